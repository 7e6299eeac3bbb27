// Tests of `if` and `loop` in the interpreter (runtime/ControlFlow.h): the
// branch a condition picks, loops bounded by the trip count or ended by the
// body's condition, carried values, scan values stacked per iteration (an
// empty stack when no iteration runs), nested bodies, and the errors for a
// scan whose rows change shape and a condition that is not a bool scalar.
#include "test/unit/ControlFlowTestSupport.h"
#include "test/unit/InterpreterTestSupport.h"

namespace kiln::test {
namespace {

constexpr std::string_view kIf = R"(
func @pick(%c: bool[], %x: f32[3]) -> f32[3] {
  %r = if(%c, %x) : f32[3] {
  ^(%a: f32[3]):
    %n = neg(%a) : f32[3]
    return %n
  } {
  ^(%a: f32[3]):
    %e = add(%a, %a) : f32[3]
    return %e
  }
  return %r
}
)";

TEST(InterpreterControlFlowTest, IfRunsTheBranchItsConditionPicks) {
  auto m = parseOk(kIf);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto yes = interpret(f, {boolScalar(true), f32({3}, {1, -2, 3})});
  ASSERT_TRUE(yes) << yes.error().str();
  expectTensor((*yes)[0], {3}, {-1, 2, -3});
  auto no = interpret(f, {boolScalar(false), f32({3}, {1, -2, 3})});
  ASSERT_TRUE(no) << no.error().str();
  expectTensor((*no)[0], {3}, {2, -4, 6});
}

/// Sums %step into %acc; the body ends the loop once the sum passes %limit;
/// each iteration's sum is a scan row and its iteration number another.
constexpr std::string_view kLoop = R"(
func @accumulate(%n: i64[], %go: bool[], %init: f32[2], %step: f32[2], %limit: f32[]) -> (f32[2], f32[?,2], i64[?]) {
  %sum, %rows, %iters = loop(%n, %go, %init, %step, %limit) {num_carried = 1} : f32[2], f32[?,2], i64[?] {
  ^(%i: i64[], %c: bool[], %acc: f32[2], %s: f32[2], %lim: f32[]) -> (bool[], f32[2], f32[2], i64[]):
    %next = add(%acc, %s) : f32[2]
    %total = reduce_sum(%next) {axes = [0]} : f32[]
    %more = lt(%total, %lim) : bool[]
    return %more, %next, %next, %i
  }
  return %sum, %rows, %iters
}
)";

TEST(InterpreterControlFlowTest, LoopRunsUpToItsTripCount) {
  auto m = parseOk(kLoop);
  ASSERT_TRUE(m);
  auto out = interpret(*m->functions().front(),
                       {i64Scalar(3), boolScalar(true), f32({2}, {0, 1}), f32({2}, {1, 2}), f32({}, {100})});
  ASSERT_TRUE(out) << out.error().str();
  expectTensor((*out)[0], {2}, {3, 7});
  expectTensor((*out)[1], {3, 2}, {1, 3, 2, 5, 3, 7});
  EXPECT_EQ(int64s((*out)[2]), (std::vector<int64_t>{0, 1, 2}));
}

TEST(InterpreterControlFlowTest, LoopStopsWhenItsBodyReturnsFalse) {
  auto m = parseOk(kLoop);
  ASSERT_TRUE(m);
  // The totals after each iteration are 4, 7, 10, ...: the second is not
  // below 6, so the loop ends after it (its rows are kept).
  auto out = interpret(*m->functions().front(),
                       {i64Scalar(100), boolScalar(true), f32({2}, {0, 1}), f32({2}, {1, 2}), f32({}, {6})});
  ASSERT_TRUE(out) << out.error().str();
  expectTensor((*out)[0], {2}, {2, 5});
  expectTensor((*out)[1], {2, 2}, {1, 3, 2, 5});
}

TEST(InterpreterControlFlowTest, LoopThatRunsNoIterationGivesItsInitialValuesAndEmptyScans) {
  auto m = parseOk(kLoop);
  ASSERT_TRUE(m);
  for (auto [n, go] : {std::pair{int64_t{0}, true}, std::pair{int64_t{5}, false}}) {
    auto out = interpret(*m->functions().front(),
                         {i64Scalar(n), boolScalar(go), f32({2}, {4, 5}), f32({2}, {1, 2}), f32({}, {9})});
    ASSERT_TRUE(out) << out.error().str();
    expectTensor((*out)[0], {2}, {4, 5});
    expectTensor((*out)[1], {0, 2}, {});
    EXPECT_EQ((*out)[2].shape(), (std::vector<int64_t>{0}));
  }
}

/// A loop nested in a branch: x squared %n times when %c holds.
constexpr std::string_view kNested = R"(
func @nested(%c: bool[], %n: i64[], %x: f32[2]) -> f32[2] {
  %r = if(%c, %n, %x) : f32[2] {
  ^(%m: i64[], %a: f32[2]):
    %t = constant() {value = dense<bool[]>[true]} : bool[]
    %p = loop(%m, %t, %a) {num_carried = 1} : f32[2] {
    ^(%i: i64[], %k: bool[], %v: f32[2]) -> (bool[], f32[2]):
      %w = mul(%v, %v) : f32[2]
      return %k, %w
    }
    return %p
  } {
  ^(%m: i64[], %a: f32[2]):
    return %a
  }
  return %r
}
)";

TEST(InterpreterControlFlowTest, BodiesNest) {
  auto m = parseOk(kNested);
  ASSERT_TRUE(m);
  auto out = interpret(*m->functions().front(), {boolScalar(true), i64Scalar(2), f32({2}, {2, 3})});
  ASSERT_TRUE(out) << out.error().str();
  expectTensor((*out)[0], {2}, {16, 81});
}

TEST(InterpreterControlFlowTest, CarriedValuesMayChangeShapeButScanRowsMayNot) {
  auto m = parseOk(kRaggedScan);
  ASSERT_TRUE(m);
  auto once = interpret(*m->functions().front(), {i64Scalar(1), f32({1}, {5})});
  ASSERT_TRUE(once) << once.error().str();
  expectTensor((*once)[1], {1, 2}, {5, 5});
  auto twice = interpret(*m->functions().front(), {i64Scalar(2), f32({1}, {5})});
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message().find(kRaggedScanError), std::string::npos) << twice.error().str();
}

TEST(InterpreterControlFlowTest, ConditionMustBeABoolScalar) {
  auto m = parseOk(kIf);
  ASSERT_TRUE(m);
  const Op& op = *m->functions().front()->ops().front();
  Tensor cond = ints(DType::I64, {}, {1});
  Tensor x = f32({3}, {1, 2, 3});
  const Tensor* operands[] = {&cond, &x};
  auto out = interpretOp(op, operands);
  ASSERT_FALSE(out);
  EXPECT_NE(out.error().message().find("the condition of 'if' is i64[], expected bool[]"), std::string::npos)
      << out.error().str();
}

}  // namespace
}  // namespace kiln::test
