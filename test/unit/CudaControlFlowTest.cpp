// The CUDA executor on the emulated GPU (runtime/cuda/emulator/) with
// functions that run in stages (codegen/Stages.h): `if` and `loop` whose
// bodies are CUDA programs of their own, and a `nonzero` between compiled
// stages; results against the interpreter's. A staged function is not one
// program, so its memory plan and `.kc` are refused, naming the op.
#include <gtest/gtest.h>

#include <filesystem>

#include "codegen/cuda/CudaExecutor.h"
#include "runtime/Interpreter.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaDevices.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::parseVerified;
using test::tensorOf;

#define REQUIRE_EMULATOR()                                 \
  if (!std::filesystem::exists(KILN_CUDA_EMULATOR_DRIVER)) \
    GTEST_SKIP() << "the emulated GPU (" KILN_CUDA_EMULATOR_DRIVER ") is not built";

std::shared_ptr<cuda::CudaContext> context() {
  cuda::LibrarySearchOptions options;
  options.driverPath = KILN_CUDA_EMULATOR_DRIVER;
  auto device = cuda::requireCudaDevice(options, std::nullopt);
  EXPECT_TRUE(device) << device.error().message();
  if (!device) return nullptr;
  auto c = cuda::CudaContext::get(*device, options);
  EXPECT_TRUE(c) << c.error().message();
  return c ? *c : nullptr;
}

Tensor i64Scalar(int64_t v) { return tensorOf(DType::I64, {}, {static_cast<double>(v)}); }
Tensor boolScalar(bool v) { return tensorOf(DType::Bool, {}, {v ? 1.0 : 0.0}); }

/// Runs `f` on `inputs` on the emulated GPU and on the interpreter and
/// checks that they agree.
void expectMatchesInterpreter(codegen::CudaExecutor& executor, const Function& f, const std::vector<Tensor>& inputs,
                              const std::string& what) {
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << what << ": " << want.error().str();
  auto got = executor.run(inputs);
  ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
  ASSERT_EQ(got->size(), want->size()) << what;
  for (size_t r = 0; r < got->size(); ++r)
    test::expectClose((*got)[r], (*want)[r], what + ", result " + std::to_string(r));
}

/// A loop with a carried sum and two scan values, an op before it and one
/// after it (test/unit/CpuControlFlowTest.cpp has the same).
constexpr const char* kLoop = R"(
func @accumulate(%n: i64[], %go: bool[], %init: f32[2], %step: f32[2], %limit: f32[]) -> (f32[2], f32[?,2], i64[?]) {
  %start = mul(%init, %init) : f32[2]
  %sum, %rows, %iters = loop(%n, %go, %start, %step, %limit) {num_carried = 1} : f32[2], f32[?,2], i64[?] {
  ^(%i: i64[], %c: bool[], %acc: f32[2], %s: f32[2], %lim: f32[]) -> (bool[], f32[2], f32[2], i64[]):
    %next = add(%acc, %s) : f32[2]
    %total = reduce_sum(%next) {axes = [0]} : f32[]
    %more = lt(%total, %lim) : bool[]
    return %more, %next, %next, %i
  }
  %twice = add(%sum, %sum) : f32[2]
  return %twice, %rows, %iters
}
)";

TEST(CudaControlFlowTest, LoopBodiesRunAsCudaPrograms) {
  REQUIRE_EMULATOR();
  auto m = parseVerified(kLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, context());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto inputs = [](int64_t n, bool go, double limit) {
    return std::vector<Tensor>{i64Scalar(n), boolScalar(go), tensorOf(DType::F32, {2}, {0, 1}),
                               tensorOf(DType::F32, {2}, {1, 2}), tensorOf(DType::F32, {}, {limit})};
  };
  ASSERT_TRUE((*executor)->prepare(inputs(3, true, 100)).ok());
  expectMatchesInterpreter(**executor, f, inputs(3, true, 100), "three iterations");
  expectMatchesInterpreter(**executor, f, inputs(100, true, 6), "ended by the condition");
  expectMatchesInterpreter(**executor, f, inputs(0, true, 6), "no iteration");
  // The stages are not one program.
  auto plan = (*executor)->memoryPlan(inputs(3, true, 100));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message().find("has control flow (loop)"), std::string::npos) << plan.error().str();
  EXPECT_FALSE((*executor)->compiledProgram(inputs(3, true, 100)).ok());
}

/// A loop whose body holds an `if`: the Collatz sequence of %x.
constexpr const char* kNested = R"(
func @collatz(%n: i64[], %x: i64[]) -> (i64[], i64[?]) {
  %t = constant() {value = dense<bool[]>[true]} : bool[]
  %last, %seq = loop(%n, %t, %x) {num_carried = 1} : i64[], i64[?] {
  ^(%i: i64[], %k: bool[], %v: i64[]) -> (bool[], i64[], i64[]):
    %two = constant() {value = dense<i64[]>[2]} : i64[]
    %zero = constant() {value = dense<i64[]>[0]} : i64[]
    %one = constant() {value = dense<i64[]>[1]} : i64[]
    %r = mod(%v, %two) : i64[]
    %even = eq(%r, %zero) : bool[]
    %next = if(%even, %v) : i64[] {
    ^(%a: i64[]):
      %d = constant() {value = dense<i64[]>[2]} : i64[]
      %h = div(%a, %d) : i64[]
      return %h
    } {
    ^(%a: i64[]):
      %three = constant() {value = dense<i64[]>[3]} : i64[]
      %u = constant() {value = dense<i64[]>[1]} : i64[]
      %p = mul(%a, %three) : i64[]
      %q = add(%p, %u) : i64[]
      return %q
    }
    %more = gt(%next, %one) : bool[]
    return %more, %next, %next
  }
  return %last, %seq
}
)";

TEST(CudaControlFlowTest, ControlFlowNestsInBodies) {
  REQUIRE_EMULATOR();
  auto m = parseVerified(kNested);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, context());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto got = (*executor)->run({i64Scalar(100), i64Scalar(6)});
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[1]), (std::vector<double>{3, 10, 5, 16, 8, 4, 2, 1}));
  expectMatchesInterpreter(**executor, f, {i64Scalar(5), i64Scalar(27)}, "27, five steps");
}

TEST(CudaControlFlowTest, DataDependentOpsRunBetweenCudaStages) {
  REQUIRE_EMULATOR();
  auto m = parseVerified(
      "func @f(%x: f32[6], %w: f32[6]) -> (f32[?], i64[1,?], f32[6]) {\n"
      "  %d = sub(%x, %w) : f32[6]\n"
      "  %m = relu(%d) : f32[6]\n"
      "  %n = nonzero(%m) : i64[1,?]\n"
      "  %i = reshape(%n) : i64[?]\n"
      "  %g = gather(%x, %i) {axis = 0} : f32[?]\n"
      "  %e = exp(%g) : f32[?]\n"
      "  return %e, %n, %m\n}\n");
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, context());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  for (const std::vector<double>& x : {std::vector<double>{1, 2, 3, 4, 5, 6}, std::vector<double>{0, 0, 0, 0, 0, 0}})
    expectMatchesInterpreter(**executor, f,
                             {tensorOf(DType::F32, {6}, x), tensorOf(DType::F32, {6}, {0, 3, 1, 5, -1, 2})}, "nonzero");
}

}  // namespace
}  // namespace kiln
