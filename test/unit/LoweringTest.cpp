// The lowerings that closed the CPU JIT's gap to the interpreter on the ONNX
// conformance suite (docs/codegen.md section 2): scatter_elements with each
// reduction, conv_transpose, integer pow, max_pool on integers, f16/bf16
// computed in f32, and random_uniform/random_normal. Each runs through the CpuExecutor and must match the
// reference interpreter on the same inputs (random_uniform/normal bit for
// bit in f64: the samples are a function of seed and index); the run-time
// errors the
// interpreter reports (a scatter index out of range, a negative integer
// exponent) must be reported by the executor too.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/Lowering.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

using test::expectClose;
using test::parseVerified;

/// A tensor of `type` with values from `value(i)`.
template <typename Fn>
Tensor makeTensor(DType dtype, const std::vector<int64_t>& shape, Fn value) {
  Tensor t(dtype, shape);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    if (isFloat(dtype))
      t.setDouble(i, static_cast<double>(value(i)));
    else
      t.setInt(i, static_cast<int64_t>(value(i)));
  }
  return t;
}

Tensor randomFloats(DType dtype, const std::vector<int64_t>& shape, std::mt19937& rng) {
  std::uniform_real_distribution<double> real(-2.0, 2.0);
  return makeTensor(dtype, shape, [&](int64_t) { return real(rng); });
}

Tensor randomInts(DType dtype, const std::vector<int64_t>& shape, int64_t lo, int64_t hi, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> integer(lo, hi);
  return makeTensor(dtype, shape, [&](int64_t) { return integer(rng); });
}

/// Runs `text`'s function on the JIT (no fallback: prepare must succeed)
/// and on the interpreter, and compares: floats within atol 1e-5 + `rtol`
/// (1e-4, the bound; f16 gets one f16 ulp), integers exactly.
void expectJitMatchesInterpreter(const std::string& text, const std::vector<Tensor>& inputs, double rtol = 1e-4) {
  SCOPED_TRACE(text);
  auto m = parseVerified(text);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  auto executor = CpuExecutor::create(f, {.threads = 2});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  Status prepared = (*executor)->prepare(inputs);
  ASSERT_TRUE(prepared.ok()) << prepared.error().str();
  auto got = (*executor)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t r = 0; r < want->size(); ++r) expectClose((*got)[r], (*want)[r], "result " + std::to_string(r), rtol);
}

/// The error the JIT run gives for `inputs` (prepare must succeed), and
/// that the interpreter fails too.
std::string jitRunError(const std::string& text, const std::vector<Tensor>& inputs) {
  auto m = parseVerified(text);
  if (!m) return "";
  const Function& f = *m->functions().front();
  EXPECT_FALSE(interpret(f, inputs).ok()) << "the interpreter should refuse these inputs";
  auto executor = CpuExecutor::create(f, {.threads = 1});
  if (!executor) return "create: " + executor.error().str();
  Status prepared = (*executor)->prepare(inputs);
  EXPECT_TRUE(prepared.ok()) << prepared.error().str();
  auto got = (*executor)->run(inputs);
  return got ? "" : got.error().str();
}

std::string scatterFunction(const std::string& data, const std::string& indices, int axis,
                            const std::string& reduction) {
  const std::string type = "f32" + data;
  return "func @f(%d: " + type + ", %i: i64" + indices + ", %u: f32" + indices + ") -> " + type +
         " {\n  %y = scatter_elements(%d, %i, %u) {axis = " + std::to_string(axis) + ", reduction = \"" + reduction +
         "\"} : " + type + "\n  return %y\n}\n";
}

TEST(LoweringTest, ScatterElementsEveryReduction) {
  std::mt19937 rng(3);
  struct Case {
    std::vector<int64_t> data, indices;
    int axis;
  };
  // Duplicate and negative indices (the index range covers both), indices
  // smaller than data in the other dims, a negative axis.
  // The last cases walk runs of adjacent lines (the last dim when it is not
  // the axis), some of them beyond indices' last dim.
  const Case cases[] = {{{4, 5}, {3, 5}, 0},       {{4, 5}, {2, 7}, 1},       {{3, 4, 2}, {3, 2, 2}, -2},
                        {{6}, {9}, 0},             {{4, 6}, {3, 4}, 0},       {{2, 3, 8}, {2, 2, 5}, 1},
                        {{2, 5, 128}, {1, 7, 96}, 1}};
  auto dims = [](const std::vector<int64_t>& d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
    return s + "]";
  };
  for (const Case& c : cases)
    for (const char* reduction : {"none", "add", "mul", "max", "min"}) {
      const int64_t axis = c.axis < 0 ? c.axis + static_cast<int64_t>(c.data.size()) : c.axis;
      const int64_t dim = c.data[axis];
      std::vector<Tensor> in = {randomFloats(DType::F32, c.data, rng),
                                randomInts(DType::I64, c.indices, -dim, dim - 1, rng),
                                randomFloats(DType::F32, c.indices, rng)};
      expectJitMatchesInterpreter(scatterFunction(dims(c.data), dims(c.indices), c.axis, reduction), in);
    }
}

/// Data that is one repeated value (the zeros of a gather's gradient) is
/// stored by the kernel, not read: the result still starts from that value.
TEST(LoweringTest, ScatterElementsIntoASplatConstant) {
  std::mt19937 rng(5);
  std::string values;
  for (int i = 0; i < 4 * 6; ++i) values += (i ? ", " : "") + std::string("1.5");
  for (const char* reduction : {"none", "add", "max"}) {
    const std::string text = std::string("func @main(%i: i64[3,6], %u: f32[3,6]) -> f32[4,6] {\n") +
                             "  %z = constant() {value = dense<f32[4,6]>[" + values + "]} : f32[4,6]\n" +
                             "  %y = scatter_elements(%z, %i, %u) {axis = 0, reduction = \"" + reduction +
                             "\"} : f32[4,6]\n  return %y\n}\n";
    expectJitMatchesInterpreter(text, {randomInts(DType::I64, {3, 6}, -4, 3, rng), randomFloats(DType::F32, {3, 6}, rng)});
  }
}

TEST(LoweringTest, ScatterElementsNoneLastDuplicateWins) {
  // Indices [1, 1, 1] along axis 0: the interpreter writes updates in order,
  // so the last one (30) lands at position 1.
  const std::string text = scatterFunction("[3]", "[3]", 0, "none");
  const Tensor data = makeTensor(DType::F32, {3}, [](int64_t i) { return i; });
  const Tensor indices = makeTensor(DType::I64, {3}, [](int64_t) { return 1; });
  const Tensor updates = makeTensor(DType::F32, {3}, [](int64_t i) { return 10 * (i + 1); });
  expectJitMatchesInterpreter(text, {data, indices, updates});
  auto m = parseVerified(text);
  auto executor = CpuExecutor::create(*m->functions().front(), {.threads = 1});
  ASSERT_TRUE(executor.ok());
  auto got = (*executor)->run({data, indices, updates});
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ((*got)[0].getDouble(0), 0.0);
  EXPECT_EQ((*got)[0].getDouble(1), 30.0);
  EXPECT_EQ((*got)[0].getDouble(2), 2.0);
}

TEST(LoweringTest, ScatterElementsIntegers) {
  std::mt19937 rng(5);
  for (const char* reduction : {"none", "add", "mul", "max", "min"}) {
    const std::string text = std::string("func @f(%d: i32[4,3], %i: i64[4,3], %u: i32[4,3]) -> i32[4,3] {\n") +
                             "  %y = scatter_elements(%d, %i, %u) {axis = 1, reduction = \"" + reduction +
                             "\"} : i32[4,3]\n  return %y\n}\n";
    expectJitMatchesInterpreter(text, {randomInts(DType::I32, {4, 3}, -9, 9, rng),
                                       randomInts(DType::I64, {4, 3}, -3, 2, rng),
                                       randomInts(DType::I32, {4, 3}, -9, 9, rng)});
  }
}

TEST(LoweringTest, ScatterElementsIndexOutOfRangeIsAnError) {
  const std::string text = scatterFunction("[3]", "[2]", 0, "none");
  const Tensor data = makeTensor(DType::F32, {3}, [](int64_t) { return 0; });
  const Tensor indices = makeTensor(DType::I64, {2}, [](int64_t i) { return i == 0 ? 0 : 3; });
  const Tensor updates = makeTensor(DType::F32, {2}, [](int64_t) { return 1; });
  const std::string error = jitRunError(text, {data, indices, updates});
  EXPECT_NE(error.find("index 3 is out of range for dim 0 of size 3"), std::string::npos) << error;
}

TEST(LoweringTest, ConvTranspose) {
  std::mt19937 rng(11);
  // x, w, result type, attributes, bias. Result dims: (in - 1) * stride -
  // pads + dilation * (k - 1) + 1 + output_padding.
  struct Case {
    std::vector<int64_t> x, w, out;
    std::string attrs;
    bool bias;
  };
  const Case cases[] = {
      {{1, 1, 3, 3}, {1, 2, 3, 3}, {1, 2, 5, 5}, "", false},
      {{2, 3, 4}, {3, 2, 3}, {2, 2, 9}, "{strides = [2]}", true},
      {{1, 2, 3, 3}, {2, 3, 3, 3}, {1, 3, 6, 6}, "{strides = [2, 2], pads = [1, 1, 1, 1], output_padding = [1, 1]}",
       true},
      {{1, 1, 3, 3}, {1, 2, 2, 2}, {1, 2, 5, 5}, "{dilations = [2, 2], strides = [1, 1]}", false},
      {{1, 4, 3, 2}, {4, 1, 2, 2}, {1, 2, 6, 4}, "{groups = 2, strides = [2, 2]}", true},
      {{1, 1, 2, 2, 2}, {1, 2, 2, 2, 2}, {1, 2, 4, 4, 4}, "{strides = [2, 2, 2]}", false},
  };
  auto type = [](const std::vector<int64_t>& d) {
    std::string s = "f32[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
    return s + "]";
  };
  for (const Case& c : cases) {
    const std::string bias = c.bias ? ", %b: f32[" + std::to_string(c.out[1]) + "]" : "";
    const std::string text = "func @f(%x: " + type(c.x) + ", %w: " + type(c.w) + bias + ") -> " + type(c.out) +
                             " {\n  %y = conv_transpose(%x, %w" + (c.bias ? ", %b" : "") + ") " + c.attrs + " : " +
                             type(c.out) + "\n  return %y\n}\n";
    std::vector<Tensor> in = {randomFloats(DType::F32, c.x, rng), randomFloats(DType::F32, c.w, rng)};
    if (c.bias) in.push_back(randomFloats(DType::F32, {c.out[1]}, rng));
    expectJitMatchesInterpreter(text, in);
  }
}

TEST(LoweringTest, IntegerPow) {
  std::mt19937 rng(13);
  for (const char* t : {"i64", "i32", "i16", "i8", "u8"}) {
    const std::string a = std::string(t) + "[3,5]", b = std::string(t) + "[5]";
    const DType dtype = *parseDType(t);
    const int64_t lo = dtype == DType::U8 ? 0 : -7;
    // Exponents up to 40 overflow every width: wrapping must agree too.
    std::vector<Tensor> in = {randomInts(dtype, {3, 5}, lo, 7, rng),
                              makeTensor(dtype, {5}, [](int64_t i) { return std::vector<int64_t>{0, 1, 3, 7, 40}[i]; })};
    expectJitMatchesInterpreter("func @f(%a: " + a + ", %b: " + b + ") -> " + a + " {\n  %y = pow(%a, %b) : " + a +
                                    "\n  return %y\n}\n",
                                in);
  }
}

TEST(LoweringTest, IntegerPowNegativeExponentIsAnError) {
  const std::string text = "func @f(%a: i64[2], %b: i64[2]) -> i64[2] {\n  %y = pow(%a, %b) : i64[2]\n  return %y\n}\n";
  const Tensor a = makeTensor(DType::I64, {2}, [](int64_t) { return 2; });
  const Tensor b = makeTensor(DType::I64, {2}, [](int64_t i) { return i == 0 ? 3 : -1; });
  const std::string error = jitRunError(text, {a, b});
  EXPECT_NE(error.find("integer pow with a negative exponent"), std::string::npos) << error;
}

TEST(LoweringTest, MaxPoolOnIntegers) {
  std::mt19937 rng(17);
  // Padding must never win, also when every element is below zero.
  for (const char* t : {"u8", "i8", "i32", "i64"}) {
    const DType dtype = *parseDType(t);
    const std::string x = std::string(t) + "[1,2,5,5]", y = std::string(t) + "[1,2,3,3]";
    const std::string text = "func @f(%x: " + x + ") -> " + y +
                             " {\n  %y = max_pool(%x) {kernel = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} : " +
                             y + "\n  return %y\n}\n";
    expectJitMatchesInterpreter(text, {randomInts(dtype, {1, 2, 5, 5}, dtype == DType::U8 ? 0 : -100, 100, rng)});
    if (dtype != DType::U8)
      expectJitMatchesInterpreter(text, {randomInts(dtype, {1, 2, 5, 5}, -100, -1, rng)});
  }
}

TEST(LoweringTest, HalfPrecisionComputesInF32) {
  std::mt19937 rng(19);
  // Casts in and out of f16 and bf16, from f64 and integers too.
  for (const char* from : {"f32", "f64", "i32", "f16", "bf16"})
    for (const char* to : {"f16", "bf16", "f32", "f64", "i64"}) {
      if (std::string(from) == to) continue;
      const std::string a = std::string(from) + "[4,6]", r = std::string(to) + "[4,6]";
      const DType dtype = *parseDType(from);
      Tensor x = isFloat(dtype) ? makeTensor(dtype, {4, 6}, [&](int64_t i) { return (i - 12) * 37.3 + 0.1234567; })
                                : randomInts(dtype, {4, 6}, -5000, 5000, rng);
      expectJitMatchesInterpreter(
          "func @f(%x: " + a + ") -> " + r + " {\n  %y = cast(%x) : " + r + "\n  return %y\n}\n", {x}, 0);
    }
  // Arithmetic: each op rounds its result to f16 once, as the interpreter.
  for (const char* t : {"f16", "bf16"}) {
    const DType dtype = *parseDType(t);
    const std::string a = std::string(t) + "[3,8]";
    for (const char* op : {"add", "mul", "div", "max", "min", "rem"})
      expectJitMatchesInterpreter("func @f(%a: " + a + ", %b: " + a + ") -> " + a + " {\n  %y = " + op +
                                      "(%a, %b) : " + a + "\n  return %y\n}\n",
                                  {randomFloats(dtype, {3, 8}, rng), randomFloats(dtype, {3, 8}, rng)}, 0);
    // exp's f32 result may round to the neighbouring f16/bf16 value.
    expectJitMatchesInterpreter("func @f(%a: " + a + ") -> " + a + " {\n  %y = exp(%a) : " + a +
                                    "\n  return %y\n}\n",
                                {randomFloats(dtype, {3, 8}, rng)}, dtype == DType::F16 ? 1e-3 : 8e-3);
    const std::string r = std::string(t) + "[3]";
    expectJitMatchesInterpreter("func @f(%a: " + a + ") -> " + r + " {\n  %y = reduce_sum(%a) {axes = [1]} : " + r +
                                    "\n  return %y\n}\n",
                                {randomFloats(dtype, {3, 8}, rng)}, dtype == DType::F16 ? 1e-3 : 8e-3);
  }
}

TEST(LoweringTest, HalfPrecisionSpecialValues) {
  // NaN, infinities, overflow to inf and the smallest subnormals survive
  // the f32 round trip as the interpreter's conversions give them.
  const double values[] = {NAN, INFINITY, -INFINITY, 70000.0, -70000.0, 6e-8, 3e-8, 1e-40, 0.0, -0.0, 65504.0};
  const Tensor x = makeTensor(DType::F32, {11}, [&](int64_t i) { return values[i]; });
  for (const char* to : {"f16", "bf16"})
    expectJitMatchesInterpreter(std::string("func @f(%x: f32[11]) -> ") + to + "[11] {\n  %y = cast(%x) : " + to +
                                    "[11]\n  return %y\n}\n",
                                {x}, 0);
}

TEST(LoweringTest, RandomSamplesAreTheInterpreters) {
  // Odd element counts (normal pairs elements), several seeds (0, negative,
  // large), f32 and f64; rtol 0 on f64: the same bits, up to libm.
  for (const char* type : {"f64[3,5]", "f32[7]", "f64[]"})
    for (int64_t seed : {int64_t{0}, int64_t{42}, int64_t{-7}, int64_t{1} << 40}) {
      const std::string t = type, s = std::to_string(seed);
      const double rtol = t.starts_with("f64") ? 1e-15 : 0;
      expectJitMatchesInterpreter("func @f() -> " + t + " {\n  %y = random_uniform() {low = -3.0, high = 5.0, seed = " +
                                      s + "} : " + t + "\n  return %y\n}\n",
                                  {}, rtol);
      expectJitMatchesInterpreter("func @f() -> " + t + " {\n  %y = random_normal() {mean = 1.0, std = 2.0, seed = " +
                                      s + "} : " + t + "\n  return %y\n}\n",
                                  {}, t.starts_with("f64") ? 1e-12 : 1e-6);
    }
  // Inside arithmetic, as dropout's mask would use it.
  expectJitMatchesInterpreter(
      "func @f(%x: f32[4,6]) -> f32[4,6] {\n  %r = random_uniform() {seed = 9} : f32[4,6]\n"
      "  %y = mul(%x, %r) : f32[4,6]\n  return %y\n}\n",
      {makeTensor(DType::F32, {4, 6}, [](int64_t i) { return i - 7.5; })});
}

}  // namespace
}  // namespace kiln
