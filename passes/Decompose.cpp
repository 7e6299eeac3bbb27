// The `decompose` pass: expands every composite op of ir/Ops.def into the
// primitive ops, with exactly the semantics of docs/ops.md, so that later
// passes (folding, CSE, fusion) and backends only ever see primitives. Each
// composite has one lowering function below, registered in an array indexed
// by OpKind; a composite added to Ops.def without a lowering fails to
// compile. New ops take the composite's location and their result types
// from the shape rules (declared types only for reshape, cast and iota, built
// from the operands' dims so symbolic dims survive). Recurrent ops are
// unrolled over time and therefore need a static sequence length.
#include "passes/Decompose.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <optional>

#include "ir/Builder.h"
#include "ir/ShapeRules.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

constexpr int64_t kToEnd = std::numeric_limits<int64_t>::max();

/// Builds the primitives of one lowering before the composite op. Errors are
/// sticky: the first failure is kept and every later call (and every call
/// given a null operand) returns null, so lowerings read as formulas and are
/// checked once at the end. It also remembers every op it created, so that a
/// failed lowering can be undone. Lowerings never pass two op-emitting calls
/// as arguments of one call: C++ leaves their order unspecified, and the
/// printed IR must not depend on the compiler.
class Emitter {
 public:
  explicit Emitter(Op& composite) : b_(*composite.parent()), composite_(composite) {
    b_.setInsertionPoint(&composite);
    b_.setLocation(composite.loc());
  }

  const std::vector<Op*>& created() const { return created_; }
  Status status() const { return error_ ? Status(*error_) : Status::success(); }

  /// An op of `kind` whose result type comes from its shape rule.
  Value* emit(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {}, std::vector<TensorType> declared = {}) {
    if (error_) return nullptr;
    for (Value* v : operands)
      if (!v) return nullptr;
    auto op = b_.build(kind, std::move(operands), std::move(attrs), std::move(declared));
    if (!op) {
      fail(composite_.emitError("cannot be decomposed: " + op.error().message()));
      return nullptr;
    }
    created_.push_back(*op);
    return (*op)->result(0);
  }

  /// A rank-0 constant, created once per dtype and value.
  Value* scalar(DType dtype, double v) {
    if (error_) return nullptr;
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    Value*& cached = scalars_[{dtype, bits}];
    if (!cached) {
      cached = b_.scalar(dtype, v);
      created_.push_back(cached->definingOp());
    }
    return cached;
  }
  /// A scalar with the dtype of `like` (null when `like` is).
  Value* scalarLike(Value* like, double v) { return like ? scalar(like->type().dtype, v) : nullptr; }

  Value* unary(OpKind kind, Value* x) { return emit(kind, {x}); }
  Value* binary(OpKind kind, Value* a, Value* b) { return emit(kind, {a, b}); }
  Value* add(Value* a, Value* b) { return binary(OpKind::Add, a, b); }
  Value* sub(Value* a, Value* b) { return binary(OpKind::Sub, a, b); }
  Value* mul(Value* a, Value* b) { return binary(OpKind::Mul, a, b); }
  Value* div(Value* a, Value* b) { return binary(OpKind::Div, a, b); }
  Value* add(Value* a, double b) { return add(a, scalarLike(a, b)); }
  Value* mul(Value* a, double b) { return mul(a, scalarLike(a, b)); }
  Value* sub(double a, Value* b) { return sub(scalarLike(b, a), b); }
  Value* select(Value* cond, Value* a, Value* b) { return emit(OpKind::Select, {cond, a, b}); }
  Value* matmul(Value* a, Value* b) { return binary(OpKind::MatMul, a, b); }

  Value* reduce(OpKind kind, Value* x, std::vector<int64_t> axes, bool keepdims) {
    return emit(kind, {x}, {{"axes", Attribute(std::move(axes))}, {"keepdims", Attribute(keepdims)}});
  }
  Value* transpose(Value* x, std::vector<int64_t> perm) {
    return emit(OpKind::Transpose, {x}, {{"perm", Attribute(std::move(perm))}});
  }
  Value* concat(std::vector<Value*> parts, int64_t axis) {
    if (parts.size() == 1) return parts[0];
    return emit(OpKind::Concat, std::move(parts), {{"axis", Attribute(axis)}});
  }
  Value* reshape(Value* x, Shape shape) {
    if (!x) return nullptr;
    return emit(OpKind::Reshape, {x}, {}, {TensorType{x->type().dtype, std::move(shape)}});
  }
  Value* cast(Value* x, DType dtype) {
    if (!x) return nullptr;
    return emit(OpKind::Cast, {x}, {}, {TensorType{dtype, x->type().shape}});
  }
  Value* iota(TensorType type, int64_t axis) {
    return emit(OpKind::Iota, {}, {{"axis", Attribute(axis)}}, {std::move(type)});
  }
  /// Elements [start, end) of `x` along `axis`, all of every other dim.
  Value* sliceAxis(Value* x, int64_t axis, int64_t start, int64_t end) { return slice(x, {{axis, start, end}}); }
  /// Elements [start, end) of `x` along each (axis, start, end) of `ranges`,
  /// all of every other dim.
  Value* slice(Value* x, const std::vector<std::array<int64_t, 3>>& ranges) {
    if (!x) return nullptr;
    const Shape& shape = x->type().shape;
    std::vector<int64_t> starts(shape.size(), 0), ends, steps(shape.size(), 1);
    for (const Dim& d : shape) ends.push_back(d.isStatic() ? d.size : kToEnd);
    for (const auto& [axis, start, end] : ranges) {
      starts[axis] = start;
      ends[axis] = end;
    }
    return emit(OpKind::Slice, {x},
                {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
  }

 private:
  void fail(Error e) {
    if (!error_) error_ = std::move(e);
  }

  Builder b_;
  Op& composite_;
  std::optional<Error> error_;
  std::vector<Op*> created_;
  std::map<std::pair<DType, uint64_t>, Value*> scalars_;
};

using Lowered = Expected<std::vector<Value*>>;
/// Expands one composite op; returns the values replacing its results.
using Lowering = Lowered (*)(Emitter&, const Op&);

/// The `axis` attribute of `op` normalized against `rank`, or an error.
Expected<int64_t> axisAttr(const Op& op, int64_t rank) { return checkedAxis(op, op.getInt("axis"), rank); }

// --- Normalization and activations -------------------------------------------

/// softmax(x) = e / sum(e), e = exp(x - max(x)) along `axis`.
Value* softmaxOf(Emitter& e, Value* x, int64_t axis) {
  Value* ex = e.unary(OpKind::Exp, e.sub(x, e.reduce(OpKind::ReduceMax, x, {axis}, true)));
  return e.div(ex, e.reduce(OpKind::ReduceSum, ex, {axis}, true));
}

/// log_softmax(x) = z - log(sum(exp(z))), z = x - max(x) along `axis`.
Value* logSoftmaxOf(Emitter& e, Value* x, int64_t axis) {
  Value* z = e.sub(x, e.reduce(OpKind::ReduceMax, x, {axis}, true));
  return e.sub(z, e.unary(OpKind::Log, e.reduce(OpKind::ReduceSum, e.unary(OpKind::Exp, z), {axis}, true)));
}

Lowered lowerSoftmax(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  auto axis = axisAttr(op, x->type().rank());
  if (!axis) return axis.takeError();
  return std::vector{softmaxOf(e, x, *axis)};
}

Lowered lowerLogSoftmax(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  auto axis = axisAttr(op, x->type().rank());
  if (!axis) return axis.takeError();
  return std::vector{logSoftmaxOf(e, x, *axis)};
}

/// layer_norm = (x - mean) * rsqrt(mean((x - mean)^2) + eps) [* scale] [+ bias], over dims axis..
Lowered lowerLayerNorm(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  int64_t rank = x->type().rank();
  auto axis = axisAttr(op, rank);
  if (!axis) return axis.takeError();
  std::vector<int64_t> axes;
  for (int64_t a = *axis; a < rank; ++a) axes.push_back(a);
  Value* centered = e.sub(x, e.reduce(OpKind::ReduceMean, x, axes, true));
  Value* var = e.reduce(OpKind::ReduceMean, e.mul(centered, centered), axes, true);
  Value* y = e.mul(centered, e.unary(OpKind::Rsqrt, e.add(var, op.getFloat("epsilon"))));
  if (op.numOperands() > 1) y = e.mul(y, op.operand(1));
  if (op.numOperands() > 2) y = e.add(y, op.operand(2));
  return std::vector{y};
}

/// batch_norm = (x - mean) * (scale * rsqrt(var + eps)) + bias, the [C] operands reshaped to [C,1,...].
Lowered lowerBatchNorm(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  int64_t rank = x->type().rank();
  // A [C] operand broadcasts against dim 1 of x[N, C, d...] once trailing 1s are appended.
  auto perChannel = [&](Value* v) {
    if (rank <= 2) return v;
    Shape shape(static_cast<size_t>(rank - 1), Dim::fixed(1));
    shape[0] = v->type().shape[0];
    return e.reshape(v, shape);
  };
  Value* gain = e.mul(op.operand(1), e.unary(OpKind::Rsqrt, e.add(op.operand(4), op.getFloat("epsilon"))));
  Value* centered = e.sub(x, perChannel(op.operand(3)));
  Value* y = e.mul(centered, perChannel(gain));
  return std::vector{e.add(y, perChannel(op.operand(2)))};
}

/// gelu = 0.5 x (1 + erf(x / sqrt 2)), or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) for "tanh".
Lowered lowerGelu(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  const std::string& approximate = op.getString("approximate");
  Value* inner;
  if (approximate == "none") {
    inner = e.unary(OpKind::Erf, e.mul(x, 1.0 / std::numbers::sqrt2));
  } else if (approximate == "tanh") {
    Value* cubic = e.add(x, e.mul(e.mul(e.mul(x, x), x), 0.044715));
    inner = e.unary(OpKind::Tanh, e.mul(cubic, std::sqrt(2.0 / std::numbers::pi)));
  } else {
    return op.emitError("has approximate = \"" + approximate + "\"; expected \"none\" or \"tanh\"");
  }
  Value* half = e.mul(x, 0.5);
  return std::vector{e.mul(half, e.add(inner, 1.0))};
}

/// silu = x * sigmoid(x).
Lowered lowerSilu(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  return std::vector{e.mul(x, e.unary(OpKind::Sigmoid, x))};
}

/// leaky_relu = select(x < 0, alpha * x, x).
Lowered lowerLeakyRelu(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  Value* negative = e.binary(OpKind::Lt, x, e.scalarLike(x, 0.0));
  return std::vector{e.select(negative, e.mul(x, op.getFloat("alpha")), x)};
}

/// expm1(x) = e^x - 1 from exp and log, accurate for small |x| where
/// exp(x) - 1 cancels (the IR has no expm1 primitive). Kahan's trick: with
/// u = exp(x) rounded, u - 1 is exact, and (u - 1) * x / log(u) is
/// expm1 evaluated at the x' that u is exactly e^x' of, rescaled by x / x',
/// so the rounding of u barely shows. u == 1 (|x| below half an ulp of 1)
/// gives x itself; u - 1 == -1 (x below about -17 in f32, -37 in f64, and
/// -inf, where log(u) would make the ratio NaN) gives -1.
Value* expm1(Emitter& e, Value* x) {
  Value* u = e.unary(OpKind::Exp, x);
  Value* um1 = e.add(u, -1.0);
  Value* scaled = e.mul(um1, x);
  Value* ratio = e.div(scaled, e.unary(OpKind::Log, u));
  Value* isOne = e.binary(OpKind::Eq, u, e.scalarLike(u, 1.0));
  Value* isMinusOne = e.binary(OpKind::Eq, um1, e.scalarLike(um1, -1.0));
  return e.select(isOne, x, e.select(isMinusOne, um1, ratio));
}

/// log1p(t) = log(1 + t) for t >= 0, accurate where 1 + t rounds away t's
/// digits (Kahan's trick again: u = 1 + t rounded, u - 1 exact, and
/// log(u) * t / (u - 1) rescales log(u) to the t that was asked for);
/// u == 1 gives t itself.
Value* log1pNonNegative(Emitter& e, Value* t) {
  Value* u = e.add(t, 1.0);
  Value* scaled = e.mul(e.unary(OpKind::Log, u), t);
  Value* ratio = e.div(scaled, e.add(u, -1.0));
  Value* isOne = e.binary(OpKind::Eq, u, e.scalarLike(u, 1.0));
  return e.select(isOne, t, ratio);
}

/// elu = select(x < 0, alpha * expm1(x), x), with PyTorch's expm1 (not
/// exp(x) - 1, which loses every digit of x near 0).
Lowered lowerElu(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  Value* negative = e.binary(OpKind::Lt, x, e.scalarLike(x, 0.0));
  return std::vector{e.select(negative, e.mul(expm1(e, x), op.getFloat("alpha")), x)};
}

/// softplus = max(x, 0) + log1p(exp(-|x|)), which never overflows and keeps
/// e^x for large negative x (log(1 + e^x) there would round to 0).
Lowered lowerSoftplus(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  Value* positive = e.binary(OpKind::Max, x, e.scalarLike(x, 0.0));
  Value* tail = e.unary(OpKind::Exp, e.unary(OpKind::Neg, e.unary(OpKind::Abs, x)));
  return std::vector{e.add(positive, log1pNonNegative(e, tail))};
}

// --- Recurrent ops -------------------------------------------------------------

/// The input projection x W^T + Wb of one time step, read gate by gate:
/// gates(k, n) is gates [k, k+n) of step t, [batch, n*H], sliced out of the
/// projection of all steps ([seq, batch, G*H]) where the cell reads it. A
/// cell that adds it to its h R^T gate by gate computes the sum inside its
/// fused kernel, so no step copies its row of the projection first.
struct StepInput {
  Emitter& e;
  Value* projections;
  int64_t t;
  int64_t hidden;
  Dim batch;
  Value* gates(int64_t first, int64_t count = 1) const {
    Value* part = e.slice(projections, {{0, t, t + 1}, {2, first * hidden, (first + count) * hidden}});
    return e.reshape(part, {batch, Dim::fixed(count * hidden)});
  }
};

/// One time step of a cell: from the input projection of this step and the
/// carried state (h, or h and c) to the next state.
using Step = std::function<std::vector<Value*>(const StepInput& x, const std::vector<Value*>& state)>;
/// Prepares one direction's step from R^T ([H, G*H]) and, for cells that
/// keep it separate, the recurrent bias ([G*H], else null). Called once per
/// direction so that weight slicing stays out of the time loop.
using StepFactory = std::function<Step(Value* rT, Value* recurrentBias)>;

/// Columns [gate*H, (gate+1)*H) of a [batch, G*H] gate projection.
Value* gate(Emitter& e, Value* projection, int64_t gate, int64_t hidden) {
  return e.sliceAxis(projection, 1, gate * hidden, (gate + 1) * hidden);
}

/// Unrolls a recurrent op (ONNX layout, docs/ops.md) over its static
/// sequence length. Per direction: the input projection of all steps is one
/// matmul; each step's cell reads its gates of it (StepInput), and its h
/// becomes row t of Y; directions are concatenated along Y's dirs axis.
Lowered unrollRecurrence(Emitter& e, const Op& op, int64_t numGates, int64_t numStates, bool separateRecurrentBias,
                         const StepFactory& makeStep) {
  Value* x = op.operand(0);
  Value* w = op.operand(1);
  Value* r = op.operand(2);
  Value* b = op.operand(3);
  const TensorType& xType = x->type();
  if (xType.rank() != 3) return op.emitError("needs X of rank 3 [seq, batch, input]; got " + xType.str());
  if (!xType.shape[0].isStatic())
    return op.emitError("cannot be decomposed: the sequence length must be static to unroll it, but X has type " +
                        xType.str());
  int64_t seq = xType.shape[0].size;
  if (seq == 0) return op.emitError("cannot be decomposed: the sequence length of X (" + xType.str() + ") is 0");
  const std::string& direction = op.getString("direction");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    return op.emitError("has direction = \"" + direction +
                        "\"; expected \"forward\", \"reverse\" or \"bidirectional\"");
  int64_t hidden = op.getInt("hidden_size");
  int64_t gates = numGates * hidden;
  Dim batch = xType.shape[1];
  Dim h = Dim::fixed(hidden);

  // A [dirs, d...] operand's part for direction `dir`, without the dirs axis.
  auto ofDirection = [&](Value* v, int64_t dir) {
    const Shape& shape = v->type().shape;
    Value* part = shape[0] == Dim::fixed(1) ? v : e.sliceAxis(v, 0, dir, dir + 1);
    return e.reshape(part, Shape(shape.begin() + 1, shape.end()));
  };

  std::vector<Value*> ys;
  std::vector<std::vector<Value*>> finals(static_cast<size_t>(numStates));
  int64_t numDirections = direction == "bidirectional" ? 2 : 1;
  for (int64_t dir = 0; dir < numDirections; ++dir) {
    bool reverse = direction == "reverse" || dir == 1;
    Value* wT = e.transpose(ofDirection(w, dir), {1, 0});
    Value* rT = e.transpose(ofDirection(r, dir), {1, 0});
    Value* bias = ofDirection(b, dir);
    Value* inputBias = e.sliceAxis(bias, 0, 0, gates);
    Value* recurrentBias = e.sliceAxis(bias, 0, gates, 2 * gates);
    if (!separateRecurrentBias) {
      inputBias = e.add(inputBias, recurrentBias);
      recurrentBias = nullptr;
    }
    Value* projections = e.add(e.matmul(x, wT), inputBias);  // [seq, batch, G*H]
    Step step = makeStep(rT, recurrentBias);

    std::vector<Value*> state;
    for (int64_t s = 0; s < numStates; ++s) state.push_back(ofDirection(op.operand(4 + s), dir));
    std::vector<Value*> steps(static_cast<size_t>(seq));
    for (int64_t i = 0; i < seq; ++i) {
      int64_t t = reverse ? seq - 1 - i : i;
      state = step(StepInput{e, projections, t, hidden, batch}, state);
      steps[static_cast<size_t>(t)] = e.reshape(state[0], {Dim::fixed(1), Dim::fixed(1), batch, h});
    }
    ys.push_back(e.concat(steps, 0));
    for (int64_t s = 0; s < numStates; ++s)
      finals[static_cast<size_t>(s)].push_back(e.reshape(state[static_cast<size_t>(s)], {Dim::fixed(1), batch, h}));
  }
  std::vector<Value*> results{e.concat(ys, 1)};
  for (auto& f : finals) results.push_back(e.concat(f, 0));
  return results;
}

/// The primitive of an RNN `activation`, if it names one.
std::optional<OpKind> rnnActivation(std::string_view name) {
  if (name == "tanh") return OpKind::Tanh;
  if (name == "relu") return OpKind::Relu;
  if (name == "sigmoid") return OpKind::Sigmoid;
  return std::nullopt;
}

/// rnn: h = act(x W^T + h R^T + Wb + Rb), act = tanh, relu or sigmoid.
Lowered lowerRnn(Emitter& e, const Op& op) {
  const std::string& activation = op.getString("activation");
  std::optional<OpKind> act = rnnActivation(activation);
  if (!act) return op.emitError("has activation = \"" + activation + "\"; expected \"tanh\", \"relu\" or \"sigmoid\"");
  return unrollRecurrence(e, op, 1, 1, false, [&](Value* rT, Value*) -> Step {
    return [&e, act = *act, rT](const StepInput& x, const std::vector<Value*>& state) {
      Value* xh = x.gates(0);
      return std::vector{e.unary(act, e.add(xh, e.matmul(state[0], rT)))};
    };
  });
}

/// lstm: [i o f c~] = x W^T + h R^T + Wb + Rb; c = sig(f) c + sig(i) tanh(c~); h = sig(o) tanh(c).
/// Each gate's sum is taken after slicing both terms, so that one kernel
/// after the h R^T product computes all of the cell.
Lowered lowerLstm(Emitter& e, const Op& op) {
  int64_t hidden = op.getInt("hidden_size");
  return unrollRecurrence(e, op, 4, 2, false, [&](Value* rT, Value*) -> Step {
    return [&e, hidden, rT](const StepInput& x, const std::vector<Value*>& state) {
      Value* hr = e.matmul(state[0], rT);
      auto preactivation = [&](int64_t k) {
        Value* xk = x.gates(k);
        return e.add(xk, gate(e, hr, k, hidden));
      };
      auto sigmoidGate = [&](int64_t k) { return e.unary(OpKind::Sigmoid, preactivation(k)); };
      Value* candidate = e.unary(OpKind::Tanh, preactivation(3));
      Value* kept = e.mul(sigmoidGate(2), state[1]);
      Value* c = e.add(kept, e.mul(sigmoidGate(0), candidate));
      Value* output = sigmoidGate(1);
      Value* h = e.mul(output, e.unary(OpKind::Tanh, c));
      return std::vector{h, c};
    };
  });
}

/// gru: z, r = sig(x W^T + h R^T + Wb + Rb) (gates z r); h~ = tanh(xh + (r h) Rh^T + Rbh),
/// or tanh(xh + r (h Rh^T + Rbh)) with linear_before_reset; h = (1 - z) h~ + z h.
/// With linear_before_reset all three gates' h R^T + Rb are one product; z
/// and r sum their two terms after slicing them, as the LSTM's gates do.
Lowered lowerGru(Emitter& e, const Op& op) {
  int64_t hidden = op.getInt("hidden_size");
  bool linearBeforeReset = op.getBool("linear_before_reset");
  return unrollRecurrence(e, op, 3, 1, true, [&](Value* rT, Value* rb) -> Step {
    Value* rTzr = linearBeforeReset ? rT : e.sliceAxis(rT, 1, 0, 2 * hidden);
    Value* rbzr = linearBeforeReset ? rb : e.sliceAxis(rb, 0, 0, 2 * hidden);
    Value* rTh = linearBeforeReset ? nullptr : e.sliceAxis(rT, 1, 2 * hidden, 3 * hidden);
    Value* rbh = linearBeforeReset ? nullptr : e.sliceAxis(rb, 0, 2 * hidden, 3 * hidden);
    return [=, &e](const StepInput& x, const std::vector<Value*>& state) {
      Value* h = state[0];
      // [batch, 3H] with linear_before_reset, else [batch, 2H].
      Value* hr = e.add(e.matmul(h, rTzr), rbzr);
      auto sigmoidGate = [&](int64_t k) {
        Value* xk = x.gates(k);
        return e.unary(OpKind::Sigmoid, e.add(xk, gate(e, hr, k, hidden)));
      };
      Value* z = sigmoidGate(0);
      Value* r = sigmoidGate(1);
      Value* recurrent =
          linearBeforeReset ? e.mul(r, gate(e, hr, 2, hidden)) : e.add(e.matmul(e.mul(r, h), rTh), rbh);
      Value* candidate = e.unary(OpKind::Tanh, e.add(x.gates(2), recurrent));
      Value* update = e.mul(e.sub(1.0, z), candidate);
      return std::vector{e.add(update, e.mul(z, h))};
    };
  });
}

// --- Attention -------------------------------------------------------------------

/// attention = softmax(mask(q k^T * scale)) v; scale 0 means 1/sqrt(D); a bool mask
/// keeps true positions (others -inf), a float mask is added, causal keeps j <= i.
Lowered lowerAttention(Emitter& e, const Op& op) {
  Value* q = op.operand(0);
  Value* k = op.operand(1);
  const Shape& qShape = q->type().shape;
  int64_t rank = k->type().rank();
  if (qShape.size() < 2 || rank < 2) return op.emitError("needs q and k of rank 2 or more");
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank - 2; ++i) perm.push_back(i);
  perm.push_back(rank - 1);
  perm.push_back(rank - 2);

  double scale = op.getFloat("scale");
  if (scale == 0.0) {
    const Dim& depth = qShape.back();
    if (!depth.isStatic())
      return op.emitError(
          "cannot be decomposed: scale = 0 means 1/sqrt(D), which needs a static head size D, but q has type " +
          q->type().str());
    scale = 1.0 / std::sqrt(static_cast<double>(depth.size));
  }
  Value* scores = e.mul(e.matmul(q, e.transpose(k, perm)), scale);
  Value* minusInf = e.scalarLike(scores, -std::numeric_limits<double>::infinity());
  if (op.numOperands() > 3) {
    Value* mask = op.operand(3);
    scores = mask->type().dtype == DType::Bool ? e.select(mask, scores, minusInf) : e.add(scores, mask);
  }
  if (op.getBool("causal")) {
    Dim queries = qShape[qShape.size() - 2];
    Dim keys = k->type().shape[static_cast<size_t>(rank - 2)];
    if (queries.isUnknown() || keys.isUnknown())
      return op.emitError(
          "cannot be decomposed: a causal mask needs static or named query and key lengths, but q has type " +
          q->type().str() + " and k has type " + k->type().str());
    TensorType positions{DType::I64, {queries, keys}};
    Value* query = e.iota(positions, 0);
    Value* keep = e.binary(OpKind::Le, e.iota(positions, 1), query);
    scores = e.select(keep, scores, minusInf);
  }
  return std::vector{e.matmul(softmaxOf(e, scores, -1), op.operand(2))};
}

// --- Losses ------------------------------------------------------------------------

/// Applies a loss's `reduction`: none, sum, or sum / `count` (count null: mean over all).
Expected<Value*> reduceLoss(Emitter& e, const Op& op, Value* loss, Value* count) {
  const std::string& reduction = op.getString("reduction");
  if (reduction == "none") return loss;
  if (reduction == "sum") return e.reduce(OpKind::ReduceSum, loss, {}, false);
  if (reduction == "mean") {
    if (!count) return e.reduce(OpKind::ReduceMean, loss, {}, false);
    return e.div(e.reduce(OpKind::ReduceSum, loss, {}, false), count);
  }
  return op.emitError("has reduction = \"" + reduction + "\"; expected \"mean\", \"sum\" or \"none\"");
}

/// The loss of log-probabilities logp[N, C, d...] against labels[N, d...]:
/// (1 - eps) * -logp[label] + eps * mean_c(-logp), 0 where label == ignore_index,
/// then reduced; the label is picked by comparing labels with iota over C.
/// (A label outside [0, C) matches no class and contributes 0, where the
/// interpreter reports it: there is no run-time error primitive.)
Lowered classLoss(Emitter& e, const Op& op, Value* logp, double smoothing) {
  if (!logp) return std::vector<Value*>{nullptr};  // the emitter holds the error
  Value* labels = op.operand(1);
  const TensorType& labelType = labels->type();
  const Shape& logpShape = logp->type().shape;
  if (logpShape.size() < 2 || labelType.rank() + 1 != static_cast<int64_t>(logpShape.size()))
    return op.emitError("needs input [N, C, d...] and labels [N, d...]; got " + logp->type().str() + " and " +
                        labelType.str());

  Shape labelsWithClassAxis = labelType.shape;
  labelsWithClassAxis.insert(labelsWithClassAxis.begin() + 1, Dim::fixed(1));
  Shape classShape(logpShape.size(), Dim::fixed(1));
  classShape[1] = logpShape[1];
  Value* label = e.reshape(labels, labelsWithClassAxis);
  Value* oneHot = e.binary(OpKind::Eq, label, e.iota(TensorType{labelType.dtype, classShape}, 1));
  Value* zero = e.scalarLike(logp, 0.0);
  Value* loss = e.unary(OpKind::Neg, e.reduce(OpKind::ReduceSum, e.select(oneHot, logp, zero), {1}, false));
  if (smoothing != 0.0) {
    Value* uniform = e.unary(OpKind::Neg, e.reduce(OpKind::ReduceMean, logp, {1}, false));
    Value* picked = e.mul(loss, 1.0 - smoothing);
    loss = e.add(picked, e.mul(uniform, smoothing));
  }
  Value* counted =
      e.binary(OpKind::Ne, labels, e.scalar(labelType.dtype, static_cast<double>(op.getInt("ignore_index"))));
  loss = e.select(counted, loss, zero);
  Value* count = e.reduce(OpKind::ReduceSum, e.cast(counted, logp->type().dtype), {}, false);
  auto reduced = reduceLoss(e, op, loss, count);
  if (!reduced) return reduced.takeError();
  return std::vector{*reduced};
}

/// cross_entropy = classLoss(log_softmax(logits, 1), labels).
Lowered lowerCrossEntropy(Emitter& e, const Op& op) {
  Value* logits = op.operand(0);
  if (logits->type().rank() < 2) return op.emitError("needs logits of rank 2 or more; got " + logits->type().str());
  return classLoss(e, op, logSoftmaxOf(e, logits, 1), op.getFloat("label_smoothing"));
}

/// nll_loss = classLoss(logp, labels) without smoothing.
Lowered lowerNllLoss(Emitter& e, const Op& op) { return classLoss(e, op, op.operand(0), 0.0); }

/// mse_loss = reduce((a - b)^2).
Lowered lowerMseLoss(Emitter& e, const Op& op) {
  Value* diff = e.sub(op.operand(0), op.operand(1));
  auto reduced = reduceLoss(e, op, e.mul(diff, diff), nullptr);
  if (!reduced) return reduced.takeError();
  return std::vector{*reduced};
}

// --- Quantization ---------------------------------------------------------------------

/// A quantization parameter shaped to broadcast against x: a scalar stays,
/// a vector along `axis` becomes [1, ..., n, ..., 1].
Value* alongAxis(Emitter& e, const Op& op, Value* param) {
  const TensorType& x = op.operand(0)->type();
  const TensorType& p = param->type();
  if (p.rank() == 0 || x.rank() == 0) return param;
  if (p.shape[0].isStatic() && p.shape[0].size == 1) return e.reshape(param, {});
  auto axis = normalizeAxis(op.getInt("axis"), x.rank());
  if (!axis) return e.reshape(param, {});  // the shape rule reported it
  Shape shape(static_cast<size_t>(x.rank()), Dim::fixed(1));
  shape[static_cast<size_t>(*axis)] = p.shape[0];
  return e.reshape(param, std::move(shape));
}

/// quantize = cast(clamp(round(x / scale) + zero_point, lo, hi)).
Lowered lowerQuantize(Emitter& e, const Op& op) {
  Value* x = op.operand(0);
  const DType f = x->type().dtype, dtype = op.operand(2)->type().dtype;
  Value* scale = alongAxis(e, op, op.operand(1));
  Value* zero = e.cast(alongAxis(e, op, op.operand(2)), f);
  Value* q = e.add(e.unary(OpKind::Round, e.div(x, scale)), zero);
  const double lo = dtype == DType::U8 ? 0 : -128;
  // Named in order: the numbering must not depend on how the compiler orders
  // a call's arguments (passes/README.md).
  Value* hi = e.scalar(f, lo + 255);
  Value* above = e.binary(OpKind::Max, q, e.scalar(f, lo));
  q = e.binary(OpKind::Min, above, hi);
  return std::vector{e.cast(q, dtype)};
}

/// dequantize = (cast(x) - cast(zero_point)) * scale.
Lowered lowerDequantize(Emitter& e, const Op& op) {
  const DType f = op.operand(1)->type().dtype;
  Value* x = e.cast(op.operand(0), f);
  Value* zero = e.cast(alongAxis(e, op, op.operand(2)), f);
  Value* scale = alongAxis(e, op, op.operand(1));
  return std::vector{e.mul(e.sub(x, zero), scale)};
}

// --- Registration ------------------------------------------------------------------

template <OpKind K>
constexpr Lowering kLoweringOf = nullptr;
template <>
constexpr Lowering kLoweringOf<OpKind::Softmax> = &lowerSoftmax;
template <>
constexpr Lowering kLoweringOf<OpKind::LogSoftmax> = &lowerLogSoftmax;
template <>
constexpr Lowering kLoweringOf<OpKind::LayerNorm> = &lowerLayerNorm;
template <>
constexpr Lowering kLoweringOf<OpKind::BatchNorm> = &lowerBatchNorm;
template <>
constexpr Lowering kLoweringOf<OpKind::Gelu> = &lowerGelu;
template <>
constexpr Lowering kLoweringOf<OpKind::Silu> = &lowerSilu;
template <>
constexpr Lowering kLoweringOf<OpKind::LeakyRelu> = &lowerLeakyRelu;
template <>
constexpr Lowering kLoweringOf<OpKind::Elu> = &lowerElu;
template <>
constexpr Lowering kLoweringOf<OpKind::Softplus> = &lowerSoftplus;
template <>
constexpr Lowering kLoweringOf<OpKind::Rnn> = &lowerRnn;
template <>
constexpr Lowering kLoweringOf<OpKind::Lstm> = &lowerLstm;
template <>
constexpr Lowering kLoweringOf<OpKind::Gru> = &lowerGru;
template <>
constexpr Lowering kLoweringOf<OpKind::Attention> = &lowerAttention;
template <>
constexpr Lowering kLoweringOf<OpKind::CrossEntropy> = &lowerCrossEntropy;
template <>
constexpr Lowering kLoweringOf<OpKind::NllLoss> = &lowerNllLoss;
template <>
constexpr Lowering kLoweringOf<OpKind::MseLoss> = &lowerMseLoss;
template <>
constexpr Lowering kLoweringOf<OpKind::Quantize> = &lowerQuantize;
template <>
constexpr Lowering kLoweringOf<OpKind::Dequantize> = &lowerDequantize;

// Every composite has a lowering and nothing else does.
#define KILN_OP(Enum, Mnemonic, Class, ...)                                                       \
  static_assert((OpClass::Class == OpClass::Composite) == (kLoweringOf<OpKind::Enum> != nullptr), \
                "a composite op needs a lowering in passes/Decompose.cpp (and a primitive none): " Mnemonic);
#include "ir/Ops.def"

/// The lowering of each op kind; null for primitives.
constexpr Lowering kLowerings[] = {
#define KILN_OP(Enum, ...) kLoweringOf<OpKind::Enum>,
#include "ir/Ops.def"
};
static_assert(std::size(kLowerings) == kNumOpKinds);

/// Gives `replacement` the composite result's declared type, which users of
/// that result were checked against; an incompatible type is an error.
Status adoptType(const Op& op, size_t i, Value* replacement, const std::vector<Op*>& created) {
  const TensorType& want = op.result(i)->type();
  const TensorType& got = replacement->type();
  if (got == want) return Status::success();
  bool compatible = got.dtype == want.dtype && got.rank() == want.rank();
  for (size_t d = 0; compatible && d < got.shape.size(); ++d) compatible = dimsCompatible(got.shape[d], want.shape[d]);
  if (!compatible)
    return op.emitError("result " + std::to_string(i) + " is declared " + want.str() + " but decomposes to " +
                        got.str());
  if (std::find(created.begin(), created.end(), replacement->definingOp()) != created.end()) replacement->setType(want);
  return Status::success();
}

/// Expands every composite op of every function, in program order; stops at
/// the first op that cannot be expanded (the error names it), leaving that
/// op untouched.
class DecomposePass : public Pass {
 public:
  std::string_view name() const override { return "decompose"; }
  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (auto& f : m.functions()) {
      auto c = decomposeFunction(*f);
      if (!c) return c.takeError();
      changed |= *c;
    }
    return changed;
  }
};

}  // namespace

Status decomposeOp(Op& op) {
  Lowering lower = kLowerings[static_cast<size_t>(op.kind())];
  if (!lower) return op.emitError("is a primitive op; only composite ops decompose");
  // The composite's own shape rule reports bad operands in its terms, before
  // any primitive's rule would report them in terms of the expansion.
  auto types = inferResultTypes(op);
  if (!types) return types.takeError();

  Emitter e(op);
  Lowered replacements = lower(e, op);
  Status status = replacements ? e.status() : Status(replacements.takeError());
  for (size_t i = 0; status.ok() && i < op.numResults(); ++i)
    status = adoptType(op, i, (*replacements)[i], e.created());
  Function& f = *op.parent();
  if (!status.ok()) {
    // Users come after their operands, so erasing newest first leaves no dangling use.
    for (auto it = e.created().rbegin(); it != e.created().rend(); ++it) f.erase(*it);
    return status;
  }
  for (size_t i = 0; i < op.numResults(); ++i) op.result(i)->replaceAllUsesWith((*replacements)[i]);
  f.erase(&op);
  return Status::success();
}

Expected<bool> decomposeFunction(Function& f) {
  std::vector<Op*> composites;
  for (auto& op : f.ops())
    if (op->info().isComposite()) composites.push_back(op.get());
  // Lowerings emit only primitives, so one sweep expands everything.
  for (Op* op : composites) KILN_TRY(decomposeOp(*op));
  return !composites.empty();
}

std::unique_ptr<Pass> createDecomposePass() { return std::make_unique<DecomposePass>(); }

}  // namespace kiln
