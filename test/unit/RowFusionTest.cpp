// Row reductions fused with their readers at any width (passes/Fuse.cpp
// reducesRows): a softmax, a layer norm or an RMS norm over the last axis
// is one kernel however wide its rows, because the emitters compute a row's
// reductions once before its elements (the CPU before the row's vector
// loop, CUDA by the row's warp or block: codegen/Schedule.h
// rowInvariantReductions). Checked here: such functions fuse into a single
// kernel, and that kernel computes what the interpreter does on the CPU JIT
// and on the emulated GPU, at widths below and above a warp and a block, at
// odd widths, with NaN and infinities in a row and a row of one element.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>

#include "passes/PassManager.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

std::string dims(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? "," : "") + std::to_string(shape[d]);
  return s;
}

/// The types a function over rows of `shape` uses: the tensor, its reduced
/// rows (keepdims), a vector along the last axis, and that axis.
struct RowTypes {
  std::string tensor, rows, vector, axis;
};

RowTypes rowTypes(const std::vector<int64_t>& shape) {
  std::vector<int64_t> reduced = shape;
  reduced.back() = 1;
  return {"f32[" + dims(shape) + "]", "f32[" + dims(reduced) + "]", "f32[" + std::to_string(shape.back()) + "]",
          std::to_string(shape.size() - 1)};
}

/// softmax(x) over the last axis of `shape`, as exporters write it.
std::string softmax(const std::vector<int64_t>& shape) {
  const auto [t, r, w, axis] = rowTypes(shape);
  return "func @f(%x: " + t + ") -> " + t + " {\n" +
         "  %m = reduce_max(%x) {axes = [" + axis + "], keepdims = true} : " + r + "\n" +
         "  %d = sub(%x, %m) : " + t + "\n" +
         "  %e = exp(%d) : " + t + "\n" +
         "  %s = reduce_sum(%e) {axes = [" + axis + "], keepdims = true} : " + r + "\n" +
         "  %y = div(%e, %s) : " + t + "\n" +
         "  return %y\n}\n";
}

/// layer_norm(x) * g + b over the last axis of `shape`, decomposed.
std::string layerNorm(const std::vector<int64_t>& shape) {
  const auto [t, r, w, axis] = rowTypes(shape);
  return "func @f(%x: " + t + ", %g: " + w + ", %b: " + w + ") -> " + t + " {\n" +
         "  %mean = reduce_mean(%x) {axes = [" + axis + "], keepdims = true} : " + r + "\n" +
         "  %d = sub(%x, %mean) : " + t + "\n" +
         "  %sq = mul(%d, %d) : " + t + "\n" +
         "  %var = reduce_mean(%sq) {axes = [" + axis + "], keepdims = true} : " + r + "\n" +
         "  %eps = constant() {value = dense<f32[]>[1e-05]} : f32[]\n" +
         "  %ve = add(%var, %eps) : " + r + "\n" +
         "  %rs = rsqrt(%ve) : " + r + "\n" +
         "  %n = mul(%d, %rs) : " + t + "\n" +
         "  %s = mul(%n, %g) : " + t + "\n" +
         "  %y = add(%s, %b) : " + t + "\n" +
         "  return %y\n}\n";
}

/// rms_norm(x) * g over the last axis of `shape`: one reduction.
std::string rmsNorm(const std::vector<int64_t>& shape) {
  const auto [t, r, w, axis] = rowTypes(shape);
  return "func @f(%x: " + t + ", %g: " + w + ") -> " + t + " {\n" +
         "  %sq = mul(%x, %x) : " + t + "\n" +
         "  %ms = reduce_mean(%sq) {axes = [" + axis + "], keepdims = true} : " + r + "\n" +
         "  %eps = constant() {value = dense<f32[]>[1e-06]} : f32[]\n" +
         "  %me = add(%ms, %eps) : " + r + "\n" +
         "  %rs = rsqrt(%me) : " + r + "\n" +
         "  %n = mul(%x, %rs) : " + t + "\n" +
         "  %y = mul(%n, %g) : " + t + "\n" +
         "  return %y\n}\n";
}

Tensor random(std::vector<int64_t> shape, uint32_t seed, float scale) {
  Tensor t(DType::F32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  for (int64_t i = 0; i < t.numElements(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

/// The kernels `text` makes after fusion: its ops but constants and the
/// return, once `fuse` has run.
int kernelsAfterFusion(const std::string& text) {
  auto m = test::parseVerified(text);
  if (!m) return -1;
  PassManager pm;
  EXPECT_TRUE(pm.addPipeline("fuse").ok());
  std::ostringstream log;
  Status fused = pm.run(*m, log);
  EXPECT_TRUE(fused.ok()) << fused.error().message();
  int kernels = 0;
  for (const auto& op : m->functions().front()->ops())
    if (op->kind() != OpKind::Constant && op->kind() != OpKind::Return) ++kernels;
  return kernels;
}

void expectClose(const Tensor& got, const Tensor& want, const std::string& where) {
  ASSERT_EQ(got.type(), want.type()) << where;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    const float g = got.data<float>()[i], w = want.data<float>()[i];
    if (std::isnan(w)) {
      ASSERT_TRUE(std::isnan(g)) << where << " at " << i << ": " << g << ", want NaN";
    } else {
      ASSERT_NEAR(g, w, 2e-6 + 2e-5 * std::abs(w)) << where << " at " << i;
    }
  }
}

/// `text` fuses into one kernel and matches the interpreter on the CPU JIT
/// and the emulated GPU.
void checkRowKernel(const std::string& text, const std::vector<Tensor>& inputs, const std::string& what) {
  SCOPED_TRACE(what);
  auto m = test::parseVerified(text);
  ASSERT_TRUE(m);
  EXPECT_EQ(kernelsAfterFusion(text), 1) << text;
  const Function& f = *m->functions().front();
  auto want = test::interpretedResults(f, inputs);
  ASSERT_TRUE(want);
  auto cpu = test::cpuJitResults(f, inputs, 3);
  ASSERT_TRUE(cpu);
  expectClose((*cpu)[0], (*want)[0], what + " on the CPU");
  if (!test::emulatorBuilt()) return;
  auto gpu = test::emulatedGpuResults(f, inputs);
  ASSERT_TRUE(gpu);
  expectClose((*gpu)[0], (*want)[0], what + " on the emulated GPU");
}

TEST(RowFusionTest, SoftmaxOfAnyWidthIsOneKernelMatchingTheInterpreter) {
  // Below a warp, a warp and a bit, a transformer's attention row, a
  // block's worth and more, odd widths, a row of one.
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {7, 20}, {5, 33}, {2, 3, 128}, {3, 768}, {2, 1000}, {4, 1}, {1, 2049}}) {
    Tensor x = random(shape, 7, 8);
    checkRowKernel(softmax(shape), {x}, "softmax over f32[" + dims(shape) + "]");
  }
}

TEST(RowFusionTest, SoftmaxOverATransposedOperandIsOneKernel) {
  // The rows are read across memory (a transpose heads the group): the
  // row's threads still share them on CUDA, and the CPU's row loop still
  // computes the max and the sum once.
  const std::string text =
      "func @f(%x: f32[200,6]) -> f32[6,200] {\n"
      "  %t = transpose(%x) {perm = [1, 0]} : f32[6,200]\n"
      "  %m = reduce_max(%t) {axes = [1], keepdims = true} : f32[6,1]\n"
      "  %d = sub(%t, %m) : f32[6,200]\n"
      "  %e = exp(%d) : f32[6,200]\n"
      "  %s = reduce_sum(%e) {axes = [1], keepdims = true} : f32[6,1]\n"
      "  %y = div(%e, %s) : f32[6,200]\n"
      "  return %y\n}\n";
  checkRowKernel(text, {random({200, 6}, 9, 6)}, "softmax over a transposed operand");
}

TEST(RowFusionTest, SoftmaxKeepsNanAndInfinityToTheirRows) {
  // A NaN makes its row NaN; +inf makes its row NaN (inf - inf) as in the
  // interpreter; -inf is a zero; the other rows are untouched.
  const std::vector<int64_t> shape{4, 300};
  Tensor x = random(shape, 11, 4);
  x.data<float>()[17] = NAN;
  x.data<float>()[300 + 5] = INFINITY;
  x.data<float>()[600 + 299] = -INFINITY;
  checkRowKernel(softmax(shape), {x}, "softmax with special values");
}

TEST(RowFusionTest, LayerNormAndRmsNormOfWideRowsAreOneKernel) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{6, 64}, {2, 5, 768}, {3, 1023}, {2, 1}}) {
    const int64_t width = shape.back();
    Tensor x = random(shape, 3, 5), g = random({width}, 4, 2), b = random({width}, 5, 1);
    checkRowKernel(layerNorm(shape), {x, g, b}, "layer norm over f32[" + dims(shape) + "]");
    checkRowKernel(rmsNorm(shape), {x, g}, "rms norm over f32[" + dims(shape) + "]");
  }
}

}  // namespace
}  // namespace kiln
