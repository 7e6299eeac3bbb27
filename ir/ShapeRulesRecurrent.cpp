// Shape rules of the Recurrent family: the recurrent layers rnn, lstm and gru.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

/// rnn, gru and lstm (ONNX layout 0) with `Gates` gates; lstm also takes
/// and returns a cell state.
template <int Gates>
Result inferRecurrent(const ShapeQuery& q) {
  auto hidden = intAttr(q, "hidden_size");
  if (!hidden) return hidden.takeError();
  if (*hidden < 1 || *hidden > kInt64Max / (2 * Gates))
    return fail(q, "attribute 'hidden_size' = " + std::to_string(*hidden) + ", expected a positive size");
  auto direction = choiceAttr(q, "direction", {"forward", "reverse", "bidirectional"});
  if (!direction) return direction.takeError();
  if (q.kind == OpKind::Rnn) KILN_TRY(choiceAttr(q, "activation", {"tanh", "relu", "sigmoid"}));
  if (q.kind == OpKind::Gru) KILN_TRY(boolAttr(q, "linear_before_reset"));
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  for (size_t i = 1; i < q.operands.size(); ++i) KILN_TRY(expectSameDType(q, 0, i));

  KILN_TRY(expectRank(q, 0, 3, "X[seq, batch, input]"));
  const Shape& x = shapeOf(q, 0);
  Dim dirs = Dim::fixed(*direction == "bidirectional" ? 2 : 1);
  Dim h = Dim::fixed(*hidden);
  Dim gh = Dim::fixed(Gates * *hidden);
  std::string ghWhy = std::to_string(Gates) + " gates * hidden_size";
  KILN_TRY(expectRank(q, 1, 3, "W[dirs, gates * hidden, input]"));
  KILN_TRY(expectDim(q, 1, 0, dirs, "directions"));
  KILN_TRY(expectDim(q, 1, 1, gh, ghWhy));
  KILN_TRY(expectDim(q, 1, 2, x[2], "operand 0's input size"));
  KILN_TRY(expectRank(q, 2, 3, "R[dirs, gates * hidden, hidden]"));
  KILN_TRY(expectDim(q, 2, 0, dirs, "directions"));
  KILN_TRY(expectDim(q, 2, 1, gh, ghWhy));
  KILN_TRY(expectDim(q, 2, 2, h, "hidden_size"));
  KILN_TRY(expectRank(q, 3, 2, "B[dirs, 2 * gates * hidden]"));
  KILN_TRY(expectDim(q, 3, 0, dirs, "directions"));
  KILN_TRY(expectDim(q, 3, 1, Dim::fixed(2 * Gates * *hidden), "2 * " + ghWhy));
  Dim batch = x[1];
  for (size_t i = 4; i < q.operands.size(); ++i) {
    KILN_TRY(expectRank(q, i, 3, "initial state [dirs, batch, hidden]"));
    KILN_TRY(expectDim(q, i, 0, dirs, "directions"));
    KILN_TRY(expectDim(q, i, 1, x[1], "operand 0's batch"));
    KILN_TRY(expectDim(q, i, 2, h, "hidden_size"));
    batch = refineDim(batch, shapeOf(q, i)[1]);
  }
  DType dtype = operand(q, 0).dtype;
  Types results{{dtype, {x[0], dirs, batch, h}}, {dtype, {dirs, batch, h}}};
  if (q.kind == OpKind::Lstm) results.push_back({dtype, {dirs, batch, h}});
  return results;
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule Rnn = &inferRecurrent<1>;
const Rule Lstm = &inferRecurrent<4>;
const Rule Gru = &inferRecurrent<3>;
}  // namespace rules

}  // namespace kiln::shape_rules
