// Device discovery (runtime/cuda/CudaDevices.h) against the fake driver of
// test/devices/fake-driver, whose behaviour $KILN_FAKE_CUDA picks: the API that
// `kiln devices` and `--device cuda` share, seen from C++.
#include "runtime/cuda/CudaDevices.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kiln::cuda {
namespace {

LibrarySearchOptions fakeDriver(const char* scenario) {
  setenv("KILN_FAKE_CUDA", scenario, 1);
  LibrarySearchOptions options;
  options.driverPath = KILN_FAKE_CUDA_DRIVER;
  return options;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CudaDevicesTest, TwoDevicesOneOutOfMemory) {
  CudaReport report = probeCuda(fakeDriver("2xh100-oom1"));
  ASSERT_TRUE(report.usable()) << report.message;
  EXPECT_EQ(report.driverRelease, "999.0.1");
  EXPECT_EQ(report.driverCudaVersion, 13000);
  ASSERT_EQ(report.devices.size(), 2u);
  const CudaDeviceInfo& first = report.devices[0];
  EXPECT_EQ(first.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(first.computeMajor, 9);
  EXPECT_EQ(first.computeMinor, 0);
  EXPECT_EQ(first.multiprocessors, 132);
  EXPECT_EQ(first.totalBytes, 85520809984u);
  ASSERT_TRUE(first.freeBytes.has_value());
  EXPECT_EQ(*first.freeBytes, 85520809984u - 536870912u);
  EXPECT_TRUE(first.usable());
  EXPECT_EQ(report.devices[1].problem, CudaProblem::OutOfMemory);
  EXPECT_FALSE(report.devices[1].freeBytes.has_value());
  EXPECT_EQ(report.usableDevices(), std::vector<int>{0});

  auto chosen = requireCudaDevice(fakeDriver("2xh100-oom1"), std::nullopt);
  ASSERT_TRUE(chosen) << chosen.error().message();
  EXPECT_EQ(chosen->index, 0);
  auto second = requireCudaDevice(fakeDriver("2xh100-oom1"), 1);
  ASSERT_FALSE(second);
  EXPECT_TRUE(contains(second.error().message(), "cuda:1 (NVIDIA H100 80GB HBM3) is out of memory"))
      << second.error().message();
  auto third = requireCudaDevice(fakeDriver("2xh100-oom1"), 2);
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().message(), "there is no CUDA device 2: this machine has 2 devices (cuda:0 to cuda:1)");
}

TEST(CudaDevicesTest, EachFailureHasItsProblem) {
  struct Case {
    const char* scenario;
    CudaProblem problem;
    const char* message;
  };
  const Case cases[] = {
      {"no-device", CudaProblem::NoDevice, "the NVIDIA driver found no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE"},
      {"insufficient-driver", CudaProblem::DriverTooOld, "the NVIDIA driver is too old: it supports CUDA 12.4"},
      {"old-driver", CudaProblem::DriverTooOld, "the NVIDIA driver is too old: it supports CUDA 12.4"},
      {"stub", CudaProblem::DriverError, "is the CUDA toolkit's stub library, not a driver"},
      {"mismatch", CudaProblem::DriverError, "does not match the loaded kernel module"},
      {"oom", CudaProblem::OutOfMemory, "cuda:0 (NVIDIA H100 80GB HBM3) is out of memory"},
      {"busy", CudaProblem::DeviceUnavailable, "it is in exclusive-process mode and another process is using it"},
  };
  for (const Case& c : cases) {
    CudaReport report = probeCuda(fakeDriver(c.scenario));
    EXPECT_EQ(report.problem, c.problem) << c.scenario;
    EXPECT_TRUE(contains(report.message, c.message)) << c.scenario << ": " << report.message;
    auto device = requireCudaDevice(fakeDriver(c.scenario), std::nullopt);
    ASSERT_FALSE(device) << c.scenario;
    EXPECT_EQ(device.error().message(), "CUDA is not usable: " + report.message) << c.scenario;
  }
}

TEST(CudaDevicesTest, NoDriverLibrary) {
  LibrarySearchOptions options;
  options.driverPath = "/nonexistent-kiln/libcuda.so.1";
  CudaReport report = probeCuda(options);
  EXPECT_EQ(report.problem, CudaProblem::NoDriver);
  EXPECT_STREQ(cudaProblemName(report.problem), "no-driver");
  EXPECT_TRUE(report.driverPath.empty());
  EXPECT_TRUE(contains(report.message, "/nonexistent-kiln/libcuda.so.1: cannot open shared object file"))
      << report.message;
}

TEST(CudaDevicesTest, FormatsBytes) {
  EXPECT_EQ(formatBytes(85520809984u), "79.65 GiB");
  EXPECT_EQ(formatBytes(0), "0.00 GiB");
}

}  // namespace
}  // namespace kiln::cuda
