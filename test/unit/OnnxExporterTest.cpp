// Unit tests of the ONNX exporter: IR built here is exported, imported back
// with importOnnxBytes, and both functions run on the interpreter with the
// same inputs must agree; the exported ModelProto keeps argument, default
// (initializer) and result names; ops without an ONNX equivalent are errors
// naming them; writeOnnxModel writes atomically.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "frontend/onnx/OnnxExporter.h"
#include "frontend/onnx/OnnxImporter.h"
#include "ir/Builder.h"
#include "onnx.pb.h"
#include "runtime/Interpreter.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

TensorType f32(std::vector<int64_t> dims) { return TensorType{DType::F32, staticShape(dims)}; }

/// A deterministic tensor of `type` with values in [-2, 2) (integers: in [0, modulo)).
Tensor sample(const TensorType& type, uint64_t seed, int64_t modulo = 3) {
  Tensor t(type.dtype, staticDims(type.shape));
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numElements(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    double u = static_cast<double>(state >> 11) * 0x1.0p-53;
    if (isFloat(type.dtype))
      t.setDouble(i, 4 * u - 2);
    else
      t.setDouble(i, static_cast<double>(static_cast<int64_t>(u * static_cast<double>(modulo))));
  }
  return t;
}

DenseTensor denseSample(const TensorType& type, uint64_t seed) {
  Tensor t = sample(type, seed);
  DenseTensor d = DenseTensor::zeros(type);
  for (int64_t i = 0; i < d.numElements(); ++i) d.setDouble(i, t.getDouble(i));
  return d;
}

/// Builds one function through a Builder; `op` fails the test on a shape error.
struct TestFunction {
  std::unique_ptr<Module> module = std::make_unique<Module>();
  Function* f = module->addFunction("main");
  Builder b{*f};

  Value* arg(const std::string& name, TensorType type) { return f->addArgument(std::move(type), name); }
  Value* op(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {}, std::vector<TensorType> declared = {}) {
    auto v = b.value(kind, std::move(operands), std::move(attrs), std::move(declared));
    EXPECT_TRUE(v.ok()) << opName(kind) << ": " << (v.ok() ? "" : v.error().str());
    return v.ok() ? *v : nullptr;
  }
  std::vector<Value*> ops(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {}) {
    auto o = b.build(kind, std::move(operands), std::move(attrs));
    EXPECT_TRUE(o.ok()) << opName(kind) << ": " << (o.ok() ? "" : o.error().str());
    return o.ok() ? (*o)->results() : std::vector<Value*>{};
  }
  Value* constant(TensorType type, uint64_t seed) { return b.constant(denseSample(type, seed)); }
};

std::string exported(const Module& m) {
  auto bytes = exportOnnx(m);
  EXPECT_TRUE(bytes.ok()) << (bytes.ok() ? "" : bytes.error().str());
  return bytes.ok() ? *bytes : "";
}

/// Exports, imports back and checks that both run to the same results on inputs from `sample`.
void expectRoundTrip(const Module& m, std::map<size_t, Tensor> given = {}) {
  std::string bytes = exported(m);
  ASSERT_FALSE(bytes.empty());
  InterpreterEvaluator evaluator;
  LoadOptions options;
  options.evaluator = &evaluator;
  auto back = importOnnxBytes(bytes, "exported.onnx", "", options);
  ASSERT_TRUE(back.ok()) << back.error().str();
  const Function& f = *m.functions().front();
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i)
    inputs.push_back(given.count(i) ? given.at(i) : sample(f.argument(i)->type(), i + 1));
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  auto got = interpret(*(*back)->functions().front(), inputs);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t r = 0; r < want->size(); ++r) {
    const Tensor& a = (*got)[r];
    const Tensor& b = (*want)[r];
    ASSERT_EQ(a.shape(), b.shape()) << "result " << r;
    ASSERT_EQ(a.dtype(), b.dtype()) << "result " << r;
    for (int64_t i = 0; i < a.numElements(); ++i) {
      if (std::isnan(a.getDouble(i)) && std::isnan(b.getDouble(i))) continue;
      EXPECT_NEAR(a.getDouble(i), b.getDouble(i), 1e-5 + 1e-4 * std::abs(b.getDouble(i)))
          << "result " << r << " element " << i;
    }
  }
}

onnx::ModelProto parsed(const std::string& bytes) {
  onnx::ModelProto model;
  EXPECT_TRUE(model.ParseFromString(bytes));
  return model;
}

TEST(OnnxExporter, NamesDefaultsAndResultsSurvive) {
  TestFunction t;
  Value* x = t.arg("x", f32({2, 4}));
  Value* w = t.arg("fc.weight", f32({4, 3}));
  t.f->setArgumentDefault(1, std::make_shared<DenseTensor>(denseSample(f32({4, 3}), 7)));
  Value* bias = t.constant(f32({3}), 8);
  bias->setName("fc.bias");
  Value* y = t.op(OpKind::Add, {t.op(OpKind::MatMul, {x, w}), bias});
  Value* probs = t.op(OpKind::Softmax, {t.op(OpKind::Relu, {y})});
  t.b.ret({probs, x});
  t.f->setResultName(0, "probs");

  onnx::ModelProto model = parsed(exported(*t.module));
  EXPECT_EQ(model.ir_version(), 8);
  ASSERT_EQ(model.opset_import_size(), 1);
  EXPECT_EQ(model.opset_import(0).version(), 17);
  const onnx::GraphProto& g = model.graph();
  ASSERT_EQ(g.input_size(), 2);
  EXPECT_EQ(g.input(0).name(), "x");
  EXPECT_EQ(g.input(1).name(), "fc.weight");
  std::set<std::string> initializers;
  for (const auto& i : g.initializer()) initializers.insert(i.name());
  EXPECT_TRUE(initializers.count("fc.weight"));
  EXPECT_TRUE(initializers.count("fc.bias"));
  ASSERT_EQ(g.output_size(), 2);
  EXPECT_EQ(g.output(0).name(), "probs");
  EXPECT_EQ(g.output(1).name(), "x_0");  // an argument returned as is goes through an Identity
  expectRoundTrip(*t.module);
}

TEST(OnnxExporter, ElementwiseLayoutAndReductions) {
  TestFunction t;
  Value* a = t.arg("a", f32({2, 3, 4}));
  Value* b = t.arg("b", f32({3, 4}));
  Value* positive = t.op(OpKind::Add, {t.op(OpKind::Abs, {a}), t.b.scalar(DType::F32, 1.0)});
  Value* r = t.op(OpKind::Rsqrt, {positive});
  Value* mod = t.op(OpKind::Mod, {a, t.op(OpKind::Add, {t.op(OpKind::Abs, {b}), t.b.scalar(DType::F32, 0.5)})});
  Value* rem = t.op(OpKind::Rem, {a, t.b.scalar(DType::F32, 0.75)});
  Value* ne = t.op(OpKind::Ne, {t.op(OpKind::Round, {a}), t.op(OpKind::Floor, {a})});
  Value* picked = t.op(OpKind::Select, {ne, mod, rem});
  Value* moved = t.op(OpKind::Transpose, {picked}, {{"perm", Attribute(std::vector<int64_t>{2, 0, 1})}});
  Value* flat = t.op(OpKind::Reshape, {moved}, {}, {f32({4, 6})});
  Value* sliced = t.op(OpKind::Slice, {flat},
                       {{"starts", Attribute(std::vector<int64_t>{3, 0})},
                        {"ends", Attribute(std::vector<int64_t>{-100, 6})},
                        {"steps", Attribute(std::vector<int64_t>{-2, 2})}});
  Value* padded =
      t.op(OpKind::Pad, {sliced}, {{"pads", Attribute(std::vector<int64_t>{1, 0, 0, 2})}, {"value", Attribute(1.5)}});
  Value* joined = t.op(OpKind::Concat, {padded, padded}, {{"axis", Attribute(int64_t{1})}});
  Value* sum = t.op(OpKind::ReduceSum, {joined}, {{"axes", Attribute(std::vector<int64_t>{1})}});
  Value* mean =
      t.op(OpKind::ReduceMean, {r}, {{"axes", Attribute(std::vector<int64_t>{0, 2})}, {"keepdims", Attribute(true)}});
  Value* total = t.op(OpKind::ReduceMax, {r}, {{"axes", Attribute(std::vector<int64_t>{})}});
  Value* index = t.op(OpKind::ArgMax, {a}, {{"axis", Attribute(int64_t{1})}});
  Value* gathered = t.op(OpKind::Gather, {b, t.b.constant(denseSample(TensorType{DType::I64, staticShape({2})}, 3))});
  Value* cast = t.op(OpKind::Cast, {index}, {}, {TensorType{DType::F32, index->type().shape}});
  Value* wide = t.op(OpKind::Broadcast, {b}, {}, {f32({2, 3, 4})});
  Value* iota =
      t.op(OpKind::Iota, {}, {{"axis", Attribute(int64_t{1})}}, {TensorType{DType::I32, staticShape({2, 3})}});
  t.b.ret({sum, mean, total, index, gathered, cast, wide, iota});
  expectRoundTrip(*t.module);
}

TEST(OnnxExporter, ConvPoolingAndNormalization) {
  TestFunction t;
  Value* x = t.arg("x", f32({1, 2, 5, 5}));
  Value* w = t.constant(f32({4, 1, 3, 3}), 11);
  Value* bias = t.constant(f32({4}), 12);
  Value* conv = t.op(OpKind::Conv, {x, w, bias},
                     {{"pads", Attribute(std::vector<int64_t>{1, 1, 1, 1})},
                      {"strides", Attribute(std::vector<int64_t>{1, 2})},
                      {"groups", Attribute(int64_t{2})}});
  Value* up = t.op(
      OpKind::ConvTranspose, {conv, t.constant(f32({4, 1, 2, 2}), 13)},
      {{"strides", Attribute(std::vector<int64_t>{2, 2})}, {"output_padding", Attribute(std::vector<int64_t>{1, 0})}});
  Value* pooled = t.op(OpKind::MaxPool, {up},
                       {{"kernel", Attribute(std::vector<int64_t>{3, 3})},
                        {"strides", Attribute(std::vector<int64_t>{2, 2})},
                        {"ceil_mode", Attribute(true)}});
  Value* averaged = t.op(OpKind::AvgPool, {pooled},
                         {{"kernel", Attribute(std::vector<int64_t>{2, 2})},
                          {"pads", Attribute(std::vector<int64_t>{1, 1, 0, 0})},
                          {"count_include_pad", Attribute(false)}});
  Value* stats = t.constant(f32({1}), 14);
  Value* var = t.op(OpKind::Abs, {stats});
  Value* normed = t.op(OpKind::BatchNorm, {averaged, stats, stats, stats, var});
  Value* layer = t.op(OpKind::LayerNorm, {normed}, {{"axis", Attribute(int64_t{2})}});
  Value* scaled = t.op(OpKind::LayerNorm, {x, t.constant(f32({5}), 15)}, {{"axis", Attribute(int64_t{-1})}});
  Value* gelu = t.op(OpKind::Gelu, {scaled});
  Value* geluTanh = t.op(OpKind::Gelu, {scaled}, {{"approximate", Attribute("tanh")}});
  Value* acts = t.op(OpKind::Add, {t.op(OpKind::Silu, {gelu}), t.op(OpKind::LeakyRelu, {geluTanh})});
  acts = t.op(OpKind::Add, {acts, t.op(OpKind::Elu, {x}, {{"alpha", Attribute(0.5)}})});
  acts = t.op(OpKind::Add, {acts, t.op(OpKind::Softplus, {x})});
  Value* logp = t.op(OpKind::LogSoftmax, {acts}, {{"axis", Attribute(int64_t{1})}});
  t.b.ret({layer, logp});
  expectRoundTrip(*t.module);
}

TEST(OnnxExporter, RecurrentOps) {
  TestFunction t;
  Value* x = t.arg("x", f32({3, 2, 4}));
  int64_t h = 5;
  auto weights = [&](int64_t dirs, int64_t gates, uint64_t seed) {
    return std::vector<Value*>{
        t.constant(f32({dirs, gates * h, 4}), seed), t.constant(f32({dirs, gates * h, h}), seed + 1),
        t.constant(f32({dirs, 2 * gates * h}), seed + 2), t.constant(f32({dirs, 2, h}), seed + 3)};
  };
  auto lw = weights(2, 4, 20);
  auto lstm = t.ops(OpKind::Lstm, {x, lw[0], lw[1], lw[2], lw[3], t.constant(f32({2, 2, h}), 30)},
                    {{"hidden_size", Attribute(h)}, {"direction", Attribute("bidirectional")}});
  auto gw = weights(1, 3, 40);
  auto gru = t.ops(
      OpKind::Gru, {x, gw[0], gw[1], gw[2], gw[3]},
      {{"hidden_size", Attribute(h)}, {"direction", Attribute("reverse")}, {"linear_before_reset", Attribute(true)}});
  auto rw = weights(2, 1, 50);
  auto rnn = t.ops(
      OpKind::Rnn, {x, rw[0], rw[1], rw[2], rw[3]},
      {{"hidden_size", Attribute(h)}, {"direction", Attribute("bidirectional")}, {"activation", Attribute("relu")}});
  ASSERT_EQ(lstm.size(), 3u);
  ASSERT_EQ(gru.size(), 2u);
  ASSERT_EQ(rnn.size(), 2u);
  t.b.ret({lstm[0], lstm[1], lstm[2], gru[0], gru[1], rnn[0], rnn[1]});
  expectRoundTrip(*t.module);
}

TEST(OnnxExporter, AttentionAndLosses) {
  TestFunction t;
  Value* q = t.arg("q", f32({2, 3, 4}));
  Value* k = t.arg("k", f32({2, 5, 4}));
  Value* v = t.arg("v", f32({2, 5, 6}));
  Value* labels = t.arg("labels", TensorType{DType::I64, staticShape({2, 3})});
  Value* causal = t.op(OpKind::Attention, {q, k, v}, {{"causal", Attribute(true)}, {"scale", Attribute(0.3)}});
  Value* masked = t.op(OpKind::Attention, {q, k, v, t.constant(f32({3, 5}), 60)});
  Value* logits = t.op(OpKind::Transpose, {causal}, {{"perm", Attribute(std::vector<int64_t>{0, 2, 1})}});
  Value* ce = t.op(OpKind::CrossEntropy, {logits, labels}, {{"ignore_index", Attribute(int64_t{2})}});
  Value* ceNone = t.op(OpKind::CrossEntropy, {logits, labels}, {{"reduction", Attribute("none")}});
  Value* logp = t.op(OpKind::LogSoftmax, {logits}, {{"axis", Attribute(int64_t{1})}});
  Value* nll = t.op(OpKind::NllLoss, {logp, labels}, {{"reduction", Attribute("sum")}});
  Value* mse = t.op(OpKind::MseLoss, {causal, masked});
  Value* mseNone = t.op(OpKind::MseLoss, {causal, masked}, {{"reduction", Attribute("none")}});
  t.b.ret({causal, masked, ce, ceNone, nll, mse, mseNone});
  expectRoundTrip(*t.module, {{3, sample(labels->type(), 9, 6)}});
}

TEST(OnnxExporter, DataDependentOps) {
  TestFunction t;
  Value* x = t.arg("x", f32({3, 4}));
  Value* boxes = t.arg("boxes", f32({1, 3, 4}));
  Value* scores = t.arg("scores", f32({1, 2, 3}));
  Value* positive = t.op(OpKind::Relu, {x});
  Value* nonzero = t.op(OpKind::NonZero, {positive});
  auto unique = t.ops(OpKind::Unique, {x},
                      {{"axis", Attribute(std::vector<int64_t>{0})}, {"sorted", Attribute(false)}});
  DenseTensor two = DenseTensor::zeros(TensorType{DType::I64, staticShape({1})});
  two.setDouble(0, 2);
  DenseTensor half = DenseTensor::zeros(f32({1}));
  half.setDouble(0, 0.5);
  Value* k = t.b.constant(two);
  Value* iou = t.b.constant(half);
  Value* nms = t.op(OpKind::NonMaxSuppression, {boxes, scores, k, iou}, {{"center_point_box", Attribute(true)}});
  ASSERT_EQ(unique.size(), 4u);
  t.b.ret({nonzero, unique[0], unique[1], unique[2], unique[3], nms});
  expectRoundTrip(*t.module);
}

TEST(OnnxExporter, UnexportableOpIsAnErrorNamingIt) {
  TestFunction t;
  Value* x = t.arg("x", f32({4}));
  Value* idx = t.b.constant(denseSample(TensorType{DType::I64, staticShape({2})}, 1));
  Value* y = t.op(OpKind::ScatterElements, {x, idx, t.constant(f32({2}), 2)}, {{"reduction", Attribute("max")}});
  t.b.ret({y});
  auto bytes = exportOnnx(*t.module);
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.error().str().find("scatter_elements"), std::string::npos) << bytes.error().str();

  TestFunction s;
  Value* logits = s.arg("logits", f32({2, 3}));
  Value* labels = s.arg("labels", TensorType{DType::I64, staticShape({2})});
  s.b.ret({s.op(OpKind::CrossEntropy, {logits, labels}, {{"label_smoothing", Attribute(0.1)}})});
  auto smoothed = exportOnnx(*s.module);
  ASSERT_FALSE(smoothed.ok());
  EXPECT_NE(smoothed.error().str().find("label smoothing"), std::string::npos) << smoothed.error().str();
}

TEST(OnnxExporter, WriteIsAtomic) {
  TestFunction t;
  Value* x = t.arg("x", f32({2}));
  t.b.ret({t.op(OpKind::Neg, {x})});
  fs::path dir = fs::temp_directory_path() / ("kiln-export-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "m.onnx").string();
  ASSERT_TRUE(writeOnnxModel(*t.module, path).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(parsed(bytes).graph().node(0).op_type(), "Neg");

  // A failed export leaves the existing file as it was and no temporary behind.
  TestFunction bad;
  Value* y = bad.arg("y", f32({4}));
  Value* idx = bad.b.constant(denseSample(TensorType{DType::I64, staticShape({1})}, 1));
  bad.b.ret({bad.op(OpKind::ScatterElements, {y, idx, bad.constant(f32({1}), 2)}, {{"reduction", Attribute("min")}})});
  EXPECT_FALSE(writeOnnxModel(*bad.module, path).ok());
  std::ifstream again(path, std::ios::binary);
  std::string after((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, bytes);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  EXPECT_FALSE(writeOnnxModel(*t.module, (dir / "missing" / "m.onnx").string()).ok());
  fs::remove_all(dir);
}

/// Every PyTorch-exported conformance model that Kiln imports comes back
/// from an export with the same results on its test inputs.
TEST(OnnxExporter, RoundTripsThePyTorchConformanceModels) {
  fs::path data = "/usr/share/libonnx-testdata/data";
  std::ifstream list(std::string(KILN_SOURCE_DIR) + "/test/conformance/expected-pass.txt");
  if (!fs::exists(data) || !list) GTEST_SKIP() << "libonnx-testdata or the expected-pass list is missing";
  InterpreterEvaluator evaluator;
  LoadOptions options;
  options.evaluator = &evaluator;
  int checked = 0;
  for (std::string name; std::getline(list, name);) {
    if (name.rfind("pytorch-", 0) != 0) continue;
    fs::path dir = data / name;
    auto module = importOnnx((dir / "model.onnx").string(), options);
    if (!module.ok()) continue;  // a case the runner imports with frozen inputs
    const Function& f = *(*module)->functions().front();
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < f.numArguments() && !f.argumentDefault(i); ++i) {
      auto t = readOnnxTensor((dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")).string());
      ASSERT_TRUE(t.ok()) << name << ": " << t.error().str();
      inputs.push_back(Tensor::fromDense(*t));
    }
    for (size_t i = inputs.size(); i < f.numArguments(); ++i) {
      if (!f.argumentDefault(i)) break;
      inputs.push_back(Tensor::fromDense(*f.argumentDefault(i)));
    }
    if (inputs.size() != f.numArguments()) continue;
    SCOPED_TRACE(name);
    expectRoundTrip(**module, [&] {
      std::map<size_t, Tensor> given;
      for (size_t i = 0; i < inputs.size(); ++i) given.emplace(i, inputs[i]);
      return given;
    }());
    ++checked;
  }
  EXPECT_GT(checked, 50);
}

}  // namespace
}  // namespace kiln
