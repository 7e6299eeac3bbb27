// The CPU executor's arena (passes/MemoryPlan.h's plan, allocated once per
// compiled shape set): intermediates written in place and reused across
// runs give the interpreter's results on every run, returned tensors are
// the caller's own, and the host checks of gathers and integer divisions
// still report bad operands, also inside fused groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "codegen/cpu/CpuExecutable.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

using test::parseOk;
using test::randomF32;

/// A chain of elementwise ops (planned in place, at -O2 one kernel each)
/// and a reduction, with an intermediate returned beside the final result.
constexpr const char* kChain =
    "func @f(%x: f32[16,32], %y: f32[16,32]) -> (f32[16,32], f32[16]) {\n"
    "  %a = add(%x, %y) : f32[16,32]\n  %b = exp(%a) : f32[16,32]\n  %c = neg(%b) : f32[16,32]\n"
    "  %d = mul(%c, %x) : f32[16,32]\n  %e = tanh(%d) : f32[16,32]\n"
    "  %s = reduce_sum(%e) {axes = [1]} : f32[16]\n  return %b, %s\n}\n";

TEST(CpuExecutorArenaTest, RunsReuseTheArenaAndMatchTheInterpreter) {
  auto m = parseOk(kChain);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  for (int optLevel : {2, 3}) {
    auto executor = CpuExecutor::create(f, {.threads = 2, .optLevel = optLevel});
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    std::vector<std::vector<Tensor>> kept;
    for (int seed = 0; seed < 3; ++seed) {
      std::vector<Tensor> in = {randomF32({16, 32}, seed), randomF32({16, 32}, seed + 10)};
      auto want = interpret(f, in);
      ASSERT_TRUE(want.ok());
      auto got = (*executor)->run(in);
      ASSERT_TRUE(got.ok()) << got.error().str();
      ASSERT_EQ(got->size(), 2u);
      for (size_t r = 0; r < 2; ++r)
        for (int64_t i = 0; i < (*want)[r].numElements(); ++i)
          ASSERT_NEAR((*got)[r].getDouble(i), (*want)[r].getDouble(i), 1e-5 + 1e-4 * std::abs((*want)[r].getDouble(i)))
              << "-O" << optLevel << " run " << seed << " result " << r << " element " << i;
      kept.push_back(std::move(*got));
    }
    // Results are the caller's: later runs did not overwrite earlier ones.
    EXPECT_NE(kept[0][1].getDouble(0), kept[1][1].getDouble(0));
    auto again = (*executor)->run({randomF32({16, 32}, 0), randomF32({16, 32}, 10)});
    ASSERT_TRUE(again.ok());
    for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(kept[0][1].getDouble(i), (*again)[1].getDouble(i));
  }
}

TEST(CpuExecutorArenaTest, MemoryStatsCountTheArenaAndEachRunsResults) {
  // `kiln run --memory-stats` on the CPU: the runner's arena for its life,
  // each run's results (%b and %s: 16*32*4 + 16*4 bytes).
  auto m = parseOk(kChain);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  CpuMemoryStats stats;
  uint64_t arena = 0;
  {
    auto executor = CpuExecutor::create(f, {.threads = 1, .optLevel = 2, .memory = &stats});
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    std::vector<Tensor> in = {randomF32({16, 32}, 0), randomF32({16, 32}, 1)};
    ASSERT_TRUE((*executor)->run(in).ok());
    auto program = (*executor)->compiledProgram(in);
    ASSERT_TRUE(program.ok()) << program.error().str();
    arena = (static_cast<uint64_t>(std::max<int64_t>(program->second->arenaBytes, 1)) + 63) / 64 * 64;
    EXPECT_GT(program->second->arenaBytes, 0);  // the chain's intermediates live there
    EXPECT_EQ(stats.programs, 1);
    EXPECT_EQ(stats.arena, arena);
    EXPECT_EQ(stats.constants, 0u);
    EXPECT_EQ(stats.results, 16u * 32 * 4 + 16 * 4);
    EXPECT_EQ(stats.runs, 1);
    EXPECT_EQ(stats.peak, arena + stats.results);
    ASSERT_TRUE((*executor)->run(in).ok());
    EXPECT_EQ(stats.runs, 2);
    EXPECT_EQ(stats.maxResults, stats.results);
    EXPECT_NE(stats.format().find("arena"), std::string::npos);
  }
  // The runner gave its arena back; the peaks stay.
  EXPECT_EQ(stats.programs, 0);
  EXPECT_EQ(stats.arena, 0u);
  EXPECT_EQ(stats.maxArena, arena);
  EXPECT_EQ(stats.maxPrograms, 1);
}

TEST(CpuExecutorArenaTest, HostChecksReportBadOperandsInsideFusedGroups) {
  auto m = parseOk(
      "func @f(%t: f32[5,4], %i: i64[3], %b: f32[3,4]) -> f32[3,4] {\n"
      "  %g = gather(%t, %i) {axis = 0} : f32[3,4]\n  %s = add(%g, %b) : f32[3,4]\n  %r = relu(%s) : f32[3,4]\n"
      "  return %r\n}\n");
  ASSERT_TRUE(m);
  Tensor idx(DType::I64, {3});
  idx.setInt(0, 1);
  idx.setInt(1, 7);
  idx.setInt(2, 0);
  auto executor = CpuExecutor::create(*m->functions().front(), {.threads = 2});
  ASSERT_TRUE(executor.ok());
  auto got = (*executor)->run({randomF32({5, 4}, 1), idx, randomF32({3, 4}, 2)});
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message().find("index 7 is out of range for dim 0 of size 5"), std::string::npos)
      << got.error().message();

  auto div = parseOk(
      "func @f(%x: i32[6], %y: i32[6]) -> i32[6] {\n  %q = div(%x, %y) : i32[6]\n  %r = add(%q, %x) : i32[6]\n"
      "  return %r\n}\n");
  ASSERT_TRUE(div);
  Tensor x(DType::I32, {6}), y(DType::I32, {6});
  for (int64_t i = 0; i < 6; ++i) {
    x.setInt(i, i + 1);
    y.setInt(i, i == 4 ? 0 : 2);
  }
  auto divExecutor = CpuExecutor::create(*div->functions().front(), {.threads = 2});
  ASSERT_TRUE(divExecutor.ok());
  auto quotient = (*divExecutor)->run({x, y});
  ASSERT_FALSE(quotient.ok());
  EXPECT_NE(quotient.error().message().find("integer division by zero"), std::string::npos)
      << quotient.error().message();
}

}  // namespace
}  // namespace kiln
