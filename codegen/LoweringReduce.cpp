// Lowerings of the Reduce family: the reductions over axes and the arg-reductions, as kernel IR
// reductions over fresh loop variables, one per run of adjacent reduced axes.
// The index helpers are in codegen/LoweringSupport.h; the table at the end
// registers this family's lowering of each of its ops (null where it has none).
#include "codegen/LoweringSupport.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>

namespace kiln::codegen {
namespace {

using namespace lower;

// --- Reductions ----------------------------------------------------------------------

/// The input index of a reduction: kept dims from the result index, reduced
/// dims from the reduction variables starting at `firstVar`, one variable
/// per run of consecutive reduced dims (reductionRuns), the run's dims its
/// unravelled offset (which a load from a row-major buffer reads at the
/// offset itself, linearize); with `merge` false, one variable per dim.
Index reductionInput(const Index& index, const std::vector<bool>& reduced, const std::vector<int64_t>& shape,
                     bool keepdims, int firstVar, bool merge = true) {
  Index in;
  int next = firstVar;
  size_t r = 0;
  for (size_t d = 0; d < reduced.size();) {
    if (!reduced[d]) {
      in.push_back(index[r++]);
      ++d;
      continue;
    }
    size_t end = d + 1;
    while (merge && end < reduced.size() && reduced[end]) ++end;
    const Index run = unravel(kir::var(next++), std::vector<int64_t>(shape.begin() + static_cast<std::ptrdiff_t>(d),
                                                                       shape.begin() + static_cast<std::ptrdiff_t>(end)));
    in.insert(in.end(), run.begin(), run.end());
    if (keepdims) r += end - d;
    d = end;
  }
  return in;
}

/// The extents of a reduction's variables: one per run of consecutive
/// reduced dims, their product. A batch norm's statistics over N, H, W of
/// [32, 64, 56, 56] sum 32 runs of 3136 contiguous elements, which the
/// vectorizer splits over SIMD lanes; as separate H and W levels each
/// inner loop had 56 elements, too few for 4 interleaved vectors of 16, and
/// ran scalar.
/// With `merge` false, one per reduced dim.
std::vector<int64_t> reductionRuns(const std::vector<bool>& reduced, const std::vector<int64_t>& shape,
                                   bool merge = true) {
  std::vector<int64_t> extents;
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (!reduced[d]) continue;
    if (!merge || d == 0 || !reduced[d - 1])
      extents.push_back(shape[d]);
    else
      extents.back() *= shape[d];
  }
  return extents;
}

/// Whether `e` divides, or takes the remainder of, an expression of one of
/// the variables [first, first + count): a merged run's unravelled offset
/// that the operand did not read at the offset itself (a transposed or
/// reshaped producer in a fused group), which would cost a division per
/// element where separate loop levels cost none.
bool unravelsVars(const kir::Expr& e, int first, int count) {
  if (e.kind == kir::ExprKind::Binary && (e.binary == kir::BinaryFn::Div || e.binary == kir::BinaryFn::Rem)) {
    std::function<bool(const kir::Expr&)> uses = [&](const kir::Expr& x) {
      if (x.kind == kir::ExprKind::Var) return x.id >= first && x.id < first + count;
      for (const ExprPtr& a : x.args)
        if (uses(*a)) return true;
      return false;
    };
    if (uses(*e.args[0])) return true;
  }
  for (const ExprPtr& a : e.args)
    if (unravelsVars(*a, first, count)) return true;
  return false;
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
  std::vector<int64_t> extents = reductionRuns(reduced, shape);
  const int64_t count = std::accumulate(extents.begin(), extents.end(), int64_t{1}, std::multiplies<>());
  int first = ctx.newVars(static_cast<int>(extents.size()));
  auto body = ctx.operand(0, reductionInput(index, reduced, shape, op.getBool("keepdims"), first));
  if (!body) return body;
  // Merged runs the operand reads at their offset, or one level per dim.
  if (extents.size() != reductionRuns(reduced, shape, false).size() &&
      unravelsVars(**body, first, static_cast<int>(extents.size()))) {
    extents = reductionRuns(reduced, shape, false);
    first = ctx.newVars(static_cast<int>(extents.size()));
    body = ctx.operand(0, reductionInput(index, reduced, shape, op.getBool("keepdims"), first, false));
    if (!body) return body;
  }
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
  auto body = ctx.operand(0, reductionInput(index, reduced, shape, op.getBool("keepdims"), first));
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
