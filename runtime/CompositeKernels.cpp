// Reference kernels for the composite ops (softmax, normalisations,
// activations, attention and losses). The decompose pass rewrites these
// into primitives; these direct implementations are what its output is
// checked against, so they follow the formulas of docs/ops.md literally,
// in double, without reusing the primitive kernels.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "runtime/Kernels.h"

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Status checkFloats(const KernelCall& c, size_t count) {
  for (size_t k = 0; k < count && k < c.numOperands(); ++k)
    if (!isFloat(c.in(k).dtype())) return dtypeError(c.op, c.in(k).dtype(), "float operands");
  return {};
}

/// softmax or log_softmax of `x` along `axis`, computed stably.
Status softmax(const KernelCall& c, bool logarithm) {
  KILN_TRY(checkFloats(c, 1));
  const Tensor& x = c.in(0);
  // A scalar is a softmax over one element.
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), std::max<int64_t>(x.rank(), 1));
  if (!axis) return axis.takeError();
  const int64_t dim = x.rank() ? x.shape()[*axis] : 1;
  const int64_t outer = product(x.shape(), 0, *axis);
  const int64_t inner = product(x.shape(), *axis + 1, x.shape().size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return (o * dim + k) * inner + i; };
      double max = -kInf;
      for (int64_t k = 0; k < dim; ++k) max = std::max(max, x.getDouble(at(k)));
      double sum = 0;
      for (int64_t k = 0; k < dim; ++k) sum += std::exp(x.getDouble(at(k)) - max);
      for (int64_t k = 0; k < dim; ++k) {
        const double shifted = x.getDouble(at(k)) - max;
        c.out().setDouble(at(k), logarithm ? shifted - std::log(sum) : std::exp(shifted) / sum);
      }
    }
  return {};
}

/// For each element of a shape `inner`, the offset of the matching element
/// of an operand of shape `operand` broadcast to it.
std::vector<int64_t> broadcastOffsets(const std::vector<int64_t>& operand, const std::vector<int64_t>& inner) {
  std::vector<int64_t> offsets(static_cast<size_t>(product(inner)));
  walk(inner, {broadcastStrides(operand, inner)}, {0},
       [&](int64_t i, const std::vector<int64_t>& off) { offsets[i] = off[0]; });
  return offsets;
}

/// True when `operand` broadcasts to `target` NumPy-style.
bool broadcastsTo(const std::vector<int64_t>& operand, const std::vector<int64_t>& target) {
  if (operand.size() > target.size()) return false;
  const size_t lead = target.size() - operand.size();
  for (size_t d = 0; d < operand.size(); ++d)
    if (operand[d] != 1 && operand[d] != target[lead + d]) return false;
  return true;
}

Status reduceLosses(const KernelCall& c, const std::vector<double>& losses, int64_t count) {
  const std::string& reduction = c.op.getString("reduction");
  if (reduction == "none") {
    if (c.out().numElements() != static_cast<int64_t>(losses.size()))
      return c.op.emitError("result " + c.out().type().str() + " does not hold one loss per element");
    for (size_t i = 0; i < losses.size(); ++i) c.out().setDouble(static_cast<int64_t>(i), losses[i]);
    return {};
  }
  if (reduction != "mean" && reduction != "sum")
    return c.op.emitError("unknown reduction '" + reduction + "' (expected mean, sum or none)");
  if (c.out().numElements() != 1) return c.op.emitError("result " + c.out().type().str() + " must be a scalar");
  double sum = 0;
  for (double l : losses) sum += l;
  // The mean over no (non-ignored) elements is 0/0 = NaN, as in PyTorch.
  c.out().setDouble(0, reduction == "sum" ? sum : sum / static_cast<double>(count));
  return {};
}

/// cross_entropy (`fromLogits`) or nll_loss of scores[N, C, d...] against
/// labels[N, d...]; a rank-1 score tensor is one unbatched sample.
Status classificationLoss(const KernelCall& c, bool fromLogits) {
  KILN_TRY(checkFloats(c, 1));
  const Tensor& scores = c.in(0);
  const Tensor& labels = c.in(1);
  if (!isInteger(labels.dtype())) return dtypeError(c.op, labels.dtype(), "integer labels");
  if (scores.rank() == 0) return c.op.emitError("scores must have a class dim, got " + scores.type().str());
  const int64_t classAxis = scores.rank() >= 2 ? 1 : 0;
  const int64_t classes = scores.shape()[classAxis];
  const int64_t batch = classAxis ? scores.shape()[0] : 1;
  const int64_t inner = product(scores.shape(), classAxis + 1, scores.shape().size());
  if (labels.numElements() != batch * inner)
    return c.op.emitError("labels " + labels.type().str() + " do not match scores " + scores.type().str());
  const int64_t ignoreIndex = c.op.getInt("ignore_index");
  const double smoothing = fromLogits ? c.op.getFloat("label_smoothing") : 0.0;

  std::vector<double> losses(static_cast<size_t>(batch * inner), 0.0);
  std::vector<double> logp(static_cast<size_t>(classes));
  int64_t count = 0;
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t e = n * inner + i;
      const int64_t label = labels.getInt(e);
      if (label == ignoreIndex) continue;
      if (label < 0 || label >= classes)
        return c.op.emitError("label " + std::to_string(label) + " at element " + std::to_string(e) +
                              " is outside [0, " + std::to_string(classes) + ")");
      for (int64_t k = 0; k < classes; ++k) logp[k] = scores.getDouble((n * classes + k) * inner + i);
      if (fromLogits) {
        double max = -kInf, sum = 0;
        for (double v : logp) max = std::max(max, v);
        for (double v : logp) sum += std::exp(v - max);
        for (double& v : logp) v = v - max - std::log(sum);
      }
      double meanNll = 0;
      for (double v : logp) meanNll -= v / static_cast<double>(classes);
      losses[e] = (1 - smoothing) * -logp[label] + (smoothing != 0 ? smoothing * meanNll : 0.0);
      ++count;
    }
  return reduceLosses(c, losses, count);
}

}  // namespace

namespace kernels {

Status Softmax(const KernelCall& c) { return softmax(c, false); }
Status LogSoftmax(const KernelCall& c) { return softmax(c, true); }

Status LayerNorm(const KernelCall& c) {
  KILN_TRY(checkFloats(c, 3));
  const Tensor& x = c.in(0);
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), x.rank());
  if (!axis) return axis.takeError();
  const double epsilon = c.op.getFloat("epsilon");
  const std::vector<int64_t> innerShape(x.shape().begin() + *axis, x.shape().end());
  const int64_t groupSize = product(innerShape);
  const int64_t groups = product(x.shape(), 0, *axis);
  std::vector<int64_t> scaleAt, biasAt;
  for (size_t k = 1; k < c.numOperands(); ++k)
    if (!broadcastsTo(c.in(k).shape(), innerShape))
      return c.op.emitError((k == 1 ? "scale " : "bias ") + c.in(k).type().str() +
                            " does not broadcast to the normalised dims of " + x.type().str());
  if (c.numOperands() > 1) scaleAt = broadcastOffsets(c.in(1).shape(), innerShape);
  if (c.numOperands() > 2) biasAt = broadcastOffsets(c.in(2).shape(), innerShape);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t base = g * groupSize;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < groupSize; ++j) mean += x.getDouble(base + j);
    mean /= static_cast<double>(groupSize);
    for (int64_t j = 0; j < groupSize; ++j) var += std::pow(x.getDouble(base + j) - mean, 2);
    var /= static_cast<double>(groupSize);
    for (int64_t j = 0; j < groupSize; ++j) {
      double y = (x.getDouble(base + j) - mean) / std::sqrt(var + epsilon);
      if (!scaleAt.empty()) y *= c.in(1).getDouble(scaleAt[j]);
      if (!biasAt.empty()) y += c.in(2).getDouble(biasAt[j]);
      c.out().setDouble(base + j, y);
    }
  }
  return {};
}

Status BatchNorm(const KernelCall& c) {
  KILN_TRY(checkFloats(c, 5));
  const Tensor& x = c.in(0);
  if (x.rank() < 2) return c.op.emitError("expects x[N,C,...], got " + x.type().str());
  const int64_t channels = x.shape()[1];
  for (size_t k = 1; k < 5; ++k)
    if (c.in(k).numElements() != channels)
      return c.op.emitError("operand " + std::to_string(k) + " " + c.in(k).type().str() + " must be [" +
                            std::to_string(channels) + "]");
  const double epsilon = c.op.getFloat("epsilon");
  const int64_t inner = product(x.shape(), 2, x.shape().size());
  for (int64_t i = 0; i < x.numElements(); ++i) {
    const int64_t ch = (i / inner) % channels;
    const double normalised = (x.getDouble(i) - c.in(3).getDouble(ch)) / std::sqrt(c.in(4).getDouble(ch) + epsilon);
    c.out().setDouble(i, normalised * c.in(1).getDouble(ch) + c.in(2).getDouble(ch));
  }
  return {};
}

Status Gelu(const KernelCall& c) {
  const std::string& approximate = c.op.getString("approximate");
  if (approximate == "none")
    return mapFloats(c, [](double x) { return 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2)); });
  if (approximate == "tanh")
    return mapFloats(c, [](double x) {
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    });
  return c.op.emitError("unknown approximate '" + approximate + "' (expected none or tanh)");
}

Status Silu(const KernelCall& c) {
  return mapFloats(c, [](double x) { return x / (1 + std::exp(-x)); });
}

Status LeakyRelu(const KernelCall& c) {
  const double alpha = c.op.getFloat("alpha");
  return mapFloats(c, [alpha](double x) { return x < 0 ? alpha * x : x; });
}

Status Elu(const KernelCall& c) {
  const double alpha = c.op.getFloat("alpha");
  return mapFloats(c, [alpha](double x) { return x < 0 ? alpha * std::expm1(x) : x; });
}

Status Softplus(const KernelCall& c) {
  // log(1 + e^x) = max(x, 0) + log1p(e^-|x|), which neither overflows nor
  // loses the small values of large negative x.
  return mapFloats(c, [](double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); });
}

Status Attention(const KernelCall& c) {
  KILN_TRY(checkFloats(c, 3));
  const Tensor& q = c.in(0);
  const Tensor& k = c.in(1);
  const Tensor& v = c.in(2);
  const int64_t rank = q.rank();
  if (rank < 2 || k.rank() != rank || v.rank() != rank)
    return c.op.emitError("expects q, k, v of one rank >= 2, got " + q.type().str() + ", " + k.type().str() + ", " +
                          v.type().str());
  const std::vector<int64_t> lead(q.shape().begin(), q.shape().end() - 2);
  const int64_t lq = q.shape()[rank - 2], depth = q.shape()[rank - 1];
  const int64_t lk = k.shape()[rank - 2], dv = v.shape()[rank - 1];
  if (!std::equal(lead.begin(), lead.end(), k.shape().begin()) ||
      !std::equal(lead.begin(), lead.end(), v.shape().begin()) || k.shape()[rank - 1] != depth ||
      v.shape()[rank - 2] != lk)
    return c.op.emitError("q " + q.type().str() + ", k " + k.type().str() + " and v " + v.type().str() +
                          " do not fit q[...,Lq,D], k[...,Lk,D], v[...,Lk,Dv]");
  const int64_t batch = product(lead);
  if (c.out().numElements() != batch * lq * dv)
    return c.op.emitError("result " + c.out().type().str() + " does not match [...,Lq,Dv]");
  const double attrScale = c.op.getFloat("scale");
  const double scale = attrScale == 0 ? 1 / std::sqrt(static_cast<double>(depth)) : attrScale;
  const bool causal = c.op.getBool("causal");

  std::vector<int64_t> scoreShape = lead;
  scoreShape.push_back(lq);
  scoreShape.push_back(lk);
  std::vector<int64_t> maskAt;
  if (c.numOperands() == 4) {
    if (!broadcastsTo(c.in(3).shape(), scoreShape))
      return c.op.emitError("mask " + c.in(3).type().str() + " does not broadcast to the scores [...," +
                            std::to_string(lq) + "," + std::to_string(lk) + "]");
    maskAt = broadcastOffsets(c.in(3).shape(), scoreShape);
  }
  const bool keepMask = c.numOperands() == 4 && c.in(3).dtype() == DType::Bool;

  std::vector<double> scores(static_cast<size_t>(lk));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < lq; ++i) {
      double max = -kInf;
      for (int64_t j = 0; j < lk; ++j) {
        double s = 0;
        for (int64_t d = 0; d < depth; ++d)
          s += q.getDouble((b * lq + i) * depth + d) * k.getDouble((b * lk + j) * depth + d);
        s *= scale;
        if (!maskAt.empty()) {
          const int64_t m = maskAt[(b * lq + i) * lk + j];
          if (keepMask)
            s = c.in(3).getInt(m) ? s : -kInf;
          else
            s += c.in(3).getDouble(m);
        }
        if (causal && j > i) s = -kInf;
        scores[j] = s;
        max = std::max(max, s);
      }
      // A row with every key masked is 0/0 = NaN, as in PyTorch.
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - max));
      for (int64_t e = 0; e < dv; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < lk; ++j) acc += scores[j] / sum * v.getDouble((b * lk + j) * dv + e);
        c.out().setDouble((b * lq + i) * dv + e, acc);
      }
    }
  return {};
}

Status CrossEntropy(const KernelCall& c) { return classificationLoss(c, true); }
Status NllLoss(const KernelCall& c) { return classificationLoss(c, false); }

Status MseLoss(const KernelCall& c) {
  KILN_TRY(checkFloats(c, 2));
  const Tensor& a = c.in(0);
  const Tensor& b = c.in(1);
  if (a.shape() != b.shape())
    return c.op.emitError("operands " + a.type().str() + " and " + b.type().str() + " differ in shape");
  std::vector<double> losses(static_cast<size_t>(a.numElements()));
  for (int64_t i = 0; i < a.numElements(); ++i) losses[i] = std::pow(a.getDouble(i) - b.getDouble(i), 2);
  return reduceLosses(c, losses, a.numElements());
}

/// The index along `axis` of x that element `i` of x has, for per-axis
/// quantization parameters (0 for scalar ones).
namespace {
Expected<std::vector<int64_t>> quantizationIndex(const KernelCall& c) {
  const Tensor& x = c.in(0);
  const bool perAxis = c.in(1).numElements() > 1 || c.in(2).numElements() > 1;
  std::vector<int64_t> index(static_cast<size_t>(x.numElements()), 0);
  if (!perAxis) return index;
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), x.rank());
  if (!axis) return axis.takeError();
  const int64_t dim = x.shape()[*axis], inner = product(x.shape(), *axis + 1, x.shape().size());
  for (size_t k : {size_t{1}, size_t{2}})
    if (c.in(k).numElements() != 1 && c.in(k).numElements() != dim)
      return c.op.emitError("operand " + std::to_string(k) + " " + c.in(k).type().str() + " has neither 1 nor " +
                            std::to_string(dim) + " elements (dim " + std::to_string(*axis) + " of x)");
  for (int64_t i = 0; i < x.numElements(); ++i) index[i] = (i / inner) % dim;
  return index;
}
/// Element `i` of a scalar or per-axis parameter.
int64_t at(const Tensor& t, int64_t i) { return t.numElements() == 1 ? 0 : i; }
}  // namespace

// Quantization in the float dtype of x (f32 division as ONNX Runtime's),
// rounded half to even.
Status Quantize(const KernelCall& c) {
  KILN_TRY(checkFloats(c, 2));
  auto index = quantizationIndex(c);
  if (!index) return index.takeError();
  const Tensor& x = c.in(0);
  const double lo = c.out().dtype() == DType::U8 ? 0 : -128, hi = lo + 255;
  const bool single = x.dtype() != DType::F64;
  for (int64_t i = 0; i < x.numElements(); ++i) {
    const int64_t a = (*index)[i];
    const double scale = c.in(1).getDouble(at(c.in(1), a)), zero = c.in(2).getDouble(at(c.in(2), a));
    const double q = single ? kiln_fround(static_cast<float>(x.getDouble(i)) / static_cast<float>(scale))
                            : kiln_fround(x.getDouble(i) / scale);
    c.out().setInt(i, static_cast<int64_t>(std::clamp(q + zero, lo, hi)));
  }
  return {};
}

Status Dequantize(const KernelCall& c) {
  if (!isFloat(c.in(1).dtype())) return dtypeError(c.op, c.in(1).dtype(), "a float scale");
  auto index = quantizationIndex(c);
  if (!index) return index.takeError();
  const Tensor& x = c.in(0);
  const bool single = c.out().dtype() != DType::F64;
  for (int64_t i = 0; i < x.numElements(); ++i) {
    const int64_t a = (*index)[i];
    const int64_t d = x.getInt(i) - c.in(2).getInt(at(c.in(2), a));
    const double scale = c.in(1).getDouble(at(c.in(1), a));
    c.out().setDouble(i, single ? static_cast<double>(static_cast<float>(d) * static_cast<float>(scale))
                                : static_cast<double>(d) * scale);
  }
  return {};
}

}  // namespace kernels
}  // namespace kiln
