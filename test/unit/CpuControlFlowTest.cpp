// The CPU executor on `if` and `loop` (codegen/Stages.h, docs/codegen.md
// section 7): the ops before a control-flow op compiled, the op run on the
// host by runtime/ControlFlow.h with each body a compiled program of its
// own, the ops after it compiled for the shapes it gave. Results are
// compared with the interpreter's; the compile report shows that the bodies
// are compiled (kernels appear though every op but the constants is inside
// a body), once per set of argument shapes, not per iteration or per run;
// an op the JIT cannot lower inside a body is an error naming it.
#include <gtest/gtest.h>

#include "codegen/CpuExecutable.h"
#include "codegen/llvm/CpuJit.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CompileReport;
using codegen::CpuExecutor;
using test::expectClose;
using test::parseVerified;
using test::tensorOf;

Tensor i64Scalar(int64_t v) { return tensorOf(DType::I64, {}, {static_cast<double>(v)}); }
Tensor boolScalar(bool v) { return tensorOf(DType::Bool, {}, {v ? 1.0 : 0.0}); }

/// Runs `f` on `inputs` with `executor` and on the interpreter and checks
/// that they agree, shapes included.
void expectMatchesInterpreter(CpuExecutor& executor, const Function& f, const std::vector<Tensor>& inputs,
                              const std::string& what) {
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << what << ": " << want.error().str();
  auto got = executor.run(inputs);
  ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
  ASSERT_EQ(got->size(), want->size()) << what;
  for (size_t r = 0; r < got->size(); ++r) expectClose((*got)[r], (*want)[r], what + ", result " + std::to_string(r));
}

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

/// Sums %step into %acc; the body ends the loop once the sum passes %limit;
/// each iteration's sum is a scan row and its iteration number another.
/// An op before the loop scales the start, one after it doubles the sum.
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

TEST(CpuControlFlowTest, LoopWithScanValuesCompilesItsBodyOnce) {
  auto m = parseVerified(kLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CompileReport report;
  auto executor = CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto inputs = [](int64_t n, bool go, double limit) {
    return std::vector<Tensor>{i64Scalar(n), boolScalar(go), tensorOf(DType::F32, {2}, {0, 1}),
                               tensorOf(DType::F32, {2}, {1, 2}), tensorOf(DType::F32, {}, {limit})};
  };
  // Bounded by the trip count: three rows.
  expectMatchesInterpreter(**executor, f, inputs(3, true, 100), "three iterations");
  const int first = report.kernels;
  EXPECT_GT(first, 0);
  auto got = (*executor)->run(inputs(3, true, 100));
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[0]), (std::vector<double>{6, 14}));
  EXPECT_EQ((*got)[1].shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(test::elementsOf((*got)[2]), (std::vector<double>{0, 1, 2}));
  // Ended by the body's condition (totals 4, 7: the second is not below 6),
  // and no iteration at all (empty stacks of the declared row shape).
  expectMatchesInterpreter(**executor, f, inputs(100, true, 6), "ended by the condition");
  expectMatchesInterpreter(**executor, f, inputs(0, true, 6), "no iteration");
  expectMatchesInterpreter(**executor, f, inputs(5, false, 6), "false from the start");
  expectMatchesInterpreter(**executor, f, inputs(40, true, 1000), "forty iterations");
  // The body's arguments keep their shapes: it compiled on the first run
  // and never again, whatever the number of iterations.
  EXPECT_EQ(report.kernels, first);
}

/// A loop whose body holds an `if`: the Collatz sequence of %x, up to %n
/// steps or until it reaches 1, each step a scan row.
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

TEST(CpuControlFlowTest, ControlFlowInsideABodyIsCompiledToo) {
  auto m = parseVerified(kNested);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CompileReport report;
  auto executor = CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto got = (*executor)->run({i64Scalar(100), i64Scalar(6)});
  ASSERT_TRUE(got.ok()) << got.error().str();
  EXPECT_EQ(test::elementsOf((*got)[0]), (std::vector<double>{1}));
  EXPECT_EQ(test::elementsOf((*got)[1]), (std::vector<double>{3, 10, 5, 16, 8, 4, 2, 1}));
  // Only constants are outside the bodies: the kernels are the bodies'.
  const int compiled = report.kernels;
  EXPECT_GT(compiled, 0);
  expectMatchesInterpreter(**executor, f, {i64Scalar(100), i64Scalar(27)}, "27 (111 steps)");
  expectMatchesInterpreter(**executor, f, {i64Scalar(4), i64Scalar(7)}, "7, four steps");
  EXPECT_EQ(report.kernels, compiled);
}

/// The carried value doubles in length each iteration: the body compiles
/// once per length. As a scan value it would be ragged, an error.
constexpr const char* kGrowing = R"(
func @grow(%n: i64[], %x: f32[?]) -> (f32[?], f32[?,?]) {
  %t = constant() {value = dense<bool[]>[true]} : bool[]
  %last = loop(%n, %t, %x) {num_carried = 1} : f32[?] {
  ^(%i: i64[], %k: bool[], %v: f32[?]) -> (bool[], f32[?]):
    %w = concat(%v, %v) {axis = 0} : f32[?]
    return %k, %w
  }
  %b = constant() {value = dense<bool[]>[true]} : bool[]
  %end, %rows = loop(%n, %b, %x) {num_carried = 1} : f32[?], f32[?,?] {
  ^(%i: i64[], %k: bool[], %v: f32[?]) -> (bool[], f32[?], f32[?]):
    %w = concat(%v, %v) {axis = 0} : f32[?]
    return %k, %w, %w
  }
  return %last, %rows
}
)";

TEST(CpuControlFlowTest, BodiesCompilePerArgumentShapeAndRaggedScansFailAsInTheInterpreter) {
  auto m = parseVerified(kGrowing);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CompileReport report;
  auto executor = CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  expectMatchesInterpreter(**executor, f, {i64Scalar(1), tensorOf(DType::F32, {1}, {5})}, "one iteration");
  const int once = report.kernels;
  auto twice = (*executor)->run({i64Scalar(2), tensorOf(DType::F32, {1}, {5})});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message().find("scan value 0 is f32[4] in iteration 1 but f32[2] in iteration 0"),
            std::string::npos)
      << twice.error().str();
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
  auto m = parseVerified(kLoop);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = CpuExecutor::create(f, {.threads = 1});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  const std::vector<Tensor> in = {i64Scalar(3), boolScalar(true), tensorOf(DType::F32, {2}, {0, 1}),
                                  tensorOf(DType::F32, {2}, {1, 2}), tensorOf(DType::F32, {}, {9})};
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
