// The CUDA program's image selection (which CUBIN or the PTX a device of a
// given compute capability loads) and its code's bytes, round trip and
// corruption (runtime/cuda/CudaProgram.h).
#include <gtest/gtest.h>

#include "runtime/cuda/CudaProgram.h"

namespace kiln::cuda {
namespace {

CudaProgram programWith(std::vector<CudaImage> cubins, int ptxArch) {
  CudaProgram p;
  p.plan.name = "f";
  p.cubins = std::move(cubins);
  p.ptxArch = ptxArch;
  p.ptx = ptxArch ? ".version 8.0\n.target sm_" + std::to_string(ptxArch) + "\n" : "";
  return p;
}

std::string chosen(const CudaProgram& p, int major, int minor) {
  auto choice = selectCudaImage(p, major, minor);
  if (!choice) return "error: " + choice.error().message();
  return choice->describe(p);
}

TEST(CudaProgramTest, CubinRunsOnItsMajorAtAnEqualOrHigherMinor) {
  const CudaProgram p = programWith({{80, false, "a"}, {90, false, "b"}}, 80);
  EXPECT_EQ(chosen(p, 8, 0), "CUBIN sm_80");
  EXPECT_EQ(chosen(p, 8, 6), "CUBIN sm_80");  // an A10 runs sm_80 code
  EXPECT_EQ(chosen(p, 8, 9), "CUBIN sm_80");
  EXPECT_EQ(chosen(p, 9, 0), "CUBIN sm_90");
  // Another major: the PTX, which the driver compiles.
  EXPECT_EQ(chosen(p, 10, 0), "PTX for sm_80, compiled by the driver");
  EXPECT_EQ(chosen(p, 12, 0), "PTX for sm_80, compiled by the driver");
}

TEST(CudaProgramTest, NewestCompatibleCubinWins) {
  const CudaProgram p = programWith({{86, false, "a"}, {80, false, "b"}, {89, false, "c"}}, 80);
  EXPECT_EQ(chosen(p, 8, 6), "CUBIN sm_86");
  EXPECT_EQ(chosen(p, 8, 7), "CUBIN sm_86");
  EXPECT_EQ(chosen(p, 8, 9), "CUBIN sm_89");
}

TEST(CudaProgramTest, ArchSpecificCubinRunsOnThatArchitectureOnly) {
  const CudaProgram p = programWith({{90, true, "a"}}, 0);
  EXPECT_EQ(chosen(p, 9, 0), "CUBIN sm_90a");
  EXPECT_EQ(chosen(p, 10, 0),
            "error: the compiled program 'f' cannot run on a GPU of compute capability 10.0 (sm_100): it holds "
            "CUBIN sm_90a; compile it again with --cuda-arch sm_100");
}

TEST(CudaProgramTest, PtxNeedsADeviceAtLeastItsArchitecture) {
  const CudaProgram p = programWith({{90, false, "a"}}, 90);
  EXPECT_EQ(chosen(p, 8, 0),
            "error: the compiled program 'f' cannot run on a GPU of compute capability 8.0 (sm_80): it holds CUBIN "
            "sm_90, PTX for sm_90; compile it again with --cuda-arch sm_80");
  EXPECT_EQ(chosen(programWith({}, 75), 15, 0), "PTX for sm_75, compiled by the driver");
}

TEST(CudaProgramTest, CodeRoundTripsAndCorruptionIsAnError) {
  CudaProgram p = programWith({{80, false, std::string("\x7f" "ELF\0\1", 6)}, {90, true, "cubin"}}, 80);
  p.nvrtcVersion = "13.0";
  p.launches = {{1000, 256}, {1, 32}};
  const std::string bytes = serializeCudaCode(p);
  CudaProgram q;
  ASSERT_TRUE(parseCudaCode(bytes, "m.kc", q));
  EXPECT_EQ(q.nvrtcVersion, "13.0");
  ASSERT_EQ(q.launches.size(), 2u);
  EXPECT_EQ(q.launches[0].workItems, 1000);
  EXPECT_EQ(q.launches[1].blockSize, 32);
  ASSERT_EQ(q.cubins.size(), 2u);
  EXPECT_EQ(q.cubins[0].cubin, p.cubins[0].cubin);
  EXPECT_TRUE(q.cubins[1].archSpecific);
  EXPECT_EQ(q.ptx, p.ptx);
  EXPECT_EQ(q.ptxArch, 80);
  // Every truncation is an error naming the file, never a crash.
  for (size_t n = 0; n < bytes.size(); ++n) {
    CudaProgram r;
    Status parsed = parseCudaCode(std::string_view(bytes).substr(0, n), "m.kc", r);
    ASSERT_FALSE(parsed) << "truncated at " << n;
    EXPECT_EQ(parsed.error().message().rfind("m.kc: ", 0), 0u) << parsed.error().message();
  }
  CudaProgram extra;
  Status parsed = parseCudaCode(bytes + "x", "m.kc", extra);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().message(), "m.kc: corrupt: 1 bytes after the PTX");
}

TEST(CudaProgramTest, ValidateChecksLaunchesAgainstKernels) {
  CudaProgram p = programWith({}, 75);
  p.plan.kernelNames = {"k0"};
  p.plan.kernelHashes = {"0"};
  Status valid = p.validate();
  ASSERT_FALSE(valid);
  EXPECT_EQ(valid.error().message(), "CUDA program 'f' has 0 launch sizes for 1 kernels");
  p.launches = {{10, 2048}};
  valid = p.validate();
  ASSERT_FALSE(valid);
  EXPECT_EQ(valid.error().message(),
            "CUDA program 'f': kernel k0 has work 10 and block size 2048 (expected work >= 1 and 1 to 1024 threads a "
            "block)");
}

}  // namespace
}  // namespace kiln::cuda
