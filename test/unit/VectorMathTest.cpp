// The inline f32 math of codegen/llvm/VectorMath.h, run as vectorized JIT
// kernels, against the C++ library in double (so the reference is the
// correctly rounded result): over every 997th f32 bit pattern (4.3 million
// inputs: all exponents, both signs, denormals, NaNs) and a million points
// spread evenly over [-10, 10], the error must stay within the ulp bound
// claimed in docs/codegen.md; and the special values (signed zeros,
// infinities, NaN, overflow, underflow, saturation, log of negatives)
// must come out exactly as std:: gives them in f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "codegen/KernelIR.h"
#include "codegen/llvm/CpuJit.h"

namespace kiln {
namespace {

using kir::UnaryFn;

struct MathCase {
  const char* name;
  UnaryFn fn;
  std::function<double(double)> reference;
  double maxUlp;  // the bound docs/codegen.md states
};

const MathCase kCases[] = {
    {"exp", UnaryFn::Exp, [](double x) { return std::exp(x); }, 1.0},
    {"log", UnaryFn::Log, [](double x) { return std::log(x); }, 1.0},
    {"tanh", UnaryFn::Tanh, [](double x) { return std::tanh(x); }, 1.5},
    {"erf", UnaryFn::Erf, [](double x) { return std::erf(x); }, 1.5},
    {"sigmoid", UnaryFn::Sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, 2.5},
};

/// Runs `fn` over `xs` as one kernel whose loop the JIT vectorizes.
std::vector<float> runKernel(codegen::CpuJit& jit, const MathCase& c, const std::vector<float>& xs) {
  const auto n = static_cast<int64_t>(xs.size());
  kir::Kernel k;
  k.name = std::string("vector_math_") + c.name + "_" + std::to_string(n);
  k.buffers = {{"x", DType::F32, {n}, kir::Buffer::Role::Input}, {"y", DType::F32, {n}, kir::Buffer::Role::Output}};
  k.numVars = 1;
  k.body = {kir::forLoop(0, n, true, true,
                         {kir::store(1, kir::var(0), kir::unary(c.fn, kir::load(0, DType::F32, kir::var(0))))})};
  auto code = jit.compile({k}, 1, nullptr, nullptr);
  EXPECT_TRUE(code.ok()) << (code.ok() ? "" : code.error().str());
  std::vector<float> ys(xs.size());
  if (!code.ok()) return ys;
  auto loaded = LoadedCode::load(*code, {k.name});
  EXPECT_TRUE(loaded.ok()) << (loaded.ok() ? "" : loaded.error().str());
  if (!loaded.ok()) return ys;
  void* buffers[] = {const_cast<float*>(xs.data()), ys.data()};
  (*loaded)->kernel(0)(buffers, nullptr, 0, n);
  return ys;
}

/// |got - want| in units of the f32 spacing at `want` (denormal spacing
/// below FLT_MIN); infinite when only one of them is NaN or infinite.
double ulpError(float got, double want) {
  const auto rounded = static_cast<float>(want);
  if (std::isnan(want) || std::isinf(rounded)) {
    const bool same = std::isnan(want) ? std::isnan(got) : got == rounded;
    return same ? 0.0 : std::numeric_limits<double>::infinity();
  }
  if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
  const double magnitude = std::max(std::fabs(want), static_cast<double>(std::numeric_limits<float>::min()));
  const double spacing = std::ldexp(1.0, std::ilogb(magnitude) - 23);
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::vector<float> sampleInputs() {
  std::vector<float> xs;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 997) xs.push_back(fromBits(static_cast<uint32_t>(u)));
  for (int i = 0; i <= 1000000; ++i) xs.push_back(static_cast<float>(-10.0 + 20.0 * i / 1000000));
  return xs;
}

TEST(VectorMathTest, WithinUlpBoundOverWholeRange) {
  auto jit = codegen::CpuJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  const std::vector<float> xs = sampleInputs();
  ASSERT_GT(xs.size(), 5000000u);
  for (const MathCase& c : kCases) {
    const std::vector<float> ys = runKernel(**jit, c, xs);
    double worst = 0;
    float worstX = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double e = ulpError(ys[i], c.reference(xs[i]));
      if (e > worst) {
        worst = e;
        worstX = xs[i];
      }
    }
    std::printf("%-8s max error %.3f ulp (at x = %.9g)\n", c.name, worst, worstX);
    EXPECT_LE(worst, c.maxUlp) << c.name << " at x = " << worstX << ": got " << runKernel(**jit, c, {worstX})[0]
                               << ", want " << c.reference(worstX);
  }
}

TEST(VectorMathTest, SpecialValuesAsLibm) {
  auto jit = codegen::CpuJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> xs = {0.0f,   -0.0f,   inf,   -inf,   nan,   -nan,   tiny,  -tiny,   1e-40f, -1e-40f,
                                 1e-30f, -1e-30f, 1.0f,  -1.0f,  88.7f, 88.8f,  89.0f, 100.0f,  -87.0f, -103.0f,
                                 -104.f, -110.0f, 9.0f,  -9.0f,  20.0f, -20.0f, 45.0f, -45.0f,  3.95f,  -3.95f,
                                 5.0f,   -5.0f,   1e10f, -1e10f, big,   -big,   0.5f,  -0.625f, 0.875f, -0.875f};
  const std::function<float(float)> libm[] = {
      [](float x) { return std::exp(x); }, [](float x) { return std::log(x); }, [](float x) { return std::tanh(x); },
      [](float x) { return std::erf(x); },
      [](float x) { return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))); }};
  for (size_t k = 0; k < std::size(kCases); ++k) {
    const MathCase& c = kCases[k];
    const std::vector<float> ys = runKernel(**jit, c, xs);
    for (size_t i = 0; i < xs.size(); ++i) {
      const float want = libm[k](xs[i]), got = ys[i];
      SCOPED_TRACE(std::string(c.name) + "(" + std::to_string(xs[i]) + ")");
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << got;
      } else if (want == 0 || std::isinf(want) || std::fabs(want) == 1) {
        // Exactly the libm result, sign of zero included.
        EXPECT_EQ(got, want);
        EXPECT_EQ(std::signbit(got), std::signbit(want)) << got << " vs " << want;
      } else {
        EXPECT_LE(ulpError(got, c.reference(xs[i])), c.maxUlp) << got << " vs " << want;
      }
    }
  }
  // The cases libm defines and the tests above rely on.
  const std::vector<float> logs = runKernel(**jit, kCases[1], {-1.0f, -0.0f, 0.0f, -inf, 1.0f});
  EXPECT_TRUE(std::isnan(logs[0]));
  EXPECT_EQ(logs[1], -inf);
  EXPECT_EQ(logs[2], -inf);
  EXPECT_TRUE(std::isnan(logs[3]));
  EXPECT_EQ(logs[4], 0.0f);
}

}  // namespace
}  // namespace kiln
