// Converters for ONNX's sequence ops: SequenceConstruct, SequenceEmpty,
// SequenceInsert, SequenceErase, SequenceAt, SequenceLength, SplitToSequence
// and ConcatFromSequence. Kiln IR has no sequence type: a sequence is
// resolved at import into a "static sequence", the list of Kiln values of
// its elements (NodeContext::sequenceInput / setSequenceOutput). So every
// position and split size must be known when the model is loaded (a
// constant, an initializer or a folded computation); one known only at run
// time is an error naming the node. Only tensors leave the sequence ops
// (SequenceAt, SequenceLength as an i64 constant, ConcatFromSequence as
// `concat`); a sequence that reaches a graph output or an If/Loop/Scan body
// is an error of the importer.
#include <algorithm>
#include <limits>

#include "frontend/onnx/ConverterSupport.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {
namespace {

constexpr int64_t kNewest = kNewestOnnxOpset;

#define KILN_SEQUENCE(var, i)             \
  auto var##_ = ctx.sequenceInput(i);     \
  if (!var##_) return var##_.takeError(); \
  std::vector<Value*> var = std::move(*var##_)

#define KILN_ASSIGN(var, expr)            \
  auto var##_ = (expr);                   \
  if (!var##_) return var##_.takeError(); \
  auto var = std::move(*var##_)

/// The position input `i` of a sequence op, known at import, as an index
/// into a sequence of `length` elements: in [-length, length - 1], or up to
/// `length` when `allowEnd` (SequenceInsert); negative counts from the back.
Expected<size_t> constantPosition(NodeContext& ctx, size_t i, size_t length, bool allowEnd) {
  const DenseTensor* t = ctx.constantInput(i);
  if (!t)
    return ctx.error("the position of " + ctx.node().op_type() +
                     " must be known when the model is loaded; Kiln resolves sequences at import");
  if (t->type.dtype != DType::I32 && t->type.dtype != DType::I64)
    return ctx.error("the position is " + t->type.str() + ", expected an int32 or int64 scalar");
  if (t->numElements() != 1 || t->type.rank() > 1)
    return ctx.error("the position is " + t->type.str() + ", expected a scalar");
  const int64_t pos = tensorInts(*t)[0];
  const int64_t n = static_cast<int64_t>(length);
  const int64_t last = allowEnd ? n : n - 1;
  if (pos < -n || pos > last)
    return ctx.error("position " + std::to_string(pos) + " is out of range for a sequence of " + std::to_string(n) +
                     " elements, expected [" + std::to_string(-n) + ", " + std::to_string(last) + "]");
  return static_cast<size_t>(pos < 0 ? pos + n : pos);
}

/// Elements of one sequence have one dtype.
Status checkElementType(NodeContext& ctx, const std::vector<Value*>& sequence, const Value* v,
                        const std::string& what) {
  if (!sequence.empty() && sequence.front()->type().dtype != v->type().dtype)
    return ctx.error(what + " is " + v->type().str() + ", but the sequence holds " + sequence.front()->type().str());
  return {};
}

Status convertSequenceConstruct(NodeContext& ctx) {
  std::vector<Value*> elements;
  for (size_t i = 0; i < ctx.numInputs(); ++i) {
    auto v = ctx.input(i);
    if (!v) return v.takeError();
    KILN_TRY(checkElementType(ctx, elements, *v, "input " + std::to_string(i)));
    elements.push_back(*v);
  }
  if (elements.empty()) return ctx.error("needs at least one input");
  ctx.setSequenceOutput(0, std::move(elements));
  return {};
}

Status convertSequenceEmpty(NodeContext& ctx) {
  if (const auto* a = ctx.attribute("dtype")) {
    KILN_ASSIGN(type, ctx.intAttr("dtype", 0));
    if (!dtypeFromOnnx(static_cast<int32_t>(type)))
      return ctx.error("attribute '" + a->name() + "' is " + std::to_string(type) + ", a type Kiln has no dtype for");
  }
  ctx.setSequenceOutput(0, {});
  return {};
}

Status convertSequenceInsert(NodeContext& ctx) {
  KILN_SEQUENCE(sequence, 0);
  auto v = ctx.input(1);
  if (!v) return v.takeError();
  KILN_TRY(checkElementType(ctx, sequence, *v, "the inserted tensor"));
  size_t at = sequence.size();  // the end by default
  if (ctx.hasInput(2)) {
    KILN_ASSIGN(pos, constantPosition(ctx, 2, sequence.size(), /*allowEnd=*/true));
    at = pos;
  }
  sequence.insert(sequence.begin() + static_cast<std::ptrdiff_t>(at), *v);
  ctx.setSequenceOutput(0, std::move(sequence));
  return {};
}

Status convertSequenceErase(NodeContext& ctx) {
  KILN_SEQUENCE(sequence, 0);
  if (sequence.empty()) return ctx.error("cannot erase from an empty sequence");
  size_t at = sequence.size() - 1;  // the last by default
  if (ctx.hasInput(1)) {
    KILN_ASSIGN(pos, constantPosition(ctx, 1, sequence.size(), /*allowEnd=*/false));
    at = pos;
  }
  sequence.erase(sequence.begin() + static_cast<std::ptrdiff_t>(at));
  ctx.setSequenceOutput(0, std::move(sequence));
  return {};
}

Status convertSequenceAt(NodeContext& ctx) {
  KILN_SEQUENCE(sequence, 0);
  if (!ctx.hasInput(1)) return ctx.error("input 1 (position) is required but absent");
  KILN_ASSIGN(at, constantPosition(ctx, 1, sequence.size(), /*allowEnd=*/false));
  ctx.setOutput(0, sequence[at]);
  return {};
}

Status convertSequenceLength(NodeContext& ctx) {
  KILN_SEQUENCE(sequence, 0);
  ctx.setOutput(0, ctx.scalar(DType::I64, static_cast<double>(sequence.size())));
  return {};
}

/// A slice of `x` along one axis: [start, end).
Expected<Value*> sliceAxis(NodeContext& ctx, Value* x, int64_t axis, int64_t start, int64_t end) {
  const size_t rank = static_cast<size_t>(x->type().rank());
  std::vector<int64_t> starts(rank, 0), ends(rank, std::numeric_limits<int64_t>::max()), steps(rank, 1);
  starts[static_cast<size_t>(axis)] = start;
  ends[static_cast<size_t>(axis)] = end;
  return ctx.emit(OpKind::Slice, {x},
                  {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
}

Status convertSplitToSequence(NodeContext& ctx) {
  auto xOr = ctx.input(0);
  if (!xOr) return xOr.takeError();
  Value* x = *xOr;
  const int64_t rank = x->type().rank();
  if (rank == 0) return ctx.error("cannot split a scalar");
  KILN_ASSIGN(axisAttr, ctx.intAttr("axis", 0));
  KILN_ASSIGN(axis, normalizeAxis(ctx, axisAttr, rank));
  KILN_ASSIGN(keepdims, ctx.intAttr("keepdims", 1));
  if (keepdims != 0 && keepdims != 1)
    return ctx.error("attribute 'keepdims' is " + std::to_string(keepdims) + ", expected 0 or 1");
  const Dim& dim = x->type().shape[static_cast<size_t>(axis)];
  if (!dim.isStatic())
    return ctx.error("splitting needs a size along axis " + std::to_string(axis) +
                     " known when the model is loaded (Kiln resolves sequences at import), got " + x->type().str());
  const int64_t size = dim.size;

  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (!ctx.hasInput(1)) {
    // Parts of 1, without the axis unless keepdims.
    sizes.assign(static_cast<size_t>(size), 1);
    squeeze = keepdims == 0;
  } else {
    const DenseTensor* split = ctx.constantInput(1);
    if (!split)
      return ctx.error(
          "the split of SplitToSequence must be known when the model is loaded; Kiln resolves "
          "sequences at import");
    if (split->type.dtype != DType::I32 && split->type.dtype != DType::I64)
      return ctx.error("the split is " + split->type.str() + ", expected int32 or int64");
    const std::vector<int64_t> values = tensorInts(*split);
    if (split->type.rank() == 0) {
      // Parts of that size; the last may be smaller.
      const int64_t chunk = values[0];
      if (chunk <= 0) return ctx.error("the split size is " + std::to_string(chunk) + ", expected a positive size");
      for (int64_t left = size; left > 0; left -= chunk) sizes.push_back(std::min(chunk, left));
    } else if (split->type.rank() == 1) {
      int64_t total = 0;
      for (int64_t s : values) {
        if (s < 0) return ctx.error("the split has a negative size " + std::to_string(s));
        total += s;
      }
      if (total != size)
        return ctx.error("the split sizes sum to " + std::to_string(total) + ", but axis " + std::to_string(axis) +
                         " of " + x->type().str() + " has " + std::to_string(size));
      sizes = values;
    } else {
      return ctx.error("the split is " + split->type.str() + ", expected a scalar or a 1-D tensor");
    }
  }

  std::vector<Value*> elements;
  int64_t start = 0;
  for (int64_t s : sizes) {
    KILN_ASSIGN(part, sliceAxis(ctx, x, axis, start, start + s));
    start += s;
    if (squeeze) {
      KILN_ASSIGN(squeezed, squeezeAxes(ctx, part, {axis}));
      part = squeezed;
    }
    elements.push_back(part);
  }
  ctx.setSequenceOutput(0, std::move(elements));
  return {};
}

Status convertConcatFromSequence(NodeContext& ctx) {
  KILN_SEQUENCE(sequence, 0);
  if (!ctx.attribute("axis")) return ctx.error("attribute 'axis' is required");
  KILN_ASSIGN(axisAttr, ctx.intAttr("axis", 0));
  KILN_ASSIGN(newAxis, ctx.intAttr("new_axis", 0));
  if (newAxis != 0 && newAxis != 1)
    return ctx.error("attribute 'new_axis' is " + std::to_string(newAxis) + ", expected 0 or 1");
  if (sequence.empty()) return ctx.error("cannot concatenate an empty sequence");
  const int64_t rank = sequence.front()->type().rank();
  for (size_t i = 1; i < sequence.size(); ++i)
    if (sequence[i]->type().rank() != rank)
      return ctx.error("element " + std::to_string(i) + " is " + sequence[i]->type().str() + ", but element 0 is " +
                       sequence.front()->type().str() + " (elements must have one rank)");
  // With new_axis the elements are stacked along a new axis in [0, rank].
  KILN_ASSIGN(axis, normalizeAxis(ctx, axisAttr, rank + newAxis));
  std::vector<Value*> parts;
  for (Value* v : sequence) {
    if (newAxis == 1) {
      KILN_ASSIGN(stacked, unsqueezeAxes(ctx, v, {axis}));
      parts.push_back(stacked);
    } else {
      parts.push_back(v);
    }
  }
  if (parts.size() == 1) {
    ctx.setOutput(0, parts[0]);
    return {};
  }
  return setOutput0(ctx, ctx.emit(OpKind::Concat, std::move(parts), {{"axis", Attribute(axis)}}));
}

constexpr OpConverter kConverters[] = {
    {"", "SequenceConstruct", 11, kNewest, &convertSequenceConstruct},
    {"", "SequenceEmpty", 11, kNewest, &convertSequenceEmpty},
    {"", "SequenceInsert", 11, kNewest, &convertSequenceInsert},
    {"", "SequenceErase", 11, kNewest, &convertSequenceErase},
    {"", "SequenceAt", 11, kNewest, &convertSequenceAt},
    {"", "SequenceLength", 11, kNewest, &convertSequenceLength},
    {"", "SplitToSequence", 11, kNewest, &convertSplitToSequence},
    {"", "ConcatFromSequence", 11, kNewest, &convertConcatFromSequence},
};

}  // namespace

std::span<const OpConverter> sequenceConverters() { return kConverters; }

}  // namespace kiln::onnx_import
