// PackedMatmul (PackedMatmul.h).
//
// The kernel: for a block of R rows (at most 4) and Q panels (2 for one or
// two rows, so that 8 to 16 accumulators hide the FMA latency; else 1), the
// R x 64Q accumulators live in registers over the whole k loop, which reads
// each panel row once and broadcasts a's element; the finished tile goes
// through the post-ops and is stored, its last panel cut to N.
#include "runtime/PackedMatmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ir/Types.h"

namespace kiln {

namespace {

constexpr int64_t kPanel = 64;  // columns per panel
constexpr int kLanes = 16;      // floats per vector
constexpr int kVectorsPerPanel = kPanel / kLanes;

// The vectors are passed between always-inlined functions only, so the
// calling convention of vector arguments (which depends on the target's
// registers) never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float Vec __attribute__((vector_size(64)));
typedef int32_t VecI __attribute__((vector_size(64)));

#define KILN_VECTOR_INLINE __attribute__((always_inline)) inline

KILN_VECTOR_INLINE Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
KILN_VECTOR_INLINE void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
/// x in every lane, as one broadcast (GCC builds an initializer list of x
/// lane by lane, and Vec{} + x adds first, since 0 + -0 is +0).
KILN_VECTOR_INLINE Vec splat(float x) {
#if defined(__clang__)
  return __builtin_shufflevector(Vec{x}, Vec{x}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
#else
  return __builtin_shuffle(Vec{x}, VecI{});
#endif
}
/// Lanes [0, n) of p, the others 0.
KILN_VECTOR_INLINE Vec loadPartial(const float* p, int n) {
  float lanes[kLanes] = {};
  std::memcpy(lanes, p, static_cast<size_t>(n) * sizeof(float));
  return load(lanes);
}
KILN_VECTOR_INLINE Vec select(VecI mask, Vec a, Vec b) { return mask ? a : b; }
KILN_VECTOR_INLINE Vec minV(Vec a, float b) { return select(a < b, a, splat(b)); }
KILN_VECTOR_INLINE Vec maxV(Vec a, float b) { return select(a > b, a, splat(b)); }
KILN_VECTOR_INLINE Vec absV(Vec x) { return (Vec)((VecI)x & 0x7fffffff); }
/// NaN lanes of `x` replace those of `y`.
KILN_VECTOR_INLINE Vec keepNaN(Vec x, Vec y) { return select(x != x, x, y); }

/// e^x: Cephes' expf (range reduction by ln 2, a degree-6 polynomial),
/// about 1 ulp; arguments clamped to [-87.3, 88.3], where the scale 2^n
/// stays a normal float. NaN is left to the caller.
KILN_VECTOR_INLINE Vec expV(Vec x) {
  x = maxV(minV(x, 88.3f), -87.3f);
  const Vec fx = x * 1.44269504088896341f + 0.5f;
  VecI n = __builtin_convertvector(fx, VecI);  // toward zero
  n += (VecI)(__builtin_convertvector(n, Vec) > fx);  // floor: -1 where truncation went up
  const Vec t = __builtin_convertvector(n, Vec);
  x = x - t * 0.693359375f + t * 2.12194440e-4f;
  const Vec z = x * x;
  Vec y = 1.9875691500e-4f * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  return y * (Vec)((n + 127) << 23);
}

/// 1 / (1 + e^-x); 0 below -87.3, where expV's clamp would leave 1 / e^87.3
/// (4.5e-39, also for -inf) and the exact value is below FLT_MIN.
KILN_VECTOR_INLINE Vec sigmoidV(Vec x) {
  return keepNaN(x, select(x < -87.3f, Vec{}, 1.0f / (1.0f + expV(-x))));
}

/// tanh: Cephes' tanhf polynomial below |x| 0.625, else 1 - 2 / (e^2|x| + 1)
/// with x's sign (|x| clamped at 10, where tanh is 1 in f32).
KILN_VECTOR_INLINE Vec tanhV(Vec x) {
  const Vec ax = absV(x);
  const Vec z = x * x;
  Vec small = -5.70498872745e-3f * z + 2.06390887954e-2f;
  small = small * z - 5.37397155531e-2f;
  small = small * z + 1.33314422036e-1f;
  small = small * z - 3.33332819422e-1f;
  small = small * z * x + x;
  const Vec big = 1.0f - 2.0f / (expV(2.0f * minV(ax, 10.0f)) + 1.0f);
  const Vec signedBig = (Vec)((VecI)big | ((VecI)x & (VecI)splat(-0.0f)));
  return keepNaN(x, select(ax < 0.625f, small, signedBig));
}

/// relu as the interpreter has it: NaN stays NaN, -0 gives +0.
KILN_VECTOR_INLINE Vec reluV(Vec x) { return select((x > 0.0f) | (x != x), x, Vec{}); }

}  // namespace

struct PackedMatmul::Weights {
  int64_t k = 0, n = 0, panels = 0;
  std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};  // [panels][k][64]
};

struct PackedMatmul::Impl {
  /// A post-op: operand element (row, col) at rowStride * row + colStride * col.
  struct Op {
    PostOp::Kind kind = PostOp::Kind::Add;
    float alpha = 0, beta = 0;
    int buffer = -1;
    int64_t rowStride = 0, colStride = 0;
  };
  std::shared_ptr<const Weights> b;
  int64_t m = 0, k = 0, n = 0;
  int a = 0, result = 0;
  std::vector<Op> ops;
  std::string description;
};

namespace {

using Impl = PackedMatmul::Impl;

/// Applies the post-ops to the R x (64 Q) tile `acc` of rows [row, row+R)
/// and columns [col, col + 64 Q), and stores its columns below n.
template <int R, int Q>
KILN_VECTOR_INLINE void finish(const Impl& m, void* const* buffers, Vec (&acc)[R][Q * kVectorsPerPanel], int64_t row,
                               int64_t col) {
  constexpr int V = Q * kVectorsPerPanel;
  float* c = static_cast<float*>(buffers[m.result]);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      const int64_t j = col + v * kLanes;
      if (j >= m.n) break;
      const int valid = static_cast<int>(std::min<int64_t>(kLanes, m.n - j));
      Vec x = acc[r][v];
      for (const Impl::Op& op : m.ops) {
        switch (op.kind) {
          case PostOp::Kind::Relu: x = reluV(x); continue;
          case PostOp::Kind::Tanh: x = tanhV(x); continue;
          case PostOp::Kind::Sigmoid: x = sigmoidV(x); continue;
          case PostOp::Kind::Linear: x = op.alpha * x + op.beta; continue;
          default: break;
        }
        const float* data = static_cast<const float*>(buffers[op.buffer]) + op.rowStride * (row + r);
        const Vec y = op.colStride == 0   ? splat(data[0])
                      : valid == kLanes ? load(data + j)
                                        : loadPartial(data + j, valid);
        switch (op.kind) {
          case PostOp::Kind::Add: x = x + y; break;
          case PostOp::Kind::Sub: x = x - y; break;
          case PostOp::Kind::Mul: x = x * y; break;
          case PostOp::Kind::Div: x = x / y; break;
          default: break;
        }
      }
      float* out = c + (row + r) * m.n + j;
      if (valid == kLanes) {
        store(out, x);
      } else {
        float lanes[kLanes];
        store(lanes, x);
        std::memcpy(out, lanes, static_cast<size_t>(valid) * sizeof(float));
      }
    }
}

/// Rows [row, row+R) times panels [panel, panel+Q).
template <int R, int Q>
KILN_VECTOR_INLINE void tile(const Impl& m, void* const* buffers, int64_t row, int64_t panel) {
  constexpr int V = Q * kVectorsPerPanel;
  const int64_t k = m.k;
  const float* a = static_cast<const float*>(buffers[m.a]) + row * k;
  const float* p[Q];
  for (int q = 0; q < Q; ++q) p[q] = m.b->data.get() + (panel + q) * k * kPanel;
  // The loops over registers are unrolled, so that the accumulators stay in
  // registers (-O2 would not unroll them).
  Vec acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) acc[r][v] = Vec{};
  for (int64_t i = 0; i < k; ++i) {
    Vec w[V];
#pragma GCC unroll 16
    for (int q = 0; q < Q; ++q)
#pragma GCC unroll 16
      for (int v = 0; v < kVectorsPerPanel; ++v) w[q * kVectorsPerPanel + v] = load(p[q] + i * kPanel + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vec x = splat(a[r * k + i]);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[r][v] += x * w[v];
    }
  }
  finish<R, Q>(m, buffers, acc, row, panel * kPanel);
}

/// Panels [begin, end) for rows [row, row+R), two at a time for one or two
/// rows, in order or in reverse.
template <int R>
KILN_VECTOR_INLINE void sweep(const Impl& m, void* const* buffers, int64_t row, int64_t begin, int64_t end,
                              bool backward) {
  constexpr int64_t Q = R <= 2 ? 2 : 1;
  const int64_t groups = (end - begin + Q - 1) / Q;
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t p = begin + (backward ? groups - 1 - i : i) * Q;
    if (Q == 2 && p + 2 <= end)
      tile<R, 2>(m, buffers, row, p);
    else
      tile<R, 1>(m, buffers, row, p);
  }
}

/// Panels [begin, end), every row, in blocks of up to 4 rows. Each sweep
/// over the panels runs the other way from this thread's previous one: a
/// thread's half of an LSTM's R^T (512 KiB) read in the same order at every
/// time step streamed from its 1 MiB L2 at about 150 GB/s, as if part of it
/// were evicted each time (the cache's replacement does not keep a cyclic
/// sweep of half its size), and in alternating order at about 225 GB/s, the
/// last panels read being the first read again (one thread, [1,256]x[256,
/// 512]: 3.5 against 2.3 us).
KILN_VECTOR_INLINE void panels(const Impl& m, void* const* buffers, int64_t begin, int64_t end) {
  static thread_local bool backward = false;
  for (int64_t row = 0; row < m.m; row += 4) {
    backward = !backward;
    switch (std::min<int64_t>(4, m.m - row)) {
      case 1: sweep<1>(m, buffers, row, begin, end, backward); break;
      case 2: sweep<2>(m, buffers, row, begin, end, backward); break;
      case 3: sweep<3>(m, buffers, row, begin, end, backward); break;
      default: sweep<4>(m, buffers, row, begin, end, backward); break;
    }
  }
}

using PanelsFn = void (*)(const Impl&, void* const*, int64_t, int64_t);

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"))) void panelsAvx512(const Impl& m,
                                                                                      void* const* buffers,
                                                                                      int64_t begin, int64_t end) {
  panels(m, buffers, begin, end);
}
__attribute__((target("avx2,fma"))) void panelsAvx2(const Impl& m, void* const* buffers, int64_t begin,
                                                     int64_t end) {
  panels(m, buffers, begin, end);
}
#endif
void panelsBaseline(const Impl& m, void* const* buffers, int64_t begin, int64_t end) {
  panels(m, buffers, begin, end);
}

struct Isa {
  PanelsFn fn;
  const char* name;
};

const Isa& hostIsa() {
  static const Isa isa = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
      return Isa{&panelsAvx512, "avx512"};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa{&panelsAvx2, "avx2"};
    return Isa{&panelsBaseline, "x86-64"};
#else
    return Isa{&panelsBaseline, "generic"};
#endif
  }();
  return isa;
}

int64_t product(const std::vector<int64_t>& dims, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= dims[i];
  return n;
}

std::string dimsText(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + "," + std::to_string(cols) + "]";
}

/// The operand strides of binary post-op `p` on an [m, n] result, or false
/// when its dims neither broadcast a row nor cover every row.
bool operandStrides(const PostOp& p, const std::vector<int64_t>& result, int64_t m, int64_t n, Impl::Op& op) {
  if (p.dims.size() != result.size() || p.dims.empty()) return false;
  const int64_t last = p.dims.back();
  if (last != 1 && last != n) return false;
  op.colStride = last == 1 ? 0 : 1;
  const int64_t rows = product(p.dims, 0, p.dims.size() - 1);
  if (rows == 1) {
    op.rowStride = 0;
    return true;
  }
  if (!std::equal(p.dims.begin(), p.dims.end() - 1, result.begin()) || rows != m) return false;
  op.rowStride = last;
  return true;
}

/// The call's sizes and post-ops, or an error saying why it is not one of
/// this kernel's.
Expected<Impl> plan(const LibraryCall& call) {
  if (call.kind != LibraryCall::Kind::MatMul || call.operands.size() != 2 || call.operandDims.size() != 2)
    return Error("not a matmul of two operands");
  if (call.srcType != DType::F32 || call.dstType != DType::F32) return Error("not an f32 matmul");
  const std::vector<int64_t>& a = call.operandDims[0];
  const std::vector<int64_t>& b = call.operandDims[1];
  const std::vector<int64_t>& c = call.resultDims;
  if (a.empty() || b.size() < 2 || c.empty()) return Error("a 1-D b");
  // Its a is read row by row as stored (a constant b is what it packs).
  if (call.transposedA) return Error("a stored transposed");
  if (product(b, 0, b.size() - 2) != 1) return Error("b has a batch");
  Impl m;
  m.k = a.back();
  m.n = b.back();
  m.m = product(a, 0, a.size() - 1);
  if (b[b.size() - 2] != m.k || c.back() != m.n || product(c, 0, c.size() - 1) != m.m)
    return Error("the dims do not multiply");
  if (m.m < 1 || m.m > PackedMatmul::kMaxRows || m.k < 1 || m.n < 1) return Error("too many rows");
  m.a = call.operands[0];
  m.result = call.resultBuffer;
  for (const PostOp& p : call.postOps) {
    Impl::Op op;
    op.kind = p.kind;
    op.alpha = p.alpha;
    op.beta = p.beta;
    switch (p.kind) {
      case PostOp::Kind::Relu:
      case PostOp::Kind::Tanh:
      case PostOp::Kind::Sigmoid:
      case PostOp::Kind::Linear: break;
      case PostOp::Kind::Add:
      case PostOp::Kind::Sub:
      case PostOp::Kind::Mul:
      case PostOp::Kind::Div:
        if (!operandStrides(p, c, m.m, m.n, op)) return Error("a post-op operand that is neither a row nor the result's shape");
        op.buffer = p.operand;
        break;
      default: return Error("a post-op it has not");
    }
    m.ops.push_back(op);
  }
  std::string post;
  for (const PostOp& p : call.postOps) post += (post.empty() ? " + " : ", ") + p.name;
  m.description = "packed matmul " + dimsText(m.m, m.k) + "x" + dimsText(m.k, m.n) + post + " (" + hostIsa().name +
                  (call.transposedB ? ", b stored transposed" : "") + ")";
  return m;
}

}  // namespace

PackedMatmul::PackedMatmul(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PackedMatmul::~PackedMatmul() = default;

bool PackedMatmul::accepts(const LibraryCall& call) { return plan(call).ok(); }

std::shared_ptr<const PackedMatmul::Weights> PackedMatmul::pack(const float* b, int64_t k, int64_t n, bool transposed) {
  auto w = std::make_shared<Weights>();
  w->k = k;
  w->n = n;
  w->panels = (n + kPanel - 1) / kPanel;
  const size_t bytes = static_cast<size_t>(w->panels * k * kPanel) * sizeof(float);
  w->data.reset(static_cast<float*>(std::aligned_alloc(64, std::max<size_t>(bytes, 64))));
  float* out = w->data.get();
  for (int64_t p = 0; p < w->panels; ++p) {
    const int64_t cols = std::min(kPanel, n - p * kPanel);
    for (int64_t i = 0; i < k; ++i) {
      float* row = out + (p * k + i) * kPanel;
      if (transposed)
        for (int64_t j = 0; j < cols; ++j) row[j] = b[(p * kPanel + j) * k + i];
      else
        std::memcpy(row, b + i * n + p * kPanel, static_cast<size_t>(cols) * sizeof(float));
      std::fill(row + cols, row + kPanel, 0.0f);
    }
  }
  return w;
}

Expected<std::unique_ptr<PackedMatmul>> PackedMatmul::create(const LibraryCall& call,
                                                             std::shared_ptr<const Weights> b) {
  auto m = plan(call);
  if (!m) return m.takeError();
  if (!b || b->k != m->k || b->n != m->n) return Error("packed weights of other dims than the matmul's");
  m->b = std::move(b);
  return std::unique_ptr<PackedMatmul>(new PackedMatmul(std::make_unique<Impl>(std::move(*m))));
}

void PackedMatmul::run(void* const* buffers, int thread, int threads) const {
  const int64_t panels = impl_->b->panels;
  const int64_t begin = panels * thread / threads, end = panels * (thread + 1) / threads;
  if (begin < end) hostIsa().fn(*impl_, buffers, begin, end);
}

int64_t PackedMatmul::work() const { return impl_->m * impl_->k * impl_->n; }
const std::string& PackedMatmul::description() const { return impl_->description; }
const char* PackedMatmul::isa() { return hostIsa().name; }

}  // namespace kiln
