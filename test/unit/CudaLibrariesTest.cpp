// Run-time loading of the CUDA libraries (runtime/cuda/CudaLibraries.h):
// the errors name the library and every place searched; NVRTC, where the
// toolkit is installed, compiles a kernel to CUBIN and PTX with no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "runtime/cuda/CudaLibraries.h"

namespace kiln::cuda {
namespace {

TEST(CudaLibrariesTest, FormatsCudaVersions) {
  EXPECT_EQ(formatCudaVersion(13000), "13.0");
  EXPECT_EQ(formatCudaVersion(12040), "12.4");
  EXPECT_EQ(formatCudaVersion(0), "none");
  EXPECT_GE(requiredCudaVersion(), 12000);
  if (builtAgainstCudaVersion() != 0) {
    EXPECT_EQ(requiredCudaVersion(), builtAgainstCudaVersion());
  }
}

TEST(CudaLibrariesTest, MissingLibraryNamesEveryPlaceSearched) {
  LibrarySearchOptions options;
  options.cudaHome = "/nonexistent-kiln-cuda-home";
  options.searchDefaultToolkit = false;
  LibrarySpec spec{"the test library", {"libkiln-no-such-library.so.7"}, false, "Install nothing."};
  auto library = openCudaLibrary(spec, options);
  ASSERT_FALSE(library);
  const std::string& message = library.error().message();
  EXPECT_NE(message.find("the test library could not be loaded; tried:"), std::string::npos) << message;
  EXPECT_NE(message.find("libkiln-no-such-library.so.7 on the loader path"), std::string::npos) << message;
  EXPECT_NE(message.find("/nonexistent-kiln-cuda-home/lib64/libkiln-no-such-library.so.7 ($CUDA_HOME/lib64): "
                         "/nonexistent-kiln-cuda-home/lib64/libkiln-no-such-library.so.7: cannot open shared object"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("/usr/local/cuda"), std::string::npos) << message;
  EXPECT_NE(message.find("Install nothing."), std::string::npos) << message;
}

TEST(CudaLibrariesTest, ExplicitDriverPathIsTheOnlyPlaceTried) {
  LibrarySearchOptions options;
  options.driverPath = "/nonexistent-kiln/libcuda.so.1";
  auto driver = loadCudaDriver(options);
  ASSERT_FALSE(driver);
  const std::string& message = driver.error().message();
  EXPECT_NE(message.find("the CUDA driver library (libcuda.so.1) could not be loaded; tried:\n"
                         "  /nonexistent-kiln/libcuda.so.1 (from $KILN_CUDA_DRIVER or the driver path given): "
                         "/nonexistent-kiln/libcuda.so.1: cannot open shared object file"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("install the driver"), std::string::npos) << message;
}

TEST(CudaLibrariesTest, LibraryWithoutAnEntryPointNamesIt) {
  // libm opens but is not NVRTC: the first entry point resolved is missing.
  LibrarySpec spec{"a library", {"libm.so.6"}, false, ""};
  auto library = openCudaLibrary(spec, LibrarySearchOptions{});
  ASSERT_TRUE(library) << library.error().message();
  EXPECT_NE(library->path.find("libm.so.6"), std::string::npos) << library->path;
  auto address = library->symbol("nvrtcVersion");
  ASSERT_FALSE(address);
  EXPECT_NE(address.error().message().find("lacks the entry point nvrtcVersion"), std::string::npos)
      << address.error().message();
}

/// With the toolkit installed (as on the CI machine), NVRTC compiles for
/// sm_90 without a GPU; elsewhere the test says why it is skipped.
TEST(CudaLibrariesTest, NvrtcCompilesAKernelWithoutAGpu) {
  auto nvrtc = loadNvrtc();
  if (!nvrtc) GTEST_SKIP() << nvrtc.error().message();
  const NvrtcApi& api = **nvrtc;
  EXPECT_NE(api.version(), "unknown");
  std::vector<int> archs = api.supportedArchs();
  EXPECT_NE(std::find(archs.begin(), archs.end(), 90), archs.end());

  const char* source = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n";
  nvrtcProgram program = nullptr;
  ASSERT_EQ(api.nvrtcCreateProgram(&program, source, "twice.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
  const char* options[] = {"--gpu-architecture=sm_90"};
  nvrtcResult compiled = api.nvrtcCompileProgram(program, 1, options);
  size_t logSize = 0;
  ASSERT_EQ(api.nvrtcGetProgramLogSize(program, &logSize), NVRTC_SUCCESS);
  std::string log(logSize, '\0');
  ASSERT_EQ(api.nvrtcGetProgramLog(program, log.data()), NVRTC_SUCCESS);
  ASSERT_EQ(compiled, NVRTC_SUCCESS) << api.errorString(compiled) << "\n" << log;

  size_t cubinSize = 0;
  ASSERT_EQ(api.nvrtcGetCUBINSize(program, &cubinSize), NVRTC_SUCCESS);
  std::string cubin(cubinSize, '\0');
  ASSERT_EQ(api.nvrtcGetCUBIN(program, cubin.data()), NVRTC_SUCCESS);
  EXPECT_EQ(cubin.substr(0, 4),
            "\x7f"
            "ELF");
  size_t ptxSize = 0;
  ASSERT_EQ(api.nvrtcGetPTXSize(program, &ptxSize), NVRTC_SUCCESS);
  std::string ptx(ptxSize, '\0');
  ASSERT_EQ(api.nvrtcGetPTX(program, ptx.data()), NVRTC_SUCCESS);
  EXPECT_NE(ptx.find(".entry twice"), std::string::npos) << ptx;
  ASSERT_EQ(api.nvrtcDestroyProgram(&program), NVRTC_SUCCESS);

  // A broken kernel fails with NVRTC's log naming the problem.
  const char* broken = "extern \"C\" __global__ void broken(float* x) { x[0] = undeclared; }\n";
  ASSERT_EQ(api.nvrtcCreateProgram(&program, broken, "broken.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
  compiled = api.nvrtcCompileProgram(program, 1, options);
  EXPECT_EQ(api.errorString(compiled), "NVRTC_ERROR_COMPILATION");
  ASSERT_EQ(api.nvrtcGetProgramLogSize(program, &logSize), NVRTC_SUCCESS);
  log.assign(logSize, '\0');
  ASSERT_EQ(api.nvrtcGetProgramLog(program, log.data()), NVRTC_SUCCESS);
  EXPECT_NE(log.find("\"undeclared\" is undefined"), std::string::npos) << log;
  ASSERT_EQ(api.nvrtcDestroyProgram(&program), NVRTC_SUCCESS);

  // A second load returns the same table.
  auto again = loadNvrtc();
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *nvrtc);
}

}  // namespace
}  // namespace kiln::cuda
