// Unit tests of the NN converters (frontend/onnx/NNOps.cpp, NNRecurrent.cpp,
// NNResize.cpp) on ModelProtos built in C++, for what the ONNX backend test
// data does not cover: recurrent nodes that must be unrolled (clip,
// activations with parameters, sequence_lens, layout 1) against formulas
// computed here, the composite path and its zero states for an unknown
// batch, pre-13 softmax coercion, ConvTranspose output shapes beyond
// output_padding, dynamic batch dims, and errors that name what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "frontend/onnx/OnnxImporter.h"
#include "onnx.pb.h"
#include "runtime/Interpreter.h"
#include "test/unit/OnnxTestSupport.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::addInitializer;
using test::addInput;
using test::addIntInitializer;
using test::addNode;
using test::addOutput;
using test::countOps;
using test::errorOf;
using test::expectNear;
using test::importModel;
using test::makeModel;
using test::run;
using test::setFloat;
using test::setFloats;
using test::setInt;
using test::setInts;
using test::setStrings;

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

/// A one-unit RNN over X[seq, batch, 1] with W = w, R = r and no bias.
onnx::ModelProto scalarRnn(const std::string& op, int64_t seq, int64_t batch, float w, float r) {
  onnx::ModelProto m = makeModel(14);
  int64_t gates = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
  addInput(m, "X", {seq, batch, 1});
  addInitializer(m, "W", {1, gates, 1}, std::vector<float>(static_cast<size_t>(gates), w));
  addInitializer(m, "R", {1, gates, 1}, std::vector<float>(static_cast<size_t>(gates), r));
  addOutput(m, "Y");
  addOutput(m, "Y_h");
  return m;
}

/// HardSwish (opset 14, PyTorch's export of hardswish) imports as the one
/// `hard_swish` op rather than its composition, and gives
/// torch.nn.functional.hardswish's values (float64 reference, f32 tensors).
TEST(OnnxNNOps, HardSwishIsTheHardSwishOp) {
  onnx::ModelProto m = makeModel(14);
  addInput(m, "X", {6});
  addOutput(m, "Y");
  addNode(m, "HardSwish", {"X"}, {"Y"});
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  const Function& f = *(*module)->functions().front();
  EXPECT_EQ(countOps(f, OpKind::HardSwish), 1u);
  EXPECT_EQ(countOps(f, OpKind::Max) + countOps(f, OpKind::Min) + countOps(f, OpKind::Mul), 0u);
  auto results = run(**module, {test::tensorOf(DType::F32, {6}, {-4, -3, -1, 0.5, 2.5, 4})});
  ASSERT_EQ(results.size(), 1u);
  expectNear(test::elementsOf(results[0]), {-0.0, -0.0, -0.3333333333333333, 0.2916666666666667, 2.2916666666666665, 4.0});
}

TEST(OnnxNNOps, RnnWithClipAndAffineActivationIsUnrolled) {
  onnx::ModelProto m = scalarRnn("RNN", 2, 1, 2.0f, 0.5f);
  auto* n = addNode(m, "RNN", {"X", "W", "R"}, {"Y", "Y_h"});
  setInt(n, "hidden_size", 1);
  setFloat(n, "clip", 1.5f);
  setStrings(n, "activations", {"Affine"});
  setFloats(n, "activation_alpha", {3.0f});
  setFloats(n, "activation_beta", {0.25f});
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  EXPECT_EQ(countOps(*(*module)->functions().front(), OpKind::Rnn), 0u);
  auto results = run(**module, {test::tensorOf(DType::F32, {2, 1, 1}, {1.0, -0.1})});
  ASSERT_EQ(results.size(), 2u);
  auto affine = [](double v) { return 3.0 * std::clamp(v, -1.5, 1.5) + 0.25; };
  double h1 = affine(2.0 * 1.0);
  double h2 = affine(2.0 * -0.1 + 0.5 * h1);
  expectNear(test::elementsOf(results[0]), {h1, h2});
  expectNear(test::elementsOf(results[1]), {h2});
}

TEST(OnnxNNOps, DefaultLstmIsTheCompositeWithZeroStatesForAnUnknownBatch) {
  onnx::ModelProto m = scalarRnn("LSTM", 1, -1, 1.0f, 0.0f);
  auto* n = addNode(m, "LSTM", {"X", "W", "R"}, {"Y", "Y_h"});
  setInt(n, "hidden_size", 1);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  EXPECT_EQ(countOps(*(*module)->functions().front(), OpKind::Lstm), 1u);
  auto results = run(**module, {test::tensorOf(DType::F32, {1, 2, 1}, {0.5, -2.0})});
  ASSERT_EQ(results.size(), 2u);
  // c = sig(x) tanh(x) (zero initial c); h = sig(x) tanh(c).
  auto h = [](double x) { return sigmoid(x) * std::tanh(sigmoid(x) * std::tanh(x)); };
  expectNear(test::elementsOf(results[1]), {h(0.5), h(-2.0)});
}

TEST(OnnxNNOps, GruSequenceLensFreezeTheStateAndZeroY) {
  onnx::ModelProto m = scalarRnn("GRU", 2, 2, 1.0f, 0.5f);
  addIntInitializer(m, "lens", {2}, {1, 2}, onnx::TensorProto::INT32);
  auto* n = addNode(m, "GRU", {"X", "W", "R", "", "lens"}, {"Y", "Y_h"});
  setInt(n, "hidden_size", 1);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto results = run(**module, {test::tensorOf(DType::F32, {2, 2, 1}, {0.3, 0.3, 0.7, 0.7})});
  ASSERT_EQ(results.size(), 2u);
  auto step = [](double x, double h) {
    double z = sigmoid(x + 0.5 * h), r = sigmoid(x + 0.5 * h);
    double candidate = std::tanh(x + 0.5 * (r * h));
    return (1 - z) * candidate + z * h;
  };
  double first = step(0.3, 0);
  double second = step(0.7, first);
  // Y[seq, dirs, batch, 1]: batch 0 stops after one step.
  expectNear(test::elementsOf(results[0]), {first, first, 0.0, second});
  expectNear(test::elementsOf(results[1]), {first, second});
}

TEST(OnnxNNOps, BatchFirstLayoutTransposesAroundTheOp) {
  onnx::ModelProto m = scalarRnn("RNN", 3, 2, 1.0f, 1.0f);
  // X is [batch, seq, input] in layout 1.
  m.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_value(2);
  m.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(1)
      ->set_dim_value(3);
  auto* n = addNode(m, "RNN", {"X", "W", "R"}, {"Y", "Y_h"});
  setInt(n, "hidden_size", 1);
  setInt(n, "layout", 1);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto results = run(**module, {test::tensorOf(DType::F32, {2, 3, 1}, {0.1, 0.2, 0.3, -0.1, -0.2, -0.3})});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].shape(), (std::vector<int64_t>{2, 3, 1, 1}));
  EXPECT_EQ(results[1].shape(), (std::vector<int64_t>{2, 1, 1}));
  double a1 = std::tanh(0.1), a2 = std::tanh(0.2 + a1), a3 = std::tanh(0.3 + a2);
  double b1 = std::tanh(-0.1), b2 = std::tanh(-0.2 + b1), b3 = std::tanh(-0.3 + b2);
  expectNear(test::elementsOf(results[0]), {a1, a2, a3, b1, b2, b3});
  expectNear(test::elementsOf(results[1]), {a3, b3});
}

TEST(OnnxNNOps, UnknownActivationAndAttributeAreErrorsNamingThem) {
  onnx::ModelProto m = scalarRnn("RNN", 1, 1, 1.0f, 1.0f);
  auto* n = addNode(m, "RNN", {"X", "W", "R"}, {"Y", "Y_h"});
  setInt(n, "hidden_size", 1);
  setStrings(n, "activations", {"Swishy"});
  EXPECT_NE(errorOf(importModel(m)).find("activation 'Swishy' is not supported"), std::string::npos);

  onnx::ModelProto c = makeModel(13);
  addInput(c, "x", {1, 1, 4, 4});
  addInitializer(c, "w", {1, 1, 3, 3}, std::vector<float>(9, 1.0f));
  addOutput(c, "y");
  setInt(addNode(c, "Conv", {"x", "w"}, {"y"}, "Conv_0"), "winograd", 1);
  std::string error = errorOf(importModel(c));
  EXPECT_NE(error.find("Conv_0"), std::string::npos) << error;
  EXPECT_NE(error.find("attribute 'winograd' is not supported"), std::string::npos) << error;
}

TEST(OnnxNNOps, SoftmaxBeforeOpset13CoercesTo2D) {
  for (int64_t opset : {11, 13}) {
    onnx::ModelProto m = makeModel(opset);
    addInput(m, "x", {2, 2, 2});
    addOutput(m, "y");
    setInt(addNode(m, "Softmax", {"x"}, {"y"}), "axis", 1);
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    auto y = test::elementsOf(run(**module, {test::tensorOf(DType::F32, {2, 2, 2}, {0, 1, 2, 3, 0, 0, 0, 0})})[0]);
    if (opset == 11) {
      // Each image's 4 elements form one row.
      double total = std::exp(0) + std::exp(1) + std::exp(2) + std::exp(3);
      expectNear(y, {1 / total, std::exp(1) / total, std::exp(2) / total, std::exp(3) / total, 0.25, 0.25, 0.25, 0.25});
    } else {
      // Along dim 1 only: pairs (0, 2) and (1, 3).
      double a = 1 / (1 + std::exp(2));
      expectNear(y, {a, a, 1 - a, 1 - a, 0.5, 0.5, 0.5, 0.5});
    }
  }
}

TEST(OnnxNNOps, ConvTransposeOutputShapeBeyondOutputPaddingGetsTheBias) {
  onnx::ModelProto m = makeModel(11);
  addInput(m, "x", {1, 1, 2});
  addInitializer(m, "w", {1, 1, 1}, {2.0f});
  addInitializer(m, "b", {1}, {0.5f});
  addOutput(m, "y");
  // Full output is 2*(2-1) + 1 = 3; 6 asks for 3 more at the end.
  auto* n = addNode(m, "ConvTranspose", {"x", "w", "b"}, {"y"});
  setInts(n, "strides", {2});
  setInts(n, "output_shape", {6});
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  expectNear(test::elementsOf(run(**module, {test::tensorOf(DType::F32, {1, 1, 2}, {1, 3})})[0]),
             {2.5, 0.5, 6.5, 0.5, 0.5, 0.5});
}

TEST(OnnxNNOps, SymbolicBatchConvPoolAndResize) {
  onnx::ModelProto m = makeModel(13);
  addInput(m, "x", {-1, 1, 2, 2}, onnx::TensorProto::FLOAT, {{0, "N"}});
  addInitializer(m, "w", {1, 1, 1, 1}, {1.0f});
  addInitializer(m, "scales", {4}, {1, 1, 2, 2});
  addOutput(m, "y");
  addNode(m, "Conv", {"x", "w"}, {"c"});
  setInts(addNode(m, "MaxPool", {"c"}, {"p"}), "kernel_shape", {1, 1});
  addNode(m, "Resize", {"p", "", "scales"}, {"y"});
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto y = run(**module, {test::tensorOf(DType::F32, {2, 1, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8})});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{2, 1, 4, 4}));
  auto v = test::elementsOf(y[0]);
  EXPECT_EQ(v[0], 1);
  EXPECT_EQ(v[3], 2);
  EXPECT_EQ(v[15], 4);
  EXPECT_EQ(v[16], 5);
}

TEST(OnnxNNOps, DropoutIsTheIdentityInInferenceAndRandomDropoutNeedsAKnownShape) {
  onnx::ModelProto m = makeModel(13);
  addInput(m, "x", {-1, 3});
  addIntInitializer(m, "training", {}, {0}, onnx::TensorProto::BOOL);
  addOutput(m, "y");
  auto* mask = m.mutable_graph()->add_output();
  mask->set_name("mask");
  mask->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::BOOL);
  addNode(m, "Dropout", {"x", "", "training"}, {"y", "mask"});
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto results = run(**module, {test::tensorOf(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_EQ(results.size(), 2u);
  expectNear(test::elementsOf(results[0]), {1, 2, 3, 4, 5, 6});
  expectNear(test::elementsOf(results[1]), {1, 1, 1, 1, 1, 1});

  // Training mode draws a mask of x's shape (OnnxSignalOpsTest.cpp checks
  // it), which an unknown dim leaves undetermined.
  m.mutable_graph()->mutable_initializer(0)->set_int32_data(0, 1);
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("random dropout needs a known input shape"), std::string::npos) << error;
}

TEST(OnnxNNOps, WeightedNllMeanDividesByTheCountedWeights) {
  onnx::ModelProto m = makeModel(13);
  addInput(m, "logp", {3, 2});
  addIntInitializer(m, "target", {3}, {0, 1, 1});
  addInitializer(m, "weight", {2}, {2.0f, 0.5f});
  addOutput(m, "loss");
  auto* n = addNode(m, "NegativeLogLikelihoodLoss", {"logp", "target", "weight"}, {"loss"});
  setInt(n, "ignore_index", 0);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto loss = test::elementsOf(run(**module, {test::tensorOf(DType::F32, {3, 2}, {-1, -2, -3, -4, -5, -6})})[0]);
  // Target 0 is ignored; the others weigh 0.5 each.
  expectNear(loss, {(0.5 * 4 + 0.5 * 6) / 1.0});
}

TEST(OnnxNNOps, MaxPoolIndicesNeedAStaticShape) {
  onnx::ModelProto m = makeModel(12);
  addInput(m, "x", {-1, 1, 4, 4});
  addOutput(m, "y");
  addOutput(m, "i");
  setInts(addNode(m, "MaxPool", {"x"}, {"y", "i"}), "kernel_shape", {2, 2});
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("Indices output of MaxPool needs a static input shape"), std::string::npos) << error;
}

TEST(OnnxNNOps, LrnWindowWiderThanTheChannelsIsCutToThem) {
  // size 5 and size 10^12 over 3 channels: both windows cover every channel,
  // so only the divisor alpha / size differs. The huge one built a slice per
  // channel of the window before.
  for (int64_t size : {int64_t{5}, int64_t{1000000000000}}) {
    onnx::ModelProto m = makeModel(13);
    addInput(m, "x", {1, 3, 1, 1});
    addOutput(m, "y");
    auto* n = addNode(m, "LRN", {"x"}, {"y"});
    setInt(n, "size", size);
    setFloat(n, "alpha", 2.0f);
    setFloat(n, "beta", 1.0f);
    setFloat(n, "bias", 1.0f);
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    std::vector<double> x{1, 2, 3};
    std::vector<double> want;
    // Channel c sums c - 2 .. c + 2 (size 5) or everything (size 10^12): all three here.
    for (double v : x) want.push_back(v / (1.0 + 2.0 / static_cast<double>(size) * 14.0));
    expectNear(test::elementsOf(run(**module, {test::tensorOf(DType::F32, {1, 3, 1, 1}, x)})[0]), want);
  }
  // A window as wide as asked over unknown channels is refused, not built.
  onnx::ModelProto m = makeModel(13);
  addInput(m, "x", {1, -1, 1, 1});
  addOutput(m, "y");
  setInt(addNode(m, "LRN", {"x"}, {"y"}), "size", 1000000);
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("Kiln imports LRN windows of at most 4096"), std::string::npos) << error;
}

TEST(OnnxNNOps, ExpansionsAreBoundedBeforeTheyAreBuilt) {
  // An RNN that must be unrolled over a billion steps.
  onnx::ModelProto rnn = scalarRnn("RNN", 1000000000, 1, 1.0f, 1.0f);
  auto* n = addNode(rnn, "RNN", {"X", "W", "R"}, {"Y", "Y_h"});
  setInt(n, "hidden_size", 1);
  setFloat(n, "clip", 1.5f);
  std::string error = errorOf(importModel(rnn));
  EXPECT_NE(error.find("unrolls one step per element of the sequence, at most 8192"), std::string::npos) << error;

  // A resize to 2^30 elements along one axis.
  onnx::ModelProto resize = makeModel(13);
  addInput(resize, "x", {1, 1, 1, 4});
  addInitializer(resize, "scales", {4}, {1.0f, 1.0f, 1.0f, 268435456.0f});
  addOutput(resize, "y");
  addNode(resize, "Resize", {"x", "", "scales"}, {"y"});
  error = errorOf(importModel(resize));
  EXPECT_NE(error.find("would be resized to 1073741824 elements; expected between 1 and 16777216"), std::string::npos)
      << error;

  // MaxPool indices of a 4096x4096 window at 4096x4096 positions.
  onnx::ModelProto pool = makeModel(12);
  addInput(pool, "x", {1, 1, 8191, 8191});
  addOutput(pool, "y");
  addOutput(pool, "i");
  setInts(addNode(pool, "MaxPool", {"x"}, {"y", "i"}), "kernel_shape", {4096, 4096});
  error = errorOf(importModel(pool));
  EXPECT_NE(error.find("the table of window positions would have more than 16777216 elements"), std::string::npos)
      << error;
  // Within those bounds a node still may not expand without end: a
  // bidirectional LSTM with clipping unrolled over 8000 steps would build
  // about 1.5 million ops.
  onnx::ModelProto lstm = makeModel(14);
  addInput(lstm, "X", {8000, 1, 1});
  addInitializer(lstm, "W", {2, 4, 1}, std::vector<float>(8, 1.0f));
  addInitializer(lstm, "R", {2, 4, 1}, std::vector<float>(8, 1.0f));
  addOutput(lstm, "Y");
  auto* cell = addNode(lstm, "LSTM", {"X", "W", "R"}, {"Y"});
  setInt(cell, "hidden_size", 1);
  setFloat(cell, "clip", 1.5f);
  auto* direction = cell->add_attribute();
  direction->set_name("direction");
  direction->set_type(onnx::AttributeProto::STRING);
  direction->set_s("bidirectional");
  error = errorOf(importModel(lstm));
  EXPECT_NE(error.find("expands to more than 262144 Kiln ops"), std::string::npos) << error;
}

}  // namespace
}  // namespace kiln
