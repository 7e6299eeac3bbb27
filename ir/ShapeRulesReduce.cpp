// Shape rules of the Reduce family: the reductions over axes and the arg-reductions along one axis.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

Result inferReduce(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  auto axes = intsAttr(q, "axes");
  if (!axes) return axes.takeError();
  auto keepdims = boolAttr(q, "keepdims");
  if (!keepdims) return keepdims.takeError();
  int64_t rank = rankOf(q, 0);
  std::vector<bool> reduced(rank, axes->empty());
  for (size_t i = 0; i < axes->size(); ++i) {
    auto axis = normalizeAxis((*axes)[i], rank);
    if (!axis)
      return fail(q, "attribute 'axes' entry " + std::to_string(i) + " = " + std::to_string((*axes)[i]) +
                         " is out of range for rank " + std::to_string(rank));
    if (reduced[*axis]) return fail(q, "attribute 'axes' names axis " + std::to_string(*axis) + " more than once");
    reduced[*axis] = true;
  }
  Shape shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[d])
      shape.push_back(shapeOf(q, 0)[d]);
    else if (*keepdims)
      shape.push_back(Dim::fixed(1));
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferArgReduce(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  auto keepdims = boolAttr(q, "keepdims");
  if (!keepdims) return keepdims.takeError();
  KILN_TRY(boolAttr(q, "select_last_index"));
  Shape shape = shapeOf(q, 0);
  if (*keepdims)
    shape[*axis] = Dim::fixed(1);
  else
    shape.erase(shape.begin() + *axis);
  return Types{{DType::I64, std::move(shape)}};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule ReduceSum = &inferReduce;
const Rule ReduceMean = &inferReduce;
const Rule ReduceMax = &inferReduce;
const Rule ReduceMin = &inferReduce;
const Rule ReduceProd = &inferReduce;
const Rule ArgMax = &inferArgReduce;
const Rule ArgMin = &inferArgReduce;
}  // namespace rules

}  // namespace kiln::shape_rules
