// NNEmitter: the sticky-error builder of the neural-network converters (see
// NNEmitter.h).
#include "frontend/onnx/NNEmitter.h"

#include "frontend/onnx/ConverterSupport.h"

#include <algorithm>

#include "onnx.pb.h"

namespace kiln::onnx_import {

Value *NNEmitter::fail(const std::string &message) { return fail(ctx_.error(message)); }

Value *NNEmitter::fail(Error error) {
  if (!error_) error_ = std::move(error);
  return nullptr;
}

void NNEmitter::expectOnlyAttributes(std::initializer_list<std::string_view> known) {
  for (const onnx::AttributeProto &attr : ctx_.node().attribute()) {
    if (std::find(known.begin(), known.end(), attr.name()) != known.end()) continue;
    std::string list;
    for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    fail("attribute '" + attr.name() + "' is not supported" +
         (list.empty() ? std::string(" (this op takes none)") : " (supported: " + list + ")"));
    return;
  }
}

void NNEmitter::rejectInput(size_t i, std::string_view what) {
  if (ctx_.hasInput(i)) fail("input " + std::to_string(i) + " (" + std::string(what) + ") is not supported");
}

int64_t NNEmitter::intAttr(std::string_view name, int64_t dflt) {
  auto v = ctx_.intAttr(name, dflt);
  if (!v) {
    fail(v.takeError());
    return dflt;
  }
  return *v;
}

double NNEmitter::floatAttr(std::string_view name, double dflt) {
  auto v = ctx_.floatAttr(name, dflt);
  if (!v) {
    fail(v.takeError());
    return dflt;
  }
  return *v;
}

std::string NNEmitter::stringAttr(std::string_view name, std::string dflt) {
  auto v = ctx_.stringAttr(name, dflt);
  if (!v) {
    fail(v.takeError());
    return dflt;
  }
  return *v;
}

std::vector<int64_t> NNEmitter::intsAttr(std::string_view name, std::vector<int64_t> dflt) {
  auto v = ctx_.intsAttr(name, dflt);
  if (!v) {
    fail(v.takeError());
    return dflt;
  }
  return *v;
}

std::vector<double> NNEmitter::floatsAttr(std::string_view name, std::vector<double> dflt) {
  auto v = ctx_.floatsAttr(name, dflt);
  if (!v) {
    fail(v.takeError());
    return dflt;
  }
  return *v;
}

std::vector<std::string> NNEmitter::stringsAttr(std::string_view name) {
  const onnx::AttributeProto *attr = ctx_.attribute(name);
  if (!attr) return {};
  if (attr->type() != onnx::AttributeProto::STRINGS) {
    fail("attribute '" + std::string(name) + "' must be a list of strings");
    return {};
  }
  return {attr->strings().begin(), attr->strings().end()};
}

Value *NNEmitter::input(size_t i) {
  if (error_) return nullptr;
  auto v = ctx_.input(i);
  if (!v) return fail(v.takeError());
  return *v;
}

Value *NNEmitter::optionalInput(size_t i) { return ctx_.hasInput(i) ? input(i) : nullptr; }

void NNEmitter::setOutput(size_t i, Value *v) {
  if (error_ || !v || !ctx_.hasOutput(i)) return;
  ctx_.setOutput(i, v);
}

Value *NNEmitter::emit(OpKind kind, std::vector<Value *> operands, AttrMap attrs, std::vector<TensorType> declared) {
  if (error_) return nullptr;
  for (Value *v : operands)
    if (!v) return nullptr;
  auto v = ctx_.emit(kind, std::move(operands), std::move(attrs), std::move(declared));
  if (!v) return fail(v.takeError());
  return *v;
}

std::vector<Value *> NNEmitter::emitMulti(OpKind kind, std::vector<Value *> operands, size_t numResults,
                                          AttrMap attrs) {
  std::vector<Value *> none(numResults, nullptr);
  if (error_) return none;
  for (Value *v : operands)
    if (!v) return none;
  auto v = ctx_.emitMulti(kind, std::move(operands), std::move(attrs));
  if (!v) {
    fail(v.takeError());
    return none;
  }
  if (v->size() != numResults) {
    fail("internal error: " + std::to_string(v->size()) + " results where " + std::to_string(numResults) +
         " were expected");
    return none;
  }
  return *v;
}

Value *NNEmitter::constant(DenseTensor value) {
  if (error_) return nullptr;
  return ctx_.constant(std::move(value));
}

Value *NNEmitter::scalar(DType dtype, double value) {
  if (error_) return nullptr;
  return ctx_.scalar(dtype, value);
}

Value *NNEmitter::scalarLike(Value *like, double value) { return like ? scalar(like->type().dtype, value) : nullptr; }

Value *NNEmitter::tensor(DType dtype, const std::vector<int64_t> &dims, const std::vector<double> &values) {
  if (failed()) return nullptr;
  if (Status s = checkGeneratedSize(ctx_, staticShape(dims), "a generated constant"); !s) return fail(s.takeError());
  DenseTensor t = DenseTensor::zeros(TensorType{dtype, staticShape(dims)});
  for (size_t i = 0; i < values.size() && static_cast<int64_t>(i) < t.numElements(); ++i)
    t.setDouble(static_cast<int64_t>(i), values[i]);
  return constant(std::move(t));
}

Value *NNEmitter::tensorI64(const std::vector<int64_t> &dims, const std::vector<int64_t> &values) {
  if (failed()) return nullptr;
  if (Status s = checkGeneratedSize(ctx_, staticShape(dims), "a generated index table"); !s) return fail(s.takeError());
  DenseTensor t = DenseTensor::zeros(TensorType{DType::I64, staticShape(dims)});
  for (size_t i = 0; i < values.size() && static_cast<int64_t>(i) < t.numElements(); ++i)
    t.setInt(static_cast<int64_t>(i), values[i]);
  return constant(std::move(t));
}

Value *NNEmitter::reduce(OpKind kind, Value *x, std::vector<int64_t> axes, bool keepdims) {
  return emit(kind, {x}, {{"axes", Attribute(std::move(axes))}, {"keepdims", Attribute(keepdims)}});
}

Value *NNEmitter::transpose(Value *x, std::vector<int64_t> perm) {
  return emit(OpKind::Transpose, {x}, {{"perm", Attribute(std::move(perm))}});
}

Value *NNEmitter::reshape(Value *x, Shape shape) {
  if (!x) return nullptr;
  if (x->type().shape == shape) return x;
  return emit(OpKind::Reshape, {x}, {}, {TensorType{x->type().dtype, std::move(shape)}});
}

Value *NNEmitter::cast(Value *x, DType dtype) {
  if (!x) return nullptr;
  if (x->type().dtype == dtype) return x;
  return emit(OpKind::Cast, {x}, {}, {TensorType{dtype, x->type().shape}});
}

Value *NNEmitter::concat(std::vector<Value *> parts, int64_t axis) {
  if (parts.size() == 1) return parts[0];
  return emit(OpKind::Concat, std::move(parts), {{"axis", Attribute(axis)}});
}

Value *NNEmitter::sliceAxis(Value *x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  if (!x) return nullptr;
  const Shape &shape = x->type().shape;
  std::vector<int64_t> starts(shape.size(), 0), ends(shape.size(), kSliceToEnd), steps(shape.size(), 1);
  starts[static_cast<size_t>(axis)] = start;
  ends[static_cast<size_t>(axis)] = end;
  steps[static_cast<size_t>(axis)] = step;
  return emit(OpKind::Slice, {x},
              {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
}

Value *NNEmitter::gather(Value *x, Value *indices, int64_t axis) {
  return emit(OpKind::Gather, {x, indices}, {{"axis", Attribute(axis)}});
}

Value *NNEmitter::unsqueeze(Value *x, int64_t axis) {
  if (!x) return nullptr;
  Shape shape = x->type().shape;
  shape.insert(shape.begin() + axis, Dim::fixed(1));
  return reshape(x, std::move(shape));
}

Value *NNEmitter::filledLike(Value *like, DType dtype, double value) {
  if (!like) return nullptr;
  const Shape &shape = like->type().shape;
  bool resolvable = std::none_of(shape.begin(), shape.end(), [](const Dim &d) { return d.isUnknown(); });
  Value *fill = scalar(dtype, value);
  // A broadcast takes symbolic dims from the run-time bindings; an unknown
  // dim is only known from `like` itself, so select between two scalars
  // under a condition that is true everywhere (x == x fails only for NaN).
  if (resolvable) return emit(OpKind::Broadcast, {fill}, {}, {TensorType{dtype, shape}});
  Value *everywhere = binary(OpKind::Eq, like, like);
  if (isFloat(like->type().dtype)) {
    Value *nan = unary(OpKind::IsNan, like);
    everywhere = binary(OpKind::Or, everywhere, nan);
  }
  return select(everywhere, fill, fill);
}

std::optional<DType> dtypeOfOnnx(int64_t onnxType) {
  switch (onnxType) {
    case onnx::TensorProto::FLOAT:
      return DType::F32;
    case onnx::TensorProto::DOUBLE:
      return DType::F64;
    case onnx::TensorProto::FLOAT16:
      return DType::F16;
    case onnx::TensorProto::BFLOAT16:
      return DType::BF16;
    case onnx::TensorProto::INT64:
      return DType::I64;
    case onnx::TensorProto::INT32:
      return DType::I32;
    case onnx::TensorProto::INT16:
      return DType::I16;
    case onnx::TensorProto::INT8:
      return DType::I8;
    case onnx::TensorProto::UINT8:
      return DType::U8;
    case onnx::TensorProto::UINT16:
      return DType::U16;
    case onnx::TensorProto::UINT32:
      return DType::U32;
    case onnx::TensorProto::UINT64:
      return DType::U64;
    case onnx::TensorProto::BOOL:
      return DType::Bool;
    default:
      return std::nullopt;
  }
}

}  // namespace kiln::onnx_import
