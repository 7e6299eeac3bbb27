// NNEmitter: the helper the neural-network converters (NNOps.cpp,
// NNRecurrent.cpp, NNResize.cpp) build Kiln IR with. It wraps a NodeContext
// and keeps the first error: every later call (and every call given a null
// operand) returns null, so a converter reads as the formula it implements
// and checks for failure once, at the end, with status(). Attribute getters
// are sticky in the same way. Never pass two emitting calls as arguments of
// one call: C++ leaves their order unspecified and the IR would depend on
// the compiler.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/onnx/OnnxOps.h"

namespace kiln::onnx_import {

/// The largest opset version whose semantics the NN converters follow; the
/// ops they handle have not changed meaning between their last listed
/// change and this version.
inline constexpr int64_t kNewestNNOpset = 22;

/// `INT64_MAX`, the "to the end" bound of `slice`.
inline constexpr int64_t kSliceToEnd = INT64_MAX;

class NNEmitter {
 public:
  explicit NNEmitter(NodeContext &ctx) : ctx_(ctx) {}

  NodeContext &ctx() const { return ctx_; }
  int64_t opset() const { return ctx_.opset(); }
  bool failed() const { return error_.has_value(); }
  /// The first error recorded, or success.
  Status status() const { return error_ ? Status(*error_) : Status::success(); }
  /// Records an error located at the node (the first one wins); returns null.
  Value *fail(const std::string &message);
  Value *fail(Error error);

  /// Fails unless every attribute of the node is in `known`: an attribute a
  /// converter does not read must never be ignored silently.
  void expectOnlyAttributes(std::initializer_list<std::string_view> known);
  /// Fails when optional input `i` is present (an input the converter does
  /// not implement), naming it as `what`.
  void rejectInput(size_t i, std::string_view what);

  // Attributes; the default when absent.
  int64_t intAttr(std::string_view name, int64_t dflt);
  double floatAttr(std::string_view name, double dflt);
  std::string stringAttr(std::string_view name, std::string dflt);
  std::vector<int64_t> intsAttr(std::string_view name, std::vector<int64_t> dflt);
  std::vector<double> floatsAttr(std::string_view name, std::vector<double> dflt);
  /// A list-of-strings attribute (empty when absent).
  std::vector<std::string> stringsAttr(std::string_view name);
  bool hasAttr(std::string_view name) const { return ctx_.attribute(name) != nullptr; }

  /// Input `i` (null and an error when absent).
  Value *input(size_t i);
  /// Input `i` when present, else null without an error.
  Value *optionalInput(size_t i);
  bool hasInput(size_t i) const { return ctx_.hasInput(i); }
  bool hasOutput(size_t i) const { return ctx_.hasOutput(i); }
  /// Binds output `i` when the node requests it.
  void setOutput(size_t i, Value *v);

  Value *emit(OpKind kind, std::vector<Value *> operands, AttrMap attrs = {}, std::vector<TensorType> declared = {});
  std::vector<Value *> emitMulti(OpKind kind, std::vector<Value *> operands, size_t numResults, AttrMap attrs = {});

  Value *constant(DenseTensor value);
  Value *scalar(DType dtype, double value);
  /// A rank-0 constant with the dtype of `like`.
  Value *scalarLike(Value *like, double value);
  /// A constant of `dtype` and `dims` holding `values` (row-major).
  Value *tensor(DType dtype, const std::vector<int64_t> &dims, const std::vector<double> &values);
  Value *tensorI64(const std::vector<int64_t> &dims, const std::vector<int64_t> &values);

  Value *unary(OpKind kind, Value *x) { return emit(kind, {x}); }
  Value *binary(OpKind kind, Value *a, Value *b) { return emit(kind, {a, b}); }
  Value *add(Value *a, Value *b) { return binary(OpKind::Add, a, b); }
  Value *sub(Value *a, Value *b) { return binary(OpKind::Sub, a, b); }
  Value *mul(Value *a, Value *b) { return binary(OpKind::Mul, a, b); }
  Value *div(Value *a, Value *b) { return binary(OpKind::Div, a, b); }
  Value *max(Value *a, Value *b) { return binary(OpKind::Max, a, b); }
  Value *min(Value *a, Value *b) { return binary(OpKind::Min, a, b); }
  Value *add(Value *a, double b) { return add(a, scalarLike(a, b)); }
  Value *mul(Value *a, double b) { return mul(a, scalarLike(a, b)); }
  Value *sub(double a, Value *b) { return sub(scalarLike(b, a), b); }
  Value *max(Value *a, double b) { return max(a, scalarLike(a, b)); }
  Value *min(Value *a, double b) { return min(a, scalarLike(a, b)); }
  Value *select(Value *cond, Value *a, Value *b) { return emit(OpKind::Select, {cond, a, b}); }

  Value *reduce(OpKind kind, Value *x, std::vector<int64_t> axes, bool keepdims);
  Value *transpose(Value *x, std::vector<int64_t> perm);
  Value *reshape(Value *x, Shape shape);
  Value *cast(Value *x, DType dtype);
  Value *concat(std::vector<Value *> parts, int64_t axis);
  /// Elements [start, end) of `x` along `axis` with `step`, all of every other
  /// dim.
  Value *sliceAxis(Value *x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
  Value *gather(Value *x, Value *indices, int64_t axis);
  /// `x` with a dim of 1 inserted at `axis` (of the result).
  Value *unsqueeze(Value *x, int64_t axis);
  /// A tensor of `like`'s shape (whatever its dims at run time) filled with
  /// `value`.
  Value *filledLike(Value *like, DType dtype, double value);

 private:
  NodeContext &ctx_;
  std::optional<Error> error_;
};

/// The Kiln dtype of an ONNX TensorProto data type code, if Kiln has one.
std::optional<DType> dtypeOfOnnx(int64_t onnxType);

}  // namespace kiln::onnx_import
