// oneDNN kernels of DnnlKernels.h. Buffers are described as plain
// row-major (explicit strides); `set_data_handle` binds each run's buffers
// to memory objects made once, and a convolution whose chosen layouts are
// blocked reorders through memory of its own. Post-ops come from the
// LibraryCall as they are: code generation decided which ops they are
// (codegen/cpu/CpuTarget.h), from the ops themselves.
#include "runtime/DnnlKernels.h"

#include "ir/ScalarSemantics.h"
#include "ir/Types.h"
#include "runtime/FiniteBound.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_version.h>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>

// The headers of PyPI's oneDNN 3.x (runtime/CMakeLists.txt), not those of
// Debian's libdnnl-dev 2.6 in /usr/include, whose API differs.
static_assert(DNNL_VERSION_MAJOR == 3, "DnnlKernels.cpp is written for oneDNN 3.x");

namespace kiln {

namespace {

using dnnl::algorithm;
using dnnl::memory;

memory::dims rowMajorStrides(const memory::dims& dims) {
  memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(dims[i], 1);
  return strides;
}

memory::desc plainDesc(const memory::dims& dims, memory::data_type type = memory::data_type::f32) {
  return memory::desc(dims, type, rowMajorStrides(dims));
}

/// A matrix (or batch of them) of logical dims [..., R, C] stored with its
/// last two dims swapped, [..., C, R] row-major (LibraryCall::transposedA
/// and transposedB).
memory::desc transposedDesc(const memory::dims& dims, memory::data_type type = memory::data_type::f32) {
  memory::dims stored = dims;
  std::swap(stored[stored.size() - 2], stored[stored.size() - 1]);
  memory::dims strides = rowMajorStrides(stored);
  std::swap(strides[strides.size() - 2], strides[strides.size() - 1]);
  return memory::desc(dims, type, strides);
}

/// oneDNN's type of a library call's elements: f32, or u8 and s8 (int8 calls).
memory::data_type dnnlType(DType dtype) {
  switch (dtype) {
    case DType::U8: return memory::data_type::u8;
    case DType::I8: return memory::data_type::s8;
    case DType::I32: return memory::data_type::s32;
    case DType::BF16: return memory::data_type::bf16;
    case DType::F16: return memory::data_type::f16;
    default: return memory::data_type::f32;
  }
}

/// Memory stored channels last, [N, D..., C] as `dims` say, described in
/// oneDNN's logical order [N, C, D...] with the strides that read it (nhwc
/// for 2-d convolutions).
memory::desc channelsLastDesc(const memory::dims& dims, memory::data_type type = memory::data_type::f32) {
  memory::dims strides = rowMajorStrides(dims), logical = dims;
  if (dims.size() > 2) {
    std::rotate(logical.begin() + 1, logical.end() - 1, logical.end());
    std::rotate(strides.begin() + 1, strides.end() - 1, strides.end());
  }
  return memory::desc(logical, type, strides);
}

/// `dims` right-aligned in `rank` dims, padded with leading 1s (NumPy
/// broadcasting), or nullopt when it has more dims than `rank`.
std::optional<memory::dims> alignTo(const std::vector<int64_t>& dims, size_t rank) {
  if (dims.size() > rank) return std::nullopt;
  memory::dims out(rank - dims.size(), 1);
  out.insert(out.end(), dims.begin(), dims.end());
  return out;
}

/// The oneDNN algorithm of an elementwise post-op.
algorithm eltwiseAlgorithm(PostOp::Kind kind) {
  switch (kind) {
    case PostOp::Kind::Relu: return algorithm::eltwise_relu;
    case PostOp::Kind::Tanh: return algorithm::eltwise_tanh;
    case PostOp::Kind::Sigmoid: return algorithm::eltwise_logistic;
    case PostOp::Kind::Exp: return algorithm::eltwise_exp;
    case PostOp::Kind::Log: return algorithm::eltwise_log;
    case PostOp::Kind::Abs: return algorithm::eltwise_abs;
    case PostOp::Kind::Sqrt: return algorithm::eltwise_sqrt;
    case PostOp::Kind::Linear: return algorithm::eltwise_linear;
    case PostOp::Kind::GeluErf: return algorithm::eltwise_gelu_erf;
    case PostOp::Kind::GeluTanh: return algorithm::eltwise_gelu_tanh;
    case PostOp::Kind::Swish: return algorithm::eltwise_swish;
    case PostOp::Kind::Clip: return algorithm::eltwise_clip;
    default: return algorithm::undef;
  }
}

/// One of oneDNN's eltwise post-ops: alpha and beta as its algorithm reads them.
struct EltwiseEntry {
  algorithm alg = algorithm::undef;
  float alpha = 0, beta = 0;
};

bool sameBits(const EltwiseEntry& a, const EltwiseEntry& b) {
  return a.alg == b.alg && std::memcmp(&a.alpha, &b.alpha, sizeof(float)) == 0 &&
         std::memcmp(&a.beta, &b.beta, sizeof(float)) == 0;
}

/// How a primitive computes relu and clip post-ops.
enum class Variant : uint8_t {
  /// relu as elu and an add (below), exact on every value; a call with a
  /// clip stops before it (the host applies the rest).
  Exact,
  /// relu and clip as oneDNN's max(x, 0) and max-then-min, which differ from
  /// the IR's only on NaN: run when the call's guard proves that no NaN and
  /// no infinity reaches them (DnnlKernel::Impl::Guard).
  Guarded,
};

/// oneDNN's eltwise post-ops for `p`. An f32 relu is not oneDNN's relu,
/// whose max(x, 0) (vmaxps with 0 second) turns NaN into 0, but elu with
/// alpha -0 and then x + 0: elu keeps x where x > 0 and computes
/// -0 * (e^x - 1) elsewhere, which is NaN for NaN (its e^x clamps NaN to
/// ln(FLT_MAX), where it overflows to +inf), +0 for x < 0 and -inf, and -0
/// for +-0 and tiny negatives, which the add makes +0. So NaN stays NaN and
/// every other value is the interpreter's relu (kiln_frelu), on every ISA
/// (test/unit/PostOpSpecialValuesTest.cpp). An int8 call's relu acts on
/// integers, where oneDNN's relu is exact.
/// In the guarded variant relu is oneDNN's relu and a clip's open ends
/// (+-inf) are the largest floats, the same on the finite values it sees.
std::vector<EltwiseEntry> eltwiseEntries(const PostOp& p, bool quantized, Variant variant) {
  if (p.kind == PostOp::Kind::Relu && !quantized && variant == Variant::Exact)
    return {{algorithm::eltwise_elu, -0.0f, 0.0f}, {algorithm::eltwise_linear, 1.0f, 0.0f}};
  if (p.kind == PostOp::Kind::Clip)
    return {{algorithm::eltwise_clip, std::max(p.alpha, std::numeric_limits<float>::lowest()),
             std::min(p.beta, std::numeric_limits<float>::max())}};
  return {{eltwiseAlgorithm(p.kind), p.alpha, p.beta}};
}

int64_t elementCount(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

/// Whether `p` passes a bound on its input to its result without making a
/// NaN of finite values (see Guard::postOpRange): relu, clip, x * a + b,
/// + - * a tensor, tanh, sigmoid, abs, swish, tanh GELU.
bool passesBound(const PostOp& p) {
  switch (p.kind) {
    case PostOp::Kind::Relu:
    case PostOp::Kind::Clip:
    case PostOp::Kind::Linear:
    case PostOp::Kind::Add:
    case PostOp::Kind::Sub:
    case PostOp::Kind::Mul:
    case PostOp::Kind::Tanh:
    case PostOp::Kind::Sigmoid:
    case PostOp::Kind::Abs:
    case PostOp::Kind::Swish:
    case PostOp::Kind::GeluTanh: return true;
    default: return false;
  }
}

/// Whether `call` is one a guard can bound: an f32 convolution or matmul.
bool boundable(const LibraryCall& call) {
  return !call.quantized() && !call.mixedPrecision() && call.dstType == DType::F32 &&
         (call.kind == LibraryCall::Kind::Conv || call.kind == LibraryCall::Kind::MatMul);
}

/// Whether a guard can bound `call`'s result: its post-ops all pass a bound on.
bool boundsResult(const LibraryCall& call) {
  return boundable(call) && std::all_of(call.postOps.begin(), call.postOps.end(), passesBound);
}

/// The post-ops a guard bounds, [0, end), or 0 when `call` has no guard: a
/// boundable call with a relu or clip, where every post-op up to the last of
/// them passes a bound on.
size_t guardEnd(const LibraryCall& call) {
  if (!boundable(call)) return 0;
  size_t end = 0;
  for (size_t i = 0; i < call.postOps.size(); ++i)
    if (call.postOps[i].kind == PostOp::Kind::Relu || call.postOps[i].kind == PostOp::Kind::Clip) end = i + 1;
  return std::all_of(call.postOps.begin(), call.postOps.begin() + static_cast<std::ptrdiff_t>(end), passesBound) ? end
                                                                                                                   : 0;
}

/// Where `call`'s exact variant stops and the host goes on: at the first
/// clip, which no oneDNN post-op computes as the IR does. The post-ops from
/// there on must all be relus and clips, which the host applies.
size_t hostTailBegin(const LibraryCall& call) {
  for (size_t i = 0; i < call.postOps.size(); ++i)
    if (call.postOps[i].kind == PostOp::Kind::Clip) return i;
  return call.postOps.size();
}

/// The IR's relu or clip (min(max(x, lo), hi), NaN kept) of `x`.
float applyHostPostOp(const PostOp& p, float x) {
  if (p.kind == PostOp::Kind::Relu) return kiln_frelu(x);
  return kiln_fmin(kiln_fmax(x, p.alpha), p.beta);
}

/// The oneDNN algorithm of a binary post-op.
algorithm binaryAlgorithm(PostOp::Kind kind) {
  switch (kind) {
    case PostOp::Kind::Add: return algorithm::binary_add;
    case PostOp::Kind::Sub: return algorithm::binary_sub;
    case PostOp::Kind::Mul: return algorithm::binary_mul;
    case PostOp::Kind::Div: return algorithm::binary_div;
    case PostOp::Kind::Max: return algorithm::binary_max;
    case PostOp::Kind::Min: return algorithm::binary_min;
    default: return algorithm::undef;
  }
}

std::string dimsText(const memory::dims& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

dnnl::engine& cpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

}  // namespace

/// What oneDNN chose for a convolution or deconvolution.
struct ConvDescs {
  dnnl::memory::desc src, weights, dst;
  std::string impl;
  /// The layout of each binary post-op's operand, by post-op (the others' empty).
  std::vector<dnnl::memory::desc> postOpOperands;
};

struct DnnlKernel::Impl {
  /// A copy between a buffer's plain layout and the blocked layout the
  /// primitive chose, into or out of memory the kernel owns.
  struct Reorder {
    dnnl::reorder primitive;
    memory plain, blocked;
    int buffer = 0;
    /// A constant operand (weights): reordered on the first run only, as
    /// long as it is at the same address.
    bool constant = false;
    const void* reordered = nullptr;
    /// A constant matmul b: `blocked` is the copy every kernel of the
    /// process shares for the same source and layout (PackedWeights), made
    /// on the first run; `argument` is the primitive's argument it binds.
    bool shared = false;
    int argument = 0;
    std::shared_ptr<const memory> sharedCopy;
  };
  dnnl::primitive primitive;
  std::unordered_map<int, memory> args;
  /// (oneDNN argument, buffer index) to bind on each run.
  std::vector<std::pair<int, int>> bindings;
  std::vector<Reorder> inputReorders;
  std::vector<Reorder> outputReorders;
  std::string description;
  int64_t work = 0;
  /// A padded f32 convolution: oneDNN's kernels skip the taps in the
  /// padding, where the IR multiplies a zero by the weight (docs/ops.md), so
  /// after each run every result element with a NaN or infinite weight on a
  /// tap in the padding is set to NaN (0 * inf). Empty `pads`: no fix-up.
  struct PaddedTaps {
    std::vector<int64_t> weightDims;            // [M, C/g, K...], the plain buffer
    std::vector<int64_t> inDims, outDims;       // spatial dims of x and the result
    std::vector<int64_t> strides, dilations, padBegin;
    int64_t batch = 0;
    bool channelsLast = false;
    /// The weights' type: f32, or bf16 or f16 (a mixed-precision call's);
    /// the result's: f32, or bf16 or f16 (stored so by the call).
    DType weightType = DType::F32;
    DType resultType = DType::F32;
    int weightBuffer = 0, resultBuffer = 0;
    /// Constant weights (inference) are scanned once per address, as a
    /// constant reorder is made once: the first run found them all finite.
    bool constantWeights = false;
    const void* finiteAt = nullptr;
  };
  std::optional<PaddedTaps> paddedTaps;
  void fixPaddedTaps(void* const* buffers);

  /// Bounds on the values an f32 convolution or matmul computes
  /// (FiniteBound.h), which guard its relu and clip post-ops and pass on to
  /// the calls that read its result.
  ///
  /// A call with a relu or clip (guardEnd) is built as the guarded variant,
  /// which computes them as oneDNN's max and min. Before each run the guard
  /// bounds the value reaching them from the call's operands: when x, the
  /// weights, the bias and the added tensors are finite and
  ///   max|x| * max_m sum|w_m| + max|bias| (+ max|t| per added tensor, ...)
  /// stays below kGuardLimit, no infinity or NaN can arise (a sum in f32
  /// exceeds the exact sum of magnitudes by a factor below e for any length
  /// up to 2^24), and max and min are the IR's relu and clip. Otherwise the
  /// exact variant runs: relu as elu and an add, and a clip (with the relus
  /// and clips after it) on the host, as the IR defines it. On ResNet-50 the
  /// exact relu cost 6% at batch 1 (an exponential per element, and oneDNN's
  /// 1x1 kernels slowed most).
  ///
  /// max|x| comes from the run's known bounds (the result bound of the call
  /// that computed x, which the CPU runner passes on) or else from a scan;
  /// constant weights, biases and tensors are bounded once per address. A
  /// known bound can only be larger than the value's true maximum, so when
  /// one makes the guard fail the operands are scanned before giving up:
  /// bounds grow by the weights' row sums from call to call, and a ReLU6
  /// (at most 6) or a scan starts them afresh. Without the known bounds,
  /// MobileNetV2's scans of every input cost it 4.7% at batch 8.
  struct Guard {
    size_t end = 0;            // post-ops [0, end) see no NaN; 0: nothing to guard
    bool boundsResult = false; // every post-op passes a bound on (postOpRange)
    LibraryCall exactCall;     // the call up to the host's tail
    std::vector<PostOp> hostTail;  // relus and clips after the first clip
    std::vector<bool> constantBuffers;
    std::unique_ptr<Impl> exact;   // made on the first run that needs it
    /// Bounds of constant buffers by address: max|v| (x, bias, tensors) or
    /// the weights' largest row or column sum.
    std::map<std::pair<int, const void*>, double> constantBounds;
    int64_t guardedRuns = 0, exactRuns = 0;
    /// The reduction length of one result element, for the rounding slack
    /// of the result's bound.
    int64_t reduction = 1;

    /// How bounds are found for one pass over the call: `known` (a bound
    /// per buffer, negative where unknown; may be empty), whether buffers
    /// without one may be scanned, and whether a known bound was used.
    struct Sources {
      std::span<const double> known;
      bool scan = true;
      bool usedKnown = false;
    };
    /// An interval holding every value (in exact arithmetic); a relu or
    /// ReLU6 after a sum bounds it on one side.
    struct Range {
      double lo = 0, hi = 0;
      double magnitude() const { return std::max(std::fabs(lo), std::fabs(hi)); }
      static Range unbounded() {
        return {-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
      }
    };
    /// The running value's range after post-ops [0, upTo) of `call`,
    /// unbounded when an operand is not finite or has no bound.
    Range chainRange(const LibraryCall& call, void* const* buffers, Sources& from, size_t upTo);
    /// `r`, the range before post-op `p`, after it (unbounded where it makes
    /// no bound: exp, log, sqrt, division, binary max and min).
    Range postOpRange(const PostOp& p, Range r, void* const* buffers, Sources& from);
    /// Buffer `buffer`'s max|v| over `elements` floats.
    double magnitude(int buffer, int64_t elements, void* const* buffers, Sources& from);
    /// Buffer `buffer`'s bound from `compute`, cached for a constant, or
    /// +inf for a buffer that may not be scanned.
    template <typename Compute>
    double cached(int buffer, void* const* buffers, const Sources& from, Compute compute);
  };
  std::unique_ptr<Guard> guard;
  LibraryCall call;  // a guarded call's, for the guard
};

/// Far enough below FLT_MAX (2^128) that a bound below it proves every
/// partial sum finite, rounding included.
constexpr double kGuardLimit = 0x1p124;

template <typename Compute>
double DnnlKernel::Impl::Guard::cached(int buffer, void* const* buffers, const Sources& from, Compute compute) {
  const void* data = buffers[buffer];
  if (buffer >= static_cast<int>(constantBuffers.size()) || !constantBuffers[buffer])
    return from.scan ? compute(data) : std::numeric_limits<double>::infinity();
  const auto key = std::make_pair(buffer, data);
  if (auto it = constantBounds.find(key); it != constantBounds.end()) return it->second;
  return constantBounds[key] = compute(data);
}

double DnnlKernel::Impl::Guard::magnitude(int buffer, int64_t elements, void* const* buffers, Sources& from) {
  if (static_cast<size_t>(buffer) < from.known.size() && from.known[static_cast<size_t>(buffer)] >= 0) {
    from.usedKnown = true;
    return from.known[static_cast<size_t>(buffer)];
  }
  return cached(buffer, buffers, from, [&](const void* data) {
    return static_cast<double>(maxMagnitude(static_cast<const float*>(data), elements));
  });
}

DnnlKernel::Impl::Guard::Range DnnlKernel::Impl::Guard::postOpRange(const PostOp& p, Range r, void* const* buffers,
                                                                    Sources& from) {
  const double m = r.magnitude();
  switch (p.kind) {
    case PostOp::Kind::Relu: return {std::max(r.lo, 0.0), std::max(r.hi, 0.0)};
    case PostOp::Kind::Clip: {
      auto clamp = [&](double v) {
        return std::min(std::max(v, static_cast<double>(p.alpha)), static_cast<double>(p.beta));
      };
      return {clamp(r.lo), clamp(r.hi)};
    }
    case PostOp::Kind::Linear: {
      const double a = p.alpha * r.lo + p.beta, b = p.alpha * r.hi + p.beta;
      return {std::min(a, b), std::max(a, b)};
    }
    case PostOp::Kind::Add:
    case PostOp::Kind::Sub: {
      const double t = magnitude(p.operand, elementCount(p.dims), buffers, from);
      return {r.lo - t, r.hi + t};
    }
    case PostOp::Kind::Mul: {
      const double t = m * magnitude(p.operand, elementCount(p.dims), buffers, from);
      return {-t, t};
    }
    case PostOp::Kind::Abs: return {r.lo >= 0 ? r.lo : 0.0, m};
    case PostOp::Kind::Tanh: return {-1, 1};
    case PostOp::Kind::Sigmoid: return {0, 1};
    case PostOp::Kind::Swish:     // |x * sigmoid(x)| <= |x|
    case PostOp::Kind::GeluTanh:  // |x * (1 + tanh(...)) / 2| <= |x|
      return {-m, m};
    default: return {-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  }
}

DnnlKernel::Impl::Guard::Range DnnlKernel::Impl::Guard::chainRange(const LibraryCall& call, void* const* buffers,
                                                                   Sources& from, size_t upTo) {
  const std::vector<int64_t>& wDims = call.operandDims[1];
  const double weights = cached(call.operands[1], buffers, from, [&](const void* data) {
    const float* w = static_cast<const float*>(data);
    if (call.kind == LibraryCall::Kind::Conv) return maxRowMagnitudeSum(w, wDims[0], elementCount(wDims) / wDims[0]);
    // A matmul's b: [K] (a column) or [..., K, N].
    if (wDims.size() == 1) return maxColumnMagnitudeSum(w, 1, wDims[0], 1);
    const int64_t k = wDims[wDims.size() - 2], n = wDims.back();
    // Stored transposed, [..., N, K]: a result column's weights are a row.
    if (call.transposedB) return maxRowMagnitudeSum(w, elementCount(wDims) / k, k);
    return maxColumnMagnitudeSum(w, elementCount(wDims) / (k * n), k, n);
  });
  if (!(weights <= kGuardLimit)) return Range::unbounded();
  const double x = magnitude(call.operands[0], elementCount(call.operandDims[0]), buffers, from);
  if (!(x <= kGuardLimit)) return Range::unbounded();
  double b = x * weights;
  if (call.kind == LibraryCall::Kind::Conv && call.operands.size() > 2)
    b += magnitude(call.operands[2], elementCount(call.operandDims[2]), buffers, from);
  Range r{-b, b};
  for (size_t i = 0; i < upTo && r.magnitude() <= kGuardLimit; ++i) r = postOpRange(call.postOps[i], r, buffers, from);
  return r.magnitude() <= kGuardLimit ? r : Range::unbounded();
}

/// Sets to NaN the result elements whose window has a NaN or infinite
/// weight on a tap in the padding: that tap is 0 * w = NaN in the IR's
/// conv. The post-ops oneDNN applied (DnnlKernel::exactPostOp's: relu as
/// elu, tanh, sigmoid, exp, log, sums and products with a tensor, ...) all
/// keep a NaN a NaN, so the final value is NaN too. Scans the weights only
/// (all finite: nothing to do) unless one is not finite.
void DnnlKernel::Impl::fixPaddedTaps(void* const* buffers) {
  PaddedTaps& p = *paddedTaps;
  const void* w = buffers[p.weightBuffer];
  if (p.constantWeights && p.finiteAt == w) return;
  // An exponent of all ones is an infinity or a NaN.
  auto nonFiniteAt = [&](int64_t i) {
    if (p.weightType == DType::F32) {
      uint32_t bits;
      std::memcpy(&bits, static_cast<const float*>(w) + i, sizeof bits);
      return (bits & 0x7f800000u) == 0x7f800000u;
    }
    uint16_t bits;
    std::memcpy(&bits, static_cast<const uint16_t*>(w) + i, sizeof bits);
    const uint16_t exponent = p.weightType == DType::BF16 ? 0x7f80u : 0x7c00u;
    return (bits & exponent) == exponent;
  };
  const int64_t outChannels = p.weightDims[0], groupIn = p.weightDims[1];
  const size_t k = p.inDims.size();
  int64_t taps = 1;
  for (size_t d = 0; d < k; ++d) taps *= p.weightDims[2 + d];
  // The common case in one pass over the weights in memory order.
  const int64_t count = outChannels * groupIn * taps;
  bool nonFinite = false;
  for (int64_t i = 0; i < count; ++i) nonFinite = nonFiniteAt(i) || nonFinite;
  if (!nonFinite) {
    if (p.constantWeights) p.finiteAt = w;
    return;
  }
  // Per output channel, the taps with a non-finite weight in any channel
  // (the scan above found at least one).
  std::vector<std::vector<int64_t>> bad(static_cast<size_t>(outChannels));
  for (int64_t m = 0; m < outChannels; ++m)
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t c = 0; c < groupIn; ++c)
        if (nonFiniteAt((m * groupIn + c) * taps + t)) {
          bad[static_cast<size_t>(m)].push_back(t);
          break;
        }
  // The result element `i` set to NaN, in the result's type.
  auto setNaN = [&](int64_t i) {
    if (p.resultType == DType::F32) {
      static_cast<float*>(buffers[p.resultBuffer])[i] = std::numeric_limits<float>::quiet_NaN();
      return;
    }
    static_cast<uint16_t*>(buffers[p.resultBuffer])[i] = p.resultType == DType::BF16 ? 0x7fc0 : 0x7e00;
  };
  int64_t outSize = 1;
  for (int64_t d : p.outDims) outSize *= d;
  std::vector<int64_t> outIndex(k), tapIndex(k);
  for (int64_t o = 0; o < outSize; ++o) {
    for (size_t d = k, rest = static_cast<size_t>(o); d-- > 0;) {
      outIndex[d] = static_cast<int64_t>(rest) % p.outDims[d];
      rest /= static_cast<size_t>(p.outDims[d]);
    }
    for (int64_t m = 0; m < outChannels; ++m) {
      bool padded = false;
      for (int64_t t : bad[static_cast<size_t>(m)]) {
        for (size_t d = k, rest = static_cast<size_t>(t); d-- > 0;) {
          tapIndex[d] = static_cast<int64_t>(rest) % p.weightDims[2 + d];
          rest /= static_cast<size_t>(p.weightDims[2 + d]);
        }
        for (size_t d = 0; d < k && !padded; ++d) {
          const int64_t pos = outIndex[d] * p.strides[d] - p.padBegin[d] + tapIndex[d] * p.dilations[d];
          padded = pos < 0 || pos >= p.inDims[d];
        }
        if (padded) break;
      }
      if (!padded) continue;
      for (int64_t n = 0; n < p.batch; ++n)
        setNaN(p.channelsLast ? (n * outSize + o) * outChannels + m : (n * outChannels + m) * outSize + o);
    }
  }
}

DnnlKernel::DnnlKernel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DnnlKernel::~DnnlKernel() = default;

const std::string& DnnlKernel::description() const { return impl_->description; }
int64_t DnnlKernel::work() const { return impl_->work; }

namespace {

/// Builds `call`'s primitive descriptor into `impl` (description, work,
/// bindings) and, unless `describeOnly`, the primitive and its reorder
/// memory. Returns the implementation oneDNN chose.
Expected<std::string> build(const LibraryCall& call, const std::vector<bool>& constantBuffers, bool describeOnly,
                            DnnlKernel::Impl& impl, Variant variant);

/// `call` as its exact variant computes it on oneDNN: without the clip
/// and what follows it (the host's tail).
LibraryCall exactPart(const LibraryCall& call) {
  LibraryCall exact = call;
  exact.postOps.resize(hostTailBegin(call));
  return exact;
}

/// Builds the variant of `call` that runs by default into `impl`, and
/// checks (describing it only) that the exact variant a guard falls back
/// to builds too. Returns the implementation oneDNN chose.
Expected<std::string> buildBoth(const LibraryCall& call, const std::vector<bool>& constantBuffers, bool describeOnly,
                                DnnlKernel::Impl& impl) {
  if (!guardEnd(call)) {
    if (hostTailBegin(call) != call.postOps.size()) return Error("a clip post-op without a guard");
    return build(call, constantBuffers, describeOnly, impl, Variant::Exact);
  }
  DnnlKernel::Impl exact;
  auto exactImpl = build(exactPart(call), constantBuffers, /*describeOnly=*/true, exact, Variant::Exact);
  if (!exactImpl) return exactImpl.takeError();
  auto chosen = build(call, constantBuffers, describeOnly, impl, Variant::Guarded);
  if (!chosen) return chosen;
  impl.description += " guarded";
  return chosen;
}

}  // namespace

Expected<std::unique_ptr<DnnlKernel>> DnnlKernel::create(const LibraryCall& call,
                                                         const std::vector<bool>& constantBuffers) {
  auto impl = std::make_unique<Impl>();
  auto chosen = buildBoth(call, constantBuffers, /*describeOnly=*/false, *impl);
  if (!chosen) return chosen.takeError();
  const size_t end = guardEnd(call);
  if (end || boundsResult(call)) {
    for (const PostOp& p : std::span(call.postOps).subspan(hostTailBegin(call)))
      if (p.kind != PostOp::Kind::Relu && p.kind != PostOp::Kind::Clip)
        return Error("a '" + p.name + "' post-op after a clip, which the host applies");
    auto guard = std::make_unique<Impl::Guard>();
    guard->end = end;
    guard->boundsResult = boundsResult(call);
    guard->exactCall = exactPart(call);
    guard->hostTail.assign(call.postOps.begin() + static_cast<std::ptrdiff_t>(hostTailBegin(call)), call.postOps.end());
    guard->constantBuffers = constantBuffers;
    const std::vector<int64_t>& w = call.operandDims[1];
    guard->reduction = call.kind == LibraryCall::Kind::Conv ? elementCount(w) / w[0]
                                                            : w[w.size() >= 2 ? w.size() - 2 : 0];
    impl->guard = std::move(guard);
    impl->call = call;
  }
  return std::unique_ptr<DnnlKernel>(new DnnlKernel(std::move(impl)));
}

Status DnnlKernel::exactCall(const LibraryCall& call) {
  const size_t tail = hostTailBegin(call);
  for (size_t i = 0; i < call.postOps.size(); ++i) {
    const PostOp& p = call.postOps[i];
    if (i < tail) {
      if (Status exact = exactPostOp(p); !exact) return exact;
      continue;
    }
    // The clip and what follows it run on the host in the exact variant.
    if (!guardEnd(call)) return exactPostOp(p);
    if (p.kind != PostOp::Kind::Relu && p.kind != PostOp::Kind::Clip)
      return Error("a '" + p.name + "' post-op after a clip, which only relus and clips may follow");
  }
  return Status::success();
}

int64_t DnnlKernel::guardedRuns() const { return impl_->guard ? impl_->guard->guardedRuns : 0; }
int64_t DnnlKernel::exactRuns() const { return impl_->guard ? impl_->guard->exactRuns : 0; }

Status DnnlKernel::exactPostOp(const PostOp& p) {
  // What each is was measured with NaN, +-inf, +-0, denormals and large
  // values through matmul and convolution post-ops on the avx512, avx2 and
  // sse41 kernels (test/unit/PostOpSpecialValuesTest.cpp keeps checking).
  switch (p.kind) {
    case PostOp::Kind::Relu:  // elu and an add (eltwiseEntries)
    case PostOp::Kind::Tanh:
    case PostOp::Kind::Sigmoid:
    case PostOp::Kind::Abs:
    case PostOp::Kind::Sqrt:
    case PostOp::Kind::GeluTanh:
    case PostOp::Kind::Swish:
    case PostOp::Kind::Add:
    case PostOp::Kind::Sub:
    case PostOp::Kind::Mul:
    case PostOp::Kind::Div: return Status::success();
    case PostOp::Kind::Linear: {
      // One fma, alpha * x + beta: exact for x * alpha (beta -0) and
      // x + beta (alpha 1). oneDNN's primitive cache takes -0 and +0 for
      // equal, so of the two linears that differ in the sign of a zero beta
      // only one may ever be made: +0 with alpha 1 (x + 0, and relu's add),
      // -0 with any other alpha (a product).
      const bool zeroBeta = p.beta == 0;
      if (zeroBeta && std::signbit(p.beta) != (p.alpha != 1))
        return Error("a linear post-op " + std::to_string(p.alpha) + " * x " + (std::signbit(p.beta) ? "- 0" : "+ 0") +
                     " would share oneDNN's cached kernel with the other sign of zero");
      return Status::success();
    }
    case PostOp::Kind::Exp: return Error("oneDNN's exp turns NaN into +inf");
    case PostOp::Kind::Log: return Error("oneDNN's log of a denormal is log(FLT_MIN) (-88 for 1e-40, not -92)");
    case PostOp::Kind::GeluErf:
      return Error("oneDNN's erf GELU of +inf is NaN, and of x from about -8 to -6 -0 where the IR's is a tiny "
                   "negative number");
    case PostOp::Kind::Clip: return Error("oneDNN's clip turns NaN into its lower bound and +-inf into its bounds");
    case PostOp::Kind::Max:
    case PostOp::Kind::Min:
      return Error("oneDNN's binary max and min give the operand where the running value is NaN");
  }
  return Error("an unknown post-op");
}

Expected<std::string> DnnlKernel::implementation(const LibraryCall& call) {
  Impl impl;
  return buildBoth(call, {}, /*describeOnly=*/true, impl);
}

Expected<std::string> DnnlKernel::describe(const LibraryCall& call) {
  Impl impl;
  auto chosen = buildBoth(call, {}, /*describeOnly=*/true, impl);
  if (!chosen) return chosen.takeError();
  return impl.description;
}

namespace {

/// Argument `arg` of `impl`'s primitive on the call's buffer `buffer`: bound
/// to it as it is when the primitive uses the plain layout (and nullopt),
/// else to memory of the kernel's own in the layout the primitive chose, and
/// the reorder between the two, whose primitive the caller makes.
std::optional<DnnlKernel::Impl::Reorder> bindOrReorder(DnnlKernel::Impl& impl, int arg, const memory::desc& plain,
                                                       const memory::desc& chosen, int buffer) {
  if (chosen == plain) {
    impl.args[arg] = memory(plain, cpuEngine(), DNNL_MEMORY_NONE);
    impl.bindings.push_back({arg, buffer});
    return std::nullopt;
  }
  DnnlKernel::Impl::Reorder r;
  r.plain = memory(plain, cpuEngine(), DNNL_MEMORY_NONE);
  r.blocked = memory(chosen, cpuEngine());
  r.buffer = buffer;
  impl.args[arg] = r.blocked;
  return r;
}

/// Gives argument `arg` of `impl`'s primitive the call's buffer `buffer`,
/// reordered on each run (on the first only, for a constant) when the
/// primitive chose another layout.
void bindInput(DnnlKernel::Impl& impl, int arg, const memory::desc& plain, const memory::desc& chosen, int buffer,
               bool constant = false) {
  std::optional<DnnlKernel::Impl::Reorder> r = bindOrReorder(impl, arg, plain, chosen, buffer);
  if (!r) return;
  r->primitive = dnnl::reorder(r->plain, r->blocked);
  r->constant = constant;
  impl.inputReorders.push_back(std::move(*r));
}

/// Binds the primitive's result `arg` to buffer `buffer`, reordered into it
/// after each run when the primitive chose another layout.
void bindOutput(DnnlKernel::Impl& impl, int arg, const memory::desc& plain, const memory::desc& chosen, int buffer) {
  std::optional<DnnlKernel::Impl::Reorder> r = bindOrReorder(impl, arg, plain, chosen, buffer);
  if (!r) return;
  r->primitive = dnnl::reorder(r->blocked, r->plain);
  impl.outputReorders.push_back(std::move(*r));
}

Expected<std::string> build(const LibraryCall& call, const std::vector<bool>& constantBuffers, bool describeOnly,
                            DnnlKernel::Impl& implRef, Variant variant) {
  DnnlKernel::Impl* impl = &implRef;
  using Impl = DnnlKernel::Impl;
  if (call.operands.size() < 2 || call.operandDims.size() != call.operands.size())
    return Error("a library call needs two operands and their dims");
  for (const std::vector<int64_t>& dims : call.operandDims)
    if (numElements(staticShape(dims)) == 0) return Error("an empty operand");
  const std::vector<int>& operandBuffer = call.operands;
  const int resultBuffer = call.resultBuffer;
  const std::vector<PostOp>& postOps = call.postOps;
  dnnl::engine& engine = cpuEngine();
  const memory::dims dstDims(call.resultDims.begin(), call.resultDims.end());
  if (call.channelsLast && call.kind != LibraryCall::Kind::Conv)
    return Error("only convolutions are stored channels last");
  if (call.transposedB && (call.kind != LibraryCall::Kind::MatMul || call.operandDims[1].size() < 2))
    return Error("only a matmul's b of 2 or more dims is stored transposed");
  if (call.transposedA && (call.kind != LibraryCall::Kind::MatMul || call.operandDims[0].size() < 2))
    return Error("only a matmul's a of 2 or more dims is stored transposed");
  if (call.transposedA && call.quantized()) return Error("a quantized matmul's a is not stored transposed");
  // Element types: all f32; an int8 call's u8/s8 x and result, s8
  // weights and s32 bias; or a mixed-precision call's bf16 or f16 operands
  // (the bias too) and f32 result.
  const bool quantized = call.quantized();
  const memory::data_type xType = dnnlType(call.srcType), yType = dnnlType(call.dstType);
  const memory::data_type wType = quantized ? memory::data_type::s8 : xType;
  const memory::data_type biasType = quantized ? memory::data_type::s32 : xType;
  if (quantized) {
    if (call.kind != LibraryCall::Kind::MatMul && call.kind != LibraryCall::Kind::Conv)
      return Error("only matmuls and convolutions are quantized");
    if (call.dstType == DType::F32 || call.scales.empty())
      return Error("a quantized call needs an int8 result and scales");
    for (const PostOp& p : postOps)
      if (p.kind != PostOp::Kind::Relu) return Error("a quantized call takes relu as its only post-op");
  }
  // A tensor post-op operand is stored as the result is.
  auto operandDesc = [&](const memory::dims& dims, memory::data_type type = memory::data_type::f32) {
    return call.channelsLast ? channelsLastDesc(dims, type) : plainDesc(dims, type);
  };
  // A matmul whose b has no batch (every leading dim 1) multiplies each of
  // a's rows alike: [B..., M, K] x [K, N] is [B*M, K] x [K, N] on the same
  // memory, one GEMM instead of a batch of small ones (an LSTM's input
  // projection, 64 x [1,512]x[512,1024], ran at 33 GFLOP/s batched). Each
  // tensor post-op operand must then read as [1, N] or [B*M, N] too.
  // (An a stored transposed, [B..., K, M], has no such rows.)
  int64_t rows = 0;  // B*M when collapsed, else 0
  if (call.kind == LibraryCall::Kind::MatMul && !call.transposedA && call.operandDims[0].size() > 2 &&
      call.operandDims[1].size() <= call.operandDims[0].size() && dstDims.size() == call.operandDims[0].size()) {
    const std::vector<int64_t>& a = call.operandDims[0];
    const std::vector<int64_t>& b = call.operandDims[1];
    const bool bUnbatched = b.size() < 2 || std::all_of(b.begin(), b.end() - 2, [](int64_t d) { return d == 1; });
    int64_t batch = 1;
    for (size_t i = 0; i + 2 < a.size(); ++i) batch *= a[i];
    if (bUnbatched && b.size() >= 2) rows = batch * a[a.size() - 2];
    for (const PostOp& p : postOps) {
      if (!rows || !p.isBinary()) continue;
      const bool broadcastRows = std::all_of(p.dims.begin(), p.dims.end() - 1, [](int64_t d) { return d == 1; });
      const bool fullRows = std::equal(p.dims.begin(), p.dims.end() - 1, dstDims.begin());
      if (!broadcastRows && !fullRows) rows = 0;
    }
  }
  auto postOpDesc = [&](const std::vector<int64_t>& dims) {
    if (!rows) return operandDesc(dims);
    const bool broadcastRows = std::all_of(dims.begin(), dims.end() - 1, [](int64_t d) { return d == 1; });
    return plainDesc({broadcastRows ? 1 : rows, dims.back()});
  };
  std::string chosenImpl;
  try {
    // `anyOps`, tried first by a convolution stored channels first, are
    // `ops` but for a binary post-op's operand the size of the result (a
    // residual add), whose layout oneDNN chooses: its kernels for a blocked
    // result take only such an operand in the result's layout (3.x has
    // only its reference kernel for a plain one, where 2.6 had its jit
    // ones), so the operand is reordered into it, as x is.
    dnnl::post_ops ops, anyOps;
    const bool channelsFirstConv =
        (call.kind == LibraryCall::Kind::Conv || call.kind == LibraryCall::Kind::ConvTranspose) && !call.channelsLast;
    bool anyOperand = false;
    std::string postText;
    // oneDNN's index of each post-op (a relu is two of oneDNN's), and the
    // eltwise entries so far, for the check below.
    std::vector<int> dnnlIndex;
    std::vector<EltwiseEntry> eltwise;
    if (quantized) {
      // The requantization (ContractionKernels.cpp) is (accumulator + bias)
      // times the channel's scale, then relu, then the zero point. oneDNN
      // 3.x adds the bias after its weight scales (acc * s + bias), so the
      // scales are not weight scales but the first post-op, a product with
      // one scale per output channel (dim 1 of a convolution's result, of a
      // matmul's 2-d one): (acc + bias) * s, rounded once, as oneDNN 2.6's
      // output scales did.
      const int64_t channels = call.kind == LibraryCall::Kind::MatMul ? dstDims.back() : dstDims[1];
      if (static_cast<int64_t>(call.scales.size()) != channels)
        return Error("a quantized call has " + std::to_string(call.scales.size()) + " scales for " +
                     std::to_string(channels) + " output channels");
      memory::dims scaleDims(call.kind == LibraryCall::Kind::MatMul ? 2 : dstDims.size(), 1);
      scaleDims[1] = channels;
      const memory::desc scalesMd = plainDesc(scaleDims);
      ops.append_binary(algorithm::binary_mul, scalesMd);
      anyOps.append_binary(algorithm::binary_mul, scalesMd);
      memory scales(scalesMd, engine);
      std::memcpy(scales.get_data_handle(), call.scales.data(), call.scales.size() * sizeof(float));
      impl->args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = scales;
    }
    for (const PostOp& p : postOps) {
      dnnlIndex.push_back(ops.len());
      if (p.isBinary()) {
        if (p.dims.size() != dstDims.size()) return Error("a binary post-op's operand is not aligned to the result");
        ops.append_binary(binaryAlgorithm(p.kind), postOpDesc(p.dims));
        const bool whole = channelsFirstConv && std::equal(p.dims.begin(), p.dims.end(), dstDims.begin());
        anyOps.append_binary(binaryAlgorithm(p.kind),
                             whole ? memory::desc(p.dims, memory::data_type::f32, memory::format_tag::any)
                                   : postOpDesc(p.dims));
        anyOperand = anyOperand || whole;
      } else {
        for (const EltwiseEntry& e : eltwiseEntries(p, quantized, variant)) {
          // oneDNN 2.6 gave every eltwise post-op of one algorithm the
          // parameters of the first (a conv + mul 0.5 + add 3 computed
          // y * 0.25; 3.2 computes it right), and its primitive cache takes
          // -0 and +0 for equal (3.2's too: equal_with_nan).
          for (const EltwiseEntry& q : eltwise)
            if (q.alg == e.alg && !sameBits(q, e))
              return Error("a second '" + p.name + "' post-op with other parameters than an earlier one");
          eltwise.push_back(e);
          ops.append_eltwise(e.alg, e.alpha, e.beta);
          anyOps.append_eltwise(e.alg, e.alpha, e.beta);
        }
      }
      postText += (postText.empty() ? " + " : ", ") + p.name;
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    if (quantized) {
      // One zero point per tensor, given as an argument of each run (oneDNN
      // 3.x takes no zero point when the primitive is made).
      auto zeroPoint = [&](int arg, int32_t value) {
        if (value == 0) return;
        attr.set_zero_points_mask(arg, 0);
        memory zp(memory::desc({1}, memory::data_type::s32, memory::format_tag::a), engine);
        *static_cast<int32_t*>(zp.get_data_handle()) = value;
        impl->args[DNNL_ARG_ATTR_ZERO_POINTS | arg] = zp;
      };
      zeroPoint(DNNL_ARG_SRC, call.srcZeroPoint);
      zeroPoint(DNNL_ARG_DST, call.dstZeroPoint);
      postText = " requantized" + std::string(postOps.empty() ? "" : " + relu");
    }
    // The same attributes (a quantized call has no binary post-op but its
    // scales), unless an operand's layout is oneDNN's to choose.
    dnnl::primitive_attr anyAttr = attr;
    if (anyOperand) {
      anyAttr = dnnl::primitive_attr();
      anyAttr.set_post_ops(anyOps);
    }
    // The chosen layouts of the binary post-ops' operands (a convolution's).
    std::vector<memory::desc> postOpOperands;

    if (call.kind == LibraryCall::Kind::MatMul) {
      std::vector<int64_t> a = call.operandDims[0], b = call.operandDims[1];
      // 1-D operands: a row [1,K] and a column [K,1]; the result's memory is
      // the same with or without the unit dim.
      if (a.size() == 1) a.insert(a.begin(), 1);
      if (b.size() == 1) b.push_back(1);
      if (rows) {
        a = {rows, a.back()};
        b = {b[b.size() - 2], b.back()};
      }
      const size_t rank = std::max(a.size(), b.size());
      const memory::dims ad = alignTo(a, rank).value(), bd = alignTo(b, rank).value();
      memory::dims cd(rank);
      for (size_t i = 0; i + 2 < rank; ++i) cd[i] = std::max(ad[i], bd[i]);
      cd[rank - 2] = ad[rank - 2];
      cd[rank - 1] = bd[rank - 1];
      // Post-op operands are aligned to the result's own rank; with 1-D
      // operands that differs from the matmul's, so none are allowed then.
      if (!postOps.empty() && cd.size() != dstDims.size() && !rows)
        return Error("post-ops on a matmul of 1-D operands");
      // Output scales per column need the 2-d result that an int8 matmul
      // (b of [K, N]) always has once a's rows are collapsed.
      if (quantized && cd.size() != 2) return Error("a quantized matmul of a batched b");
      // An a or b stored transposed is read through its strides: oneDNN's
      // GEMMs take either order (a weight's gradient dy^T x reads dy in
      // place), and a constant b is packed from it once below.
      const memory::desc amd = call.transposedA ? transposedDesc(ad, xType) : plainDesc(ad, xType);
      const memory::desc cmd = plainDesc(cd, yType);
      const memory::desc bmd = call.transposedB ? transposedDesc(bd, wType) : plainDesc(bd, wType);
      const bool matmulBias = quantized && call.operands.size() > 2;
      const memory::desc biasMd = matmulBias ? plainDesc({1, cd.back()}, biasType) : memory::desc();
      // A constant b without a batch is packed once in the layout oneDNN
      // picks, one copy per source shared by every kernel that multiplies by
      // it (an unrolled recurrent net's steps). An LSTM classifier's input
      // projections at batch 1, [64,512]x[512,1024] + add on 2 threads: 186
      // us with the plain b, 133 us packed. (Packing per primitive, without
      // sharing, made that classifier slower: 7.3-7.8 vs 6.8-7.0 ms, each of
      // its 256 steps reading its own copy of R^T.)
      const bool packB = operandBuffer[1] < static_cast<int>(constantBuffers.size()) &&
                         constantBuffers[operandBuffer[1]] && bd.size() == 2;
      const memory::desc anyB = packB ? memory::desc(bd, wType, memory::format_tag::any) : bmd;
      dnnl::matmul::primitive_desc pd(engine, amd, anyB, biasMd, cmd, attr);
      chosenImpl = pd.impl_info_str();
      impl->work = libraryCallWork(call);
      impl->description = std::string(quantized ? "onednn int8 matmul " : "onednn matmul ") + dimsText(ad) + "x" +
                          dimsText(bd) + postText + " (" + chosenImpl +
                          (call.transposedA ? ", a stored transposed" : "") +
                          (call.transposedB ? ", b stored transposed" : "") +
                          (pd.weights_desc() != bmd ? ", packed b" : "") + ")";
      if (describeOnly) return chosenImpl;
      impl->primitive = dnnl::matmul(pd);
      impl->args[DNNL_ARG_SRC] = memory(amd, engine, DNNL_MEMORY_NONE);
      impl->args[DNNL_ARG_DST] = memory(cmd, engine, DNNL_MEMORY_NONE);
      impl->bindings = {{DNNL_ARG_SRC, operandBuffer[0]}, {DNNL_ARG_DST, resultBuffer}};
      if (matmulBias) {
        impl->args[DNNL_ARG_BIAS] = memory(biasMd, engine, DNNL_MEMORY_NONE);
        impl->bindings.push_back({DNNL_ARG_BIAS, operandBuffer[2]});
      }
      if (pd.weights_desc() == bmd) {
        impl->args[DNNL_ARG_WEIGHTS] = memory(bmd, engine, DNNL_MEMORY_NONE);
        impl->bindings.push_back({DNNL_ARG_WEIGHTS, operandBuffer[1]});
      } else {
        Impl::Reorder r;
        r.plain = memory(bmd, engine, DNNL_MEMORY_NONE);
        r.blocked = memory(pd.weights_desc(), engine, DNNL_MEMORY_NONE);
        r.primitive = dnnl::reorder(r.plain, r.blocked);
        r.buffer = operandBuffer[1];
        r.constant = r.shared = true;
        r.argument = DNNL_ARG_WEIGHTS;
        impl->inputReorders.push_back(std::move(r));
      }
    } else if (call.kind == LibraryCall::Kind::ConvWeightGrad) {
      // oneDNN's backward-weights convolution: dw from x (src) and dy
      // (diff_dst), in layouts of its choosing with reorders, as a
      // convolution's.
      if (!postOps.empty()) return Error("a convolution's weight gradient takes no post-ops");
      const std::vector<int64_t>& x = call.operandDims[0];
      const std::vector<int64_t>& dy = call.operandDims[1];
      if (x.size() < 3 || x.size() > 5 || dy.size() != x.size() || dstDims.size() != x.size())
        return Error("oneDNN convolutions are 1-, 2- or 3-d");
      const size_t k = x.size() - 2;
      const int64_t groups = call.groups;
      if (call.strides.size() != k || call.dilations.size() != k || call.pads.size() != 2 * k || groups < 1)
        return Error("a convolution's attributes do not match its rank");
      memory::dims dnnlDilations, padL, padR;
      for (size_t d = 0; d < k; ++d) {
        dnnlDilations.push_back(call.dilations[d] - 1);
        padL.push_back(call.pads[d]);
        padR.push_back(call.pads[k + d]);
      }
      // The gradient's [M, C/g, K...] read as [g, M/g, C/g, K...], the same memory.
      memory::dims wd = dstDims;
      if (groups > 1) {
        wd.insert(wd.begin(), groups);
        wd[1] /= groups;
      }
      const memory::desc xmd = plainDesc(x, xType), dymd = plainDesc(dy, xType), wmd = plainDesc(wd, yType);
      const memory::dims strideDims(call.strides.begin(), call.strides.end());
      auto describe = [&](const memory::desc& src, const memory::desc& weights, const memory::desc& dst)
          -> dnnl::convolution_backward_weights::primitive_desc {
        dnnl::convolution_forward::primitive_desc hint(engine, dnnl::prop_kind::forward_training,
                                                       algorithm::convolution_direct, src, weights, dst, strideDims,
                                                       dnnlDilations, padL, padR);
        return dnnl::convolution_backward_weights::primitive_desc(engine, algorithm::convolution_direct, src, weights,
                                                                  dst, strideDims, dnnlDilations, padL, padR, hint);
      };
      std::optional<dnnl::convolution_backward_weights::primitive_desc> pd;
      try {
        pd.emplace(describe(memory::desc(x, xType, memory::format_tag::any),
                            memory::desc(wd, yType, memory::format_tag::any),
                            memory::desc(dy, xType, memory::format_tag::any)));
      } catch (const dnnl::error&) {
        pd.reset();
      }
      if (!pd) pd.emplace(describe(xmd, wmd, dymd));
      chosenImpl = pd->impl_info_str();
      impl->work = libraryCallWork(call);
      const bool blocked = pd->src_desc() != xmd || pd->diff_dst_desc() != dymd || pd->diff_weights_desc() != wmd;
      impl->description = "onednn conv_weight_grad " + dimsText(x) + "*" + dimsText(dy) + " -> " + dimsText(wd) +
                          " (" + chosenImpl + (blocked ? ", blocked" : "") + ")";
      if (describeOnly) return chosenImpl;
      impl->primitive = dnnl::convolution_backward_weights(*pd);
      bindInput(*impl, DNNL_ARG_SRC, xmd, pd->src_desc(), operandBuffer[0]);
      bindInput(*impl, DNNL_ARG_DIFF_DST, dymd, pd->diff_dst_desc(), operandBuffer[1]);
      bindOutput(*impl, DNNL_ARG_DIFF_WEIGHTS, wmd, pd->diff_weights_desc(), resultBuffer);
    } else {
      // Channels last: x and the result in oneDNN's logical order.
      std::vector<int64_t> x = call.operandDims[0];
      memory::dims logicalDst = dstDims;
      if (call.channelsLast && x.size() > 2) {
        std::rotate(x.begin() + 1, x.end() - 1, x.end());
        std::rotate(logicalDst.begin() + 1, logicalDst.end() - 1, logicalDst.end());
      }
      const std::vector<int64_t>& w = call.operandDims[1];
      if (x.size() < 3 || x.size() > 5) return Error("oneDNN convolutions are 1-, 2- or 3-d");
      const size_t k = x.size() - 2;
      const int64_t groups = call.groups;
      // conv_transpose (a conv's input gradient) is oneDNN's deconvolution.
      const bool transposed = call.kind == LibraryCall::Kind::ConvTranspose;
      const std::vector<int64_t>& strides = call.strides;
      const std::vector<int64_t>& dilations = call.dilations;
      const std::vector<int64_t>& pads = call.pads;
      const std::vector<int64_t> outputPadding = transposed ? call.outputPadding : std::vector<int64_t>(k);
      if (strides.size() != k || dilations.size() != k || pads.size() != 2 * k || outputPadding.size() != k ||
          groups < 1 || w.size() != x.size())
        return Error("a convolution's attributes do not match its rank");
      memory::dims dnnlDilations, padL, padR;
      for (size_t d = 0; d < k; ++d) {
        dnnlDilations.push_back(dilations[d] - 1);
        padL.push_back(pads[d]);
        // A deconvolution's output size counts the end padding less its
        // output_padding (ONNX ConvTranspose's extra rows at the end).
        padR.push_back(pads[k + d] - outputPadding[d]);
      }
      // Groups: conv weights [M, C/g, k...] read as [g, M/g, C/g, k...], the
      // same row-major memory. A deconvolution's weights are [C, M/g, k...]:
      // oneDNN's [M, C, k...] (or [g, M/g, C/g, k...]) with strides that
      // read Kiln's memory.
      const int64_t taps = numElements(staticShape(w)) / (w[0] * w[1]);
      const int64_t outChannels = transposed ? w[1] * groups : w[0];
      memory::dims wd(w.begin(), w.end());
      memory::desc wmd;
      if (!transposed) {
        if (groups > 1) {
          wd.insert(wd.begin(), groups);
          wd[1] /= groups;
        }
        wmd = plainDesc(wd, wType);
      } else {
        const int64_t groupIn = w[0] / groups, groupOut = w[1];
        wd = {groupOut, groupIn};
        memory::dims wStrides = {taps, groupOut * taps};
        for (size_t d = 0; d < k; ++d) {
          wd.push_back(w[2 + d]);
          int64_t inner = 1;
          for (size_t e = d + 1; e < k; ++e) inner *= w[2 + e];
          wStrides.push_back(inner);
        }
        if (groups > 1) {
          wd.insert(wd.begin(), groups);
          wStrides.insert(wStrides.begin(), groupIn * groupOut * taps);
        } else {
          wd[0] = outChannels;
        }
        wmd = memory::desc(wd, wType, wStrides);
      }
      if (quantized && (transposed || call.channelsLast)) return Error("a quantized convolution is a plain one");
      const memory::desc xmd =
          quantized ? plainDesc(call.operandDims[0], xType) : operandDesc(call.operandDims[0], xType);
      const memory::desc ymd = quantized ? plainDesc(dstDims, yType) : operandDesc(dstDims, yType);
      const bool hasBias = call.operands.size() > 2;
      const memory::desc bmd = hasBias ? plainDesc({outChannels}, biasType) : memory::desc();
      const memory::dims strideDims(strides.begin(), strides.end());
      // Layouts of oneDNN's choosing (blocked channels, for its direct
      // convolution kernels), with the input and output reordered, beat the
      // plain layouts (its gemm-based convolution) at batch 1 and 64 on the
      // CNN (docs/matmul.md); the plain ones remain for what it refuses.
      // Stored channels last (assign-layouts), x and the result keep their
      // layout, which oneDNN's brgemm convolutions read without a reorder,
      // and only the constant weights are reordered (once).
      const memory::desc anyX = call.channelsLast ? xmd : memory::desc(x, xType, memory::format_tag::any);
      const memory::desc anyW(wd, wType, memory::format_tag::any);
      const memory::desc anyY = call.channelsLast ? ymd : memory::desc(logicalDst, yType, memory::format_tag::any);
      auto choose = [&]<typename Primitive>(auto describe) {
        std::optional<typename Primitive::primitive_desc> pd;
        try {
          pd.emplace(describe(anyX, anyW, anyY, anyAttr));
        } catch (const dnnl::error&) {
          pd.reset();
        }
        if (!pd) pd.emplace(describe(xmd, wmd, ymd, attr));
        if (!describeOnly) impl->primitive = Primitive(*pd);
        ConvDescs chosen{pd->src_desc(), pd->weights_desc(), pd->dst_desc(), pd->impl_info_str(), {}};
        for (size_t i = 0; i < postOps.size(); ++i)
          chosen.postOpOperands.push_back(
              postOps[i].isBinary()
                  ? pd->query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_MULTIPLE_POST_OP(dnnlIndex[i]) | DNNL_ARG_SRC_1)
                  : memory::desc());
        return chosen;
      };
      ConvDescs chosen;
      if (transposed) {
        chosen = choose.template operator()<dnnl::deconvolution_forward>(
            [&](const memory::desc& src, const memory::desc& weights, const memory::desc& dst,
                const dnnl::primitive_attr& attributes) {
              return dnnl::deconvolution_forward::primitive_desc(
                  engine, dnnl::prop_kind::forward_inference, algorithm::deconvolution_direct, src, weights, bmd, dst,
                  strideDims, dnnlDilations, padL, padR, attributes);
            });
      } else {
        chosen = choose.template operator()<dnnl::convolution_forward>(
            [&](const memory::desc& src, const memory::desc& weights, const memory::desc& dst,
                const dnnl::primitive_attr& attributes) {
              return dnnl::convolution_forward::primitive_desc(
                  engine, dnnl::prop_kind::forward_inference, algorithm::convolution_direct, src, weights, bmd, dst,
                  strideDims, dnnlDilations, padL, padR, attributes);
            });
      }
      chosenImpl = chosen.impl;
      postOpOperands = chosen.postOpOperands;
      impl->work = libraryCallWork(call);
      const bool blocked = chosen.src != xmd || chosen.weights != wmd || chosen.dst != ymd;
      impl->description = std::string(transposed  ? "onednn deconv "
                                      : quantized ? "onednn int8 conv "
                                                  : "onednn conv ") +
                          dimsText(x) + "*" + dimsText(wd) + postText + " (" + chosen.impl +
                          (blocked ? ", blocked" : "") + (call.channelsLast ? ", channels last" : "") + ")";
      if (describeOnly) return chosenImpl;
      auto isConstant = [&](size_t operand) {
        const int buffer = operandBuffer[operand];
        return buffer < static_cast<int>(constantBuffers.size()) && constantBuffers[buffer];
      };
      bindInput(*impl, DNNL_ARG_SRC, xmd, chosen.src, operandBuffer[0], isConstant(0));
      bindInput(*impl, DNNL_ARG_WEIGHTS, wmd, chosen.weights, operandBuffer[1], isConstant(1));
      if (hasBias) {
        impl->args[DNNL_ARG_BIAS] = memory(bmd, engine, DNNL_MEMORY_NONE);
        impl->bindings.push_back({DNNL_ARG_BIAS, operandBuffer[2]});
      }
      bindOutput(*impl, DNNL_ARG_DST, ymd, chosen.dst, resultBuffer);
      if (!transposed && !quantized &&
          std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p > 0; })) {
        Impl::PaddedTaps p;
        p.weightDims = w;
        p.inDims.assign(x.begin() + 2, x.end());
        p.outDims.assign(logicalDst.begin() + 2, logicalDst.end());
        p.strides = strides;
        p.dilations = dilations;
        p.padBegin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(k));
        p.batch = logicalDst[0];
        p.channelsLast = call.channelsLast;
        p.weightBuffer = operandBuffer[1];
        p.resultBuffer = resultBuffer;
        p.constantWeights = isConstant(1);
        p.weightType = call.srcType;
        p.resultType = call.dstType;
        impl->paddedTaps = std::move(p);
      }
    }
    for (size_t i = 0; i < postOps.size(); ++i) {
      if (!postOps[i].isBinary()) continue;
      const int arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(dnnlIndex[i]) | DNNL_ARG_SRC_1;
      const memory::desc plain = postOpDesc(postOps[i].dims);
      const int buffer = postOps[i].operand;
      bindInput(*impl, arg, plain, postOpOperands.empty() ? plain : postOpOperands[i], buffer,
                buffer < static_cast<int>(constantBuffers.size()) && constantBuffers[buffer]);
    }
  } catch (const dnnl::error& e) {
    return Error(std::string("oneDNN refuses it: ") + e.what());
  }
  return chosenImpl;
}

}  // namespace

namespace {

/// The packed copies of constant matmul operands, by source address and
/// layout, for as long as a kernel holds one. A source cannot change while
/// a kernel holding its copy lives: the program owning the constant outlives
/// its kernels.
class PackedWeights {
 public:
  static PackedWeights& instance() {
    static PackedWeights weights;
    return weights;
  }
  /// The copy of `source` in `packed`'s layout, reordered by `reorder` (from
  /// `plain`) when nobody holds one.
  std::shared_ptr<const memory> get(const void* source, memory& plain, const memory& packed,
                                    const dnnl::reorder& reorder, dnnl::stream& stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Entry>& entries = bySource_[source];
    std::erase_if(entries, [](const Entry& e) { return e.copy.expired(); });
    // The source's layout is part of the key: one constant may be read as
    // b by one call and as b stored transposed by another.
    for (const Entry& e : entries)
      if (e.desc == packed.get_desc() && e.source == plain.get_desc())
        if (auto copy = e.copy.lock()) return copy;
    auto copy = std::make_shared<const memory>(packed.get_desc(), cpuEngine());
    plain.set_data_handle(const_cast<void*>(source));
    reorder.execute(stream, plain, const_cast<memory&>(*copy));
    stream.wait();
    entries.push_back({packed.get_desc(), plain.get_desc(), copy});
    return copy;
  }

 private:
  struct Entry {
    memory::desc desc, source;
    std::weak_ptr<const memory> copy;
  };
  std::mutex mutex_;
  std::unordered_map<const void*, std::vector<Entry>> bySource_;
};

}  // namespace

namespace {

/// Runs `impl`'s primitive, with its reorders and fix-up, on `buffers`.
void execute(DnnlKernel::Impl& impl, void* const* buffers) {
  using Impl = DnnlKernel::Impl;
  for (const auto& [arg, buffer] : impl.bindings) impl.args.at(arg).set_data_handle(buffers[buffer]);
  static thread_local dnnl::stream stream(cpuEngine());
  for (Impl::Reorder& r : impl.inputReorders) {
    if (r.constant && r.reordered == buffers[r.buffer]) continue;
    if (r.shared) {
      r.sharedCopy = PackedWeights::instance().get(buffers[r.buffer], r.plain, r.blocked, r.primitive, stream);
      impl.args[r.argument] = *r.sharedCopy;
      r.reordered = buffers[r.buffer];
      continue;
    }
    r.plain.set_data_handle(buffers[r.buffer]);
    r.primitive.execute(stream, r.plain, r.blocked);
    r.reordered = buffers[r.buffer];
  }
  impl.primitive.execute(stream, impl.args);
  for (Impl::Reorder& r : impl.outputReorders) {
    r.plain.set_data_handle(buffers[r.buffer]);
    r.primitive.execute(stream, r.blocked, r.plain);
  }
  stream.wait();
  if (impl.paddedTaps) impl.fixPaddedTaps(buffers);
}

}  // namespace

Status DnnlKernel::run(void* const* buffers, std::span<double> bounds) const {
  Impl::Guard* guard = impl_->guard.get();
  if (!guard) {
    execute(*impl_, buffers);
    return Status::success();
  }
  const LibraryCall& call = impl_->call;
  Impl::Guard::Sources from{bounds};
  Impl::Guard::Range r;
  if (guard->end) {
    r = guard->chainRange(call, buffers, from, guard->end);
    if (!(r.magnitude() <= kGuardLimit) && from.usedKnown) {
      // A known bound may be far above the value's true maximum: scan.
      from = {};
      r = guard->chainRange(call, buffers, from, guard->end);
    }
  }
  if (r.magnitude() <= kGuardLimit) {
    if (guard->end) ++guard->guardedRuns;
    execute(*impl_, buffers);
    if (guard->boundsResult && static_cast<size_t>(call.resultBuffer) < bounds.size()) {
      // The rest of the post-ops, from what this run knows without
      // scanning; a computed sum may exceed the exact one's bound by
      // (1 + reduction * 2^-23) (and each post-op by one rounding).
      from.scan = false;
      if (guard->end)
        for (size_t i = guard->end; i < call.postOps.size() && r.magnitude() <= kGuardLimit; ++i)
          r = guard->postOpRange(call.postOps[i], r, buffers, from);
      else
        r = guard->chainRange(call, buffers, from, call.postOps.size());
      const double b =
          r.magnitude() * (1 + static_cast<double>(guard->reduction + 8 + static_cast<int64_t>(call.postOps.size())) * 0x1p-23);
      bounds[static_cast<size_t>(call.resultBuffer)] = b <= kGuardLimit ? b : -1;
    }
    return Status::success();
  }
  ++guard->exactRuns;
  if (!guard->exact) {
    auto exact = std::make_unique<Impl>();
    auto built = build(guard->exactCall, guard->constantBuffers, /*describeOnly=*/false, *exact, Variant::Exact);
    if (!built) return Error(impl_->description + ": its exact variant: " + built.error().message());
    guard->exact = std::move(exact);
  }
  execute(*guard->exact, buffers);
  if (!guard->hostTail.empty()) {
    float* y = static_cast<float*>(buffers[call.resultBuffer]);
    const int64_t n = elementCount(call.resultDims);
    for (int64_t i = 0; i < n; ++i)
      for (const PostOp& p : guard->hostTail) y[i] = applyHostPostOp(p, y[i]);
  }
  return Status::success();
}

void setDnnlThreads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

}  // namespace kiln
