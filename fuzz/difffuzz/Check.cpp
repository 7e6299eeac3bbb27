// The difffuzz oracle (Check.h): the interpreter's results, the error each
// element of them is allowed, and the comparison with a backend's results.
//
// The allowance is carried through the graph element by element. Inputs
// are exact. An elementwise op adds its own allowance (ulps of its result,
// by op family) to what its operands' allowances do to it, measured by
// running the op (on the interpreter) on each operand moved up and down by
// its allowance; layout ops and max/min reductions move the allowances as
// they move the values; sums, GEMMs and convolutions add n·eps times the
// same op on the operands' magnitudes (|x| + allowance), so cancellation is
// allowed for exactly as much as the order of a sum may change it; the
// composite normalizations have bounds of their own (docs/ops.md).
#include "fuzz/difffuzz/Check.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "runtime/Interpreter.h"

namespace kiln::difffuzz {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double unitEps(DType t) {
  switch (t) {
    case DType::F64: return std::ldexp(1.0, -52);
    case DType::F32: return std::ldexp(1.0, -23);
    case DType::F16: return std::ldexp(1.0, -10);
    case DType::BF16: return std::ldexp(1.0, -7);
    default: return 0;
  }
}

/// The distance from |r| to the next larger number of `t`.
double ulpOf(double r, DType t) {
  if (!std::isfinite(r)) return kInf;
  const double a = std::fabs(r);
  if (t == DType::F32) {
    const float f = static_cast<float>(a);
    return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity())) - static_cast<double>(f);
  }
  if (t == DType::F64) return std::nextafter(a, kInf) - a;
  return a * unitEps(t) + std::ldexp(1.0, -24);
}

/// The ulps an elementwise op may be off by (docs/ops.md): 0 for the exact
/// ones, 1 for correctly rounded arithmetic, more for the library functions.
int opUlps(OpKind k) {
  switch (k) {
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Sqrt: return 1;
    case OpKind::Reciprocal:
    case OpKind::Rsqrt:
    case OpKind::Mod: return 2;
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Erf:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::Tan:
    case OpKind::Asin:
    case OpKind::Acos:
    case OpKind::Atan:
    case OpKind::Sinh:
    case OpKind::Cosh:
    case OpKind::Asinh:
    case OpKind::Acosh:
    case OpKind::Atanh:
    case OpKind::HardSwish:
    case OpKind::LeakyRelu: return 4;
    case OpKind::Pow:
    case OpKind::Gelu:
    case OpKind::Silu:
    case OpKind::Elu:
    case OpKind::Softplus: return 8;
    default: return 0;  // neg, abs, relu, floor, max, select, compares, rem...
  }
}

/// Ops whose zero results have a defined sign (IEEE 754 for the arithmetic,
/// odd functions keep it) when their operands' zeros do.
bool keepsZeroSign(OpKind k) {
  switch (k) {
    case OpKind::Neg:
    case OpKind::Abs:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Sqrt:
    case OpKind::Reciprocal:
    case OpKind::Tanh:
    case OpKind::Sin:
    case OpKind::Tan:
    case OpKind::Asin:
    case OpKind::Atan:
    case OpKind::Sinh:
    case OpKind::Asinh:
    case OpKind::Atanh:
    case OpKind::Erf:
    case OpKind::Floor:
    case OpKind::Ceil:
    case OpKind::Round:
    case OpKind::Select:
    case OpKind::Transpose:
    case OpKind::Slice:
    case OpKind::Broadcast:
    case OpKind::Reshape:
    case OpKind::Constant: return true;
    default: return false;
  }
}

bool isElementwiseKind(OpKind k) {
  if (opInfo(k).isElementwise()) return true;
  return k == OpKind::Gelu || k == OpKind::Silu || k == OpKind::LeakyRelu || k == OpKind::Elu || k == OpKind::Softplus;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numElements()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = t.getDouble(static_cast<int64_t>(i));
  return v;
}

/// A tensor like `like` (dtype and shape) holding `v`; with `roundUp`
/// (allowances, magnitudes) enlarged so that it never shrinks in the
/// conversion.
Tensor tensorOf(const Tensor& like, const std::vector<double>& v, bool roundUp = true) {
  Tensor t(like.dtype(), like.shape());
  for (size_t i = 0; i < v.size(); ++i) {
    double x = v[i];
    if (roundUp && std::isfinite(x) && x != 0 && isFloat(like.dtype())) x *= 1 + 4 * unitEps(like.dtype());
    t.setDouble(static_cast<int64_t>(i), x);
  }
  return t;
}

bool anyPositive(const std::vector<double>& e) {
  for (double x : e)
    if (!(x == 0)) return true;
  return false;
}

/// The op `op` on `operands` through the interpreter, as doubles; NaNs
/// where it fails.
std::vector<double> run(const Op& op, const std::vector<Tensor>& operands, size_t n) {
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : operands) ptrs.push_back(&t);
  auto r = interpretOp(op, ptrs);
  if (!r || r->empty()) return std::vector<double>(n, std::nan(""));
  return values((*r)[0]);
}

std::vector<Tensor> magnitudes(const std::vector<Tensor>& xs, const std::vector<std::vector<double>>& es, bool addErrors) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < xs.size(); ++k) {
    std::vector<double> v = values(xs[k]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::fabs(v[i]) + (addErrors ? es[k][i] : 0.0);
    out.push_back(isFloat(xs[k].dtype()) ? tensorOf(xs[k], v) : xs[k]);
  }
  return out;
}

/// The length of the sums an accumulating op makes per result element.
double sumLength(const Op& op, const std::vector<Tensor>& xs, const Tensor& r) {
  switch (op.kind()) {
    case OpKind::MatMul: return static_cast<double>(xs[0].shape().back());
    case OpKind::Conv: {
      double k = 1;
      for (size_t i = 1; i < xs[1].shape().size(); ++i) k *= static_cast<double>(xs[1].shape()[i]);
      return k;
    }
    case OpKind::AvgPool: {
      double k = 1;
      for (int64_t d : op.getInts("kernel")) k *= static_cast<double>(d);
      return k;
    }
    default: return static_cast<double>(xs[0].numElements()) / std::max<double>(1, static_cast<double>(r.numElements()));
  }
}

/// The allowance of `op`'s result `r` from its operands `xs` and theirs.
std::vector<double> allowance(const Op& op, const std::vector<Tensor>& xs, const std::vector<std::vector<double>>& es,
                              const Tensor& r) {
  const size_t n = static_cast<size_t>(r.numElements());
  const std::vector<double> rv = values(r);
  const DType dtype = r.dtype();
  const double eps = unitEps(dtype);
  std::vector<double> e(n, 0.0);
  const OpKind k = op.kind();
  bool inputErrors = false;
  for (const auto& ek : es) inputErrors = inputErrors || anyPositive(ek);

  if (k == OpKind::Constant) return e;
  if (isElementwiseKind(k)) {
    const int u = opUlps(k);
    if (isFloat(dtype)) {
      // Library functions' exp-based forms flush below about 2^-122 (oneDNN's
      // logistic gives 0 for 1.6e-38): a little above the smallest normal.
      const double minNormal = dtype == DType::F32 ? 0x1p-122 : dtype == DType::F64 ? 0x1p-1018 : 0;
      for (size_t i = 0; i < n; ++i) {
        e[i] = u * ulpOf(rv[i], dtype);
        // Library functions (4 ulps and more) may give 0 for a result in the
        // denormal range (1 / (1 + exp(92)) is 0 in f32, as in PyTorch);
        // arithmetic keeps denormals.
        if (u >= 4 && std::fabs(rv[i]) < minNormal) e[i] += std::fabs(rv[i]);
      }
      if (k == OpKind::Gelu) {
        // x * (1 + erf(x / sqrt 2)) / 2 cancels where erf is near -1: its
        // error is some eps of |x| there (PyTorch's formula as well).
        const std::vector<double> xv = values(xs[0]);
        for (size_t i = 0; i < n && xv.size() == n; ++i) e[i] += 4 * unitEps(dtype) * std::fabs(xv[i]);
      }
    }
    for (size_t j = 0; j < xs.size(); ++j) {
      if (!anyPositive(es[j])) continue;
      if (k == OpKind::Mod || k == OpKind::Rem) {
        // x mod y of inexact operands is not compared: its error is x / y
        // times y's, and a difference within the allowance may cross a
        // multiple of y.
        for (size_t i = 0; i < n; ++i)
          if (!std::isnan(rv[i])) e[i] = kInf;
        break;
      }
      std::vector<double> xv = values(xs[j]);
      std::vector<Tensor> up = xs, down = xs;
      std::vector<double> a(xv.size()), b(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        a[i] = xv[i] + es[j][i];
        b[i] = xv[i] - es[j][i];
      }
      up[j] = tensorOf(xs[j], a, false);
      down[j] = tensorOf(xs[j], b, false);
      std::vector<double> ru = run(op, up, n), rd = run(op, down, n);
      for (size_t i = 0; i < n; ++i) {
        if (!isFloat(dtype)) {  // a compare whose answer may flip
          if (ru[i] != rv[i] || rd[i] != rv[i]) e[i] = kInf;
          continue;
        }
        if (std::isnan(rv[i])) {
          // A NaN that an operand within its allowance avoids (sqrt of a
          // denormal that a library function may give as -0) is unstable.
          if (!std::isnan(ru[i]) || !std::isnan(rd[i])) e[i] = kInf;
          continue;
        }
        // A moved operand that makes the result NaN (inf - inf) allows anything.
        const double du = std::fabs(ru[i] - rv[i]), dd = std::fabs(rd[i] - rv[i]);
        e[i] += std::isnan(du) || std::isnan(dd) ? kInf : std::max(du, dd);
      }
    }
    for (size_t i = 0; i < n; ++i)
      if (std::isnan(rv[i]) && e[i] != kInf) e[i] = 0;
    return e;
  }
  switch (k) {
    case OpKind::Transpose:
    case OpKind::Slice:
    case OpKind::Concat:
    case OpKind::Pad:
    case OpKind::Broadcast:
    case OpKind::Reshape:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::MaxPool: {
      if (!inputErrors) return e;
      // The largest allowance in each window; a min reduction finds it as
      // the min of the negated allowances.
      const double sign = k == OpKind::ReduceMin ? -1 : 1;
      std::vector<Tensor> ets;
      for (size_t j = 0; j < xs.size(); ++j) {
        std::vector<double> ej = es[j];
        for (double& x : ej) x *= sign;
        ets.push_back(tensorOf(xs[j], ej));
      }
      std::vector<double> moved = run(op, ets, n);
      for (size_t i = 0; i < n; ++i) e[i] = std::fabs(moved[i]);
      if (k == OpKind::Pad) {  // the pad value is exact
        const double pad = std::fabs(op.getFloat("value"));
        for (size_t i = 0; i < n; ++i)
          if (e[i] == pad) e[i] = 0;
      }
      return e;
    }
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::AvgPool:
    case OpKind::ReduceProd:
    case OpKind::MatMul:
    case OpKind::Conv: {
      const double len = sumLength(op, xs, r);
      std::vector<double> mag = run(op, magnitudes(xs, es, false), n);
      std::vector<double> magErr = inputErrors ? run(op, magnitudes(xs, es, true), n) : mag;
      // Each of the n roundings is also off by up to the denormal spacing
      // (ulpOf(0)) where the partial sums are that small.
      for (size_t i = 0; i < n; ++i)
        e[i] = (magErr[i] - mag[i]) + (len + 2) * eps * mag[i] + (len + 1) * ulpOf(0, dtype) + ulpOf(rv[i], dtype);
      if (k == OpKind::ReduceMean || k == OpKind::AvgPool) {
        // A mean's sum may overflow where the mean does not.
        const double maxValue = dtype == DType::F32 ? 3.4028234663852886e38 : 1.7976931348623157e308;
        for (size_t i = 0; i < n; ++i)
          if (!(mag[i] * len < maxValue)) e[i] = kInf;
      }
      if (k == OpKind::ReduceProd && isFloat(dtype)) {
        // Partial products lie between the products of min(1, |x|) and of
        // max(1, |x|): where those leave the dtype's range, a product
        // accumulated in the dtype may overflow or underflow on the way.
        std::vector<Tensor> big = magnitudes(xs, es, true), small = big;
        for (size_t j = 0; j < xs.size(); ++j) {
          std::vector<double> b = values(big[j]), s = b;
          for (size_t i = 0; i < b.size(); ++i) {
            b[i] = std::max(1.0, b[i]);
            s[i] = std::min(1.0, s[i]);
          }
          big[j] = tensorOf(xs[j], b);
          small[j] = tensorOf(xs[j], s);
        }
        std::vector<double> hi = run(op, big, n), lo = run(op, small, n);
        const double tiny = dtype == DType::F32 ? 1.2e-38 : 2.3e-308;
        for (size_t i = 0; i < n; ++i) {
          if (!std::isfinite(hi[i])) e[i] = kInf;
          if (lo[i] < tiny) e[i] = std::max(e[i], std::fabs(rv[i]) + tiny);
        }
      }
      return e;
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
    case OpKind::LayerNorm: {
      const std::vector<int64_t>& shape = xs[0].shape();
      const int64_t rank = static_cast<int64_t>(shape.size());
      const int64_t axis = *normalizeAxis(op.getInt("axis"), rank);
      const std::vector<double> xv = values(xs[0]);
      double maxX = 0, maxE = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        if (std::isfinite(xv[i])) maxX = std::max(maxX, std::fabs(xv[i]));
        maxE = std::max(maxE, es[0][i]);
      }
      if (k != OpKind::LayerNorm) {
        const double len = static_cast<double>(shape[static_cast<size_t>(axis)]);
        for (size_t i = 0; i < n; ++i) {
          if (k == OpKind::Softmax)
            e[i] = std::fabs(rv[i]) * ((2 * maxX + len + 8) * eps + 2 * maxE) + 8 * ulpOf(rv[i], dtype);
          else
            e[i] = (3 * maxX + len + 8) * eps + 2 * maxE + 8 * ulpOf(rv[i], dtype);
        }
        return e;
      }
      // layer_norm over dims axis..: row by row, the bound of (x - mean) / s
      // with s = sqrt(var + epsilon), var possibly as E[x^2] - E[x]^2.
      int64_t rowLen = 1;
      for (int64_t d = axis; d < rank; ++d) rowLen *= shape[static_cast<size_t>(d)];
      const double epsilon = op.getFloat("epsilon");
      for (size_t row = 0; row * static_cast<size_t>(rowLen) < n; ++row) {
        const size_t base = row * static_cast<size_t>(rowLen);
        double mean = 0, maxAbs = 0, maxSq = 0, rowE = 0;
        for (int64_t j = 0; j < rowLen; ++j) mean += xv[base + static_cast<size_t>(j)];
        mean /= static_cast<double>(rowLen);
        double var = 0;
        for (int64_t j = 0; j < rowLen; ++j) {
          const double x = xv[base + static_cast<size_t>(j)];
          var += (x - mean) * (x - mean);
          maxAbs = std::max(maxAbs, std::fabs(x));
          maxSq = std::max(maxSq, x * x);
          rowE = std::max(rowE, es[0][base + static_cast<size_t>(j)]);
        }
        var /= static_cast<double>(rowLen);
        const double s2 = var + epsilon, s = std::sqrt(s2);
        const double len = static_cast<double>(rowLen) + 8;
        // Squares past the dtype's range overflow a variance computed in it.
        const double maxValue = dtype == DType::F32 ? 3.4028234663852886e38 : 1.7976931348623157e308;
        if (!(maxSq * static_cast<double>(rowLen) < maxValue / 4)) {
          for (int64_t j = 0; j < rowLen; ++j) e[base + static_cast<size_t>(j)] = kInf;
          continue;
        }
        for (int64_t j = 0; j < rowLen; ++j) {
          const size_t i = base + static_cast<size_t>(j);
          // The denormal spacing of x - mean, divided by s, counts too.
          e[i] = (len * eps * maxAbs + len * ulpOf(0, dtype) + 2 * rowE) / s +
                 std::fabs(rv[i]) * len * eps * (1 + maxSq / s2) + 8 * ulpOf(rv[i], dtype);
        }
      }
      return e;
    }
    default:
      for (double& x : e) x = kInf;  // an op without a rule: anything finite passes
      return e;
  }
}

}  // namespace

Expected<Reference> reference(const Case& c) {
  auto built = build(c);
  if (!built) return built.takeError();
  std::unordered_map<const Op*, size_t> nodeOf;
  for (size_t i = 0; i < built->ops.size(); ++i) nodeOf[built->ops[i]] = i;
  Reference ref;
  ref.nodeValues.resize(c.nodes.size());
  auto results = interpret(built->function(), c.inputs, [&](const Op& op, const std::vector<Tensor>& rs) -> Status {
    auto it = nodeOf.find(&op);
    if (it != nodeOf.end() && !rs.empty()) ref.nodeValues[it->second] = rs[0];
    return {};
  });
  if (!results) return results.takeError();
  ref.outputs = std::move(*results);

  // Allowances and zero-sign definedness, value by value.
  const size_t numInputs = c.inputs.size();
  std::vector<std::vector<double>> allowed(static_cast<size_t>(c.numValues()));
  std::vector<bool> signDefined(static_cast<size_t>(c.numValues()), true);
  std::vector<std::vector<bool>> mayBeNaN(static_cast<size_t>(c.numValues()));
  for (size_t i = 0; i < numInputs; ++i) {
    allowed[i].assign(static_cast<size_t>(c.inputs[i].numElements()), 0.0);
    mayBeNaN[i].assign(static_cast<size_t>(c.inputs[i].numElements()), false);
  }
  auto valueOf = [&](int v) -> const Tensor& {
    return static_cast<size_t>(v) < numInputs ? c.inputs[static_cast<size_t>(v)] : ref.nodeValues[static_cast<size_t>(v) - numInputs];
  };
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const Op& op = *built->ops[i];
    std::vector<Tensor> xs;
    std::vector<std::vector<double>> es;
    bool operandsSigned = true;
    for (int v : c.nodes[i].operands) {
      xs.push_back(valueOf(v));
      es.push_back(allowed[static_cast<size_t>(v)]);
      operandsSigned = operandsSigned && signDefined[static_cast<size_t>(v)];
    }
    const Tensor& r = ref.nodeValues[i];
    std::vector<double> e = allowance(op, xs, es, r);
    std::vector<bool> nanOk(e.size(), false);
    // Elements that may be NaN spread as NaN does: the op on its operands
    // with those elements made NaN says where.
    std::vector<Tensor> poisoned = xs;
    bool anyPoison = false;
    for (size_t k = 0; k < xs.size(); ++k) {
      const std::vector<bool>& m = mayBeNaN[static_cast<size_t>(c.nodes[i].operands[k])];
      if (!isFloat(xs[k].dtype())) continue;
      for (size_t j = 0; j < m.size(); ++j)
        if (m[j]) {
          poisoned[k].setDouble(static_cast<int64_t>(j), std::nan(""));
          anyPoison = true;
        }
    }
    std::vector<double> spread = anyPoison ? run(op, poisoned, e.size()) : std::vector<double>();
    // A NaN result is exact unless it comes from an unstable NaN (one with
    // an infinite allowance): the op with those made 0 says where.
    std::vector<Tensor> cleared = xs;
    bool anyUnstable = false;
    for (size_t k = 0; k < xs.size(); ++k) {
      const std::vector<double>& ek = es[k];
      if (!isFloat(xs[k].dtype())) continue;
      for (size_t j = 0; j < ek.size(); ++j)
        if (ek[j] == kInf && std::isnan(xs[k].getDouble(static_cast<int64_t>(j)))) {
          cleared[k].setDouble(static_cast<int64_t>(j), 0.0);
          anyUnstable = true;
        }
    }
    std::vector<double> settled = anyUnstable ? run(op, cleared, e.size()) : std::vector<double>();
    for (size_t j = 0; j < e.size(); ++j) {
      const double rv = r.getDouble(static_cast<int64_t>(j));
      if (std::isnan(rv)) {
        const bool unstable = e[j] == kInf || (anyUnstable && !std::isnan(settled[j]));
        e[j] = unstable ? kInf : 0;  // NaN is exact where it is stable
        continue;
      }
      if (std::isnan(e[j])) e[j] = kInf;
      // What reads an element that may be anything may be anything (the
      // moved operands' ends miss the poles of reciprocal, say).
      if (anyPoison && std::isnan(spread[j])) e[j] = kInf;
      nanOk[j] = (e[j] == kInf && isFloat(r.dtype())) || (anyPoison && std::isnan(spread[j]));
      if (anyPoison && !isFloat(r.dtype()) && spread[j] != rv) e[j] = kInf;  // a compare of a maybe-NaN
    }
    mayBeNaN[numInputs + i] = std::move(nanOk);
    if (std::getenv("KILN_DIFFFUZZ_TRACE")) {
      double mx = 0;
      for (double x : e) mx = std::max(mx, x);
      std::fprintf(stderr, "node %zu %s: max allowance %g, first %g\n", i, std::string(op.name()).c_str(), mx,
                   e.empty() ? 0.0 : e[e.size() > 33 ? 33 : 0]);
    }
    allowed[numInputs + i] = std::move(e);
    signDefined[numInputs + i] = operandsSigned && keepsZeroSign(op.kind());
  }
  for (int v : c.outputs) {
    ref.allowed.push_back(allowed[static_cast<size_t>(v)]);
    ref.mayBeNaN.push_back(mayBeNaN[static_cast<size_t>(v)]);
    ref.zeroSignDefined.push_back(signDefined[static_cast<size_t>(v)]);
  }
  return ref;
}

namespace {

std::string indexStr(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? "," : "") + std::to_string(idx[d]);
  return s + "]";
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

}  // namespace

Verdict compare(const Reference& ref, const std::vector<Tensor>& got) {
  if (got.size() != ref.outputs.size())
    return {Outcome::Diverge, std::to_string(got.size()) + " results, the interpreter gives " + std::to_string(ref.outputs.size())};
  for (size_t o = 0; o < got.size(); ++o) {
    const Tensor& want = ref.outputs[o];
    const Tensor& have = got[o];
    const std::string where = "result " + std::to_string(o) + " ";
    if (have.dtype() != want.dtype() || have.shape() != want.shape())
      return {Outcome::Diverge, where + "is " + have.type().str() + ", the interpreter's " + want.type().str()};
    const bool floating = isFloat(want.dtype());
    for (int64_t i = 0; i < want.numElements(); ++i) {
      const double r = want.getDouble(i), a = have.getDouble(i);
      const double tol = ref.allowed[o][static_cast<size_t>(i)];
      auto fail = [&](const std::string& what) {
        return Verdict{Outcome::Diverge, where + "element " + indexStr(want.shape(), i) + ": " + what + ": got " + num(a) +
                                             ", the interpreter " + num(r) + " (allowed error " + num(tol) + ")"};
      };
      if (!floating) {
        if (r != a && tol != kInf) return fail("integer result differs");
        continue;
      }
      if (std::isnan(r) && !std::isnan(a) && tol == kInf) continue;  // an unstable NaN
      if (std::isnan(r) != std::isnan(a)) {
        // Where an intermediate may overflow (products past the range that
        // the interpreter's double sums keep), inf - inf may make a NaN.
        if (std::isnan(a) && ref.mayBeNaN[o][static_cast<size_t>(i)]) continue;
        return fail(std::isnan(r) ? "NaN expected" : "NaN where the interpreter has a number");
      }
      if (std::isnan(r)) continue;
      if (std::isinf(r) || std::isinf(a)) {
        if (r == a || tol == kInf) continue;
        return fail("infinity differs");
      }
      if (!(std::fabs(a - r) <= tol)) return fail("value differs by " + num(std::fabs(a - r)));
      if (r == 0 && a == 0 && ref.zeroSignDefined[o] && std::signbit(r) != std::signbit(a))
        return fail("sign of zero differs");
    }
  }
  return {};
}

Verdict check(const Case& c, const Reference& ref, Backend& backend) {
  const auto start = std::chrono::steady_clock::now();
  auto addTime = [&] {
    backend.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++backend.cases;
  };
  auto built = build(c);
  if (!built) return {Outcome::Skipped, built.error().message()};
  auto model = backend.session->compile(built->function());
  if (!model) {
    addTime();
    return {Outcome::Diverge, "compile failed: " + model.error().str()};
  }
  Status prepared = (*model)->prepare(c.inputs);
  if (!prepared) {
    addTime();
    // Ops a backend does not lower are a gap, not a wrong answer.
    const bool unsupported = ((*model)->executor() && !(*model)->executor()->unsupportedOps().empty()) ||
                             !(*model)->unsupportedOps().empty();
    if (unsupported) return {Outcome::Skipped, prepared.error().message()};
    return {Outcome::Diverge, "compile failed: " + prepared.error().str()};
  }
  auto got = (*model)->run(c.inputs);
  addTime();
  if (!got) return {Outcome::Diverge, "run failed where the interpreter runs: " + got.error().str()};
  return compare(ref, *got);
}

}  // namespace kiln::difffuzz
