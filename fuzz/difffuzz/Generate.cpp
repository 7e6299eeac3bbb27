// The difffuzz graph generator (Generate.h). Each pattern builds a case
// node by node through the shape rules, so a node's result type is known
// when the next one is chosen; a candidate whose rule refuses it is
// abandoned and another drawn.
#include "fuzz/difffuzz/Generate.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

#include "ir/ShapeRules.h"

namespace kiln::difffuzz {

namespace {

/// A candidate that cannot be built (a shape rule refused it).
struct Refused {};

class Gen {
 public:
  explicit Gen(std::mt19937_64& rng) : rng_(rng) {}

  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(uniform(0, static_cast<int>(v.size()) - 1))]; }

  const TensorType& type(int v) const { return types_[static_cast<size_t>(v)]; }
  std::vector<int64_t> dims(int v) const { return staticDims(type(v).shape); }

  /// A new input of `type`, filled with values of a random style.
  int input(TensorType t, double specialScale = 1.0) {
    Tensor x(t.dtype, staticDims(t.shape));
    fill(x, specialScale);
    // Inputs are numbered before nodes: renumber the nodes' values.
    const int v = static_cast<int>(c_.inputs.size());
    for (Node& n : c_.nodes)
      for (int& o : n.operands)
        if (o >= v) ++o;
    for (int& o : c_.outputs)
      if (o >= v) ++o;
    for (int& o : live_)
      if (o >= v) ++o;
    c_.inputs.push_back(std::move(x));
    types_.insert(types_.begin() + v, t);
    return v;
  }

  /// The node `kind(operands)`, its type from the shape rule.
  int op(OpKind kind, std::vector<int> operands, AttrMap attrs = {}, std::vector<TensorType> declared = {}) {
    std::vector<TensorType> operandTypes;
    for (int v : operands) operandTypes.push_back(type(v));
    ShapeQuery q{kind, operandTypes, &attrs, declared, {}};
    auto result = inferResultTypes(q);
    if (!result || result->size() != 1 || !(*result)[0].isStatic()) throw Refused{};
    if (numElements((*result)[0].shape) > kMaxElements) throw Refused{};
    c_.nodes.push_back(Node{kind, std::move(operands), std::move(attrs), std::move(declared)});
    types_.push_back((*result)[0]);
    return static_cast<int>(types_.size()) - 1;
  }

  int scalar(DType dtype, double value) {
    DenseTensor t = DenseTensor::zeros(TensorType{dtype, {}});
    t.setDouble(0, value);
    c_.nodes.push_back(Node{OpKind::Constant, {}, {{"value", Attribute(std::move(t))}}, {}});
    types_.push_back(TensorType{dtype, {}});
    return static_cast<int>(types_.size()) - 1;
  }

  /// Values rebuilt after input() renumbering: the value numbers a pattern
  /// holds across input() calls go through here.
  int& hold(int v) {
    live_.push_back(v);
    return live_.back();
  }

  Case finish(std::vector<int> outputs, std::string pattern) {
    c_.outputs = std::move(outputs);
    c_.pattern = std::move(pattern);
    return std::move(c_);
  }

  static constexpr int64_t kMaxElements = 4096;

  /// A random static shape of rank `rank` with at most `maxElements`.
  std::vector<int64_t> shape(int rank, int64_t maxElements = 1024) {
    static const std::vector<int64_t> sizes = {1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 31, 32, 33, 64};
    for (;;) {
      std::vector<int64_t> s;
      for (int i = 0; i < rank; ++i) s.push_back(pick(sizes));
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      if (n <= maxElements) return s;
    }
  }

  /// A shape that broadcasts to `s`: some dims 1, maybe fewer leading dims.
  std::vector<int64_t> broadcastable(const std::vector<int64_t>& s) {
    std::vector<int64_t> out = s;
    if (chance(0.35)) return out;
    for (int64_t& d : out)
      if (chance(0.4)) d = 1;
    if (!out.empty() && chance(0.3)) out.erase(out.begin(), out.begin() + uniform(1, static_cast<int>(out.size())));
    return out;
  }

 private:
  void fill(Tensor& x, double specialScale) {
    const int64_t n = x.numElements();
    if (isInteger(x.dtype())) {
      for (int64_t i = 0; i < n; ++i) x.setInt(i, uniform(-20, 20));
      return;
    }
    if (x.dtype() == DType::Bool) {
      for (int64_t i = 0; i < n; ++i) x.setInt(i, uniform(0, 1));
      return;
    }
    static const std::vector<double> scales = {1, 1, 1, 1, 1e-3, 1e3, 1e-39, 1e30};
    static const std::vector<double> specialRates = {0, 0, 0.01, 0.03, 0.1, 0.3};
    const double scale = pick(scales);
    const double rate = pick(specialRates) * specialScale;
    const bool ties = chance(0.15);  // halves, for floor/ceil/round
    const double inf = std::numeric_limits<double>::infinity();
    const std::vector<double> specials = {std::nan(""), -std::nan(""), inf, -inf, 0.0, -0.0, 1e-40, -1e-40, 1.4e-45,
                                          -3e-39, 3.4e38, -3.4e38, 1e30, -1e30, 1e-30, 88.8, -104.0, 0.5, -0.5, 1.0};
    std::normal_distribution<double> normal(0, 1);
    for (int64_t i = 0; i < n; ++i) {
      double v = normal(rng_) * scale;
      if (ties) v = std::round(v * 4) / 2;
      if (chance(rate)) v = pick(specials);
      x.setDouble(i, v);
    }
  }

  std::mt19937_64& rng_;
  Case c_;
  std::vector<TensorType> types_;
  std::deque<int> live_;  // held values: references stay valid as it grows
};

const std::vector<OpKind> kFloatUnary = {
    OpKind::Neg,   OpKind::Abs,  OpKind::Sign,  OpKind::Exp,   OpKind::Log,   OpKind::Sqrt,    OpKind::Rsqrt,
    OpKind::Reciprocal, OpKind::Tanh, OpKind::Sigmoid, OpKind::Relu, OpKind::Erf, OpKind::Sin, OpKind::Cos,
    OpKind::Tan,   OpKind::Asin, OpKind::Acos,  OpKind::Atan,  OpKind::Sinh,  OpKind::Cosh,    OpKind::Asinh,
    OpKind::Acosh, OpKind::Atanh, OpKind::HardSwish, OpKind::Floor, OpKind::Ceil, OpKind::Round, OpKind::IsNan, OpKind::IsInf,
    OpKind::Gelu,  OpKind::Silu, OpKind::LeakyRelu, OpKind::Elu, OpKind::Softplus};
const std::vector<OpKind> kFloatBinary = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow,
                                          OpKind::Max, OpKind::Min, OpKind::Mod, OpKind::Rem};
const std::vector<OpKind> kIntUnary = {OpKind::Neg, OpKind::Abs, OpKind::Sign, OpKind::Relu};
const std::vector<OpKind> kIntBinary = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Max, OpKind::Min};
const std::vector<OpKind> kCompare = {OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge, OpKind::Eq, OpKind::Ne};

AttrMap unaryAttrs(Gen& g, OpKind k) {
  if (k == OpKind::Gelu) return {{"approximate", Attribute(g.chance(0.5) ? "none" : "tanh")}};
  if (k == OpKind::LeakyRelu) return {{"alpha", Attribute(g.chance(0.5) ? 0.01 : 0.2)}};
  if (k == OpKind::Elu) return {{"alpha", Attribute(g.chance(0.5) ? 1.0 : 0.5)}};
  return {};
}

/// A unary op on `x`; isnan and isinf (bool results) become the condition
/// of a select that zeroes those elements, so the chain stays float.
int unary(Gen& g, int x, const std::vector<OpKind>& ops) {
  // relu, whose NaN handling backends get wrong most (max(0, x) is not
  // relu), is drawn more often than the table's other ops.
  OpKind k = g.chance(0.15) ? OpKind::Relu : g.pick(ops);
  if (k == OpKind::IsNan || k == OpKind::IsInf) {
    int cond = g.op(k, {x});
    int zero = g.scalar(g.type(x).dtype, 0.0);
    return g.op(OpKind::Select, {cond, zero, x});
  }
  return g.op(k, {x}, unaryAttrs(g, k));
}

/// An elementwise step on `x`: a unary op, a binary op with a new input
/// (broadcast either way) or a scalar constant, or a select.
int elementwiseStep(Gen& g, int& x, bool floating) {
  const DType dtype = g.type(x).dtype;
  const int r = g.uniform(0, 9);
  if (r < 4) return unary(g, x, floating ? kFloatUnary : kIntUnary);
  if (r < 8) {
    OpKind k = g.pick(floating ? kFloatBinary : kIntBinary);
    int other;
    if (g.chance(0.2)) {
      other = g.scalar(dtype, floating ? g.pick(std::vector<double>{0.0, -0.0, 1.0, 2.0, -1.5, 6.0, 1e-3}) : g.uniform(-3, 3));
    } else {
      int& held = g.hold(x);
      other = g.input(TensorType{dtype, staticShape(g.broadcastable(g.dims(held)))});
      x = held;
    }
    return g.chance(0.5) ? g.op(k, {x, other}) : g.op(k, {other, x});
  }
  // select(compare(a, b), x, y) with a, b new inputs broadcast into x.
  int& held = g.hold(x);
  int a = g.input(TensorType{dtype, staticShape(g.broadcastable(g.dims(held)))});
  int b = g.input(TensorType{dtype, staticShape(g.broadcastable(g.dims(held)))});
  int y = g.input(TensorType{dtype, staticShape(g.broadcastable(g.dims(held)))});
  x = held;
  int cond = g.op(g.pick(kCompare), {a, b});
  return g.chance(0.5) ? g.op(OpKind::Select, {cond, x, y}) : g.op(OpKind::Select, {cond, y, x});
}

/// The ops a library call may take as post-ops, each on `x` (an
/// accumulated value; only ops that do not amplify its error).
int epilogueStep(Gen& g, int x, int biasDim) {
  const DType dtype = g.type(x).dtype;
  switch (g.uniform(-2, 11)) {
    case -2:
    case -1:
    case 0: return g.op(OpKind::Relu, {x});
    case 1: return g.op(OpKind::Tanh, {x});
    case 2: return g.op(OpKind::Sigmoid, {x});
    case 3: {  // clip(x, lo, hi) as ONNX imports it
      int lo = g.scalar(dtype, g.chance(0.5) ? 0.0 : -1.0);
      int hi = g.scalar(dtype, g.chance(0.5) ? 6.0 : 1.0);
      int m = g.op(OpKind::Max, {x, lo});
      return g.op(OpKind::Min, {m, hi});
    }
    case 4: return g.op(OpKind::Max, {x, g.scalar(dtype, 0.0)});
    case 5: return g.op(OpKind::Min, {g.scalar(dtype, g.chance(0.5) ? 0.0 : 0.5), x});
    case 6: return g.op(OpKind::Gelu, {x}, unaryAttrs(g, OpKind::Gelu));
    case 7: return g.op(OpKind::Silu, {x});
    case 8: return g.op(g.chance(0.5) ? OpKind::Abs : OpKind::Neg, {x});
    case 9: return g.op(g.chance(0.5) ? OpKind::Add : OpKind::Mul, {x, g.scalar(dtype, g.chance(0.5) ? 0.5 : -2.0)});
    case 10: return g.op(OpKind::LeakyRelu, {x}, unaryAttrs(g, OpKind::LeakyRelu));
    default: {  // a bias along `biasDim` (a channel or a column), broadcast
      std::vector<int64_t> d = g.dims(x);
      if (d.size() <= static_cast<size_t>(biasDim))  // a scalar (a full reduction): a scalar bias
        return g.op(OpKind::Add, {x, g.scalar(dtype, 0.25)});
      std::vector<int64_t> b(d.size() - static_cast<size_t>(biasDim), 1);
      b[0] = d[static_cast<size_t>(biasDim)];
      int& held = g.hold(x);
      int bias = g.input(TensorType{dtype, staticShape(b)});
      return g.op(OpKind::Add, {held, bias});
    }
  }
}

Case elementwise(Gen& g) {
  const bool floating = !g.chance(0.15);
  const DType dtype = floating ? (g.chance(0.1) ? DType::F64 : DType::F32) : DType::I32;
  std::vector<int64_t> s = g.shape(g.uniform(0, 4));
  int x = g.input(TensorType{dtype, staticShape(g.broadcastable(s))});
  int& held = g.hold(x);
  int y = g.input(TensorType{dtype, staticShape(g.broadcastable(s))});
  x = g.op(g.pick(floating ? kFloatBinary : kIntBinary), {held, y});
  const int steps = g.uniform(1, 5);
  for (int i = 0; i < steps; ++i) {
    int& h = g.hold(x);
    x = elementwiseStep(g, h, floating);
  }
  return g.finish({x}, floating ? "elementwise" : "elementwise-int");
}

Case reduction(Gen& g) {
  const bool floating = !g.chance(0.15);
  const DType dtype = floating ? (g.chance(0.1) ? DType::F64 : DType::F32) : DType::I32;
  const int rank = g.uniform(1, 4);
  std::vector<int64_t> s = g.shape(rank, 2048);
  int x = g.input(TensorType{dtype, staticShape(s)});
  const int producers = g.uniform(0, 2);
  for (int i = 0; i < producers; ++i) {
    int& h = g.hold(x);
    x = elementwiseStep(g, h, floating);
  }
  std::vector<int64_t> axes;
  const int r = g.type(x).rank();
  for (int a = 0; a < r; ++a)
    if (g.chance(0.5)) axes.push_back(g.chance(0.2) ? a - r : a);
  if (axes.empty()) axes.push_back(g.uniform(0, r - 1));
  const std::vector<OpKind> kinds = floating ? std::vector<OpKind>{OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax,
                                                                   OpKind::ReduceMin, OpKind::ReduceProd}
                                             : std::vector<OpKind>{OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin};
  const OpKind kind = g.pick(kinds);
  const bool keep = g.chance(0.5);
  int& held = g.hold(x);
  int red = g.op(kind, {held}, {{"axes", Attribute(axes)}, {"keepdims", Attribute(keep)}});
  std::string pattern = std::string(opName(kind));
  if (keep && g.chance(0.5) && kind != OpKind::ReduceProd) {
    // x - reduce(x): the softmax-like consumer reads the producer again.
    red = g.op(OpKind::Sub, {held, red});
    pattern += "-consumer";
  } else if (floating && g.chance(0.4) && kind != OpKind::ReduceProd) {
    red = epilogueStep(g, red, 0);
    pattern += "-epilogue";
  }
  return g.finish({red}, pattern);
}

Case matmulEpilogue(Gen& g) {
  const DType dtype = DType::F32;
  const std::vector<int64_t> ks = {1, 3, 5, 17, 64, 65, 70, 128};
  const int64_t k = g.pick(ks), m = g.pick(std::vector<int64_t>{1, 2, 3, 5, 8, 16}), n = g.pick(std::vector<int64_t>{1, 3, 4, 7, 16, 32});
  std::vector<int64_t> a = {m, k}, b = {k, n};
  if (g.chance(0.25)) a.insert(a.begin(), g.uniform(1, 3));
  const double special = k >= 64 ? 0.1 : 0.5;  // a NaN in each of k terms would leave few finite results
  int x = g.input(TensorType{dtype, staticShape(a)}, special);
  int& hx = g.hold(x);
  int w = g.input(TensorType{dtype, staticShape(b)}, special);
  int y = g.op(OpKind::MatMul, {hx, w});
  const int steps = g.uniform(1, 3);
  for (int i = 0; i < steps; ++i) y = epilogueStep(g, y, g.type(y).rank() - 1);
  return g.finish({y}, "matmul-epilogue");
}

Case convEpilogue(Gen& g) {
  const DType dtype = DType::F32;
  const int64_t groups = g.chance(0.2) ? 2 : 1;
  const int64_t c = groups * g.uniform(1, 3), mOut = groups * g.uniform(1, 3);
  const int64_t h = g.uniform(3, 9), wd = g.uniform(3, 9), kh = g.uniform(1, 3), kw = g.uniform(1, 3);
  int x = g.input(TensorType{dtype, staticShape({g.uniform(1, 2), c, h, wd})});
  int& hx = g.hold(x);
  int w = g.input(TensorType{dtype, staticShape({mOut, c / groups, kh, kw})});
  int& hw = g.hold(w);
  AttrMap attrs;
  if (g.chance(0.4)) attrs["strides"] = Attribute(std::vector<int64_t>{g.uniform(1, 2), g.uniform(1, 2)});
  if (g.chance(0.4)) attrs["pads"] = Attribute(std::vector<int64_t>{g.uniform(0, 1), g.uniform(0, 1), g.uniform(0, 1), g.uniform(0, 1)});
  if (g.chance(0.2)) attrs["dilations"] = Attribute(std::vector<int64_t>{g.uniform(1, 2), g.uniform(1, 2)});
  if (groups > 1) attrs["groups"] = Attribute(groups);
  std::vector<int> operands = {hx, hw};
  if (g.chance(0.4)) {
    int bias = g.input(TensorType{dtype, staticShape({mOut})});
    operands = {hx, hw, bias};
  }
  int y = g.op(OpKind::Conv, operands, attrs);
  const int steps = g.uniform(1, 3);
  for (int i = 0; i < steps; ++i) y = epilogueStep(g, y, 1);
  return g.finish({y}, "conv-epilogue");
}

Case pool(Gen& g) {
  const DType dtype = DType::F32;
  const int64_t h = g.uniform(2, 9), w = g.uniform(2, 9);
  int x = g.input(TensorType{dtype, staticShape({g.uniform(1, 2), g.uniform(1, 4), h, w})});
  const bool isMax = g.chance(0.5);
  AttrMap attrs = {{"kernel", Attribute(std::vector<int64_t>{g.uniform(1, std::min<int>(3, static_cast<int>(h))),
                                                               g.uniform(1, std::min<int>(3, static_cast<int>(w)))})}};
  if (g.chance(0.5)) attrs["strides"] = Attribute(std::vector<int64_t>{g.uniform(1, 2), g.uniform(1, 2)});
  if (g.chance(0.3)) attrs["pads"] = Attribute(std::vector<int64_t>{0, 1, 1, 0});
  if (g.chance(0.2)) attrs["ceil_mode"] = Attribute(true);
  if (!isMax && g.chance(0.3)) attrs["count_include_pad"] = Attribute(true);
  int y = g.op(isMax ? OpKind::MaxPool : OpKind::AvgPool, {x}, attrs);
  if (g.chance(0.6)) y = epilogueStep(g, y, 1);
  return g.finish({y}, isMax ? "max_pool" : "avg_pool");
}

Case normalization(Gen& g) {
  const DType dtype = DType::F32;
  std::vector<int64_t> s = g.shape(g.uniform(1, 3), 2048);
  int x = g.input(TensorType{dtype, staticShape(s)});
  const int r = static_cast<int>(s.size());
  const int64_t axis = g.chance(0.5) ? -1 : g.uniform(0, r - 1);
  const int which = g.uniform(0, 2);
  int y;
  if (which == 0) {
    y = g.op(OpKind::Softmax, {x}, {{"axis", Attribute(axis)}});
  } else if (which == 1) {
    y = g.op(OpKind::LogSoftmax, {x}, {{"axis", Attribute(axis)}});
  } else {
    y = g.op(OpKind::LayerNorm, {x}, {{"axis", Attribute(int64_t{-1})}});
  }
  return g.finish({y}, which == 0 ? "softmax" : which == 1 ? "log_softmax" : "layer_norm");
}

Case layout(Gen& g) {
  const DType dtype = DType::F32;
  const int rank = g.uniform(1, 4);
  std::vector<int64_t> s = g.shape(rank);
  int x = g.input(TensorType{dtype, staticShape(s)});
  const int steps = g.uniform(1, 4);
  for (int i = 0; i < steps; ++i) {
    std::vector<int64_t> d = g.dims(x);
    const int r = static_cast<int>(d.size());
    switch (g.uniform(0, 5)) {
      case 0: {
        std::vector<int64_t> perm(d.size());
        for (size_t j = 0; j < perm.size(); ++j) perm[j] = static_cast<int64_t>(j);
        std::shuffle(perm.begin(), perm.end(), std::mt19937_64(static_cast<uint64_t>(g.uniform(0, 1 << 30))));
        x = g.op(OpKind::Transpose, {x}, {{"perm", Attribute(perm)}});
        break;
      }
      case 1: {
        std::vector<int64_t> starts, ends, stepsAttr;
        for (int64_t n : d) {
          const int64_t st = g.uniform(0, static_cast<int>(n) - 1);
          starts.push_back(st);
          ends.push_back(g.uniform(static_cast<int>(st) + 1, static_cast<int>(n)));
          stepsAttr.push_back(g.chance(0.2) ? 2 : 1);
        }
        x = g.op(OpKind::Slice, {x}, {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(stepsAttr)}});
        break;
      }
      case 2: {  // concat with a new input along a random axis
        const int64_t axis = g.uniform(0, r - 1);
        std::vector<int64_t> o = d;
        o[static_cast<size_t>(axis)] = g.uniform(1, 3);
        int& held = g.hold(x);
        int other = g.input(TensorType{dtype, staticShape(o)});
        x = g.op(OpKind::Concat, {held, other}, {{"axis", Attribute(axis)}});
        break;
      }
      case 3: {
        std::vector<int64_t> pads(2 * d.size());
        for (int64_t& p : pads) p = g.uniform(0, 1);
        x = g.op(OpKind::Pad, {x}, {{"pads", Attribute(pads)}, {"value", Attribute(g.chance(0.5) ? 0.0 : -1.5)}});
        break;
      }
      case 4: {  // an explicit broadcast of a value with size-1 dims
        std::vector<int64_t> target = d;
        for (size_t j = 0; j < target.size(); ++j)
          if (target[j] == 1) target[j] = g.uniform(1, 5);
        if (g.chance(0.5)) target.insert(target.begin(), g.uniform(1, 3));
        x = g.op(OpKind::Broadcast, {x}, {}, {TensorType{dtype, staticShape(target)}});
        break;
      }
      default: {
        int& h = g.hold(x);
        x = elementwiseStep(g, h, true);
        break;
      }
    }
    int& h = g.hold(x);
    x = elementwiseStep(g, h, true);
  }
  return g.finish({x}, "layout");
}

}  // namespace

Case generate(std::mt19937_64& rng) {
  for (;;) {
    Gen g(rng);
    try {
      Case c;
      switch (g.uniform(0, 9)) {
        case 0:
        case 1: c = elementwise(g); break;
        case 2:
        case 3: c = reduction(g); break;
        case 4:
        case 5: c = matmulEpilogue(g); break;
        case 6: c = convEpilogue(g); break;
        case 7: c = pool(g); break;
        case 8: c = normalization(g); break;
        default: c = layout(g); break;
      }
      if (build(c)) return c;
    } catch (const Refused&) {
    }
  }
}

}  // namespace kiln::difffuzz
