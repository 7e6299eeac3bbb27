// Converters for ONNX's sequence ops (SequenceConstruct, SequenceEmpty,
// SequenceInsert, SequenceErase, SequenceAt, SequenceLength, SplitToSequence,
// ConcatFromSequence, SequenceMap) and optional ops (Optional,
// OptionalHasElement, OptionalGetElement). Kiln IR has no sequence or
// optional type: a sequence is resolved at import into a "static sequence",
// the list of Kiln values of its elements, and an optional into whether it
// holds a value and which (ImportValue, NodeContext::anyInput /
// setAnyOutput). So every position, split size and presence must be known
// when the model is loaded (a constant, an initializer, a folded computation,
// or a graph input specialized to the value it takes, frontend/Model.h); one
// known only at run time is an error naming the node. SequenceMap inlines its
// body once per element; OptionalHasElement is a bool constant. A sequence
// or optional reaches a graph output as the tensors it holds; one that an
// If or Loop body not resolved at import (a condition or trip count known
// only at run time) would read or return is an error of the importer.
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

/// SequenceMap: its body inlined once per element of the first input, with
/// the same element of every other sequence input and the tensor inputs as
/// they are; output k is the sequence of the body's output k.
Status convertSequenceMap(NodeContext& ctx) {
  KILN_SEQUENCE(first, 0);
  std::vector<ImportValue> others;
  for (size_t i = 1; i < ctx.numInputs(); ++i) {
    KILN_ASSIGN(v, ctx.anyInput(i));
    if (v.kind == ValueKind::Sequence) {
      if (v.elements.size() != first.size())
        return ctx.error("input " + std::to_string(i) + " is a sequence of " + std::to_string(v.elements.size()) +
                         " elements, but input 0 has " + std::to_string(first.size()) +
                         " (the sequences of a SequenceMap have one length)");
    } else if (v.kind != ValueKind::Tensor) {
      return ctx.error("input " + std::to_string(i) + " is " + std::string(valueKindName(v.kind)) +
                       ", expected a sequence or a tensor");
    }
    others.push_back(std::move(v));
  }
  std::vector<std::vector<Value*>> outputs(ctx.numOutputs());
  for (size_t e = 0; e < first.size(); ++e) {
    std::vector<ImportValue> args = {ImportValue::ofTensor(first[e])};
    for (const ImportValue& v : others)
      args.push_back(v.kind == ValueKind::Sequence ? ImportValue::ofTensor(v.elements[e]) : v);
    KILN_ASSIGN(results, ctx.inlineBody("body", args, "_map" + std::to_string(e)));
    if (results.size() != outputs.size())
      return ctx.error("the body gives " + std::to_string(results.size()) + " outputs, for " +
                       std::to_string(outputs.size()) + " node outputs");
    for (size_t k = 0; k < results.size(); ++k) {
      if (results[k].kind != ValueKind::Tensor)
        return ctx.error("body output " + std::to_string(k) + " is " + std::string(valueKindName(results[k].kind)) +
                         ", expected a tensor (an element of output sequence " + std::to_string(k) + ")");
      KILN_TRY(checkElementType(ctx, outputs[k], results[k].tensor, "body output " + std::to_string(k)));
      outputs[k].push_back(results[k].tensor);
    }
  }
  for (size_t k = 0; k < outputs.size(); ++k) ctx.setSequenceOutput(k, std::move(outputs[k]));
  return {};
}

/// Optional: input 0 (a tensor or a sequence) made an optional, or, without
/// it, the absent optional of the type attribute.
Status convertOptional(NodeContext& ctx) {
  if (ctx.hasInput(0)) {
    KILN_ASSIGN(v, ctx.anyInput(0));
    if (v.isOptional()) return ctx.error("input 0 is already an optional, expected a tensor or a sequence");
    ctx.setAnyOutput(0, v.wrapped());
    return {};
  }
  if (!ctx.attribute("type")) return ctx.error("needs input 0 or attribute 'type' (the type of an empty optional)");
  ctx.setAnyOutput(0, ImportValue::none());
  return {};
}

/// OptionalHasElement: whether input 0 holds a value, known at import (an
/// absent input, allowed from opset 18, does not; a tensor or sequence given
/// where an optional is expected, allowed from opset 18, does).
Status convertOptionalHasElement(NodeContext& ctx) {
  bool present = false;
  if (ctx.hasInput(0)) {
    KILN_ASSIGN(v, ctx.anyInput(0));
    present = v.kind != ValueKind::OptionalNone;
  } else if (ctx.opset() < 18) {
    return ctx.error("input 0 is required before opset 18");
  }
  ctx.setOutput(0, ctx.scalar(DType::Bool, present ? 1 : 0));
  return {};
}

/// OptionalGetElement: the tensor or sequence an optional holds (a tensor or
/// sequence as it is, from opset 18); an absent one is an error at import.
Status convertOptionalGetElement(NodeContext& ctx) {
  KILN_ASSIGN(v, ctx.anyInput(0));
  if (v.kind == ValueKind::OptionalNone)
    return ctx.error("input 0 '" + ctx.node().input(0) +
                     "' is an absent optional, which holds no element (known when the model is loaded)");
  ctx.setAnyOutput(0, v.contents());
  return {};
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
    {"", "SequenceMap", 17, kNewest, &convertSequenceMap},
    {"", "Optional", 15, kNewest, &convertOptional},
    {"", "OptionalHasElement", 15, kNewest, &convertOptionalHasElement},
    {"", "OptionalGetElement", 15, kNewest, &convertOptionalGetElement},
};

}  // namespace

std::span<const OpConverter> sequenceConverters() { return kConverters; }

}  // namespace kiln::onnx_import
