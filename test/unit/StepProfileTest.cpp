// StepProfile::format (runtime/CpuRunner.h), the table behind `kiln run
// --profile` and `kiln-train-bench --profile`: steps sorted by time, and,
// when the table is cut, the time of each kind of step summed over shapes.
#include <gtest/gtest.h>
#include <string>
#include "runtime/CpuRunner.h"

namespace kiln {
namespace {

TEST(StepProfileTest, SumsEachKindOfStepOverItsShapesWhenTheTableIsCut) {
  StepProfile profile;
  profile.entries.push_back({"%a", "transpose -> f32[4,8]", 0.003, 1, 0});
  profile.entries.push_back({"%b", "transpose -> f32[16,8]", 0.002, 1, 0});
  profile.entries.push_back({"%c", "onednn matmul [4,8]x[8,8] (brg:avx512_core)", 0.004, 1, 512});
  profile.entries.push_back({"%d", "fused(add relu) -> f32[4,8]", 0.001, 1, 0});
  profile.entries.push_back({"%e", "cudnn conv [2,16,14,14]*[32,16,3,3] pad [1,1] + bias (f32)", 0.0005, 1, 0});
  profile.entries.push_back({"%f", "cudnn conv [2,3,28,28]*[16,3,3,3] pad [1,1] + bias (f32)", 0.0005, 1, 0});
  const std::string text = profile.format(2);
  // The two largest steps, then what was left out.
  EXPECT_NE(text.find("(4 more steps)"), std::string::npos) << text;
  const size_t kinds = text.find("by kind:\n");
  ASSERT_NE(kinds, std::string::npos) << text;
  // 5 ms in the two transposes, 45% of 11 ms, listed before the matmul's 4 ms.
  const std::string summary = text.substr(kinds);
  const size_t transposes = summary.find("    5.00  45.5%      2 steps  transpose\n");
  const size_t matmuls = summary.find("    4.00  36.4%      1 steps  onednn matmul\n");
  EXPECT_NE(transposes, std::string::npos) << summary;
  EXPECT_NE(matmuls, std::string::npos) << summary;
  EXPECT_LT(transposes, matmuls) << summary;
  // Library calls of one kind are summed over their shapes, as ops are.
  EXPECT_NE(summary.find("    1.00   9.1%      2 steps  cudnn conv\n"), std::string::npos) << summary;
  // A step's GB/s: the bytes it reads and writes over its time.
  StepProfile moved;
  moved.entries.push_back({"%t", "transpose -> f32[1024,1024]", 0.002, 2, 0, 8.0 * 1024 * 1024});
  const std::string rates = moved.format();
  EXPECT_NE(rates.find("    2.00 100.0%     1.0000        -      8.4  %t = transpose"), std::string::npos) << rates;
  // A table that lists every step needs no summary.
  EXPECT_EQ(profile.format(10).find("by kind:"), std::string::npos);
}

}  // namespace
}  // namespace kiln
