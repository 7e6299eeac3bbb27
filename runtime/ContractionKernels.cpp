// Contraction and window kernels: matmul (NumPy semantics, batch dims
// broadcast), N-d convolution and transposed convolution with strides,
// padding, dilation and groups, and N-d max / average pooling. The loops are
// the textbook definitions: each output element sums (or maxes) over its
// window. A convolution's padding is zeros multiplied by the weights like
// any other input (PyTorch's semantics: 0 * inf is NaN); pooling skips it
// (padding never wins a max), and conv_transpose drops the taps that land
// in it, as PyTorch's scatter does. Floats accumulate in double, integers in
// wrapping int64.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/Kernels.h"

namespace kiln {
namespace {

/// The per-dim window parameters of conv, conv_transpose and pooling, with
/// the defaults of empty lists applied and their lengths checked.
struct Window {
  std::vector<int64_t> kernel;    // window extent per spatial dim
  std::vector<int64_t> strides;   // all 1 when unset
  std::vector<int64_t> padBegin;  // all 0 when unset
  std::vector<int64_t> padEnd;
  std::vector<int64_t> dilations;          // all 1 when unset
  std::vector<std::vector<int64_t>> taps;  // every offset within the kernel, row-major
};

Expected<Window> readWindow(const Op& op, std::vector<int64_t> kernel) {
  const size_t k = kernel.size();
  Window w;
  w.kernel = std::move(kernel);
  w.strides = intsOr(op, "strides");
  w.dilations = intsOr(op, "dilations");  // avg_pool has none: all 1
  std::vector<int64_t> pads = intsOr(op, "pads");
  if (w.strides.empty()) w.strides.assign(k, 1);
  if (w.dilations.empty()) w.dilations.assign(k, 1);
  if (pads.empty()) pads.assign(2 * k, 0);
  if (w.strides.size() != k || w.dilations.size() != k || pads.size() != 2 * k)
    return op.emitError("strides " + listStr(w.strides) + ", dilations " + listStr(w.dilations) + " and pads " +
                        listStr(pads) + " do not match " + std::to_string(k) + " spatial dims");
  for (size_t d = 0; d < k; ++d)
    if (w.strides[d] <= 0 || w.dilations[d] <= 0) return op.emitError("strides and dilations must be positive");
  w.padBegin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(k));
  w.padEnd.assign(pads.begin() + static_cast<std::ptrdiff_t>(k), pads.end());
  w.taps.resize(static_cast<size_t>(product(w.kernel)));
  for (size_t t = 0; t < w.taps.size(); ++t) unravel(static_cast<int64_t>(t), w.kernel, w.taps[t]);
  return w;
}

/// The spatial dims (all but the first two) of a shape.
std::vector<int64_t> spatial(const std::vector<int64_t>& shape) {
  return shape.size() < 2 ? std::vector<int64_t>{} : std::vector<int64_t>(shape.begin() + 2, shape.end());
}

/// Flat index into `dims` of `base * stride - pad + offset * dilation` per
/// dim, or -1 when that position lies outside `dims` (in the padding).
int64_t windowPosition(const std::vector<int64_t>& base, const std::vector<int64_t>& offset, const Window& w,
                       const std::vector<int64_t>& dims) {
  int64_t flat = 0;
  for (size_t d = 0; d < dims.size(); ++d) {
    const int64_t pos = base[d] * w.strides[d] - w.padBegin[d] + offset[d] * w.dilations[d];
    if (pos < 0 || pos >= dims[d]) return -1;
    flat = flat * dims[d] + pos;
  }
  return flat;
}

Status checkSameDType(const KernelCall& c) {
  for (size_t k = 1; k < c.numOperands(); ++k)
    if (c.in(k).dtype() != c.in(0).dtype())
      return c.op.emitError("operand " + std::to_string(k) + " has dtype " + std::string(dtypeName(c.in(k).dtype())) +
                            ", expected " + std::string(dtypeName(c.in(0).dtype())));
  return {};
}

/// The ranks of a convolution's x[N,C,D...], w[M,C/groups,K...] and result.
Status checkConvRanks(const KernelCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1);
  if (x.rank() < 3 || w.rank() != x.rank() || c.out().rank() != x.rank())
    return c.op.emitError("expects x[N,C,D...] and w[M,C/groups,K...] of one rank, got " + x.type().str() + " and " +
                          w.type().str());
  return {};
}

/// The channel counts of a convolution in `groups` groups: x's `channels`,
/// w[M, C/groups, ...] and the result's `resultChannels` (M).
Status checkConvGroups(const KernelCall& c, int64_t channels, int64_t resultChannels, int64_t groups) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const int64_t outChannels = w.shape()[0];
  if (groups <= 0 || channels % groups || outChannels % groups || w.shape()[1] * groups != channels ||
      resultChannels != outChannels)
    return c.op.emitError("channels of x " + x.type().str() + " and w " + w.type().str() + " do not fit " +
                          std::to_string(groups) + " groups");
  return {};
}

}  // namespace

namespace kernels {

Status MatMul(const KernelCall& c) {
  KILN_TRY(checkSameDType(c));
  const Tensor& a = c.in(0);
  const Tensor& b = c.in(1);
  if (a.rank() == 0 || b.rank() == 0) return c.op.emitError("operands must have rank 1 or more");
  // Rank-1 operands become a row (a) or a column (b); the result drops that
  // dim again, which leaves its flat order unchanged.
  std::vector<int64_t> aShape = a.shape(), bShape = b.shape();
  if (aShape.size() == 1) aShape.insert(aShape.begin(), 1);
  if (bShape.size() == 1) bShape.push_back(1);
  const int64_t m = aShape[aShape.size() - 2], k = aShape.back();
  const int64_t n = bShape.back();
  if (bShape[bShape.size() - 2] != k)
    return c.op.emitError("contracting dims differ: " + a.type().str() + " and " + b.type().str());
  const std::vector<int64_t> aBatch(aShape.begin(), aShape.end() - 2), bBatch(bShape.begin(), bShape.end() - 2);
  std::vector<int64_t> batch(std::max(aBatch.size(), bBatch.size()));
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t fromBack = batch.size() - i;
    const int64_t da = fromBack <= aBatch.size() ? aBatch[aBatch.size() - fromBack] : 1;
    const int64_t db = fromBack <= bBatch.size() ? bBatch[bBatch.size() - fromBack] : 1;
    if (da != db && da != 1 && db != 1)
      return c.op.emitError("batch dims of " + a.type().str() + " and " + b.type().str() + " do not broadcast");
    batch[i] = da == 1 ? db : da;
  }
  if (product(batch) * m * n != c.out().numElements())
    return c.op.emitError("result " + c.out().type().str() + " does not match the product's shape");
  std::vector<int64_t> aStrides = broadcastStrides(aBatch, batch), bStrides = broadcastStrides(bBatch, batch);
  for (int64_t& s : aStrides) s *= m * k;
  for (int64_t& s : bStrides) s *= k * n;

  withComputeType(a.dtype(), [&]<typename Acc>() {
    const std::vector<Acc> av = readAs<Acc>(a), bv = readAs<Acc>(b);
    std::vector<Acc> result(static_cast<size_t>(c.out().numElements()));
    walk(batch, {aStrides, bStrides}, {0, 0}, [&](int64_t bi, const std::vector<int64_t>& off) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          Acc acc = 0;
          for (int64_t p = 0; p < k; ++p) acc = addAcc(acc, mulAcc(av[off[0] + i * k + p], bv[off[1] + p * n + j]));
          result[(bi * m + i) * n + j] = acc;
        }
    });
    writeAll(c.out(), result);
  });
  return {};
}

Status Conv(const KernelCall& c) {
  const Tensor& x = c.in(0);
  const Tensor& w = c.in(1);
  Tensor& out = c.out();
  KILN_TRY(checkConvRanks(c));
  KILN_TRY(checkSameDType(c));
  // channels_last: x[N, D..., C] and out[N, D..., M], read through the same
  // loops with the channel as the innermost dim.
  const bool channelsLast = c.op.getBool("channels_last");
  std::vector<int64_t> xShape = x.shape(), outShape = out.shape();
  if (channelsLast) {
    std::rotate(xShape.begin() + 1, xShape.end() - 1, xShape.end());
    std::rotate(outShape.begin() + 1, outShape.end() - 1, outShape.end());
  }
  const int64_t batchSize = xShape[0], channels = xShape[1], outChannels = w.shape()[0];
  const int64_t groups = c.op.getInt("groups");
  KILN_TRY(checkConvGroups(c, channels, outShape[1], groups));
  if (c.numOperands() == 3 && (c.in(2).rank() != 1 || c.in(2).shape()[0] != outChannels))
    return c.op.emitError("bias " + c.in(2).type().str() + " must be [" + std::to_string(outChannels) + "]");
  auto window = readWindow(c.op, spatial(w.shape()));
  if (!window) return window.takeError();
  const std::vector<int64_t> inDims = spatial(xShape), outDims = spatial(outShape);
  const int64_t inSize = product(inDims), outSize = product(outDims), kernelSize = product(window->kernel);
  const int64_t groupIn = channels / groups, groupOut = outChannels / groups;
  // Element offsets of (batch, channel, spatial position) in x and out.
  auto xOffset = [&](int64_t nb, int64_t channel, int64_t pos) {
    return channelsLast ? (nb * inSize + pos) * channels + channel : (nb * channels + channel) * inSize + pos;
  };
  auto outOffset = [&](int64_t nb, int64_t mo, int64_t o) {
    return channelsLast ? (nb * outSize + o) * outChannels + mo : (nb * outChannels + mo) * outSize + o;
  };

  withComputeType(x.dtype(), [&]<typename Acc>() {
    const std::vector<Acc> xv = readAs<Acc>(x), wv = readAs<Acc>(w);
    std::vector<int64_t> outIndex;
    for (int64_t nb = 0; nb < batchSize; ++nb)
      for (int64_t mo = 0; mo < outChannels; ++mo) {
        const int64_t group = mo / groupOut;
        for (int64_t o = 0; o < outSize; ++o) {
          unravel(o, outDims, outIndex);
          Acc acc = 0;
          for (int64_t ci = 0; ci < groupIn; ++ci) {
            const int64_t channel = group * groupIn + ci;
            for (int64_t kp = 0; kp < kernelSize; ++kp) {
              const std::vector<int64_t>& kernelIndex = window->taps[kp];
              const int64_t pos = windowPosition(outIndex, kernelIndex, *window, inDims);
              // A padded tap is a zero multiplied like any other input (as
              // PyTorch's zero padding is), so a NaN or infinite weight
              // makes it NaN (0 * inf) rather than being skipped.
              const Acc xe = pos < 0 ? Acc(0) : xv[xOffset(nb, channel, pos)];
              acc = addAcc(acc, mulAcc(xe, wv[(mo * groupIn + ci) * kernelSize + kp]));
            }
          }
          if (c.numOperands() == 3) acc = addAcc(acc, getElement<Acc>(c.in(2), mo));
          setElement<Acc>(out, outOffset(nb, mo, o), acc);
        }
      }
  });
  return {};
}

Status ConvTranspose(const KernelCall& c) {
  const Tensor& x = c.in(0);
  const Tensor& w = c.in(1);
  Tensor& out = c.out();
  if (x.rank() < 3 || w.rank() != x.rank() || out.rank() != x.rank())
    return c.op.emitError("expects x[N,C,D...] and w[C,M/groups,K...] of one rank, got " + x.type().str() + " and " +
                          w.type().str());
  KILN_TRY(checkSameDType(c));
  const int64_t batchSize = x.shape()[0], channels = x.shape()[1];
  const int64_t groups = c.op.getInt("groups");
  const int64_t groupOut = w.shape()[1], outChannels = groupOut * groups;
  if (groups <= 0 || channels % groups || w.shape()[0] != channels || out.shape()[1] != outChannels)
    return c.op.emitError("channels of x " + x.type().str() + " and w " + w.type().str() + " do not fit " +
                          std::to_string(groups) + " groups");
  if (c.numOperands() == 3 && (c.in(2).rank() != 1 || c.in(2).shape()[0] != outChannels))
    return c.op.emitError("bias " + c.in(2).type().str() + " must be [" + std::to_string(outChannels) + "]");
  auto window = readWindow(c.op, spatial(w.shape()));
  if (!window) return window.takeError();
  const std::vector<int64_t> inDims = spatial(x.shape()), outDims = spatial(out.shape());
  const int64_t inSize = product(inDims), outSize = product(outDims), kernelSize = product(window->kernel);
  const int64_t groupIn = channels / groups;

  withComputeType(x.dtype(), [&]<typename Acc>() {
    const std::vector<Acc> xv = readAs<Acc>(x), wv = readAs<Acc>(w);
    std::vector<Acc> result(static_cast<size_t>(out.numElements()), Acc(0));
    std::vector<int64_t> inIndex;
    // The transpose of conv: every input element scatters into the output
    // window it would have been gathered from.
    for (int64_t nb = 0; nb < batchSize; ++nb)
      for (int64_t ci = 0; ci < channels; ++ci) {
        const int64_t group = ci / groupIn;
        for (int64_t i = 0; i < inSize; ++i) {
          unravel(i, inDims, inIndex);
          const Acc xe = xv[(nb * channels + ci) * inSize + i];
          for (int64_t mo = 0; mo < groupOut; ++mo)
            for (int64_t kp = 0; kp < kernelSize; ++kp) {
              const std::vector<int64_t>& kernelIndex = window->taps[kp];
              const int64_t pos = windowPosition(inIndex, kernelIndex, *window, outDims);
              if (pos < 0) continue;
              Acc& dst = result[(nb * outChannels + group * groupOut + mo) * outSize + pos];
              dst = addAcc(dst, mulAcc(xe, wv[(ci * groupOut + mo) * kernelSize + kp]));
            }
        }
      }
    if (c.numOperands() == 3)
      for (int64_t i = 0; i < out.numElements(); ++i)
        result[i] = addAcc(result[i], getElement<Acc>(c.in(2), (i / outSize) % outChannels));
    writeAll(out, result);
  });
  return {};
}

Status ConvWeightGrad(const KernelCall& c) {
  const Tensor& x = c.in(0);
  const Tensor& dy = c.in(1);
  Tensor& out = c.out();
  if (x.rank() < 3 || dy.rank() != x.rank() || out.rank() != x.rank())
    return c.op.emitError("expects x[N,C,D...] and dy[N,M,O...] of one rank, got " + x.type().str() + " and " +
                          dy.type().str());
  KILN_TRY(checkSameDType(c));
  const int64_t batchSize = x.shape()[0], channels = x.shape()[1], outChannels = dy.shape()[1];
  const int64_t groups = c.op.getInt("groups");
  if (groups <= 0 || channels % groups || outChannels % groups || out.shape()[0] != outChannels ||
      out.shape()[1] * groups != channels || dy.shape()[0] != batchSize)
    return c.op.emitError("x " + x.type().str() + ", dy " + dy.type().str() + " and the result " + out.type().str() +
                          " do not fit " + std::to_string(groups) + " groups");
  auto window = readWindow(c.op, c.op.getInts("kernel"));
  if (!window) return window.takeError();
  const std::vector<int64_t> inDims = spatial(x.shape()), outDims = spatial(dy.shape());
  const int64_t inSize = product(inDims), outSize = product(outDims), kernelSize = product(window->kernel);
  const int64_t groupIn = channels / groups, groupOut = outChannels / groups;
  withComputeType(x.dtype(), [&]<typename Acc>() {
    const std::vector<Acc> xv = readAs<Acc>(x), dv = readAs<Acc>(dy);
    std::vector<Acc> result(static_cast<size_t>(out.numElements()), Acc(0));
    std::vector<int64_t> outIndex;
    for (int64_t nb = 0; nb < batchSize; ++nb)
      for (int64_t mo = 0; mo < outChannels; ++mo) {
        const int64_t group = mo / groupOut;
        for (int64_t o = 0; o < outSize; ++o) {
          unravel(o, outDims, outIndex);
          const Acc d = dv[(nb * outChannels + mo) * outSize + o];
          for (int64_t ci = 0; ci < groupIn; ++ci) {
            const int64_t channel = group * groupIn + ci;
            for (int64_t kp = 0; kp < kernelSize; ++kp) {
              const int64_t pos = windowPosition(outIndex, window->taps[kp], *window, inDims);
              // As in conv, padding is zeros that multiply dy (a NaN or
              // infinite dy makes the tap's sum NaN, as in PyTorch).
              const Acc xe = pos < 0 ? Acc(0) : xv[(nb * channels + channel) * inSize + pos];
              Acc& r = result[(mo * groupIn + ci) * kernelSize + kp];
              r = addAcc(r, mulAcc(d, xe));
            }
          }
        }
      }
    writeAll(out, result);
  });
  return {};
}

/// A pooling's x and result as planes (one per batch element and channel)
/// of spatial positions, stored channels first or, with channels_last,
/// channels innermost.
struct PoolPlanes {
  std::vector<int64_t> inDims, outDims;
  int64_t channels = 1, planes = 0, inSize = 0, outSize = 0;
  bool channelsLast = false;

  PoolPlanes(const Op& op, const Tensor& x, const Tensor& out) : channelsLast(op.getBool("channels_last")) {
    std::vector<int64_t> xs = x.shape(), os = out.shape();
    if (channelsLast) {
      std::rotate(xs.begin() + 1, xs.end() - 1, xs.end());
      std::rotate(os.begin() + 1, os.end() - 1, os.end());
    }
    inDims = spatial(xs);
    outDims = spatial(os);
    channels = xs[1];
    planes = xs[0] * xs[1];
    inSize = product(inDims);
    outSize = product(outDims);
  }
  /// The offset of plane `p`'s position `pos` in x (size inSize) or the result (outSize).
  int64_t offset(int64_t p, int64_t pos, int64_t size) const {
    return channelsLast ? ((p / channels) * size + pos) * channels + p % channels : p * size + pos;
  }
};

Status MaxPool(const KernelCall& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out();
  if (x.rank() < 3 || out.rank() != x.rank()) return c.op.emitError("expects x[N,C,D...], got " + x.type().str());
  auto window = readWindow(c.op, c.op.getInts("kernel"));
  if (!window) return window.takeError();
  const PoolPlanes planes(c.op, x, out);
  const std::vector<int64_t>&inDims = planes.inDims, &outDims = planes.outDims;
  if (window->kernel.size() != inDims.size())
    return c.op.emitError("kernel " + listStr(window->kernel) + " does not match " + x.type().str());
  const int64_t inSize = planes.inSize, outSize = planes.outSize, kernelSize = product(window->kernel);
  withComputeType(x.dtype(), [&]<typename Acc>() {
    constexpr bool kFloat = std::is_same_v<Acc, double>;
    std::vector<int64_t> outIndex;
    for (int64_t p = 0; p < planes.planes; ++p)
      for (int64_t o = 0; o < outSize; ++o) {
        unravel(o, outDims, outIndex);
        // Padding never wins: only real elements are candidates.
        bool found = false;
        Acc best = kFloat ? Acc(-std::numeric_limits<double>::infinity()) : Acc(0);
        for (int64_t kp = 0; kp < kernelSize; ++kp) {
          const std::vector<int64_t>& kernelIndex = window->taps[kp];
          const int64_t pos = windowPosition(outIndex, kernelIndex, *window, inDims);
          if (pos < 0) continue;
          const Acc v = getElement<Acc>(x, planes.offset(p, pos, inSize));
          if (v != v || best != best) {
            best = v != v ? v : best;  // NaN propagates
          } else if (!found || v > best) {
            best = v;
          }
          found = true;
        }
        setElement<Acc>(out, planes.offset(p, o, outSize), best);
      }
  });
  return {};
}

Status AvgPool(const KernelCall& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out();
  if (x.rank() < 3 || out.rank() != x.rank()) return c.op.emitError("expects x[N,C,D...], got " + x.type().str());
  auto window = readWindow(c.op, c.op.getInts("kernel"));
  if (!window) return window.takeError();
  const PoolPlanes planes(c.op, x, out);
  const std::vector<int64_t>&inDims = planes.inDims, &outDims = planes.outDims;
  if (window->kernel.size() != inDims.size())
    return c.op.emitError("kernel " + listStr(window->kernel) + " does not match " + x.type().str());
  const bool countPad = c.op.getBool("count_include_pad");
  const int64_t inSize = planes.inSize, outSize = planes.outSize, kernelSize = product(window->kernel);
  std::vector<int64_t> outIndex;
  for (int64_t p = 0; p < planes.planes; ++p)
    for (int64_t o = 0; o < outSize; ++o) {
      unravel(o, outDims, outIndex);
      double sum = 0;
      int64_t real = 0, padded = 0;
      for (int64_t kp = 0; kp < kernelSize; ++kp) {
        const std::vector<int64_t>& kernelIndex = window->taps[kp];
        // With count_include_pad the divisor counts window positions inside
        // the padded input; positions past the end padding (ceil_mode's
        // partial last window) never count.
        bool insidePadded = true;
        for (size_t d = 0; d < inDims.size(); ++d) {
          const int64_t pos = outIndex[d] * window->strides[d] - window->padBegin[d] + kernelIndex[d];
          insidePadded = insidePadded && pos >= -window->padBegin[d] && pos < inDims[d] + window->padEnd[d];
        }
        padded += insidePadded;
        const int64_t pos = windowPosition(outIndex, kernelIndex, *window, inDims);
        if (pos < 0) continue;
        sum += x.getDouble(planes.offset(p, pos, inSize));
        ++real;
      }
      out.setDouble(planes.offset(p, o, outSize), sum / static_cast<double>(countPad ? padded : real));
    }
  return {};
}

// --- Quantized contractions ------------------------------------------------------

}  // namespace kernels

namespace {

/// The requantization of qconv and qmatmul (ir/Ops.def): the exact integer
/// accumulator times the channel's f32 scale, relu, rounded half to even,
/// plus the result's zero point, saturated to u8 or i8.
int64_t requantize(int64_t acc, float scale, bool relu, int64_t zeroPoint, DType dtype) {
  float v = static_cast<float>(acc) * scale;
  if (relu) v = std::max(v, 0.0f);
  const int64_t lo = dtype == DType::U8 ? 0 : -128, hi = lo + 255;
  const double q = static_cast<double>(kiln_fround(v)) + static_cast<double>(zeroPoint);
  return static_cast<int64_t>(std::clamp(q, static_cast<double>(lo), static_cast<double>(hi)));
}

/// The operands a quantized contraction's kernel checks beyond its shape
/// rule: one scale (and bias) per output channel.
Status checkQuantizedOperands(const KernelCall& c, int64_t channels) {
  if (c.in(2).numElements() != channels || (c.numOperands() == 4 && c.in(3).numElements() != channels))
    return c.op.emitError("expects one scale and bias per output channel (" + std::to_string(channels) + "), got " +
                          c.in(2).type().str() + (c.numOperands() == 4 ? " and " + c.in(3).type().str() : ""));
  return {};
}

}  // namespace

namespace kernels {

Status QConv(const KernelCall& c) {
  const Tensor& x = c.in(0);
  const Tensor& w = c.in(1);
  Tensor& out = c.out();
  KILN_TRY(checkConvRanks(c));
  const int64_t batchSize = x.shape()[0], channels = x.shape()[1], outChannels = w.shape()[0];
  const int64_t groups = c.op.getInt("groups");
  KILN_TRY(checkConvGroups(c, channels, out.shape()[1], groups));
  KILN_TRY(checkQuantizedOperands(c, outChannels));
  auto window = readWindow(c.op, spatial(w.shape()));
  if (!window) return window.takeError();
  const std::vector<int64_t> inDims = spatial(x.shape()), outDims = spatial(out.shape());
  const int64_t inSize = product(inDims), outSize = product(outDims), kernelSize = product(window->kernel);
  const int64_t groupIn = channels / groups, groupOut = outChannels / groups;
  const int64_t xZero = c.op.getInt("x_zero_point"), yZero = c.op.getInt("y_zero_point");
  const bool relu = c.op.getBool("relu");
  const std::vector<int64_t> xv = readAs<int64_t>(x), wv = readAs<int64_t>(w);
  std::vector<int64_t> outIndex;
  for (int64_t nb = 0; nb < batchSize; ++nb)
    for (int64_t mo = 0; mo < outChannels; ++mo) {
      const int64_t group = mo / groupOut;
      const float scale = static_cast<float>(c.in(2).getDouble(mo));
      const int64_t bias = c.numOperands() == 4 ? c.in(3).getInt(mo) : 0;
      for (int64_t o = 0; o < outSize; ++o) {
        unravel(o, outDims, outIndex);
        // Exact: |terms| < 2^16, so int64 holds any realistic sum.
        int64_t acc = bias;
        for (int64_t ci = 0; ci < groupIn; ++ci) {
          const int64_t channel = group * groupIn + ci;
          for (int64_t kp = 0; kp < kernelSize; ++kp) {
            const int64_t pos = windowPosition(outIndex, window->taps[kp], *window, inDims);
            if (pos < 0) continue;  // padding holds x's zero point: it adds nothing
            acc += (xv[(nb * channels + channel) * inSize + pos] - xZero) * wv[(mo * groupIn + ci) * kernelSize + kp];
          }
        }
        out.setInt((nb * outChannels + mo) * outSize + o, requantize(acc, scale, relu, yZero, out.dtype()));
      }
    }
  return {};
}

Status QMatMul(const KernelCall& c) {
  const Tensor& a = c.in(0);
  const Tensor& b = c.in(1);
  if (a.rank() < 1 || b.rank() != 2 || a.shape().back() != b.shape()[0])
    return c.op.emitError("expects x[...,M,K] and w[K,N], got " + a.type().str() + " and " + b.type().str());
  const int64_t k = b.shape()[0], n = b.shape()[1], rows = a.numElements() / k;
  if (rows * n != c.out().numElements())
    return c.op.emitError("result " + c.out().type().str() + " does not match the product's shape");
  KILN_TRY(checkQuantizedOperands(c, n));
  const int64_t xZero = c.op.getInt("x_zero_point"), yZero = c.op.getInt("y_zero_point");
  const bool relu = c.op.getBool("relu");
  const std::vector<int64_t> av = readAs<int64_t>(a), bv = readAs<int64_t>(b);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int64_t acc = c.numOperands() == 4 ? c.in(3).getInt(j) : 0;
      for (int64_t p = 0; p < k; ++p) acc += (av[i * k + p] - xZero) * bv[p * n + j];
      c.out().setInt(i * n + j,
                     requantize(acc, static_cast<float>(c.in(2).getDouble(j)), relu, yZero, c.out().dtype()));
    }
  return {};
}

}  // namespace kernels
}  // namespace kiln
