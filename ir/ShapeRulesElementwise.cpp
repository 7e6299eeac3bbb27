// Shape rules of the Elementwise family: unary math, broadcasting binary arithmetic, logical and
// comparison ops, select and cast.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

template <DTypes In, bool BoolOut>
Result inferBinary(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, In));
  KILN_TRY(expectSameDType(q, 0, 1));
  auto shape = broadcastOperands(q, {0, 1});
  if (!shape) return shape.takeError();
  return Types{{BoolOut ? DType::Bool : operand(q, 0).dtype, std::move(*shape)}};
}

Result inferSelect(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Bool));
  KILN_TRY(expectSameDType(q, 1, 2));
  auto shape = broadcastOperands(q, {0, 1, 2});
  if (!shape) return shape.takeError();
  return Types{{operand(q, 1).dtype, std::move(*shape)}};
}

Result inferCast(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  const Shape& in = shapeOf(q, 0);
  if (declared->rank() != rankOf(q, 0))
    return fail(
        q, "declared result type " + declared->str() + " must have the operand's rank " + std::to_string(rankOf(q, 0)));
  Shape shape = in;
  for (size_t d = 0; d < in.size(); ++d) shape[d] = refineDim(in[d], declared->shape[d]);
  return Types{{declared->dtype, std::move(shape)}};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule Neg = &inferUnary<DTypes::Numeric>;
const Rule Abs = &inferUnary<DTypes::Numeric>;
const Rule Sign = &inferUnary<DTypes::Numeric>;
const Rule Exp = &inferUnary<DTypes::Float>;
const Rule Log = &inferUnary<DTypes::Float>;
const Rule Sqrt = &inferUnary<DTypes::Float>;
const Rule Rsqrt = &inferUnary<DTypes::Float>;
const Rule Reciprocal = &inferUnary<DTypes::Float>;
const Rule Tanh = &inferUnary<DTypes::Float>;
const Rule Sigmoid = &inferUnary<DTypes::Float>;
const Rule Relu = &inferUnary<DTypes::Numeric>;
const Rule Erf = &inferUnary<DTypes::Float>;
const Rule Sin = &inferUnary<DTypes::Float>;
const Rule Cos = &inferUnary<DTypes::Float>;
const Rule Tan = &inferUnary<DTypes::Float>;
const Rule Asin = &inferUnary<DTypes::Float>;
const Rule Acos = &inferUnary<DTypes::Float>;
const Rule Atan = &inferUnary<DTypes::Float>;
const Rule Sinh = &inferUnary<DTypes::Float>;
const Rule Cosh = &inferUnary<DTypes::Float>;
const Rule Asinh = &inferUnary<DTypes::Float>;
const Rule Acosh = &inferUnary<DTypes::Float>;
const Rule Atanh = &inferUnary<DTypes::Float>;
const Rule HardSwish = &inferUnary<DTypes::Float>;
const Rule Floor = &inferUnary<DTypes::Float>;
const Rule Ceil = &inferUnary<DTypes::Float>;
const Rule Round = &inferUnary<DTypes::Float>;
const Rule Not = &inferUnary<DTypes::Bool>;
const Rule IsNan = &inferUnary<DTypes::Float, true>;
const Rule IsInf = &inferUnary<DTypes::Float, true>;
const Rule Add = &inferBinary<DTypes::Numeric, false>;
const Rule Sub = &inferBinary<DTypes::Numeric, false>;
const Rule Mul = &inferBinary<DTypes::Numeric, false>;
const Rule Div = &inferBinary<DTypes::Numeric, false>;
const Rule Pow = &inferBinary<DTypes::Numeric, false>;
const Rule Max = &inferBinary<DTypes::Numeric, false>;
const Rule Min = &inferBinary<DTypes::Numeric, false>;
const Rule Mod = &inferBinary<DTypes::Numeric, false>;
const Rule Rem = &inferBinary<DTypes::Numeric, false>;
const Rule And = &inferBinary<DTypes::Bool, false>;
const Rule Or = &inferBinary<DTypes::Bool, false>;
const Rule Xor = &inferBinary<DTypes::Bool, false>;
const Rule Eq = &inferBinary<DTypes::Any, true>;
const Rule Ne = &inferBinary<DTypes::Any, true>;
const Rule Lt = &inferBinary<DTypes::Any, true>;
const Rule Le = &inferBinary<DTypes::Any, true>;
const Rule Gt = &inferBinary<DTypes::Any, true>;
const Rule Ge = &inferBinary<DTypes::Any, true>;
const Rule Select = &inferSelect;
const Rule Cast = &inferCast;
}  // namespace rules

}  // namespace kiln::shape_rules
