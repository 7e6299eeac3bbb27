// The CPU executor on `if` and `loop` (codegen/Stages.h, docs/codegen.md
// section 7): the ops before a control-flow op compiled, the op run on the
// host by runtime/ControlFlow.h with each body a compiled program of its
// own, the ops after it compiled for the shapes it gave. Results are
// compared with the interpreter's; the compile report shows that the bodies
// are compiled (kernels appear though every op but the constants is inside
// a body), once per set of argument shapes, not per iteration or per run;
// an op the JIT cannot lower inside a body is an error naming it.
#include <gtest/gtest.h>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/llvm/CpuJit.h"
#include "test/unit/ControlFlowTestSupport.h"

namespace kiln {
namespace {

using codegen::CompileReport;
using codegen::CpuExecutor;
using test::accumulateInputs;
using test::boolScalar;
using test::expectMatchesInterpreter;
using test::i64Scalar;
using test::parseVerified;
using test::tensorOf;

/// The condition is computed (compiled, before the `if`), the branches
/// negate or double the prefix's square, and a `sub` after the `if` reads
/// its result.
constexpr const char* kIf = R"(
func @pick(%x: f32[3]) -> (f32[3], f32[3]) {
  %y = mul(%x, %x) : f32[3]
  %t = reduce_sum(%x) {axes = [0]} : f32[]
  %z = constant() {value = dense<f32[]>[0.0]} : f32[]
  %c = gt(%t, %z) : bool[]
  %r = if(%c, %y) : f32[3] {
  ^(%a: f32[3]):
    %n = neg(%a) : f32[3]
    return %n
  } {
  ^(%a: f32[3]):
    %e = add(%a, %a) : f32[3]
    return %e
  }
  %s = sub(%r, %x) : f32[3]
  return %s, %y
}
)";

TEST(CpuControlFlowTest, IfRunsTheCompiledBranchItsConditionPicks) {
  auto m = parseVerified(kIf);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CompileReport report;
  auto executor = CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  const Tensor positive = tensorOf(DType::F32, {3}, {1, -2, 3});
  const Tensor negative = tensorOf(DType::F32, {3}, {-1, 2, -3});
  // prepare compiles the prefix and both branches, whose arguments have
  // static shapes; the suffix waits for the `if`'s result shapes.
  ASSERT_TRUE((*executor)->prepare({positive}).ok());
  const int prepared = report.kernels;
  EXPECT_GE(prepared, 4);  // mul, the condition's ops, neg, add
  expectMatchesInterpreter(**executor, f, {positive}, "then");
  expectMatchesInterpreter(**executor, f, {negative}, "else");
  auto got = (*executor)->run({positive});
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[0]), (std::vector<double>{-2, -2, -12}));
  // The suffix compiled once (both branches give f32[3]); nothing else.
  const int ran = report.kernels;
  EXPECT_GT(ran, prepared);
  expectMatchesInterpreter(**executor, f, {negative}, "else again");
  EXPECT_EQ(report.kernels, ran);
}

TEST(CpuControlFlowTest, LoopWithScanValuesCompilesItsBodyOnce) {
  auto m = parseVerified(test::kAccumulateLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CompileReport report;
  auto executor = CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  // Bounded by the trip count: three rows.
  expectMatchesInterpreter(**executor, f, accumulateInputs(3, true, 100), "three iterations");
  const int first = report.kernels;
  EXPECT_GT(first, 0);
  auto got = (*executor)->run(accumulateInputs(3, true, 100));
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[0]), (std::vector<double>{6, 14}));
  EXPECT_EQ((*got)[1].shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(test::elementsOf((*got)[2]), (std::vector<double>{0, 1, 2}));
  // Ended by the body's condition (totals 4, 7: the second is not below 6),
  // and no iteration at all (empty stacks of the declared row shape).
  expectMatchesInterpreter(**executor, f, accumulateInputs(100, true, 6), "ended by the condition");
  expectMatchesInterpreter(**executor, f, accumulateInputs(0, true, 6), "no iteration");
  expectMatchesInterpreter(**executor, f, accumulateInputs(5, false, 6), "false from the start");
  expectMatchesInterpreter(**executor, f, accumulateInputs(40, true, 1000), "forty iterations");
  // The body's arguments keep their shapes: it compiled on the first run
  // and never again, whatever the number of iterations.
  EXPECT_EQ(report.kernels, first);
}

TEST(CpuControlFlowTest, ControlFlowInsideABodyIsCompiledToo) {
  auto m = parseVerified(test::kCollatzLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CompileReport report;
  auto executor = CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto got = (*executor)->run({i64Scalar(100), i64Scalar(6)});
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[0]), (std::vector<double>{1}));
  EXPECT_EQ(test::elementsOf((*got)[1]), test::kCollatzOf6);
  // Only constants are outside the bodies: the kernels are the bodies'.
  const int compiled = report.kernels;
  EXPECT_GT(compiled, 0);
  expectMatchesInterpreter(**executor, f, {i64Scalar(100), i64Scalar(27)}, "27 (111 steps)");
  expectMatchesInterpreter(**executor, f, {i64Scalar(4), i64Scalar(7)}, "7, four steps");
  EXPECT_EQ(report.kernels, compiled);
}

/// kRaggedScan: the body compiles once per length of its carried value.
TEST(CpuControlFlowTest, BodiesCompilePerArgumentShapeAndRaggedScansFailAsInTheInterpreter) {
  auto m = parseVerified(test::kRaggedScan);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CompileReport report;
  auto executor = CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  expectMatchesInterpreter(**executor, f, {i64Scalar(1), tensorOf(DType::F32, {1}, {5})}, "one iteration");
  const int once = report.kernels;
  auto twice = (*executor)->run({i64Scalar(2), tensorOf(DType::F32, {1}, {5})});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message().find(test::kRaggedScanError), std::string::npos) << twice.error().str();
  // The second iteration's length 2 was new: its body compiled.
  EXPECT_GT(report.kernels, once);
}

TEST(CpuControlFlowTest, AnOpTheJitCannotLowerInABodyIsNamed) {
  // conv_transpose on i32 has no CPU lowering (CodegenTest); inside a
  // branch it is named, not interpreted. The branch's arguments have
  // static shapes, so prepare finds it.
  constexpr const char* kText = R"(
func @f(%c: bool[], %x: i32[1,1,4,4], %w: i32[1,2,3,3]) -> i32[1,2,6,6] {
  %r = if(%c, %x, %w) : i32[1,2,6,6] {
  ^(%a: i32[1,1,4,4], %b: i32[1,2,3,3]):
    %y = conv_transpose(%a, %b) : i32[1,2,6,6]
    return %y
  } {
  ^(%a: i32[1,1,4,4], %b: i32[1,2,3,3]):
    %z = constant() {value = dense<i32[]>[0]} : i32[]
    %e = broadcast(%z) : i32[1,2,6,6]
    return %e
  }
  return %r
}
)";
  auto m = parseVerified(kText);
  ASSERT_TRUE(m);
  const std::vector<Tensor> inputs = {boolScalar(false), Tensor(DType::I32, {1, 1, 4, 4}),
                                      Tensor(DType::I32, {1, 2, 3, 3})};
  auto executor = CpuExecutor::create(*m->functions().front(), {.threads = 1});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  Status prepared = (*executor)->prepare(inputs);
  ASSERT_FALSE(prepared.ok());
  EXPECT_NE(prepared.error().message().find("'conv_transpose' on i32"), std::string::npos) << prepared.error().str();
  ASSERT_EQ((*executor)->unsupportedOps().size(), 1u);
  EXPECT_NE((*executor)->unsupportedOps()[0].find("conv_transpose"), std::string::npos);
  // Run without prepare: the same error, even on the branch that does not
  // hold the op (both compile before the run).
  auto fresh = CpuExecutor::create(*m->functions().front(), {.threads = 1});
  ASSERT_TRUE(fresh.ok());
  auto ran = (*fresh)->run({boolScalar(true), Tensor(DType::I32, {1, 1, 4, 4}), Tensor(DType::I32, {1, 2, 3, 3})});
  ASSERT_FALSE(ran.ok());
  EXPECT_NE(ran.error().message().find("'conv_transpose' on i32"), std::string::npos) << ran.error().str();
}

TEST(CpuControlFlowTest, StagesAreNotOneProgram) {
  auto m = parseVerified(test::kAccumulateLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = CpuExecutor::create(f, {.threads = 1});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  const std::vector<Tensor> in = accumulateInputs(3, true, 9);
  auto plan = (*executor)->memoryPlan(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message().find("has control flow (loop)"), std::string::npos) << plan.error().str();
  EXPECT_FALSE((*executor)->artifact(in).ok());
  // A wrongly typed input is named before anything runs.
  auto bad = (*executor)->run({boolScalar(true), boolScalar(true), in[2], in[3], in[4]});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("input 0 of 'accumulate' is bool[], expected i64[]"), std::string::npos)
      << bad.error().str();
  auto donated = CpuExecutor::create(f, {.aliases = {{0, 2}}});
  ASSERT_FALSE(donated.ok());
  EXPECT_NE(donated.error().message().find("donated"), std::string::npos) << donated.error().str();
}

}  // namespace
}  // namespace kiln
