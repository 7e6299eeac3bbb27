// Int8 inference (docs/onnx.md, "Quantized models"): the interpreter's
// qconv and qmatmul (exact integer sums, one requantization) against the
// float QDQ patterns `fold-qdq` makes them of, and the CPU executor's
// oneDNN int8 primitives against the interpreter.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "codegen/cpu/CpuExecutable.h"
#include "ir/ShapeRules.h"
#include "passes/Pass.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

/// A constant of `dtype` and `dims` with integers drawn from [lo, hi].
std::string randomConstant(const std::string& name, const std::string& dtype, const std::vector<int64_t>& dims, int lo,
                           int hi, std::mt19937& rng) {
  std::uniform_int_distribution<int> value(lo, hi);
  int64_t count = 1;
  std::string type = dtype + "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    count *= dims[i];
    type += (i ? "," : "") + std::to_string(dims[i]);
  }
  type += "]";
  std::string values;
  for (int64_t i = 0; i < count; ++i) values += (i ? ", " : "") + std::to_string(value(rng));
  return "  %" + name + " = constant() {value = dense<" + type + ">[" + values + "]} : " + type + "\n";
}

/// Inputs for `f`'s integer arguments, uniform over their dtype's range.
std::vector<Tensor> randomInputs(const Function& f, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const TensorType& type = f.argument(i)->type();
    Tensor t(type.dtype, staticDims(type.shape));
    std::uniform_int_distribution<int> value(type.dtype == DType::U8 ? 0 : -128, type.dtype == DType::U8 ? 255 : 127);
    for (int64_t j = 0; j < t.numElements(); ++j) t.setInt(j, value(rng));
    inputs.push_back(std::move(t));
  }
  return inputs;
}

/// A QDQ conv (per-channel weights, int32 bias, optional relu) on x of
/// `xType` [2,8,9,9], quantized to `yType`, stride 2, pads 1, `groups`.
std::string qdqConv(const std::string& xType, const std::string& yType, int groups, bool relu, unsigned seed) {
  std::mt19937 rng(seed);
  const int zx = xType == "u8" ? 131 : -3, zy = yType == "u8" ? 117 : 5;
  std::string scales, biasScales;
  std::uniform_real_distribution<double> scale(0.002, 0.01);
  for (int m = 0; m < 16; ++m) {
    const double s = scale(rng);
    scales += (m ? ", " : "") + std::to_string(s);
    biasScales += (m ? ", " : "") + std::to_string(0.05 * s);
  }
  std::string text = "func @f(%x: " + xType + "[2,8,9,9]) -> " + yType + "[2,16,5,5] {\n";
  text += "  %sx = constant() {value = dense<f32[]>[0.05]} : f32[]\n";
  text += "  %zx = constant() {value = dense<" + xType + "[]>[" + std::to_string(zx) + "]} : " + xType + "[]\n";
  text += "  %xd = dequantize(%x, %sx, %zx) : f32[2,8,9,9]\n";
  text += randomConstant("wq", "i8", {16, 8 / groups, 3, 3}, -127, 127, rng);
  text += "  %sw = constant() {value = dense<f32[16]>[" + scales + "]} : f32[16]\n";
  text += "  %zw = constant() {value = dense<i8[]>[0]} : i8[]\n";
  text += "  %wd = dequantize(%wq, %sw, %zw) {axis = 0} : f32[16," + std::to_string(8 / groups) + ",3,3]\n";
  text += randomConstant("bq", "i32", {16}, -5000, 5000, rng);
  text += "  %sb = constant() {value = dense<f32[16]>[" + biasScales + "]} : f32[16]\n";
  text += "  %zb = constant() {value = dense<i32[]>[0]} : i32[]\n";
  text += "  %bd = dequantize(%bq, %sb, %zb) {axis = 0} : f32[16]\n";
  text += "  %c = conv(%xd, %wd, %bd) {strides = [2, 2], pads = [1, 1, 1, 1], groups = " + std::to_string(groups) +
          "} : f32[2,16,5,5]\n";
  std::string last = "%c";
  if (relu) {
    text += "  %r = relu(%c) : f32[2,16,5,5]\n";
    last = "%r";
  }
  text += "  %sy = constant() {value = dense<f32[]>[0.4]} : f32[]\n";
  text += "  %zy = constant() {value = dense<" + yType + "[]>[" + std::to_string(zy) + "]} : " + yType + "[]\n";
  text += "  %y = quantize(" + last + ", %sy, %zy) : " + yType + "[2,16,5,5]\n  return %y\n}\n";
  return text;
}

/// A QDQ matmul x[3,5,64] by per-column weights [64,24], with a float bias.
std::string qdqMatMul(unsigned seed) {
  std::mt19937 rng(seed);
  std::string scales, bias;
  std::uniform_real_distribution<double> scale(0.002, 0.01), b(-0.5, 0.5);
  for (int n = 0; n < 24; ++n) {
    scales += (n ? ", " : "") + std::to_string(scale(rng));
    bias += (n ? ", " : "") + std::to_string(b(rng));
  }
  std::string text = "func @f(%x: u8[3,5,64]) -> u8[3,5,24] {\n";
  text += "  %sx = constant() {value = dense<f32[]>[0.02]} : f32[]\n";
  text += "  %zx = constant() {value = dense<u8[]>[128]} : u8[]\n";
  text += "  %xd = dequantize(%x, %sx, %zx) : f32[3,5,64]\n";
  text += randomConstant("wq", "i8", {64, 24}, -127, 127, rng);
  text += "  %sw = constant() {value = dense<f32[24]>[" + scales + "]} : f32[24]\n";
  text += "  %zw = constant() {value = dense<i8[]>[0]} : i8[]\n";
  text += "  %wd = dequantize(%wq, %sw, %zw) {axis = 1} : f32[64,24]\n";
  text += "  %m = matmul(%xd, %wd) : f32[3,5,24]\n";
  text += "  %b = constant() {value = dense<f32[24]>[" + bias + "]} : f32[24]\n";
  text += "  %a = add(%m, %b) : f32[3,5,24]\n";
  text += "  %sy = constant() {value = dense<f32[]>[0.1]} : f32[]\n";
  text += "  %zy = constant() {value = dense<u8[]>[60]} : u8[]\n";
  text += "  %y = quantize(%a, %sy, %zy) : u8[3,5,24]\n  return %y\n}\n";
  return text;
}

/// The largest difference between two integer tensors of one shape.
int64_t maxDifference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.dtype(), b.dtype());
  int64_t most = 0;
  for (int64_t i = 0; i < a.numElements() && a.shape() == b.shape(); ++i)
    most = std::max(most, std::abs(a.getInt(i) - b.getInt(i)));
  return most;
}

/// Folds `text`, checks that one `kind` replaced the pattern, and compares
/// the interpreter on the folded function with the QDQ function (within
/// one quantization step: the float conv rounds its sum) and the CPU
/// executor (oneDNN int8) with the folded function's interpreter (exactly).
void expectFoldAndRun(const std::string& text, const std::string& kind) {
  SCOPED_TRACE(text.substr(0, 200));
  auto qdq = test::parseVerified(text);
  auto folded = test::parseVerified(text);
  ASSERT_TRUE(qdq && folded);
  auto changed = createFoldQdqPass()->run(*folded, PassContext{});
  ASSERT_TRUE(changed.ok()) << changed.error().str();
  EXPECT_TRUE(*changed);
  const Function& f = *folded->functions().front();
  int found = 0;
  for (const auto& op : f.ops()) {
    EXPECT_NE(op->kind(), OpKind::Quantize);
    found += op->name() == kind;
  }
  EXPECT_EQ(found, 1);
  const std::vector<Tensor> inputs = randomInputs(f, 11);
  auto reference = interpret(*qdq->functions().front(), inputs);
  auto exact = interpret(f, inputs);
  ASSERT_TRUE(reference.ok()) << reference.error().str();
  ASSERT_TRUE(exact.ok()) << exact.error().str();
  EXPECT_LE(maxDifference((*exact)[0], (*reference)[0]), 1);

  // The QDQ function itself, as `kiln run` compiles it: fold-qdq in the
  // target pipeline, then a oneDNN int8 call.
  const Function& g = *qdq->functions().front();
  auto executor = CpuExecutor::create(g, {.threads = 2, .optLevel = 3});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto got = (*executor)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(maxDifference((*got)[0], (*exact)[0]), 0);
  auto ir = (*executor)->kernelIR(inputs);
  ASSERT_TRUE(ir.ok());
  EXPECT_NE(ir->find("onednn int8 " + std::string(kind == "qconv" ? "conv" : "matmul")), std::string::npos) << *ir;
}

TEST(QuantizedTest, ConvU8ToU8WithRelu) { expectFoldAndRun(qdqConv("u8", "u8", 1, true, 1), "qconv"); }
TEST(QuantizedTest, ConvI8ToI8Grouped) { expectFoldAndRun(qdqConv("i8", "i8", 2, false, 2), "qconv"); }
TEST(QuantizedTest, ConvU8ToI8) { expectFoldAndRun(qdqConv("u8", "i8", 1, false, 3), "qconv"); }
TEST(QuantizedTest, MatMulWithBias) { expectFoldAndRun(qdqMatMul(4), "qmatmul"); }

/// The shape rule names a bad operand of a qconv and what it expects.
TEST(QuantizedTest, ErrorsNameTheOp) {
  auto m = test::parseOk(
      "func @f(%x: u8[1,2,4,4], %w: u8[2,2,1,1], %s: f32[2]) -> u8[1,2,4,4] {\n"
      "  %y = qconv(%x, %w, %s) : u8[1,2,4,4]\n  return %y\n}\n");
  ASSERT_TRUE(m);
  auto types = inferResultTypes(*m->functions().front()->ops().front());
  ASSERT_FALSE(types.ok());
  EXPECT_NE(types.error().message().find("'qconv' operand 1 (the weights) has dtype u8, expected i8"),
            std::string::npos)
      << types.error().message();
}

}  // namespace
}  // namespace kiln
