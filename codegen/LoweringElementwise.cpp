// Lowerings of the Elementwise family: unary math, the broadcasting binary ops, select and cast,
// each one scalar function of the element(s) at the same (broadcast) index.
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

// --- Elementwise -----------------------------------------------------------------

template <kir::UnaryFn Fn>
Expected<ExprPtr> lowerUnary(const Op& op, LoweringContext& ctx, const Index& index) {
  auto x = ctx.operand(0, index);
  if (!x) return x;
  return kir::unary(Fn, *x);
}

/// hard_swish as x * min(max(x + 3, 0), 6) / 6, kiln_fhardswish's
/// expression (ir/ScalarSemantics.h) in kernel IR, so the CPU JIT and the
/// CUDA emitter need no function of their own.
Expected<ExprPtr> lowerHardSwish(const Op& op, LoweringContext& ctx, const Index& index) {
  auto x = ctx.operand(0, index);
  if (!x) return x;
  const DType t = op.result()->type().dtype;
  using kir::BinaryFn;
  ExprPtr gate = kir::binary(BinaryFn::Min, kir::binary(BinaryFn::Max, kir::binary(BinaryFn::Add, *x, kir::constant(t, 3)),
                                                        kir::constant(t, 0)),
                             kir::constant(t, 6));
  return kir::binary(BinaryFn::Div, kir::binary(BinaryFn::Mul, *x, gate), kir::constant(t, 6));
}

/// Reads every operand of a broadcasting op at `index`.
Expected<std::vector<ExprPtr>> broadcastOperands(const Op& op, LoweringContext& ctx, const Index& index) {
  std::vector<ExprPtr> values;
  for (size_t i = 0; i < op.numOperands(); ++i) {
    auto v = ctx.operand(i, broadcastIndex(index, dimsOf(op.operand(i))));
    if (!v) return v.takeError();
    values.push_back(*v);
  }
  return values;
}

template <kir::BinaryFn Fn>
Expected<ExprPtr> lowerBinary(const Op& op, LoweringContext& ctx, const Index& index) {
  auto v = broadcastOperands(op, ctx, index);
  if (!v) return v.takeError();
  return kir::binary(Fn, (*v)[0], (*v)[1]);
}

Expected<ExprPtr> lowerSelect(const Op& op, LoweringContext& ctx, const Index& index) {
  auto v = broadcastOperands(op, ctx, index);
  if (!v) return v.takeError();
  return kir::select((*v)[0], (*v)[1], (*v)[2]);
}

Expected<ExprPtr> lowerCast(const Op& op, LoweringContext& ctx, const Index& index) {
  auto x = ctx.operand(0, index);
  if (!x) return x;
  return kir::cast(*x, op.result()->type().dtype);
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace lowerings {
using kir::BinaryFn;
using kir::ReduceKind;
using kir::UnaryFn;
const LowerFn Neg = lowerUnary<UnaryFn::Neg>;
const LowerFn Abs = lowerUnary<UnaryFn::Abs>;
const LowerFn Sign = lowerUnary<UnaryFn::Sign>;
const LowerFn Exp = lowerUnary<UnaryFn::Exp>;
const LowerFn Log = lowerUnary<UnaryFn::Log>;
const LowerFn Sqrt = lowerUnary<UnaryFn::Sqrt>;
const LowerFn Rsqrt = lowerUnary<UnaryFn::Rsqrt>;
const LowerFn Reciprocal = lowerUnary<UnaryFn::Reciprocal>;
const LowerFn Tanh = lowerUnary<UnaryFn::Tanh>;
const LowerFn Sigmoid = lowerUnary<UnaryFn::Sigmoid>;
const LowerFn Relu = lowerUnary<UnaryFn::Relu>;
const LowerFn Erf = lowerUnary<UnaryFn::Erf>;
const LowerFn Sin = lowerUnary<UnaryFn::Sin>;
const LowerFn Cos = lowerUnary<UnaryFn::Cos>;
const LowerFn Tan = lowerUnary<UnaryFn::Tan>;
const LowerFn Asin = lowerUnary<UnaryFn::Asin>;
const LowerFn Acos = lowerUnary<UnaryFn::Acos>;
const LowerFn Atan = lowerUnary<UnaryFn::Atan>;
const LowerFn Sinh = lowerUnary<UnaryFn::Sinh>;
const LowerFn Cosh = lowerUnary<UnaryFn::Cosh>;
const LowerFn Asinh = lowerUnary<UnaryFn::Asinh>;
const LowerFn Acosh = lowerUnary<UnaryFn::Acosh>;
const LowerFn Atanh = lowerUnary<UnaryFn::Atanh>;
const LowerFn HardSwish = lowerHardSwish;
const LowerFn Floor = lowerUnary<UnaryFn::Floor>;
const LowerFn Ceil = lowerUnary<UnaryFn::Ceil>;
const LowerFn Round = lowerUnary<UnaryFn::Round>;
const LowerFn Not = lowerUnary<UnaryFn::Not>;
const LowerFn IsNan = lowerUnary<UnaryFn::IsNan>;
const LowerFn IsInf = lowerUnary<UnaryFn::IsInf>;
const LowerFn Add = lowerBinary<BinaryFn::Add>;
const LowerFn Sub = lowerBinary<BinaryFn::Sub>;
const LowerFn Mul = lowerBinary<BinaryFn::Mul>;
const LowerFn Div = lowerBinary<BinaryFn::Div>;
const LowerFn Pow = lowerBinary<BinaryFn::Pow>;
const LowerFn Max = lowerBinary<BinaryFn::Max>;
const LowerFn Min = lowerBinary<BinaryFn::Min>;
const LowerFn Mod = lowerBinary<BinaryFn::Mod>;
const LowerFn Rem = lowerBinary<BinaryFn::Rem>;
const LowerFn And = lowerBinary<BinaryFn::And>;
const LowerFn Or = lowerBinary<BinaryFn::Or>;
const LowerFn Xor = lowerBinary<BinaryFn::Xor>;
const LowerFn Eq = lowerBinary<BinaryFn::Eq>;
const LowerFn Ne = lowerBinary<BinaryFn::Ne>;
const LowerFn Lt = lowerBinary<BinaryFn::Lt>;
const LowerFn Le = lowerBinary<BinaryFn::Le>;
const LowerFn Gt = lowerBinary<BinaryFn::Gt>;
const LowerFn Ge = lowerBinary<BinaryFn::Ge>;
const LowerFn Select = lowerSelect;
const LowerFn Cast = lowerCast;
}  // namespace lowerings

}  // namespace kiln::codegen
