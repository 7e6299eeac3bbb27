// The CUDA executor on the emulated GPU (test/devices/emulator/) with
// functions that run in stages (codegen/Stages.h): `if` and `loop` whose
// bodies are CUDA programs of their own, and a `nonzero` between compiled
// stages; results against the interpreter's. A staged function is not one
// program, so its memory plan is refused, naming the op; its `.kc` is a
// program with host steps whose parts are CUDA programs, run from the file
// (CudaExecutor::fromStaged and the runtime's CUDA loader) with nothing
// compiled.
#include <gtest/gtest.h>


#include "codegen/cuda/CudaExecutor.h"
#include "runtime/KcFile.h"
#include "runtime/StageDriver.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaProgram.h"
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

TEST(CudaControlFlowTest, AStagedKcRunsItsCudaPartsFromTheFile) {
  KILN_REQUIRE_EMULATOR();
  auto m = parseVerified(test::kCollatzLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, emulatorContext());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  const std::vector<Tensor> in = {i64Scalar(100), i64Scalar(6)};
  auto bytes = (*executor)->artifact(in);
  ASSERT_TRUE(bytes.ok()) << bytes.error().str();
  auto artifact = parseArtifact(*bytes, "collatz-cuda.kc");
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  EXPECT_EQ(artifact->device, cuda::kCudaDevice);
  ASSERT_TRUE(artifact->staged);
  // Each part carries its own CUDA code.
  ASSERT_FALSE(artifact->staged->programs.empty());
  for (const std::string& code : artifact->staged->deviceCode) EXPECT_FALSE(code.empty());
  auto stored = codegen::CudaExecutor::fromStaged(artifact->staged, emulatorContext());
  ASSERT_TRUE(stored.ok()) << stored.error().str();
  auto got = (*stored)->run(in);
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[1]), test::kCollatzOf6);
  expectMatchesInterpreter(**stored, f, {i64Scalar(5), i64Scalar(27)}, "27, five steps, from the file");
  // As the embedding API runs it: the runtime's stage driver over CudaRunners.
  auto parts = cuda::cudaPartsOf(*artifact->staged, "collatz-cuda.kc");
  ASSERT_TRUE(parts.ok()) << parts.error().str();
  auto runner = StagedRunner::create(artifact->staged, [&](size_t i) -> Expected<std::unique_ptr<LoadedProgram>> {
    auto part = cuda::CudaRunner::create((*parts)[i], emulatorContext(), {});
    if (!part) return part.takeError();
    return std::unique_ptr<LoadedProgram>(std::move(*part));
  });
  ASSERT_TRUE(runner.ok()) << runner.error().str();
  expectMatchesInterpreter(**runner, f, in, "collatz of 6, by the stage driver");
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
