// The CPU JIT against the reference interpreter: every lowered op runs on
// random inputs of several shapes (broadcasting, scalars, zero-size dims)
// through CpuExecutor and must match interpret() within rtol 1e-4; plus the
// kernel IR printer, shape-keyed recompilation, the thread pool, and the
// error that names ops without a lowering.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/KernelIR.h"
#include "codegen/Lowering.h"
#include "runtime/Interpreter.h"
#include "runtime/ThreadPool.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

using test::expectClose;
using test::parseVerified;
using test::randomTensor;

/// Runs `text`'s first function on the JIT and on the interpreter with the
/// given inputs (random ones of the argument types when empty).
void expectJitMatchesInterpreter(const std::string& text, std::vector<Tensor> inputs = {}, bool positive = false,
                                 int optLevel = 2) {
  SCOPED_TRACE(text);
  auto m = parseVerified(text);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  std::mt19937 rng(42);
  if (inputs.empty())
    for (size_t i = 0; i < f.numArguments(); ++i) inputs.push_back(randomTensor(f.argument(i)->type(), rng, positive));
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  auto executor = CpuExecutor::create(f, {.threads = 3, .optLevel = optLevel});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto got = (*executor)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < want->size(); ++i) expectClose((*got)[i], (*want)[i], "result " + std::to_string(i));
}

std::string unaryFunction(const std::string& op, const std::string& type) {
  return "func @f(%x: " + type + ") -> " + type + " {\n  %y = " + op + "(%x) : " + type + "\n  return %y\n}\n";
}

std::string binaryFunction(const std::string& op, const std::string& a, const std::string& b, const std::string& r) {
  return "func @f(%a: " + a + ", %b: " + b + ") -> " + r + " {\n  %y = " + op + "(%a, %b) : " + r +
         "\n  return %y\n}\n";
}

TEST(CodegenTest, UnaryFloatOps) {
  for (const char* op : {"neg", "abs", "sign", "exp", "tanh", "sigmoid", "relu", "erf", "sin", "cos", "tan", "atan",
                         "sinh", "cosh", "asinh", "floor", "ceil", "round"})
    for (const char* type : {"f32[3,17]", "f32[]", "f32[0,4]", "f64[5]"})
      expectJitMatchesInterpreter(unaryFunction(op, type));
  // Ops with restricted domains get positive inputs.
  for (const char* op : {"log", "sqrt", "rsqrt", "reciprocal", "acosh"})
    expectJitMatchesInterpreter(unaryFunction(op, "f32[4,9]"), {}, true);
  // hard_swish over its three pieces, its kinks at -3 and 3, and the
  // special values, on every shape the other unary ops take.
  for (const char* type : {"f32[3,17]", "f32[]", "f32[0,4]", "f64[5]"})
    expectJitMatchesInterpreter(unaryFunction("hard_swish", type));
  {
    Tensor x(DType::F32, {12});
    const double values[] = {-5, -3, -2.75, -1, -0.0, 0.5, 2.5, 3, 7, NAN, INFINITY, -INFINITY};
    for (int64_t i = 0; i < 12; ++i) x.setDouble(i, values[i]);
    expectJitMatchesInterpreter(unaryFunction("hard_swish", "f32[12]"), {x});
  }
  for (const char* op : {"asin", "acos", "atanh"}) {
    Tensor x(DType::F32, {7});
    for (int64_t i = 0; i < 7; ++i) x.setDouble(i, -0.9 + 0.3 * i);
    expectJitMatchesInterpreter(unaryFunction(op, "f32[7]"), {x});
  }
}

TEST(CodegenTest, UnaryIntegerAndPredicateOps) {
  for (const char* op : {"neg", "abs", "sign", "relu"})
    for (const char* type : {"i64[6]", "i32[2,3]", "i8[4]"}) expectJitMatchesInterpreter(unaryFunction(op, type));
  expectJitMatchesInterpreter(unaryFunction("not", "bool[2,5]"));
  Tensor x(DType::F32, {4});
  x.setDouble(0, NAN);
  x.setDouble(1, INFINITY);
  x.setDouble(2, -INFINITY);
  x.setDouble(3, 1.5);
  for (const char* op : {"isnan", "isinf"})
    expectJitMatchesInterpreter(
        "func @f(%x: f32[4]) -> bool[4] {\n  %y = " + std::string(op) + "(%x) : bool[4]\n  return %y\n}\n", {x});
  expectJitMatchesInterpreter(unaryFunction("relu", "f32[4]"), {x});
}

TEST(CodegenTest, BinaryOpsBroadcast) {
  const char* shapes[][3] = {{"f32[3,4]", "f32[3,4]", "f32[3,4]"},     {"f32[3,4]", "f32[4]", "f32[3,4]"},
                             {"f32[2,1,5]", "f32[3,1]", "f32[2,3,5]"}, {"f32[]", "f32[6]", "f32[6]"},
                             {"f32[0,3]", "f32[3]", "f32[0,3]"},       {"f64[]", "f64[]", "f64[]"}};
  for (const char* op : {"add", "sub", "mul", "div", "max", "min", "mod", "rem", "pow"})
    for (auto& s : shapes)
      expectJitMatchesInterpreter(binaryFunction(op, s[0], s[1], s[2]), {}, std::string(op) == "pow");
  for (const char* op : {"add", "sub", "mul", "div", "max", "min", "mod", "rem"})
    for (const char* t : {"i64", "i32", "i8", "u8"}) {
      const std::string a = std::string(t) + "[3,4]", b = std::string(t) + "[4]";
      const bool divides = std::string(op) == "div" || std::string(op) == "mod" || std::string(op) == "rem";
      auto m = parseVerified(binaryFunction(op, a, b, a));
      std::mt19937 rng(7);
      std::vector<Tensor> in = {randomTensor(m->functions().front()->argument(0)->type(), rng),
                                randomTensor(m->functions().front()->argument(1)->type(), rng, divides)};
      expectJitMatchesInterpreter(binaryFunction(op, a, b, a), in);
    }
}

TEST(CodegenTest, CompareLogicalSelect) {
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    expectJitMatchesInterpreter(binaryFunction(op, "f32[3,4]", "f32[4]", "bool[3,4]"));
    expectJitMatchesInterpreter(binaryFunction(op, "i32[5]", "i32[]", "bool[5]"));
  }
  for (const char* op : {"and", "or", "xor"})
    expectJitMatchesInterpreter(binaryFunction(op, "bool[2,3]", "bool[3]", "bool[2,3]"));
  expectJitMatchesInterpreter(
      "func @f(%c: bool[2,1], %a: f32[3], %b: f32[]) -> f32[2,3] {\n  %y = select(%c, %a, %b) : f32[2,3]\n"
      "  return %y\n}\n");
}

TEST(CodegenTest, Casts) {
  const char* types[] = {"f32", "f64", "i64", "i32", "i16", "i8", "u8", "bool"};
  for (const char* from : types)
    for (const char* to : types) {
      const std::string a = std::string(from) + "[2,5]", r = std::string(to) + "[2,5]";
      expectJitMatchesInterpreter("func @f(%x: " + a + ") -> " + r + " {\n  %y = cast(%x) : " + r +
                                  "\n  return %y\n}\n");
    }
}

TEST(CodegenTest, LayoutOps) {
  expectJitMatchesInterpreter("func @f(%x: f32[3]) -> f32[2,3] {\n  %y = broadcast(%x) : f32[2,3]\n  return %y\n}\n");
  expectJitMatchesInterpreter("func @f(%x: f32[]) -> f32[4] {\n  %y = broadcast(%x) : f32[4]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[2,6]) -> f32[3,2,2] {\n  %y = reshape(%x) : f32[3,2,2]\n  return %y\n}\n");
  expectJitMatchesInterpreter("func @f(%x: f32[0,6]) -> f32[3,0] {\n  %y = reshape(%x) : f32[3,0]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[2,3,4]) -> f32[4,2,3] {\n  %y = transpose(%x) {perm = [2, 0, 1]} : f32[4,2,3]\n"
      "  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[5,6]) -> f32[2,3] {\n  %y = slice(%x) {starts = [1, 0], ends = [5, 6], steps = [2, 2]} : "
      "f32[2,3]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[5,6]) -> f32[2,2] {\n  %y = slice(%x) {starts = [-1, 4], ends = [-4, 0], steps = [-2, -3]} : "
      "f32[2,2]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%a: f32[2,3], %b: f32[2,0], %c: f32[2,2]) -> f32[2,5] {\n  %y = concat(%a, %b, %c) {axis = 1} : "
      "f32[2,5]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%a: i64[1], %b: i64[3]) -> i64[4] {\n  %y = concat(%a, %b) {axis = 0} : i64[4]\n  return %y\n}\n");
  for (const char* mode : {"constant", "edge", "reflect"})
    expectJitMatchesInterpreter("func @f(%x: f32[3,4]) -> f32[5,9] {\n  %y = pad(%x) {mode = \"" + std::string(mode) +
                                "\", pads = [1, 2, 1, 3], value = 1.5} : f32[5,9]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[4,4]) -> f32[3,2] {\n  %y = pad(%x) {pads = [0, -1, -1, -1]} : f32[3,2]\n  return %y\n}\n");
}

TEST(CodegenTest, GatherAndIota) {
  Tensor indices(DType::I64, {2, 2});
  for (int64_t i = 0; i < 4; ++i) indices.setInt(i, i % 2 ? -1 : i);
  std::mt19937 rng(3);
  Tensor data = randomTensor({DType::F32, staticShape({4, 3})}, rng);
  expectJitMatchesInterpreter(
      "func @f(%d: f32[4,3], %i: i64[2,2]) -> f32[2,2,3] {\n  %y = gather(%d, %i) {axis = 0} : f32[2,2,3]\n"
      "  return %y\n}\n",
      {data, indices});
  Tensor idx3(DType::I32, {2});
  idx3.setInt(0, 2);
  idx3.setInt(1, 0);
  expectJitMatchesInterpreter(
      "func @f(%d: f32[4,3], %i: i32[2]) -> f32[4,2] {\n  %y = gather(%d, %i) {axis = 1} : f32[4,2]\n  return %y\n}\n",
      {data, idx3});
  Tensor el(DType::I64, {4, 3});
  for (int64_t i = 0; i < 12; ++i) el.setInt(i, (i * 7) % 4 - 1);
  expectJitMatchesInterpreter(
      "func @f(%d: f32[4,3], %i: i64[4,3]) -> f32[4,3] {\n  %y = gather_elements(%d, %i) {axis = 0} : f32[4,3]\n"
      "  return %y\n}\n",
      {data, el});
  expectJitMatchesInterpreter("func @f() -> i64[2,3] {\n  %y = iota() {axis = 1} : i64[2,3]\n  return %y\n}\n");
  expectJitMatchesInterpreter("func @f() -> f32[4,2] {\n  %y = iota() {axis = 0} : f32[4,2]\n  return %y\n}\n");
  // An index out of range is the interpreter's error, not a wild read.
  indices.setInt(0, 9);
  auto m = parseVerified(
      "func @f(%d: f32[4,3], %i: i64[2,2]) -> f32[2,2,3] {\n  %y = gather(%d, %i) {axis = 0} : f32[2,2,3]\n"
      "  return %y\n}\n");
  auto executor = CpuExecutor::create(*m->functions().front());
  ASSERT_TRUE(executor.ok());
  auto result = (*executor)->run({data, indices});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message().find("index 9 is out of range"), std::string::npos) << result.error().str();
}

TEST(CodegenTest, Reductions) {
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"}) {
    const std::string o = op;
    expectJitMatchesInterpreter("func @f(%x: f32[3,4,5]) -> f32[3,5] {\n  %y = " + o +
                                "(%x) {axes = [1]} : f32[3,5]\n  return %y\n}\n");
    expectJitMatchesInterpreter("func @f(%x: f32[3,4,5]) -> f32[1,4,1] {\n  %y = " + o +
                                "(%x) {axes = [0, -1], keepdims = true} : f32[1,4,1]\n  return %y\n}\n");
    expectJitMatchesInterpreter("func @f(%x: f32[3,4]) -> f32[] {\n  %y = " + o +
                                "(%x) {axes = []} : f32[]\n  return %y\n}\n");
    expectJitMatchesInterpreter("func @f(%x: i32[3,4]) -> i32[4] {\n  %y = " + o +
                                "(%x) {axes = [0]} : i32[4]\n  return %y\n}\n");
    if (o != "reduce_mean")
      expectJitMatchesInterpreter("func @f(%x: f32[0,4]) -> f32[4] {\n  %y = " + o +
                                  "(%x) {axes = [0]} : f32[4]\n  return %y\n}\n");
  }
  Tensor x(DType::F32, {2, 4});
  const double values[] = {1, 3, 3, 0, NAN, 2, NAN, -1};
  for (int64_t i = 0; i < 8; ++i) x.setDouble(i, values[i]);
  for (const char* op : {"argmax", "argmin"})
    for (const char* last : {"false", "true"}) {
      const std::string head = "func @f(%x: f32[2,4]) -> i64[2] {\n  %y = " + std::string(op) +
                               "(%x) {axis = 1, select_last_index = " + last + "} : i64[2]\n  return %y\n}\n";
      expectJitMatchesInterpreter(head, {x});
      expectJitMatchesInterpreter(head);
    }
  expectJitMatchesInterpreter(
      "func @f(%x: i32[3,4]) -> i64[1,4] {\n  %y = argmax(%x) {axis = 0, keepdims = true} : i64[1,4]\n"
      "  return %y\n}\n");
  for (const char* op : {"reduce_max", "reduce_min"})
    expectJitMatchesInterpreter(
        "func @f(%x: f32[2,4]) -> f32[2] {\n  %y = " + std::string(op) + "(%x) {axes = [1]} : f32[2]\n  return %y\n}\n",
        {x});
  // Rows long enough for the vectorized max and min (a softmax's row max),
  // of a length no vector width divides: a NaN early, one last, one in the
  // tail, infinities alone, -0 and +0 alone, and a row of random numbers.
  Tensor rows(DType::F32, {6, 77});
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> uniform(-5, 5);
  for (int64_t i = 0; i < rows.numElements(); ++i) rows.setDouble(i, uniform(rng));
  rows.setDouble(0 * 77 + 3, NAN);
  rows.setDouble(1 * 77 + 76, NAN);
  rows.setDouble(2 * 77 + 70, NAN);
  for (int64_t j = 0; j < 77; ++j) rows.setDouble(3 * 77 + j, j % 2 ? INFINITY : -INFINITY);
  for (int64_t j = 0; j < 77; ++j) rows.setDouble(4 * 77 + j, j % 3 ? 0.0 : -0.0);
  for (const char* op : {"reduce_max", "reduce_min"})
    expectJitMatchesInterpreter("func @f(%x: f32[6,77]) -> f32[6,1] {\n  %y = " + std::string(op) +
                                    "(%x) {axes = [1], keepdims = true} : f32[6,1]\n  return %y\n}\n",
                                {rows});
  // Column reductions (the kept innermost dim contiguous, the reduced dims
  // strided: a channels-last global average pool), which run column-wise:
  // more lanes than one chunk of accumulators (300 > 256), NaN in a few.
  Tensor cols(DType::F32, {2, 5, 3, 300});
  for (int64_t i = 0; i < cols.numElements(); ++i) cols.setDouble(i, uniform(rng));
  cols.setDouble(7, NAN);
  cols.setDouble(2 * 3 * 300 + 299, NAN);
  cols.setDouble(cols.numElements() - 1, NAN);
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"}) {
    expectJitMatchesInterpreter("func @f(%x: f32[2,5,3,300]) -> f32[2,1,1,300] {\n  %y = " + std::string(op) +
                                    "(%x) {axes = [1, 2], keepdims = true} : f32[2,1,1,300]\n  return %y\n}\n",
                                {cols});
    expectJitMatchesInterpreter("func @f(%x: i32[4,6,40]) -> i32[4,40] {\n  %y = " + std::string(op) +
                                "(%x) {axes = [1]} : i32[4,40]\n  return %y\n}\n");
  }
}

TEST(CodegenTest, MatMul) {
  const char* cases[][3] = {{"f32[3,4]", "f32[4,5]", "f32[3,5]"},
                            {"f32[2,3,4]", "f32[4,5]", "f32[2,3,5]"},
                            {"f32[2,1,3,4]", "f32[3,4,2]", "f32[2,3,3,2]"},
                            {"f32[4]", "f32[4,5]", "f32[5]"},
                            {"f32[3,4]", "f32[4]", "f32[3]"},
                            {"f32[4]", "f32[4]", "f32[]"},
                            {"f32[3,0]", "f32[0,5]", "f32[3,5]"},
                            {"f64[64,33]", "f64[33,70]", "f64[64,70]"}};
  for (auto& c : cases) expectJitMatchesInterpreter(binaryFunction("matmul", c[0], c[1], c[2]));
}

TEST(CodegenTest, ConvAndPooling) {
  expectJitMatchesInterpreter(
      "func @f(%x: f32[2,3,7,6], %w: f32[4,3,3,2], %b: f32[4]) -> f32[2,4,5,5] {\n"
      "  %y = conv(%x, %w, %b) : f32[2,4,5,5]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[1,4,8,8], %w: f32[6,2,3,3]) -> f32[1,6,4,4] {\n"
      "  %y = conv(%x, %w) {strides = [2, 2], pads = [1, 1, 1, 1], groups = 2} : f32[1,6,4,4]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[1,2,9], %w: f32[3,2,3]) -> f32[1,3,5] {\n"
      "  %y = conv(%x, %w) {dilations = [2], pads = [0, 0]} : f32[1,3,5]\n  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[2,3,7,7]) -> f32[2,3,4,4] {\n"
      "  %y = max_pool(%x) {kernel = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} : f32[2,3,4,4]\n"
      "  return %y\n}\n");
  expectJitMatchesInterpreter(
      "func @f(%x: f32[1,2,5,5]) -> f32[1,2,3,3] {\n"
      "  %y = max_pool(%x) {kernel = [2, 2], strides = [2, 2], ceil_mode = true} : f32[1,2,3,3]\n  return %y\n}\n");
  for (const char* include : {"false", "true"})
    expectJitMatchesInterpreter(
        "func @f(%x: f32[1,2,6,6]) -> f32[1,2,4,4] {\n  %y = avg_pool(%x) {kernel = [3, 3], strides = [2, 2], "
        "pads = [1, 1, 2, 2], count_include_pad = " +
        std::string(include) + "} : f32[1,2,4,4]\n  return %y\n}\n");
}

/// NaN and infinite weights: a conv's padded tap is 0 * w (NaN), a
/// conv_transpose's tap in a stride's gap or the cropped padding adds
/// nothing, as in the interpreter (and PyTorch).
TEST(CodegenTest, ConvPaddingWithNonFiniteWeights) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(7);
  auto random = [&](std::vector<int64_t> dims) {
    Tensor t(DType::F32, std::move(dims));
    for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, std::uniform_real_distribution<double>(-2, 2)(rng));
    return t;
  };
  Tensor x = random({1, 2, 5, 5});
  Tensor w = random({3, 2, 3, 3});
  w.setDouble(0, inf);        // w[0, 0, 0, 0]
  w.setDouble(9 + 8, -inf);   // w[0, 1, 2, 2]
  w.setDouble(18 + 4, nan);   // w[1, 0, 1, 1]: every output meets it
  const std::string conv =
      "func @f(%x: f32[1,2,5,5], %w: f32[3,2,3,3]) -> f32[1,3,3,3] {\n"
      "  %y = conv(%x, %w) {strides = [2, 2], pads = [1, 1, 1, 1]} : f32[1,3,3,3]\n  return %y\n}\n";
  // -O1 lowers them to generated code, -O2 calls oneDNN.
  for (int optLevel : {1, 2}) expectJitMatchesInterpreter(conv, {x, w}, false, optLevel);
  Tensor xt = random({1, 2, 3, 3});
  Tensor wt = random({2, 2, 3, 3});
  wt.setDouble(0, nan);       // wt[0, 0, 0, 0]
  wt.setDouble(27 + 5, inf);  // wt[1, 1, 1, 2]
  const std::string transposed =
      "func @f(%x: f32[1,2,3,3], %w: f32[2,2,3,3]) -> f32[1,2,5,5] {\n"
      "  %y = conv_transpose(%x, %w) {strides = [2, 2], pads = [1, 1, 1, 1]} : f32[1,2,5,5]\n  return %y\n}\n";
  for (int optLevel : {1, 2}) expectJitMatchesInterpreter(transposed, {xt, wt}, false, optLevel);
}

/// Composites run through -O2's decompose, then their primitives lower.
TEST(CodegenTest, DecomposedComposites) {
  expectJitMatchesInterpreter(unaryFunction("softmax", "f32[4,10]"));
  expectJitMatchesInterpreter(unaryFunction("gelu", "f32[3,7]"));
  expectJitMatchesInterpreter(
      "func @f(%x: f32[2,3,8], %s: f32[8], %b: f32[8]) -> f32[2,3,8] {\n"
      "  %y = layer_norm(%x, %s, %b) : f32[2,3,8]\n  return %y\n}\n");
}

/// At -O3 `fuse` groups ops; a single-result group is one kernel composed
/// from its ops' lowerings (producers recomputed inside reductions).
TEST(CodegenTest, FusedGroupsLowerByComposition) {
  const std::string mlp =
      "func @f(%x: f32[8,16], %w: f32[16,12], %b: f32[12]) -> f32[8,12] {\n  %m = matmul(%x, %w) : f32[8,12]\n"
      "  %s = add(%m, %b) : f32[8,12]\n  %r = relu(%s) : f32[8,12]\n  return %r\n}\n";
  expectJitMatchesInterpreter(mlp, {}, false, 3);
  expectJitMatchesInterpreter(unaryFunction("softmax", "f32[4,10]"), {}, false, 3);
  expectJitMatchesInterpreter(
      "func @f(%x: f32[2,3,8], %s: f32[8], %b: f32[8]) -> f32[2,3,8] {\n"
      "  %y = layer_norm(%x, %s, %b) : f32[2,3,8]\n  return %y\n}\n",
      {}, false, 3);
  auto m = parseVerified(mlp);
  auto executor = CpuExecutor::create(*m->functions().front(), {.optLevel = 3});
  ASSERT_TRUE(executor.ok());
  std::mt19937 rng(5);
  std::vector<Tensor> in;
  for (size_t i = 0; i < 3; ++i) in.push_back(randomTensor(m->functions().front()->argument(i)->type(), rng));
  EXPECT_EQ((*executor)->numKernels(in), 1u);
}

TEST(CodegenTest, SymbolicDimsRecompilePerShape) {
  auto m = parseVerified(
      "func @f(%x: f32[N,3], %y: f32[3]) -> f32[N,3] {\n  %s = add(%x, %y) : f32[N,3]\n  %r = relu(%s) : f32[N,3]\n"
      "  return %r\n}\n");
  const Function& f = *m->functions().front();
  auto executor = CpuExecutor::create(f);
  ASSERT_TRUE(executor.ok());
  std::mt19937 rng(1);
  for (int64_t n : {2, 5, 0, 5}) {
    std::vector<Tensor> in = {randomTensor({DType::F32, staticShape({n, 3})}, rng),
                              randomTensor({DType::F32, staticShape({3})}, rng)};
    auto got = (*executor)->run(in);
    ASSERT_TRUE(got.ok()) << got.error().str();
    auto want = interpret(f, in);
    ASSERT_TRUE(want.ok());
    expectClose((*got)[0], (*want)[0], "n = " + std::to_string(n));
  }
}

TEST(CodegenTest, LargeKernelsSplitAcrossThreads) {
  expectJitMatchesInterpreter(binaryFunction("add", "f32[300,257]", "f32[257]", "f32[300,257]"));
  expectJitMatchesInterpreter(binaryFunction("matmul", "f32[1,96,80]", "f32[80,64]", "f32[1,96,64]"));
}

TEST(CodegenTest, UnsupportedOpsAreNamed) {
  auto m = parseVerified(
      "func @f(%x: i32[1,1,4,4], %w: i32[1,2,3,3], %q: u8[1,1,2,2,2,2]) -> (i32[1,2,6,6], u8[1,1,2,2,2,2]) {\n"
      "  %y = conv_transpose(%x, %w) : i32[1,2,6,6]\n"
      "  %wq = constant() {value = dense<i8[1,1,1,1,1,1]>[3]} : i8[1,1,1,1,1,1]\n"
      "  %s = constant() {value = dense<f32[1]>[0.5]} : f32[1]\n"
      "  %r = qconv(%q, %wq, %s) : u8[1,1,2,2,2,2]\n  return %y, %r\n}\n");
  auto executor = CpuExecutor::create(*m->functions().front());
  ASSERT_TRUE(executor.ok());
  std::mt19937 rng(1);
  Status s = (*executor)->prepare({randomTensor({DType::I32, staticShape({1, 1, 4, 4})}, rng),
                                   randomTensor({DType::I32, staticShape({1, 2, 3, 3})}, rng),
                                   randomTensor({DType::U8, staticShape({1, 1, 2, 2, 2, 2})}, rng)});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("'conv_transpose' on i32"), std::string::npos) << s.error().str();
  // oneDNN has no 4-d convolution, and a qconv has no other lowering.
  EXPECT_NE(s.error().message().find("'qconv' (int8) is computed only by a library call"), std::string::npos)
      << s.error().str();
  EXPECT_EQ((*executor)->unsupportedOps().size(), 2u);
}

TEST(CodegenTest, KernelPrinter) {
  auto m = parseVerified(binaryFunction("add", "f32[2,3]", "f32[3]", "f32[2,3]"));
  auto kernel = codegen::lowerOpToKernel(*m->functions().front()->ops().front(), "add");
  ASSERT_TRUE(kernel.ok()) << kernel.error().str();
  EXPECT_EQ(kir::printKernel(*kernel),
            "kernel @add(in %b0: f32[2,3] \"a\", in %b1: f32[3] \"b\", out %b2: f32[2,3] \"y\") {\n"
            "  for %i0 in 0..2 parallel {\n"
            "    for %i1 in 0..3 vectorize {\n"
            "      %b2[((%i0 * 3) + %i1)] = (%b0[((%i0 * 3) + %i1)] + %b1[%i1])\n"
            "    }\n"
            "  }\n"
            "}\n");
}

/// A kernel below kParallelWork (2^18 of codegen's estimated work) runs on
/// the calling thread alone (its step is not parallel): splitting it would
/// cost more than it saves, and on a busy machine a wait for a thread. One
/// above it is split across the pool.
TEST(CodegenTest, SmallKernelsRunOnTheCallingThread) {
  for (const auto& [shape, parallel] : {std::pair<std::string, bool>{"f32[64,64]", false}, {"f32[1024,512]", true}}) {
    auto m = parseVerified(binaryFunction("add", shape, shape, shape));
    auto executor = CpuExecutor::create(*m->functions().front());
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    std::mt19937 rng(1);
    const TensorType type = m->functions().front()->argument(0)->type();
    auto compiled = (*executor)->compiledProgram({randomTensor(type, rng), randomTensor(type, rng)});
    ASSERT_TRUE(compiled) << compiled.error().str();
    const auto& steps = compiled->second->steps;
    ASSERT_EQ(steps.size(), 1u);
    EXPECT_EQ(steps[0].kind, Program::Step::Kind::Kernel);
    EXPECT_EQ(steps[0].parallel, parallel) << shape;
  }
}

TEST(CodegenTest, ThreadPoolCoversTheRangeOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 4, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n = " << n << ", i = " << i;
  }
}

}  // namespace
}  // namespace kiln
