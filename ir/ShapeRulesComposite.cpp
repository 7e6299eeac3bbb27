// Shape rules of the Composite family: the composite ops that decompose into primitives (softmax,
// the norms, the activations, attention, the losses, quantize and dequantize).
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

/// Softmax-like ops: a float operand, one axis, same type out.
Result inferAlongAxis(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(axisAttr(q, "axis", rankOf(q, 0)));
  return Types{operand(q, 0)};
}

Result inferGelu(const ShapeQuery& q) {
  KILN_TRY(choiceAttr(q, "approximate", {"none", "tanh"}));
  return inferUnary<DTypes::Float>(q);
}

Result inferLayerNorm(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  KILN_TRY(floatAttr(q, "epsilon"));
  const Shape& x = shapeOf(q, 0);
  Shape normalized(x.begin() + *axis, x.end());
  for (size_t i = 1; i < q.operands.size(); ++i) {
    KILN_TRY(expectSameDType(q, 0, i));
    if (auto mismatch = broadcastToMismatch(shapeOf(q, i), normalized))
      return fail(q, operandName(i) + " of type " + operand(q, i).str() +
                         " does not broadcast to the normalized dims " + shapeStr(normalized) + ": " + *mismatch);
  }
  return Types{operand(q, 0)};
}

Result inferBatchNorm(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectMinRank(q, 0, 2, "x[N, C, ...]"));
  KILN_TRY(floatAttr(q, "epsilon"));
  static constexpr const char* kNames[] = {"", "scale", "bias", "mean", "var"};
  for (size_t i = 1; i < 5; ++i) {
    KILN_TRY(expectSameDType(q, 0, i));
    KILN_TRY(expectRank(q, i, 1, std::string(kNames[i]) + "[C]"));
    KILN_TRY(expectDim(q, i, 0, shapeOf(q, 0)[1], "operand 0's channels"));
  }
  return Types{operand(q, 0)};
}

Result inferAttention(const ShapeQuery& q) {
  KILN_TRY(floatAttr(q, "scale"));
  KILN_TRY(boolAttr(q, "causal"));
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectMinRank(q, 0, 2, "q[..., Lq, D]"));
  size_t rank = shapeOf(q, 0).size();
  KILN_TRY(expectRank(q, 1, static_cast<int64_t>(rank), "k[..., Lk, D] has q's rank"));
  KILN_TRY(expectRank(q, 2, static_cast<int64_t>(rank), "v[..., Lk, Dv] has q's rank"));
  const Shape& query = shapeOf(q, 0);
  const Shape& key = shapeOf(q, 1);
  const Shape& value = shapeOf(q, 2);
  Shape shape;
  for (size_t d = 0; d + 2 < rank; ++d) {
    KILN_TRY(expectDim(q, 1, d, query[d], "operand 0's leading dim " + std::to_string(d)));
    KILN_TRY(expectDim(q, 2, d, query[d], "operand 0's leading dim " + std::to_string(d)));
    shape.push_back(refineDim(refineDim(query[d], key[d]), value[d]));
  }
  KILN_TRY(expectDim(q, 1, rank - 1, query[rank - 1], "operand 0's feature size D"));
  KILN_TRY(expectDim(q, 2, rank - 2, key[rank - 2], "operand 1's key length Lk"));
  if (q.operands.size() == 4) {
    DType maskType = operand(q, 3).dtype;
    if (maskType != DType::Bool && maskType != operand(q, 0).dtype)
      return fail(q, "operand 3 (mask) has dtype " + std::string(dtypeName(maskType)) + ", expected bool or " +
                         std::string(dtypeName(operand(q, 0).dtype)));
    Shape scores = shape;
    scores.push_back(query[rank - 2]);
    scores.push_back(refineDim(key[rank - 2], value[rank - 2]));
    if (auto mismatch = broadcastToMismatch(shapeOf(q, 3), scores))
      return fail(q, "operand 3 (mask) of type " + operand(q, 3).str() + " does not broadcast to the scores " +
                         shapeStr(scores) + ": " + *mismatch);
  }
  shape.push_back(query[rank - 2]);
  shape.push_back(value[rank - 1]);
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// Result of a loss with `reduction`: a scalar, or the per-element `shape`.
Result lossResult(const ShapeQuery& q, DType dtype, Shape shape) {
  auto reduction = choiceAttr(q, "reduction", {"mean", "sum", "none"});
  if (!reduction) return reduction.takeError();
  if (*reduction != "none") shape.clear();
  return Types{{dtype, std::move(shape)}};
}

/// cross_entropy and nll_loss: scores[N, C, d...] and labels[N, d...].
Result inferClassLoss(const ShapeQuery& q) {
  KILN_TRY(intAttr(q, "ignore_index"));
  if (q.kind == OpKind::CrossEntropy) {
    auto smoothing = floatAttr(q, "label_smoothing");
    if (!smoothing) return smoothing.takeError();
    if (!(*smoothing >= 0 && *smoothing <= 1))
      return fail(q, "attribute 'label_smoothing' = " + std::to_string(*smoothing) + ", expected a value in [0, 1]");
  }
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectMinRank(q, 0, 2, "scores[N, C, d...]"));
  KILN_TRY(expectDType(q, 1, DTypes::Index));
  const Shape& scores = shapeOf(q, 0);
  KILN_TRY(expectRank(q, 1, static_cast<int64_t>(scores.size()) - 1, "labels[N, d...]: operand 0's rank - 1"));
  Shape shape{refineDim(scores[0], shapeOf(q, 1)[0])};
  KILN_TRY(expectDim(q, 1, 0, scores[0], "operand 0's batch dim 0"));
  for (size_t d = 2; d < scores.size(); ++d) {
    KILN_TRY(expectDim(q, 1, d - 1, scores[d], "operand 0's dim " + std::to_string(d)));
    shape.push_back(refineDim(scores[d], shapeOf(q, 1)[d - 1]));
  }
  return lossResult(q, operand(q, 0).dtype, std::move(shape));
}

Result inferMseLoss(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  auto shape = expectSameShape(q, 0, 1);
  if (!shape) return shape.takeError();
  return lossResult(q, operand(q, 0).dtype, std::move(*shape));
}

/// quantize(x, scale, zero_point): x's shape in zero_point's dtype (u8, i8).
Result inferQuantize(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  if (!isInt8(operand(q, 2).dtype))
    return fail(q, "operand 2 (the zero point) has dtype " + std::string(dtypeName(operand(q, 2).dtype)) +
                       ", expected u8 or i8 (it gives the result's dtype)");
  KILN_TRY(expectPerAxis(q, 1, "scale"));
  KILN_TRY(expectPerAxis(q, 2, "zero point"));
  return Types{{operand(q, 2).dtype, shapeOf(q, 0)}};
}

/// dequantize(x, scale, zero_point): x's shape in scale's dtype.
Result inferDequantize(const ShapeQuery& q) {
  const DType x = operand(q, 0).dtype;
  if (!isInt8(x) && x != DType::I32)
    return fail(q, "operand 0 has dtype " + std::string(dtypeName(x)) + ", expected u8, i8 or i32");
  KILN_TRY(expectDType(q, 1, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectPerAxis(q, 1, "scale"));
  KILN_TRY(expectPerAxis(q, 2, "zero point"));
  return Types{{operand(q, 1).dtype, shapeOf(q, 0)}};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule Softmax = &inferAlongAxis;
const Rule LogSoftmax = &inferAlongAxis;
const Rule LayerNorm = &inferLayerNorm;
const Rule BatchNorm = &inferBatchNorm;
const Rule Gelu = &inferGelu;
const Rule Silu = &inferUnary<DTypes::Float>;
const Rule LeakyRelu = &inferUnary<DTypes::Float>;
const Rule Elu = &inferUnary<DTypes::Float>;
const Rule Softplus = &inferUnary<DTypes::Float>;
const Rule Attention = &inferAttention;
const Rule CrossEntropy = &inferClassLoss;
const Rule NllLoss = &inferClassLoss;
const Rule MseLoss = &inferMseLoss;
const Rule Quantize = &inferQuantize;
const Rule Dequantize = &inferDequantize;
}  // namespace rules

}  // namespace kiln::shape_rules
