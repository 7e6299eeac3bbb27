// Ops whose result sizes depend on values (nonzero, unique,
// non_max_suppression): their shape rules and bounds, the interpreter's
// results against values computed by hand, the memory plan's bounded and
// dynamic buffers, and the CPU executor, which runs them between compiled
// stages and compiles the rest once per size they give.
#include <gtest/gtest.h>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/llvm/CpuJit.h"
#include "ir/ShapeRules.h"
#include "passes/MemoryPlan.h"
#include "runtime/Interpreter.h"
#include "test/unit/ControlFlowTestSupport.h"

namespace kiln {
namespace {

using test::elementsOf;
using test::parseOk;
using test::parseVerified;
using test::tensorOf;

/// Runs the one-function module `text` on the interpreter.
std::vector<Tensor> interpretOk(const std::string& text, std::vector<Tensor> inputs) {
  auto m = parseVerified(text);
  EXPECT_TRUE(m);
  if (!m) return {};
  auto out = interpret(*m->functions().front(), std::move(inputs));
  EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.error().str());
  return out.ok() ? std::move(*out) : std::vector<Tensor>{};
}

TEST(DataDependentTest, NonZeroGivesOneColumnPerNonzeroElement) {
  auto out = interpretOk("func @f(%x: f32[2,3]) -> i64[2,?] {\n  %n = nonzero(%x) : i64[2,?]\n  return %n\n}\n",
                         {tensorOf(DType::F32, {2, 3}, {1, 0, 2, 0, -3, 0})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{2, 3}));
  // (0,0), (0,2), (1,1): rows are the dims, columns the elements.
  EXPECT_EQ(elementsOf(out[0]), (std::vector<double>{0, 0, 1, 0, 2, 1}));

  auto none = interpretOk("func @f(%x: i32[4]) -> i64[1,?] {\n  %n = nonzero(%x) : i64[1,?]\n  return %n\n}\n",
                          {tensorOf(DType::I32, {4}, {0, 0, 0, 0})});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].shape(), (std::vector<int64_t>{1, 0}));
}

TEST(DataDependentTest, UniqueFlattenedSortedAndInOrderOfFirstOccurrence) {
  const char* kText =
      "func @f(%x: f32[6]) -> (f32[?], i64[?], i64[6], i64[?]) {\n"
      "  %y, %i, %inv, %c = unique(%x) {sorted = SORTED} : f32[?], i64[?], i64[6], i64[?]\n"
      "  return %y, %i, %inv, %c\n}\n";
  const Tensor x = tensorOf(DType::F32, {6}, {2, 1, 1, 3, 4, 3});
  std::string sorted = kText;
  sorted.replace(sorted.find("SORTED"), 6, "true");
  auto s = interpretOk(sorted, {x});
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(elementsOf(s[0]), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(elementsOf(s[1]), (std::vector<double>{1, 0, 3, 4}));
  EXPECT_EQ(elementsOf(s[2]), (std::vector<double>{1, 0, 0, 2, 3, 2}));
  EXPECT_EQ(elementsOf(s[3]), (std::vector<double>{2, 1, 2, 1}));

  std::string unsorted = kText;
  unsorted.replace(unsorted.find("SORTED"), 6, "false");
  auto u = interpretOk(unsorted, {x});
  ASSERT_EQ(u.size(), 4u);
  EXPECT_EQ(elementsOf(u[0]), (std::vector<double>{2, 1, 3, 4}));
  EXPECT_EQ(elementsOf(u[1]), (std::vector<double>{0, 1, 3, 4}));
  EXPECT_EQ(elementsOf(u[2]), (std::vector<double>{0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(elementsOf(u[3]), (std::vector<double>{1, 2, 2, 1}));
}

TEST(DataDependentTest, UniqueAlongAnAxisComparesWholeSlices) {
  // Columns of x: (1,4) (0,3) (1,4) (0,2): three distinct, sorted
  // lexicographically (0,2) < (0,3) < (1,4).
  auto out = interpretOk(
      "func @f(%x: i64[2,4]) -> (i64[2,?], i64[?], i64[4], i64[?]) {\n"
      "  %y, %i, %inv, %c = unique(%x) {axis = [-1]} : i64[2,?], i64[?], i64[4], i64[?]\n"
      "  return %y, %i, %inv, %c\n}\n",
      {tensorOf(DType::I64, {2, 4}, {1, 0, 1, 0, 4, 3, 4, 2})});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(elementsOf(out[0]), (std::vector<double>{0, 0, 1, 2, 3, 4}));
  EXPECT_EQ(elementsOf(out[1]), (std::vector<double>{3, 1, 0}));
  EXPECT_EQ(elementsOf(out[2]), (std::vector<double>{2, 1, 2, 0}));
  EXPECT_EQ(elementsOf(out[3]), (std::vector<double>{1, 1, 2}));
}

TEST(DataDependentTest, NonMaxSuppressionKeepsBoxesByScoreUnlessTheyOverlap) {
  // Boxes as corners [y1,x1,y2,x2]: box 1 overlaps box 0 with IoU 81/119
  // (0.68), box 2 is apart, box 3 is box 0 flipped (the same extent).
  const char* kText =
      "func @f(%b: f32[1,4,4], %s: f32[1,2,4], %k: i64[1], %iou: f32[1], %min: f32[1]) -> i64[?,3] {\n"
      "  %sel = non_max_suppression(%b, %s, %k, %iou, %min) : i64[?,3]\n  return %sel\n}\n";
  const Tensor boxes = tensorOf(DType::F32, {1, 4, 4}, {0, 0, 10, 10, 1, 1, 11, 11, 20, 20, 30, 30, 10, 10, 0, 0});
  const Tensor scores = tensorOf(DType::F32, {1, 2, 4}, {0.9, 0.8, 0.7, 0.6, 0.1, 0.2, 0.95, 0.3});
  auto run = [&](double maxPerClass, double iou, double minScore) {
    auto out = interpretOk(kText, {boxes, scores, tensorOf(DType::I64, {1}, {maxPerClass}),
                                   tensorOf(DType::F32, {1}, {iou}), tensorOf(DType::F32, {1}, {minScore})});
    return out.empty() ? std::vector<double>{} : elementsOf(out[0]);
  };
  // Class 0: 0 kept, 1 and 3 suppressed by it, 2 kept. Class 1: 2, then 3,
  // then 1 suppressed by 3 (the same extent as 0), and 0 likewise.
  EXPECT_EQ(run(10, 0.5, 0), (std::vector<double>{0, 0, 0, 0, 0, 2, 0, 1, 2, 0, 1, 3}));
  // At most one per class.
  EXPECT_EQ(run(1, 0.5, 0), (std::vector<double>{0, 0, 0, 0, 1, 2}));
  // An IoU threshold of 0.7 keeps box 1 beside box 0 (IoU 0.68), not box 3
  // (IoU 1); scores must exceed 0.5, which leaves class 1 only box 2.
  EXPECT_EQ(run(10, 0.7, 0.5), (std::vector<double>{0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 2}));
  // No box per class: nothing.
  EXPECT_TRUE(run(0, 0.5, 0).empty());
}

TEST(DataDependentTest, ShapeRulesGiveAnUnknownDimAndItsBound) {
  auto m = parseVerified(
      "func @f(%x: f32[2,3,4], %b: f32[2,5,4], %s: f32[2,3,5]) -> (i64[3,?], f32[2,?,4], i64[?,3]) {\n"
      "  %n = nonzero(%x) : i64[3,?]\n"
      "  %y, %i, %inv, %c = unique(%x) {axis = [1]} : f32[2,?,4], i64[?], i64[3], i64[?]\n"
      "  %sel = non_max_suppression(%b, %s) : i64[?,3]\n"
      "  return %n, %y, %sel\n}\n");
  ASSERT_TRUE(m);
  const auto& ops = m->functions().front()->ops();
  auto it = ops.begin();
  const Op& nonzero = **it++;
  const Op& unique = **it++;
  const Op& nms = **it++;
  EXPECT_EQ(dataDependentBound(nonzero, 0), 24);
  EXPECT_EQ(dataDependentBound(unique, 0), 3);
  EXPECT_EQ(dataDependentBound(unique, 2), std::nullopt);  // the inverse has a static size
  EXPECT_EQ(dataDependentBound(nms, 0), 2 * 3 * 5);

  auto bad = parseOk(
      "func @f(%x: f32[2,3]) -> f32[?] {\n"
      "  %y, %i, %inv, %c = unique(%x) {axis = [0, 1]} : f32[?], i64[?], i64[6], i64[?]\n"
      "  return %y\n}\n");
  ASSERT_TRUE(bad);
  auto types = inferResultTypes(*bad->functions().front()->ops().front());
  ASSERT_FALSE(types.ok());
  EXPECT_NE(types.error().message().find("expected at most one"), std::string::npos) << types.error().str();
}

TEST(DataDependentTest, MemoryPlanBoundsResultsAndAllocatesTheRestAtRunTime) {
  auto m = parseVerified(
      "func @f(%x: f32[4,8]) -> i64[?,2] {\n"
      "  %a = exp(%x) : f32[4,8]\n"
      "  %n = nonzero(%a) : i64[2,?]\n"
      "  %t = transpose(%n) {perm = [1, 0]} : i64[?,2]\n"
      "  return %t\n}\n");
  ASSERT_TRUE(m);
  auto plan = planMemory(*m->functions().front());
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  ASSERT_EQ(plan->buffers.size(), 2u);  // %a and %n; %t is returned
  EXPECT_EQ(plan->buffers[0].sizing, MemoryPlan::Buffer::Sizing::Exact);
  EXPECT_EQ(plan->buffers[1].sizing, MemoryPlan::Buffer::Sizing::Bound);
  EXPECT_EQ(plan->buffers[1].size, 2 * 32 * 8);  // two rows of at most 32 i64 indices

  auto chained = parseVerified(
      "func @f(%x: f32[4,8]) -> f32[?] {\n"
      "  %n = nonzero(%x) : i64[2,?]\n"
      "  %c = cast(%n) : f32[2,?]\n"
      "  %s = reduce_sum(%c) {axes = [0]} : f32[?]\n"
      "  return %s\n}\n");
  ASSERT_TRUE(chained);
  auto dynamic = planMemory(*chained->functions().front());
  ASSERT_TRUE(dynamic.ok()) << dynamic.error().str();
  ASSERT_EQ(dynamic->buffers.size(), 2u);
  EXPECT_EQ(dynamic->buffers[1].sizing, MemoryPlan::Buffer::Sizing::Dynamic);
  EXPECT_EQ(dynamic->buffers[1].offset, -1);
  EXPECT_NE(dynamic->str().find("%c: dynamic size, allocated at run time"), std::string::npos) << dynamic->str();
}

/// kNonZeroBetweenStages: the executor compiles the ops before the nonzero
/// and the ops after it, the suffix once per count.
TEST(DataDependentTest, CpuExecutorRunsStagesAndMatchesTheInterpreter) {
  auto m = parseVerified(test::kNonZeroBetweenStages);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  codegen::CompileReport report;
  auto executor = codegen::CpuExecutor::create(f, {.threads = 1, .report = &report});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  std::vector<int> compiledKernels;
  const std::vector<std::vector<double>> xs = {
      {1, 2, 3, 4, 5, 6}, {0, 9, 0, 9, 0, 9}, {0, 0, 0, 0, 0, 0}, {-1, -1, -1, -1, -2, -1}};
  for (const auto& values : xs) {
    std::vector<Tensor> in = {tensorOf(DType::F32, {6}, values), tensorOf(DType::F32, {6}, {0, 3, 1, 5, -1, 2})};
    auto want = interpret(f, in);
    ASSERT_TRUE(want.ok()) << want.error().str();
    auto got = (*executor)->run(in);
    ASSERT_TRUE(got.ok()) << got.error().str();
    ASSERT_EQ(got->size(), 3u);
    for (size_t r = 0; r < 3; ++r) {
      EXPECT_EQ((*got)[r].shape(), (*want)[r].shape()) << "result " << r;
      test::expectClose((*got)[r], (*want)[r], "result " + std::to_string(r));
    }
    compiledKernels.push_back(report.kernels);
  }
  // Counts 4, 4, 1, 0: the prefix and the suffix for 4 compile on the first
  // run; the second run's count was seen before and compiles nothing; the
  // counts 1 and 0 compile the suffix again.
  ASSERT_EQ(compiledKernels.size(), 4u);
  EXPECT_GT(compiledKernels[0], 0);
  EXPECT_EQ(compiledKernels[1], compiledKernels[0]);
  EXPECT_GT(compiledKernels[2], compiledKernels[1]);
  EXPECT_GT(compiledKernels[3], compiledKernels[2]);
  // One program per shape set is not one program for the function.
  std::vector<Tensor> in = {tensorOf(DType::F32, {6}, xs[0]), tensorOf(DType::F32, {6}, xs[0])};
  auto plan = (*executor)->memoryPlan(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message().find("nonzero"), std::string::npos) << plan.error().str();
  EXPECT_FALSE((*executor)->artifact(in).ok());
}

TEST(DataDependentTest, CpuExecutorRefusesDonatedArgumentsWithDataDependentOps) {
  auto m = parseVerified(
      "func @f(%x: f32[4]) -> (i64[1,?], f32[4]) {\n"
      "  %n = nonzero(%x) : i64[1,?]\n  %y = neg(%x) : f32[4]\n  return %n, %y\n}\n");
  ASSERT_TRUE(m);
  auto executor = codegen::CpuExecutor::create(*m->functions().front(), {.aliases = {{1, 0}}});
  ASSERT_FALSE(executor.ok());
  EXPECT_NE(executor.error().message().find("donated"), std::string::npos) << executor.error().str();
}

}  // namespace
}  // namespace kiln
