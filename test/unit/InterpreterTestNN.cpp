// Tests of the interpreter's contraction, window, random and composite
// kernels: matmul (1-D, batched, broadcast batch dims), conv (stride, pad,
// dilation, groups, bias), conv_transpose, max/avg pooling (pads, ceil_mode,
// count_include_pad), random determinism, softmax, normalisations,
// activations, attention with masks, losses, and rnn/lstm/gru against
// step loops written independently here. Small cases are worked by hand.
#include <cmath>
#include <limits>
#include <numbers>

#include "test/unit/InterpreterTestSupport.h"

namespace kiln::test {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

TensorType type(DType dtype, std::vector<int64_t> dims) { return TensorType{dtype, staticShape(dims)}; }

std::vector<double> range(int from, int to) {
  std::vector<double> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

// --- matmul ----------------------------------------------------------------------------

TEST(InterpreterMatMulTest, Matrices) {
  expectTensor(run(OpKind::MatMul, {f32({2, 2}, {1, 2, 3, 4}), f32({2, 2}, {5, 6, 7, 8})}), {2, 2}, {19, 22, 43, 50});
  expectTensor(run(OpKind::MatMul, {f32({1, 3}, {1, 2, 3}), f32({3, 2}, {1, 0, 0, 1, 1, 1})}), {1, 2}, {4, 5});
  expectInts(run(OpKind::MatMul, {ints(DType::I32, {1, 2}, {3, -4}), ints(DType::I32, {2, 1}, {5, 6})}), {1, 1}, {-9});
  // K = 0 sums nothing.
  expectTensor(run(OpKind::MatMul, {f32({2, 0}, {}), f32({0, 3}, {})}), {2, 3}, {0, 0, 0, 0, 0, 0});
}

TEST(InterpreterMatMulTest, RankOneOperands) {
  expectTensor(run(OpKind::MatMul, {f32({3}, {1, 2, 3}), f32({3}, {4, 5, 6})}), {}, {32});
  expectTensor(run(OpKind::MatMul, {f32({2}, {1, 2}), f32({2, 3}, {1, 2, 3, 4, 5, 6})}), {3}, {9, 12, 15});
  expectTensor(run(OpKind::MatMul, {f32({2, 2}, {1, 2, 3, 4}), f32({2}, {1, 1})}), {2}, {3, 7});
  // A batched matrix times a vector.
  expectTensor(run(OpKind::MatMul, {f32({2, 1, 2}, {1, 2, 3, 4}), f32({2}, {1, 10})}), {2, 1}, {21, 43});
}

TEST(InterpreterMatMulTest, BatchDimsBroadcast) {
  // a[2,1,1,2] x b[3,2,1] -> [2,3,1,1]: out[i,j] = a_i . b_j.
  Tensor a = f32({2, 1, 1, 2}, {1, 2, 3, 4});
  Tensor b = f32({3, 2, 1}, {1, 0, 0, 1, 1, 1});
  expectTensor(run(OpKind::MatMul, {a, b}), {2, 3, 1, 1}, {1, 2, 3, 3, 4, 7});
  // An unbatched right operand is shared by every batch.
  expectTensor(run(OpKind::MatMul, {f32({2, 1, 2}, {1, 2, 3, 4}), f32({2, 2}, {0, 1, 1, 0})}), {2, 1, 2}, {2, 1, 4, 3});
}

// --- conv ----------------------------------------------------------------------------------

AttrMap convAttrs(std::vector<int64_t> strides, std::vector<int64_t> pads, std::vector<int64_t> dilations,
                  int64_t groups = 1) {
  return {{"strides", std::move(strides)},
          {"pads", std::move(pads)},
          {"dilations", std::move(dilations)},
          {"groups", groups}};
}

TEST(InterpreterConvTest, Conv2D) {
  Tensor x = f32({1, 1, 3, 3}, range(1, 10));
  Tensor ones = f32({1, 1, 2, 2}, {1, 1, 1, 1});
  expectTensor(run(OpKind::Conv, {x, ones}), {1, 1, 2, 2}, {12, 16, 24, 28});
  // Stride 2 over a 1-padded input: windows start at -1 and 1.
  expectTensor(run(OpKind::Conv, {x, ones}, convAttrs({2, 2}, {1, 1, 1, 1}, {})), {1, 1, 2, 2}, {1, 5, 11, 28});
  // Dilation 2: the 2x2 kernel touches the four corners.
  expectTensor(run(OpKind::Conv, {x, ones}, convAttrs({}, {}, {2, 2})), {1, 1, 1, 1}, {20});
  // Asymmetric padding: one column on the left only.
  expectTensor(run(OpKind::Conv, {x, f32({1, 1, 1, 2}, {1, 10})}, convAttrs({}, {0, 1, 0, 0}, {})), {1, 1, 3, 3},
               {10, 21, 32, 40, 54, 65, 70, 87, 98});
}

TEST(InterpreterConvTest, GroupsAndBias) {
  // Two groups of one channel: channel 0 sums pairs, channel 1 differences them.
  Tensor x = f32({1, 2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor w = f32({2, 1, 2}, {1, 1, 1, -1});
  Tensor bias = f32({2}, {10, 20});
  expectTensor(run(OpKind::Conv, {x, w, bias}, convAttrs({}, {}, {}, 2)), {1, 2, 2}, {13, 15, 19, 19});
  // One group: each output channel sees both input channels.
  Tensor w2 = f32({1, 2, 1}, {1, 100});
  expectTensor(run(OpKind::Conv, {x, w2}), {1, 1, 3}, {401, 502, 603});
  // Batch of two.
  expectTensor(run(OpKind::Conv, {f32({2, 1, 2}, {1, 2, 3, 4}), f32({1, 1, 1}, {2})}), {2, 1, 2}, {2, 4, 6, 8});
}

TEST(InterpreterConvTest, ConvTranspose) {
  // Stride 2: x0 = 1 lands on outputs 0..2, x1 = 2 on 2..4.
  Tensor x = f32({1, 1, 2}, {1, 2});
  Tensor w = f32({1, 1, 3}, {1, 1, 1});
  expectTensor(run(OpKind::ConvTranspose, {x, w}, {{"strides", std::vector<int64_t>{2}}}), {1, 1, 5}, {1, 1, 3, 2, 2});
  expectTensor(
      run(OpKind::ConvTranspose, {x, w}, {{"strides", std::vector<int64_t>{2}}, {"pads", std::vector<int64_t>{1, 1}}}),
      {1, 1, 3}, {1, 3, 2});
  expectTensor(run(OpKind::ConvTranspose, {x, w},
                   {{"strides", std::vector<int64_t>{2}}, {"output_padding", std::vector<int64_t>{1}}}),
               {1, 1, 6}, {1, 1, 3, 2, 2, 0});
  // 2-D, stride 1: every output sums the inputs whose window covers it.
  expectTensor(run(OpKind::ConvTranspose, {f32({1, 1, 2, 2}, {1, 2, 3, 4}), f32({1, 1, 2, 2}, {1, 1, 1, 1})}),
               {1, 1, 3, 3}, {1, 3, 2, 4, 10, 6, 3, 7, 4});
  // Groups: w[C, M/groups, K]; each channel feeds its own output channel; plus bias.
  expectTensor(run(OpKind::ConvTranspose, {f32({1, 2, 1}, {1, 2}), f32({2, 1, 1}, {3, 4}), f32({2}, {1, -1})},
                   {{"groups", int64_t{2}}}),
               {1, 2, 1}, {4, 7});
  // Dilation 2 spreads the kernel taps.
  expectTensor(run(OpKind::ConvTranspose, {f32({1, 1, 1}, {5}), f32({1, 1, 2}, {1, 2})},
                   {{"dilations", std::vector<int64_t>{2}}}),
               {1, 1, 3}, {5, 0, 10});
}

TEST(InterpreterConvTest, PaddingIsZerosMultipliedByTheWeight) {
  // PyTorch 1.13's values (torch.nn.functional.conv1d, conv_transpose1d and
  // conv1d's weight gradient on ones(1, 1, 3)): a padded tap of conv is 0 *
  // w, NaN for an infinite or NaN weight; conv_transpose's taps that land
  // in a stride's gap or the cropped padding add nothing.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  Tensor x = f32({1, 1, 3}, {1, 1, 1});
  Tensor infFirst = f32({1, 1, 3}, {inf, 1, 1});
  expectTensor(run(OpKind::Conv, {x, infFirst}, convAttrs({}, {1, 1}, {})), {1, 1, 3}, {nan, inf, inf});
  expectTensor(run(OpKind::Conv, {x, infFirst}, convAttrs({2}, {1, 1}, {})), {1, 1, 2}, {nan, inf});
  expectTensor(run(OpKind::Conv, {x, infFirst}, convAttrs({}, {2, 2}, {2})), {1, 1, 3}, {nan, nan, inf});
  expectTensor(run(OpKind::Conv, {x, f32({1, 1, 3}, {1, 1, nan})}, convAttrs({}, {0, 1}, {})), {1, 1, 2}, {nan, nan});
  // Without padding an infinite weight only meets real inputs.
  expectTensor(run(OpKind::Conv, {f32({1, 1, 4}, {1, 1, 1, 1}), infFirst}), {1, 1, 2}, {inf, inf});
  // conv_weight_grad: dy's NaN meets every tap, padded ones included.
  expectTensor(run(OpKind::ConvWeightGrad, {x, f32({1, 1, 3}, {nan, 1, 1})},
                   {{"kernel", std::vector<int64_t>{3}}, {"pads", std::vector<int64_t>{1, 1}}}),
               {1, 1, 3}, {nan, nan, nan});
  Tensor nanLast = f32({1, 1, 3}, {1, 1, nan});
  expectTensor(run(OpKind::ConvTranspose, {x, nanLast}, {{"strides", std::vector<int64_t>{2}}}), {1, 1, 7},
               {1, 1, nan, 1, nan, 1, nan});
  expectTensor(run(OpKind::ConvTranspose, {x, nanLast}, {{"pads", std::vector<int64_t>{1, 1}}}), {1, 1, 3},
               {2, nan, nan});
  expectTensor(run(OpKind::ConvTranspose, {x, infFirst}, {{"pads", std::vector<int64_t>{1, 1}}}), {1, 1, 3},
               {inf, inf, 2});
}

// --- pooling -----------------------------------------------------------------------------

AttrMap poolAttrs(std::vector<int64_t> kernel, std::vector<int64_t> strides, std::vector<int64_t> pads,
                  bool ceil = false) {
  return {
      {"kernel", std::move(kernel)}, {"strides", std::move(strides)}, {"pads", std::move(pads)}, {"ceil_mode", ceil}};
}

TEST(InterpreterPoolTest, MaxPool) {
  Tensor x = f32({1, 1, 4}, {1, 3, 2, 4});
  expectTensor(run(OpKind::MaxPool, {x}, poolAttrs({2}, {2}, {})), {1, 1, 2}, {3, 4});
  expectTensor(run(OpKind::MaxPool, {x}, poolAttrs({2}, {2}, {1, 1})), {1, 1, 3}, {1, 3, 4});
  // Padding never wins, even over negative values.
  expectTensor(run(OpKind::MaxPool, {f32({1, 1, 2}, {-1, -2})}, poolAttrs({2}, {1}, {1, 1})), {1, 1, 3}, {-1, -1, -2});
  // ceil_mode keeps the partial last window.
  Tensor five = f32({1, 1, 5}, {1, 2, 3, 4, 5});
  expectTensor(run(OpKind::MaxPool, {five}, poolAttrs({2}, {2}, {})), {1, 1, 2}, {2, 4});
  expectTensor(run(OpKind::MaxPool, {five}, poolAttrs({2}, {2}, {}, true)), {1, 1, 3}, {2, 4, 5});
  AttrMap dilated = poolAttrs({2}, {1}, {});
  dilated["dilations"] = std::vector<int64_t>{2};
  expectTensor(run(OpKind::MaxPool, {f32({1, 1, 5}, {1, 5, 2, 4, 3})}, dilated), {1, 1, 3}, {2, 5, 3});
  expectTensor(run(OpKind::MaxPool, {f32({1, 1, 2, 2}, {1, kNaN, 3, 4})}, poolAttrs({2, 2}, {}, {})), {1, 1, 1, 1},
               {kNaN});
  expectInts(run(OpKind::MaxPool, {ints(DType::I32, {1, 1, 2, 2}, {-5, -7, -9, -6})}, poolAttrs({2, 2}, {}, {})),
             {1, 1, 1, 1}, {-5});
}

TEST(InterpreterPoolTest, AvgPoolPaddingCounts) {
  Tensor x = f32({1, 1, 4}, {1, 2, 3, 4});
  AttrMap attrs = poolAttrs({2}, {2}, {1, 1});
  expectTensor(run(OpKind::AvgPool, {x}, attrs), {1, 1, 3}, {1, 2.5, 4});
  attrs["count_include_pad"] = true;
  expectTensor(run(OpKind::AvgPool, {x}, attrs), {1, 1, 3}, {0.5, 2.5, 2});
  // ceil_mode: the last window [3,5) reaches past the padded input; only
  // positions inside it count, with or without count_include_pad.
  AttrMap ceil = poolAttrs({3}, {2}, {1, 1}, true);
  expectTensor(run(OpKind::AvgPool, {x}, ceil), {1, 1, 3}, {1.5, 3, 4});
  ceil["count_include_pad"] = true;
  expectTensor(run(OpKind::AvgPool, {x}, ceil), {1, 1, 3}, {1, 3, 2});
  expectTensor(run(OpKind::AvgPool, {f32({1, 1, 5}, {1, 2, 3, 4, 5})}, poolAttrs({2}, {2}, {}, true)), {1, 1, 3},
               {1.5, 3.5, 5});
  expectTensor(run(OpKind::AvgPool, {f32({1, 2, 2, 2}, range(0, 8))}, poolAttrs({2, 2}, {}, {})), {1, 2, 1, 1},
               {1.5, 5.5});
}

// --- random -----------------------------------------------------------------------------

/// u_i of docs/ops.md, written out independently of the kernel.
double specUniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return std::ldexp(static_cast<double>(z >> 11), -53);
}

TEST(InterpreterRandomTest, UniformIsDeterministicAndFollowsTheFormula) {
  AttrMap attrs{{"low", -2.0}, {"high", 6.0}, {"seed", int64_t{42}}};
  Tensor a = run(OpKind::RandomUniform, {}, attrs, {type(DType::F64, {100, 100})});
  Tensor b = run(OpKind::RandomUniform, {}, attrs, {type(DType::F64, {100, 100})});
  EXPECT_EQ(doubles(a), doubles(b));
  attrs["seed"] = int64_t{43};
  Tensor c = run(OpKind::RandomUniform, {}, attrs, {type(DType::F64, {100, 100})});
  EXPECT_NE(doubles(a), doubles(c));
  double sum = 0;
  for (double v : doubles(a)) {
    EXPECT_GE(v, -2.0);
    EXPECT_LT(v, 6.0);
    sum += v;
  }
  EXPECT_NEAR(sum / 10000, 2.0, 0.1);
  for (int i : {0, 1, 9999}) EXPECT_DOUBLE_EQ(a.getDouble(i), -2.0 + 8.0 * specUniform(42, i));
}

TEST(InterpreterRandomTest, NormalMomentsAndBoxMuller) {
  AttrMap attrs{{"mean", 1.0}, {"std", 3.0}, {"seed", int64_t{7}}};
  Tensor a = run(OpKind::RandomNormal, {}, attrs, {type(DType::F32, {20000})});
  EXPECT_EQ(doubles(a), doubles(run(OpKind::RandomNormal, {}, attrs, {type(DType::F32, {20000})})));
  double sum = 0, sumSq = 0;
  for (double v : doubles(a)) {
    sum += v;
    sumSq += v * v;
  }
  const double mean = sum / 20000, var = sumSq / 20000 - mean * mean;
  EXPECT_NEAR(mean, 1.0, 0.1);
  EXPECT_NEAR(std::sqrt(var), 3.0, 0.1);
  // Elements 0 and 1 share (u0, u1): cosine and sine branches.
  const double r = std::sqrt(-2 * std::log(specUniform(7, 0))), angle = 2 * std::numbers::pi * specUniform(7, 1);
  EXPECT_NEAR(a.getDouble(0), 1 + 3 * r * std::cos(angle), 1e-5);
  EXPECT_NEAR(a.getDouble(1), 1 + 3 * r * std::sin(angle), 1e-5);
}

// --- composites --------------------------------------------------------------------------

TEST(InterpreterCompositeTest, SoftmaxAndLogSoftmax) {
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  expectTensor(run(OpKind::Softmax, {f32({3}, {1, 2, 3})}), {3},
               {std::exp(1.0) / z, std::exp(2.0) / z, std::exp(3.0) / z});
  expectTensor(run(OpKind::LogSoftmax, {f32({3}, {1, 2, 3})}), {3},
               {1 - std::log(z), 2 - std::log(z), 3 - std::log(z)});
  // Stable for large inputs, along axis 0 of a matrix.
  expectTensor(run(OpKind::Softmax, {f32({2, 2}, {1000, 0, 1000, 0})}, {{"axis", int64_t{0}}}), {2, 2},
               {0.5, 0.5, 0.5, 0.5});
  expectTensor(run(OpKind::LogSoftmax, {f32({2}, {1000, 0})}), {2}, {0, -1000});
  expectTensor(run(OpKind::Softmax, {f32({2}, {kNaN, 0})}), {2}, {kNaN, kNaN});
  expectTensor(run(OpKind::Softmax, {f32({0, 3}, {})}), {0, 3}, {});
}

TEST(InterpreterCompositeTest, LayerNorm) {
  const double s = std::sqrt(1 + 1e-5);
  Tensor x = f32({2, 2}, {1, 3, 2, 2});
  expectTensor(run(OpKind::LayerNorm, {x}), {2, 2}, {-1 / s, 1 / s, 0, 0});
  expectTensor(run(OpKind::LayerNorm, {x, f32({2}, {2, 3}), f32({2}, {1, 1})}), {2, 2}, {1 - 2 / s, 1 + 3 / s, 1, 1});
  // Normalising over both dims (axis 0), without epsilon.
  expectTensor(run(OpKind::LayerNorm, {f32({2, 2}, {0, 0, 2, 2})}, {{"axis", int64_t{0}}, {"epsilon", 0.0}}), {2, 2},
               {-1, -1, 1, 1});
}

TEST(InterpreterCompositeTest, BatchNorm) {
  Tensor x = f32({1, 2, 2}, {1, 2, 3, 4});
  expectTensor(run(OpKind::BatchNorm, {x, f32({2}, {1, 2}), f32({2}, {0, 1}), f32({2}, {1, 3}), f32({2}, {4, 1})},
                   {{"epsilon", 0.0}}),
               {1, 2, 2}, {0, 0.5, 1, 3});
}

TEST(InterpreterCompositeTest, Activations) {
  expectTensor(run(OpKind::Gelu, {f32({3}, {1, -1, 0})}), {3}, {0.8413447460685429, -0.15865525393145707, 0});
  expectTensor(run(OpKind::Gelu, {f32({2}, {1, -1})}, {{"approximate", "tanh"}}), {2},
               {0.8411919906082768, -0.15880800939172324});
  EXPECT_NE(runError(OpKind::Gelu, {f32({1}, {1})}, {{"approximate", "erf"}}).find("approximate"), std::string::npos);
  expectTensor(run(OpKind::Silu, {f32({2}, {1, 0})}), {2}, {0.7310585786300049, 0});
  expectTensor(run(OpKind::LeakyRelu, {f32({2}, {-2, 3})}, {{"alpha", 0.1}}), {2}, {-0.2, 3});
  expectTensor(run(OpKind::LeakyRelu, {f32({1}, {-2})}), {1}, {-0.02});
  expectTensor(run(OpKind::Elu, {f32({2}, {-1, 2})}), {2}, {std::exp(-1.0) - 1, 2});
  expectTensor(run(OpKind::Softplus, {makeTensor(DType::F64, {3}, {0, 100, -100})}), {3},
               {std::log(2.0), 100, 3.7200759760208356e-44}, 1e-12);
}

TEST(InterpreterCompositeTest, AttentionWithMasks) {
  Tensor q = f32({2, 2}, {1, 0, 0, 1});
  Tensor k = f32({2, 2}, {1, 0, 0, 1});
  Tensor v = f32({2, 2}, {1, 2, 3, 4});
  // Row 0 scores [1, 0], row 1 [0, 1] (scale 1).
  const double p = std::exp(1.0) / (std::exp(1.0) + 1);
  const std::vector<double> full = {p * 1 + (1 - p) * 3, p * 2 + (1 - p) * 4, (1 - p) * 1 + p * 3, (1 - p) * 2 + p * 4};
  expectTensor(run(OpKind::Attention, {q, k, v}, {{"scale", 1.0}}), {2, 2}, full);
  const std::vector<double> causal = {1, 2, full[2], full[3]};
  expectTensor(run(OpKind::Attention, {q, k, v}, {{"scale", 1.0}, {"causal", true}}), {2, 2}, causal);
  expectTensor(run(OpKind::Attention, {q, k, v, bools({2, 2}, {1, 0, 1, 1})}, {{"scale", 1.0}}), {2, 2}, causal);
  expectTensor(run(OpKind::Attention, {q, k, v, f32({2, 2}, {0, -kInf, 0, 0})}, {{"scale", 1.0}}), {2, 2}, causal);
  // A broadcast additive mask [Lk] and the default scale 1/sqrt(D).
  const double s = 1 / std::sqrt(2.0);
  const double p0 = 1 / (1 + std::exp(-s - 1)), p1 = 1 / (1 + std::exp(s - 1));  // weight of key 0 per row
  expectTensor(run(OpKind::Attention, {q, k, v, f32({2}, {1, 0})}), {2, 2},
               {p0 * 1 + (1 - p0) * 3, p0 * 2 + (1 - p0) * 4, p1 * 1 + (1 - p1) * 3, p1 * 2 + (1 - p1) * 4});
  // Leading batch dims: two heads, the second with swapped values.
  Tensor q2 = f32({2, 1, 2}, {1, 0, 1, 0});
  Tensor k2 = f32({2, 2, 2}, {1, 0, 0, 1, 1, 0, 0, 1});
  Tensor v2 = f32({2, 2, 1}, {1, 3, 3, 1});
  expectTensor(run(OpKind::Attention, {q2, k2, v2}, {{"scale", 1.0}}), {2, 1, 1}, {p + 3 * (1 - p), 3 * p + (1 - p)});
}

/// Cross-entropy of one sample, straight from the definition.
double crossEntropy(const std::vector<double>& logits, int label, double smoothing) {
  double z = 0;
  for (double l : logits) z += std::exp(l);
  double mean = 0;
  for (double l : logits) mean += (std::log(z) - l) / logits.size();
  return (1 - smoothing) * (std::log(z) - logits[label]) + smoothing * mean;
}

TEST(InterpreterCompositeTest, CrossEntropyReductionsIgnoreIndexAndSmoothing) {
  Tensor logits = f32({2, 3}, {1, 2, 3, 1, 1, 1});
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3;  // 0.4076...
  const double l1 = std::log(3.0);
  expectTensor(run(OpKind::CrossEntropy, {logits, ints(DType::I64, {2}, {2, 0})}), {}, {(l0 + l1) / 2});
  expectTensor(run(OpKind::CrossEntropy, {logits, ints(DType::I32, {2}, {2, 0})}, {{"reduction", "sum"}}), {},
               {l0 + l1});
  expectTensor(run(OpKind::CrossEntropy, {logits, ints(DType::I64, {2}, {2, 0})}, {{"reduction", "none"}}), {2},
               {l0, l1});
  // The ignored element is left out of the mean's denominator.
  expectTensor(run(OpKind::CrossEntropy, {logits, ints(DType::I64, {2}, {2, -100})}), {}, {l0});
  expectTensor(run(OpKind::CrossEntropy, {logits, ints(DType::I64, {2}, {2, 1})}, {{"ignore_index", int64_t{1}}}), {},
               {l0});
  expectTensor(run(OpKind::CrossEntropy, {logits, ints(DType::I64, {2}, {-100, -100})}), {}, {kNaN});
  const double s0 = crossEntropy({1, 2, 3}, 2, 0.1), s1 = crossEntropy({1, 1, 1}, 0, 0.1);
  expectTensor(run(OpKind::CrossEntropy, {logits, ints(DType::I64, {2}, {2, 0})}, {{"label_smoothing", 0.1}}), {},
               {(s0 + s1) / 2});
  // Spatial dims: logits[N=1, C=2, d=2], labels[1, 2].
  Tensor spatial = f32({1, 2, 2}, {0, 1, 1, 0});
  const double a = std::log(std::exp(0.0) + std::exp(1.0));
  expectTensor(run(OpKind::CrossEntropy, {spatial, ints(DType::I64, {1, 2}, {1, 1})}, {{"reduction", "none"}}), {1, 2},
               {a - 1, a});
}

TEST(InterpreterCompositeTest, BadLabelIsAnError) {
  std::string error = runError(OpKind::CrossEntropy, {f32({2, 3}, {1, 2, 3, 1, 1, 1}), ints(DType::I64, {2}, {0, 3})});
  EXPECT_NE(error.find("'cross_entropy'"), std::string::npos) << error;
  EXPECT_NE(error.find("label 3"), std::string::npos) << error;
  EXPECT_NE(runError(OpKind::NllLoss, {f32({1, 2}, {0, 0}), ints(DType::I64, {1}, {-1})}).find("label -1"),
            std::string::npos);
}

TEST(InterpreterCompositeTest, NllAndMseLosses) {
  Tensor logp = f32({2, 2}, {-1, -2, -3, -4});
  expectTensor(run(OpKind::NllLoss, {logp, ints(DType::I64, {2}, {1, 0})}), {}, {2.5});
  expectTensor(run(OpKind::NllLoss, {logp, ints(DType::I64, {2}, {1, 0})}, {{"reduction", "none"}}), {2}, {2, 3});
  expectTensor(run(OpKind::NllLoss, {logp, ints(DType::I64, {2}, {1, 7})}, {{"ignore_index", int64_t{7}}}), {}, {2});
  Tensor a = f32({2}, {1, 2}), b = f32({2}, {3, 5});
  expectTensor(run(OpKind::MseLoss, {a, b}), {}, {6.5});
  expectTensor(run(OpKind::MseLoss, {a, b}, {{"reduction", "sum"}}), {}, {13});
  expectTensor(run(OpKind::MseLoss, {a, b}, {{"reduction", "none"}}), {2}, {4, 9});
}

// --- recurrent layers -----------------------------------------------------------------------

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(InterpreterRecurrentTest, RnnByHand) {
  // seq 2, batch 1, input 1, hidden 1: h_t = tanh(0.5 x_t + 0.25 h + 0.1 + 0.2).
  Tensor x = f32({2, 1, 1}, {1, 2});
  Tensor w = f32({1, 1, 1}, {0.5}), r = f32({1, 1, 1}, {0.25}), b = f32({1, 2}, {0.1, 0.2});
  Tensor h0 = f32({1, 1, 1}, {0});
  auto results = runOpFunction(OpKind::Rnn, {x, w, r, b, h0}, {{"hidden_size", int64_t{1}}});
  ASSERT_TRUE(results) << results.error().str();
  const double h1 = std::tanh(0.8), h2 = std::tanh(1.0 + 0.25 * h1 + 0.3);
  expectTensor((*results)[0], {2, 1, 1, 1}, {h1, h2});
  expectTensor((*results)[1], {1, 1, 1}, {h2});

  // Reverse runs from the last step; Y stays indexed by time.
  auto reversed = runOpFunction(OpKind::Rnn, {x, w, r, b, h0}, {{"hidden_size", int64_t{1}}, {"direction", "reverse"}});
  ASSERT_TRUE(reversed) << reversed.error().str();
  const double g1 = std::tanh(1.3), g0 = std::tanh(0.5 + 0.25 * g1 + 0.3);
  expectTensor((*reversed)[0], {2, 1, 1, 1}, {g0, g1});
  expectTensor((*reversed)[1], {1, 1, 1}, {g0});

  // Bidirectional: direction 1 is the reverse pass with its own weights.
  Tensor w2 = f32({2, 1, 1}, {0.5, 0.5}), r2 = f32({2, 1, 1}, {0.25, 0.25}), b2 = f32({2, 2}, {0.1, 0.2, 0.1, 0.2});
  Tensor h02 = f32({2, 1, 1}, {0, 0});
  auto both = runOpFunction(OpKind::Rnn, {x, w2, r2, b2, h02},
                            {{"hidden_size", int64_t{1}}, {"direction", "bidirectional"}, {"activation", "tanh"}});
  ASSERT_TRUE(both) << both.error().str();
  expectTensor((*both)[0], {2, 2, 1, 1}, {h1, g0, h2, g1});
  expectTensor((*both)[1], {2, 1, 1}, {h2, g0});
}

/// Deterministic, varied test values.
std::vector<double> values(int n, double scale, double offset) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(scale * std::sin(1.7 * i + offset));
  return v;
}

/// y[j] = sum_i m[row0 + j][i] * v[i] for a row-major matrix with `cols` columns.
std::vector<double> matVec(const std::vector<double>& m, int row0, int rows, int cols, const std::vector<double>& v) {
  std::vector<double> y(rows, 0.0);
  for (int j = 0; j < rows; ++j)
    for (int i = 0; i < cols; ++i) y[j] += m[(row0 + j) * cols + i] * v[i];
  return y;
}

TEST(InterpreterRecurrentTest, LstmMatchesAStepLoop) {
  const int seq = 3, batch = 2, in = 3, hid = 2;
  const std::vector<double> X = values(seq * batch * in, 1.0, 0.1), W = values(4 * hid * in, 0.5, 0.2),
                            R = values(4 * hid * hid, 0.5, 0.3), B = values(8 * hid, 0.3, 0.4),
                            H0 = values(batch * hid, 0.4, 0.5), C0 = values(batch * hid, 0.6, 0.6);
  auto results = runOpFunction(OpKind::Lstm,
                               {f32({seq, batch, in}, X), f32({1, 4 * hid, in}, W), f32({1, 4 * hid, hid}, R),
                                f32({1, 8 * hid}, B), f32({1, batch, hid}, H0), f32({1, batch, hid}, C0)},
                               {{"hidden_size", int64_t{hid}}});
  ASSERT_TRUE(results) << results.error().str();
  // Reference: per batch row, gates i, o, f, c from W/R rows [g*hid, (g+1)*hid).
  for (int b = 0; b < batch; ++b) {
    std::vector<double> h(H0.begin() + b * hid, H0.begin() + (b + 1) * hid);
    std::vector<double> c(C0.begin() + b * hid, C0.begin() + (b + 1) * hid);
    for (int t = 0; t < seq; ++t) {
      std::vector<double> xt(X.begin() + (t * batch + b) * in, X.begin() + (t * batch + b + 1) * in);
      auto gate = [&](int g) {
        std::vector<double> a = matVec(W, g * hid, hid, in, xt), r = matVec(R, g * hid, hid, hid, h);
        for (int j = 0; j < hid; ++j) a[j] += r[j] + B[g * hid + j] + B[4 * hid + g * hid + j];
        return a;
      };
      const auto i = gate(0), o = gate(1), f = gate(2), cc = gate(3);
      for (int j = 0; j < hid; ++j) {
        c[j] = sigmoid(f[j]) * c[j] + sigmoid(i[j]) * std::tanh(cc[j]);
        h[j] = sigmoid(o[j]) * std::tanh(c[j]);
        EXPECT_NEAR((*results)[0].getDouble((t * batch + b) * hid + j), h[j], 1e-5) << "Y t=" << t;
      }
    }
    for (int j = 0; j < hid; ++j) {
      EXPECT_NEAR((*results)[1].getDouble(b * hid + j), h[j], 1e-5);
      EXPECT_NEAR((*results)[2].getDouble(b * hid + j), c[j], 1e-5);
    }
  }
}

TEST(InterpreterRecurrentTest, GruMatchesAStepLoopInBothResetModes) {
  const int seq = 2, batch = 2, in = 2, hid = 3;
  const std::vector<double> X = values(seq * batch * in, 1.0, 0.7), W = values(3 * hid * in, 0.6, 0.8),
                            R = values(3 * hid * hid, 0.6, 0.9), B = values(6 * hid, 0.3, 1.0),
                            H0 = values(batch * hid, 0.5, 1.1);
  for (bool linearBeforeReset : {false, true}) {
    auto results = runOpFunction(OpKind::Gru,
                                 {f32({seq, batch, in}, X), f32({1, 3 * hid, in}, W), f32({1, 3 * hid, hid}, R),
                                  f32({1, 6 * hid}, B), f32({1, batch, hid}, H0)},
                                 {{"hidden_size", int64_t{hid}}, {"linear_before_reset", linearBeforeReset}});
    ASSERT_TRUE(results) << results.error().str();
    for (int b = 0; b < batch; ++b) {
      std::vector<double> h(H0.begin() + b * hid, H0.begin() + (b + 1) * hid);
      for (int t = 0; t < seq; ++t) {
        std::vector<double> xt(X.begin() + (t * batch + b) * in, X.begin() + (t * batch + b + 1) * in);
        auto inputPart = [&](int g) {
          auto a = matVec(W, g * hid, hid, in, xt);
          for (int j = 0; j < hid; ++j) a[j] += B[g * hid + j];
          return a;
        };
        auto recurrentPart = [&](int g, const std::vector<double>& state) {
          auto a = matVec(R, g * hid, hid, hid, state);
          for (int j = 0; j < hid; ++j) a[j] += B[3 * hid + g * hid + j];
          return a;
        };
        std::vector<double> z(hid), r(hid), rh(hid);
        for (int j = 0; j < hid; ++j) {
          z[j] = sigmoid(inputPart(0)[j] + recurrentPart(0, h)[j]);
          r[j] = sigmoid(inputPart(1)[j] + recurrentPart(1, h)[j]);
          rh[j] = r[j] * h[j];
        }
        const auto xh = inputPart(2), hPlain = recurrentPart(2, h), hReset = recurrentPart(2, rh);
        std::vector<double> next(hid);
        for (int j = 0; j < hid; ++j) {
          const double cand = std::tanh(xh[j] + (linearBeforeReset ? r[j] * hPlain[j] : hReset[j]));
          next[j] = (1 - z[j]) * cand + z[j] * h[j];
          EXPECT_NEAR((*results)[0].getDouble((t * batch + b) * hid + j), next[j], 1e-5)
              << "linear_before_reset=" << linearBeforeReset << " t=" << t;
        }
        h = next;
      }
      for (int j = 0; j < hid; ++j) EXPECT_NEAR((*results)[1].getDouble(b * hid + j), h[j], 1e-5);
    }
  }
}

TEST(InterpreterRecurrentTest, EmptySequenceReturnsTheInitialState) {
  auto results = runOpFunction(
      OpKind::Rnn,
      {f32({0, 1, 1}, {}), f32({1, 1, 1}, {1}), f32({1, 1, 1}, {1}), f32({1, 2}, {0, 0}), f32({1, 1, 1}, {0.5})},
      {{"hidden_size", int64_t{1}}});
  ASSERT_TRUE(results) << results.error().str();
  expectTensor((*results)[0], {0, 1, 1, 1}, {});
  expectTensor((*results)[1], {1, 1, 1}, {0.5});
}

}  // namespace
}  // namespace kiln::test
