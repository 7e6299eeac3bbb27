// The gradients of max_pool and avg_pool (passes/VjpContraction.cpp,
// docs/autodiff.md): the gather over shifted windows that replaced the
// transposed convolution, on the interpreter against an independent
// reference of PyTorch's backward (max: each window's dy to its first
// maximal tap in row-major order, the padding never a candidate; avg: dy
// over the window's divisor to every tap), and against PyTorch's own
// numbers for three cases; then the same gradients on the CPU (-O3 and
// -O2) and on the emulated GPU against the interpreter, and the kernels the
// CPU runs for ResNet's pool (no library call, two generated kernels).
// The inputs are small integers, so that windows tie: ties are what the
// choice of the first maximal tap is about.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaExecutor.h"
#include "passes/Autodiff.h"
#include "runtime/Interpreter.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

/// One pooling: x's dims, the op's attributes and the output's dims.
struct PoolCase {
  std::string name;
  bool isMax;
  std::vector<int64_t> x;
  std::vector<int64_t> kernel, strides, pads, dilations;
  bool ceilMode = false, countIncludePad = false;
  std::vector<int64_t> y;
};

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string typeOf(const std::vector<int64_t>& dims) {
  std::string s = "f32[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t d : v) n *= d;
  return n;
}

/// loss = sum(pool(x) * w), so that dy = w; its gradient with respect to x.
std::string lossText(const PoolCase& c) {
  std::string attrs = "kernel = " + list(c.kernel) + ", strides = " + list(c.strides) + ", pads = " + list(c.pads);
  if (c.isMax && !c.dilations.empty()) attrs += ", dilations = " + list(c.dilations);
  if (c.ceilMode) attrs += ", ceil_mode = true";
  if (!c.isMax && c.countIncludePad) attrs += ", count_include_pad = true";
  return "func @f(%x: " + typeOf(c.x) + ", %w: " + typeOf(c.y) + ") -> f32[] {\n  %y = " +
         (c.isMax ? "max_pool" : "avg_pool") + "(%x) {" + attrs + "} : " + typeOf(c.y) + "\n  %m = mul(%y, %w) : " +
         typeOf(c.y) + "\n  %l = reduce_sum(%m) {axes = []} : f32[]\n  return %l\n}\n";
}

/// x: small integers (many ties); w (dy): small integers of both signs.
/// The same formulas as the PyTorch script in the comments below.
Tensor xOf(const std::vector<int64_t>& dims) {
  std::vector<double> v(product(dims));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 5);
  return test::tensorOf(DType::F32, dims, v);
}
Tensor dyOf(const std::vector<int64_t>& dims) {
  std::vector<double> v(product(dims));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(static_cast<int64_t>(i % 7) - 3);
  return test::tensorOf(DType::F32, dims, v);
}

/// PyTorch's pooling backward, written out (aten/src/ATen/native/cpu/
/// MaxPoolKernel.cpp and AvgPoolKernel.cpp): a max window's index is its
/// first in-range tap, replaced by each later tap that is strictly
/// greater; an average window's divisor counts its real elements, or with
/// count_include_pad those inside the padded input.
std::vector<double> referenceGrad(const PoolCase& c, const Tensor& x, const Tensor& dy) {
  const size_t sp = c.kernel.size();
  std::vector<int64_t> in(c.x.begin() + 2, c.x.end()), out(c.y.begin() + 2, c.y.end());
  std::vector<int64_t> dil = c.dilations.empty() ? std::vector<int64_t>(sp, 1) : c.dilations;
  const int64_t planes = c.x[0] * c.x[1], inSize = product(in), outSize = product(out), taps = product(c.kernel);
  std::vector<double> dx(static_cast<size_t>(planes * inSize), 0.0);
  for (int64_t plane = 0; plane < planes; ++plane)
    for (int64_t o = 0; o < outSize; ++o) {
      std::vector<int64_t> oi(sp);
      for (int64_t rest = o, i = static_cast<int64_t>(sp) - 1; i >= 0; --i) {
        oi[i] = rest % out[i];
        rest /= out[i];
      }
      const double g = dy.getDouble(plane * outSize + o);
      std::vector<int64_t> real;  // flat positions of the in-range taps, in tap order
      int64_t padded = 1;
      for (size_t i = 0; i < sp; ++i) {
        int64_t begin = oi[i] * c.strides[i] - c.pads[i];
        padded *= std::min(begin + c.kernel[i], in[i] + c.pads[sp + i]) - begin;
      }
      for (int64_t t = 0; t < taps; ++t) {
        int64_t flat = 0;
        bool inside = true;
        for (int64_t rest = t, scale = 1, i = static_cast<int64_t>(sp) - 1; i >= 0; --i) {
          int64_t pos = oi[i] * c.strides[i] - c.pads[i] + (rest % c.kernel[i]) * dil[i];
          rest /= c.kernel[i];
          inside = inside && pos >= 0 && pos < in[i];
          flat += pos * scale;
          scale *= in[i];
        }
        if (inside) real.push_back(flat);
      }
      if (real.empty()) continue;
      if (c.isMax) {
        int64_t best = real[0];
        for (int64_t p : real)
          if (x.getDouble(plane * inSize + p) > x.getDouble(plane * inSize + best)) best = p;
        dx[static_cast<size_t>(plane * inSize + best)] += g;
      } else {
        const double divisor = c.countIncludePad ? static_cast<double>(padded) : static_cast<double>(real.size());
        for (int64_t p : real) dx[static_cast<size_t>(plane * inSize + p)] += g / divisor;
      }
    }
  return dx;
}

/// The cases: ResNet's 3x3 stride 2 pad 1, tiling windows with and without
/// a crop, ceil_mode's partial windows, stride 1, dilation, 1-d and 3-d,
/// and the average pools.
std::vector<PoolCase> cases() {
  return {
      {"resnet", true, {2, 3, 8, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, false, false, {2, 3, 4, 4}},
      {"tiles", true, {1, 2, 8, 6}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {}, false, false, {1, 2, 4, 3}},
      {"tiles-cropped", true, {1, 2, 7, 7}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {}, false, false, {1, 2, 3, 3}},
      {"ceil", true, {1, 2, 7, 7}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {}, true, false, {1, 2, 4, 4}},
      {"ceil-pad", true, {1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, true, false, {1, 2, 4, 4}},
      {"stride1", true, {1, 2, 6, 5}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {}, false, false, {1, 2, 6, 5}},
      {"kernel2-stride1", true, {2, 1, 5, 5}, {2, 2}, {1, 1}, {0, 0, 0, 0}, {}, false, false, {2, 1, 4, 4}},
      {"dilated", true, {1, 2, 6, 6}, {3, 2}, {2, 1}, {1, 0, 1, 1}, {1, 2}, true, false, {1, 2, 4, 5}},
      {"1d", true, {2, 3, 7}, {3}, {2}, {0, 0}, {}, false, false, {2, 3, 3}},
      {"3d", true, {1, 2, 4, 5, 4}, {2, 3, 2}, {2, 2, 2}, {0, 1, 0, 0, 1, 0}, {}, false, false, {1, 2, 2, 3, 2}},
      {"avg-tiles", false, {1, 2, 8, 6}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {}, false, false, {1, 2, 4, 3}},
      {"avg-ceil", false, {1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, true, false, {1, 2, 4, 4}},
      {"avg-ceil-count-pad", false, {1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, true, true, {1, 2, 4, 4}},
      {"avg-stride1", false, {1, 1, 5, 6}, {3, 2}, {1, 1}, {1, 0, 1, 1}, {}, false, false, {1, 1, 5, 6}},
  };
}

/// The training function of `c`: its loss and dx (grad.x).
std::unique_ptr<Module> gradientOf(const PoolCase& c) {
  auto m = test::parseVerified(lossText(c));
  if (!m) return nullptr;
  Status s = differentiateFunction(*m->functions()[0], AutodiffOptions{std::vector<std::string>{"x"}, 0});
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().str());
  return s.ok() ? std::move(m) : nullptr;
}

void expectNear(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.numElements(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got.getDouble(static_cast<int64_t>(i)), want[i], 1e-6 + 1e-6 * std::abs(want[i]))
        << what << ": element " << i;
}

TEST(PoolGradTest, InterpreterMatchesPyTorchsBackwardWithTies) {
  for (const PoolCase& c : cases()) {
    SCOPED_TRACE(c.name);
    auto m = gradientOf(c);
    ASSERT_TRUE(m);
    const Tensor x = xOf(c.x), dy = dyOf(c.y);
    auto r = interpret(*m->functions()[0], {x, dy});
    ASSERT_TRUE(r.ok()) << r.error().str();
    ASSERT_EQ(r->size(), 2u);
    expectNear((*r)[1], referenceGrad(c, x, dy), "interpreter");
  }
}

TEST(PoolGradTest, ReferenceAgreesWithPyTorch) {
  // torch 1.13, float64, x and dy from the formulas of xOf and dyOf:
  //   x = torch.tensor([float((i*7)%5) for i in range(n)]).reshape(shape)
  //   dy = torch.tensor([float((i%7)-3) for i in range(m)]).reshape(y.shape)
  //   F.max_pool2d(x, 3, 2, 1) and F.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
  //   count_include_pad=False / True), y.backward(dy), x.grad.
  struct Known {
    PoolCase c;
    std::vector<double> grad;
  };
  const std::vector<Known> known = {
      {{"max", true, {1, 1, 5, 5}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, false, false, {1, 1, 3, 3}},
       {0, -3, -2, 0, -1, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 3, -3, 0, -2, 0, 0, 0, 0, 0}},
      {{"avg", false, {1, 1, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, true, false, {1, 1, 4, 4}},
       {-0.75,
        -1.0833333333333333,
        -0.3333333333333333,
        -0.5,
        -0.16666666666666666,
        -0.16666666666666666,
        -0.5833333333333334,
        -0.6944444444444444,
        -0.1111111111111111,
        0.055555555555555525,
        0.16666666666666666,
        -0.8333333333333334,
        0.16666666666666666,
        0.38888888888888884,
        0.2222222222222222,
        0.5555555555555556,
        0.3333333333333333,
        -0.6666666666666667,
        -0.16666666666666666,
        -0.05555555555555558,
        0.1111111111111111,
        0.4444444444444445,
        0.3333333333333333,
        -0.3333333333333334,
        -0.3333333333333333,
        -0.4444444444444444,
        -0.1111111111111111,
        -0.1111111111111111,
        0.0,
        0.3333333333333333,
        0.6666666666666667,
        1.5555555555555556,
        0.8888888888888888,
        -0.11111111111111116,
        -1.0,
        -2.666666666666667}},
      {{"avg-count-pad", false, {1, 1, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, true, true, {1, 1, 4, 4}},
       {-0.3333333333333333,
        -0.5555555555555556,
        -0.2222222222222222,
        -0.3333333333333333,
        -0.1111111111111111,
        -0.1111111111111111,
        -0.2222222222222222,
        -0.22222222222222227,
        0.0,
        0.2222222222222222,
        0.2222222222222222,
        -0.2777777777777778,
        0.1111111111111111,
        0.3333333333333333,
        0.2222222222222222,
        0.5555555555555556,
        0.3333333333333333,
        -0.16666666666666669,
        -0.1111111111111111,
        0.0,
        0.1111111111111111,
        0.4444444444444445,
        0.3333333333333333,
        -2.7755575615628914e-17,
        -0.2222222222222222,
        -0.3333333333333333,
        -0.1111111111111111,
        -0.1111111111111111,
        0.0,
        0.16666666666666666,
        0.1111111111111111,
        0.5,
        0.3888888888888889,
        -0.1111111111111111,
        -0.5,
        -0.8333333333333334}},
  };
  for (const Known& k : known) {
    SCOPED_TRACE(k.c.name);
    const Tensor x = xOf(k.c.x), dy = dyOf(k.c.y);
    const std::vector<double> reference = referenceGrad(k.c, x, dy);
    ASSERT_EQ(reference.size(), k.grad.size());
    for (size_t i = 0; i < reference.size(); ++i) EXPECT_NEAR(reference[i], k.grad[i], 1e-12) << "element " << i;
    auto m = gradientOf(k.c);
    ASSERT_TRUE(m);
    auto r = interpret(*m->functions()[0], {x, dy});
    ASSERT_TRUE(r.ok()) << r.error().str();
    expectNear((*r)[1], k.grad, "interpreter");
  }
}

/// Every case's gradient from `run` (the JIT of a device) against the
/// interpreter's.
template <typename Run>
void expectEveryCaseMatchesTheInterpreter(const std::string& device, Run run) {
  for (const PoolCase& c : cases()) {
    SCOPED_TRACE(c.name);
    auto m = gradientOf(c);
    ASSERT_TRUE(m);
    const Function& f = *m->functions()[0];
    const std::vector<Tensor> in = {xOf(c.x), dyOf(c.y)};
    auto want = test::interpretedResults(f, in);
    ASSERT_TRUE(want);
    auto got = run(f, in);
    ASSERT_TRUE(got);
    expectNear((*got)[1], test::elementsOf((*want)[1]), device);
  }
}

TEST(PoolGradTest, CpuMatchesTheInterpreter) {
  for (int optLevel : {3, 2})
    expectEveryCaseMatchesTheInterpreter("-O" + std::to_string(optLevel), [&](const Function& f, const auto& in) {
      return test::cpuJitResults(f, in, optLevel);
    });
}

TEST(PoolGradTest, EmulatedGpuMatchesTheInterpreter) {
  KILN_REQUIRE_EMULATOR();
  expectEveryCaseMatchesTheInterpreter("emulated GPU", test::emulatedGpuResults);
}

TEST(PoolGradTest, ResNetsPoolGradientIsTwoGeneratedKernels) {
  // The forward pool, the loss (one reduction kernel), the first maximal
  // tap of each window (one kernel over the output) and dx (one kernel over
  // x): no transposed convolution, no stacked taps, no padded copy of x.
  const PoolCase c = cases()[0];
  auto m = gradientOf(c);
  ASSERT_TRUE(m);
  auto executor = CpuExecutor::create(*m->functions()[0], {.threads = 1, .optLevel = 3});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  EXPECT_EQ((*executor)->numKernels({xOf(c.x), dyOf(c.y)}), 4u);
}

}  // namespace
}  // namespace kiln
