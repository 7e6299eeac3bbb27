// The CUDA executor on the emulated GPU (test/devices/emulator/) with
// functions that run in stages (codegen/Stages.h): `if` and `loop` whose
// bodies are CUDA programs of their own, and a `nonzero` between compiled
// stages; results against the interpreter's. A staged function is not one
// program, so its memory plan and `.kc` are refused, naming the op.
#include <gtest/gtest.h>


#include "codegen/cuda/CudaExecutor.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaDevices.h"
#include "test/unit/ControlFlowTestSupport.h"
#include "test/unit/EmulatedGpu.h"

namespace kiln {
namespace {

using test::accumulateInputs;
using test::expectMatchesInterpreter;
using test::i64Scalar;
using test::parseVerified;
using test::tensorOf;

using test::emulatorContext;

TEST(CudaControlFlowTest, LoopBodiesRunAsCudaPrograms) {
  KILN_REQUIRE_EMULATOR();
  auto m = parseVerified(test::kAccumulateLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, emulatorContext());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  ASSERT_TRUE((*executor)->prepare(accumulateInputs(3, true, 100)).ok());
  expectMatchesInterpreter(**executor, f, accumulateInputs(3, true, 100), "three iterations");
  expectMatchesInterpreter(**executor, f, accumulateInputs(100, true, 6), "ended by the condition");
  expectMatchesInterpreter(**executor, f, accumulateInputs(0, true, 6), "no iteration");
  // The stages are not one program.
  auto plan = (*executor)->memoryPlan(accumulateInputs(3, true, 100));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message().find("has control flow (loop)"), std::string::npos) << plan.error().str();
  EXPECT_FALSE((*executor)->compiledProgram(accumulateInputs(3, true, 100)).ok());
}

TEST(CudaControlFlowTest, ControlFlowNestsInBodies) {
  KILN_REQUIRE_EMULATOR();
  auto m = parseVerified(test::kCollatzLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, emulatorContext());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto got = (*executor)->run({i64Scalar(100), i64Scalar(6)});
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[1]), test::kCollatzOf6);
  expectMatchesInterpreter(**executor, f, {i64Scalar(5), i64Scalar(27)}, "27, five steps");
}

TEST(CudaControlFlowTest, DataDependentOpsRunBetweenCudaStages) {
  KILN_REQUIRE_EMULATOR();
  auto m = parseVerified(test::kNonZeroBetweenStages);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, emulatorContext());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  for (const std::vector<double>& x : {std::vector<double>{1, 2, 3, 4, 5, 6}, std::vector<double>{0, 0, 0, 0, 0, 0}})
    expectMatchesInterpreter(**executor, f,
                             {tensorOf(DType::F32, {6}, x), tensorOf(DType::F32, {6}, {0, 3, 1, 5, -1, 2})}, "nonzero");
}

}  // namespace
}  // namespace kiln
