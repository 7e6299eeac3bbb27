// Kiln's choice of libgomp's spin (runtime/openmp/OpenMpWaitPolicy.cpp):
// short once other programs' runnable tasks fill every core, libgomp's own
// default otherwise; and what the library set is what this process's
// environment holds (the unit tests link it, as every executable does).
#include "runtime/openmp/OpenMpWaitPolicy.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kiln {
namespace {

TEST(OpenMpWaitPolicyTest, ShortSpinOnlyWhenOtherProgramsFillEveryCore) {
  EXPECT_EQ(kiln_openmp_spin_count_for(0, 2), 300000);
  EXPECT_EQ(kiln_openmp_spin_count_for(1, 2), 300000);  // one busy process leaves a core
  EXPECT_EQ(kiln_openmp_spin_count_for(2, 2), 1000);    // two fill both
  EXPECT_EQ(kiln_openmp_spin_count_for(9, 2), 1000);
  EXPECT_EQ(kiln_openmp_spin_count_for(15, 16), 300000);
  EXPECT_EQ(kiln_openmp_spin_count_for(16, 16), 1000);
}

TEST(OpenMpWaitPolicyTest, TheEnvironmentHoldsWhatThePolicySays) {
  const std::string said = kiln_openmp_wait_policy();
  ASSERT_FALSE(said.empty()) << "the policy library's constructor did not run";
  if (said.find("from the environment") != std::string::npos) return;  // the user's setting
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  ASSERT_NE(spin, nullptr);
  EXPECT_EQ(said.rfind(std::string("GOMP_SPINCOUNT=") + spin + ", Kiln's choice: ", 0), 0u) << said;
}

}  // namespace
}  // namespace kiln
