// Shape rules of the Layout family: constants, iota and the ops that move data without arithmetic
// (broadcast, reshape, transpose, slice, concat, pad) or by index (gather,
// gather_elements, scatter_elements).
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

Result inferConstant(const ShapeQuery& q) {
  auto value = lookupAttr(q, "value", AttrKind::Tensor);
  if (!value) return value.takeError();
  const DenseTensor& t = (*value)->getTensor();
  if (!t.type.isStatic()) return fail(q, "attribute 'value' has type " + t.type.str() + ", expected a static shape");
  auto count = staticProduct(t.type.shape);
  if (!count || static_cast<uint64_t>(*count) != t.bytes.size() / dtypeSize(t.type.dtype) ||
      t.bytes.size() % dtypeSize(t.type.dtype) != 0)
    return fail(q, "attribute 'value' of type " + t.type.str() + " holds " + std::to_string(t.bytes.size()) +
                       " bytes, which does not match its type");
  return Types{t.type};
}

Result inferIota(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  if (!accepts(DTypes::Numeric, declared->dtype))
    return fail(q, "declared result type " + declared->str() + " must have a numeric dtype");
  KILN_TRY(axisAttr(q, "axis", declared->rank()));
  return Types{*declared};
}

Result inferBroadcast(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  const TensorType& in = operand(q, 0);
  if (declared->dtype != in.dtype)
    return fail(q, "declared result type " + declared->str() + " must have the operand's dtype " +
                       std::string(dtypeName(in.dtype)));
  if (auto mismatch = broadcastToMismatch(in.shape, declared->shape))
    return fail(q, "operand 0 of type " + in.str() + " does not broadcast to " + declared->str() + ": " + *mismatch);
  // A static non-1 operand dim fixes the result dim it maps to.
  TensorType result = *declared;
  size_t offset = result.shape.size() - in.shape.size();
  for (size_t i = 0; i < in.shape.size(); ++i)
    if (in.shape[i].isStatic() && in.shape[i].size != 1)
      result.shape[offset + i] = refineDim(result.shape[offset + i], in.shape[i]);
  return Types{result};
}

Result inferReshape(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  const TensorType& in = operand(q, 0);
  if (declared->dtype != in.dtype)
    return fail(q, "declared result type " + declared->str() + " must have the operand's dtype " +
                       std::string(dtypeName(in.dtype)));
  TensorType result = *declared;
  if (!in.isStatic()) return Types{result};
  auto count = staticProduct(in.shape);
  auto known = staticProduct(result.shape);
  if (!count || !known) return fail(q, "element count overflows int64");
  if (result.isStatic()) {
    if (*count != *known)
      return fail(q, "result " + result.str() + " has " + std::to_string(*known) + " elements, but operand 0 " +
                         in.str() + " has " + std::to_string(*count));
    return Types{result};
  }
  // Static input, partly unknown result: the static dims must divide the
  // count, and a single non-static dim is the quotient.
  if (*known == 0) return Types{result};
  if (*count % *known != 0)
    return fail(q, "result " + result.str() + " cannot hold the " + std::to_string(*count) + " elements of operand 0 " +
                       in.str() + ": its static dims multiply to " + std::to_string(*known));
  auto open = std::count_if(result.shape.begin(), result.shape.end(), [](const Dim& d) { return !d.isStatic(); });
  if (open == 1)
    for (Dim& d : result.shape)
      if (!d.isStatic()) d = Dim::fixed(*count / *known);
  return Types{result};
}

Result inferTranspose(const ShapeQuery& q) {
  auto perm = intsAttr(q, "perm");
  if (!perm) return perm.takeError();
  int64_t rank = rankOf(q, 0);
  if (static_cast<int64_t>(perm->size()) != rank)
    return fail(q, "attribute 'perm' has " + std::to_string(perm->size()) + " entries, expected " +
                       std::to_string(rank) + " (the operand's rank)");
  std::vector<bool> seen(rank, false);
  Shape shape;
  for (size_t i = 0; i < perm->size(); ++i) {
    auto axis = normalizeAxis((*perm)[i], rank);
    if (!axis || seen[*axis])
      return fail(q, "attribute 'perm' is not a permutation of 0.." + std::to_string(rank - 1) + ": entry " +
                         std::to_string(i) + " = " + std::to_string((*perm)[i]) +
                         (axis ? " is repeated" : " is out of range"));
    seen[*axis] = true;
    shape.push_back(shapeOf(q, 0)[*axis]);
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// The length of `[start:end:step]` over a static dim, Python/ONNX semantics.
int64_t sliceLength(int64_t dim, int64_t start, int64_t end, int64_t step) {
  Wide s = start, e = end, d = dim;
  if (s < 0) s += d;
  if (e < 0) e += d;
  Wide lo = step > 0 ? 0 : -1;
  Wide hi = step > 0 ? d : d - 1;
  s = std::clamp(s, lo, hi);
  e = std::clamp(e, lo, hi);
  Wide span = step > 0 ? e - s : s - e;
  if (span <= 0) return 0;
  Wide mag = step > 0 ? Wide(step) : -Wide(step);
  return static_cast<int64_t>((span + mag - 1) / mag);
}

/// True when `[start:end:step]` takes a whole dim of any size, in order or
/// reversed, so a non-static dim is kept.
bool takesWholeDim(int64_t start, int64_t end, int64_t step) {
  if (step == 1) return (start == 0 || start == kInt64Min) && end == kInt64Max;
  if (step == -1) return (start == -1 || start == kInt64Max) && end == kInt64Min;
  return false;
}

Result inferSlice(const ShapeQuery& q) {
  auto starts = intsAttr(q, "starts");
  if (!starts) return starts.takeError();
  auto ends = intsAttr(q, "ends");
  if (!ends) return ends.takeError();
  auto steps = intsAttr(q, "steps");
  if (!steps) return steps.takeError();
  size_t rank = shapeOf(q, 0).size();
  for (auto [name, list] : {std::pair{"starts", &*starts}, std::pair{"ends", &*ends}, std::pair{"steps", &*steps}})
    if (list->size() != rank)
      return fail(q, "attribute '" + std::string(name) + "' has " + std::to_string(list->size()) +
                         " entries, expected " + std::to_string(rank) + " (one per dim of operand 0)");
  Shape shape;
  for (size_t d = 0; d < rank; ++d) {
    int64_t start = (*starts)[d], end = (*ends)[d], step = (*steps)[d];
    if (step == 0) return fail(q, "attribute 'steps' entry " + std::to_string(d) + " is 0, expected non-zero");
    const Dim& in = shapeOf(q, 0)[d];
    if (in.isStatic())
      shape.push_back(Dim::fixed(sliceLength(in.size, start, end, step)));
    else
      shape.push_back(takesWholeDim(start, end, step) ? in : Dim::unknown());
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferConcat(const ShapeQuery& q) {
  int64_t rank = rankOf(q, 0);
  auto axis = axisAttr(q, "axis", rank);
  if (!axis) return axis.takeError();
  Shape shape = shapeOf(q, 0);
  Wide staticSum = 0;
  std::vector<Dim> open;  // the non-static dims along `axis`
  for (size_t i = 0; i < q.operands.size(); ++i) {
    if (i > 0) {
      KILN_TRY(expectSameDType(q, 0, i));
      KILN_TRY(expectRank(q, i, rank, "operand 0's rank"));
    }
    for (int64_t d = 0; d < rank; ++d) {
      const Dim& dim = shapeOf(q, i)[d];
      if (d == *axis) {
        if (dim.isStatic())
          staticSum += dim.size;
        else
          open.push_back(dim);
        continue;
      }
      KILN_TRY(expectDim(q, i, d, shape[d], "the dim of the operands before it"));
      shape[d] = refineDim(shape[d], dim);
    }
  }
  if (staticSum > kInt64Max) return fail(q, "result dim " + std::to_string(*axis) + " overflows int64");
  if (open.empty())
    shape[*axis] = Dim::fixed(static_cast<int64_t>(staticSum));
  else if (open.size() == 1 && staticSum == 0)
    shape[*axis] = open[0];
  else
    shape[*axis] = Dim::unknown();
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferPad(const ShapeQuery& q) {
  auto pads = intsAttr(q, "pads");
  if (!pads) return pads.takeError();
  auto mode = choiceAttr(q, "mode", {"constant", "reflect", "edge"});
  if (!mode) return mode.takeError();
  KILN_TRY(floatAttr(q, "value"));
  const Shape& in = shapeOf(q, 0);
  size_t rank = in.size();
  if (pads->size() != 2 * rank)
    return fail(q, "attribute 'pads' has " + std::to_string(pads->size()) + " entries, expected " +
                       std::to_string(2 * rank) + " (begins then ends for rank " + std::to_string(rank) + ")");
  Shape shape;
  for (size_t d = 0; d < rank; ++d) {
    int64_t begin = (*pads)[d], end = (*pads)[rank + d];
    if (!in[d].isStatic()) {
      shape.push_back(begin == 0 && end == 0 ? in[d] : Dim::unknown());
      continue;
    }
    Wide size = Wide(in[d].size) + begin + end;
    if (size < 0 || size > kInt64Max)
      return fail(q, "attribute 'pads' gives dim " + std::to_string(d) + " of size " + in[d].str() +
                         " a size out of range (pads " + std::to_string(begin) + " and " + std::to_string(end) + ")");
    // Reflection mirrors without the edge, so it needs more than `pad` elements.
    if (*mode == "reflect" && std::max(begin, end) > 0 && std::max(begin, end) >= in[d].size)
      return fail(q, "attribute 'pads' reflects dim " + std::to_string(d) + " of size " + in[d].str() + " by " +
                         std::to_string(std::max(begin, end)) + ", expected less than the dim");
    if (*mode == "edge" && std::max(begin, end) > 0 && in[d].size == 0)
      return fail(q, "mode \"edge\" cannot pad dim " + std::to_string(d) + " of size 0");
    shape.push_back(Dim::fixed(static_cast<int64_t>(size)));
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferGather(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 1, DTypes::Index));
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  const Shape& data = shapeOf(q, 0);
  Shape shape(data.begin(), data.begin() + *axis);
  shape.insert(shape.end(), shapeOf(q, 1).begin(), shapeOf(q, 1).end());
  shape.insert(shape.end(), data.begin() + *axis + 1, data.end());
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// Common checks of gather_elements and scatter_elements: indices of the
/// data's rank, no longer than the data along the other axes.
Status checkElementIndices(const ShapeQuery& q, int64_t axis) {
  KILN_TRY(expectDType(q, 1, DTypes::Index));
  KILN_TRY(expectRank(q, 1, rankOf(q, 0), "operand 0's rank"));
  for (int64_t d = 0; d < rankOf(q, 0); ++d) {
    const Dim& index = shapeOf(q, 1)[d];
    const Dim& data = shapeOf(q, 0)[d];
    if (d != axis && index.isStatic() && data.isStatic() && index.size > data.size)
      return fail(q, "operand 1 has dim " + std::to_string(d) + " = " + index.str() + ", expected at most " +
                         data.str() + " (operand 0's dim " + std::to_string(d) + ")");
  }
  return Status::success();
}

Result inferGatherElements(const ShapeQuery& q) {
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  KILN_TRY(checkElementIndices(q, *axis));
  return Types{{operand(q, 0).dtype, shapeOf(q, 1)}};
}

Result inferScatterElements(const ShapeQuery& q) {
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  KILN_TRY(choiceAttr(q, "reduction", {"none", "add", "mul", "max", "min"}));
  KILN_TRY(checkElementIndices(q, *axis));
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectSameShape(q, 1, 2));
  return Types{operand(q, 0)};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule Constant = &inferConstant;
const Rule Iota = &inferIota;
const Rule Broadcast = &inferBroadcast;
const Rule Reshape = &inferReshape;
const Rule Transpose = &inferTranspose;
const Rule Slice = &inferSlice;
const Rule Concat = &inferConcat;
const Rule Pad = &inferPad;
const Rule Gather = &inferGather;
const Rule GatherElements = &inferGatherElements;
const Rule ScatterElements = &inferScatterElements;
}  // namespace rules

}  // namespace kiln::shape_rules
