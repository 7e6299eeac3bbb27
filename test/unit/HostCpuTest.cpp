// CPUID feature detection (runtime/HostCpu.h), which the runtime uses in
// place of LLVM's to check that stored code can run: on this machine it
// must agree with LLVM's host features on every feature it knows, present
// or absent; and missingCpuFeatures names exactly the required ones a host
// lacks.
#include <gtest/gtest.h>

#include <sstream>

#include "codegen/llvm/CpuJit.h"
#include "runtime/HostCpu.h"

namespace kiln {
namespace {

TEST(HostCpuTest, AgreesWithLlvmOnThisMachine) {
  const std::set<std::string> have = hostCpuFeatures();
  std::istringstream in(codegen::CpuJit::hostTarget().features);
  int compared = 0;
  for (std::string feature; std::getline(in, feature, ',');) {
    const std::string name = feature.substr(1);
    if (!hostCpuFeatureNames().count(name)) continue;
    ++compared;
    EXPECT_EQ(have.count(name) == 1, feature[0] == '+') << name << ": LLVM says " << feature[0];
  }
  // The table covers the features that change generated code on x86-64.
  EXPECT_GE(compared, 40);
  for (const char* basic : {"sse2", "64bit", "cx8"}) EXPECT_TRUE(have.count(basic)) << basic;
}

TEST(HostCpuTest, MissingFeaturesAreNamed) {
  const std::set<std::string> host = {"sse2", "avx", "avx2", "fma"};
  EXPECT_EQ(missingCpuFeatures("+sse2,+avx2,-avx512f", host), "");
  EXPECT_EQ(missingCpuFeatures("+sse2,+avx512f,+avx512bw,+fma", host), "avx512f, avx512bw");
  // Features this file cannot detect are not held against the host.
  EXPECT_EQ(missingCpuFeatures("+some-future-feature,+avx", host), "");
  EXPECT_EQ(missingCpuFeatures("", host), "");
}

}  // namespace
}  // namespace kiln
