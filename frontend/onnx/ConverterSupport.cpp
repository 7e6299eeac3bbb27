// Helpers shared by the ONNX op converters; see ConverterSupport.h.
#include "frontend/onnx/ConverterSupport.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "onnx.pb.h"

namespace kiln::onnx_import {

std::optional<DType> dtypeFromOnnx(int32_t type) {
  switch (type) {
    case onnx::TensorProto::FLOAT: return DType::F32;
    case onnx::TensorProto::DOUBLE: return DType::F64;
    case onnx::TensorProto::FLOAT16: return DType::F16;
    case onnx::TensorProto::BFLOAT16: return DType::BF16;
    case onnx::TensorProto::INT64: return DType::I64;
    case onnx::TensorProto::INT32: return DType::I32;
    case onnx::TensorProto::INT16: return DType::I16;
    case onnx::TensorProto::INT8: return DType::I8;
    case onnx::TensorProto::UINT8: return DType::U8;
    case onnx::TensorProto::UINT16: return DType::U16;
    case onnx::TensorProto::UINT32: return DType::U32;
    case onnx::TensorProto::UINT64: return DType::U64;
    case onnx::TensorProto::BOOL: return DType::Bool;
    default: return std::nullopt;
  }
}

Status checkGeneratedSize(NodeContext& ctx, const Shape& shape, const std::string& what) {
  int64_t count = 1;
  for (const Dim& d : shape) {
    if (!d.isStatic()) return ctx.error(what + " needs static dims");
    if (d.size != 0 && count > kMaxGeneratedElements / d.size) count = kMaxGeneratedElements + 1;
    else count *= d.size;
  }
  if (count > kMaxGeneratedElements)
    return ctx.error(what + " would have more than " + std::to_string(kMaxGeneratedElements) +
                     " elements; the shapes are too large to import");
  return {};
}

std::vector<int64_t> tensorInts(const DenseTensor& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numElements()));
  for (int64_t i = 0; i < t.numElements(); ++i) out[static_cast<size_t>(i)] = t.getInt(i);
  return out;
}

std::vector<double> tensorDoubles(const DenseTensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numElements()));
  for (int64_t i = 0; i < t.numElements(); ++i) out[static_cast<size_t>(i)] = t.getDouble(i);
  return out;
}

Expected<std::vector<int64_t>> constantInts(NodeContext& ctx, size_t i, const std::string& what) {
  if (!ctx.hasInput(i)) return ctx.error(what + " (input " + std::to_string(i) + ") is required but absent");
  const DenseTensor* t = ctx.constantInput(i);
  if (!t)
    return ctx.error(what + " (input " + std::to_string(i) + " '" + ctx.node().input(static_cast<int>(i)) +
                     "') must be known at import time (a constant, an initializer or computed from them); Kiln "
                     "compiles static shapes");
  if (isFloat(t->type.dtype) || t->type.dtype == DType::Bool)
    return ctx.error(what + " (input " + std::to_string(i) + ") must be integers, got " + t->type.str());
  return tensorInts(*t);
}

Expected<std::optional<std::vector<int64_t>>> optionalConstantInts(NodeContext& ctx, size_t i,
                                                                   const std::string& what) {
  if (!ctx.hasInput(i)) return std::optional<std::vector<int64_t>>();
  auto v = constantInts(ctx, i, what);
  if (!v) return v.takeError();
  return std::optional<std::vector<int64_t>>(std::move(*v));
}

Expected<int64_t> normalizeAxis(NodeContext& ctx, int64_t axis, int64_t rank, const std::string& what) {
  if (auto normalized = kiln::normalizeAxis(axis, rank)) return *normalized;
  return ctx.error(what + " " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank) +
                   " (expected " + std::to_string(-rank) + " to " + std::to_string(rank - 1) + ")");
}

Expected<std::vector<int64_t>> normalizeAxes(NodeContext& ctx, const std::vector<int64_t>& axes, int64_t rank,
                                             const std::string& what) {
  std::vector<int64_t> out;
  for (int64_t a : axes) {
    auto n = normalizeAxis(ctx, a, rank, what.substr(0, what.size() - (what.ends_with("s") ? 1 : 0)));
    if (!n) return n.takeError();
    if (std::find(out.begin(), out.end(), *n) != out.end())
      return ctx.error(what + " repeat axis " + std::to_string(*n));
    out.push_back(*n);
  }
  return out;
}

Expected<Value*> reshapeTo(NodeContext& ctx, Value* v, Shape shape) {
  if (v->type().shape == shape) return v;
  return ctx.emit(OpKind::Reshape, {v}, {}, {TensorType{v->type().dtype, std::move(shape)}});
}

Expected<Value*> castTo(NodeContext& ctx, Value* v, DType dtype) {
  if (v->type().dtype == dtype) return v;
  return ctx.emit(OpKind::Cast, {v}, {}, {TensorType{dtype, v->type().shape}});
}

Expected<Value*> broadcastTo(NodeContext& ctx, Value* v, Shape shape) {
  if (v->type().shape == shape) return v;
  return ctx.emit(OpKind::Broadcast, {v}, {}, {TensorType{v->type().dtype, std::move(shape)}});
}

Expected<Value*> squeezeAxes(NodeContext& ctx, Value* v, const std::vector<int64_t>& axes) {
  const Shape& in = v->type().shape;
  auto norm = normalizeAxes(ctx, axes, static_cast<int64_t>(in.size()));
  if (!norm) return norm.takeError();
  Shape out;
  for (size_t d = 0; d < in.size(); ++d) {
    if (std::find(norm->begin(), norm->end(), static_cast<int64_t>(d)) == norm->end()) {
      out.push_back(in[d]);
      continue;
    }
    if (in[d].isStatic() && in[d].size != 1)
      return ctx.error("cannot squeeze axis " + std::to_string(d) + " of " + v->type().str() + ": its size is not 1");
  }
  return reshapeTo(ctx, v, std::move(out));
}

Expected<Value*> unsqueezeAxes(NodeContext& ctx, Value* v, const std::vector<int64_t>& axes) {
  const Shape& in = v->type().shape;
  const int64_t rank = static_cast<int64_t>(in.size() + axes.size());
  auto norm = normalizeAxes(ctx, axes, rank);
  if (!norm) return norm.takeError();
  Shape out;
  size_t next = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (std::find(norm->begin(), norm->end(), d) != norm->end())
      out.push_back(Dim::fixed(1));
    else
      out.push_back(in[next++]);
  }
  return reshapeTo(ctx, v, std::move(out));
}

Dim productDim(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t d = begin; d < end; ++d) {
    if (!shape[d].isStatic()) {
      // A single non-static dim keeps its identity (symbol) in the product.
      bool othersOne = true;
      for (size_t e = begin; e < end; ++e)
        if (e != d && !(shape[e].isStatic() && shape[e].size == 1)) othersOne = false;
      return othersOne ? shape[d] : Dim::unknown();
    }
    n *= shape[d].size;
  }
  return Dim::fixed(n);
}

Status rejectMovedAttribute(NodeContext& ctx, std::string_view name, int64_t since) {
  if (ctx.opset() >= since && ctx.attribute(name))
    return ctx.error("attribute '" + std::string(name) + "' is not allowed since opset " + std::to_string(since) +
                     ", where it is an input");
  return {};
}

Expected<int64_t> randomSeed(NodeContext& ctx) {
  const onnx::AttributeProto* attr = ctx.attribute("seed");
  if (!attr) {
    // FNV-1a of the output name: stable across imports, different per node.
    uint64_t h = 0xcbf29ce484222325ull;
    const std::string& name = ctx.node().output_size() > 0 ? ctx.node().output(0) : ctx.node().name();
    for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
    return static_cast<int64_t>(h);
  }
  if (attr->type() == onnx::AttributeProto::INT) return attr->i();
  if (attr->type() != onnx::AttributeProto::FLOAT) return ctx.error("attribute 'seed' must be a float");
  const float seed = attr->f();
  if (std::isfinite(seed) && seed == std::trunc(seed) && std::fabs(seed) < 0x1p62f) return static_cast<int64_t>(seed);
  return static_cast<int64_t>(std::bit_cast<uint32_t>(seed));
}

Status setOutput0(NodeContext& ctx, Expected<Value*> v) {
  if (!v) return v.takeError();
  ctx.setOutput(0, *v);
  return {};
}

}  // namespace kiln::onnx_import
