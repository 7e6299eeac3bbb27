// driver/Device.h: the device `kiln compile --device` compiles for (its
// values checked for form, no device needed) and the device whose
// architecture it compiles for by default, against the fake driver of
// test/devices/fake-driver ($KILN_FAKE_CUDA picks its machine).
#include "driver/Device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kiln {
namespace {

cuda::LibrarySearchOptions fakeDriver(const char* scenario) {
  setenv("KILN_FAKE_CUDA", scenario, 1);
  cuda::LibrarySearchOptions options;
  options.driverPath = KILN_FAKE_CUDA_DRIVER;
  return options;
}

TEST(DeviceTest, CompileDeviceValuesAreCheckedForFormOnly) {
  auto cpu = resolveCompileDevice("cpu", nullptr);
  ASSERT_TRUE(std::holds_alternative<CompileDevice>(cpu));
  EXPECT_EQ(std::get<CompileDevice>(cpu).kind, DeviceChoice::Kind::Cpu);
  auto cuda = resolveCompileDevice("cuda", nullptr);
  ASSERT_TRUE(std::holds_alternative<CompileDevice>(cuda));
  EXPECT_EQ(std::get<CompileDevice>(cuda).kind, DeviceChoice::Kind::Cuda);
  EXPECT_FALSE(std::get<CompileDevice>(cuda).index.has_value());
  // No device 7 is needed to compile for it.
  auto seventh = resolveCompileDevice("cuda:7", nullptr);
  ASSERT_TRUE(std::holds_alternative<CompileDevice>(seventh));
  EXPECT_EQ(std::get<CompileDevice>(seventh).index, 7);
}

TEST(DeviceTest, MalformedCompileDevicesAreUsageErrors) {
  auto unknown = resolveCompileDevice("tpu", nullptr);
  ASSERT_TRUE(std::holds_alternative<DeviceError>(unknown));
  EXPECT_TRUE(std::get<DeviceError>(unknown).usage);
  EXPECT_EQ(std::get<DeviceError>(unknown).error.message(),
            "unknown device 'tpu' (valid devices: cpu, cuda, cuda:N, auto)");
  for (const char* bad : {"cuda:x", "cuda:", "cuda:-1", "cuda:1048577"}) {
    auto malformed = resolveCompileDevice(bad, nullptr);
    ASSERT_TRUE(std::holds_alternative<DeviceError>(malformed)) << bad;
    EXPECT_TRUE(std::get<DeviceError>(malformed).usage) << bad;
    EXPECT_EQ(std::get<DeviceError>(malformed).error.message(),
              "the device index in --device cuda:N expects a whole number from 0 to 1048576, got '" +
                  std::string(bad).substr(5) + "'");
  }
}

TEST(DeviceTest, ArchDeviceIsTheNamedOrTheFirstUsable) {
  const auto search = fakeDriver("2xh100-oom1");
  auto first = compileArchDevice({DeviceChoice::Kind::Cuda, std::nullopt}, search);
  ASSERT_TRUE(first) << first.error().message();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->index, 0);
  EXPECT_EQ((*first)->computeMajor, 9);
  // Named, a device out of memory still gives its architecture.
  auto second = compileArchDevice({DeviceChoice::Kind::Cuda, 1}, search);
  ASSERT_TRUE(second) << second.error().message();
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ((*second)->index, 1);
  auto missing = compileArchDevice({DeviceChoice::Kind::Cuda, 2}, search);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().message(),
            "--device cuda:2: there is no CUDA device 2: this machine has 2 (give --cuda-arch to compile for an "
            "architecture without its device)");
  // The CPU has no CUDA architecture.
  auto cpu = compileArchDevice({}, search);
  ASSERT_TRUE(cpu);
  EXPECT_FALSE(cpu->has_value());
}

TEST(DeviceTest, NoDriverGivesNoArchDevice) {
  cuda::LibrarySearchOptions none;
  none.driverPath = "/nonexistent/libcuda.so.1";
  auto device = compileArchDevice({DeviceChoice::Kind::Cuda, 3}, none);
  ASSERT_TRUE(device) << device.error().message();
  EXPECT_FALSE(device->has_value());
}

}  // namespace
}  // namespace kiln
