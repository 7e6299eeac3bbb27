// Converters for ONNX's tensor ops: constants (Constant, ConstantOfShape,
// Range, EyeLike), shape queries (Shape, Size), layout (Reshape, Flatten,
// Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Expand, Tile, Pad,
// DepthToSpace, SpaceToDepth), indexing (Gather, GatherElements,
// ScatterElements, OneHot, Trilu) and Identity. Kiln takes shapes, axes and
// slice bounds as attributes and declared types, so the ONNX inputs that
// carry them must be known at import time (constants, initializers, or
// computations on them, which the importer folds).
#include <algorithm>
#include <cmath>
#include <limits>

#include "frontend/onnx/ConverterSupport.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {
namespace {

constexpr int64_t kNewest = kNewestOnnxOpset;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

#define KILN_INPUT(var, i)                \
  auto var##_ = ctx.input(i);             \
  if (!var##_) return var##_.takeError(); \
  Value* var = *var##_

#define KILN_ASSIGN(var, expr)            \
  auto var##_ = (expr);                   \
  if (!var##_) return var##_.takeError(); \
  auto var = std::move(*var##_)

/// A rank-1 i64 constant.
DenseTensor int64Vector(const std::vector<int64_t>& values) {
  DenseTensor t = DenseTensor::zeros(TensorType{DType::I64, staticShape({static_cast<int64_t>(values.size())})});
  for (size_t i = 0; i < values.size(); ++i) t.setInt(static_cast<int64_t>(i), values[i]);
  return t;
}

Status convertConstant(NodeContext& ctx) {
  const int present = ctx.node().attribute_size();
  if (present != 1) return ctx.error("expects exactly one value attribute, got " + std::to_string(present));
  const std::string& name = ctx.node().attribute(0).name();
  if (name == "value") {
    KILN_ASSIGN(t, ctx.tensorAttr("value"));
    ctx.setOutput(0, ctx.constant(std::move(t)));
    return {};
  }
  if (name == "value_float") {
    KILN_ASSIGN(v, ctx.floatAttr("value_float", 0));
    ctx.setOutput(0, ctx.scalar(DType::F32, v));
    return {};
  }
  if (name == "value_int") {
    KILN_ASSIGN(v, ctx.intAttr("value_int", 0));
    DenseTensor t = DenseTensor::zeros(TensorType{DType::I64, {}});
    t.setInt(0, v);
    ctx.setOutput(0, ctx.constant(std::move(t)));
    return {};
  }
  if (name == "value_floats") {
    KILN_ASSIGN(v, ctx.floatsAttr("value_floats", {}));
    DenseTensor t = DenseTensor::zeros(TensorType{DType::F32, staticShape({static_cast<int64_t>(v.size())})});
    for (size_t i = 0; i < v.size(); ++i) t.setDouble(static_cast<int64_t>(i), v[i]);
    ctx.setOutput(0, ctx.constant(std::move(t)));
    return {};
  }
  if (name == "value_ints") {
    KILN_ASSIGN(v, ctx.intsAttr("value_ints", {}));
    ctx.setOutput(0, ctx.constant(int64Vector(v)));
    return {};
  }
  if (name == "value_string" || name == "value_strings") return ctx.error("string constants are not supported");
  if (name == "sparse_value") return ctx.error("sparse constants are not supported");
  return ctx.error("unknown attribute '" + name + "'");
}

Status convertConstantOfShape(NodeContext& ctx) {
  KILN_ASSIGN(dims, constantInts(ctx, 0, "shape"));
  Shape shape;
  for (int64_t d : dims) {
    if (d < 0) return ctx.error("shape has a negative dim " + std::to_string(d));
    shape.push_back(Dim::fixed(d));
  }
  DenseTensor value = DenseTensor::zeros(TensorType{DType::F32, {}});
  if (ctx.attribute("value")) {
    KILN_ASSIGN(v, ctx.tensorAttr("value"));
    if (v.numElements() != 1) return ctx.error("attribute 'value' must hold one element, got " + v.type.str());
    v.type.shape.clear();
    value = std::move(v);
  }
  return setOutput0(ctx, broadcastTo(ctx, ctx.constant(std::move(value)), std::move(shape)));
}

Status convertShape(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const int64_t rank = x->type().rank();
  KILN_ASSIGN(start, ctx.intAttr("start", 0));
  KILN_ASSIGN(end, ctx.intAttr("end", rank));
  // Shape clamps start and end into [0, rank] after adding rank to negatives.
  auto clampAxis = [&](int64_t a) { return std::clamp(a < 0 ? a + rank : a, int64_t{0}, rank); };
  start = clampAxis(start);
  end = clampAxis(end);
  std::vector<int64_t> dims;
  for (int64_t d = start; d < end; ++d) {
    const Dim& dim = x->type().shape[static_cast<size_t>(d)];
    if (!dim.isStatic())
      return ctx.error("dim " + std::to_string(d) + " of " + x->type().str() +
                       " is only known at run time; Kiln compiles static shapes (kiln run specializes a model to "
                       "the shapes of its inputs)");
    dims.push_back(dim.size);
  }
  ctx.setOutput(0, ctx.constant(int64Vector(dims)));
  return {};
}

Status convertSize(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  if (!x->type().isStatic())
    return ctx.error("the size of " + x->type().str() +
                     " is only known at run time; Kiln compiles static shapes (kiln run specializes a model to the "
                     "shapes of its inputs)");
  DenseTensor t = DenseTensor::zeros(TensorType{DType::I64, {}});
  t.setInt(0, numElements(x->type().shape));
  ctx.setOutput(0, ctx.constant(std::move(t)));
  return {};
}

Status convertReshape(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  std::vector<int64_t> dims;
  if (ctx.opset() < 5) {
    KILN_ASSIGN(attr, ctx.intsAttr("shape", {}));
    dims = attr;
  } else {
    KILN_TRY(rejectMovedAttribute(ctx, "shape", 5));
    KILN_ASSIGN(input, constantInts(ctx, 1, "shape"));
    dims = input;
  }
  KILN_ASSIGN(allowzero, ctx.intAttr("allowzero", 0));
  const Shape& in = x->type().shape;
  Shape shape;
  int64_t inferred = -1;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    if (d == 0 && !allowzero) {
      if (i >= in.size())
        return ctx.error("shape entry " + std::to_string(i) + " is 0 (copy the input dim), but the input " +
                         x->type().str() + " has no dim " + std::to_string(i));
      shape.push_back(in[i]);
    } else if (d == -1) {
      if (inferred >= 0) return ctx.error("shape has more than one -1");
      inferred = static_cast<int64_t>(i);
      shape.push_back(Dim::unknown());
    } else if (d < 0) {
      return ctx.error("shape entry " + std::to_string(i) + " is " + std::to_string(d) + " (expected -1 or more)");
    } else {
      shape.push_back(Dim::fixed(d));
    }
  }
  if (inferred >= 0 && x->type().isStatic()) {
    int64_t known = 1;
    for (const Dim& d : shape)
      if (d.isStatic()) known *= d.size;
    const int64_t count = numElements(in);
    if (known == 0 || count % known != 0)
      return ctx.error("cannot reshape " + x->type().str() + " to " + shapeStr(shape));
    shape[static_cast<size_t>(inferred)] = Dim::fixed(count / known);
  }
  return setOutput0(ctx, reshapeTo(ctx, x, std::move(shape)));
}

Status convertFlatten(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const int64_t rank = x->type().rank();
  KILN_ASSIGN(axis, ctx.intAttr("axis", 1));
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) return ctx.error("axis is out of range for " + x->type().str());
  const Shape& in = x->type().shape;
  Shape shape{productDim(in, 0, static_cast<size_t>(axis)), productDim(in, static_cast<size_t>(axis), in.size())};
  return setOutput0(ctx, reshapeTo(ctx, x, std::move(shape)));
}

Expected<std::vector<int64_t>> axesOf(NodeContext& ctx, int64_t inputSince, bool required) {
  KILN_TRY(rejectMovedAttribute(ctx, "axes", inputSince));
  if (ctx.opset() >= inputSince) {
    KILN_ASSIGN(axes, optionalConstantInts(ctx, 1, "axes"));
    if (!axes && required) return ctx.error("axes (input 1) is required");
    return axes ? *axes : std::vector<int64_t>{};
  }
  if (required && !ctx.attribute("axes")) return ctx.error("attribute 'axes' is required");
  return ctx.intsAttr("axes", {});
}

Status convertSqueeze(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(axes, axesOf(ctx, 13, false));
  if (axes.empty()) {
    // No axes: every dim of size 1, which must then be known.
    for (int64_t d = 0; d < x->type().rank(); ++d) {
      const Dim& dim = x->type().shape[static_cast<size_t>(d)];
      if (!dim.isStatic()) return ctx.error("squeezing without axes needs static dims, got " + x->type().str());
      if (dim.size == 1) axes.push_back(d);
    }
  }
  return setOutput0(ctx, squeezeAxes(ctx, x, axes));
}

Status convertUnsqueeze(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(axes, axesOf(ctx, 13, true));
  return setOutput0(ctx, unsqueezeAxes(ctx, x, axes));
}

Status convertTranspose(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const int64_t rank = x->type().rank();
  std::vector<int64_t> reversed;
  for (int64_t d = rank - 1; d >= 0; --d) reversed.push_back(d);
  KILN_ASSIGN(perm, ctx.intsAttr("perm", reversed));
  return setOutput0(ctx, ctx.emit(OpKind::Transpose, {x}, {{"perm", Attribute(perm)}}));
}

Status convertConcat(NodeContext& ctx) {
  std::vector<Value*> inputs;
  for (size_t i = 0; i < ctx.numInputs(); ++i) {
    if (!ctx.hasInput(i)) continue;
    KILN_INPUT(v, i);
    inputs.push_back(v);
  }
  if (inputs.empty()) return ctx.error("needs at least one input");
  // Opset 1-3 default the axis to 1; later opsets require it.
  if (ctx.opset() >= 4 && !ctx.attribute("axis")) return ctx.error("attribute 'axis' is required");
  KILN_ASSIGN(axis, ctx.intAttr("axis", 1));
  KILN_ASSIGN(a, normalizeAxis(ctx, axis, inputs[0]->type().rank()));
  return setOutput0(ctx, ctx.emit(OpKind::Concat, inputs, {{"axis", Attribute(a)}}));
}

/// A slice of `x` along one axis: [start, end).
Expected<Value*> sliceAxis(NodeContext& ctx, Value* x, int64_t axis, int64_t start, int64_t end, int64_t step = 1) {
  const int64_t rank = x->type().rank();
  std::vector<int64_t> starts(static_cast<size_t>(rank), 0), ends(static_cast<size_t>(rank), kInt64Max),
      steps(static_cast<size_t>(rank), 1);
  starts[static_cast<size_t>(axis)] = start;
  ends[static_cast<size_t>(axis)] = end;
  steps[static_cast<size_t>(axis)] = step;
  return ctx.emit(OpKind::Slice, {x},
                  {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
}

Status convertSplit(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(axisAttr, ctx.intAttr("axis", 0));
  KILN_ASSIGN(axis, normalizeAxis(ctx, axisAttr, x->type().rank()));
  const Dim& dim = x->type().shape[static_cast<size_t>(axis)];
  std::vector<int64_t> sizes;
  KILN_TRY(rejectMovedAttribute(ctx, "split", 13));
  if (ctx.opset() >= 13) {
    KILN_ASSIGN(input, optionalConstantInts(ctx, 1, "split"));
    if (input) sizes = *input;
  } else if (ctx.opset() == 1 && ctx.hasInput(1)) {
    KILN_ASSIGN(input, constantInts(ctx, 1, "split"));
    sizes = input;
  } else {
    KILN_ASSIGN(attr, ctx.intsAttr("split", {}));
    sizes = attr;
  }
  const int64_t outputs = static_cast<int64_t>(ctx.numOutputs());
  if (sizes.empty()) {
    if (!dim.isStatic()) return ctx.error("splitting needs a static size along the axis, got " + x->type().str());
    int64_t parts = outputs;
    if (ctx.opset() >= 18) {
      KILN_ASSIGN(n, ctx.intAttr("num_outputs", 0));
      if (n > 0) parts = n;
    }
    if (parts <= 0) return ctx.error("needs at least one output");
    if (parts != outputs)
      return ctx.error("num_outputs is " + std::to_string(parts) + " but the node has " + std::to_string(outputs) +
                       " outputs");
    // Equal parts; since opset 18 the last may be smaller (ceil division).
    const int64_t chunk = ctx.opset() >= 18 ? (dim.size + parts - 1) / parts : dim.size / parts;
    if (ctx.opset() < 18 && dim.size % parts != 0)
      return ctx.error("cannot split " + x->type().str() + " into " + std::to_string(parts) + " equal parts");
    int64_t left = dim.size;
    for (int64_t i = 0; i < parts; ++i) {
      sizes.push_back(std::min(chunk, left));
      left -= sizes.back();
    }
  }
  if (static_cast<int64_t>(sizes.size()) != outputs)
    return ctx.error("split has " + std::to_string(sizes.size()) + " sizes for " + std::to_string(outputs) +
                     " outputs");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) return ctx.error("split has a negative size " + std::to_string(s));
    total += s;
  }
  if (dim.isStatic() && total != dim.size)
    return ctx.error("split sizes sum to " + std::to_string(total) + ", but the axis has " + std::to_string(dim.size));
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    KILN_ASSIGN(part, sliceAxis(ctx, x, axis, start, start + sizes[i]));
    ctx.setOutput(i, part);
    start += sizes[i];
  }
  return {};
}

Status convertSlice(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const int64_t rank = x->type().rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    KILN_ASSIGN(s, ctx.intsAttr("starts", {}));
    KILN_ASSIGN(e, ctx.intsAttr("ends", {}));
    KILN_ASSIGN(a, ctx.intsAttr("axes", {}));
    starts = s, ends = e, axes = a;
  } else {
    for (const char* name : {"starts", "ends", "axes"}) KILN_TRY(rejectMovedAttribute(ctx, name, 10));
    KILN_ASSIGN(s, constantInts(ctx, 1, "starts"));
    KILN_ASSIGN(e, constantInts(ctx, 2, "ends"));
    KILN_ASSIGN(a, optionalConstantInts(ctx, 3, "axes"));
    KILN_ASSIGN(st, optionalConstantInts(ctx, 4, "steps"));
    starts = s, ends = e;
    if (a) axes = *a;
    if (st) steps = *st;
  }
  if (starts.size() != ends.size())
    return ctx.error("starts has " + std::to_string(starts.size()) + " entries but ends has " +
                     std::to_string(ends.size()));
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    return ctx.error("starts, ends, axes and steps must have the same length");
  KILN_ASSIGN(norm, normalizeAxes(ctx, axes, rank));
  std::vector<int64_t> allStarts(static_cast<size_t>(rank), 0), allEnds(static_cast<size_t>(rank), kInt64Max),
      allSteps(static_cast<size_t>(rank), 1);
  for (size_t i = 0; i < norm.size(); ++i) {
    if (steps[i] == 0) return ctx.error("steps must not be 0");
    const size_t d = static_cast<size_t>(norm[i]);
    allStarts[d] = starts[i];
    allEnds[d] = ends[i];
    allSteps[d] = steps[i];
  }
  return setOutput0(
      ctx, ctx.emit(OpKind::Slice, {x},
                    {{"starts", Attribute(allStarts)}, {"ends", Attribute(allEnds)}, {"steps", Attribute(allSteps)}}));
}

Status convertGather(NodeContext& ctx) {
  KILN_INPUT(data, 0);
  KILN_INPUT(indices, 1);
  KILN_ASSIGN(axisAttr, ctx.intAttr("axis", 0));
  KILN_ASSIGN(axis, normalizeAxis(ctx, axisAttr, data->type().rank()));
  return setOutput0(ctx, ctx.emit(OpKind::Gather, {data, indices}, {{"axis", Attribute(axis)}}));
}

Status convertGatherElements(NodeContext& ctx) {
  KILN_INPUT(data, 0);
  KILN_INPUT(indices, 1);
  KILN_ASSIGN(axisAttr, ctx.intAttr("axis", 0));
  KILN_ASSIGN(axis, normalizeAxis(ctx, axisAttr, data->type().rank()));
  return setOutput0(ctx, ctx.emit(OpKind::GatherElements, {data, indices}, {{"axis", Attribute(axis)}}));
}

Status convertScatterElements(NodeContext& ctx) {
  KILN_INPUT(data, 0);
  KILN_INPUT(indices, 1);
  KILN_INPUT(updates, 2);
  KILN_ASSIGN(axisAttr, ctx.intAttr("axis", 0));
  KILN_ASSIGN(axis, normalizeAxis(ctx, axisAttr, data->type().rank()));
  KILN_ASSIGN(reduction, ctx.stringAttr("reduction", "none"));
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" && reduction != "min")
    return ctx.error("reduction '" + reduction + "' is not one of none, add, mul, max, min");
  return setOutput0(ctx, ctx.emit(OpKind::ScatterElements, {data, indices, updates},
                                  {{"axis", Attribute(axis)}, {"reduction", Attribute(reduction)}}));
}

/// The result shape of Expand: NumPy broadcasting of the input and `dims`.
Expected<Shape> expandShape(NodeContext& ctx, const Shape& in, const std::vector<int64_t>& dims) {
  const size_t rank = std::max(in.size(), dims.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const bool hasIn = i + in.size() >= rank, hasDim = i + dims.size() >= rank;
    const Dim a = hasIn ? in[i + in.size() - rank] : Dim::fixed(1);
    const int64_t b = hasDim ? dims[i + dims.size() - rank] : 1;
    if (b < 0) return ctx.error("shape has a negative dim " + std::to_string(b));
    if (b == 1) {
      out[i] = a;
    } else if (a.isStatic() && a.size != 1 && a.size != b) {
      return ctx.error("cannot expand dim of size " + std::to_string(a.size) + " to " + std::to_string(b));
    } else {
      out[i] = Dim::fixed(b);
    }
  }
  return out;
}

Status convertExpand(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(dims, constantInts(ctx, 1, "shape"));
  KILN_ASSIGN(shape, expandShape(ctx, x->type().shape, dims));
  return setOutput0(ctx, broadcastTo(ctx, x, std::move(shape)));
}

/// Tile as reshape [1, d0, 1, d1, ...] -> broadcast [r0, d0, r1, d1, ...] -> reshape.
Status convertTile(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(repeats, constantInts(ctx, 1, "repeats"));
  const Shape& in = x->type().shape;
  if (repeats.size() != in.size())
    return ctx.error("repeats has " + std::to_string(repeats.size()) + " entries for the rank-" +
                     std::to_string(in.size()) + " input");
  Shape interleaved, expanded, result;
  for (size_t d = 0; d < in.size(); ++d) {
    if (repeats[d] < 0) return ctx.error("repeats has a negative entry");
    interleaved.push_back(Dim::fixed(1));
    interleaved.push_back(in[d]);
    expanded.push_back(Dim::fixed(repeats[d]));
    expanded.push_back(in[d]);
    if (repeats[d] == 1)
      result.push_back(in[d]);
    else if (in[d].isStatic())
      result.push_back(Dim::fixed(in[d].size * repeats[d]));
    else
      return ctx.error("tiling a dim that is only known at run time is not supported (" + x->type().str() + ")");
  }
  KILN_ASSIGN(a, reshapeTo(ctx, x, interleaved));
  KILN_ASSIGN(b, broadcastTo(ctx, a, expanded));
  return setOutput0(ctx, reshapeTo(ctx, b, result));
}

/// Identity of a tensor, or of a sequence or optional (opsets 14 and 16).
Status convertIdentity(NodeContext& ctx) {
  auto x = ctx.anyInput(0);
  if (!x) return x.takeError();
  ctx.setAnyOutput(0, std::move(*x));
  return {};
}

Status convertRange(NodeContext& ctx) {
  const DenseTensor* start = ctx.constantInput(0);
  const DenseTensor* limit = ctx.constantInput(1);
  const DenseTensor* delta = ctx.constantInput(2);
  if (!start || !limit || !delta)
    return ctx.error("start, limit and delta must be known at import time; Kiln compiles static shapes");
  if (start->numElements() != 1 || limit->numElements() != 1 || delta->numElements() != 1)
    return ctx.error("start, limit and delta must be scalars");
  const DType dtype = start->type.dtype;
  if (limit->type.dtype != dtype || delta->type.dtype != dtype)
    return ctx.error("start, limit and delta must have the same type");
  int64_t count = 0;
  if (isFloat(dtype)) {
    const double s = start->getDouble(0), l = limit->getDouble(0), d = delta->getDouble(0);
    if (d == 0) return ctx.error("delta must not be 0");
    // NaN and huge counts are refused before the conversion to an integer.
    const double n = std::ceil((l - s) / d);
    if (!(n <= static_cast<double>(kMaxGeneratedElements)))
      return ctx.error("range from " + std::to_string(s) + " to " + std::to_string(l) + " by " + std::to_string(d) +
                       " has too many elements (at most " + std::to_string(kMaxGeneratedElements) + ")");
    count = static_cast<int64_t>(std::max(0.0, n));
  } else {
    const int64_t s = start->getInt(0), l = limit->getInt(0), d = delta->getInt(0);
    if (d == 0) return ctx.error("delta must not be 0");
    const double n = std::ceil((static_cast<double>(l) - static_cast<double>(s)) / static_cast<double>(d));
    count = static_cast<int64_t>(std::clamp(n, 0.0, static_cast<double>(kMaxGeneratedElements) + 1));
  }
  if (count > kMaxGeneratedElements)
    return ctx.error("range of " + std::to_string(count) + " elements is too large (at most " +
                     std::to_string(kMaxGeneratedElements) + ")");
  DenseTensor out = DenseTensor::zeros(TensorType{dtype, staticShape({count})});
  for (int64_t i = 0; i < count; ++i) {
    if (isFloat(dtype))
      out.setDouble(i, start->getDouble(0) + static_cast<double>(i) * delta->getDouble(0));
    else
      out.setInt(i, start->getInt(0) + i * delta->getInt(0));
  }
  ctx.setOutput(0, ctx.constant(std::move(out)));
  return {};
}

Status convertOneHot(NodeContext& ctx) {
  KILN_INPUT(indices, 0);
  KILN_INPUT(values, 2);
  const DenseTensor* depthT = ctx.constantInput(1);
  if (!depthT || depthT->numElements() != 1) return ctx.error("depth (input 1) must be a scalar known at import time");
  const int64_t depth = static_cast<int64_t>(depthT->getDouble(0));
  if (depth <= 0) return ctx.error("depth must be positive, got " + std::to_string(depth));
  if (values->type().rank() != 1 || (values->type().shape[0].isStatic() && values->type().shape[0].size != 2))
    return ctx.error("values must be [off, on], got " + values->type().str());
  KILN_ASSIGN(axisAttr, ctx.intAttr("axis", -1));
  const int64_t rank = indices->type().rank() + 1;
  KILN_ASSIGN(axis, normalizeAxis(ctx, axisAttr, rank));
  // Indices may be floats; negative ones count from depth.
  KILN_ASSIGN(idx, castTo(ctx, indices, DType::I64));
  KILN_ASSIGN(isNeg, ctx.emit(OpKind::Lt, {idx, ctx.scalar(DType::I64, 0)}));
  KILN_ASSIGN(wrapped, ctx.emit(OpKind::Add, {idx, ctx.scalar(DType::I64, static_cast<double>(depth))}));
  KILN_ASSIGN(norm, ctx.emit(OpKind::Select, {isNeg, wrapped, idx}));
  KILN_ASSIGN(expanded, unsqueezeAxes(ctx, norm, {axis}));
  Shape classShape(static_cast<size_t>(rank), Dim::fixed(1));
  classShape[static_cast<size_t>(axis)] = Dim::fixed(depth);
  KILN_TRY(checkGeneratedSize(ctx, classShape, "the class indices"));
  DenseTensor classes = DenseTensor::zeros(TensorType{DType::I64, classShape});
  for (int64_t i = 0; i < depth; ++i) classes.setInt(i, i);
  KILN_ASSIGN(hot, ctx.emit(OpKind::Eq, {expanded, ctx.constant(std::move(classes))}));
  KILN_ASSIGN(off, sliceAxis(ctx, values, 0, 0, 1));
  KILN_ASSIGN(on, sliceAxis(ctx, values, 0, 1, 2));
  KILN_ASSIGN(offScalar, reshapeTo(ctx, off, {}));
  KILN_ASSIGN(onScalar, reshapeTo(ctx, on, {}));
  return setOutput0(ctx, ctx.emit(OpKind::Select, {hot, onScalar, offScalar}));
}

Status convertPad(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const int64_t rank = x->type().rank();
  KILN_ASSIGN(mode, ctx.stringAttr("mode", "constant"));
  if (mode != "constant" && mode != "reflect" && mode != "edge")
    return ctx.error("mode '" + mode + "' is not supported (expected constant, reflect or edge)");
  std::vector<int64_t> pads;
  double value = 0;
  if (ctx.opset() < 11) {
    KILN_ASSIGN(p, ctx.intsAttr(ctx.opset() < 2 ? "paddings" : "pads", {}));
    KILN_ASSIGN(v, ctx.floatAttr("value", 0.0));
    pads = p, value = v;
  } else {
    for (const char* name : {"pads", "value"}) KILN_TRY(rejectMovedAttribute(ctx, name, 11));
    KILN_ASSIGN(p, constantInts(ctx, 1, "pads"));
    pads = p;
    if (ctx.hasInput(2)) {
      const DenseTensor* c = ctx.constantInput(2);
      if (!c || c->numElements() != 1)
        return ctx.error("constant_value (input 2) must be a scalar known at import time");
      value = c->getDouble(0);
    }
    if (ctx.hasInput(3)) {
      KILN_ASSIGN(axes, constantInts(ctx, 3, "axes"));
      KILN_ASSIGN(norm, normalizeAxes(ctx, axes, rank));
      if (pads.size() != 2 * norm.size())
        return ctx.error("pads has " + std::to_string(pads.size()) + " entries for " + std::to_string(norm.size()) +
                         " axes (expected twice as many)");
      std::vector<int64_t> full(static_cast<size_t>(2 * rank), 0);
      for (size_t i = 0; i < norm.size(); ++i) {
        full[static_cast<size_t>(norm[i])] = pads[i];
        full[static_cast<size_t>(norm[i] + rank)] = pads[i + norm.size()];
      }
      pads = full;
    }
  }
  if (static_cast<int64_t>(pads.size()) != 2 * rank)
    return ctx.error("pads has " + std::to_string(pads.size()) + " entries, expected " + std::to_string(2 * rank) +
                     " for " + x->type().str());
  return setOutput0(ctx, ctx.emit(OpKind::Pad, {x},
                                  {{"pads", Attribute(pads)}, {"mode", Attribute(mode)}, {"value", Attribute(value)}}));
}

/// DepthToSpace / SpaceToDepth as reshape -> transpose -> reshape.
template <bool ToSpace>
Status convertDepthSpace(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(b, ctx.intAttr("blocksize", 0));
  KILN_ASSIGN(mode, ctx.stringAttr("mode", "DCR"));
  if (b <= 0) return ctx.error("blocksize must be positive");
  if (x->type().rank() != 4 || !x->type().isStatic())
    return ctx.error("expects a static 4-d input, got " + x->type().str());
  const auto dims = staticDims(x->type().shape);
  const int64_t n = dims[0], c = dims[1], h = dims[2], w = dims[3];
  Shape mid, out;
  std::vector<int64_t> perm;
  if (ToSpace) {
    if (c % (b * b) != 0) return ctx.error("channels " + std::to_string(c) + " are not divisible by blocksize^2");
    if (mode == "DCR") {
      mid = staticShape({n, b, b, c / (b * b), h, w});
      perm = {0, 3, 4, 1, 5, 2};
    } else if (mode == "CRD") {
      mid = staticShape({n, c / (b * b), b, b, h, w});
      perm = {0, 1, 4, 2, 5, 3};
    } else {
      return ctx.error("mode '" + mode + "' is not DCR or CRD");
    }
    out = staticShape({n, c / (b * b), h * b, w * b});
  } else {
    if (h % b != 0 || w % b != 0) return ctx.error("spatial dims are not divisible by blocksize");
    mid = staticShape({n, c, h / b, b, w / b, b});
    perm = {0, 3, 5, 1, 2, 4};
    out = staticShape({n, c * b * b, h / b, w / b});
  }
  KILN_ASSIGN(r, reshapeTo(ctx, x, mid));
  KILN_ASSIGN(t, ctx.emit(OpKind::Transpose, {r}, {{"perm", Attribute(perm)}}));
  return setOutput0(ctx, reshapeTo(ctx, t, out));
}

Status convertTrilu(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(upper, ctx.intAttr("upper", 1));
  int64_t k = 0;
  if (ctx.hasInput(1)) {
    KILN_ASSIGN(kv, constantInts(ctx, 1, "k"));
    if (kv.size() != 1) return ctx.error("k must be a scalar");
    k = kv[0];
  }
  const int64_t rank = x->type().rank();
  if (rank < 2) return ctx.error("expects at least 2 dims, got " + x->type().str());
  const Dim& rows = x->type().shape[static_cast<size_t>(rank - 2)];
  const Dim& cols = x->type().shape[static_cast<size_t>(rank - 1)];
  if (!rows.isStatic() || !cols.isStatic()) return ctx.error("expects static matrix dims, got " + x->type().str());
  // Keep element (i, j) when j - i >= k (upper) or j - i <= k (lower).
  KILN_TRY(checkGeneratedSize(ctx, staticShape({rows.size, cols.size}), "the triangle mask"));
  DenseTensor mask = DenseTensor::zeros(TensorType{DType::Bool, staticShape({rows.size, cols.size})});
  // An empty matrix may still have a huge dim; loop only when it has elements.
  if (mask.numElements() != 0)
    for (int64_t i = 0; i < rows.size; ++i)
      for (int64_t j = 0; j < cols.size; ++j) mask.setInt(i * cols.size + j, upper ? (j - i >= k) : (j - i <= k));
  return setOutput0(ctx, ctx.emit(OpKind::Select, {ctx.constant(std::move(mask)), x, ctx.scalar(x->type().dtype, 0)}));
}

Status convertEyeLike(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(k, ctx.intAttr("k", 0));
  DType dtype = x->type().dtype;
  if (const onnx::AttributeProto* a = ctx.attribute("dtype")) {
    const std::optional<DType> chosen = dtypeFromOnnx(static_cast<int32_t>(a->i()));
    if (!chosen) return ctx.error("dtype " + std::to_string(a->i()) + " is not supported");
    dtype = *chosen;
  }
  if (x->type().rank() != 2 || !x->type().isStatic())
    return ctx.error("expects a static 2-d input, got " + x->type().str());
  const auto dims = staticDims(x->type().shape);
  KILN_TRY(checkGeneratedSize(ctx, x->type().shape, "the identity matrix"));
  DenseTensor eye = DenseTensor::zeros(TensorType{dtype, x->type().shape});
  // Rows i with 0 <= i + k < cols hold a one; the bounds keep the loop within
  // the matrix even when one dim is 0 and the other huge.
  if (k > -dims[0] && k < dims[1]) {
    const int64_t first = std::max<int64_t>(0, -k);
    const int64_t last = std::min(dims[0], dims[1] - k);
    for (int64_t i = first; i < last; ++i) eye.setDouble(i * dims[1] + i + k, 1.0);
  }
  ctx.setOutput(0, ctx.constant(std::move(eye)));
  return {};
}

/// Hann, Hamming and Blackman windows: sum_k a_k cos(2 pi k n / N') with
/// N' = size (periodic) or size - 1 (symmetric).
template <int Kind>
Status convertWindow(NodeContext& ctx) {
  const DenseTensor* sizeT = ctx.constantInput(0);
  if (!sizeT || sizeT->numElements() != 1) return ctx.error("size (input 0) must be a scalar known at import time");
  const int64_t size = sizeT->getInt(0);
  if (size < 0 || size > (int64_t{1} << 24)) return ctx.error("size " + std::to_string(size) + " is out of range");
  KILN_ASSIGN(periodic, ctx.intAttr("periodic", 1));
  KILN_ASSIGN(outType, ctx.intAttr("output_datatype", onnx::TensorProto::FLOAT));
  DType dtype;
  switch (outType) {
    case onnx::TensorProto::FLOAT: dtype = DType::F32; break;
    case onnx::TensorProto::DOUBLE: dtype = DType::F64; break;
    case onnx::TensorProto::FLOAT16: dtype = DType::F16; break;
    default: return ctx.error("output_datatype " + std::to_string(outType) + " is not supported");
  }
  const double pi = 3.14159265358979323846;
  const double n1 = periodic ? static_cast<double>(size) : static_cast<double>(size - 1);
  const double a0 = Kind == 0 ? 0.5 : Kind == 1 ? 25.0 / 46.0 : 0.42;
  const double a1 = Kind == 0 ? 0.5 : Kind == 1 ? 1 - 25.0 / 46.0 : 0.5;
  const double a2 = Kind == 2 ? 0.08 : 0.0;
  DenseTensor out = DenseTensor::zeros(TensorType{dtype, staticShape({size})});
  for (int64_t i = 0; i < size; ++i) {
    const double x = 2 * pi * static_cast<double>(i) / n1;
    out.setDouble(i, a0 - a1 * std::cos(x) + a2 * std::cos(2 * x));
  }
  ctx.setOutput(0, ctx.constant(std::move(out)));
  return {};
}

/// The row-major linear index of index tuples `indices[..., :k]` into the
/// dims `dims` (negative entries count from the back), as an i64 tensor of
/// shape indices.shape[:-1].
Expected<Value*> linearIndex(NodeContext& ctx, Value* indices, const std::vector<int64_t>& dims) {
  const int64_t k = static_cast<int64_t>(dims.size());
  KILN_ASSIGN(idx, castTo(ctx, indices, DType::I64));
  std::vector<int64_t> strides(dims.size(), 1);
  for (int64_t j = k - 2; j >= 0; --j)
    strides[static_cast<size_t>(j)] = strides[static_cast<size_t>(j + 1)] * dims[static_cast<size_t>(j + 1)];
  KILN_ASSIGN(negative, ctx.emit(OpKind::Lt, {idx, ctx.scalar(DType::I64, 0)}));
  KILN_ASSIGN(wrapped, ctx.emit(OpKind::Add, {idx, ctx.constant(int64Vector(dims))}));
  KILN_ASSIGN(norm, ctx.emit(OpKind::Select, {negative, wrapped, idx}));
  KILN_ASSIGN(scaled, ctx.emit(OpKind::Mul, {norm, ctx.constant(int64Vector(strides))}));
  const int64_t last = idx->type().rank() - 1;
  return ctx.emit(OpKind::ReduceSum, {scaled}, {{"axes", Attribute(std::vector<int64_t>{last})}});
}

/// GatherND as one gather on the data with its leading (batch and indexed)
/// dims flattened, at linear indices.
Status convertGatherND(NodeContext& ctx) {
  KILN_INPUT(data, 0);
  KILN_INPUT(indices, 1);
  KILN_ASSIGN(batch, ctx.intAttr("batch_dims", 0));
  // The indices' dims other than the batch dims and the tuple length may be
  // unknown: the tuples a NonZero found (PyTorch's x[mask] exports as
  // NonZero, Transpose, GatherND).
  const Shape& qShape = indices->type().shape;
  if (!data->type().isStatic() || qShape.empty() || !qShape.back().isStatic())
    return ctx.error("GatherND needs a static data shape and index tuple length, got " + data->type().str() + " and " +
                     indices->type().str());
  const auto d = staticDims(data->type().shape);
  const int64_t r = static_cast<int64_t>(d.size()), qr = static_cast<int64_t>(qShape.size());
  if (batch < 0 || batch >= std::min(r, qr))
    return ctx.error("batch_dims " + std::to_string(batch) + " is out of range");
  const int64_t k = qShape.back().size;
  if (k < 1 || batch + k > r)
    return ctx.error("index tuples of length " + std::to_string(k) + " do not fit " + data->type().str());
  std::vector<int64_t> q;  // the batch dims
  for (int64_t i = 0; i < batch; ++i) {
    const Dim& dim = qShape[static_cast<size_t>(i)];
    if (!dim.isStatic() || dim.size != d[static_cast<size_t>(i)])
      return ctx.error("batch dims of data and indices differ");
    q.push_back(dim.size);
  }
  std::vector<int64_t> indexed(d.begin() + batch, d.begin() + batch + k);
  KILN_ASSIGN(lin, linearIndex(ctx, indices, indexed));
  int64_t inner = 1, batches = 1;
  for (int64_t v : indexed) inner *= v;
  for (int64_t i = 0; i < batch; ++i) batches *= d[static_cast<size_t>(i)];
  Value* flatIndex = lin;
  if (batch > 0) {
    // Each index tuple also selects its batch: add batch * inner.
    Shape offShape(static_cast<size_t>(qr - 1), Dim::fixed(1));
    for (int64_t i = 0; i < batch; ++i) offShape[static_cast<size_t>(i)] = Dim::fixed(q[static_cast<size_t>(i)]);
    KILN_TRY(checkGeneratedSize(ctx, offShape, "the batch offsets"));
    DenseTensor offsets = DenseTensor::zeros(TensorType{DType::I64, offShape});
    for (int64_t b = 0; b < batches; ++b) offsets.setInt(b, b * inner);
    KILN_ASSIGN(withBatch, ctx.emit(OpKind::Add, {lin, ctx.constant(std::move(offsets))}));
    flatIndex = withBatch;
  }
  Shape flat{Dim::fixed(batches * inner)};
  for (int64_t i = batch + k; i < r; ++i) flat.push_back(Dim::fixed(d[static_cast<size_t>(i)]));
  KILN_ASSIGN(flatData, reshapeTo(ctx, data, flat));
  return setOutput0(ctx, ctx.emit(OpKind::Gather, {flatData, flatIndex}, {{"axis", Attribute(int64_t{0})}}));
}

/// ScatterND as scatter_elements along the flattened indexed dims of a 2-d
/// view [indexed, rest] of the data.
Status convertScatterND(NodeContext& ctx) {
  KILN_INPUT(data, 0);
  KILN_INPUT(indices, 1);
  KILN_INPUT(updates, 2);
  KILN_ASSIGN(reduction, ctx.stringAttr("reduction", "none"));
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" && reduction != "min")
    return ctx.error("reduction '" + reduction + "' is not one of none, add, mul, max, min");
  if (!data->type().isStatic() || !indices->type().isStatic())
    return ctx.error("ScatterND needs static shapes, got " + data->type().str() + " and " + indices->type().str());
  const auto d = staticDims(data->type().shape);
  const auto q = staticDims(indices->type().shape);
  if (q.empty()) return ctx.error("indices must have at least one dim");
  const int64_t k = q.back();
  if (k < 1 || k > static_cast<int64_t>(d.size()))
    return ctx.error("index tuples of length " + std::to_string(k) + " do not fit " + data->type().str());
  std::vector<int64_t> indexed(d.begin(), d.begin() + k);
  KILN_ASSIGN(lin, linearIndex(ctx, indices, indexed));
  int64_t rows = 1, rest = 1, n = 1;
  for (int64_t v : indexed) rows *= v;
  for (size_t i = static_cast<size_t>(k); i < d.size(); ++i) rest *= d[i];
  for (size_t i = 0; i + 1 < q.size(); ++i) n *= q[i];
  KILN_ASSIGN(data2d, reshapeTo(ctx, data, staticShape({rows, rest})));
  KILN_ASSIGN(lin2d, reshapeTo(ctx, lin, staticShape({n, 1})));
  KILN_ASSIGN(linFull, broadcastTo(ctx, lin2d, staticShape({n, rest})));
  KILN_ASSIGN(upd2d, reshapeTo(ctx, updates, staticShape({n, rest})));
  KILN_ASSIGN(scattered, ctx.emit(OpKind::ScatterElements, {data2d, linFull, upd2d},
                                  {{"axis", Attribute(int64_t{0})}, {"reduction", Attribute(reduction)}}));
  return setOutput0(ctx, reshapeTo(ctx, scattered, data->type().shape));
}

/// Compress with a condition known at import time: a gather of the kept positions.
Status convertCompress(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const DenseTensor* cond = ctx.constantInput(1);
  if (!cond) return ctx.error("condition (input 1) must be known at import time; Kiln compiles static shapes");
  Value* data = x;
  int64_t axis = 0;
  if (ctx.attribute("axis")) {
    KILN_ASSIGN(a, ctx.intAttr("axis", 0));
    KILN_ASSIGN(norm, normalizeAxis(ctx, a, x->type().rank()));
    axis = norm;
  } else {
    KILN_ASSIGN(flat, reshapeTo(ctx, x, {productDim(x->type().shape, 0, x->type().shape.size())}));
    data = flat;
  }
  const Dim& dim = data->type().shape[static_cast<size_t>(axis)];
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < cond->numElements(); ++i) {
    if (cond->getDouble(i) == 0) continue;
    if (dim.isStatic() && i >= dim.size) return ctx.error("condition is longer than the compressed axis");
    kept.push_back(i);
  }
  return setOutput0(ctx,
                    ctx.emit(OpKind::Gather, {data, ctx.constant(int64Vector(kept))}, {{"axis", Attribute(axis)}}));
}

/// ReverseSequence with lengths known at import time: a gather_elements
/// along the time axis with each batch entry's first `len` steps reversed.
Status convertReverseSequence(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_ASSIGN(lens, constantInts(ctx, 1, "sequence_lens"));
  KILN_ASSIGN(batchAttr, ctx.intAttr("batch_axis", 1));
  KILN_ASSIGN(timeAttr, ctx.intAttr("time_axis", 0));
  if (!x->type().isStatic()) return ctx.error("ReverseSequence needs a static shape, got " + x->type().str());
  const int64_t rank = x->type().rank();
  KILN_ASSIGN(batchAxis, normalizeAxis(ctx, batchAttr, rank, "batch_axis"));
  KILN_ASSIGN(timeAxis, normalizeAxis(ctx, timeAttr, rank, "time_axis"));
  if (batchAxis == timeAxis || rank < 2) return ctx.error("batch_axis and time_axis must differ");
  const auto dims = staticDims(x->type().shape);
  const int64_t batches = dims[static_cast<size_t>(batchAxis)], steps = dims[static_cast<size_t>(timeAxis)];
  if (static_cast<int64_t>(lens.size()) != batches) return ctx.error("sequence_lens must have one entry per batch");
  KILN_TRY(checkGeneratedSize(ctx, x->type().shape, "the reversal index"));
  DenseTensor index = DenseTensor::zeros(TensorType{DType::I64, x->type().shape});
  const std::vector<int64_t> zero(dims.size(), 0);
  std::vector<int64_t> pos(dims.size(), 0);
  for (int64_t i = 0; i < index.numElements(); ++i) {
    const int64_t b = pos[static_cast<size_t>(batchAxis)], t = pos[static_cast<size_t>(timeAxis)];
    const int64_t len = std::clamp<int64_t>(lens[static_cast<size_t>(b)], 0, steps);
    index.setInt(i, t < len ? len - 1 - t : t);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++pos[static_cast<size_t>(d)] < dims[static_cast<size_t>(d)]) break;
      pos[static_cast<size_t>(d)] = 0;
    }
  }
  return setOutput0(
      ctx, ctx.emit(OpKind::GatherElements, {x, ctx.constant(std::move(index))}, {{"axis", Attribute(timeAxis)}}));
}

constexpr OpConverter kConverters[] = {
    {"", "Constant", 1, kNewest, &convertConstant},
    {"", "ConstantOfShape", 9, kNewest, &convertConstantOfShape},
    {"", "Shape", 1, kNewest, &convertShape},
    {"", "Size", 1, kNewest, &convertSize},
    {"", "Reshape", 1, kNewest, &convertReshape},
    {"", "Flatten", 1, kNewest, &convertFlatten},
    {"", "Squeeze", 1, kNewest, &convertSqueeze},
    {"", "Unsqueeze", 1, kNewest, &convertUnsqueeze},
    {"", "Transpose", 1, kNewest, &convertTranspose},
    {"", "Concat", 1, kNewest, &convertConcat},
    {"", "Split", 1, kNewest, &convertSplit},
    {"", "Slice", 1, kNewest, &convertSlice},
    {"", "Gather", 1, kNewest, &convertGather},
    {"", "GatherElements", 11, kNewest, &convertGatherElements},
    {"", "ScatterElements", 11, kNewest, &convertScatterElements},
    {"", "Scatter", 9, 10, &convertScatterElements},
    {"", "Expand", 8, kNewest, &convertExpand},
    {"", "Tile", 6, kNewest, &convertTile},
    {"", "Identity", 1, kNewest, &convertIdentity},
    {"", "Range", 11, kNewest, &convertRange},
    {"", "OneHot", 9, kNewest, &convertOneHot},
    {"", "Pad", 1, kNewest, &convertPad},
    {"", "DepthToSpace", 1, kNewest, &convertDepthSpace<true>},
    {"", "SpaceToDepth", 1, kNewest, &convertDepthSpace<false>},
    {"", "Trilu", 14, kNewest, &convertTrilu},
    {"", "EyeLike", 9, kNewest, &convertEyeLike},
    {"", "HannWindow", 17, kNewest, &convertWindow<0>},
    {"", "HammingWindow", 17, kNewest, &convertWindow<1>},
    {"", "BlackmanWindow", 17, kNewest, &convertWindow<2>},
    {"", "GatherND", 11, kNewest, &convertGatherND},
    {"", "ScatterND", 11, kNewest, &convertScatterND},
    {"", "Compress", 9, kNewest, &convertCompress},
    {"", "ReverseSequence", 10, kNewest, &convertReverseSequence},
};

}  // namespace

std::span<const OpConverter> tensorConverters() { return kConverters; }

}  // namespace kiln::onnx_import
