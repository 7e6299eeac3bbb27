// Shape rules of the DataDependent family: the ops whose result sizes depend on operand values
// (nonzero, unique, non_max_suppression), and the bound on those sizes.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

/// The element count of `shape` when every dim is static, else nullopt.
std::optional<int64_t> staticCount(const Shape& shape) {
  if (!isStaticShape(shape)) return std::nullopt;
  return numElements(shape);
}

/// nonzero: one row of indices per dim (a scalar counts as a 1-element
/// vector, as in NumPy), one column per nonzero element.
Result inferNonZero(const ShapeQuery& q) {
  const int64_t rows = std::max<int64_t>(rankOf(q, 0), 1);
  return Types{{DType::I64, {Dim::fixed(rows), Dim::unknown()}}};
}

/// unique's axis: nullopt when it flattens x.
Expected<std::optional<int64_t>> uniqueAxis(const ShapeQuery& q) {
  auto axes = intsAttr(q, "axis");
  if (!axes) return axes.takeError();
  if (axes->empty()) return std::optional<int64_t>{};
  if (axes->size() > 1)
    return fail(q, "attribute 'axis' has " + std::to_string(axes->size()) +
                       " entries, expected at most one (none flattens the operand)");
  auto axis = normalizeAxis(axes->front(), rankOf(q, 0));
  if (!axis)
    return fail(q,
                "attribute 'axis' is " + std::to_string(axes->front()) + ", out of range for " + operand(q, 0).str());
  return std::optional<int64_t>{*axis};
}

/// unique: (values, first indices, inverse indices, counts); the number of
/// distinct values is unknown, the inverse has one entry per element (or
/// per slice along the axis).
Result inferUnique(const ShapeQuery& q) {
  KILN_TRY(boolAttr(q, "sorted"));
  auto axis = uniqueAxis(q);
  if (!axis) return axis.takeError();
  const TensorType& x = operand(q, 0);
  TensorType values{x.dtype, {Dim::unknown()}};
  Dim perValue = Dim::unknown();
  if (*axis) {
    values.shape = x.shape;
    values.shape[**axis] = Dim::unknown();
    perValue = x.shape[**axis];
  } else if (auto count = staticCount(x.shape)) {
    perValue = Dim::fixed(*count);
  }
  const TensorType vector{DType::I64, {Dim::unknown()}};
  return Types{values, vector, {DType::I64, {perValue}}, vector};
}

/// non_max_suppression: boxes[B,N,4], scores[B,C,N] of one float dtype and
/// optional one-element thresholds to the selected [?,3] triples.
Result inferNonMaxSuppression(const ShapeQuery& q) {
  KILN_TRY(boolAttr(q, "center_point_box"));
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectRank(q, 0, 3, "boxes[batch, box, 4]"));
  KILN_TRY(expectRank(q, 1, 3, "scores[batch, class, box]"));
  KILN_TRY(expectDim(q, 0, 2, Dim::fixed(4), "four coordinates per box"));
  KILN_TRY(expectDim(q, 1, 0, shapeOf(q, 0)[0], "the batch of operand 0"));
  KILN_TRY(expectDim(q, 1, 2, shapeOf(q, 0)[1], "the boxes of operand 0"));
  static constexpr std::string_view kNames[] = {"", "", "max_output_boxes_per_class", "iou_threshold",
                                                "score_threshold"};
  for (size_t i = 2; i < q.operands.size(); ++i) {
    KILN_TRY(expectDType(q, i, i == 2 ? DTypes::Index : DTypes::Float));
    if (auto count = staticCount(shapeOf(q, i)); !count || *count != 1)
      return fail(q, operandName(i) + " (" + std::string(kNames[i]) + ") has type " + operand(q, i).str() +
                         ", expected one element");
  }
  return Types{{DType::I64, {Dim::unknown(), Dim::fixed(3)}}};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule NonZero = &inferNonZero;
const Rule Unique = &inferUnique;
const Rule NonMaxSuppression = &inferNonMaxSuppression;
}  // namespace rules

}  // namespace kiln::shape_rules

namespace kiln {

using namespace shape_rules;

std::optional<int64_t> dataDependentBound(const Op& op, size_t result) {
  if (!op.info().hasDataDependentShape() || result >= op.numResults() || op.numOperands() == 0) return std::nullopt;
  const Shape& x = op.operand(0)->type().shape;
  switch (op.kind()) {
    case OpKind::NonZero: return staticCount(x);
    case OpKind::Unique: {
      if (result == 2) return std::nullopt;  // the inverse's size is static or symbolic
      const std::vector<int64_t>& axis = op.getInts("axis");
      if (axis.empty()) return staticCount(x);
      auto a = normalizeAxis(axis.front(), static_cast<int64_t>(x.size()));
      if (!a || !x[*a].isStatic()) return std::nullopt;
      return x[*a].size;
    }
    case OpKind::NonMaxSuppression: {
      // At most every box of every batch and class.
      if (op.numOperands() < 2 || x.size() != 3) return std::nullopt;
      const Shape& scores = op.operand(1)->type().shape;
      if (scores.size() != 3 || !x[0].isStatic() || !x[1].isStatic() || !scores[1].isStatic()) return std::nullopt;
      return x[0].size * scores[1].size * x[1].size;
    }
    default: return std::nullopt;
  }
}

}  // namespace kiln
