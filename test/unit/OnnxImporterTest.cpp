// Unit tests of the ONNX importer on ModelProtos built in C++: the IR
// conventions (arguments, defaults, result names, value names, locations),
// opset-dependent semantics, attribute defaults, import-time folding, and
// hostile input (truncated bytes, bad tensors, bad indices, cycles,
// unsupported ops, external data that tries to leave the model's folder).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "frontend/onnx/OnnxTraining.h"
#include "ir/Verifier.h"
#include "onnx.pb.h"
#include "onnx_values.pb.h"
#include "passes/Autodiff.h"
#include "passes/TrainingStep.h"
#include "runtime/Interpreter.h"
#include "test/unit/OnnxTestSupport.h"
#include "test/unit/TestSupport.h"
#include "training/TrainableModel.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

using test::addInput;
using test::addNode;
using test::addOutput;
using test::addValueInfo;
using test::countOps;
using test::errorOf;
using test::floatTensor;
using test::importModel;
using test::int64Tensor;
using test::makeModel;
using test::run;
using test::setFloat;
using test::setInt;
using test::setInts;

TEST(OnnxImporter, ConventionsArgumentsDefaultsResultsNamesLocations) {
  auto m = makeModel(13);
  addInput(m, "onnx::x", {-1, 3}, onnx::TensorProto::FLOAT, {{0, "batch"}});
  addInput(m, "bias", {3});
  *m.mutable_graph()->add_initializer() = floatTensor("bias", {3}, {1, 2, 3});
  *m.mutable_graph()->add_initializer() = floatTensor("w", {3}, {10, 20, 30}, /*raw=*/true);
  addNode(m, "Mul", {"onnx::x", "w"}, {"scaled"}, "Mul_0");
  addNode(m, "Add", {"scaled", "bias"}, {"y"}, "Add_1");
  addOutput(m, "y");
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  const Function& f = *(*module)->functions().front();
  EXPECT_EQ(f.name(), "g");
  ASSERT_EQ(f.numArguments(), 2u);
  EXPECT_EQ(f.argument(0)->name(), "onnx::x");
  EXPECT_EQ(f.argument(0)->type().str(), "f32[batch,3]");
  EXPECT_EQ(f.argumentDefault(0), nullptr);
  ASSERT_NE(f.argumentDefault(1), nullptr);
  EXPECT_EQ(f.argumentDefault(1)->type.str(), "f32[3]");
  EXPECT_EQ(f.resultName(0), "y");
  EXPECT_EQ(countOps(f, OpKind::Constant), 1u);  // w
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Mul) {
      EXPECT_EQ(op->loc().name, "Mul_0");
      EXPECT_EQ(op->loc().file, "test.onnx");
      EXPECT_EQ(op->result()->name(), "scaled");
    }
  }
  auto out = run(**module,
                 {test::tensorOf(DType::F32, {2, 3}, {1, 1, 1, 2, 2, 2}), test::tensorOf(DType::F32, {3}, {1, 2, 3})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{11, 22, 33, 21, 42, 63}));
}

TEST(OnnxImporter, MissingDimIsUnknown) {
  auto m = makeModel(13);
  addInput(m, "x", {-1, 2});
  addNode(m, "Relu", {"x"}, {"y"});
  addOutput(m, "y");
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  EXPECT_EQ((*module)->functions().front()->argument(0)->type().str(), "f32[?,2]");
}

TEST(OnnxImporter, NodesOutOfOrderAreSorted) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addNode(m, "Neg", {"a"}, {"y"}, "second");
  addNode(m, "Abs", {"x"}, {"a"}, "first");
  addOutput(m, "y");
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto out = run(**module, {test::tensorOf(DType::F32, {2}, {-1, 2})});
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{-1, -2}));
}

TEST(OnnxImporter, CycleIsAnErrorNamingANodeOnIt) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addNode(m, "Add", {"x", "c"}, {"a"}, "n_a");
  addNode(m, "Neg", {"a"}, {"b"}, "n_b");
  addNode(m, "Abs", {"b"}, {"c"}, "n_c");
  addOutput(m, "c");
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("cycle through node 'n_"), std::string::npos) << error;
}

TEST(OnnxImporter, UndefinedTensorIsAnError) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addNode(m, "Add", {"x", "nowhere"}, {"y"}, "add");
  addOutput(m, "y");
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("'nowhere'"), std::string::npos) << error;
}

TEST(OnnxImporter, AllUnsupportedOpsAreListedAtOnce) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addNode(m, "FancyOp", {"x"}, {"a"}, "f1");
  addNode(m, "Relu", {"a"}, {"b"}, "r");
  addNode(m, "FancyOp", {"b"}, {"c"}, "f2");
  auto* custom = addNode(m, "Thing", {"c"}, {"y"}, "t1");
  custom->set_domain("com.example");
  addOutput(m, "y");
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("2 unsupported ONNX ops (3 nodes)"), std::string::npos) << error;
  EXPECT_NE(error.find("FancyOp (opset 13): 2 nodes: f1, f2"), std::string::npos) << error;
  EXPECT_NE(error.find("com.example.Thing (domain 'com.example' is not imported by the model): 1 node: t1"),
            std::string::npos)
      << error;
}

TEST(OnnxImporter, FindUnsupportedOnnxOpsReadsAFile) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addNode(m, "FancyOp", {"x"}, {"y"});
  addOutput(m, "y");
  const fs::path dir = fs::temp_directory_path() / "kiln-onnx-unsupported";
  fs::create_directories(dir);
  std::ofstream(dir / "m.onnx", std::ios::binary) << m.SerializeAsString();
  auto ops = findUnsupportedOnnxOps((dir / "m.onnx").string());
  ASSERT_TRUE(ops.ok()) << ops.error().str();
  ASSERT_EQ(ops->size(), 1u);
  EXPECT_EQ((*ops)[0].opType, "FancyOp");
  EXPECT_EQ((*ops)[0].opset, 13);
  EXPECT_EQ((*ops)[0].nodes, std::vector<std::string>{"#0"});
  fs::remove_all(dir);
}

TEST(OnnxImporter, TruncatedAndGarbageBytesAreErrors) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addNode(m, "Relu", {"x"}, {"y"});
  addOutput(m, "y");
  *m.mutable_graph()->add_initializer() = floatTensor("unused", {64}, std::vector<float>(64, 1.0f), true);
  const std::string bytes = m.SerializeAsString();
  for (size_t cut : {size_t{1}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    auto r = importOnnxBytes(std::string_view(bytes).substr(0, cut), "cut.onnx", "");
    EXPECT_FALSE(r.ok()) << "cut at " << cut;
  }
  EXPECT_FALSE(importOnnxBytes("\xff\xff\xff\xff garbage", "bad.onnx", "").ok());
  EXPECT_FALSE(importOnnx("/nonexistent/model.onnx").ok());
}

TEST(OnnxImporter, BadTensorsAreErrors) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addNode(m, "Add", {"x", "w"}, {"y"});
  addOutput(m, "y");
  auto withInit = [&](onnx::TensorProto t) {
    auto copy = m;
    *copy.mutable_graph()->add_initializer() = std::move(t);
    return errorOf(importModel(copy));
  };
  auto shortRaw = floatTensor("w", {2}, {1}, true);
  EXPECT_NE(withInit(shortRaw).find("raw_data has 4 bytes"), std::string::npos);
  auto shortTyped = floatTensor("w", {2}, {1});
  EXPECT_NE(withInit(shortTyped).find("float_data has 1 values"), std::string::npos);
  // A large shape with no values is refused before its memory is taken (the
  // fuzzer's out-of-memory case: 2.7 GB declared, no values given).
  auto empty = floatTensor("w", {int64_t{1} << 29, 2}, {});
  EXPECT_NE(withInit(empty).find("float_data has 0 values, but the shape [536870912,2] needs 1073741824"),
            std::string::npos)
      << withInit(empty);
  auto negative = floatTensor("w", {-2}, {});
  EXPECT_NE(withInit(negative).find("dim 0 is -2"), std::string::npos);
  auto huge = floatTensor("w", {int64_t{1} << 30, int64_t{1} << 30}, {});
  EXPECT_NE(withInit(huge).find("2^40"), std::string::npos);
  onnx::TensorProto strings;
  strings.set_name("w");
  strings.set_data_type(onnx::TensorProto::STRING);
  EXPECT_NE(withInit(strings).find("strings"), std::string::npos);
}

TEST(OnnxImporter, BadAttributesAndIndicesAreErrorsNamingTheNode) {
  {
    auto m = makeModel(13);
    addInput(m, "x", {2, 3});
    setInt(addNode(m, "Concat", {"x", "x"}, {"y"}, "cat"), "axis", 5);
    addOutput(m, "y");
    std::string error = errorOf(importModel(m));
    EXPECT_NE(error.find("node 'cat' (Concat, opset 13)"), std::string::npos) << error;
    EXPECT_NE(error.find("axis 5 is out of range"), std::string::npos) << error;
  }
  {
    auto m = makeModel(13);
    addInput(m, "x", {2, 3});
    setFloat(addNode(m, "Transpose", {"x"}, {"y"}, "tr"), "perm", 1.0f);
    addOutput(m, "y");
    std::string error = errorOf(importModel(m));
    EXPECT_NE(error.find("attribute 'perm' is FLOAT, expected INTS"), std::string::npos) << error;
  }
  {
    // A constant gather index out of range fails while folding, naming the node.
    auto m = makeModel(13);
    *m.mutable_graph()->add_initializer() = floatTensor("data", {3}, {1, 2, 3});
    *m.mutable_graph()->add_initializer() = int64Tensor("idx", {1}, {7});
    addNode(m, "Gather", {"data", "idx"}, {"y"}, "g");
    addOutput(m, "y");
    std::string error = errorOf(importModel(m));
    EXPECT_NE(error.find("node 'g' (Gather, opset 13)"), std::string::npos) << error;
  }
  {
    auto m = makeModel(13);
    addInput(m, "x", {2, 3});
    setInts(addNode(m, "Split", {"x"}, {"a", "b"}, "sp"), "split", {1, 1});
    addOutput(m, "a");
    // Opset 13 takes the sizes as an input; the old attribute is not silently ignored.
    std::string error = errorOf(importModel(m));
    EXPECT_NE(error.find("attribute 'split' is not allowed since opset 13"), std::string::npos) << error;
  }
}

TEST(OnnxImporter, ReduceSumAxesAttributeBeforeOpset13InputAfter) {
  for (int64_t opset : {11, 13}) {
    auto m = makeModel(opset);
    addInput(m, "x", {2, 3});
    auto* n = addNode(m, "ReduceSum", {"x"}, {"y"});
    if (opset < 13) {
      setInts(n, "axes", {1});
    } else {
      n->add_input("axes");
      *m.mutable_graph()->add_initializer() = int64Tensor("axes", {1}, {1});
    }
    setInt(n, "keepdims", 0);
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    auto out = run(**module, {test::tensorOf(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6})});
    EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{6, 15})) << "opset " << opset;
  }
}

TEST(OnnxImporter, ClipAttributesBeforeOpset11InputsAfter) {
  for (int64_t opset : {6, 11}) {
    auto m = makeModel(opset);
    addInput(m, "x", {4});
    auto* n = addNode(m, "Clip", {"x"}, {"y"});
    if (opset < 11) {
      setFloat(n, "min", -1);
      setFloat(n, "max", 2);
    } else {
      n->add_input("lo");
      n->add_input("hi");
      *m.mutable_graph()->add_initializer() = floatTensor("lo", {}, {-1});
      *m.mutable_graph()->add_initializer() = floatTensor("hi", {}, {2});
    }
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    auto out = run(**module, {test::tensorOf(DType::F32, {4}, {-5, 0, 1.5, 9})});
    EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{-1, 0, 1.5, 2})) << "opset " << opset;
  }
}

TEST(OnnxImporter, AttributeDefaults) {
  // Gemm: alpha = beta = 1, no transposes; ArgMax: axis 0, keepdims 1.
  auto m = makeModel(13);
  addInput(m, "a", {2, 2});
  addInput(m, "b", {2, 2});
  *m.mutable_graph()->add_initializer() = floatTensor("c", {2}, {100, 200});
  addNode(m, "Gemm", {"a", "b", "c"}, {"y"});
  addNode(m, "ArgMax", {"a"}, {"i"});
  addOutput(m, "y");
  addOutput(m, "i", onnx::TensorProto::INT64);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto out = run(**module,
                 {test::tensorOf(DType::F32, {2, 2}, {1, 2, 3, 4}), test::tensorOf(DType::F32, {2, 2}, {1, 0, 0, 1})});
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{101, 202, 103, 204}));
  EXPECT_EQ(out[1].shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{1, 1}));
}

TEST(OnnxImporter, ShapeComputationsFoldToConstants) {
  // Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch.onnx exports a flatten.
  auto m = makeModel(13);
  addInput(m, "x", {2, 3, 4});
  *m.mutable_graph()->add_initializer() = int64Tensor("zero", {}, {0});
  *m.mutable_graph()->add_initializer() = int64Tensor("minus1", {1}, {-1});
  *m.mutable_graph()->add_initializer() = int64Tensor("axes0", {1}, {0});
  addNode(m, "Shape", {"x"}, {"shape"});
  addNode(m, "Gather", {"shape", "zero"}, {"batch"});
  addNode(m, "Unsqueeze", {"batch", "axes0"}, {"batch1"});
  auto* cat = addNode(m, "Concat", {"batch1", "minus1"}, {"newshape"});
  setInt(cat, "axis", 0);
  addNode(m, "Reshape", {"x", "newshape"}, {"y"});
  addOutput(m, "y");
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  const Function& f = *(*module)->functions().front();
  EXPECT_EQ(countOps(f, OpKind::Reshape), 1u);
  EXPECT_EQ(countOps(f, OpKind::Gather), 0u);
  EXPECT_EQ(countOps(f, OpKind::Concat), 0u);
  EXPECT_EQ(countOps(f, OpKind::Constant), 0u);  // consumed constants are removed
  EXPECT_EQ(f.resultTypes()[0].str(), "f32[2,12]");

  // Without an evaluator nothing folds, and the Reshape says what it needs.
  std::string error = errorOf(importModel(m, "", /*fold=*/false));
  EXPECT_NE(error.find("must be known at import time"), std::string::npos) << error;
}

TEST(OnnxImporter, ReshapeOpsetDifferencesZeroAndMinusOne) {
  {
    auto m = makeModel(4);  // shape as an attribute
    addInput(m, "x", {2, 3});
    setInts(addNode(m, "Reshape", {"x"}, {"y"}), "shape", {0, -1, 1});
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    EXPECT_EQ((*module)->functions().front()->resultTypes()[0].str(), "f32[2,3,1]");
  }
  {
    auto m = makeModel(14);  // allowzero: 0 is a real zero
    addInput(m, "x", {0, 3});
    *m.mutable_graph()->add_initializer() = int64Tensor("s", {2}, {3, 0});
    setInt(addNode(m, "Reshape", {"x", "s"}, {"y"}), "allowzero", 1);
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    EXPECT_EQ((*module)->functions().front()->resultTypes()[0].str(), "f32[3,0]");
  }
}

TEST(OnnxImporter, SliceAttributesBeforeOpset10InputsAfter) {
  for (int64_t opset : {9, 13}) {
    auto m = makeModel(opset);
    addInput(m, "x", {5});
    auto* n = addNode(m, "Slice", {"x"}, {"y"});
    if (opset < 10) {
      setInts(n, "starts", {-4});
      setInts(n, "ends", {1000});
    } else {
      for (auto name : {"starts", "ends", "axes", "steps"}) n->add_input(name);
      *m.mutable_graph()->add_initializer() = int64Tensor("starts", {1}, {-4});
      *m.mutable_graph()->add_initializer() = int64Tensor("ends", {1}, {1000});
      *m.mutable_graph()->add_initializer() = int64Tensor("axes", {1}, {0});
      *m.mutable_graph()->add_initializer() = int64Tensor("steps", {1}, {2});
    }
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    auto out = run(**module, {test::tensorOf(DType::F32, {5}, {0, 1, 2, 3, 4})});
    const std::vector<double> want = opset < 10 ? std::vector<double>{1, 2, 3, 4} : std::vector<double>{1, 3};
    EXPECT_EQ(test::elementsOf(out[0]), want);
  }
}

TEST(OnnxImporter, FrozenInputsBecomeConstants) {
  auto m = makeModel(13);
  addInput(m, "x", {2, 3});
  addInput(m, "shape", {2}, onnx::TensorProto::INT64);
  addNode(m, "Reshape", {"x", "shape"}, {"y"});
  addOutput(m, "y");
  EXPECT_FALSE(importModel(m).ok());
  DenseTensor shape = DenseTensor::zeros(TensorType{DType::I64, staticShape({2})});
  shape.setInt(0, 3);
  shape.setInt(1, 2);
  LoadOptions options;
  options.evaluator = &test::onnxTestEvaluator();
  auto module = importOnnxBytes(m.SerializeAsString(), "t.onnx", "", options, {{"shape", shape}});
  ASSERT_TRUE(module.ok()) << module.error().str();
  const Function& f = *(*module)->functions().front();
  EXPECT_EQ(f.numArguments(), 1u);
  EXPECT_EQ(f.resultTypes()[0].str(), "f32[3,2]");
}

/// A model whose weight `w` lives in external data at `location`.
onnx::ModelProto externalModel(const std::string& location) {
  auto m = makeModel(13);
  addInput(m, "x", {2});
  onnx::TensorProto w;
  w.set_name("w");
  w.set_data_type(onnx::TensorProto::FLOAT);
  w.add_dims(2);
  w.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* loc = w.add_external_data();
  loc->set_key("location");
  loc->set_value(location);
  auto* off = w.add_external_data();
  off->set_key("offset");
  off->set_value("4");
  *m.mutable_graph()->add_initializer() = w;
  addNode(m, "Add", {"x", "w"}, {"y"});
  addOutput(m, "y");
  return m;
}

TEST(OnnxImporter, ExternalDataInsideTheFolderIsReadOutsideRefused) {
  const fs::path root = fs::temp_directory_path() / "kiln-onnx-external";
  fs::remove_all(root);
  fs::create_directories(root / "model" / "weights");
  const float data[3] = {0, 5, 7};  // offset 4 skips the first
  std::ofstream(root / "model" / "weights" / "w.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(data), sizeof data);
  std::ofstream(root / "secret.bin", std::ios::binary).write(reinterpret_cast<const char*>(data), sizeof data);
  fs::create_symlink(root / "secret.bin", root / "model" / "link.bin");
  const std::string dir = (root / "model").string();

  auto ok = importModel(externalModel("weights/w.bin"), dir);
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  auto out = run(**ok, {test::tensorOf(DType::F32, {2}, {1, 1})});
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{6, 8}));

  EXPECT_NE(errorOf(importModel(externalModel("../secret.bin"), dir)).find("contains '..'"), std::string::npos);
  EXPECT_NE(errorOf(importModel(externalModel((root / "secret.bin").string()), dir)).find("is absolute"),
            std::string::npos);
  EXPECT_NE(errorOf(importModel(externalModel("link.bin"), dir)).find("outside the model's folder"), std::string::npos);
  EXPECT_NE(errorOf(importModel(externalModel("weights/missing.bin"), dir)).find("not a regular file"),
            std::string::npos);
  // Without a folder (bytes from memory) external data is refused.
  EXPECT_NE(errorOf(importModel(externalModel("weights/w.bin"), "")).find("no folder"), std::string::npos);
  fs::remove_all(root);
}

TEST(OnnxImporter, ParseOnnxTensorTypedFieldsAndErrors) {
  onnx::TensorProto half;
  half.set_data_type(onnx::TensorProto::FLOAT16);
  half.add_dims(2);
  half.add_int32_data(0x3C00);  // 1.0
  half.add_int32_data(0xC000);  // -2.0
  auto t = parseOnnxTensor(half.SerializeAsString(), "half");
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->type.str(), "f16[2]");
  EXPECT_EQ(t->getDouble(0), 1.0);
  EXPECT_EQ(t->getDouble(1), -2.0);

  // UINT32 and UINT64 live in uint64_data, UINT16 in int32_data.
  onnx::TensorProto u64;
  u64.set_data_type(onnx::TensorProto::UINT64);
  u64.add_dims(2);
  u64.add_uint64_data(18446744073709551615u);
  u64.add_uint64_data(7);
  t = parseOnnxTensor(u64.SerializeAsString(), "u64");
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->type.str(), "u64[2]");
  EXPECT_EQ(static_cast<uint64_t>(t->getInt(0)), 18446744073709551615u);
  EXPECT_EQ(t->getInt(1), 7);
  onnx::TensorProto u32;
  u32.set_data_type(onnx::TensorProto::UINT32);
  u32.add_dims(1);
  u32.add_uint64_data(4294967295u);
  t = parseOnnxTensor(u32.SerializeAsString(), "u32");
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->type.str(), "u32[1]");
  EXPECT_EQ(t->getInt(0), 4294967295);
  onnx::TensorProto u16;
  u16.set_data_type(onnx::TensorProto::UINT16);
  u16.add_dims(1);
  u16.add_int32_data(65535);
  t = parseOnnxTensor(u16.SerializeAsString(), "u16");
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->getInt(0), 65535);

  onnx::TensorProto complex;
  complex.set_data_type(onnx::TensorProto::COMPLEX64);
  auto bad = parseOnnxTensor(complex.SerializeAsString(), "complex");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("COMPLEX64"), std::string::npos);
  EXPECT_FALSE(parseOnnxTensor("\x0a\xff", "truncated").ok());
}

/// loadTrainableModel: the CNN's Linear layers are Gemm with transB, whose
/// transpose of the weight folds at a plain import into an unnamed constant,
/// so lifting named constants finds only 6 of its 8 weights; loaded for
/// training, all 8 float initializers (conv1, conv2, fc1, fc2, weight and
/// bias each) are arguments with defaults, named and shaped as in the file,
/// and nothing else is.
TEST(OnnxImporterTest, LoadTrainableModelMakesEveryInitializerAParameter) {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/test/e2e/cnn/model.onnx";
  InterpreterEvaluator evaluator;
  LoadOptions options;
  options.evaluator = &evaluator;
  auto plain = importOnnx(path, options);
  ASSERT_TRUE(plain.ok()) << plain.error().str();
  EXPECT_EQ(liftConstantsToParameters(*(*plain)->functions().front()), 6u);

  onnx::ModelProto proto;
  {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(proto.ParseFromIstream(&in)) << path;
  }
  std::map<std::string, std::vector<int64_t>> initializers;
  for (const onnx::TensorProto& t : proto.graph().initializer())
    if (t.data_type() == onnx::TensorProto::FLOAT && t.dims_size() > 0)
      initializers[t.name()] = std::vector<int64_t>(t.dims().begin(), t.dims().end());
  ASSERT_EQ(initializers.size(), 8u);

  // The image input, its batch dim (symbolic in the file) given as 2.
  const onnx::ValueInfoProto& input = proto.graph().input(0);
  std::vector<int64_t> inputDims;
  for (const auto& d : input.type().tensor_type().shape().dim())
    inputDims.push_back(d.has_dim_value() ? d.dim_value() : 2);
  auto m = training::loadTrainableModel(path, {{input.name(), inputDims}}, evaluator);
  ASSERT_TRUE(m.ok()) << m.error().str();
  const Function& f = *(*m)->functions().front();
  std::map<std::string, std::string> params;
  for (size_t i = 0; i < f.numArguments(); ++i)
    if (f.argumentDefault(i)) params[f.argument(i)->name()] = f.argument(i)->type().str();
  ASSERT_EQ(params.size(), 8u);
  for (const auto& [name, dims] : initializers) {
    ASSERT_TRUE(params.count(name)) << "initializer " << name << " is not a parameter";
    EXPECT_EQ(params[name], (TensorType{DType::F32, staticShape(dims)}.str())) << name;
  }
  EXPECT_EQ(f.argument(0)->name(), input.name());
  EXPECT_EQ(f.argument(0)->type().str(), (TensorType{DType::F32, staticShape(inputDims)}.str()));
}

TEST(OnnxImporterTest, LoadTrainableModelUntiesInitializersSharedThroughIdentity) {
  // torch.onnx.export stores equal parameters once: w2 is Identity(w1).
  // Training must see two parameters, and -o must write two initializers.
  auto m = makeModel(13);
  addInput(m, "x", {1, 2});
  *m.mutable_graph()->add_initializer() = floatTensor("w1", {2, 2}, {1, 0, 0, 1});
  addNode(m, "Identity", {"w1"}, {"w2"});
  addNode(m, "MatMul", {"x", "w1"}, {"a"});
  addNode(m, "MatMul", {"a", "w2"}, {"y"});
  addOutput(m, "y");
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/tied.onnx", out = dir + "/tied-trained.onnx";
  {
    std::ofstream f(path, std::ios::binary);
    ASSERT_TRUE(m.SerializeToOstream(&f));
  }
  InterpreterEvaluator evaluator;
  auto loaded = training::loadTrainableModel(path, {{"x", {1, 2}}}, evaluator);
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  const Function& f = *(*loaded)->functions().front();
  std::vector<std::string> params;
  for (size_t i = 0; i < f.numArguments(); ++i)
    if (f.argumentDefault(i)) {
      params.push_back(f.argument(i)->name());
      EXPECT_EQ(test::elementsOf(Tensor::fromDense(*f.argumentDefault(i))), (std::vector<double>{1, 0, 0, 1}));
    }
  EXPECT_EQ(params, (std::vector<std::string>{"w1", "w2"}));

  // Written back: two initializers with their own values, no Identity left.
  Tensor v1 = test::tensorOf(DType::F32, {2, 2}, {1, 2, 3, 4}), v2 = test::tensorOf(DType::F32, {2, 2}, {5, 6, 7, 8});
  Status written = writeOnnxWithInitializers(path, {{"w1", v1.toDense()}, {"w2", v2.toDense()}}, out);
  ASSERT_TRUE(written.ok()) << written.error().str();
  onnx::ModelProto back;
  {
    std::ifstream in(out, std::ios::binary);
    ASSERT_TRUE(back.ParseFromIstream(&in));
  }
  std::map<std::string, std::vector<double>> inits;
  for (const onnx::TensorProto& t : back.graph().initializer()) {
    auto value = parseOnnxTensor(t.SerializeAsString(), t.name());
    ASSERT_TRUE(value.ok()) << value.error().str();
    inits[t.name()] = test::elementsOf(Tensor::fromDense(*value));
  }
  EXPECT_EQ(inits["w1"], (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(inits["w2"], (std::vector<double>{5, 6, 7, 8}));
  for (const onnx::NodeProto& node : back.graph().node()) EXPECT_NE(node.op_type(), "Identity");
  LoadOptions options;
  options.evaluator = &evaluator;
  auto reread = importOnnx(out, options);
  ASSERT_TRUE(reread.ok()) << reread.error().str();
}

TEST(OnnxImporter, FoldingIsBoundedByItsWork) {
  // Range(0, n) reshaped to a matrix and multiplied by itself: every operand
  // is a constant, so the import would fold the product. At 1000 x 1000 it
  // costs 10^9 multiply-adds (seconds on the interpreter, far more in the
  // sanitized fuzzer build): left as an op. At 16 x 16 it folds.
  for (int64_t n : {int64_t{16}, int64_t{1000}}) {
    auto m = makeModel(13);
    *m.mutable_graph()->add_initializer() = floatTensor("start", {}, {0});
    *m.mutable_graph()->add_initializer() = floatTensor("limit", {}, {static_cast<float>(n * n)});
    *m.mutable_graph()->add_initializer() = floatTensor("delta", {}, {1});
    *m.mutable_graph()->add_initializer() = int64Tensor("shape", {2}, {n, n});
    addNode(m, "Range", {"start", "limit", "delta"}, {"r"});
    addNode(m, "Reshape", {"r", "shape"}, {"a"});
    addNode(m, "MatMul", {"a", "a"}, {"y"});
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << module.error().str();
    EXPECT_EQ(countOps(*(*module)->functions().front(), OpKind::MatMul), n == 16 ? 0u : 1u) << "n = " << n;
  }
}

TEST(OnnxImporter, EyeLikeAndTriluOfEmptyMatricesWithAHugeDimImportAtOnce) {
  // The fuzzer's EyeLike of bool[1317011455, 0] looped over every row; an
  // empty matrix has nothing to fill, whatever its other dim.
  for (const char* op : {"EyeLike", "Trilu"}) {
    auto m = makeModel(14);
    addInput(m, "x", {int64_t{1} << 40, 0});
    addNode(m, op, {"x"}, {"y"});
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << op << ": " << module.error().str();
    EXPECT_EQ((*module)->functions().front()->resultTypes()[0].str(), "f32[1099511627776,0]") << op;
  }
  // The diagonal offset k anywhere, the extremes included: ones at (i, i + k).
  for (int64_t k : {std::numeric_limits<int64_t>::min(), int64_t{-3}, int64_t{-1}, int64_t{0}, int64_t{2},
                    int64_t{4}, std::numeric_limits<int64_t>::max()}) {
    auto m = makeModel(13);
    addInput(m, "x", {3, 4});
    setInt(addNode(m, "EyeLike", {"x"}, {"y"}), "k", k);
    addOutput(m, "y");
    auto module = importModel(m);
    ASSERT_TRUE(module.ok()) << "k = " << k << ": " << module.error().str();
    std::vector<double> expected(12, 0.0);
    for (int64_t i = 0; i < 3; ++i)
      if (k > -3 && k < 4 && i + k >= 0 && i + k < 4) expected[static_cast<size_t>(i * 4 + i + k)] = 1.0;
    EXPECT_EQ(test::elementsOf(run(**module, {test::tensorOf(DType::F32, {3, 4}, std::vector<double>(12, 0.0))})[0]),
              expected)
        << "k = " << k;
  }
}

// --- Control flow (ControlFlowOps.cpp) ----------------------------------------

onnx::NodeProto* addGraphNode(onnx::GraphProto& g, const std::string& op, std::vector<std::string> inputs,
                              std::vector<std::string> outputs) {
  auto* n = g.add_node();
  n->set_op_type(op);
  for (auto& i : inputs) n->add_input(i);
  for (auto& o : outputs) n->add_output(o);
  return n;
}

void setGraph(onnx::NodeProto* n, const std::string& name, const onnx::GraphProto& g) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  *a->mutable_g() = g;
}

/// The body of a Loop that carries one f32[2], %acc, replacing it by
/// `op`(acc, `operand`) with `operand` read from an outer scope, and passes
/// its condition on.
onnx::GraphProto carriedLoopBody(const std::string& op, const std::string& operand) {
  onnx::GraphProto body;
  body.set_name("body");
  addValueInfo(body.mutable_input(), "i", onnx::TensorProto::INT64, {});
  addValueInfo(body.mutable_input(), "cond", onnx::TensorProto::BOOL, {});
  addValueInfo(body.mutable_input(), "acc", onnx::TensorProto::FLOAT, {2});
  addGraphNode(body, "Identity", {"cond"}, {"cond_out"});
  addGraphNode(body, op, {"acc", operand}, {"acc_out"});
  addValueInfo(body.mutable_output(), "cond_out", onnx::TensorProto::BOOL, {});
  addValueInfo(body.mutable_output(), "acc_out", onnx::TensorProto::FLOAT, {2});
  return body;
}

/// If(c) whose then branch holds a Loop adding %s (read two scopes up) to %x
/// %n times, and whose else branch multiplies %y (read only there) by %s.
onnx::ModelProto nestedControlFlowModel() {
  auto m = makeModel(13);
  addInput(m, "c", {}, onnx::TensorProto::BOOL);
  addInput(m, "n", {}, onnx::TensorProto::INT64);
  addInput(m, "x", {2});
  addInput(m, "y", {2});
  addInput(m, "s", {2});
  onnx::GraphProto body = carriedLoopBody("Add", "s");
  onnx::GraphProto thenBranch;
  thenBranch.set_name("then");
  setGraph(addGraphNode(thenBranch, "Loop", {"n", "", "x"}, {"looped"}), "body", body);
  addValueInfo(thenBranch.mutable_output(), "looped", onnx::TensorProto::FLOAT, {2});
  onnx::GraphProto elseBranch;
  elseBranch.set_name("else");
  addGraphNode(elseBranch, "Mul", {"y", "s"}, {"product"});
  addValueInfo(elseBranch.mutable_output(), "product", onnx::TensorProto::FLOAT, {2});
  auto* node = addNode(m, "If", {"c"}, {"r"}, "If_0");
  setGraph(node, "then_branch", thenBranch);
  setGraph(node, "else_branch", elseBranch);
  addOutput(m, "r");
  return m;
}

TEST(OnnxImporter, SubgraphsCaptureOuterValuesThroughEveryScope) {
  auto module = importModel(nestedControlFlowModel());
  ASSERT_TRUE(module.ok()) << module.error().str();
  const Function& f = *(*module)->functions().front();
  ASSERT_TRUE(verify(**module).ok());
  const Op* op = nullptr;
  for (const auto& o : f.ops())
    if (o->kind() == OpKind::If) op = o.get();
  ASSERT_NE(op, nullptr);
  // The condition, then the then branch's captures in the order it reads
  // them (n and x for the loop, s for the loop's body), then what only the
  // else branch reads (y).
  ASSERT_EQ(op->numOperands(), 5u);
  EXPECT_EQ(op->operand(1)->name(), "n");
  EXPECT_EQ(op->operand(2)->name(), "x");
  EXPECT_EQ(op->operand(3)->name(), "s");
  EXPECT_EQ(op->operand(4)->name(), "y");
  EXPECT_EQ(op->region(0)->numArguments(), 4u);
  EXPECT_EQ(op->region(1)->numArguments(), 4u);

  Tensor x = test::tensorOf(DType::F32, {2}, {1, 2});
  Tensor y = test::tensorOf(DType::F32, {2}, {3, 4});
  Tensor s = test::tensorOf(DType::F32, {2}, {10, 20});
  auto looped = run(**module, {test::tensorOf(DType::Bool, {}, {1}), test::tensorOf(DType::I64, {}, {3}), x, y, s});
  ASSERT_EQ(looped.size(), 1u);
  EXPECT_EQ(test::elementsOf(looped[0]), (std::vector<double>{31, 62}));
  auto multiplied = run(**module, {test::tensorOf(DType::Bool, {}, {0}), test::tensorOf(DType::I64, {}, {3}), x, y, s});
  ASSERT_EQ(multiplied.size(), 1u);
  EXPECT_EQ(test::elementsOf(multiplied[0]), (std::vector<double>{30, 80}));
}

TEST(OnnxImporter, ScanReversesInputsAndMovesOutputAxes) {
  auto m = makeModel(11);
  addInput(m, "init", {2});
  addInput(m, "x", {3, 2});
  onnx::GraphProto body;
  body.set_name("body");
  addValueInfo(body.mutable_input(), "sum_in", onnx::TensorProto::FLOAT, {2});
  addValueInfo(body.mutable_input(), "row", onnx::TensorProto::FLOAT, {2});
  addGraphNode(body, "Add", {"sum_in", "row"}, {"sum_out"});
  addGraphNode(body, "Identity", {"sum_out"}, {"scan_out"});
  addValueInfo(body.mutable_output(), "sum_out", onnx::TensorProto::FLOAT, {2});
  addValueInfo(body.mutable_output(), "scan_out", onnx::TensorProto::FLOAT, {2});
  auto* node = addNode(m, "Scan", {"init", "x"}, {"total", "partial"}, "Scan_0");
  setGraph(node, "body", body);
  setInt(node, "num_scan_inputs", 1);
  setInts(node, "scan_input_directions", {1});
  setInts(node, "scan_output_axes", {1});
  addOutput(m, "total");
  addOutput(m, "partial");
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto out = run(**module, {test::tensorOf(DType::F32, {2}, {0, 0}), test::tensorOf(DType::F32, {3, 2}, {1, 2, 3, 4, 5, 6})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{9, 12}));
  // Rows last first: (5,6), (8,10), (9,12); stacked along axis 1: [2,3].
  EXPECT_EQ(out[1].shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{5, 8, 9, 6, 10, 12}));
}

TEST(OnnxImporter, UnsupportedOpsInsideSubgraphsAreListed) {
  auto m = makeModel(13);
  addInput(m, "c", {}, onnx::TensorProto::BOOL);
  addInput(m, "x", {2});
  onnx::GraphProto branch;
  branch.set_name("branch");
  addGraphNode(branch, "NoSuchOp", {"x"}, {"z"});
  addValueInfo(branch.mutable_output(), "z", onnx::TensorProto::FLOAT, {2});
  auto* node = addNode(m, "If", {"c"}, {"r"}, "If_0");
  setGraph(node, "then_branch", branch);
  setGraph(node, "else_branch", branch);
  addOutput(m, "r");
  EXPECT_NE(errorOf(importModel(m)).find("NoSuchOp (opset 13): 2 nodes"), std::string::npos) << errorOf(importModel(m));
}

TEST(OnnxImporter, DataDependentOpsKeepAnUnknownDimAndRun) {
  // Unique with three of its four outputs asked for, and NonMaxSuppression
  // with iou_threshold left out ("") before a given score_threshold: that
  // one takes ONNX's default 0, so overlapping boxes are all suppressed.
  auto m = makeModel(13);
  addInput(m, "x", {5}, onnx::TensorProto::INT64);
  addInput(m, "boxes", {1, 3, 4});
  addInput(m, "scores", {1, 1, 3});
  *m.mutable_graph()->add_initializer() = int64Tensor("k", {1}, {5});
  *m.mutable_graph()->add_initializer() = floatTensor("min", {1}, {0.25f});
  auto* unique = addNode(m, "Unique", {"x"}, {"y", "", "inverse", "counts"}, "u");
  setInt(unique, "sorted", 0);
  addNode(m, "NonMaxSuppression", {"boxes", "scores", "k", "", "min"}, {"sel"}, "nms");
  addOutput(m, "y", onnx::TensorProto::INT64);
  addOutput(m, "inverse", onnx::TensorProto::INT64);
  addOutput(m, "counts", onnx::TensorProto::INT64);
  addOutput(m, "sel", onnx::TensorProto::INT64);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  const Function& f = *(*module)->functions().front();
  EXPECT_EQ(f.resultTypes()[0].str(), "i64[?]");
  EXPECT_EQ(f.resultTypes()[1].str(), "i64[5]");
  EXPECT_EQ(f.resultTypes()[3].str(), "i64[?,3]");

  // Boxes 0 and 1 overlap a little (IoU 1/7, above the default 0, so box 1
  // goes), box 2 is apart.
  auto out = run(**module, {test::tensorOf(DType::I64, {5}, {7, 3, 7, 7, 3}),
                            test::tensorOf(DType::F32, {1, 3, 4}, {0, 0, 2, 2, 1, 1, 3, 3, 5, 5, 6, 6}),
                            test::tensorOf(DType::F32, {1, 1, 3}, {0.9, 0.3, 0.5})});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{7, 3}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{0, 1, 0, 0, 1}));
  EXPECT_EQ(test::elementsOf(out[2]), (std::vector<double>{3, 2}));
  EXPECT_EQ(test::elementsOf(out[3]), (std::vector<double>{0, 0, 0, 0, 0, 2}));
}

TEST(OnnxImporter, NonZeroOfAConstantFoldsAtImport) {
  auto m = makeModel(13);
  *m.mutable_graph()->add_initializer() = floatTensor("c", {2, 2}, {0, 1, 1, 0});
  addNode(m, "NonZero", {"c"}, {"y"}, "nz");
  addOutput(m, "y", onnx::TensorProto::INT64);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  const Function& f = *(*module)->functions().front();
  EXPECT_EQ(countOps(f, OpKind::NonZero), 0u);
  auto out = run(**module, {});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{0, 1, 1, 0}));
}

// Sequences are resolved at import into lists of values: positions count
// from the back when negative, and only tensors reach the graph's outputs.
TEST(OnnxImporter, SequencePositionsCountFromTheBackWhenNegative) {
  auto m = makeModel(13);
  addInput(m, "a", {2});
  addInput(m, "b", {2});
  addInput(m, "c", {2});
  *m.mutable_graph()->add_initializer() = int64Tensor("minus1", {}, {-1});
  *m.mutable_graph()->add_initializer() = int64Tensor("minus3", {}, {-3});
  addNode(m, "SequenceConstruct", {"a", "b"}, {"s0"}, "construct");
  // Inserted before the last element: [a, c, b].
  addNode(m, "SequenceInsert", {"s0", "c", "minus1"}, {"s1"}, "insert");
  // The element 3 from the back: a.
  addNode(m, "SequenceAt", {"s1", "minus3"}, {"first"}, "at");
  // Without the last element: [a, c].
  addNode(m, "SequenceErase", {"s1"}, {"s2"}, "erase");
  addNode(m, "SequenceLength", {"s2"}, {"n"}, "length");
  auto* concat = addNode(m, "ConcatFromSequence", {"s2"}, {"joined"}, "concat");
  setInt(concat, "axis", 0);
  auto* stack = addNode(m, "ConcatFromSequence", {"s1"}, {"stacked"}, "stack");
  setInt(stack, "axis", -1);
  setInt(stack, "new_axis", 1);
  addOutput(m, "first");
  addOutput(m, "n", onnx::TensorProto::INT64);
  addOutput(m, "joined");
  addOutput(m, "stacked");
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  ASSERT_TRUE(verify(**module).ok());
  auto out = run(**module, {test::tensorOf(DType::F32, {2}, {1, 2}), test::tensorOf(DType::F32, {2}, {3, 4}),
                            test::tensorOf(DType::F32, {2}, {5, 6})});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{1, 2}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{2}));
  EXPECT_EQ(test::elementsOf(out[2]), (std::vector<double>{1, 2, 5, 6}));
  EXPECT_EQ(out[3].shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(test::elementsOf(out[3]), (std::vector<double>{1, 5, 3, 2, 6, 4}));
}

TEST(OnnxImporter, SplitToSequenceSplitsBySizesOrIntoSqueezedOnes) {
  auto m = makeModel(13);
  addInput(m, "x", {3, 2});
  *m.mutable_graph()->add_initializer() = int64Tensor("sizes", {2}, {2, 1});
  addNode(m, "SplitToSequence", {"x", "sizes"}, {"parts"}, "split");
  auto* ones = addNode(m, "SplitToSequence", {"x"}, {"rows"}, "rows");
  setInt(ones, "keepdims", 0);
  *m.mutable_graph()->add_initializer() = int64Tensor("zero", {}, {0});
  *m.mutable_graph()->add_initializer() = int64Tensor("minus1", {}, {-1});
  addNode(m, "SequenceAt", {"parts", "zero"}, {"head"}, "at0");
  addNode(m, "SequenceAt", {"rows", "minus1"}, {"last"}, "at1");
  addNode(m, "SequenceLength", {"rows"}, {"n"}, "length");
  addOutput(m, "head");
  addOutput(m, "last");
  addOutput(m, "n", onnx::TensorProto::INT64);
  auto module = importModel(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto out = run(**module, {test::tensorOf(DType::F32, {3, 2}, {1, 2, 3, 4, 5, 6})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(out[1].shape(), (std::vector<int64_t>{2}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{5, 6}));
  EXPECT_EQ(test::elementsOf(out[2]), (std::vector<double>{3}));
}

TEST(OnnxImporter, SequencePositionKnownOnlyAtRunTimeIsAnError) {
  auto m = makeModel(13);
  addInput(m, "a", {2});
  addInput(m, "pos", {}, onnx::TensorProto::INT64);
  addNode(m, "SequenceConstruct", {"a", "a"}, {"s"}, "construct");
  addNode(m, "SequenceAt", {"s", "pos"}, {"y"}, "at");
  addOutput(m, "y");
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("node 'at' (SequenceAt"), std::string::npos) << error;
  EXPECT_NE(error.find("the position of SequenceAt must be known when the model is loaded"), std::string::npos)
      << error;
}

TEST(OnnxImporter, SequencePositionOutOfRangeIsAnError) {
  auto m = makeModel(13);
  addInput(m, "a", {2});
  *m.mutable_graph()->add_initializer() = int64Tensor("minus3", {}, {-3});
  addNode(m, "SequenceConstruct", {"a", "a"}, {"s"}, "construct");
  addNode(m, "SequenceErase", {"s", "minus3"}, {"t"}, "erase");
  addNode(m, "ConcatFromSequence", {"t"}, {"y"}, "concat");
  setInt(m.mutable_graph()->mutable_node(2), "axis", 0);
  addOutput(m, "y");
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("position -3 is out of range for a sequence of 2 elements, expected [-2, 1]"),
            std::string::npos)
      << error;
}

TEST(OnnxImporter, SequenceReadAsATensorOrATensorAsASequenceIsAnError) {
  {
    auto m = makeModel(13);
    addInput(m, "a", {2});
    addNode(m, "SequenceConstruct", {"a"}, {"s"}, "construct");
    addNode(m, "Abs", {"s"}, {"y"}, "abs");
    addOutput(m, "y");
    std::string error = errorOf(importModel(m));
    EXPECT_NE(error.find("node 'abs' (Abs, opset 13): input 0 's' is a sequence, expected a tensor"),
              std::string::npos)
        << error;
  }
  {
    auto m = makeModel(13);
    addInput(m, "a", {2});
    addNode(m, "SequenceLength", {"a"}, {"n"}, "length");
    addOutput(m, "n", onnx::TensorProto::INT64);
    std::string error = errorOf(importModel(m));
    EXPECT_NE(error.find("input 0 'a' is a tensor, expected a sequence"), std::string::npos) << error;
  }
}

TEST(OnnxImporter, SequenceReadInsideAnIfBodyIsAnError) {
  auto m = makeModel(13);
  addInput(m, "c", {}, onnx::TensorProto::BOOL);
  addInput(m, "a", {2});
  addNode(m, "SequenceConstruct", {"a"}, {"s"}, "construct");
  onnx::GraphProto branch;
  branch.set_name("branch");
  addGraphNode(branch, "SequenceLength", {"s"}, {"n"});
  addValueInfo(branch.mutable_output(), "n", onnx::TensorProto::INT64, {});
  auto* node = addNode(m, "If", {"c"}, {"r"}, "If_0");
  setGraph(node, "then_branch", branch);
  setGraph(node, "else_branch", branch);
  addOutput(m, "r", onnx::TensorProto::INT64);
  std::string error = errorOf(importModel(m));
  EXPECT_NE(error.find("'s' is a sequence of an enclosing graph"), std::string::npos) << error;
}

// --- Sequence and optional graph inputs and outputs ---------------------------
// Specialized at import to the value they take (frontend/Model.h): a
// sequence is one argument or result per element, an optional its contents
// or nothing.

/// A sequence or optional ValueInfo (`optional` wraps; `sequence` a sequence
/// of tensors of `elemType` with no shape, as ONNX's tests declare them).
void addStructuredValueInfo(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name,
                            bool optional, bool sequence, int elemType = onnx::TensorProto::FLOAT) {
  auto* v = list->Add();
  v->set_name(name);
  onnx::TypeProto* type = v->mutable_type();
  if (optional) type = type->mutable_optional_type()->mutable_elem_type();
  if (sequence) type = type->mutable_sequence_type()->mutable_elem_type();
  type->mutable_tensor_type()->set_elem_type(elemType);
}

/// Imports `m` with `forms` for its sequence and optional inputs; `outputs`
/// receives what each graph output became.
Expected<std::unique_ptr<Module>> importWithForms(const onnx::ModelProto& m, std::map<std::string, InputForm> forms,
                                                  std::vector<GraphOutputForm>& outputs) {
  std::string bytes;
  EXPECT_TRUE(m.SerializeToString(&bytes));
  LoadOptions options;
  options.evaluator = &test::onnxTestEvaluator();
  options.inputForms = std::move(forms);
  return importOnnxBytes(bytes, "test.onnx", "", options, {}, &outputs);
}

TEST(OnnxImporter, SequenceInputAndOutputAreOneArgumentAndResultPerElement) {
  auto m = makeModel(13);
  addStructuredValueInfo(m.mutable_graph()->mutable_input(), "xs", /*optional=*/false, /*sequence=*/true);
  addInput(m, "t", {2});
  // [xs..., t], and the number of elements it has.
  addNode(m, "SequenceInsert", {"xs", "t"}, {"ys"}, "insert");
  addNode(m, "SequenceLength", {"ys"}, {"n"}, "length");
  addStructuredValueInfo(m.mutable_graph()->mutable_output(), "ys", false, true);
  addOutput(m, "n", onnx::TensorProto::INT64);
  std::vector<GraphOutputForm> outputs;
  auto module = importWithForms(m, {{"xs", {ValueKind::Sequence, {{2}, {3}}}}}, outputs);
  ASSERT_TRUE(module.ok()) << module.error().str();
  ASSERT_TRUE(verify(**module).ok());
  const Function& f = *(*module)->functions().front();
  ASSERT_EQ(f.numArguments(), 3u);
  EXPECT_EQ(f.argument(0)->name(), "xs.0");
  EXPECT_EQ(f.argument(0)->type().str(), "f32[2]");
  EXPECT_EQ(f.argument(1)->name(), "xs.1");
  EXPECT_EQ(f.argument(1)->type().str(), "f32[3]");
  EXPECT_EQ(f.argument(2)->name(), "t");
  ASSERT_EQ(f.resultTypes().size(), 4u);
  EXPECT_EQ(f.resultName(0), "ys.0");
  EXPECT_EQ(f.resultName(2), "ys.2");
  EXPECT_EQ(f.resultName(3), "n");
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].name, "ys");
  EXPECT_EQ(outputs[0].kind, ValueKind::Sequence);
  EXPECT_EQ(outputs[0].first, 0u);
  EXPECT_EQ(outputs[0].count, 3u);
  EXPECT_EQ(outputs[1].kind, ValueKind::Tensor);
  EXPECT_EQ(outputs[1].first, 3u);
  EXPECT_EQ(outputs[1].count, 1u);
  auto out = run(**module, {test::tensorOf(DType::F32, {2}, {1, 2}), test::tensorOf(DType::F32, {3}, {3, 4, 5}),
                            test::tensorOf(DType::F32, {2}, {6, 7})});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{1, 2}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(test::elementsOf(out[2]), (std::vector<double>{6, 7}));
  EXPECT_EQ(test::elementsOf(out[3]), (std::vector<double>{3}));

  // The values a caller binds, flattened to those argument names.
  std::map<std::string, GraphValue> values;
  values["xs"] = GraphValue{ValueKind::Sequence,
                            {DenseTensor::zeros(TensorType{DType::F32, {Dim::fixed(2)}}),
                             DenseTensor::zeros(TensorType{DType::F32, {Dim::fixed(3)}})}};
  values["t"] = GraphValue{ValueKind::Tensor, {DenseTensor::zeros(TensorType{DType::F32, {Dim::fixed(2)}})}};
  auto flat = flattenGraphValues(values);
  EXPECT_EQ(flat.size(), 3u);
  EXPECT_EQ(flat.at("xs.1").type.str(), "f32[3]");
  EXPECT_TRUE(flat.count("t"));
}

/// Optional(o) as a graph output, whether `o` holds an element, and a
/// SequenceMap doubling each element of `xs`.
onnx::ModelProto optionalModel() {
  auto m = makeModel(17);
  addStructuredValueInfo(m.mutable_graph()->mutable_input(), "o", /*optional=*/true, /*sequence=*/false);
  addNode(m, "OptionalHasElement", {"o"}, {"has"}, "has");
  addNode(m, "Identity", {"o"}, {"same"}, "same");
  addOutput(m, "has", onnx::TensorProto::BOOL);
  addStructuredValueInfo(m.mutable_graph()->mutable_output(), "same", true, false);
  return m;
}

TEST(OnnxImporter, OptionalInputPresentIsItsTensorAndAbsentIsNothing) {
  {
    std::vector<GraphOutputForm> outputs;
    auto module = importWithForms(optionalModel(), {{"o", {ValueKind::OptionalTensor, {{3}}}}}, outputs);
    ASSERT_TRUE(module.ok()) << module.error().str();
    const Function& f = *(*module)->functions().front();
    ASSERT_EQ(f.numArguments(), 1u);
    EXPECT_EQ(f.argument(0)->name(), "o");
    ASSERT_EQ(outputs.size(), 2u);
    EXPECT_EQ(outputs[1].kind, ValueKind::OptionalTensor);
    EXPECT_EQ(outputs[1].count, 1u);
    auto out = run(**module, {test::tensorOf(DType::F32, {3}, {1, 2, 3})});
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{1}));
    EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{1, 2, 3}));
  }
  {
    std::vector<GraphOutputForm> outputs;
    auto module = importWithForms(optionalModel(), {{"o", {ValueKind::OptionalNone, {}}}}, outputs);
    ASSERT_TRUE(module.ok()) << module.error().str();
    const Function& f = *(*module)->functions().front();
    EXPECT_EQ(f.numArguments(), 0u);
    ASSERT_EQ(outputs.size(), 2u);
    EXPECT_EQ(outputs[1].kind, ValueKind::OptionalNone);
    EXPECT_EQ(outputs[1].count, 0u);
    auto out = run(**module, {});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{0}));
  }
}

TEST(OnnxImporter, SequenceOrOptionalInputsNeedTheirFormAndAbsentOptionalsHoldNothing) {
  std::vector<GraphOutputForm> outputs;
  std::string error = errorOf(importWithForms(optionalModel(), {}, outputs));
  EXPECT_NE(error.find("graph input 0 'o' is an optional; Kiln specializes such an input"), std::string::npos) << error;
  error = errorOf(importWithForms(optionalModel(), {{"o", {ValueKind::Sequence, {{2}}}}}, outputs));
  EXPECT_NE(error.find("graph input 0 'o' is declared an optional tensor, but is given a sequence"), std::string::npos)
      << error;
  auto m = makeModel(15);
  addStructuredValueInfo(m.mutable_graph()->mutable_input(), "o", true, false);
  addNode(m, "OptionalGetElement", {"o"}, {"y"}, "get");
  addOutput(m, "y");
  error = errorOf(importWithForms(m, {{"o", {ValueKind::OptionalNone, {}}}}, outputs));
  EXPECT_NE(error.find("node 'get' (OptionalGetElement, opset 15): input 0 'o' is an absent optional"),
            std::string::npos)
      << error;
}

TEST(OnnxImporter, SequenceMapAppliesItsBodyToEachElement) {
  auto m = makeModel(17);
  addStructuredValueInfo(m.mutable_graph()->mutable_input(), "xs", false, true);
  addInput(m, "k", {});
  onnx::GraphProto body;
  body.set_name("body");
  addValueInfo(body.mutable_input(), "x", onnx::TensorProto::FLOAT, {-1});
  addValueInfo(body.mutable_input(), "scale", onnx::TensorProto::FLOAT, {});
  addGraphNode(body, "Mul", {"x", "scale"}, {"y"});
  addValueInfo(body.mutable_output(), "y", onnx::TensorProto::FLOAT, {-1});
  setGraph(addNode(m, "SequenceMap", {"xs", "k"}, {"ys"}, "map"), "body", body);
  addStructuredValueInfo(m.mutable_graph()->mutable_output(), "ys", false, true);
  std::vector<GraphOutputForm> outputs;
  auto module = importWithForms(m, {{"xs", {ValueKind::Sequence, {{1}, {2}}}}}, outputs);
  ASSERT_TRUE(module.ok()) << module.error().str();
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].count, 2u);
  auto out = run(**module, {test::tensorOf(DType::F32, {1}, {1}), test::tensorOf(DType::F32, {2}, {2, 3}),
                            test::tensorOf(DType::F32, {}, {10})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{10}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{20, 30}));
}

/// Loop(n, "", s) whose body appends the iteration number to the sequence s.
onnx::ModelProto sequenceLoopModel() {
  auto m = makeModel(13);
  addInput(m, "n", {}, onnx::TensorProto::INT64);
  addNode(m, "SequenceEmpty", {}, {"s"}, "empty");
  setInt(m.mutable_graph()->mutable_node(0), "dtype", onnx::TensorProto::INT64);
  onnx::GraphProto body;
  body.set_name("body");
  addValueInfo(body.mutable_input(), "i", onnx::TensorProto::INT64, {});
  addValueInfo(body.mutable_input(), "cond", onnx::TensorProto::BOOL, {});
  addStructuredValueInfo(body.mutable_input(), "acc", false, true, onnx::TensorProto::INT64);
  addGraphNode(body, "Identity", {"cond"}, {"cond_out"});
  addGraphNode(body, "SequenceInsert", {"acc", "i"}, {"acc_out"});
  addValueInfo(body.mutable_output(), "cond_out", onnx::TensorProto::BOOL, {});
  addStructuredValueInfo(body.mutable_output(), "acc_out", false, true, onnx::TensorProto::INT64);
  setGraph(addNode(m, "Loop", {"n", "", "s"}, {"result"}, "loop"), "body", body);
  addStructuredValueInfo(m.mutable_graph()->mutable_output(), "result", false, true, onnx::TensorProto::INT64);
  return m;
}

TEST(OnnxImporter, LoopCarryingASequenceIsUnrolledWhenItsTripCountIsKnown) {
  std::string bytes;
  ASSERT_TRUE(sequenceLoopModel().SerializeToString(&bytes));
  LoadOptions options;
  options.evaluator = &test::onnxTestEvaluator();
  std::map<std::string, DenseTensor> frozen;
  frozen["n"] = DenseTensor::zeros(TensorType{DType::I64, {}});
  frozen["n"].setInt(0, 3);
  std::vector<GraphOutputForm> outputs;
  auto module = importOnnxBytes(bytes, "test.onnx", "", options, frozen, &outputs);
  ASSERT_TRUE(module.ok()) << module.error().str();
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].count, 3u);
  auto out = run(**module, {});
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(test::elementsOf(out[i]), (std::vector<double>{double(i)}));
}

TEST(OnnxImporter, LoopCarryingASequenceWithATripCountKnownOnlyAtRunTimeIsAnError) {
  std::string error = errorOf(importModel(sequenceLoopModel()));
  EXPECT_NE(error.find("node 'loop' (Loop, opset 13): loop-carried value 0 's' is a sequence, so the loop must be "
                       "unrolled at import"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("the trip count is not known at import time"), std::string::npos) << error;
}

TEST(OnnxImporter, IfWithAConditionKnownAtImportTakesItsBranchSequencesIncluded) {
  auto m = makeModel(13);
  addInput(m, "a", {2});
  *m.mutable_graph()->add_initializer() = [] {
    onnx::TensorProto t;
    t.set_name("yes");
    t.set_data_type(onnx::TensorProto::BOOL);
    t.add_int32_data(1);
    return t;
  }();
  onnx::GraphProto thenBranch;
  thenBranch.set_name("then");
  addGraphNode(thenBranch, "SequenceConstruct", {"a", "a"}, {"pair"});
  addStructuredValueInfo(thenBranch.mutable_output(), "pair", false, true);
  onnx::GraphProto elseBranch;
  elseBranch.set_name("else");
  addGraphNode(elseBranch, "SequenceConstruct", {"a"}, {"one"});
  addStructuredValueInfo(elseBranch.mutable_output(), "one", false, true);
  auto* node = addNode(m, "If", {"yes"}, {"r"}, "if");
  setGraph(node, "then_branch", thenBranch);
  setGraph(node, "else_branch", elseBranch);
  addStructuredValueInfo(m.mutable_graph()->mutable_output(), "r", false, true);
  std::vector<GraphOutputForm> outputs;
  auto module = importWithForms(m, {}, outputs);
  ASSERT_TRUE(module.ok()) << module.error().str();
  EXPECT_EQ(countOps(*(*module)->functions().front(), OpKind::If), 0u);
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].count, 2u);
}

TEST(OnnxImporter, ValueFilesHoldSequencesAndOptionals) {
  onnx::SequenceProto sequence;
  sequence.set_elem_type(1);  // tensors
  *sequence.add_tensor_values() = floatTensor("", {2}, {1, 2});
  *sequence.add_tensor_values() = floatTensor("", {1}, {3});
  std::string bytes;
  ASSERT_TRUE(sequence.SerializeToString(&bytes));
  auto value = parseOnnxValue(bytes, OnnxValueFile::Sequence, "seq.pb");
  ASSERT_TRUE(value.ok()) << value.error().str();
  EXPECT_EQ(value->kind, ValueKind::Sequence);
  ASSERT_EQ(value->tensors.size(), 2u);
  EXPECT_EQ(value->tensors[1].type.str(), "f32[1]");

  onnx::OptionalProto optional;
  optional.set_elem_type(3);  // would hold a sequence, but holds nothing
  ASSERT_TRUE(optional.SerializeToString(&bytes));
  value = parseOnnxValue(bytes, OnnxValueFile::Optional, "none.pb");
  ASSERT_TRUE(value.ok()) << value.error().str();
  EXPECT_EQ(value->kind, ValueKind::OptionalNone);
  *optional.mutable_sequence_value() = sequence;
  ASSERT_TRUE(optional.SerializeToString(&bytes));
  value = parseOnnxValue(bytes, OnnxValueFile::Optional, "some.pb");
  ASSERT_TRUE(value.ok()) << value.error().str();
  EXPECT_EQ(value->kind, ValueKind::OptionalSequence);
  EXPECT_EQ(value->tensors.size(), 2u);

  // Elements of two dtypes, a sequence of maps, and bytes that are no message.
  *sequence.add_tensor_values() = int64Tensor("", {1}, {4});
  ASSERT_TRUE(sequence.SerializeToString(&bytes));
  std::string error = parseOnnxValue(bytes, OnnxValueFile::Sequence, "mixed.pb").error().str();
  EXPECT_NE(error.find("mixed.pb: element 2 is i64[1], but element 0 is f32[2]"), std::string::npos) << error;
  onnx::SequenceProto maps;
  maps.set_elem_type(4);
  maps.add_sequence_values();
  ASSERT_TRUE(maps.SerializeToString(&bytes));
  error = parseOnnxValue(bytes, OnnxValueFile::Sequence, "maps.pb").error().str();
  EXPECT_NE(error.find("maps.pb: a sequence of element type 4, expected tensors (1)"), std::string::npos) << error;
  error = parseOnnxValue("\xff\xff\xff", OnnxValueFile::Optional, "bad.pb").error().str();
  EXPECT_NE(error.find("bad.pb: not a valid ONNX OptionalProto"), std::string::npos) << error;
}


// --- Gradient (ai.onnx.preview.training) -------------------------------------------------

/// A Gradient node: the gradient of `y` with respect to `xs`, `zs` held
/// constant; its inputs are the tensors xs then zs name.
onnx::NodeProto* addGradient(onnx::ModelProto& m, std::vector<std::string> xs, std::vector<std::string> zs,
                             const std::string& y, std::vector<std::string> outputs) {
  if (m.opset_import_size() == 1) {
    auto* o = m.add_opset_import();
    o->set_domain("ai.onnx.preview.training");
    o->set_version(1);
  }
  std::vector<std::string> inputs = xs;
  inputs.insert(inputs.end(), zs.begin(), zs.end());
  auto* n = addNode(m, "Gradient", inputs, std::move(outputs), "grad");
  n->set_domain("ai.onnx.preview.training");
  for (const auto& [name, list] : {std::pair{"xs", &xs}, std::pair{"zs", &zs}}) {
    if (list->empty()) continue;
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRINGS);
    for (const auto& s : *list) a->add_strings(s);
  }
  auto* a = n->add_attribute();
  a->set_name("y");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(y);
  return n;
}

Expected<std::unique_ptr<Module>> importWithGradients(const onnx::ModelProto& m) {
  std::string bytes;
  EXPECT_TRUE(m.SerializeToString(&bytes));
  LoadOptions options;
  options.evaluator = &test::onnxTestEvaluator();
  options.gradients = &buildGradients;
  return importOnnxBytes(bytes, "test.onnx", "", options);
}

/// y = (x w + b) * (x w + b) with x [2,3], w [3,2], b [2].
onnx::ModelProto affineSquareModel() {
  auto m = makeModel(13);
  addInput(m, "x", {2, 3});
  addInput(m, "w", {3, 2});
  addInput(m, "b", {2});
  addNode(m, "MatMul", {"x", "w"}, {"xw"});
  addNode(m, "Add", {"xw", "b"}, {"s"});
  addNode(m, "Mul", {"s", "s"}, {"y"});
  addOutput(m, "y");
  return m;
}

const std::vector<double> kX{0.5, -1, 2, 1.5, 0.25, -0.75};
const std::vector<double> kW{1, -0.5, 0.25, 2, -1, 0.5};
const std::vector<double> kB{0.1, -0.2};

std::vector<Tensor> affineInputs(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& b) {
  return {test::tensorOf(DType::F32, {2, 3}, x), test::tensorOf(DType::F32, {3, 2}, w),
          test::tensorOf(DType::F32, {2}, b)};
}

TEST(OnnxImporter, GradientOfMatMulAddMulMatchesTheHandDerivedOne) {
  auto m = affineSquareModel();
  // Written before y's producers: Gradient is ordered after what `y` names.
  addGradient(m, {"x", "w", "b"}, {}, "y", {"dx", "dw", "db"});
  m.mutable_graph()->mutable_node()->SwapElements(0, m.graph().node_size() - 1);
  for (const char* out : {"dx", "dw", "db"}) addOutput(m, out);
  auto module = importWithGradients(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  EXPECT_TRUE(verify(**module).ok());
  auto out = run(**module, affineInputs(kX, kW, kB));
  ASSERT_EQ(out.size(), 4u);
  // dL/ds = 2s for L = sum(y); db = column sums, dw = x^T ds, dx = ds w^T.
  double s[2][2], ds[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      s[i][j] = kB[j];
      for (int k = 0; k < 3; ++k) s[i][j] += kX[i * 3 + k] * kW[k * 2 + j];
      ds[i][j] = 2 * s[i][j];
    }
  std::vector<double> dx(6, 0), dw(6, 0), db(2, 0);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      db[j] += ds[i][j];
      for (int k = 0; k < 3; ++k) {
        dw[k * 2 + j] += kX[i * 3 + k] * ds[i][j];
        dx[i * 3 + k] += ds[i][j] * kW[k * 2 + j];
      }
    }
  auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << i;
  };
  near(test::elementsOf(out[1]), dx);
  near(test::elementsOf(out[2]), dw);
  near(test::elementsOf(out[3]), db);
}

TEST(OnnxImporter, GradientThroughACompositeOpMatchesFiniteDifferences) {
  // y = elu(s) * s: elu is a composite op, differentiated through a
  // decomposed copy; w is held constant (zs) and gets no output.
  auto m = affineSquareModel();
  m.mutable_graph()->mutable_node()->RemoveLast();
  addNode(m, "Elu", {"s"}, {"e"});
  addNode(m, "Mul", {"e", "s"}, {"y"});
  addGradient(m, {"x", "b"}, {"w"}, "y", {"dx", "db"});
  for (const char* out : {"dx", "db"}) addOutput(m, out);
  auto module = importWithGradients(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  EXPECT_TRUE(verify(**module).ok());
  size_t elus = 0;
  for (const auto& op : (*module)->functions().front()->ops()) elus += op->kind() == OpKind::Elu;
  EXPECT_EQ(elus, 1u) << "the forward elu stays as it was";
  auto out = run(**module, affineInputs(kX, kW, kB));
  ASSERT_EQ(out.size(), 3u);
  auto loss = [&](std::vector<double> x, std::vector<double> b) {
    auto r = run(**module, affineInputs(x, kW, b));
    double sum = 0;
    for (double v : test::elementsOf(r[0])) sum += v;
    return sum;
  };
  const double h = 1e-2;
  std::vector<double> dx = test::elementsOf(out[1]), db = test::elementsOf(out[2]);
  for (size_t i = 0; i < kX.size(); ++i) {
    auto up = kX, down = kX;
    up[i] += h;
    down[i] -= h;
    EXPECT_NEAR(dx[i], (loss(up, kB) - loss(down, kB)) / (2 * h), 2e-2) << "dx " << i;
  }
  for (size_t i = 0; i < kB.size(); ++i) {
    auto up = kB, down = kB;
    up[i] += h;
    down[i] -= h;
    EXPECT_NEAR(db[i], (loss(kX, up) - loss(kX, down)) / (2 * h), 2e-2) << "db " << i;
  }
}

TEST(OnnxImporter, GradientOfAValueIndependentOfXIsZero) {
  auto m = affineSquareModel();
  addInput(m, "u", {2});
  addGradient(m, {"u"}, {}, "y", {"du"});
  addOutput(m, "du");
  auto module = importWithGradients(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto inputs = affineInputs(kX, kW, kB);
  inputs.push_back(test::tensorOf(DType::F32, {2}, {3, 4}));
  auto out = run(**module, inputs);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{0, 0}));
}

TEST(OnnxImporter, GradientThroughALoopIsReverseMode) {
  // looped = x * w * w * w by a Loop of 3 iterations (a constant trip count,
  // no condition): dy/dx = w^3 and dy/dw = 3 x w^2, through the loop's VJP.
  auto m = makeModel(13);
  addInput(m, "x", {2});
  addInput(m, "w", {2});
  *m.mutable_graph()->add_initializer() = int64Tensor("n", {}, {3});
  onnx::GraphProto body = carriedLoopBody("Mul", "w");
  setGraph(addNode(m, "Loop", {"n", "", "x"}, {"looped"}, "Loop_0"), "body", body);
  // Two Gradient nodes of the same loop: the second reuses the stack of
  // carried values that the first added to the forward loop.
  addGradient(m, {"x"}, {}, "looped", {"dx"})->set_name("grad_x");
  addGradient(m, {"w"}, {}, "looped", {"dw"})->set_name("grad_w");
  for (const char* out : {"looped", "dx", "dw"}) addOutput(m, out);
  auto module = importWithGradients(m);
  ASSERT_TRUE(module.ok()) << module.error().str();
  Status v = verify(**module);
  ASSERT_TRUE(v.ok()) << v.error().str();
  std::vector<const Op*> loops;
  for (const auto& op : (*module)->functions().front()->ops())
    if (op->kind() == OpKind::Loop) loops.push_back(op.get());
  ASSERT_EQ(loops.size(), 3u) << "the forward loop and a backward loop per Gradient, not an unrolled one";
  EXPECT_EQ(loops[0]->numResults(), 2u) << "the result and one stack of the carried value";
  auto out = run(**module, {test::tensorOf(DType::F32, {2}, {1.5, -2}), test::tensorOf(DType::F32, {2}, {0.5, 3})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(test::elementsOf(out[0]), (std::vector<double>{1.5 * 0.125, -2.0 * 27}));
  EXPECT_EQ(test::elementsOf(out[1]), (std::vector<double>{0.125, 27}));
  EXPECT_EQ(test::elementsOf(out[2]), (std::vector<double>{3 * 1.5 * 0.25, 3 * -2.0 * 9}));
}

TEST(OnnxImporter, GradientErrorsNameWhatIsWrong) {
  {
    auto m = affineSquareModel();
    addGradient(m, {"x", "nowhere"}, {}, "y", {"dx", "dn"});
    m.mutable_graph()->mutable_node()->rbegin()->set_input(1, "x");
    addOutput(m, "dx");
    std::string error = errorOf(importWithGradients(m));
    EXPECT_NE(error.find("name 'nowhere', which no node"), std::string::npos) << error;
  }
  {
    auto m = affineSquareModel();
    addGradient(m, {"x"}, {}, "y", {"dx"});
    m.mutable_graph()->mutable_node()->rbegin()->set_input(0, "w");
    addOutput(m, "dx");
    std::string error = errorOf(importWithGradients(m));
    EXPECT_NE(error.find("input 0 is 'w', expected 'x'"), std::string::npos) << error;
  }
  {
    auto m = affineSquareModel();
    addGradient(m, {"x"}, {}, "missing", {"dx"});
    addOutput(m, "dx");
    std::string error = errorOf(importWithGradients(m));
    EXPECT_NE(error.find("'y' names 'missing'"), std::string::npos) << error;
  }
  {
    // Without LoadOptions::gradients the op cannot be imported.
    auto m = affineSquareModel();
    addGradient(m, {"x"}, {}, "y", {"dx"});
    addOutput(m, "dx");
    std::string error = errorOf(importModel(m));
    EXPECT_NE(error.find("without Kiln's autodiff"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace kiln
