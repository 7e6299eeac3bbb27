// The VJP rules of the primitive ops: for y = op(x...), given dy = dL/dy,
// each rule builds dL/dx for every operand that needs it, as new ops, reusing
// the forward operands and result rather than recomputing them. Every op kind
// of ir/Ops.def declares its VjpKind here (kVjpOf below); a missing
// declaration fails to compile. Broadcasting operands get their gradient
// summed back to their own shape (unbroadcast). Rules that need static
// shapes (slice, concat, gather, conv) say so in their error.
#include "passes/Vjp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <set>

namespace kiln {

namespace {

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

Value* x0(const Op& op) { return op.operand(0); }
Value* y0(const Op& op) { return op.result(0); }

// --- Elementwise unary ------------------------------------------------------------
// Each returns dx for y = f(x); `y` is reused where the derivative is a
// function of it (exp, tanh, sigmoid, sqrt).

Grads vjpNeg(Grad& g, const Op&, Value* dy) { return {g.neg(dy)}; }
Grads vjpAbs(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Sign, x0(op)))}; }
Grads vjpExp(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, y0(op))}; }
Grads vjpLog(Grad& g, const Op& op, Value* dy) { return {g.div(dy, x0(op))}; }
Grads vjpSqrt(Grad& g, const Op& op, Value* dy) { return {g.div(g.mul(dy, 0.5), y0(op))}; }
/// d x^-1/2 = -1/2 x^-3/2 = -1/2 y / x.
Grads vjpRsqrt(Grad& g, const Op& op, Value* dy) { return {g.div(g.mul(g.mul(dy, -0.5), y0(op)), x0(op))}; }
Grads vjpReciprocal(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.neg(g.mul(dy, g.mul(y, y)))};
}
Grads vjpTanh(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.mul(dy, g.rsub(1.0, g.mul(y, y)))};
}
Grads vjpSigmoid(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.mul(dy, g.mul(y, g.rsub(1.0, y)))};
}
/// relu'(x) = [x > 0] = [relu(x) > 0], read from the output: then the
/// backward needs no pre-activation, so a conv or matmul with a relu
/// epilogue (one oneDNN call with a post-op) stays one call in a training
/// step instead of also running without the relu for the backward's mask.
Grads vjpRelu(Grad& g, const Op& op, Value* dy) {
  return {g.where(g.cmp(OpKind::Gt, y0(op), g.like(y0(op), 0.0)), dy)};
}
/// erf'(x) = 2/sqrt(pi) e^(-x^2).
Grads vjpErf(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  Value* e = g.unary(OpKind::Exp, g.neg(g.mul(x, x)));
  return {g.mul(dy, g.mul(e, 2.0 / std::sqrt(std::numbers::pi)))};
}
Grads vjpSin(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Cos, x0(op)))}; }
Grads vjpCos(Grad& g, const Op& op, Value* dy) { return {g.neg(g.mul(dy, g.unary(OpKind::Sin, x0(op))))}; }
Grads vjpTan(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.mul(dy, g.add(g.mul(y, y), 1.0))};
}
Grads vjpAsin(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.mul(dy, g.unary(OpKind::Rsqrt, g.rsub(1.0, g.mul(x, x))))};
}
Grads vjpAcos(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.neg(g.mul(dy, g.unary(OpKind::Rsqrt, g.rsub(1.0, g.mul(x, x)))))};
}
Grads vjpAtan(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.div(dy, g.add(g.mul(x, x), 1.0))};
}
Grads vjpSinh(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Cosh, x0(op)))}; }
Grads vjpCosh(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Sinh, x0(op)))}; }
Grads vjpAsinh(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.mul(dy, g.unary(OpKind::Rsqrt, g.add(g.mul(x, x), 1.0)))};
}
Grads vjpAcosh(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.mul(dy, g.unary(OpKind::Rsqrt, g.add(g.mul(x, x), -1.0)))};
}
Grads vjpAtanh(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.div(dy, g.rsub(1.0, g.mul(x, x)))};
}

// --- Elementwise binary and select -------------------------------------------------
// Each computes the full-shape gradient and then sums it back over the dims
// the operand was broadcast along.

Grads binary(Grad& g, const Op& op, Value* da, Value* db) {
  return {g.unbroadcastTo(da, op.operand(0)->type()), g.unbroadcastTo(db, op.operand(1)->type())};
}
Grads vjpAdd(Grad& g, const Op& op, Value* dy) { return binary(g, op, dy, dy); }
Grads vjpSub(Grad& g, const Op& op, Value* dy) { return binary(g, op, dy, g.neg(dy)); }
Grads vjpMul(Grad& g, const Op& op, Value* dy) {
  return binary(g, op, g.mul(dy, op.operand(1)), g.mul(dy, op.operand(0)));
}
/// d(a/b) = da/b - a/b^2 db = (da - y db) / b.
Grads vjpDiv(Grad& g, const Op& op, Value* dy) {
  Value* da = g.div(dy, op.operand(1));
  return binary(g, op, da, g.neg(g.mul(da, y0(op))));
}
/// d(a^b) = b a^(b-1) da + a^b log(a) db; the second term is 0 where a <= 0.
Grads vjpPow(Grad& g, const Op& op, Value* dy) {
  Value *a = op.operand(0), *b = op.operand(1);
  Value* da = g.mul(dy, g.mul(b, g.emit(OpKind::Pow, {a, g.add(b, -1.0)})));
  Value* positive = g.cmp(OpKind::Gt, a, g.like(a, 0.0));
  Value* safeA = g.select(positive, a, g.like(a, 1.0));
  Value* db = g.where(positive, g.mul(dy, g.mul(y0(op), g.unary(OpKind::Log, safeA))));
  return binary(g, op, da, db);
}
/// The gradient goes to the operand that was chosen; ties go to `a`.
Grads vjpMax(Grad& g, const Op& op, Value* dy) {
  Value* takeA = g.cmp(OpKind::Ge, op.operand(0), op.operand(1));
  return binary(g, op, g.where(takeA, dy), g.select(takeA, g.like(dy, 0.0), dy));
}
Grads vjpMin(Grad& g, const Op& op, Value* dy) {
  Value* takeA = g.cmp(OpKind::Le, op.operand(0), op.operand(1));
  return binary(g, op, g.where(takeA, dy), g.select(takeA, g.like(dy, 0.0), dy));
}
/// mod(a, b) = a - b floor(a/b): da = dy, db = -floor(a/b) dy.
Grads vjpMod(Grad& g, const Op& op, Value* dy) {
  Value* q = g.unary(OpKind::Floor, g.div(op.operand(0), op.operand(1)));
  return binary(g, op, dy, g.neg(g.mul(dy, q)));
}
/// rem(a, b) = a - b trunc(a/b).
Grads vjpRem(Grad& g, const Op& op, Value* dy) {
  Value* q = g.div(op.operand(0), op.operand(1));
  Value* trunc = g.select(g.cmp(OpKind::Lt, q, g.like(q, 0.0)), g.unary(OpKind::Ceil, q), g.unary(OpKind::Floor, q));
  return binary(g, op, dy, g.neg(g.mul(dy, trunc)));
}
Grads vjpSelect(Grad& g, const Op& op, Value* dy) {
  Value* c = op.operand(0);
  Value* zero = g.like(dy, 0.0);
  return {nullptr, g.unbroadcastTo(g.select(c, dy, zero), op.operand(1)->type()),
          g.unbroadcastTo(g.select(c, zero, dy), op.operand(2)->type())};
}

// --- Casts and data movement --------------------------------------------------------

/// Float to float casts pass the gradient back in the operand's dtype.
Grads vjpCast(Grad& g, const Op& op, Value* dy) {
  if (!isFloat(y0(op)->type().dtype)) return {nullptr};
  return {g.cast(dy, x0(op)->type().dtype)};
}
Grads vjpBroadcast(Grad& g, const Op& op, Value* dy) { return {g.unbroadcastTo(dy, x0(op)->type())}; }
Grads vjpReshape(Grad& g, const Op& op, Value* dy) { return {g.reshape(dy, x0(op)->type().shape)}; }
Grads vjpTranspose(Grad& g, const Op& op, Value* dy) {
  const auto& perm = op.getInts("perm");
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return {g.transpose(dy, inverse)};
}
/// A slice is undone axis by axis: dy is reversed along negative steps, a
/// step of |s| > 1 spreads its elements s apart (a trailing axis of s - 1
/// zeros, flattened), and zero padding puts the result back in place.
Grads vjpSlice(Grad& g, const Op& op, Value* dy) {
  auto in = g.dims(x0(op), "slice");
  auto out = g.dims(y0(op), "slice");
  if (!in || !out) return {nullptr};
  const auto &starts = op.getInts("starts"), &steps = op.getInts("steps");
  size_t rank = in->size();
  for (int64_t n : *out)
    if (n == 0) return {g.zeros(x0(op)->type())};
  std::vector<int64_t> pads(2 * rank), revStarts(rank, 0), revEnds(rank, kToEnd), revSteps(rank, 1);
  bool reversed = false;
  for (size_t d = 0; d < rank; ++d) {
    int64_t dim = (*in)[d], n = (*out)[d], step = steps[d], s = starts[d] < 0 ? starts[d] + dim : starts[d];
    int64_t first = step > 0 ? std::clamp<int64_t>(s, 0, dim) : std::clamp<int64_t>(s, -1, dim - 1) + (n - 1) * step;
    pads[d] = first;
    pads[rank + d] = dim - first - ((n - 1) * std::abs(step) + 1);
    if (step < 0) {
      revStarts[d] = -1;
      revEnds[d] = std::numeric_limits<int64_t>::min();
      revSteps[d] = -1;
      reversed = true;
    }
  }
  Value* grad = reversed ? g.slice(dy, revStarts, revEnds, revSteps) : dy;
  for (size_t d = 0; d < rank; ++d) {
    int64_t stride = std::abs(steps[d]), n = (*out)[d];
    if (stride == 1 || n == 1) continue;
    // [.., n, ..] -> [.., n, 1, ..] -> [.., n, stride, ..] -> [.., n * stride, ..] -> first (n-1)*stride+1.
    Shape shape = grad->type().shape;
    Shape split = shape;
    split.insert(split.begin() + d + 1, Dim::fixed(1));
    std::vector<int64_t> spread(2 * (rank + 1), 0);
    spread[rank + 1 + d + 1] = stride - 1;
    Value* spreadOut = g.pad(g.reshape(grad, split), spread);
    shape[d] = Dim::fixed(n * stride);
    std::vector<int64_t> sliceStarts(rank, 0), sliceEnds(rank, kToEnd), sliceSteps(rank, 1);
    sliceEnds[d] = (n - 1) * stride + 1;
    grad = g.slice(g.reshape(spreadOut, shape), sliceStarts, sliceEnds, sliceSteps);
    if (!grad) return {nullptr};
  }
  return {g.pad(grad, pads)};
}
/// Each operand gets its own piece of dy along the axis.
Grads vjpConcat(Grad& g, const Op& op, Value* dy) {
  int64_t rank = y0(op)->type().rank();
  int64_t axis = *normalizeAxis(op.getInt("axis"), rank);
  Grads grads;
  int64_t offset = 0;
  for (Value* x : op.operands()) {
    const Dim& d = x->type().shape[axis];
    if (!d.isStatic()) {
      g.fail("the gradient of concat needs static sizes along the axis, got " + x->type().str());
      return Grads(op.numOperands(), nullptr);
    }
    std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
    starts[axis] = offset;
    ends[axis] = offset + d.size;
    grads.push_back(g.slice(dy, starts, ends, steps));
    offset += d.size;
  }
  return grads;
}
/// The input index that output index `i` of a padded dim reads in modes
/// reflect and edge (the interpreter's Pad, runtime/LayoutKernels.cpp).
int64_t paddedSource(int64_t i, int64_t begin, int64_t dim, bool edge) {
  int64_t s = i - begin;
  if (s >= 0 && s < dim) return s;
  if (edge) return std::clamp<int64_t>(s, 0, dim - 1);
  if (dim == 1) return 0;
  const int64_t period = 2 * (dim - 1);  // mirror without repeating the edge
  s = ((s % period) + period) % period;
  return s >= dim ? period - s : s;
}

/// Constant padding is undone by the opposite padding (cropping what was
/// padded, zero-filling what was cropped). Reflect and edge padding read
/// each dim through its own index map (out[i, j] = x[m0(i), m1(j)]), so the
/// adjoint sums dy back one padded dim at a time: a scatter_elements(add)
/// along the dim into zeros, at the map's indices (constants).
Grads vjpPad(Grad& g, const Op& op, Value* dy) {
  const std::string& mode = op.getString("mode");
  std::vector<int64_t> pads = op.getInts("pads");
  if (mode == "constant") {
    for (int64_t& p : pads) p = -p;
    return {g.pad(dy, pads)};
  }
  Value* x = x0(op);
  auto in = g.dims(x, "pad");
  auto out = g.dims(y0(op), "pad");
  if (!in || !out) return {nullptr};
  const size_t rank = in->size();
  const DType dtype = x->type().dtype;
  std::vector<int64_t> shape = *out;
  Value* grad = dy;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t begin = pads[d], end = pads[rank + d];
    if (begin == 0 && end == 0) continue;
    std::vector<int64_t> mapShape(rank, 1);
    mapShape[d] = shape[d];
    DenseTensor map = DenseTensor::zeros(TensorType{DType::I64, staticShape(mapShape)});
    for (int64_t i = 0; i < shape[d]; ++i) map.setInt(i, paddedSource(i, begin, (*in)[d], mode == "edge"));
    Value* indices = g.broadcastTo(g.constant(std::move(map)), TensorType{DType::I64, staticShape(shape)});
    shape[d] = (*in)[d];
    grad = g.emit(OpKind::ScatterElements, {g.zeros(TensorType{dtype, staticShape(shape)}), indices, grad},
                  {{"axis", Attribute(static_cast<int64_t>(d))}, {"reduction", Attribute("add")}});
  }
  return {grad};
}
/// gather's adjoint adds dy's slices into zeros at the indices: a
/// scatter_elements(add) over data viewed as [outer, dim, inner].
Grads vjpGather(Grad& g, const Op& op, Value* dy) {
  Value *data = op.operand(0), *indices = op.operand(1);
  auto dataDims = g.dims(data, "gather");
  auto indexDims = g.dims(indices, "gather");
  if (!dataDims || !indexDims) return {nullptr, nullptr};
  int64_t axis = *normalizeAxis(op.getInt("axis"), data->type().rank());
  int64_t outer = 1, inner = 1, count = numElements(indices->type().shape);
  for (int64_t d = 0; d < axis; ++d) outer *= (*dataDims)[d];
  for (size_t d = axis + 1; d < dataDims->size(); ++d) inner *= (*dataDims)[d];
  Shape viewed = staticShape({outer, count, inner});
  Value* idx = g.reshape(indices, staticShape({1, count, 1}));
  idx = g.broadcastTo(idx, TensorType{indices->type().dtype, viewed});
  Value* zeros = g.zeros(TensorType{data->type().dtype, staticShape({outer, (*dataDims)[axis], inner})});
  Value* summed = g.emit(OpKind::ScatterElements, {zeros, idx, g.reshape(dy, viewed)},
                         {{"axis", Attribute(int64_t{1})}, {"reduction", Attribute("add")}});
  return {g.reshape(summed, data->type().shape), nullptr};
}
Grads vjpGatherElements(Grad& g, const Op& op, Value* dy) {
  Value* data = op.operand(0);
  auto dims = g.dims(data, "gather_elements");
  if (!dims) return {nullptr, nullptr};
  Value* zeros = g.zeros(data->type());
  return {g.emit(OpKind::ScatterElements, {zeros, op.operand(1), dy},
                 {{"axis", Attribute(op.getInt("axis"))}, {"reduction", Attribute("add")}}),
          nullptr};
}
/// The updates' gradient is dy gathered at the indices. Without a
/// reduction, data's is dy with the overwritten places zeroed; with
/// reduction add, dy itself. Mul, max and min follow PyTorch's
/// scatter_reduce (include_self=True) backward:
///  - mul: out[p] = data[p] * prod of the updates at p. data's gradient is
///    dy times that product (a scatter of the updates into ones, no
///    division); an update's is dy[p] times the product of everything else
///    at p: out[p] / u where u != 0, and, where u == 0, the product of the
///    nonzero others when u is the only zero at p, else 0 (zeros counted by
///    a scatter add).
///  - max / min: dy[p] is split evenly among data[p] and the updates equal
///    to out[p] (ties share it, as PyTorch does).
Grads vjpScatterElements(Grad& g, const Op& op, Value* dy) {
  const std::string& reduction = op.getString("reduction");
  Value *data = op.operand(0), *indices = op.operand(1), *updates = op.operand(2), *out = y0(op);
  AttrMap axis{{"axis", Attribute(op.getInt("axis"))}};
  auto scatter = [&](Value* into, Value* values, const char* how) {
    AttrMap attrs = axis;
    attrs["reduction"] = Attribute(how);
    return g.emit(OpKind::ScatterElements, {into, indices, values}, attrs);
  };
  auto gather = [&](Value* v) { return g.emit(OpKind::GatherElements, {v, indices}, axis); };
  if (reduction == "add") return {dy, nullptr, gather(dy)};
  if (reduction == "none") {
    auto dims = g.dims(updates, "scatter_elements");
    if (!dims) return {nullptr, nullptr, nullptr};
    Value* cleared = g.emit(OpKind::ScatterElements, {dy, indices, g.zeros(updates->type())}, axis);
    return {cleared, nullptr, gather(dy)};
  }
  if (!g.dims(data, "scatter_elements") || !g.dims(updates, "scatter_elements")) return {nullptr, nullptr, nullptr};
  Value* zerosData = g.zeros(data->type());
  if (reduction == "mul") {
    Value* ones = g.add(zerosData, 1.0);
    Value* product = scatter(ones, updates, "mul");  // the updates' product at each place
    Value* dData = g.mul(dy, product);
    Value* isZero = g.cmp(OpKind::Eq, updates, g.like(updates, 0.0));
    Value* nonzero = g.select(isZero, g.like(updates, 1.0), updates);
    Value* othersTimesU = scatter(data, nonzero, "mul");  // data times the nonzero updates
    Value* zeroCount = gather(scatter(zerosData, g.select(isZero, g.like(updates, 1.0), g.like(updates, 0.0)), "add"));
    Value* atPlace = gather(othersTimesU);
    Value* noZeros = g.cmp(OpKind::Eq, zeroCount, g.like(updates, 0.0));
    Value* oneZero = g.cmp(OpKind::Eq, zeroCount, g.like(updates, 1.0));
    // u != 0: the product without u; u == 0: the others' product when u is the only zero.
    Value* withoutU = g.select(isZero, g.where(oneZero, atPlace), g.where(noZeros, g.div(atPlace, nonzero)));
    return {dData, nullptr, g.mul(gather(dy), withoutU)};
  }
  if (reduction == "max" || reduction == "min") {
    Value* dataIsOut = g.cmp(OpKind::Eq, data, out);
    Value* updateIsOut = g.cmp(OpKind::Eq, updates, gather(out));
    auto indicator = [&](Value* c, Value* like) { return g.select(c, g.like(like, 1.0), g.like(like, 0.0)); };
    Value* count = scatter(indicator(dataIsOut, data), indicator(updateIsOut, updates), "add");
    Value* share = g.div(dy, count);
    return {g.where(dataIsOut, share), nullptr, g.where(updateIsOut, gather(share))};
  }
  g.fail("the gradient of scatter_elements with reduction '" + reduction + "' is not implemented");
  return {nullptr, nullptr, nullptr};
}

// --- Reductions -------------------------------------------------------------------------

/// The reduced axes of `op` (normalized; empty means all) and dy reshaped to
/// keep them as 1s, ready to broadcast against the operand.
std::pair<std::vector<int64_t>, Value*> keptGrad(Grad& g, const Op& op, Value* dy) {
  int64_t rank = x0(op)->type().rank();
  std::vector<int64_t> axes;
  for (int64_t a : op.getInts("axes")) axes.push_back(*normalizeAxis(a, rank));
  if (axes.empty())
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  if (op.getBool("keepdims")) return {axes, dy};
  Shape kept = x0(op)->type().shape;
  for (int64_t a : axes) kept[a] = Dim::fixed(1);
  return {axes, g.reshape(dy, kept)};
}
Grads vjpReduceSum(Grad& g, const Op& op, Value* dy) {
  return {g.broadcastTo(keptGrad(g, op, dy).second, x0(op)->type())};
}
Grads vjpReduceMean(Grad& g, const Op& op, Value* dy) {
  auto [axes, kept] = keptGrad(g, op, dy);
  auto dims = g.dims(x0(op), "reduce_mean");
  if (!dims) return {nullptr};
  double count = 1;
  for (int64_t a : axes) count *= static_cast<double>((*dims)[a]);
  return {g.broadcastTo(g.mul(kept, 1.0 / count), x0(op)->type())};
}
/// The gradient is shared evenly by the elements equal to the extreme.
Grads vjpReduceExtreme(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  auto [axes, kept] = keptGrad(g, op, dy);
  Value* y = op.getBool("keepdims") ? y0(op) : g.reshape(y0(op), kept ? kept->type().shape : Shape{});
  Value* hit = g.cast(g.cmp(OpKind::Eq, x, y), x->type().dtype);
  Value* share = g.div(kept, g.reduce(OpKind::ReduceSum, hit, axes, true));
  return {g.mul(hit, share)};
}
/// d prod = prod / x (operands containing 0 get NaN or inf there).
Grads vjpReduceProd(Grad& g, const Op& op, Value* dy) {
  auto [axes, kept] = keptGrad(g, op, dy);
  Value* y = op.getBool("keepdims") ? y0(op) : g.reshape(y0(op), kept ? kept->type().shape : Shape{});
  return {g.div(g.mul(kept, y), x0(op))};
}

// --- Contractions ------------------------------------------------------------------------

/// The last two dims swapped.
Value* swapLast(Grad& g, Value* x) {
  int64_t rank = x->type().rank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return g.transpose(x, perm);
}
/// y = a @ b: da = dy @ b^T, db = a^T @ dy, summed over broadcast batch
/// dims; a vector operand is viewed as a [1,k] row or a [k,1] column.
Grads vjpMatMul(Grad& g, const Op& op, Value* dy) {
  Value *a = op.operand(0), *b = op.operand(1);
  bool vecA = a->type().rank() == 1, vecB = b->type().rank() == 1;
  Value* a2 = vecA ? g.reshape(a, {Dim::fixed(1), a->type().shape[0]}) : a;
  Value* b2 = vecB ? g.reshape(b, {b->type().shape[0], Dim::fixed(1)}) : b;
  Shape dyShape = dy->type().shape;
  if (vecA) dyShape.insert(dyShape.end() - (vecB ? 0 : 1), Dim::fixed(1));
  if (vecB) dyShape.push_back(Dim::fixed(1));
  Value* dy2 = (vecA || vecB) ? g.reshape(dy, dyShape) : dy;
  Value* da = g.emit(OpKind::MatMul, {dy2, swapLast(g, b2)});
  Value* db = g.emit(OpKind::MatMul, {swapLast(g, a2), dy2});
  if (vecA) da = g.reshape(g.unbroadcastTo(da, a2->type()), a->type().shape);
  if (vecB) db = g.reshape(g.unbroadcastTo(db, b2->type()), b->type().shape);
  return {g.unbroadcastTo(da, a->type()), g.unbroadcastTo(db, b->type())};
}
/// The spatial attributes of a conv or conv_transpose, defaults filled in.
struct ConvWindow {
  std::vector<int64_t> strides, dilations, pads;
};
ConvWindow convWindow(const Op& op, size_t spatial) {
  auto attr = [&](const char* name, int64_t fill, size_t n) {
    std::vector<int64_t> v = op.getInts(name);
    if (v.empty()) v.assign(n, fill);
    return v;
  };
  return {attr("strides", 1, spatial), attr("dilations", 1, spatial), attr("pads", 0, 2 * spatial)};
}
std::vector<int64_t> swapBatchAndChannels(size_t rank) {
  std::vector<int64_t> perm{1, 0};
  for (size_t i = 2; i < rank; ++i) perm.push_back(static_cast<int64_t>(i));
  return perm;
}
/// `v` with dims 2.. cut to `dims`' sizes.
Value* cropSpatial(Grad& g, Value* v, const std::vector<int64_t>& dims) {
  std::vector<int64_t> starts(dims.size(), 0), ends(dims.size(), kToEnd), steps(dims.size(), 1);
  for (size_t i = 2; i < dims.size(); ++i) ends[i] = dims[i];
  return g.slice(v, starts, ends, steps);
}
/// The weight gradient of one group: the convolution of dy^T [M,N,...] by
/// x^T [C,N,...] (conv) or of x^T by dy^T (conv_transpose) with stride and
/// dilation exchanged, cropped to the kernel and put in w's layout.
Value* convWeightGrad(Grad& g, Value* x, Value* dy, const ConvWindow& win, const std::vector<int64_t>& wDims,
                      bool transposed) {
  auto perm = swapBatchAndChannels(wDims.size());
  Value* input = transposed ? g.transpose(dy, perm) : g.transpose(x, perm);
  Value* kernel = transposed ? g.transpose(x, perm) : g.transpose(dy, perm);
  Value* full = g.emit(
      OpKind::Conv, {input, kernel},
      {{"strides", Attribute(win.dilations)}, {"pads", Attribute(win.pads)}, {"dilations", Attribute(win.strides)}});
  // conv: [C, M, K'] -> [M, C, K]; conv_transpose: [M, C, K'] -> [C, M, K].
  return g.transpose(cropSpatial(g, full, wDims), perm);
}
/// Slices [g*n, (g+1)*n) of dim `axis` of `v`.
Value* groupSlice(Grad& g, Value* v, int64_t axis, int64_t group, int64_t n) {
  int64_t rank = v->type().rank();
  std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
  starts[axis] = group * n;
  ends[axis] = (group + 1) * n;
  return g.slice(v, starts, ends, steps);
}
/// The gradients of a conv or conv_transpose after dx: dw, one
/// convWeightGrad per group (x's groups of `cg` channels, dy's of `mg`) with
/// the groups' kernels `groupW` concatenated, and db (when there is a bias)
/// dy summed over N and the spatial dims.
Grads withParamGrads(Grad& g, const Op& op, Value* x, Value* dy, Value* dx, const ConvWindow& win,
                     const std::vector<int64_t>& groupW, int64_t groups, int64_t cg, int64_t mg, bool transposed) {
  Value* dw = nullptr;
  if (!transposed) {
    // A conv's: one conv_weight_grad over all groups (oneDNN's backward
    // weights convolution on the CPU).
    dw = g.emit(OpKind::ConvWeightGrad, {x, dy},
                {{"kernel", Attribute(std::vector<int64_t>(groupW.begin() + 2, groupW.end()))},
                 {"strides", Attribute(win.strides)},
                 {"pads", Attribute(win.pads)},
                 {"dilations", Attribute(win.dilations)},
                 {"groups", Attribute(groups)}});
  } else {
    std::vector<Value*> dws;
    for (int64_t gi = 0; gi < groups; ++gi) {
      Value* xg = groups > 1 ? groupSlice(g, x, 1, gi, cg) : x;
      Value* dyg = groups > 1 ? groupSlice(g, dy, 1, gi, mg) : dy;
      dws.push_back(convWeightGrad(g, xg, dyg, win, groupW, transposed));
    }
    dw = dws.size() == 1 ? dws[0] : g.emit(OpKind::Concat, dws, {{"axis", Attribute(int64_t{0})}});
  }
  Grads grads{dx, dw};
  if (op.numOperands() == 3) {
    std::vector<int64_t> axes{0};
    for (size_t i = 2; i < groupW.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    grads.push_back(g.reduce(OpKind::ReduceSum, dy, axes, false));
  }
  return grads;
}

/// y = conv(x, w [M, C/G, K...], b). dx is the transposed convolution of dy
/// by the same w and groups (output_padding restoring x's size); dw is one
/// conv_weight_grad of x and dy; db sums dy over N and the spatial dims.
Grads vjpConv(Grad& g, const Op& op, Value* dy) {
  Value *x = op.operand(0), *w = op.operand(1);
  Grads none(op.numOperands(), nullptr);
  // Layouts are assigned after autodiff (assign-layouts), so a channels_last
  // conv is never differentiated; one written by hand is refused.
  if (op.getBool("channels_last")) {
    g.fail("conv with channels_last has no gradient rule; differentiate the channels-first conv");
    return none;
  }
  auto xd = g.dims(x, "conv");
  auto wd = g.dims(w, "conv");
  auto yd = g.dims(y0(op), "conv");
  if (!xd || !wd || !yd) return none;
  size_t spatial = xd->size() - 2;
  int64_t groups = op.getInt("groups"), cg = (*wd)[1], mg = (*wd)[0] / groups;
  ConvWindow win = convWindow(op, spatial);
  std::vector<int64_t> outputPadding(spatial);
  for (size_t i = 0; i < spatial; ++i) {
    int64_t k = (*wd)[i + 2], in = (*xd)[i + 2], out = (*yd)[i + 2];
    outputPadding[i] =
        in - ((out - 1) * win.strides[i] + win.dilations[i] * (k - 1) + 1 - win.pads[i] - win.pads[spatial + i]);
  }
  Value* dx = g.emit(OpKind::ConvTranspose, {dy, w},
                     {{"strides", Attribute(win.strides)},
                      {"pads", Attribute(win.pads)},
                      {"dilations", Attribute(win.dilations)},
                      {"output_padding", Attribute(outputPadding)},
                      {"groups", Attribute(groups)}});
  std::vector<int64_t> groupW = *wd;
  groupW[0] = mg;
  return withParamGrads(g, op, x, dy, dx, win, groupW, groups, cg, mg, false);
}
/// y = conv_transpose(x, w [C, M/G, K...], b), the adjoint of a conv: dx is
/// the convolution of dy by w (cropped to x's size where output_padding
/// reaches past a stride), dw per group as for conv with the roles of x and
/// dy exchanged, db sums dy.
Grads vjpConvTranspose(Grad& g, const Op& op, Value* dy) {
  Value *x = op.operand(0), *w = op.operand(1);
  Grads none(op.numOperands(), nullptr);
  auto xd = g.dims(x, "conv_transpose");
  auto wd = g.dims(w, "conv_transpose");
  if (!xd || !wd) return none;
  size_t spatial = xd->size() - 2;
  int64_t groups = op.getInt("groups"), cg = (*wd)[0] / groups, mg = (*wd)[1];
  ConvWindow win = convWindow(op, spatial);
  Value* dxFull = g.emit(OpKind::Conv, {dy, w},
                         {{"strides", Attribute(win.strides)},
                          {"pads", Attribute(win.pads)},
                          {"dilations", Attribute(win.dilations)},
                          {"groups", Attribute(groups)}});
  Value* dx = cropSpatial(g, dxFull, *xd);
  std::vector<int64_t> groupW = *wd;
  groupW[0] = cg;
  return withParamGrads(g, op, x, dy, dx, win, groupW, groups, cg, mg, true);
}

/// conv_weight_grad appears only in a gradient (conv's dw); differentiating
/// it again (a second derivative) is refused, not taken as zero.
Grads vjpConvWeightGrad(Grad& g, const Op& op, Value*) {
  g.fail("conv_weight_grad (a convolution's weight gradient) has no gradient rule: second derivatives of "
         "convolutions are not supported");
  return Grads(op.numOperands(), nullptr);
}

/// Pooling's adjoint. Each kernel tap t reads, for every output position,
/// one strided slice window_t of the padded input; the gradient of window_t
/// (g_t) is placed back by a transposed convolution of the stacked g_t
/// [N*C, taps, O...] with a one-hot kernel [taps, 1, K...] (tap t at its
/// offset), or, when the windows tile the input, by a transpose; then the
/// padding is cropped (windows that tile it exactly need none of this: see
/// below). max_pool: g_t = dy where window_t
/// equals the maximum, shared evenly by ties; avg_pool: g_t = dy / the
/// window's divisor.
Grads vjpPool(Grad& g, const Op& op, Value* dy, bool isMax) {
  if (op.getBool("channels_last")) {
    g.fail("a channels_last pool has no gradient rule; differentiate the channels-first pool");
    return Grads(op.numOperands(), nullptr);
  }
  Value *x = x0(op), *y = y0(op);
  auto xd = g.dims(x, isMax ? "max_pool" : "avg_pool");
  auto yd = g.dims(y, isMax ? "max_pool" : "avg_pool");
  if (!xd || !yd) return {nullptr};
  size_t sp = xd->size() - 2, rank = xd->size();
  auto attr = [&](const char* name, int64_t fill, size_t n) {
    std::vector<int64_t> v = op.attr(name) ? op.getInts(name) : std::vector<int64_t>{};
    if (v.empty()) v.assign(n, fill);
    return v;
  };
  auto kernel = op.getInts("kernel"), strides = attr("strides", 1, sp), pads = attr("pads", 0, 2 * sp);
  auto dilations = isMax ? attr("dilations", 1, sp) : std::vector<int64_t>(sp, 1);
  DType dt = x->type().dtype;
  // Windows that tile the input exactly (strides equal to the kernel, no
  // dilation or padding, each size a multiple of the kernel's): every
  // position is in one window, so the gradient is elementwise over x, with
  // y and dy repeated over each window by a broadcast between reshapes
  // (which fuse), and max_pool's ties counted by a reduction over each
  // window's taps. No slices, concatenation or placing.
  bool exactTiles = true;
  for (size_t i = 0; i < sp; ++i)
    exactTiles = exactTiles && strides[i] == kernel[i] && dilations[i] == 1 && pads[i] == 0 && pads[sp + i] == 0 &&
                 (*xd)[i + 2] == (*yd)[i + 2] * kernel[i];
  if (exactTiles) {
    Shape split = {Dim::fixed((*xd)[0]), Dim::fixed((*xd)[1])}, windows = split;
    std::vector<int64_t> tapAxes;
    for (size_t i = 0; i < sp; ++i) {
      split.push_back(Dim::fixed((*yd)[i + 2]));
      split.push_back(Dim::fixed(1));
      windows.push_back(Dim::fixed((*yd)[i + 2]));
      windows.push_back(Dim::fixed(kernel[i]));
      tapAxes.push_back(static_cast<int64_t>(3 + 2 * i));
    }
    auto repeat = [&](Value* v) {
      return g.reshape(g.broadcastTo(g.reshape(v, split), TensorType{dt, windows}), x->type().shape);
    };
    if (isMax) {
      Value* hit = g.cast(g.cmp(OpKind::Eq, x, repeat(y)), dt);
      Value* count = g.reduce(OpKind::ReduceSum, g.reshape(hit, windows), tapAxes, false);
      Value* share = g.div(dy, g.emit(OpKind::Max, {count, g.like(count, 1.0)}));
      return {g.mul(hit, repeat(share))};
    }
    int64_t size = 1;
    for (int64_t k : kernel) size *= k;
    return {g.div(repeat(dy), g.like(dy, static_cast<double>(size)))};
  }
  // Pads of every dim (begins, ends) that make room for every window,
  // including ceil_mode's partial last one; `span` is what the windows cover.
  std::vector<int64_t> padAll(2 * rank, 0), extra(2 * rank, 0), span(sp), crop(2 * rank, 0);
  for (size_t i = 0; i < sp; ++i) {
    int64_t in = (*xd)[i + 2], out = (*yd)[i + 2];
    span[i] = (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1;
    padAll[2 + i] = pads[i];
    padAll[rank + 2 + i] = pads[sp + i];
    extra[rank + 2 + i] = std::max<int64_t>(0, span[i] - in - pads[i] - pads[sp + i]);
    crop[2 + i] = -pads[i];
    crop[rank + 2 + i] = in + pads[i] - span[i];
  }
  auto padded = [&](Value* v, double value) {
    Value* p = g.emit(OpKind::Pad, {v}, {{"pads", Attribute(padAll)}, {"value", Attribute(value)}});
    return g.emit(OpKind::Pad, {p}, {{"pads", Attribute(extra)}, {"value", Attribute(0.0)}});
  };
  int64_t taps = 1;
  for (int64_t k : kernel) taps *= k;
  auto window = [&](Value* source, int64_t t) {
    std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
    for (size_t i = sp; i-- > 0;) {
      starts[i + 2] = (t % kernel[i]) * dilations[i];
      t /= kernel[i];
      ends[i + 2] = starts[i + 2] + ((*yd)[i + 2] - 1) * strides[i] + 1;
      steps[i + 2] = strides[i];
    }
    return g.slice(source, starts, ends, steps);
  };
  std::vector<Value*> parts;
  if (isMax) {
    // The lowest finite value (not -inf, which the text IR would have to
    // spell) stands for padding, which never wins.
    Value* source = padded(x, std::numeric_limits<double>::lowest());
    std::vector<Value*> hits;
    Value* total = nullptr;
    for (int64_t t = 0; t < taps; ++t) {
      hits.push_back(g.cast(g.cmp(OpKind::Eq, window(source, t), y), dt));
      total = total ? g.add(total, hits.back()) : hits.back();
    }
    Value* share = g.div(dy, g.emit(OpKind::Max, {total, g.like(total, 1.0)}));
    for (Value* hit : hits) parts.push_back(g.mul(hit, share));
  } else {
    // The divisor: real elements, or with count_include_pad those inside
    // the padded input, of each window (constants that fold).
    DenseTensor ones = DenseTensor::zeros(x->type());
    for (int64_t i = 0; i < numElements(x->type().shape); ++i) ones.setDouble(i, 1.0);
    Value* mask = padded(g.emit(OpKind::Constant, {}, {{"value", Attribute(std::move(ones))}}, {x->type()}),
                         op.getBool("count_include_pad") ? 1.0 : 0.0);
    Value* count = nullptr;
    for (int64_t t = 0; t < taps; ++t) count = count ? g.add(count, window(mask, t)) : window(mask, t);
    Value* share = g.div(dy, g.emit(OpKind::Max, {count, g.like(count, 1.0)}));
    parts.assign(taps, share);
  }
  Shape stackedPart = y->type().shape;
  stackedPart[0] = Dim::fixed((*xd)[0] * (*xd)[1]);
  stackedPart[1] = Dim::fixed(1);
  for (Value*& p : parts) p = g.reshape(p, stackedPart);
  Value* stacked = parts.size() == 1 ? parts[0] : g.emit(OpKind::Concat, parts, {{"axis", Attribute(int64_t{1})}});
  // Windows that tile the input (strides equal to the kernel, no
  // dilation): each position is in one window at one tap, so placing is a
  // transpose of [N*C, K..., O...] to [N*C, O1, K1, O2, K2, ...], which
  // costs a copy where the transposed convolution costs a multiply per tap.
  bool tiles = true;
  for (size_t i = 0; i < sp; ++i) tiles = tiles && strides[i] == kernel[i] && dilations[i] == 1;
  if (tiles) {
    Shape split = {Dim::fixed((*xd)[0] * (*xd)[1])}, placedShape = {split[0], Dim::fixed(1)};
    std::vector<int64_t> perm = {0};
    for (size_t i = 0; i < sp; ++i) split.push_back(Dim::fixed(kernel[i]));
    for (size_t i = 0; i < sp; ++i) {
      split.push_back(Dim::fixed((*yd)[i + 2]));
      perm.push_back(static_cast<int64_t>(1 + sp + i));
      perm.push_back(static_cast<int64_t>(1 + i));
      placedShape.push_back(Dim::fixed(span[i]));
    }
    Value* placed = g.reshape(g.transpose(g.reshape(stacked, split), perm), placedShape);
    return {g.reshape(g.pad(placed, crop), x->type().shape)};
  }
  std::vector<int64_t> weightDims{taps, 1};
  weightDims.insert(weightDims.end(), kernel.begin(), kernel.end());
  DenseTensor oneHot = DenseTensor::zeros(TensorType{dt, staticShape(weightDims)});
  for (int64_t t = 0; t < taps; ++t) oneHot.setDouble(t * taps + t, 1.0);
  Value* weight = g.emit(OpKind::Constant, {}, {{"value", Attribute(std::move(oneHot))}},
                         {TensorType{dt, staticShape(weightDims)}});
  Value* placed = g.emit(OpKind::ConvTranspose, {stacked, weight},
                         {{"strides", Attribute(strides)}, {"dilations", Attribute(dilations)}});
  return {g.reshape(g.pad(placed, crop), x->type().shape)};
}
Grads vjpMaxPool(Grad& g, const Op& op, Value* dy) { return vjpPool(g, op, dy, true); }
Grads vjpAvgPool(Grad& g, const Op& op, Value* dy) { return vjpPool(g, op, dy, false); }

// Collectives, for the loss of the whole job (the sum of every rank's
// loss): each rule is the collective that carries the gradients back.
/// y = reduce(x over ranks) on every rank: dx = the same reduction of dy.
Grads vjpAllReduce(Grad& g, const Op& op, Value* dy) {
  return {g.emit(OpKind::AllReduce, {dy}, {{"reduction", Attribute(op.getString("reduction"))}})};
}
/// y = x of rank `root` on every rank: root's dx sums every rank's dy, the
/// others' dx is 0.
Grads vjpBroadcastFrom(Grad& g, const Op& op, Value* dy) {
  return {g.emit(OpKind::ReduceTo, {dy}, {{"root", Attribute(op.getInt("root"))}})};
}
/// y = the sum of x over ranks on `root` (0 elsewhere): every rank's dx is
/// root's dy (divided by the world size for a mean, through the same mean
/// on a broadcast dy).
Grads vjpReduceTo(Grad& g, const Op& op, Value* dy) {
  Value* dx = g.emit(OpKind::BroadcastFrom, {dy}, {{"root", Attribute(op.getInt("root"))}});
  if (op.getString("reduction") == "mean") {
    // d(mean)/dx_r = 1/world: the world size is the sum of ones over ranks.
    Value* one = g.like(dx, 1.0);
    Value* world = g.emit(OpKind::AllReduce, {one}, {{"reduction", Attribute(std::string("sum"))}});
    dx = g.div(dx, world);
  }
  return {dx};
}
/// y = every rank's x along `axis`: dx = rank r's block of dy summed over ranks.
Grads vjpAllGather(Grad& g, const Op& op, Value* dy) {
  return {g.emit(OpKind::ReduceScatter, {dy},
                 {{"axis", Attribute(op.getInt("axis"))}, {"world_size", Attribute(op.getInt("world_size"))}})};
}
/// y = block r of the reduction of x: dx = every rank's dy along `axis`
/// (divided by the world size for a mean).
Grads vjpReduceScatter(Grad& g, const Op& op, Value* dy) {
  const int64_t world = op.getInt("world_size");
  Value* dx = g.emit(OpKind::AllGather, {dy}, {{"axis", Attribute(op.getInt("axis"))}, {"world_size", Attribute(world)}});
  if (op.getString("reduction") == "mean") dx = g.mul(dx, 1.0 / static_cast<double>(world));
  return {dx};
}

// --- Control flow ---------------------------------------------------------------------------

/// Zeros of `like`'s type, built with `b`.
Expected<Value*> zerosOf(Builder& b, Value* like) {
  const TensorType& t = like->type();
  if (t.isStatic()) return b.constant(DenseTensor::zeros(t));
  return b.value(OpKind::Mul, {like, b.scalar(t.dtype, 0.0)});
}

}  // namespace

void markActive(std::span<Op* const> ops, std::set<const Value*>& active, const std::set<const Value*>& held) {
  for (Op* op : ops) {
    bool any = false;
    for (Value* v : op->operands()) any |= active.count(v) > 0;
    if (!any) continue;
    for (Value* r : op->results())
      if (isFloat(r->type().dtype) && !held.count(r)) active.insert(r);
  }
}

Status accumulateGradient(Builder& b, GradientMap& grads, const Value* v, Value* g) {
  Value*& slot = grads[v];
  if (!slot) {
    slot = g;
    return Status::success();
  }
  auto sum = b.value(OpKind::Add, {slot, g});
  if (!sum) return sum.takeError();
  slot = *sum;
  return Status::success();
}

Status sweepBackward(Builder& b, std::span<Op* const> ops, const std::set<const Value*>& active, GradientMap& grads,
                     const std::function<Status(Op&)>& composite) {
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    Op& op = **it;
    std::vector<Value*> dys;
    bool reached = false;
    for (Value* r : op.results()) {
      auto found = grads.find(r);
      dys.push_back(found == grads.end() ? nullptr : found->second);
      reached |= found != grads.end();
    }
    if (!reached) continue;
    b.setLocation(op.loc());
    if (composite && op.info().isComposite()) {
      KILN_TRY(composite(op));
      continue;
    }
    std::vector<bool> needs;
    for (Value* v : op.operands()) needs.push_back(active.count(v) > 0);
    auto operandGrads = applyVjpResults(b, op, dys, needs);
    if (!operandGrads) return operandGrads.takeError();
    for (size_t i = 0; i < op.numOperands(); ++i)
      if (Value* g = (*operandGrads)[i]) KILN_TRY(accumulateGradient(b, grads, op.operand(i), g));
  }
  return Status::success();
}

namespace {

/// The gradient of `x` in `grads`, or zeros of its type where none reached
/// it.
Expected<Value*> gradientOrZeros(Builder& b, const GradientMap& grads, Value* x) {
  if (auto g = grads.find(x); g != grads.end() && g->second) return g->second;
  return zerosOf(b, x);
}

/// The backward of one branch of an `if`: a copy of `body` that also takes
/// dy (the gradient of the op's result) and returns the gradient of each
/// argument listed in `floatArgs` (zeros where none flows), computed by
/// sweeping the branch's ops backwards from its `return`. The forward ops
/// stay in the copy: the branch is recomputed rather than its values kept.
Expected<std::unique_ptr<Function>> backwardBranch(const Function& body, const TensorType& dyType,
                                                   const std::vector<size_t>& floatArgs) {
  std::unique_ptr<Function> back = body.clone();
  Function& f = *back;
  Value* dy = f.addArgument(dyType, "dy");
  Op* ret = f.returnOp();
  if (!ret || ret->numOperands() != 1) return Error("a branch of 'if' must return one value to be differentiated");
  std::set<const Value*> active;
  for (size_t i : floatArgs) active.insert(f.argument(i));
  std::vector<Op*> forward;
  for (const auto& op : f.ops())
    if (op->kind() != OpKind::Return) forward.push_back(op.get());
  markActive(forward, active);
  Builder b(f);
  b.setLocation(body.loc());
  GradientMap grads;
  if (active.count(ret->operand(0))) grads[ret->operand(0)] = dy;
  // Regions hold no composites (autodiff decomposes only at the top
  // level): applyVjpResults' error names one.
  KILN_TRY(sweepBackward(b, forward, active, grads));
  std::vector<Value*> results;
  std::vector<TensorType> types;
  for (size_t i : floatArgs) {
    Value* arg = f.argument(i);
    auto g = gradientOrZeros(b, grads, arg);
    if (!g) return g.takeError();
    results.push_back(*g);
    types.push_back(arg->type());
  }
  ret->setOperands(results);
  f.setResultTypes(std::move(types));
  return back;
}

/// y = if(c, captures...) (one result): the gradients of the float captures
/// come from an `if` on the same condition whose branches are the backward
/// of the forward ones (backwardBranch), so only the branch taken is
/// differentiated at run time. A branch with a composite op or an op of
/// several results is an error naming it.
Grads vjpIf(Grad& g, const Op& op, Value* dy) {
  if (op.numResults() != 1) {
    g.fail("an 'if' of several results is not differentiated yet");
    return {};
  }
  std::vector<size_t> floatArgs;
  for (size_t i = 1; i < op.numOperands(); ++i)
    if (isFloat(op.operand(i)->type().dtype)) floatArgs.push_back(i - 1);
  if (floatArgs.empty()) return {};
  std::vector<std::unique_ptr<Function>> branches;
  for (size_t k = 0; k < 2; ++k) {
    auto back = backwardBranch(*op.region(k), dy->type(), floatArgs);
    if (!back) {
      g.fail(back.error().message());
      return {};
    }
    branches.push_back(std::move(*back));
  }
  std::vector<Value*> operands(op.operands().begin(), op.operands().end());
  operands.push_back(dy);
  std::vector<TensorType> types;
  for (size_t i : floatArgs) types.push_back(op.operand(1 + i)->type());
  Op* backward = g.builder().create(OpKind::If, std::move(operands), std::move(types));
  for (auto& branch : branches) backward->addRegion(std::move(branch));
  Grads grads(op.numOperands(), nullptr);
  for (size_t r = 0; r < floatArgs.size(); ++r) grads[1 + floatArgs[r]] = backward->result(r);
  return grads;
}

/// The value of `v` when a `constant` op defines it as a scalar, else none.
std::optional<double> constantScalar(const Value* v) {
  const Op* def = v->definingOp();
  if (!def || def->kind() != OpKind::Constant || def->getTensor("value").numElements() != 1) return std::nullopt;
  return def->getTensor("value").getDouble(0);
}

/// Clones `op` (a forward op of a loop body) with `b`, its operands read
/// through `map`, and maps its results to the copy's.
void cloneInto(Builder& b, const Op& op, std::map<const Value*, Value*>& map) {
  std::vector<Value*> operands;
  for (Value* v : op.operands()) operands.push_back(map.count(v) ? map.at(v) : v);
  std::vector<TensorType> types;
  for (Value* r : op.results()) types.push_back(r->type());
  Op* copy = b.create(op.kind(), std::move(operands), std::move(types), op.attrs());
  copy->setLoc(op.loc());
  for (size_t k = 0; k < op.numRegions(); ++k) copy->addRegion(op.region(k)->clone());
  for (size_t i = 0; i < op.numResults(); ++i) map[op.result(i)] = copy->result(i);
}

/// What the backward loop of vjpLoop threads and reads.
struct LoopGradients {
  size_t numCarried = 0;               // K
  int64_t trips = 0;                   // N
  std::vector<size_t> floatCarried;    // carried values k with a gradient
  std::vector<size_t> floatCaptures;   // captures j whose gradient is needed
  std::vector<size_t> seededScans;     // scans s whose result has a gradient
};

/// The body of the backward loop. Iteration t visits the forward iteration
/// i = N-1-t: it reads the carried values that entered it from their stacks
/// (gather at i), recomputes the forward body from them, and sweeps it
/// backwards from the gradients of what it returned (the carried gradients
/// threaded from iteration i+1, the scan gradients' row i). It returns the
/// gradients of the carried values entering iteration i and the captures'
/// gradients summed over the iterations so far. Arguments: (t, cond,
/// d_carried..., d_captures..., stacks..., d_scans..., captures...).
Expected<std::unique_ptr<Function>> backwardLoopBody(const Function& body, const Op& op,
                                                     const std::vector<Value*>& stackResults, const LoopGradients& lg,
                                                     std::span<Value* const> dys) {
  const size_t K = lg.numCarried;
  auto back = std::make_unique<Function>(body.name());
  back->setLoc(body.loc());
  Value* t = back->addArgument(TensorType{DType::I64, {}}, "t");
  Value* cond = back->addArgument(TensorType{DType::Bool, {}}, "cond");
  std::vector<Value*> dCarried, dCaptures, stacks, dScans, captures;
  for (size_t k : lg.floatCarried) dCarried.push_back(back->addArgument(op.result(k)->type()));
  for (size_t j : lg.floatCaptures) dCaptures.push_back(back->addArgument(op.operand(2 + K + j)->type()));
  for (Value* stack : stackResults) stacks.push_back(back->addArgument(stack->type()));
  for (size_t s : lg.seededScans) dScans.push_back(back->addArgument(dys[K + s]->type()));
  for (size_t j = 0; 2 + K + j < op.numOperands(); ++j)
    captures.push_back(back->addArgument(body.argument(2 + K + j)->type()));

  Builder b(*back);
  b.setLocation(op.loc());
  KILN_TRY_VALUE(i, b.value(OpKind::Sub, {b.scalar(DType::I64, static_cast<double>(lg.trips - 1)), t}));
  const AttrMap rows{{"axis", Attribute(int64_t{0})}};
  std::map<const Value*, Value*> map;
  map[body.argument(0)] = i;
  map[body.argument(1)] = cond;
  for (size_t k = 0; k < K; ++k) {
    KILN_TRY_VALUE(x, b.value(OpKind::Gather, {stacks[k], i}, rows));
    map[body.argument(2 + k)] = x;
  }
  for (size_t j = 0; j < captures.size(); ++j) map[body.argument(2 + K + j)] = captures[j];
  const Op* ret = body.returnOp();
  if (!ret) return Error("the body of 'loop' has no return", body.loc());
  // The sweep visits the recomputed body only: it stops at the rows read
  // from the stacks, which are saved values, not differentiated (a gather's
  // VJP would also need static shapes).
  std::set<const Op*> reads;
  for (const auto& o : back->ops()) reads.insert(o.get());
  for (const auto& o : body.ops()) {
    if (o.get() == ret) break;
    cloneInto(b, *o, map);
  }
  std::vector<Op*> recomputed;
  for (const auto& o : back->ops())
    if (!reads.count(o.get())) recomputed.push_back(o.get());

  std::set<const Value*> active;
  for (size_t k : lg.floatCarried) active.insert(map.at(body.argument(2 + k)));
  for (size_t j : lg.floatCaptures) active.insert(captures[j]);
  markActive(recomputed, active);
  GradientMap grads;
  auto returned = [&](size_t r) {
    Value* v = ret->operand(r);
    return map.count(v) ? map.at(v) : v;
  };
  for (size_t n = 0; n < lg.floatCarried.size(); ++n)
    if (Value* v = returned(1 + lg.floatCarried[n]); active.count(v))
      KILN_TRY(accumulateGradient(b, grads, v, dCarried[n]));
  for (size_t n = 0; n < lg.seededScans.size(); ++n) {
    Value* v = returned(1 + K + lg.seededScans[n]);
    if (!active.count(v)) continue;
    KILN_TRY_VALUE(row, b.value(OpKind::Gather, {dScans[n], i}, rows));
    KILN_TRY(accumulateGradient(b, grads, v, row));
  }
  KILN_TRY(sweepBackward(b, recomputed, active, grads));

  b.setLocation(op.loc());
  std::vector<Value*> results{cond};
  std::vector<TensorType> types{TensorType{DType::Bool, {}}};
  for (size_t n = 0; n < lg.floatCarried.size(); ++n) {
    auto g = gradientOrZeros(b, grads, map.at(body.argument(2 + lg.floatCarried[n])));
    if (!g) return g.takeError();
    results.push_back(*g);
    types.push_back(dCarried[n]->type());
  }
  for (size_t n = 0; n < lg.floatCaptures.size(); ++n) {
    Value* acc = dCaptures[n];
    if (auto g = grads.find(captures[lg.floatCaptures[n]]); g != grads.end()) {
      KILN_TRY_VALUE(sum, b.value(OpKind::Add, {acc, g->second}));
      acc = sum;
    }
    results.push_back(acc);
    types.push_back(dCaptures[n]->type());
  }
  b.ret(results);
  back->setResultTypes(std::move(types));
  // Rules build the gradient of every float operand (the stacks' among
  // them); drop what the results do not use.
  std::vector<Op*> ops;
  for (const auto& o : back->ops()) ops.push_back(o.get());
  for (auto it = ops.rbegin(); it != ops.rend(); ++it)
    if ((*it)->kind() != OpKind::Return && !(*it)->hasUses()) back->erase(*it);
  return back;
}

/// The results of `op` (a loop of `trips` iterations) that stack the
/// carried values entering each iteration, one per carried value: the
/// loop's last scan results when its body already returns its carried
/// arguments there (an earlier VJP of it added them), else new ones, added
/// to the op in place (its other results and their uses stay).
std::vector<Value*> stackCarriedValues(Op& op, int64_t trips) {
  const size_t K = static_cast<size_t>(op.getInt("num_carried"));
  Function& body = *op.region(0);
  Op* ret = body.returnOp();
  const size_t scans = op.numResults() - K;
  bool stacked = scans >= K && K > 0;
  for (size_t k = 0; stacked && k < K; ++k) stacked = ret->operand(1 + K + scans - K + k) == body.argument(2 + k);
  std::vector<Value*> stacks;
  if (stacked) {
    for (size_t k = 0; k < K; ++k) stacks.push_back(op.result(op.numResults() - K + k));
    return stacks;
  }
  std::vector<Value*> returned(ret->operands().begin(), ret->operands().end());
  std::vector<TensorType> types = body.resultTypes();
  for (size_t k = 0; k < K; ++k) {
    Value* x = body.argument(2 + k);
    returned.push_back(x);
    types.push_back(x->type());
    TensorType rows = x->type();
    rows.shape.insert(rows.shape.begin(), Dim::fixed(trips));
    stacks.push_back(op.addResult(rows));
  }
  ret->setOperands(returned);
  body.setResultTypes(std::move(types));
  return stacks;
}

/// The value of `v` when a `constant` op defines it as an integer scalar,
/// else none.
std::optional<int64_t> constantInteger(const Value* v) {
  const Op* def = v->definingOp();
  if (!def || def->kind() != OpKind::Constant || !isInteger(v->type().dtype) ||
      def->getTensor("value").numElements() != 1)
    return std::nullopt;
  return def->getTensor("value").getInt(0);
}

/// `v`, a value of a loop body, as a_k + k*d at iteration k (k = 0, 1, ...)
/// with integer a_k and d: the iteration number (0 + k*1), an i64 carried
/// argument that the body returns plus a constant step (init + k*step),
/// either of those plus a constant, or none of these.
std::optional<std::pair<int64_t, int64_t>> affineInIteration(const Op& loop, const Value* v) {
  const Function& body = *loop.region(0);
  const size_t K = static_cast<size_t>(loop.getInt("num_carried"));
  const Op* ret = body.returnOp();
  if (!isInteger(v->type().dtype) || !v->type().shape.empty()) return std::nullopt;
  if (v == body.argument(0)) return std::pair<int64_t, int64_t>{0, 1};
  for (size_t k = 0; k < K; ++k) {
    if (v != body.argument(2 + k)) continue;
    const std::optional<int64_t> init = constantInteger(loop.operand(2 + k));
    const Op* next = ret->operand(1 + k)->definingOp();
    if (!init || !next || next->kind() != OpKind::Add) return std::nullopt;
    for (size_t i = 0; i < 2; ++i) {
      const std::optional<int64_t> step = constantInteger(next->operand(1 - i));
      if (next->operand(i) == v && step) return std::pair{*init, *step};
    }
    return std::nullopt;
  }
  const Op* def = v->definingOp();
  if (!def || def->kind() != OpKind::Add) return std::nullopt;
  for (size_t i = 0; i < 2; ++i) {
    const std::optional<int64_t> offset = constantInteger(def->operand(1 - i));
    int64_t first = 0;
    if (!offset) continue;
    if (auto x = affineInIteration(loop, def->operand(i)); x && !__builtin_add_overflow(x->first, *offset, &first))
      return std::pair{first, x->second};
  }
  return std::nullopt;
}

/// The iterations of `loop` when its body's condition is a counter compared
/// with a constant, as PyTorch exports `while i < n` (ONNX Loop without a
/// trip count): the condition returned at iteration k is `lt(v_k, b)` or
/// `le(v_k, b)` with v_k = a + k*d, d > 0 (affineInIteration). Iteration 0
/// runs when the initial condition is true, iteration k > 0 when the
/// condition of k - 1 was, so the count is 1 + #{k >= 0 : v_k < b}, at most
/// the trip bound. None when the loop does not have this form.
std::optional<int64_t> counterTripCount(const Op& loop) {
  const std::optional<int64_t> bound = constantInteger(loop.operand(0));
  const std::optional<double> go = constantScalar(loop.operand(1));
  const Op* ret = loop.region(0)->returnOp();
  if (!bound || !go || *go == 0 || !ret) return std::nullopt;
  const Op* cmp = ret->operand(0)->definingOp();
  if (!cmp || (cmp->kind() != OpKind::Lt && cmp->kind() != OpKind::Le)) return std::nullopt;
  const std::optional<int64_t> limit = constantInteger(cmp->operand(1));
  const auto v = affineInIteration(loop, cmp->operand(0));
  if (!limit || !v || v->second <= 0) return std::nullopt;
  // v_k < b, with b one more for `le`: k < (b - a) / d, rounded up.
  if (cmp->kind() == OpKind::Le && *limit == std::numeric_limits<int64_t>::max()) return std::nullopt;
  const int64_t b = *limit + (cmp->kind() == OpKind::Le ? 1 : 0);
  const int64_t a = v->first, d = v->second;
  int64_t span = 0;
  if (a < b && __builtin_sub_overflow(b, a, &span)) return std::nullopt;
  const int64_t whileTrue = a < b ? (span - 1) / d + 1 : 0;
  return std::min<int64_t>(*bound, whileTrue + 1);
}

/// Makes `loop` (of `trips` iterations, counterTripCount) a counted loop in
/// place: its trip bound the constant `trips` and the condition its body
/// returns true. Its results do not change: the condition was true in every
/// iteration but the last, after which the bound stops it too.
void makeCounted(Op& loop, int64_t trips) {
  Builder outer(*loop.parent());
  outer.setInsertionPoint(&loop);
  loop.setOperand(0, outer.scalar(DType::I64, static_cast<double>(trips)));
  Function& body = *loop.region(0);
  Op* ret = body.returnOp();
  Builder inner(body);
  inner.setInsertionPoint(ret);
  ret->setOperand(0, inner.scalar(DType::Bool, 1.0));
}

/// results = loop(N, true, carried..., captures...) with a static trip
/// count N and a body that never stops early: true reverse mode. The
/// forward loop also stacks, as scan results added to it in place
/// (stackCarriedValues), the carried values entering each iteration. A
/// backward loop of
/// N iterations then runs the body's VJP in reverse iteration order
/// (backwardLoopBody), threading the carried values' gradients from the
/// final ones (dys) to the initial ones and summing the captures'. A loop
/// of no iteration passes its carried values' gradients through.
Grads vjpLoop(Grad& g, Op& op, std::span<Value* const> dys, const std::vector<bool>& needs) {
  const Function& body = *op.region(0);
  LoopGradients lg;
  lg.numCarried = static_cast<size_t>(op.getInt("num_carried"));
  const size_t K = lg.numCarried;
  const size_t S = op.numResults() - K;
  // A loop that a counter stops (PyTorch's `while i < n`) is counted first.
  if (auto trips = counterTripCount(op)) makeCounted(op, *trips);
  const std::optional<int64_t> bound = constantInteger(op.operand(0));
  const std::optional<double> go = constantScalar(op.operand(1));
  if (!bound || !go) {
    g.fail(std::string("the VJP of 'loop' needs a static trip count: its ") +
           (!bound ? "trip bound (operand 0)" : "initial condition (operand 1)") + " is not a constant");
    return {};
  }
  // The stacks hold one row per iteration; a bound past this is a loop that
  // only its condition ends (ONNX's Loop without M), which must be true here.
  constexpr int64_t kMaxTrips = int64_t{1} << 31;
  if (*go != 0 && *bound > kMaxTrips) {
    g.fail("the VJP of 'loop' needs a static trip count: its trip bound " + std::to_string(*bound) + " is more than " +
           std::to_string(kMaxTrips) + " iterations to stack");
    return {};
  }
  lg.trips = *go != 0 ? std::max<int64_t>(0, *bound) : 0;
  Grads grads(op.numOperands(), nullptr);
  if (lg.trips == 0) {
    for (size_t k = 0; k < K; ++k) grads[2 + k] = dys[k];
    return grads;
  }
  const Op* ret = body.returnOp();
  const std::optional<double> again = ret ? constantScalar(ret->operand(0)) : std::nullopt;
  if (!ret || (ret->operand(0) != body.argument(1) && !(again && *again != 0))) {
    g.fail(
        "the VJP of 'loop' needs a static trip count: the condition its body returns is not provably true (its "
        "condition argument or a true constant), so the loop may stop early");
    return {};
  }
  for (size_t k = 0; k < K; ++k)
    if (isFloat(op.result(k)->type().dtype)) lg.floatCarried.push_back(k);
  for (size_t j = 0; 2 + K + j < op.numOperands(); ++j)
    if (isFloat(op.operand(2 + K + j)->type().dtype) && needs[2 + K + j]) lg.floatCaptures.push_back(j);
  for (size_t s = 0; s < S; ++s)
    if (dys[K + s] && isFloat(op.result(K + s)->type().dtype)) lg.seededScans.push_back(s);
  if (lg.floatCarried.empty() && lg.floatCaptures.empty()) return grads;

  std::vector<Value*> stacks = stackCarriedValues(op, lg.trips);
  auto back = backwardLoopBody(body, op, stacks, lg, dys);
  if (!back) {
    g.fail(back.error().message());
    return {};
  }
  Builder& b = g.builder();
  std::vector<Value*> operands{g.scalar(DType::I64, static_cast<double>(lg.trips)), g.scalar(DType::Bool, 1.0)};
  std::vector<TensorType> backTypes;
  for (size_t k : lg.floatCarried) {
    Value* d = dys[k];
    if (!d) {
      auto zeros = zerosOf(b, op.result(k));
      if (!zeros) {
        g.fail(zeros.error().message());
        return {};
      }
      d = *zeros;
    }
    operands.push_back(d);
    backTypes.push_back(op.result(k)->type());
  }
  for (size_t j : lg.floatCaptures) {
    Value* capture = op.operand(2 + K + j);
    auto zeros = zerosOf(b, capture);
    if (!zeros) {
      g.fail(zeros.error().message());
      return {};
    }
    operands.push_back(*zeros);
    backTypes.push_back(capture->type());
  }
  operands.insert(operands.end(), stacks.begin(), stacks.end());
  for (size_t s : lg.seededScans) operands.push_back(dys[K + s]);
  for (size_t j = 0; 2 + K + j < op.numOperands(); ++j) operands.push_back(op.operand(2 + K + j));
  const int64_t threaded = static_cast<int64_t>(lg.floatCarried.size() + lg.floatCaptures.size());
  Op* backward = b.create(OpKind::Loop, std::move(operands), std::move(backTypes),
                          {{"num_carried", Attribute(threaded)}});
  backward->addRegion(std::move(*back));
  for (size_t n = 0; n < lg.floatCarried.size(); ++n) grads[2 + lg.floatCarried[n]] = backward->result(n);
  for (size_t n = 0; n < lg.floatCaptures.size(); ++n)
    grads[2 + K + lg.floatCaptures[n]] = backward->result(lg.floatCarried.size() + n);
  return grads;
}

// --- The table ----------------------------------------------------------------------------

/// The rule of an op of several results (loop): the gradients of its
/// operands given those of its results (null where none reached one) and
/// which operands need one. It may widen the op in place (see vjpLoop).
using ResultsRule = Grads (*)(Grad&, Op&, std::span<Value* const> dys, const std::vector<bool>& needs);

struct VjpEntry {
  VjpKind kind;
  Rule rule;
  ResultsRule resultsRule = nullptr;
  bool declared = true;
};
constexpr VjpEntry rule(Rule r) { return {VjpKind::Rule, r}; }
constexpr VjpEntry resultsRule(ResultsRule r) { return {VjpKind::Rule, nullptr, r}; }
constexpr VjpEntry kUndeclared{VjpKind::Unsupported, nullptr, nullptr, false};
constexpr VjpEntry kNone{VjpKind::NotDifferentiable, nullptr};
constexpr VjpEntry kDecompose{VjpKind::Decompose, nullptr};
constexpr VjpEntry kMissing{VjpKind::Unsupported, nullptr};  // differentiable, no rule yet

template <OpKind K>
constexpr VjpEntry kVjpOf = kUndeclared;

#define KILN_VJP(Enum, Entry) \
  template <>                 \
  constexpr VjpEntry kVjpOf<OpKind::Enum> = Entry;

KILN_VJP(Neg, rule(vjpNeg))
KILN_VJP(Abs, rule(vjpAbs))
KILN_VJP(Sign, kNone)
KILN_VJP(Exp, rule(vjpExp))
KILN_VJP(Log, rule(vjpLog))
KILN_VJP(Sqrt, rule(vjpSqrt))
KILN_VJP(Rsqrt, rule(vjpRsqrt))
KILN_VJP(Reciprocal, rule(vjpReciprocal))
KILN_VJP(Tanh, rule(vjpTanh))
KILN_VJP(Sigmoid, rule(vjpSigmoid))
KILN_VJP(Relu, rule(vjpRelu))
KILN_VJP(Erf, rule(vjpErf))
KILN_VJP(Sin, rule(vjpSin))
KILN_VJP(Cos, rule(vjpCos))
KILN_VJP(Tan, rule(vjpTan))
KILN_VJP(Asin, rule(vjpAsin))
KILN_VJP(Acos, rule(vjpAcos))
KILN_VJP(Atan, rule(vjpAtan))
KILN_VJP(Sinh, rule(vjpSinh))
KILN_VJP(Cosh, rule(vjpCosh))
KILN_VJP(Asinh, rule(vjpAsinh))
KILN_VJP(Acosh, rule(vjpAcosh))
KILN_VJP(Atanh, rule(vjpAtanh))
KILN_VJP(Floor, kNone)
KILN_VJP(Ceil, kNone)
KILN_VJP(Round, kNone)
KILN_VJP(Not, kNone)
KILN_VJP(IsNan, kNone)
KILN_VJP(IsInf, kNone)
KILN_VJP(Add, rule(vjpAdd))
KILN_VJP(Sub, rule(vjpSub))
KILN_VJP(Mul, rule(vjpMul))
KILN_VJP(Div, rule(vjpDiv))
KILN_VJP(Pow, rule(vjpPow))
KILN_VJP(Max, rule(vjpMax))
KILN_VJP(Min, rule(vjpMin))
KILN_VJP(Mod, rule(vjpMod))
KILN_VJP(Rem, rule(vjpRem))
KILN_VJP(And, kNone)
KILN_VJP(Or, kNone)
KILN_VJP(Xor, kNone)
KILN_VJP(Eq, kNone)
KILN_VJP(Ne, kNone)
KILN_VJP(Lt, kNone)
KILN_VJP(Le, kNone)
KILN_VJP(Gt, kNone)
KILN_VJP(Ge, kNone)
KILN_VJP(Select, rule(vjpSelect))
KILN_VJP(Constant, kNone)
KILN_VJP(Iota, kNone)
KILN_VJP(Cast, rule(vjpCast))
KILN_VJP(Broadcast, rule(vjpBroadcast))
KILN_VJP(Reshape, rule(vjpReshape))
KILN_VJP(Transpose, rule(vjpTranspose))
KILN_VJP(Slice, rule(vjpSlice))
KILN_VJP(Concat, rule(vjpConcat))
KILN_VJP(Pad, rule(vjpPad))
KILN_VJP(Gather, rule(vjpGather))
KILN_VJP(GatherElements, rule(vjpGatherElements))
KILN_VJP(ScatterElements, rule(vjpScatterElements))
KILN_VJP(ReduceSum, rule(vjpReduceSum))
KILN_VJP(ReduceMean, rule(vjpReduceMean))
KILN_VJP(ReduceMax, rule(vjpReduceExtreme))
KILN_VJP(ReduceMin, rule(vjpReduceExtreme))
KILN_VJP(ReduceProd, rule(vjpReduceProd))
KILN_VJP(ArgMax, kNone)
KILN_VJP(ArgMin, kNone)
KILN_VJP(MatMul, rule(vjpMatMul))
KILN_VJP(Conv, rule(vjpConv))
KILN_VJP(ConvTranspose, rule(vjpConvTranspose))
KILN_VJP(ConvWeightGrad, rule(vjpConvWeightGrad))
KILN_VJP(MaxPool, rule(vjpMaxPool))
KILN_VJP(AvgPool, rule(vjpAvgPool))
// Inference only: a quantized model is not trained.
KILN_VJP(QConv, kNone)
KILN_VJP(QMatMul, kNone)
KILN_VJP(RandomUniform, kNone)
KILN_VJP(RandomNormal, kNone)
KILN_VJP(Softmax, kDecompose)
KILN_VJP(LogSoftmax, kDecompose)
KILN_VJP(LayerNorm, kDecompose)
KILN_VJP(BatchNorm, kDecompose)
KILN_VJP(Gelu, kDecompose)
KILN_VJP(Silu, kDecompose)
KILN_VJP(LeakyRelu, kDecompose)
KILN_VJP(Elu, kDecompose)
KILN_VJP(Softplus, kDecompose)
KILN_VJP(Rnn, kDecompose)
KILN_VJP(Lstm, kDecompose)
KILN_VJP(Gru, kDecompose)
KILN_VJP(Attention, kDecompose)
KILN_VJP(CrossEntropy, kDecompose)
KILN_VJP(NllLoss, kDecompose)
KILN_VJP(MseLoss, kDecompose)
KILN_VJP(Quantize, kDecompose)
KILN_VJP(Dequantize, kDecompose)
KILN_VJP(NonZero, kNone)
KILN_VJP(Unique, kMissing)
KILN_VJP(NonMaxSuppression, kNone)
KILN_VJP(Check, kNone)
KILN_VJP(AllReduce, rule(vjpAllReduce))
KILN_VJP(BroadcastFrom, rule(vjpBroadcastFrom))
KILN_VJP(ReduceTo, rule(vjpReduceTo))
KILN_VJP(AllGather, rule(vjpAllGather))
KILN_VJP(ReduceScatter, rule(vjpReduceScatter))
KILN_VJP(If, rule(vjpIf))
KILN_VJP(Loop, resultsRule(vjpLoop))
KILN_VJP(Fused, kMissing)
KILN_VJP(Return, kNone)
#undef KILN_VJP

// Every op declares how it is differentiated; composites decompose.
#define KILN_OP(Enum, Mnemonic, Class, ...)                                                                  \
  static_assert(kVjpOf<OpKind::Enum>.declared, "declare the VJP of " Mnemonic " in passes/Vjp.cpp");         \
  static_assert((OpClass::Class == OpClass::Composite) == (kVjpOf<OpKind::Enum>.kind == VjpKind::Decompose), \
                "composite ops, and only they, are differentiated through their decomposition: " Mnemonic);
#include "ir/Ops.def"

constexpr VjpEntry kVjps[] = {
#define KILN_OP(Enum, ...) kVjpOf<OpKind::Enum>,
#include "ir/Ops.def"
};
static_assert(std::size(kVjps) == kNumOpKinds);

}  // namespace

VjpKind vjpKind(OpKind kind) { return kVjps[static_cast<size_t>(kind)].kind; }

std::string_view vjpKindName(VjpKind kind) {
  switch (kind) {
    case VjpKind::Rule: return "rule";
    case VjpKind::NotDifferentiable: return "not differentiable";
    case VjpKind::Decompose: return "decompose";
    case VjpKind::Unsupported: return "unsupported";
  }
  return "?";
}

Expected<Value*> unbroadcast(Builder& b, Value* g, const TensorType& target) {
  const Shape& from = g->type().shape;
  const Shape& to = target.shape;
  if (from.size() < to.size())
    return Error("gradient of type " + g->type().str() + " cannot be summed to " + target.str());
  size_t lead = from.size() - to.size();
  std::vector<int64_t> dropped, ones;
  for (size_t d = 0; d < lead; ++d) dropped.push_back(static_cast<int64_t>(d));
  for (size_t d = 0; d < to.size(); ++d)
    if (to[d].isStatic() && to[d].size == 1 && !(from[lead + d].isStatic() && from[lead + d].size == 1))
      ones.push_back(static_cast<int64_t>(lead + d));
  Value* v = g;
  if (!ones.empty()) {
    auto r = b.value(OpKind::ReduceSum, {v}, {{"axes", Attribute(ones)}, {"keepdims", Attribute(true)}});
    if (!r) return r.takeError();
    v = *r;
  }
  if (!dropped.empty()) {
    auto r = b.value(OpKind::ReduceSum, {v}, {{"axes", Attribute(dropped)}, {"keepdims", Attribute(false)}});
    if (!r) return r.takeError();
    v = *r;
  }
  return v;
}

Expected<std::vector<Value*>> applyVjpResults(Builder& b, Op& op, std::span<Value* const> dys,
                                              const std::vector<bool>& needs) {
  const VjpEntry& entry = kVjps[static_cast<size_t>(op.kind())];
  if (entry.kind == VjpKind::NotDifferentiable) return std::vector<Value*>(op.numOperands(), nullptr);
  if (!entry.resultsRule) {
    if (op.numResults() != 1) return op.emitError("has several results; autodiff handles single-result ops and loop only");
    if (!dys[0]) return std::vector<Value*>(op.numOperands(), nullptr);
    return applyVjp(b, op, dys[0], needs);
  }
  Grad g(b, op);
  std::vector<Value*> grads = entry.resultsRule(g, op, dys, needs);
  KILN_TRY(g.status());
  grads.resize(op.numOperands(), nullptr);
  for (size_t i = 0; i < grads.size(); ++i)
    if (!needs[i] || !isFloat(op.operand(i)->type().dtype)) grads[i] = nullptr;
  return grads;
}

Expected<std::vector<Value*>> applyVjp(Builder& b, const Op& op, Value* dy, const std::vector<bool>& needs) {
  const VjpEntry& entry = kVjps[static_cast<size_t>(op.kind())];
  if (entry.resultsRule) return op.emitError("has a rule for several results: differentiate it with applyVjpResults");
  if (entry.kind == VjpKind::NotDifferentiable) return std::vector<Value*>(op.numOperands(), nullptr);
  if (entry.kind == VjpKind::Decompose) return op.emitError("is a composite op; decompose it before autodiff");
  if (entry.kind != VjpKind::Rule)
    return op.emitError("has no gradient rule yet (see docs/autodiff.md for the ops that have one)");
  Grad g(b, op);
  std::vector<Value*> grads = entry.rule(g, op, dy);
  KILN_TRY(g.status());
  grads.resize(op.numOperands(), nullptr);
  for (size_t i = 0; i < grads.size(); ++i)
    if (!needs[i] || !isFloat(op.operand(i)->type().dtype)) grads[i] = nullptr;
  return grads;
}

}  // namespace kiln
