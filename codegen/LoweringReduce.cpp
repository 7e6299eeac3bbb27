// Lowerings of the Reduce family: the reductions over axes and the arg-reductions, as kernel IR
// reductions over fresh loop variables.
// The index helpers are in codegen/LoweringSupport.h; the table at the end
// registers this family's lowering of each of its ops (null where it has none).
#include "codegen/LoweringSupport.h"

#include <algorithm>
#include <limits>
#include <numbers>
#include <numeric>

namespace kiln::codegen {
namespace {

using namespace lower;

// --- Reductions ----------------------------------------------------------------------

/// The input index of a reduction: kept dims from the result index, reduced
/// dims from the reduction variables starting at `firstVar`.
Index reductionInput(const Index& index, const std::vector<bool>& reduced, bool keepdims, int firstVar) {
  Index in;
  int next = firstVar;
  size_t r = 0;
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (reduced[d]) {
      in.push_back(kir::var(next++));
      if (keepdims) ++r;
    } else {
      in.push_back(index[r++]);
    }
  }
  return in;
}

template <kir::ReduceKind Kind, bool Mean = false>
Expected<ExprPtr> lowerReduce(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> shape = dimsOf(op.operand(0));
  std::vector<bool> reduced(shape.size(), op.getInts("axes").empty());
  for (int64_t axis : op.getInts("axes")) {
    auto checked = checkedAxis(op, axis, static_cast<int64_t>(shape.size()));
    if (!checked) return checked.takeError();
    reduced[*checked] = true;
  }
  std::vector<int64_t> extents;
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (reduced[d]) {
      extents.push_back(shape[d]);
      count *= shape[d];
    }
  const int first = ctx.newVars(static_cast<int>(extents.size()));
  auto body = ctx.operand(0, reductionInput(index, reduced, op.getBool("keepdims"), first));
  if (!body) return body;
  ExprPtr r = kir::reduce(Kind, first, extents, *body);
  if constexpr (Mean) {
    const DType t = r->type;
    const double n = static_cast<double>(count);
    // A count f32 cannot hold (above 2^24, not a multiple of its ulp there)
    // would be rounded before the division; dividing in f64 and rounding
    // once keeps the mean the sum over the count (f16 and bf16 compute in
    // f32, so theirs is the same test).
    if (isFloat(t) && t != DType::F64 && static_cast<double>(static_cast<float>(n)) != n)
      return kir::cast(kir::binary(kir::BinaryFn::Div, kir::cast(r, DType::F64), kir::constant(DType::F64, n)), t);
    if (isFloat(t)) return kir::binary(kir::BinaryFn::Div, r, kir::constant(t, n));
    if (count == 0) return op.emitError("integer mean over zero elements");
    return kir::binary(kir::BinaryFn::Div, r, kir::constantInt(t, count));
  }
  return r;
}

template <kir::ReduceKind Kind>
Expected<ExprPtr> lowerArgReduce(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> shape = dimsOf(op.operand(0));
  auto checked = checkedAxis(op, op.getInt("axis"), static_cast<int64_t>(std::max<size_t>(shape.size(), 1)));
  if (!checked) return checked.takeError();
  const int64_t axis = *checked;
  if (shape.empty()) return kir::index(0);
  if (shape[axis] == 0) return op.emitError("cannot take the arg-reduction of an empty axis");
  std::vector<bool> reduced(shape.size(), false);
  reduced[axis] = true;
  const int first = ctx.newVars(1);
  auto body = ctx.operand(0, reductionInput(index, reduced, op.getBool("keepdims"), first));
  if (!body) return body;
  return kir::reduce(Kind, first, {shape[axis]}, *body, op.getBool("select_last_index"));
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace lowerings {
using kir::BinaryFn;
using kir::ReduceKind;
using kir::UnaryFn;
const LowerFn ReduceSum = lowerReduce<ReduceKind::Sum>;
const LowerFn ReduceMean = lowerReduce<ReduceKind::Sum, true>;
const LowerFn ReduceMax = lowerReduce<ReduceKind::Max>;
const LowerFn ReduceMin = lowerReduce<ReduceKind::Min>;
const LowerFn ReduceProd = lowerReduce<ReduceKind::Prod>;
const LowerFn ArgMax = lowerArgReduce<ReduceKind::ArgMax>;
const LowerFn ArgMin = lowerArgReduce<ReduceKind::ArgMin>;
}  // namespace lowerings

}  // namespace kiln::codegen
