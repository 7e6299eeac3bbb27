// ir/ScalarSemantics.h, the one definition of Kiln's scalar rules, checked
// where it runs: the same ops on the same edge inputs (NaN and signed zeros
// for max and min, infinities, INT_MIN / -1 and INT_MIN % -1, negative
// operands of mod and rem, integer overflow, halfway cases of round, pow
// with integer exponents, out-of-range float-to-integer casts) through the
// interpreter, the CPU JIT (LLVM, the header linked in as bitcode) and the
// CUDA emitter's C++ (the header as its prelude) compiled as host code and
// run on an emulated grid. Each result is compared with values written here
// by hand, not only with the other backends, and float results bit for bit
// in the sign of zero. A zero divisor is an error on the interpreter and the
// CPU executor, which check on the host first; the kernels themselves give
// 0, which the CUDA kernel and the header's functions show.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaBackend.h"
#include "codegen/cuda/CudaEmitter.h"
#include "ir/ScalarSemantics.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::buildCudaHostLibrary;
using test::parseVerified;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

Tensor floats(DType dtype, const std::vector<double>& values) {
  Tensor t(dtype, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.setDouble(static_cast<int64_t>(i), values[i]);
  return t;
}

Tensor ints(DType dtype, const std::vector<int64_t>& values) {
  Tensor t(dtype, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.setInt(static_cast<int64_t>(i), values[i]);
  return t;
}

/// One op on edge inputs and its result, written by hand.
struct EdgeCase {
  std::string op;
  std::vector<Tensor> inputs;
  Tensor expected;

  /// `func @f(%a: T[n], ...) -> R[n]` applying `op` to the inputs.
  std::string text() const {
    std::string params, operands;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string name = "%a" + std::to_string(i);
      params += (i ? ", " : "") + name + ": " + inputs[i].type().str();
      operands += (i ? ", " : "") + name;
    }
    const std::string result = expected.type().str();
    return "func @f(" + params + ") -> " + result + " {\n  %y = " + op + "(" + operands + ") : " + result +
           "\n  return %y\n}\n";
  }
};

std::vector<EdgeCase> edgeCases() {
  std::vector<EdgeCase> cases;
  for (DType t : {DType::F32, DType::F64}) {
    // NaN wins either way; of two equal values (0 and -0) the second.
    const Tensor a = floats(t, {kNaN, 1, 0, -0.0, kInf, -kInf, 2});
    const Tensor b = floats(t, {1, kNaN, -0.0, 0, -kInf, 3, 2});
    cases.push_back({"max", {a, b}, floats(t, {kNaN, kNaN, -0.0, 0, kInf, 3, 2})});
    cases.push_back({"min", {a, b}, floats(t, {kNaN, kNaN, -0.0, 0, -kInf, -kInf, 2})});
    // rem has the dividend's sign (C's fmod), mod the divisor's (Python's
    // %: -1 mod inf is inf); a zero result keeps the dividend's sign.
    const Tensor x = floats(t, {5.5, -5.5, 5.5, -5.5, -0.0, kInf, 1, -1, 3});
    const Tensor y = floats(t, {2, 2, -2, -2, 3, 2, kInf, kInf, 0});
    cases.push_back({"rem", {x, y}, floats(t, {1.5, -1.5, 1.5, -1.5, -0.0, kNaN, 1, -1, kNaN})});
    cases.push_back({"mod", {x, y}, floats(t, {1.5, 0.5, -0.5, -1.5, -0.0, kNaN, 1, kInf, kNaN})});
    cases.push_back({"round",
                     {floats(t, {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.25, -3.75, -0.0, kNaN, kInf})},
                     floats(t, {0, 2, 2, -0.0, -2, -2, 2, -4, -0.0, kNaN, kInf})});
    const Tensor s = floats(t, {kNaN, -0.0, 0, -3, 2, -kInf, kInf});
    cases.push_back({"sign", {s}, floats(t, {kNaN, -0.0, 0, -1, 1, -1, 1})});
    cases.push_back({"relu", {s}, floats(t, {kNaN, 0, 0, 0, 2, 0, kInf})});
    cases.push_back({"pow",
                     {floats(t, {2, -2, -2, 0, 0, kNaN, 1, 0.5}), floats(t, {10, 3, 2, 0, -1, 0, kNaN, -2})},
                     floats(t, {1024, -8, 4, 1, kInf, 1, 1, 4})});
    // To integers: truncation toward zero into int64, NaN 0, saturation at
    // int64's ends, then the low bits (3e9 wraps in i32; int64's maximum is
    // -1 in i32, its minimum 0).
    cases.push_back({"cast",
                     {floats(t, {kNaN, kInf, -kInf, 1e20, -1e20, 2.9, -2.9, 3e9, -0.5})},
                     ints(DType::I32, {0, -1, 0, -1, 0, 2, -2, -1294967296, 0})});
    cases.push_back(
        {"cast", {floats(t, {kNaN, kInf, -kInf, 1e20, -2.5})}, ints(DType::I64, {0, kI64Max, kI64Min, kI64Max, -2})});
  }

  struct IntType {
    DType dtype;
    int64_t min, max;
  };
  for (IntType it : {IntType{DType::I32, kI32Min, kI32Max}, IntType{DType::I64, kI64Min, kI64Max}}) {
    const DType t = it.dtype;
    const int64_t lo = it.min, hi = it.max;
    // INT_MIN / -1 wraps to INT_MIN and INT_MIN % -1 is 0: no trap.
    cases.push_back({"div",
                     {ints(t, {lo, 7, -7, 7, -7, 0, hi}), ints(t, {-1, 2, 2, -2, -2, 3, -1})},
                     ints(t, {lo, 3, -3, -3, 3, 0, -hi})});
    const Tensor x = ints(t, {lo, 7, -7, 7, -7, 0, lo});
    const Tensor y = ints(t, {-1, 2, 2, -2, -2, 3, 3});
    cases.push_back({"rem", {x, y}, ints(t, {0, 1, -1, 1, -1, 0, -2})});
    cases.push_back({"mod", {x, y}, ints(t, {0, 1, 1, -1, -1, 0, 1})});
    // + - * and negation wrap.
    cases.push_back({"add", {ints(t, {hi, lo, -1, 5}), ints(t, {1, -1, 1, -7})}, ints(t, {lo, hi, 0, -2})});
    cases.push_back({"sub", {ints(t, {lo, hi, 0}), ints(t, {1, -1, lo})}, ints(t, {hi, lo, lo})});
    cases.push_back({"neg", {ints(t, {lo, hi, 0, -5})}, ints(t, {lo, -hi, 0, 5})});
    cases.push_back({"abs", {ints(t, {lo, -5, 5})}, ints(t, {lo, 5, 5})});
  }
  cases.push_back({"mul",
                   {ints(DType::I32, {65536, kI32Min, 46341, -3}), ints(DType::I32, {65536, -1, 46341, 5})},
                   ints(DType::I32, {0, kI32Min, -2147479015, -15})});
  cases.push_back({"mul",
                   {ints(DType::I64, {int64_t{1} << 32, kI64Min, 3037000500, -3}),
                    ints(DType::I64, {int64_t{1} << 32, -1, 3037000500, 5})},
                   ints(DType::I64, {0, kI64Min, -9223372036709301616, -15})});
  // Pow by squaring, wrapping: 2^31 is INT32_MIN, 3^21 wraps in i32, 3^40
  // in i64.
  cases.push_back({"pow",
                   {ints(DType::I32, {2, -2, 3, 0, 0, 7, -1, 2, 3}), ints(DType::I32, {10, 3, 0, 0, 5, 1, 7, 31, 21})},
                   ints(DType::I32, {1024, -8, 1, 1, 0, 7, -1, kI32Min, 1870418611})});
  cases.push_back({"pow",
                   {ints(DType::I64, {2, -2, 3, 5}), ints(DType::I64, {63, 63, 40, 30})},
                   ints(DType::I64, {kI64Min, kI64Min, -6289078614652622815, 8985370930000934825})});
  // Narrow types wrap at their own width.
  cases.push_back({"add", {ints(DType::I8, {127, -128}), ints(DType::I8, {1, -1})}, ints(DType::I8, {-128, 127})});
  cases.push_back({"mul", {ints(DType::I8, {-128, 16}), ints(DType::I8, {-1, 16})}, ints(DType::I8, {-128, 0})});
  cases.push_back({"div", {ints(DType::I8, {-128, -7}), ints(DType::I8, {-1, 2})}, ints(DType::I8, {-128, -3})});
  cases.push_back({"sub", {ints(DType::U8, {0, 255}), ints(DType::U8, {1, 255})}, ints(DType::U8, {255, 0})});
  cases.push_back({"add", {ints(DType::U8, {255, 200}), ints(DType::U8, {1, 100})}, ints(DType::U8, {0, 44})});
  return cases;
}

/// Fails unless `got` is `want`: same dtype and shape, integers equal,
/// floats equal with the same sign (so -0 is not 0), NaN matching NaN.
void expectSame(const Tensor& got, const Tensor& want, const std::string& backend) {
  ASSERT_EQ(got.type().str(), want.type().str()) << backend;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    if (!isFloat(want.dtype())) {
      EXPECT_EQ(got.getInt(i), want.getInt(i)) << backend << ", element " << i;
      continue;
    }
    const double g = got.getDouble(i), w = want.getDouble(i);
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << backend << ", element " << i << ": " << g << ", expected NaN";
    } else {
      EXPECT_EQ(g, w) << backend << ", element " << i;
      EXPECT_EQ(std::signbit(g), std::signbit(w)) << backend << ", element " << i << ": " << g << ", expected " << w;
    }
  }
}

TEST(ScalarSemanticsTest, Interpreter) {
  for (const EdgeCase& c : edgeCases()) {
    SCOPED_TRACE(c.text());
    auto m = parseVerified(c.text());
    ASSERT_NE(m, nullptr);
    auto got = interpret(*m->functions().front(), c.inputs);
    ASSERT_TRUE(got.ok()) << got.error().str();
    expectSame(got->front(), c.expected, "interpreter");
  }
}

TEST(ScalarSemanticsTest, CpuJit) {
  for (const EdgeCase& c : edgeCases()) {
    SCOPED_TRACE(c.text());
    auto m = parseVerified(c.text());
    ASSERT_NE(m, nullptr);
    auto executor = codegen::CpuExecutor::create(*m->functions().front());
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    auto got = (*executor)->run(c.inputs);
    ASSERT_TRUE(got.ok()) << got.error().str();
    expectSame(got->front(), c.expected, "CPU JIT");
  }
}

/// `kernels` of `f` run on the host build of their CUDA C++ (`library`).
Tensor runOnEmulatedGrid(void* library, const std::vector<kir::Kernel>& kernels, const Function& f,
                         const std::vector<Tensor>& inputs) {
  std::map<std::string, Tensor> values;
  for (size_t i = 0; i < inputs.size(); ++i) values[f.argument(i)->name()] = inputs[i];
  return test::runKernelsOnHost(library, kernels, values);
}

TEST(ScalarSemanticsTest, CudaEmitterOnEmulatedGrid) {
  // Every case's kernels in one translation unit, compiled once.
  const std::vector<EdgeCase> cases = edgeCases();
  std::vector<std::unique_ptr<Module>> modules;
  std::vector<std::vector<kir::Kernel>> kernels;
  std::vector<kir::Kernel> all;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].text());
    modules.push_back(parseVerified(cases[i].text()));
    ASSERT_NE(modules.back(), nullptr);
    const Function& f = *modules.back()->functions().front();
    std::vector<TensorType> types;
    for (const Tensor& t : cases[i].inputs) types.push_back(t.type());
    auto lowered = codegen::lowerToKernels(f, types, codegen::cudaBackend(), 3);
    ASSERT_TRUE(lowered.ok()) << lowered.error().str();
    for (kir::Kernel& k : *lowered) k.name = "case" + std::to_string(i) + "_" + k.name;
    kernels.push_back(*lowered);
    all.insert(all.end(), lowered->begin(), lowered->end());
  }
  auto source = codegen::emitCudaSource(all);
  ASSERT_TRUE(source.ok()) << source.error().str();
  void* library = buildCudaHostLibrary(source->code);
  ASSERT_NE(library, nullptr);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].text());
    const Tensor got = runOnEmulatedGrid(library, kernels[i], *modules[i]->functions().front(), cases[i].inputs);
    expectSame(got, cases[i].expected, "CUDA C++ on the host");
  }
  dlclose(library);
}

/// Integer division, remainder and mod by zero: the interpreter and the CPU
/// executor report it before computing; a kernel (here the CUDA one, and
/// the header's functions that every kernel calls) gives 0 instead of
/// trapping.
TEST(ScalarSemanticsTest, ZeroDivisors) {
  const Tensor x = ints(DType::I32, {7, -7, kI32Min});
  const Tensor zero = ints(DType::I32, {0, 0, 0});
  for (const char* op : {"div", "rem", "mod"}) {
    const EdgeCase c{op, {x, zero}, ints(DType::I32, {0, 0, 0})};
    SCOPED_TRACE(c.text());
    auto m = parseVerified(c.text());
    ASSERT_NE(m, nullptr);
    const Function& f = *m->functions().front();
    const std::string message = std::string(op) == "div" ? "integer division by zero" : "integer remainder by zero";
    auto interpreted = interpret(f, c.inputs);
    ASSERT_FALSE(interpreted.ok());
    EXPECT_NE(interpreted.error().message().find(message), std::string::npos) << interpreted.error().str();
    auto executor = codegen::CpuExecutor::create(f);
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    auto compiled = (*executor)->run(c.inputs);
    ASSERT_FALSE(compiled.ok());
    EXPECT_NE(compiled.error().message().find(message), std::string::npos) << compiled.error().str();

    auto kernels = codegen::lowerToKernels(f, {x.type(), zero.type()}, codegen::cudaBackend(), 3);
    ASSERT_TRUE(kernels.ok()) << kernels.error().str();
    auto source = codegen::emitCudaSource(*kernels);
    ASSERT_TRUE(source.ok()) << source.error().str();
    void* library = buildCudaHostLibrary(source->code);
    ASSERT_NE(library, nullptr);
    expectSame(runOnEmulatedGrid(library, *kernels, f, c.inputs), c.expected, "CUDA C++ on the host");
    dlclose(library);
  }
  EXPECT_EQ(kiln_idiv(int32_t{7}, int32_t{0}), 0);
  EXPECT_EQ(kiln_irem(int64_t{-7}, int64_t{0}), 0);
  EXPECT_EQ(kiln_imod(int8_t{-7}, int8_t{0}), 0);
  EXPECT_EQ(kiln_idiv(uint8_t{200}, uint8_t{0}), 0);
  // The unsigned types have no -1: 200 / 255 is 0, not -200.
  EXPECT_EQ(kiln_idiv(uint8_t{200}, uint8_t{255}), 0);
  EXPECT_EQ(kiln_imod(uint8_t{200}, uint8_t{255}), 200);
}

}  // namespace
}  // namespace kiln
