// The builder and entry types that the VJP rules of every op family share
// (internal to passes/). Each family's rules live in
// passes/Vjp<Family>.cpp (the families of runtime/*Kernels.cpp) and each
// declares, in `entries::<Enum>`, how each of its ops is differentiated;
// the declarations below, one per op of ir/Ops.def, make an op added there
// without its entry fail to link.
#pragma once

#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "passes/Vjp.h"

namespace kiln::vjp {

constexpr int64_t kToEnd = std::numeric_limits<int64_t>::max();

/// Builds the ops of one rule. Errors are sticky, as in Decompose.cpp: the
/// first failure is kept and every later call returns null, so rules read as
/// formulas and are checked once at the end.
class Grad {
 public:
  Grad(Builder& b, const Op& op) : b_(b), op_(op) {}
  Builder& builder() { return b_; }

  Status status() const { return error_ ? Status(*error_) : Status::success(); }
  /// Records why the rule does not apply (the first reason wins).
  void fail(const std::string& message) {
    if (!error_) error_ = op_.emitError("cannot be differentiated: " + message);
  }

  Value* emit(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {}, std::vector<TensorType> declared = {}) {
    if (error_) return nullptr;
    for (Value* v : operands)
      if (!v) return nullptr;
    auto op = b_.build(kind, std::move(operands), std::move(attrs), std::move(declared));
    if (!op) {
      fail(op.error().message());
      return nullptr;
    }
    return (*op)->result(0);
  }
  Value* scalar(DType dtype, double v) {
    if (error_) return nullptr;
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    Value*& cached = scalars_[{dtype, bits}];
    if (!cached) cached = b_.scalar(dtype, v);
    return cached;
  }
  Value* like(Value* x, double v) { return x ? scalar(x->type().dtype, v) : nullptr; }

  Value* unary(OpKind k, Value* x) { return emit(k, {x}); }
  Value* add(Value* a, Value* b) { return emit(OpKind::Add, {a, b}); }
  Value* sub(Value* a, Value* b) { return emit(OpKind::Sub, {a, b}); }
  Value* mul(Value* a, Value* b) { return emit(OpKind::Mul, {a, b}); }
  Value* div(Value* a, Value* b) { return emit(OpKind::Div, {a, b}); }
  Value* mul(Value* a, double c) { return mul(a, like(a, c)); }
  Value* add(Value* a, double c) { return add(a, like(a, c)); }
  Value* rsub(double c, Value* a) { return sub(like(a, c), a); }
  Value* neg(Value* a) { return unary(OpKind::Neg, a); }
  Value* select(Value* c, Value* a, Value* b) { return emit(OpKind::Select, {c, a, b}); }
  /// `g` where `c`, else 0.
  Value* where(Value* c, Value* g) { return select(c, g, like(g, 0.0)); }
  Value* cmp(OpKind k, Value* a, Value* b) { return emit(k, {a, b}); }
  Value* reduce(OpKind k, Value* x, std::vector<int64_t> axes, bool keepdims) {
    return emit(k, {x}, {{"axes", Attribute(std::move(axes))}, {"keepdims", Attribute(keepdims)}});
  }
  Value* transpose(Value* x, std::vector<int64_t> perm) {
    return emit(OpKind::Transpose, {x}, {{"perm", Attribute(std::move(perm))}});
  }
  Value* reshape(Value* x, Shape shape) {
    if (!x) return nullptr;
    return emit(OpKind::Reshape, {x}, {}, {TensorType{x->type().dtype, std::move(shape)}});
  }
  Value* broadcastTo(Value* x, const TensorType& type) {
    if (!x) return nullptr;
    return emit(OpKind::Broadcast, {x}, {}, {TensorType{x->type().dtype, type.shape}});
  }
  Value* cast(Value* x, DType dtype) {
    if (!x) return nullptr;
    return emit(OpKind::Cast, {x}, {}, {TensorType{dtype, x->type().shape}});
  }
  Value* slice(Value* x, std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> steps) {
    return emit(OpKind::Slice, {x},
                {{"starts", Attribute(std::move(starts))},
                 {"ends", Attribute(std::move(ends))},
                 {"steps", Attribute(std::move(steps))}});
  }
  Value* pad(Value* x, std::vector<int64_t> pads) { return emit(OpKind::Pad, {x}, {{"pads", Attribute(pads)}}); }
  /// A zero tensor of static `type`.
  Value* zeros(const TensorType& type) {
    if (error_) return nullptr;
    return b_.constant(DenseTensor::zeros(type));
  }
  /// A constant tensor.
  Value* constant(DenseTensor t) {
    if (error_) return nullptr;
    return b_.constant(std::move(t));
  }
  Value* unbroadcastTo(Value* g, const TensorType& target) {
    if (!g || error_) return nullptr;
    auto r = unbroadcast(b_, g, target);
    if (!r) {
      fail(r.error().message());
      return nullptr;
    }
    return *r;
  }
  /// The static dims of `v`, or a failure naming what needed them.
  std::optional<std::vector<int64_t>> dims(Value* v, const char* what) {
    if (!v) return std::nullopt;
    if (!v->type().isStatic()) {
      fail(std::string("the gradient of ") + what + " needs static shapes, got " + v->type().str());
      return std::nullopt;
    }
    return staticDims(v->type().shape);
  }

 private:
  Builder& b_;
  const Op& op_;
  std::optional<Error> error_;
  std::map<std::pair<DType, uint64_t>, Value*> scalars_;
};

using Grads = std::vector<Value*>;

/// One rule: the gradients of `op`'s operands (null where none) given `dy`.
using Rule = Grads (*)(Grad&, const Op&, Value* dy);

inline Value* x0(const Op& op) { return op.operand(0); }

inline Value* y0(const Op& op) { return op.result(0); }

/// The rule of an op of several results (loop): the gradients of its
/// operands given those of its results (null where none reached one) and
/// which operands need one. It may widen the op in place (see vjpLoop).
using ResultsRule = Grads (*)(Grad&, Op&, std::span<Value* const> dys, const std::vector<bool>& needs);

/// How one op is differentiated, and its rule when it has one.
struct VjpEntry {
  VjpKind kind;
  Rule rule;
  ResultsRule resultsRule = nullptr;
};
/// The entries of an op with a rule, one without a gradient, a composite
/// and a differentiable op without a rule yet.
constexpr VjpEntry rule(Rule r) { return {VjpKind::Rule, r}; }
constexpr VjpEntry resultsRule(ResultsRule r) { return {VjpKind::Rule, nullptr, r}; }
constexpr VjpEntry kNone{VjpKind::NotDifferentiable, nullptr};
constexpr VjpEntry kDecompose{VjpKind::Decompose, nullptr};
constexpr VjpEntry kMissing{VjpKind::Unsupported, nullptr};  // differentiable, no rule yet

/// The entry of each op, defined by its family's file.
namespace entries {
#define KILN_OP(Enum, ...) extern const VjpEntry Enum;
#include "ir/Ops.def"
#undef KILN_OP
}  // namespace entries

}  // namespace kiln::vjp
