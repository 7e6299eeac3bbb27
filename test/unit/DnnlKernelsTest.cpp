// The CPU executor's oneDNN steps (runtime/DnnlKernels.h): matmuls and
// convolutions large enough to go to oneDNN, alone and with fused epilogues
// as post-ops, must match the interpreter; kiln compile --emit=kernel's text
// (CpuExecutor::kernelIR) shows which steps are library calls.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "codegen/cpu/CpuBackend.h"
#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cpu/CpuTarget.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

/// Inputs for `f`'s arguments, uniform in [-1, 1] from a generator seeded
/// with `seed`.
std::vector<Tensor> randomInputs(const Function& f, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const TensorType& type = f.argument(i)->type();
    Tensor t(type.dtype, staticDims(type.shape));
    for (int64_t j = 0; j < t.numElements(); ++j) t.setDouble(j, real(rng));
    inputs.push_back(std::move(t));
  }
  return inputs;
}

/// Runs `text` on the JIT at `optLevel` and on the interpreter with random
/// inputs in [-1, 1], compares the results with a tolerance for sums of up
/// to a few hundred terms, and returns the JIT's --emit=kernel text.
std::string expectMatches(const std::string& text, int optLevel = 2) {
  SCOPED_TRACE(text);
  auto m = test::parseVerified(text);
  if (!m) return {};
  const Function& f = *m->functions().front();
  const std::vector<Tensor> inputs = randomInputs(f, 7);
  auto want = interpret(f, inputs);
  EXPECT_TRUE(want.ok()) << want.error().str();
  auto executor = CpuExecutor::create(f, {.threads = 2, .optLevel = optLevel});
  EXPECT_TRUE(executor.ok()) << executor.error().str();
  if (!want || !executor) return {};
  auto got = (*executor)->run(inputs);
  EXPECT_TRUE(got.ok()) << got.error().str();
  if (!got) return {};
  EXPECT_EQ(got->size(), want->size());
  for (size_t r = 0; r < want->size() && r < got->size(); ++r) {
    const Tensor &g = (*got)[r], &w = (*want)[r];
    EXPECT_EQ(g.shape(), w.shape());
    if (g.shape() != w.shape()) continue;
    for (int64_t i = 0; i < w.numElements(); ++i)
      EXPECT_NEAR(g.getDouble(i), w.getDouble(i), 1e-4 + 1e-4 * std::fabs(w.getDouble(i))) << "element " << i;
  }
  auto ir = (*executor)->kernelIR(inputs);
  EXPECT_TRUE(ir.ok());
  return ir ? *ir : std::string();
}

std::string matmulFunction(const std::string& a, const std::string& b, const std::string& r) {
  return "func @f(%a: " + a + ", %b: " + b + ") -> " + r + " {\n  %y = matmul(%a, %b) : " + r + "\n  return %y\n}\n";
}

TEST(DnnlKernelsTest, MatMulGoesToOneDnnAndMatches) {
  const char* cases[][3] = {{"f32[4,96]", "f32[96,40]", "f32[4,40]"},
                            {"f32[3,5,64]", "f32[64,7]", "f32[3,5,7]"},
                            {"f32[2,1,6,64]", "f32[3,64,5]", "f32[2,3,6,5]"},
                            {"f32[64]", "f32[64,9]", "f32[9]"},
                            {"f32[9,64]", "f32[64]", "f32[9]"},
                            {"f32[40,50]", "f32[50,60]", "f32[40,60]"}};
  for (auto& c : cases) {
    const std::string ir = expectMatches(matmulFunction(c[0], c[1], c[2]));
    EXPECT_NE(ir.find("library %y: onednn matmul"), std::string::npos) << ir;
    // b without a batch: a's batch and rows are one GEMM's rows.
    if (c[1] == std::string("f32[64,7]")) {
      EXPECT_NE(ir.find("matmul [15,64]x[64,7]"), std::string::npos) << ir;
    }
    if (c[1] == std::string("f32[3,64,5]")) {
      EXPECT_NE(ir.find("matmul [2,1,6,64]x[1,3,64,5]"), std::string::npos) << ir;
    }
  }
}

/// A product whose b has no batch is given to oneDNN as one GEMM over a's
/// batch and rows; its tensor post-ops must then be per column ([N]) or per
/// element ([B..., M, N]), and one broadcast another way keeps the batch.
TEST(DnnlKernelsTest, UnbatchedWeightsMakeOneGemm) {
  const std::string bias = expectMatches(
      "func @f(%x: f32[4,6,64], %w: f32[64,32], %b: f32[32], %r: f32[4,6,32]) -> f32[4,6,32] {\n"
      "  %m = matmul(%x, %w) : f32[4,6,32]\n  %s = add(%m, %b) : f32[4,6,32]\n"
      "  %t = add(%s, %r) : f32[4,6,32]\n  return %t\n}\n");
  EXPECT_NE(bias.find("onednn matmul [24,64]x[64,32] + add, add"), std::string::npos) << bias;
  const std::string rows = expectMatches(
      "func @f(%x: f32[4,6,64], %w: f32[64,32], %c: f32[4,1,32]) -> f32[4,6,32] {\n"
      "  %m = matmul(%x, %w) : f32[4,6,32]\n  %s = add(%m, %c) : f32[4,6,32]\n  return %s\n}\n");
  EXPECT_NE(rows.find("onednn matmul [4,6,64]x[1,64,32] + add"), std::string::npos) << rows;
}

/// Convolutions and pools stored channels last (as assign-layouts makes
/// them): the interpreter's reference gives the channels-first results
/// transposed, and the JIT matches it both through oneDNN (f32) and through
/// generated loop nests (f64, which oneDNN is not given).
std::string channelsLastFunction(const std::string& t) {
  auto ty = [&](const std::string& dims) { return t + "[" + dims + "]"; };
  return "func @f(%x: " + ty("2,3,7,6") + ", %w: " + ty("4,3,3,2") + ", %b: " + ty("4") + ") -> (" + ty("2,4,6,3") +
         ", " + ty("2,4,6,3") + ", " + ty("2,4,3,2") + ", " + ty("2,4,3,2") + ", " + ty("2,4,6,3") + ", " +
         ty("2,4,6,3") + ") {\n"
         "  %a = conv(%x, %w, %b) {strides = [1, 2], pads = [1, 0, 0, 1]} : " + ty("2,4,6,3") + "\n"
         "  %xt = transpose(%x) {perm = [0, 2, 3, 1]} : " + ty("2,7,6,3") + "\n"
         "  %c = conv(%xt, %w, %b) {channels_last = true, strides = [1, 2], pads = [1, 0, 0, 1]} : " + ty("2,6,3,4") + "\n"
         "  %ct = transpose(%c) {perm = [0, 3, 1, 2]} : " + ty("2,4,6,3") + "\n"
         "  %p = max_pool(%a) {kernel = [2, 2], strides = [2, 1]} : " + ty("2,4,3,2") + "\n"
         "  %pl = max_pool(%c) {channels_last = true, kernel = [2, 2], strides = [2, 1]} : " + ty("2,3,2,4") + "\n"
         "  %plt = transpose(%pl) {perm = [0, 3, 1, 2]} : " + ty("2,4,3,2") + "\n"
         "  %q = avg_pool(%a) {kernel = [3, 2], pads = [1, 1, 1, 0]} : " + ty("2,4,6,3") + "\n"
         "  %ql = avg_pool(%c) {channels_last = true, kernel = [3, 2], pads = [1, 1, 1, 0]} : " + ty("2,6,3,4") + "\n"
         "  %qlt = transpose(%ql) {perm = [0, 3, 1, 2]} : " + ty("2,4,6,3") + "\n"
         "  return %a, %ct, %p, %plt, %q, %qlt\n}\n";
}

TEST(DnnlKernelsTest, ChannelsLastConvAndPoolsMatchChannelsFirst) {
  for (const char* dtype : {"f32", "f64"}) {
    const std::string text = channelsLastFunction(dtype);
    SCOPED_TRACE(text);
    auto m = test::parseVerified(text);
    ASSERT_TRUE(m);
    const Function& f = *m->functions().front();
    const std::vector<Tensor> inputs = randomInputs(f, 11);
    auto results = interpret(f, inputs);
    ASSERT_TRUE(results.ok()) << results.error().str();
    for (size_t r = 0; r < 6; r += 2) {
      const Tensor &first = (*results)[r], &last = (*results)[r + 1];
      ASSERT_EQ(first.shape(), last.shape());
      for (int64_t i = 0; i < first.numElements(); ++i)
        EXPECT_NEAR(first.getDouble(i), last.getDouble(i), 1e-6) << "result " << r << " element " << i;
    }
    const std::string ir = expectMatches(text);
    if (std::string(dtype) == "f32") {
      EXPECT_NE(ir.find("channels last)"), std::string::npos) << ir;
    } else {
      EXPECT_EQ(ir.find("library"), std::string::npos) << ir;
    }
  }
}

/// ShuffleNet's unit carried channels last by assign-layouts: the two
/// halves of the channels (slices), a padded depthwise conv on one, the
/// concat and the channel shuffle (reshape, swap of the channel dims,
/// reshape back). The JIT, with every conv channels last and no transpose
/// between them, matches the interpreter at batch 1 and 2.
TEST(DnnlKernelsTest, ChannelShuffleSlicesAndPadsStayChannelsLast) {
  for (const char* n : {"1", "2"}) {
    const std::string x = std::string("f32[") + n + ",8,6,6]", half = std::string("f32[") + n + ",4,6,6]";
    const std::string text =
        "func @f(%x: " + x + ", %w: f32[8,8,1,1], %dw: f32[4,1,3,3]) -> " + x + " {\n"
        "  %x0 = conv(%x, %w) : " + x + "\n"
        "  %a = slice(%x0) {starts = [0, 0, 0, 0], ends = [" + n + ", 4, 6, 6], steps = [1, 1, 1, 1]} : " + half + "\n"
        "  %b = slice(%x0) {starts = [0, 4, 0, 0], ends = [" + n + ", 8, 6, 6], steps = [1, 1, 1, 1]} : " + half + "\n"
        "  %p = pad(%b) {pads = [0, 0, 1, 1, 0, 0, 1, 1]} : f32[" + n + ",4,8,8]\n"
        "  %y = conv(%p, %dw) {groups = 4} : " + half + "\n"
        "  %c = concat(%a, %y) {axis = 1} : " + x + "\n"
        "  %s = reshape(%c) : f32[" + n + ",2,4,6,6]\n"
        "  %t = transpose(%s) {perm = [0, 2, 1, 3, 4]} : f32[" + n + ",4,2,6,6]\n"
        "  %u = reshape(%t) : " + x + "\n"
        "  %z = conv(%u, %w) : " + x + "\n"
        "  return %z\n}\n";
    const std::string ir = expectMatches(text);
    size_t convs = 0;
    for (size_t at = ir.find("onednn conv"); at != std::string::npos; at = ir.find("onednn conv", at + 1)) ++convs;
    EXPECT_EQ(convs, 3u) << ir;
    // The input's transpose to channels last, the shuffle's own swap (of
    // the last two dims once channels last) and the result's transpose
    // back: none between the convolutions.
    size_t transposes = 0;
    for (size_t at = ir.find("_transpose_"); at != std::string::npos; at = ir.find("_transpose_", at + 1)) ++transposes;
    EXPECT_EQ(transposes, 3u) << ir;
    EXPECT_NE(ir.find("(in %b0: f32[" + std::string(n) + ",6,6,2,4] \"s\""), std::string::npos) << ir;
  }
}

/// conv_weight_grad (a conv's dw in a training step): the interpreter's
/// reference equals the formulation autodiff used before it, a conv of x^T
/// by dy^T cropped and transposed back, and the JIT matches the interpreter
/// through oneDNN's backward-weights convolution (f32: strided, padded,
/// dilated, grouped) and through a generated kernel (f64).
TEST(DnnlKernelsTest, ConvWeightGradMatchesTheConvOfTransposes) {
  const std::string reference =
      "func @f(%x: f64[2,4,7,6], %dy: f64[2,6,4,3]) -> (f64[6,4,3,2], f64[6,4,3,2]) {\n"
      "  %g = conv_weight_grad(%x, %dy) {kernel = [3, 2], strides = [2, 2], pads = [1, 0, 1, 0]} : f64[6,4,3,2]\n"
      "  %xt = transpose(%x) {perm = [1, 0, 2, 3]} : f64[4,2,7,6]\n"
      "  %dyt = transpose(%dy) {perm = [1, 0, 2, 3]} : f64[6,2,4,3]\n"
      "  %full = conv(%xt, %dyt) {dilations = [2, 2], pads = [1, 0, 1, 0]} : f64[4,6,3,2]\n"
      "  %c = transpose(%full) {perm = [1, 0, 2, 3]} : f64[6,4,3,2]\n"
      "  return %g, %c\n}\n";
  auto m = test::parseVerified(reference);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const std::vector<Tensor> inputs = randomInputs(f, 5);
  auto results = interpret(f, inputs);
  ASSERT_TRUE(results.ok()) << results.error().str();
  for (int64_t i = 0; i < (*results)[0].numElements(); ++i)
    EXPECT_NEAR((*results)[0].getDouble(i), (*results)[1].getDouble(i), 1e-12) << "element " << i;

  for (const char* dtype : {"f32", "f64"}) {
    const std::string t = dtype;
    const std::string ir = expectMatches(
        "func @f(%x: " + t + "[2,6,9,8], %dy: " + t + "[2,4,5,2]) -> " + t + "[4,3,3,3] {\n"
        "  %g = conv_weight_grad(%x, %dy) {kernel = [3, 3], strides = [2, 3], pads = [1, 1, 1, 0], dilations = [1, 2], "
        "groups = 2} : " + t + "[4,3,3,3]\n  return %g\n}\n");
    if (t == "f32") {
      EXPECT_NE(ir.find("library %g: onednn conv_weight_grad [2,6,9,8]*[2,4,5,2] -> [2,2,3,3,3]"), std::string::npos)
          << ir;
    } else {
      EXPECT_EQ(ir.find("library"), std::string::npos) << ir;
    }
  }
}

/// scatter_elements compiles to a scatter: one line of the result along
/// the axis per parallel iteration, the data copied, then the updates
/// applied in order (a loop over the updates along the axis, not a gather
/// of all of them for each element); duplicate and negative indices,
/// indices narrower than the data, every reduction and both axes match the
/// interpreter.
TEST(DnnlKernelsTest, ScatterElementsIsAScatterKernel) {
  const char* cases[] = {
      "func @f(%d: f32[6,4], %u: f32[3,4]) -> f32[6,4] {\n"
      "  %i = constant() {value = dense<i64[3,4]>[0, 5, -1, 2, 0, 0, 3, 2, 5, 1, -1, 2]} : i64[3,4]\n"
      "  %s = scatter_elements(%d, %i, %u) {axis = 0, reduction = \"add\"} : f32[6,4]\n  return %s\n}\n",
      "func @f(%d: f32[6,4], %u: f32[3,2]) -> f32[6,4] {\n"
      "  %i = constant() {value = dense<i32[3,2]>[1, 1, 1, 4, -6, 1]} : i32[3,2]\n"
      "  %s = scatter_elements(%d, %i, %u) {axis = 0, reduction = \"none\"} : f32[6,4]\n  return %s\n}\n",
      "func @f(%d: f32[2,5,3], %u: f32[2,4,3]) -> f32[2,5,3] {\n"
      "  %i = constant() {value = dense<i64[2,4,3]>[0, 1, 2, 4, 4, 4, 0, 0, 0, 3, 2, 1, 1, 1, 1, 1, 1, 1, 0, 2, 4, "
      "3, 3, 3]} : i64[2,4,3]\n"
      "  %s = scatter_elements(%d, %i, %u) {axis = 1, reduction = \"max\"} : f32[2,5,3]\n  return %s\n}\n",
      "func @f(%d: f32[3,5], %u: f32[3,2]) -> f32[3,5] {\n"
      "  %i = constant() {value = dense<i64[3,2]>[4, 4, 0, -5, 2, 1]} : i64[3,2]\n"
      "  %s = scatter_elements(%d, %i, %u) {axis = 1, reduction = \"mul\"} : f32[3,5]\n  return %s\n}\n"};
  for (const char* text : cases) {
    const std::string ir = expectMatches(text);
    EXPECT_NE(ir.find("kernel @kiln0_scatter_elements"), std::string::npos) << ir;
    EXPECT_NE(ir.find("for %i2 in"), std::string::npos) << ir;  // the loop over the updates
  }
}

/// A product too small to pay for oneDNN's call stays a generated loop nest.
TEST(DnnlKernelsTest, SmallMatMulStaysGenerated) {
  const std::string ir = expectMatches(matmulFunction("f32[2,16]", "f32[16,8]", "f32[2,8]"));
  EXPECT_EQ(ir.find("library"), std::string::npos) << ir;
  EXPECT_NE(ir.find("kernel @"), std::string::npos) << ir;
}

TEST(DnnlKernelsTest, ConvGoesToOneDnnAndMatches) {
  const char* cases[] = {
      "func @f(%x: f32[2,3,9,9], %w: f32[8,3,3,3], %b: f32[8]) -> f32[2,8,5,5] {\n"
      "  %y = conv(%x, %w, %b) {strides = [2, 2], pads = [1, 1, 1, 1]} : f32[2,8,5,5]\n  return %y\n}\n",
      "func @f(%x: f32[1,4,8,8], %w: f32[6,2,3,3]) -> f32[1,6,4,4] {\n"
      "  %y = conv(%x, %w) {dilations = [2, 2], groups = 2} : f32[1,6,4,4]\n  return %y\n}\n",
      "func @f(%x: f32[1,2,9], %w: f32[3,2,3]) -> f32[1,3,7] {\n  %y = conv(%x, %w) : f32[1,3,7]\n  return %y\n}\n",
      "func @f(%x: f32[1,2,4,5,6], %w: f32[3,2,2,2,2]) -> f32[1,3,4,5,6] {\n"
      "  %y = conv(%x, %w) {pads = [1, 1, 1, 0, 0, 0]} : f32[1,3,4,5,6]\n  return %y\n}\n"};
  for (const char* text : cases) {
    const std::string ir = expectMatches(text);
    EXPECT_NE(ir.find("library %y: onednn conv"), std::string::npos) << ir;
    // The 2-d cases are stored channels last (assign-layouts), with
    // transposes at the function's edges; the 3-d one is not, and oneDNN
    // picks blocked layouts for it, so its reorders in and out are checked.
    if (text == cases[0] || text == cases[1]) {
      EXPECT_NE(ir.find(", channels last)"), std::string::npos) << ir;
      EXPECT_NE(ir.find("transpose"), std::string::npos) << ir;
    }
    if (text == cases[3]) {
      EXPECT_NE(ir.find(", blocked)"), std::string::npos) << ir;
      EXPECT_EQ(ir.find("channels last"), std::string::npos) << ir;
    }
  }
}

/// Binary post-ops on a batched product with broadcast weights have only
/// oneDNN's reference implementation, many times slower than its matmul
/// with a generated epilogue kernel: select-library offers oneDNN a
/// shorter epilogue (the product times %a has an optimized one), and the
/// rest is a generated kernel. The weights have no batch, so oneDNN is
/// given one [64,128]x[128,32] product.
TEST(DnnlKernelsTest, ReferenceImplementationsAreRefused) {
  const std::string ir = expectMatches(
      "func @f(%x: f32[8,8,128], %w: f32[1,128,32], %a: f32[32], %b: f32[8,8,1]) -> f32[8,8,32] {\n"
      "  %m = matmul(%x, %w) : f32[8,8,32]\n  %p = mul(%m, %a) : f32[8,8,32]\n"
      "  %q = mul(%p, %b) : f32[8,8,32]\n  return %q\n}\n",
      3);
  EXPECT_NE(ir.find("library %p: onednn matmul [64,128]x[128,32] + mul ("), std::string::npos) << ir;
  EXPECT_EQ(ir.find("(ref"), std::string::npos) << ir;
  EXPECT_NE(ir.find("kernel @"), std::string::npos) << ir;
}

/// A group returning exp(x) and its row sums is split into one kernel per
/// result; the sum's kernel reads the exp's buffer instead of computing
/// every exp again.
TEST(DnnlKernelsTest, SplitGroupReadsAnEarlierResult) {
  const std::string ir = expectMatches(
      "func @f(%x: f32[8,64]) -> (f32[8,64], f32[8,1]) {\n  %m = reduce_max(%x) {axes = [1], keepdims = true} : "
      "f32[8,1]\n  %d = sub(%x, %m) : f32[8,64]\n  %e = exp(%d) : f32[8,64]\n"
      "  %s = reduce_sum(%e) {axes = [1], keepdims = true} : f32[8,1]\n  return %e, %s\n}\n",
      3);
  size_t exps = 0;
  for (size_t pos = 0; (pos = ir.find("exp(", pos)) != std::string::npos; ++pos) ++exps;
  EXPECT_EQ(exps, 1u) << ir;
}

/// conv_transpose (a conv's input gradient, and the placing of pooling
/// gradients) runs as oneDNN's deconvolution: strides, pads with
/// output_padding, groups, dilations, 1-d, bias; its weights [C, M/g, K...]
/// are read through strides.
TEST(DnnlKernelsTest, ConvTransposeGoesToOneDnnAndMatches) {
  const char* cases[] = {
      "func @f(%x: f32[2,4,5,5], %w: f32[4,3,3,3], %b: f32[3]) -> f32[2,3,10,10] {\n"
      "  %y = conv_transpose(%x, %w, %b) {strides = [2, 2], pads = [1, 1, 1, 1], output_padding = [1, 1]} : "
      "f32[2,3,10,10]\n  return %y\n}\n",
      "func @f(%x: f32[1,4,6,6], %w: f32[4,2,3,3]) -> f32[1,4,10,10] {\n"
      "  %y = conv_transpose(%x, %w) {dilations = [2, 2], groups = 2} : f32[1,4,10,10]\n  return %y\n}\n",
      "func @f(%x: f32[1,2,7], %w: f32[2,3,3]) -> f32[1,3,9] {\n  %y = conv_transpose(%x, %w) : f32[1,3,9]\n"
      "  return %y\n}\n",
      "func @f(%x: f32[8,4,7,7], %w: f32[4,1,2,2]) -> f32[8,1,14,14] {\n"
      "  %y = conv_transpose(%x, %w) {strides = [2, 2]} : f32[8,1,14,14]\n  return %y\n}\n"};
  for (const char* text : cases) {
    const std::string ir = expectMatches(text);
    EXPECT_NE(ir.find("library %y: onednn deconv"), std::string::npos) << ir;
  }
}

/// At -O3 an epilogue group whose ops are a chain becomes post-ops of one
/// oneDNN call.
TEST(DnnlKernelsTest, EpiloguesBecomePostOps) {
  std::string ir = expectMatches(
      "func @f(%x: f32[8,64], %w: f32[64,12], %b: f32[12]) -> f32[8,12] {\n  %m = matmul(%x, %w) : f32[8,12]\n"
      "  %s = add(%m, %b) : f32[8,12]\n  %r = relu(%s) : f32[8,12]\n  return %r\n}\n",
      3);
  EXPECT_NE(ir.find("onednn matmul [8,64]x[64,12] + add, relu"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("kernel @"), std::string::npos) << ir;

  ir = expectMatches(
      "func @f(%x: f32[8,64], %w: f32[64,12], %c: f32[8,12]) -> f32[8,12] {\n  %m = matmul(%x, %w) : f32[8,12]\n"
      "  %h = constant() {value = dense<f32[]>[0.5]} : f32[]\n  %s = mul(%m, %h) : f32[8,12]\n"
      "  %d = sub(%s, %c) : f32[8,12]\n  %t = sigmoid(%d) : f32[8,12]\n  return %t\n}\n",
      3);
  EXPECT_NE(ir.find("+ mul, sub, sigmoid"), std::string::npos) << ir;

  ir = expectMatches(
      "func @f(%x: f32[1,3,10,10], %w: f32[4,3,3,3], %b: f32[4]) -> f32[1,4,8,8] {\n"
      "  %y = conv(%x, %w, %b) : f32[1,4,8,8]\n  %r = relu(%y) : f32[1,4,8,8]\n  return %r\n}\n",
      3);
  EXPECT_NE(ir.find("onednn conv [1,3,10,10]*[4,3,3,3] + relu"), std::string::npos) << ir;
}

/// A convolution stored channels first (a 1-d one: assign-layouts stores
/// only 2-d ones channels last) takes its residual add and relu as post-ops:
/// oneDNN 3.x has a jit kernel for a blocked result only with the added
/// tensor in the same blocked layout, so that operand is reordered into it
/// (with the plain one it offers only its reference kernel, which the CPU
/// target refuses, and the add and relu were a generated kernel).
TEST(DnnlKernelsTest, ChannelsFirstConvTakesItsResidualAdd) {
  const std::string ir = expectMatches(
      "func @f(%x: f32[2,8,32], %w: f32[16,8,3], %b: f32[16], %r: f32[2,16,30]) -> f32[2,16,30] {\n"
      "  %y = conv(%x, %w, %b) : f32[2,16,30]\n  %a = add(%y, %r) : f32[2,16,30]\n"
      "  %z = relu(%a) : f32[2,16,30]\n  return %z\n}\n",
      3);
  EXPECT_NE(ir.find("onednn conv [2,8,32]*[16,8,3] + add, relu ("), std::string::npos) << ir;
  EXPECT_EQ(ir.find("ref:"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("channels last"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("kernel @"), std::string::npos) << ir;
}

/// A max or min with a constant other than max(x, +0) (a relu) is oneDNN's
/// clip, which turns NaN into a bound (PostOpSpecialValuesTest): the two
/// become one clip post-op, guarded, so that oneDNN's runs only where no NaN
/// reaches it, and the host clips otherwise.
TEST(DnnlKernelsTest, MaxAndMinWithAConstantAreOneGuardedClip) {
  const std::string ir = expectMatches(
      "func @f(%x: f32[1,3,10,10], %w: f32[4,3,3,3]) -> f32[1,4,8,8] {\n  %y = conv(%x, %w) : f32[1,4,8,8]\n"
      "  %lo = constant() {value = dense<f32[]>[-0.1]} : f32[]\n"
      "  %hi = constant() {value = dense<f32[]>[0.25]} : f32[]\n"
      "  %a = max(%y, %lo) : f32[1,4,8,8]\n  %b = min(%a, %hi) : f32[1,4,8,8]\n  return %b\n}\n",
      3);
  EXPECT_NE(ir.find("onednn conv [1,3,10,10]*[4,3,3,3] + max+min ("), std::string::npos) << ir;
  EXPECT_NE(ir.find(") guarded"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("kiln_fmin"), std::string::npos) << ir;
}

/// oneDNN 2.6 gives every eltwise post-op of one algorithm the parameters
/// of the first: a conv + mul 0.5 + add 3 computed y * 0.25. Two scalar
/// ops are not folded into one linear either (one fma rounds once where
/// the ops round twice), so a second one with other parameters ends the
/// post-ops; the scalar ops before it then go with it into one generated
/// kernel (select-library), which reads the conv's result either way.
TEST(DnnlKernelsTest, RepeatedEltwisePostOpsStop) {
  const std::string conv =
      "func @f(%x: f32[1,3,10,10], %w: f32[4,3,3,3]) -> f32[1,4,8,8] {\n  %y = conv(%x, %w) : f32[1,4,8,8]\n"
      "  %h = constant() {value = dense<f32[]>[0.5]} : f32[]\n"
      "  %t = constant() {value = dense<f32[]>[3.0]} : f32[]\n";
  for (const std::string epilogue :
       {"  %a = mul(%y, %h) : f32[1,4,8,8]\n  %b = add(%a, %t) : f32[1,4,8,8]\n  return %b\n}\n",
        "  %a = mul(%y, %h) : f32[1,4,8,8]\n  %s = tanh(%a) : f32[1,4,8,8]\n"
        "  %b = add(%s, %t) : f32[1,4,8,8]\n  return %b\n}\n"}) {
    const std::string ir = expectMatches(conv + epilogue, 3);
    EXPECT_NE(ir.find("onednn conv [1,3,10,10]*[4,3,3,3] ("), std::string::npos) << ir;
    EXPECT_NE(ir.find("kernel @"), std::string::npos) << ir;
  }
}

/// GELU and SiLU, whole ops when select-library sees them (raise-activations
/// restores them from exported subgraphs), each become one oneDNN post-op;
/// but not erf GELU, which oneDNN computes as NaN for +inf where the IR has
/// +inf (DnnlKernel::exactPostOp): it is a generated kernel.
TEST(DnnlKernelsTest, ScalarFunctionsOfTheProductBecomeOnePostOp) {
  const std::string erf = expectMatches(
      "func @f(%x: f32[8,64], %w: f32[64,12], %b: f32[12]) -> f32[8,12] {\n  %m = matmul(%x, %w) : f32[8,12]\n"
      "  %s = add(%m, %b) : f32[8,12]\n  %g = gelu(%s) : f32[8,12]\n  return %g\n}\n",
      3);
  EXPECT_NE(erf.find("+ add ("), std::string::npos) << erf;
  EXPECT_NE(erf.find("kernel @"), std::string::npos) << erf;
  const char* cases[][2] = {{"gelu(%s) {approximate = \"tanh\"}", "+ add, gelu_tanh ("},
                            {"silu(%s)", "+ add, swish ("}};
  for (auto& c : cases) {
    const std::string ir = expectMatches(
        "func @f(%x: f32[8,64], %w: f32[64,12], %b: f32[12]) -> f32[8,12] {\n  %m = matmul(%x, %w) : f32[8,12]\n"
        "  %s = add(%m, %b) : f32[8,12]\n  %g = " +
            std::string(c[0]) + " : f32[8,12]\n  return %g\n}\n",
        3);
    EXPECT_NE(ir.find(c[1]), std::string::npos) << ir;
    EXPECT_EQ(ir.find("kernel @"), std::string::npos) << ir;
  }
}

/// An epilogue that is neither a chain nor a known function of the product
/// (x + e^x) still matches: the product goes to oneDNN and the rest is a
/// generated kernel.
TEST(DnnlKernelsTest, EpilogueWithoutPostOpsStillMatches) {
  const std::string ir = expectMatches(
      "func @f(%x: f32[8,64], %w: f32[64,12]) -> f32[8,12] {\n  %m = matmul(%x, %w) : f32[8,12]\n"
      "  %e = exp(%m) : f32[8,12]\n  %g = add(%m, %e) : f32[8,12]\n  return %g\n}\n",
      3);
  EXPECT_NE(ir.find("library"), std::string::npos) << ir;
  EXPECT_NE(ir.find("kernel @"), std::string::npos) << ir;
}

/// A fused group with two results, both reading one matmul through
/// epilogues without post-ops (a training step's forward product feeding
/// its backward): split per result, the matmul runs once, as one library
/// step both parts read, instead of two ops of one name (which failed
/// verification).
TEST(DnnlKernelsTest, MultiResultGroupSharesItsContraction) {
  const std::string ir = expectMatches(
      "func @f(%x: f32[64,32], %w: f32[32,48], %c: f32[64,48]) -> (f32[64,48], f32[64,48]) {\n"
      "  %mm = matmul(%x, %w) : f32[64,48]\n  %a = mul(%mm, %mm) : f32[64,48]\n"
      "  %b = add(%mm, %c) : f32[64,48]\n  %d = mul(%b, %mm) : f32[64,48]\n  return %a, %d\n}\n",
      3);
  size_t libraries = 0, kernels = 0;
  for (size_t pos = 0; (pos = ir.find("library %", pos)) != std::string::npos; ++pos) ++libraries;
  for (size_t pos = 0; (pos = ir.find("kernel @", pos)) != std::string::npos; ++pos) ++kernels;
  EXPECT_EQ(libraries, 1u) << ir;
  EXPECT_EQ(kernels, 2u) << ir;
}

/// A constant b without a batch is packed once in oneDNN's layout, one copy
/// shared by every matmul by it (two here, of other row counts, one with a
/// post-op), and both still match the interpreter.
TEST(DnnlKernelsTest, ConstantWeightsArePackedOnceAndShared) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> real(-0.5, 0.5);
  std::string w = "dense<f32[64,48]>[";
  for (int i = 0; i < 64 * 48; ++i) w += (i ? ", " : "") + std::to_string(real(rng));
  const std::string text = "func @f(%x: f32[16,64], %y: f32[12,64], %b: f32[48]) -> (f32[16,48], f32[12,48]) {\n"
                           "  %w = constant() {value = " + w + "]} : f32[64,48]\n"
                           "  %m = matmul(%x, %w) : f32[16,48]\n  %n = matmul(%y, %w) : f32[12,48]\n"
                           "  %s = add(%n, %b) : f32[12,48]\n  return %m, %s\n}\n";
  auto m = test::parseVerified(text);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const std::vector<Tensor> inputs = {test::randomF32({16, 64}, 1), test::randomF32({12, 64}, 2),
                                      test::randomF32({48}, 3)};
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  StepProfile profile;
  auto executor = CpuExecutor::create(f, {.threads = 2, .profile = &profile});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  for (int run = 0; run < 2; ++run) {
    auto got = (*executor)->run(inputs);
    ASSERT_TRUE(got.ok()) << got.error().str();
    ASSERT_EQ(got->size(), 2u);
    for (size_t r = 0; r < 2; ++r) test::expectClose((*got)[r], (*want)[r], "result " + std::to_string(r));
  }
  int packed = 0;
  for (const StepProfile::Entry& e : profile.entries) packed += e.what.find(", packed b)") != std::string::npos;
  EXPECT_EQ(packed, 2);
}

/// `dense<f32[dims]>[...]` of `n` values uniform in [-0.5, 0.5) from `seed`.
std::string denseText(const std::string& dims, int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-0.5, 0.5);
  std::string text = "dense<f32[" + dims + "]>[";
  for (int64_t i = 0; i < n; ++i) text += (i ? ", " : "") + std::to_string(real(rng));
  return text + "]";
}

/// A matmul whose b is the transpose of a constant (a Linear's weight
/// exported with Gemm's transB) reads the constant in place: select-library
/// puts the transpose in the library group, and the call reads b through
/// transposed strides, so no step copies the weight. (Canonicalize folds
/// such a transpose of up to 2^25 elements at compile time; select-library
/// runs here first, as it would for a larger weight.) The results match the
/// interpreter's: through oneDNN's packed GEMM (16 rows), the packed matmul
/// of few rows (2 rows), and a batched b; and a square constant read both
/// as b and as b transposed gets two packed copies, not one for both, in
/// oneDNN's cache and in the packed matmul's.
TEST(DnnlKernelsTest, TransposedConstantWeightsAreReadInPlace) {
  const std::string text =
      "func @f(%x: f32[16,64], %y: f32[2,64], %z: f32[16,64], %u: f32[3,5,64], %b: f32[48]) -> "
      "(f32[16,48], f32[2,48], f32[16,64], f32[16,64], f32[3,5,40], f32[2,64], f32[2,64]) {\n"
      "  %w = constant() {value = " + denseText("48,64", 48 * 64, 1) + "} : f32[48,64]\n"
      "  %wt = transpose(%w) {perm = [1, 0]} : f32[64,48]\n"
      "  %m = matmul(%x, %wt) : f32[16,48]\n  %s = add(%m, %b) : f32[16,48]\n"
      "  %v = constant() {value = " + denseText("48,64", 48 * 64, 2) + "} : f32[48,64]\n"
      "  %vt = transpose(%v) {perm = [1, 0]} : f32[64,48]\n"
      "  %n = matmul(%y, %vt) : f32[2,48]\n  %r = relu(%n) : f32[2,48]\n"
      "  %q = constant() {value = " + denseText("64,64", 64 * 64, 3) + "} : f32[64,64]\n"
      "  %qt = transpose(%q) {perm = [1, 0]} : f32[64,64]\n"
      "  %p = matmul(%z, %qt) : f32[16,64]\n  %o = matmul(%z, %q) : f32[16,64]\n"
      "  %qt2 = transpose(%q) {perm = [1, 0]} : f32[64,64]\n"
      "  %e = matmul(%y, %qt2) : f32[2,64]\n  %g = matmul(%y, %q) : f32[2,64]\n"
      "  %c = constant() {value = " + denseText("3,40,64", 3 * 40 * 64, 4) + "} : f32[3,40,64]\n"
      "  %ct = transpose(%c) {perm = [0, 2, 1]} : f32[3,64,40]\n"
      "  %k = matmul(%u, %ct) : f32[3,5,40]\n"
      "  return %s, %r, %p, %o, %k, %e, %g\n}\n";
  auto m = test::parseVerified(text);
  ASSERT_TRUE(m);
  Function& f = *m->functions().front();
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i)
    inputs.push_back(test::randomF32(staticDims(f.argument(i)->type().shape), static_cast<int>(i) + 1));
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();

  PassContext ctx;
  ctx.target = &codegen::cpuBackend().target();
  PassManager pm(PassManagerOptions{}, ctx);
  ASSERT_TRUE(pm.addPipeline("infer-shapes,select-library").ok());
  std::ostringstream log;
  Status selected = pm.run(*m, log);
  ASSERT_TRUE(selected.ok()) << selected.error().str();
  // Each transpose is in its matmul's group, whose operand is the constant.
  int groups = 0;
  for (const auto& op : f.ops()) {
    EXPECT_NE(op->kind(), OpKind::Transpose) << "a transpose outside the library groups";
    if (op->kind() != OpKind::Fused || op->result()->name() == "o" || op->result()->name() == "g") continue;
    ++groups;
    EXPECT_EQ(op->region()->ops().front()->kind(), OpKind::Transpose);
    EXPECT_EQ(op->operand(1)->definingOp()->kind(), OpKind::Constant);
    auto call = codegen::describeLibraryCall(*op);
    ASSERT_TRUE(call.ok()) << call.error().str();
    EXPECT_TRUE(call->transposedB);
  }
  EXPECT_EQ(groups, 5);

  StepProfile profile;
  auto executor = CpuExecutor::create(f, {.threads = 2, .profile = &profile});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  for (int run = 0; run < 2; ++run) {
    auto got = (*executor)->run(inputs);
    ASSERT_TRUE(got.ok()) << got.error().str();
    ASSERT_EQ(got->size(), want->size());
    for (size_t r = 0; r < want->size(); ++r) test::expectClose((*got)[r], (*want)[r], "result " + std::to_string(r));
  }
  int transposed = 0, steps = 0;
  for (const StepProfile::Entry& e : profile.entries) {
    ++steps;
    transposed += e.what.find("b stored transposed") != std::string::npos;
    EXPECT_EQ(e.what.find("transpose ->"), std::string::npos) << e.what;
  }
  EXPECT_EQ(steps, 7);
  EXPECT_EQ(transposed, 5);
}

/// (transposed a, transposed b, batched): every combination.
class TransposedOperandsTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

/// A transposed a or b of any value (an argument here, a training step's
/// weight or gradient in a model), batched or not, is read in place by
/// oneDNN through transposed strides: the results match the interpreter's,
/// and the step list has the one library call and no transpose kernel.
TEST_P(TransposedOperandsTest, ReadInPlaceMatchesTheInterpreter) {
  const auto [transposedA, transposedB, batched] = GetParam();
  const std::string ir = expectMatches(test::transposedMatmulFunction(transposedA, transposedB, batched));
  EXPECT_NE(ir.find("library %y: onednn matmul"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("a stored transposed") != std::string::npos, transposedA) << ir;
  EXPECT_EQ(ir.find("b stored transposed") != std::string::npos, transposedB) << ir;
  EXPECT_EQ(ir.find("kernel"), std::string::npos) << "a transpose copied by a kernel:\n" << ir;
}

INSTANTIATE_TEST_SUITE_P(DnnlKernelsTest, TransposedOperandsTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()));

}  // namespace
}  // namespace kiln
