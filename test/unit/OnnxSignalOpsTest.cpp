// Unit tests of the signal, text and random ONNX converters
// (frontend/onnx/SignalOps.cpp, RandomOps.cpp, training-mode Dropout in
// NNOps.cpp) on ModelProtos built in C++, against values worked out by hand:
// what the ONNX backend test data does not cover (DFT's inverse with
// complex input, dft_length cutting and padding, opset 20's axis input, a
// windowed STFT, TfIdfVectorizer's IDF/TFIDF modes, skips and permuted
// output coordinates), the statistics of the random ops on many samples,
// and errors that name what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "frontend/onnx/OnnxImporter.h"
#include "onnx.pb.h"
#include "runtime/Interpreter.h"
#include "test/unit/OnnxTestSupport.h"
#include "test/unit/TestSupport.h"
#include "training/TrainableModel.h"

namespace kiln {
namespace {

using test::addInput;
using test::addNode;
using test::addOutput;
using test::errorOf;
using test::expectNear;
using test::makeModel;
using test::runModel;
using test::setFloat;
using test::setFloats;
using test::setInt;
using test::setInts;
using test::setString;

void addScalar(onnx::ModelProto& m, const std::string& name, double value, int type) {
  auto* t = m.mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  if (type == onnx::TensorProto::FLOAT)
    t->add_float_data(static_cast<float>(value));
  else if (type == onnx::TensorProto::INT64)
    t->add_int64_data(static_cast<int64_t>(value));
  else
    t->add_int32_data(static_cast<int32_t>(value));
}

// --- DFT -------------------------------------------------------------------------

/// DFT of x[1, n, parts] along axis 1 (opset 17), with optional dft_length.
onnx::ModelProto dftModel(int64_t n, int64_t parts, bool inverse, bool onesided, int64_t length = 0) {
  onnx::ModelProto m = makeModel(17);
  addInput(m, "x", {1, n, parts});
  addOutput(m, "y");
  std::vector<std::string> inputs = {"x"};
  if (length > 0) {
    addScalar(m, "len", static_cast<double>(length), onnx::TensorProto::INT64);
    inputs.push_back("len");
  }
  auto* node = addNode(m, "DFT", inputs, {"y"});
  setInt(node, "axis", 1);
  if (inverse) setInt(node, "inverse", 1);
  if (onesided) setInt(node, "onesided", 1);
  return m;
}

TEST(OnnxSignalOps, DftOfARealSignal) {
  // DFT of [1, 2, 3, 4]: X_k = sum_n x_n e^{-2 pi i k n / 4}: 10, -2+2i, -2, -2-2i.
  auto y = runModel(dftModel(4, 1, false, false), {test::tensorOf(DType::F32, {1, 4, 1}, {1, 2, 3, 4})});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{1, 4, 2}));
  expectNear(test::elementsOf(y[0]), {10, 0, -2, 2, -2, 0, -2, -2});
  // One-sided: bins 0..2.
  y = runModel(dftModel(4, 1, false, true), {test::tensorOf(DType::F32, {1, 4, 1}, {1, 2, 3, 4})});
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{1, 3, 2}));
  expectNear(test::elementsOf(y[0]), {10, 0, -2, 2, -2, 0});
}

TEST(OnnxSignalOps, DftLengthCutsOrPadsTheSignal) {
  // Cut to [1, 2]: 3, -1.
  auto y = runModel(dftModel(4, 1, false, false, 2), {test::tensorOf(DType::F32, {1, 4, 1}, {1, 2, 3, 4})});
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{1, 2, 2}));
  expectNear(test::elementsOf(y[0]), {3, 0, -1, 0});
  // Padded to [1, 2, 0, 0]: X_k = 1 + 2 (-i)^k: 3, 1-2i, -1, 1+2i.
  y = runModel(dftModel(2, 1, false, false, 4), {test::tensorOf(DType::F32, {1, 2, 1}, {1, 2})});
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{1, 4, 2}));
  expectNear(test::elementsOf(y[0]), {3, 0, 1, -2, -1, 0, 1, 2});
}

TEST(OnnxSignalOps, InverseDftOfAComplexSignal) {
  // The inverse of X = [10, -2+2i, -2, -2-2i] is x = [1, 2, 3, 4] (real).
  auto y =
      runModel(dftModel(4, 2, true, false), {test::tensorOf(DType::F32, {1, 4, 2}, {10, 0, -2, 2, -2, 0, -2, -2})});
  expectNear(test::elementsOf(y[0]), {1, 0, 2, 0, 3, 0, 4, 0});
  // Forward, complex: DFT of [i, 1] is [1 + i, -1 + i].
  y = runModel(dftModel(2, 2, false, false), {test::tensorOf(DType::F32, {1, 2, 2}, {0, 1, 1, 0})});
  expectNear(test::elementsOf(y[0]), {1, 1, -1, 1});
}

TEST(OnnxSignalOps, Opset20TakesTheAxisAsAnInput) {
  // x[2, 2, 1]: the DFT along axis 0 (given as -3) of columns [1, 3] and [2, 4]: [4, -2] and [6, -2].
  onnx::ModelProto m = makeModel(20);
  addInput(m, "x", {2, 2, 1});
  addScalar(m, "axis", -3, onnx::TensorProto::INT64);
  addOutput(m, "y");
  addNode(m, "DFT", {"x", "", "axis"}, {"y"});
  auto y = runModel(m, {test::tensorOf(DType::F32, {2, 2, 1}, {1, 2, 3, 4})});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{2, 2, 2}));
  expectNear(test::elementsOf(y[0]), {4, 0, 6, 0, -2, 0, -2, 0});

  // The default axis is -2: along dim 1, rows [1, 2] and [3, 4]: [3, -1] and [7, -1].
  m.mutable_graph()->mutable_node(0)->mutable_input()->RemoveLast();
  y = runModel(m, {test::tensorOf(DType::F32, {2, 2, 1}, {1, 2, 3, 4})});
  expectNear(test::elementsOf(y[0]), {3, 0, -1, 0, 7, 0, -1, 0});

  // The attribute moved to an input.
  setInt(m.mutable_graph()->mutable_node(0), "axis", 1);
  std::string error = errorOf(m);
  EXPECT_NE(error.find("attribute 'axis' is not supported"), std::string::npos) << error;
}

TEST(OnnxSignalOps, DftErrorsNameTheProblem) {
  onnx::ModelProto m = dftModel(4, 3, false, false);
  std::string error = errorOf(m);
  EXPECT_NE(error.find("last dim must be 1 (real) or 2"), std::string::npos) << error;
  m = dftModel(4, 1, false, false);
  setInt(m.mutable_graph()->mutable_node(0), "axis", 2);
  m.mutable_graph()->mutable_node(0)->mutable_attribute()->DeleteSubrange(0, 1);
  error = errorOf(m);
  EXPECT_NE(error.find("axis 2 is out of range"), std::string::npos) << error;
}

// --- STFT ----------------------------------------------------------------------------

TEST(OnnxSignalOps, StftFramesWindowsAndTransforms) {
  // Signal [1..6], frames of 4 every 2 samples: [1, 2, 3, 4] and [3, 4, 5, 6];
  // one-sided DFTs [10, -2+2i, -2] and [18, -2+2i, -2].
  onnx::ModelProto m = makeModel(17);
  addInput(m, "signal", {1, 6, 1});
  addScalar(m, "step", 2, onnx::TensorProto::INT64);
  addScalar(m, "length", 4, onnx::TensorProto::INT64);
  addOutput(m, "y");
  addNode(m, "STFT", {"signal", "step", "", "length"}, {"y"});
  const Tensor signal = test::tensorOf(DType::F32, {1, 6, 1}, {1, 2, 3, 4, 5, 6});
  auto y = runModel(m, {signal});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{1, 2, 3, 2}));
  expectNear(test::elementsOf(y[0]), {10, 0, -2, 2, -2, 0, 18, 0, -2, 2, -2, 0});

  // A window [0, 1, 1, 0] (a run-time input) leaves [0, 2, 3, 0] and
  // [0, 4, 5, 0]: 5, -3-2i, 1 and 9, -5-4i, 1.
  onnx::ModelProto w = makeModel(17);
  addInput(w, "signal", {1, 6, 1});
  addScalar(w, "step", 2, onnx::TensorProto::INT64);
  addInput(w, "window", {4});
  addOutput(w, "y");
  addNode(w, "STFT", {"signal", "step", "window"}, {"y"});
  y = runModel(w, {signal, test::tensorOf(DType::F32, {4}, {0, 1, 1, 0})});
  expectNear(test::elementsOf(y[0]), {5, 0, -3, -2, 1, 0, 9, 0, -5, -4, 1, 0});

  // frame_length must agree with the window.
  addScalar(w, "length", 3, onnx::TensorProto::INT64);
  w.mutable_graph()->mutable_node(0)->add_input("length");
  std::string error = errorOf(w);
  EXPECT_NE(error.find("frame_length 3 differs from the window's length 4"), std::string::npos) << error;
}

// --- MelWeightMatrix -------------------------------------------------------------------

onnx::ModelProto melModel(int64_t bins, int64_t length, int64_t rate, double lower, double upper) {
  onnx::ModelProto m = makeModel(17);
  addScalar(m, "bins", static_cast<double>(bins), onnx::TensorProto::INT32);
  addScalar(m, "length", static_cast<double>(length), onnx::TensorProto::INT32);
  addScalar(m, "rate", static_cast<double>(rate), onnx::TensorProto::INT32);
  addScalar(m, "lower", lower, onnx::TensorProto::FLOAT);
  addScalar(m, "upper", upper, onnx::TensorProto::FLOAT);
  addOutput(m, "y");
  addNode(m, "MelWeightMatrix", {"bins", "length", "rate", "lower", "upper"}, {"y"});
  return m;
}

TEST(OnnxSignalOps, MelWeightMatrixIsAConstantOfTriangles) {
  // 2 filters over 8 Hz sampled at 16 Hz, dft_length 16 (9 bins). Mel
  // edges at 0, 1/4, 1/2, 3/4 of mel(8): in Hz 0, 1.986, 3.978, 5.977,
  // bins floor(17 hz / 16): 0, 2, 4, 6. Filter 0 rises over bins 0..2 and
  // falls over 2..4; filter 1 over 2..4 and 4..6.
  auto y = runModel(melModel(2, 16, 16, 0, 8), {});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{9, 2}));
  expectNear(test::elementsOf(y[0]), {0, 0, 0.5, 0, 1, 0, 0.5, 0.5, 0, 1, 0, 0.5, 0, 0, 0, 0, 0, 0});

  // Above the Nyquist frequency: past the last bin, or past sample_rate.
  std::string error = errorOf(melModel(2, 16, 16, 0, 16));
  EXPECT_NE(error.find("reaches DFT bin 11 of 9 (it must not exceed sample_rate / 2 = 8)"), std::string::npos) << error;
  error = errorOf(melModel(2, 16, 16, 0, 20));
  EXPECT_NE(error.find("upper_edge_hertz <= sample_rate / 2, got 0.000000 and 20.000000"), std::string::npos) << error;
}

TEST(OnnxSignalOps, MelWeightMatrixNeedsItsInputsAtImportTime) {
  onnx::ModelProto m = makeModel(17);
  addInput(m, "bins", {}, onnx::TensorProto::INT32);
  addScalar(m, "length", 16, onnx::TensorProto::INT32);
  addScalar(m, "rate", 16, onnx::TensorProto::INT32);
  addScalar(m, "lower", 0, onnx::TensorProto::FLOAT);
  addScalar(m, "upper", 8, onnx::TensorProto::FLOAT);
  addOutput(m, "y");
  addNode(m, "MelWeightMatrix", {"bins", "length", "rate", "lower", "upper"}, {"y"});
  std::string error = errorOf(m);
  EXPECT_NE(error.find("num_mel_bins (input 0 'bins') must be known at import time"), std::string::npos) << error;
}

// --- TfIdfVectorizer --------------------------------------------------------------------

/// The pool: unigrams 1 and 3, bigrams (1, 2) and (1, 3); their output
/// coordinates 2, 0, 1, 3.
onnx::ModelProto tfidfModel(const std::string& mode, std::vector<int64_t> dims, bool weights) {
  onnx::ModelProto m = makeModel(9);
  addInput(m, "x", dims, onnx::TensorProto::INT64);
  addOutput(m, "y");
  auto* n = addNode(m, "TfIdfVectorizer", {"x"}, {"y"});
  setInt(n, "min_gram_length", 1);
  setInt(n, "max_gram_length", 2);
  setInt(n, "max_skip_count", 1);
  setString(n, "mode", mode);
  setInts(n, "ngram_counts", {0, 2});
  setInts(n, "ngram_indexes", {2, 0, 1, 3});
  setInts(n, "pool_int64s", {1, 3, 1, 2, 1, 3});
  if (weights) setFloats(n, "weights", {0.5f, 2, 3, 4});
  return m;
}

TEST(OnnxSignalOps, TfIdfCountsUnigramsOnceAndBigramsPerSkip) {
  // Row [1, 2, 1, 2, 3]: unigram 1 twice (-> 2), 3 once (-> 0); bigrams at
  // distance 1: (1, 2) twice (-> 1); at distance 2: (1, 1), (2, 2), (1, 3)
  // -> 3 once. Row [3, 3, 3, 3, 3]: unigram 3 five times.
  const Tensor x = test::tensorOf(DType::I64, {2, 5}, {1, 2, 1, 2, 3, 3, 3, 3, 3, 3});
  auto y = runModel(tfidfModel("TF", {2, 5}, false), {x});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{2, 4}));
  expectNear(test::elementsOf(y[0]), {1, 2, 2, 1, 5, 0, 0, 0});
  // Weights index the output coordinates.
  y = runModel(tfidfModel("TFIDF", {2, 5}, true), {x});
  expectNear(test::elementsOf(y[0]), {0.5, 4, 6, 4, 2.5, 0, 0, 0});
  y = runModel(tfidfModel("IDF", {2, 5}, true), {x});
  expectNear(test::elementsOf(y[0]), {0.5, 2, 3, 4, 0.5, 0, 0, 0});
  y = runModel(tfidfModel("IDF", {2, 5}, false), {x});
  expectNear(test::elementsOf(y[0]), {1, 1, 1, 1, 1, 0, 0, 0});
  // A vector input gives a vector.
  y = runModel(tfidfModel("TF", {5}, false), {test::tensorOf(DType::I64, {5}, {1, 2, 1, 2, 3})});
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{4}));
  expectNear(test::elementsOf(y[0]), {1, 2, 2, 1});
}

TEST(OnnxSignalOps, TfIdfErrorsNameTheAttribute) {
  onnx::ModelProto m = tfidfModel("BM25", {5}, false);
  std::string error = errorOf(m);
  EXPECT_NE(error.find("attribute 'mode' = \"BM25\""), std::string::npos) << error;
  m = tfidfModel("TF", {5}, false);
  setInts(m.mutable_graph()->mutable_node(0), "ngram_counts", {0, 3});
  m.mutable_graph()->mutable_node(0)->mutable_attribute()->DeleteSubrange(4, 1);
  error = errorOf(m);
  EXPECT_NE(error.find("not a whole number of them"), std::string::npos) << error;
}

// --- Random ops ---------------------------------------------------------------------------

onnx::ModelProto bernoulliModel(int64_t n, bool seeded) {
  onnx::ModelProto m = makeModel(15);
  addInput(m, "p", {n});
  addOutput(m, "y");
  auto* node = addNode(m, "Bernoulli", {"p"}, {"y"});
  if (seeded) setFloat(node, "seed", 3.0f);
  return m;
}

TEST(OnnxSignalOps, BernoulliDrawsOnesWithTheGivenProbability) {
  // p = 0, 0.25, 0.5, 1 repeated 20000 times: ones 0, ~5000, ~10000,
  // 20000 at the four positions (5 binomial standard deviations: 306, 354).
  const int64_t copies = 20000;
  std::vector<double> p;
  for (int64_t i = 0; i < copies; ++i) p.insert(p.end(), {0, 0.25, 0.5, 1});
  const Tensor probabilities = test::tensorOf(DType::F32, {4 * copies}, p);
  auto y = runModel(bernoulliModel(4 * copies, true), {probabilities});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].dtype(), DType::F32);
  std::vector<double> ones(4, 0.0);
  for (int64_t i = 0; i < y[0].numElements(); ++i) {
    const double v = y[0].getDouble(i);
    ASSERT_TRUE(v == 0 || v == 1) << "element " << i << " is " << v;
    ones[static_cast<size_t>(i % 4)] += v;
  }
  EXPECT_EQ(ones[0], 0);
  EXPECT_NEAR(ones[1], 5000, 306);
  EXPECT_NEAR(ones[2], 10000, 354);
  EXPECT_EQ(ones[3], copies);

  // The seed fixes the draws; without one, a model still draws the same
  // values on every import.
  EXPECT_EQ(test::elementsOf(runModel(bernoulliModel(4 * copies, true), {probabilities})[0]), test::elementsOf(y[0]));
  auto unseeded = test::elementsOf(runModel(bernoulliModel(4 * copies, false), {probabilities})[0]);
  EXPECT_NE(unseeded, test::elementsOf(y[0]));
  EXPECT_EQ(test::elementsOf(runModel(bernoulliModel(4 * copies, false), {probabilities})[0]), unseeded);
}

TEST(OnnxSignalOps, TrainingDropoutKeepsAndScales) {
  // ratio 0.3: about 70% of 40000 ones kept as 1 / 0.7, the mask true
  // exactly there (5 standard deviations of the kept count: 458).
  onnx::ModelProto m = makeModel(13);
  addInput(m, "x", {200, 200});
  addScalar(m, "ratio", 0.3, onnx::TensorProto::FLOAT);
  addScalar(m, "training", 1, onnx::TensorProto::BOOL);
  addOutput(m, "y");
  addOutput(m, "mask", onnx::TensorProto::BOOL);
  auto* node = addNode(m, "Dropout", {"x", "ratio", "training"}, {"y", "mask"});
  setInt(node, "seed", 7);
  auto out = runModel(m, {test::tensorOf(DType::F32, {200, 200}, std::vector<double>(40000, 1.0))});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].dtype(), DType::Bool);
  double kept = 0;
  for (int64_t i = 0; i < 40000; ++i) {
    const bool keep = out[1].getInt(i) != 0;
    ASSERT_NEAR(out[0].getDouble(i), keep ? 1 / 0.7 : 0.0, 1e-6) << "element " << i;
    kept += keep;
  }
  EXPECT_NEAR(kept, 28000, 458);
}

TEST(OnnxSignalOps, TrainingRefusesRandomDropout) {
  // The mask would be the same at every step.
  onnx::ModelProto m = makeModel(13);
  addInput(m, "x", {2, 3});
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(3);
  for (int i = 0; i < 3; ++i) w->add_float_data(1.0f);
  addScalar(m, "ratio", 0.5, onnx::TensorProto::FLOAT);
  addScalar(m, "training", 1, onnx::TensorProto::BOOL);
  addOutput(m, "y");
  addNode(m, "Mul", {"x", "w"}, {"h"});
  addNode(m, "Dropout", {"h", "ratio", "training"}, {"y"});
  const std::string path = ::testing::TempDir() + "/random-dropout.onnx";
  {
    std::ofstream f(path, std::ios::binary);
    ASSERT_TRUE(m.SerializeToOstream(&f));
  }
  auto loaded = training::loadTrainableModel(path, {{"x", {2, 3}}}, test::onnxTestEvaluator());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.error().str().find("'random_uniform' draws random numbers"), std::string::npos)
      << loaded.error().str();
}

TEST(OnnxSignalOps, RandomNormalLikeHasTheMeanAndScale) {
  onnx::ModelProto m = makeModel(15);
  addInput(m, "x", {100, 100});
  addOutput(m, "y");
  auto* node = addNode(m, "RandomNormalLike", {"x"}, {"y"});
  setFloat(node, "mean", 2.0f);
  setFloat(node, "scale", 0.5f);
  auto y = test::elementsOf(runModel(m, {test::tensorOf(DType::F32, {100, 100}, std::vector<double>(10000, 0.0))})[0]);
  double sum = 0, squares = 0;
  for (double v : y) {
    sum += v;
    squares += (v - 2) * (v - 2);
  }
  // The mean within 5 standard errors (0.5 / 100 each).
  EXPECT_NEAR(sum / 1e4, 2.0, 0.025);
  EXPECT_NEAR(std::sqrt(squares / 1e4), 0.5, 0.02);
}

TEST(OnnxSignalOps, RandomOpsNeedAFloatType) {
  onnx::ModelProto m = makeModel(15);
  addInput(m, "x", {4}, onnx::TensorProto::INT64);
  addOutput(m, "y");
  addNode(m, "RandomUniformLike", {"x"}, {"y"});
  std::string error = errorOf(m);
  EXPECT_NE(error.find("give the result's type in attribute 'dtype'"), std::string::npos) << error;
  setInt(m.mutable_graph()->mutable_node(0), "dtype", onnx::TensorProto::INT32);
  error = errorOf(m);
  EXPECT_NE(error.find("attribute 'dtype' = 6 is not a float type"), std::string::npos) << error;
}

}  // namespace
}  // namespace kiln
