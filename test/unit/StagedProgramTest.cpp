// Programs that carry host steps (runtime/Program.h StagedProgram): a
// function with `if`, `loop` or a data-dependent op compiled whole
// (codegen/Stages.h compileStagedProgram) into a `.kc`, read back and run
// by the runtime's loader (runtime/ProgramLoaders.h, runtime/StageDriver.h)
// with nothing compiled, against the interpreter; nested control flow (an
// `if` in a loop body) as stages of stages; validate() and the reader on
// corrupt stages (out-of-range sub-programs, cycles, stage values, every
// truncation); the compile-time refusals of parts whose shapes are known
// only at run time, and the run-time error of a stored part given other
// shapes.
#include <gtest/gtest.h>

#include "codegen/cpu/CpuExecutable.h"
#include "runtime/KcFile.h"
#include "runtime/ProgramLoaders.h"
#include "runtime/StageDriver.h"
#include "test/unit/ControlFlowTestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;
using test::accumulateInputs;
using test::expectMatchesInterpreter;
using test::i64Scalar;
using test::kAccumulateLoop;
using test::parseVerified;
using test::tensorOf;

/// The `.kc` bytes of `source` compiled for `inputs`' shapes by the CPU
/// executor.
Expected<std::string> kcOf(const Function& f, const std::vector<Tensor>& inputs) {
  auto executor = CpuExecutor::create(f, {.threads = 1});
  if (!executor) return executor.takeError();
  return (*executor)->artifact(inputs);
}

Expected<CompiledArtifact> stagedArtifact(const char* ir, const std::vector<Tensor>& inputs,
                                          std::unique_ptr<Module>& module) {
  module = parseVerified(ir);
  if (!module) return Error("the test's IR does not parse");
  auto bytes = kcOf(*module->functions().front(), inputs);
  if (!bytes) return bytes.takeError();
  return parseArtifact(*bytes, "staged.kc");
}

TEST(StagedProgramTest, ALoopCompilesIntoOneKcThatRunsLikeTheInterpreter) {
  std::unique_ptr<Module> m;
  auto artifact = stagedArtifact(kAccumulateLoop, accumulateInputs(3, true, 100), m);
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  ASSERT_TRUE(artifact->staged) << "a function with a loop stores a staged program";
  EXPECT_FALSE(artifact->program);
  const StagedProgram& staged = *artifact->staged;
  // The loop's prefix (mul), its body and its suffix (add), each a program.
  EXPECT_EQ(staged.programs.size(), 3u);
  ASSERT_EQ(staged.stages.size(), 1u);
  ASSERT_EQ(staged.stages[0].host.size(), 1u);
  EXPECT_EQ(staged.stages[0].host[0].kind, OpKind::Loop);
  EXPECT_EQ(staged.stages[0].host[0].numCarried, 1);
  // The scan stacks' lengths are known only at run time.
  ASSERT_EQ(staged.resultTypes.size(), 3u);
  EXPECT_EQ(staged.resultTypes[0].str(), "f32[2]");
  EXPECT_FALSE(staged.resultTypes[1].isStatic());

  auto loaded = loadProgram(*artifact, "staged.kc", {.threads = 1});
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  const Function& f = *m->functions().front();
  expectMatchesInterpreter(**loaded, f, accumulateInputs(3, true, 100), "three iterations");
  expectMatchesInterpreter(**loaded, f, accumulateInputs(100, true, 6), "ends by its condition");
  expectMatchesInterpreter(**loaded, f, accumulateInputs(5, false, 100), "no iteration");

  // Its module is the function with its loop, for the interpreter.
  auto module = artifactModule(*artifact, "staged.kc");
  ASSERT_TRUE(module.ok()) << module.error().str();
  EXPECT_EQ((*module)->functions().front()->numArguments(), 5u);
}

TEST(StagedProgramTest, AnIfInALoopBodyIsStagesOfStages) {
  std::unique_ptr<Module> m;
  const std::vector<Tensor> in = {i64Scalar(20), i64Scalar(6)};
  auto artifact = stagedArtifact(test::kCollatzLoop, in, m);
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  ASSERT_TRUE(artifact->staged);
  EXPECT_GE(artifact->staged->stages.size(), 2u) << "the body's `if` is a staged part of its own";
  auto loaded = loadProgram(*artifact, "collatz.kc", {.threads = 1});
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  auto got = (*loaded)->run(in);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[1].numElements(), static_cast<int64_t>(test::kCollatzOf6.size()));
  expectMatchesInterpreter(**loaded, *m->functions().front(), in, "collatz of 6");
  expectMatchesInterpreter(**loaded, *m->functions().front(), {i64Scalar(3), i64Scalar(27)}, "three steps of 27");
}

TEST(StagedProgramTest, SerializationRoundTripsAndValidateRefusesBadIndices) {
  std::unique_ptr<Module> m;
  auto artifact = stagedArtifact(kAccumulateLoop, accumulateInputs(3, true, 100), m);
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  const StagedProgram& good = *artifact->staged;
  const std::string bytes = serializeStagedProgram(good);
  StagedProgram back;
  ASSERT_TRUE(parseStagedProgram(bytes, "stages", back).ok());
  ASSERT_TRUE(back.validate().ok());
  EXPECT_EQ(serializeStagedProgram(back), bytes);

  auto refused = [&](const std::function<void(StagedProgram&)>& damage, const std::string& message,
                     bool storable = true) {
    StagedProgram bad = good;
    damage(bad);
    Status s = bad.validate();
    ASSERT_FALSE(s.ok()) << "accepted: " << message;
    EXPECT_NE(s.error().message().find(message), std::string::npos) << s.error().str();
    // Written and read back, the reader refuses it the same way.
    if (!storable) return;
    StagedProgram read;
    Status parsed = parseStagedProgram(serializeStagedProgram(bad), "stages", read);
    EXPECT_TRUE(!parsed.ok() || !read.validate().ok());
  };
  refused([](StagedProgram& p) { p.stages[0].host[0].bodies[0] = 99; }, "is no sub-program");
  refused([](StagedProgram& p) { p.stages[0].host[0].bodies[0] = 0; }, "is no sub-program");  // itself: a cycle
  refused([](StagedProgram& p) { p.stages[0].host[0].bodies.clear(); }, "has 0 bodies, expected 1");
  refused([](StagedProgram& p) { p.stages[0].prefix = 42; }, "its prefix is no sub-program");
  refused([](StagedProgram& p) { p.stages[0].results[0] = {StageValue::From::Suffix, 7, 0}; }, "refers to no value");
  refused([](StagedProgram& p) { p.stages[0].host[0].operands[0] = {StageValue::From::Host, 0, 0}; },
          "refers to no value");  // a step reading its own result
  refused([](StagedProgram& p) { p.stages[0].suffixInputs[0] = {StageValue::From::Argument, 5, 0}; },
          "refers to no value");
  refused([](StagedProgram& p) { p.parts[1].index = 9; }, "refers to no program or stages");
  refused([](StagedProgram& p) { p.parts[0].kind = StagedProgram::Part::Kind::Program; }, "first part");
  // (The bytes hold one code object per program, however many there are.)
  refused([](StagedProgram& p) { p.deviceCode.pop_back(); }, "code objects", false);
  refused([](StagedProgram& p) { p.stages[0].host[0].numCarried = 9; }, "carries 9 values");

  // Every truncation of the stages is an error, never a crash.
  for (size_t size = 0; size < bytes.size(); size += (size < 400 ? 1 : 61)) {
    StagedProgram cut;
    EXPECT_FALSE(parseStagedProgram(std::string_view(bytes).substr(0, size), "stages", cut).ok()) << size;
  }
}

/// Stages parts chained `n` deep, each the prefix of the one before.
StagedProgram chainOf(size_t n) {
  StagedProgram p;
  p.name = "chain";
  for (size_t i = 0; i < n; ++i) {
    p.parts.push_back({StagedProgram::Part::Kind::Stages, i});
    Stages s;
    s.name = "chain" + std::to_string(i);
    if (i + 1 < n) s.prefix = static_cast<int>(i + 1);
    p.stages.push_back(std::move(s));
  }
  return p;
}

TEST(StagedProgramTest, StagesNestAtMostTheBoundDeep) {
  EXPECT_TRUE(chainOf(kMaxStageDepth).validate().ok());
  Status deep = chainOf(kMaxStageDepth + 1).validate();
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.error().message().find("nest more than " + std::to_string(kMaxStageDepth) + " deep"), std::string::npos) << deep.error().str();
  // The deepest chain allowed runs (each level returns nothing).
  auto runner = StagedRunner::create(std::make_shared<StagedProgram>(chainOf(kMaxStageDepth)),
                                     [](size_t) -> Expected<std::unique_ptr<LoadedProgram>> {
                                       return Error("the chain has no programs");
                                     });
  ASSERT_TRUE(runner.ok()) << runner.error().str();
  auto ran = (*runner)->run({});
  ASSERT_TRUE(ran.ok()) << ran.error().str();
  EXPECT_TRUE(ran->empty());
}

TEST(StagedProgramTest, AStoredPartGivenOtherShapesIsAClearError) {
  std::unique_ptr<Module> m;
  auto artifact = stagedArtifact(kAccumulateLoop, accumulateInputs(3, true, 100), m);
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  // The function itself admits any length of %init; its stored prefix was
  // compiled for f32[2].
  auto staged = std::make_shared<StagedProgram>(*artifact->staged);
  staged->stages[0].argumentTypes[2] = TensorType{DType::F32, {Dim::unknown()}};
  staged->stages[0].argumentTypes[3] = TensorType{DType::F32, {Dim::unknown()}};
  CompiledArtifact edited = *artifact;
  edited.staged = staged;
  auto loaded = loadProgram(edited, "staged.kc", {.threads = 1});
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  std::vector<Tensor> in = accumulateInputs(3, true, 100);
  in[2] = tensorOf(DType::F32, {3}, {0, 1, 2});
  in[3] = tensorOf(DType::F32, {3}, {1, 1, 1});
  auto ran = (*loaded)->run(in);
  ASSERT_FALSE(ran.ok());
  EXPECT_NE(ran.error().message().find("the prefix 'accumulate.before' of the stored program was compiled for input 2 of type f32[2], but "
                                        "is given f32[3]"),
            std::string::npos)
      << ran.error().str();
}

TEST(StagedProgramTest, PartsWhoseShapesAreKnownOnlyAtRunTimeAreRefusedByName) {
  // The ops after a nonzero read sizes its values give.
  std::unique_ptr<Module> m = parseVerified(test::kNonZeroBetweenStages);
  ASSERT_TRUE(m);
  auto bytes = kcOf(*m->functions().front(),
                    {tensorOf(DType::F32, {6}, {1, 2, 3, 4, 5, 6}), tensorOf(DType::F32, {6}, {0, 3, 1, 5, -1, 2})});
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.error().message().find("depends on the values 'nonzero' computes"), std::string::npos)
      << bytes.error().str();
  EXPECT_NE(bytes.error().message().find("kiln run MODEL.onnx"), std::string::npos) << bytes.error().str();

  // A loop whose carried value grows each iteration.
  m = parseVerified(R"(
func @grow(%n: i64[], %x: f32[?]) -> (f32[?]) {
  %t = constant() {value = dense<bool[]>[true]} : bool[]
  %last = loop(%n, %t, %x) {num_carried = 1} : f32[?] {
  ^(%i: i64[], %k: bool[], %v: f32[?]) -> (bool[], f32[?]):
    %w = concat(%v, %v) {axis = 0} : f32[?]
    return %k, %w
  }
  return %last
}
)");
  ASSERT_TRUE(m);
  bytes = kcOf(*m->functions().front(), {i64Scalar(3), tensorOf(DType::F32, {1}, {1})});
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.error().message().find("carried value 0 of 'loop' enters its body as f32[1] and leaves it as f32[2]"),
            std::string::npos)
      << bytes.error().str();
}

}  // namespace
}  // namespace kiln
