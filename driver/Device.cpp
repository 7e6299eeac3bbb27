// Device resolution (Device.h): the `--device` values, for running and for
// compiling.
#include "driver/Device.h"

#include <charconv>
#include <string_view>

namespace kiln {

std::string DeviceChoice::str() const {
  if (kind == Kind::Cpu) return "cpu";
  return "cuda:" + std::to_string(cuda.index) + " (" + cuda.name + ")";
}

namespace {

/// The N of `cuda:N`, or nullopt when `digits` is not a whole number from 0
/// to kMaxDeviceIndex.
constexpr int kMaxDeviceIndex = 1 << 20;
std::optional<int> parseDeviceIndex(std::string_view digits) {
  int value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 0 ||
      value > kMaxDeviceIndex)
    return std::nullopt;
  return value;
}

}  // namespace

std::variant<DeviceChoice, DeviceError> resolveDevice(const std::string& spec, std::string* notice) {
  cuda::LibrarySearchOptions options = cuda::LibrarySearchOptions::fromEnvironment();
  if (spec == "cpu") return DeviceChoice{};
  if (spec == "auto") {
    cuda::CudaReport report = cuda::probeCuda(options);
    if (!report.usable()) {
      // One line; the missing driver's full search is for `kiln devices`.
      std::string reason = report.problem == cuda::CudaProblem::NoDriver
                               ? "no NVIDIA driver: libcuda.so.1 could not be loaded"
                               : report.message;
      if (!reason.empty() && reason.back() == '.') reason.pop_back();
      if (notice) *notice = "--device auto chose cpu (CUDA is not usable: " + reason + "; `kiln devices` tells more)";
      return DeviceChoice{};
    }
    DeviceChoice choice{DeviceChoice::Kind::Cuda, report.devices[static_cast<size_t>(report.usableDevices().front())]};
    if (notice) *notice = "--device auto chose " + choice.str();
    return choice;
  }
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    std::optional<int> index;
    if (spec != "cuda") {
      index = parseDeviceIndex(std::string_view(spec).substr(5));
      if (!index)
        return DeviceError{true, Error("the device index in --device cuda:N expects a whole number from 0 to " +
                                       std::to_string(kMaxDeviceIndex) + ", got '" + spec.substr(5) + "'")};
    }
    auto device = cuda::requireCudaDevice(options, index);
    if (!device) return DeviceError{false, Error("--device " + spec + ": " + device.error().message())};
    return DeviceChoice{DeviceChoice::Kind::Cuda, *device};
  }
  return DeviceError{true, Error("unknown device '" + spec + "' (valid devices: cpu, cuda, cuda:N, auto)")};
}

std::variant<CompileDevice, DeviceError> resolveCompileDevice(const std::string& spec, std::string* notice) {
  if (spec == "cpu") return CompileDevice{};
  if (spec == "auto") {
    // Compiles for CUDA when running there would; the reason CUDA is not
    // usable is for `kiln devices`.
    auto resolved = resolveDevice("auto", nullptr);
    const auto* choice = std::get_if<DeviceChoice>(&resolved);
    const bool cuda = choice && choice->kind == DeviceChoice::Kind::Cuda;
    if (notice) *notice = std::string("--device auto chose ") + (cuda ? "cuda" : "cpu");
    return cuda ? CompileDevice{DeviceChoice::Kind::Cuda, std::nullopt} : CompileDevice{};
  }
  if (spec == "cuda") return CompileDevice{DeviceChoice::Kind::Cuda, std::nullopt};
  if (spec.rfind("cuda:", 0) == 0) {
    std::optional<int> index = parseDeviceIndex(std::string_view(spec).substr(5));
    if (!index)
      return DeviceError{true, Error("the device index in --device cuda:N expects a whole number from 0 to " +
                                     std::to_string(kMaxDeviceIndex) + ", got '" + spec.substr(5) + "'")};
    return CompileDevice{DeviceChoice::Kind::Cuda, index};
  }
  return DeviceError{true, Error("unknown device '" + spec + "' (valid devices: cpu, cuda, cuda:N, auto)")};
}

Expected<std::optional<cuda::CudaDeviceInfo>> compileArchDevice(const CompileDevice& device,
                                                                const cuda::LibrarySearchOptions& search) {
  if (device.kind != DeviceChoice::Kind::Cuda) return std::optional<cuda::CudaDeviceInfo>();
  const std::optional<int> index = device.index;
  const cuda::CudaReport probe = cuda::probeCuda(search, index);
  if (index && *index >= static_cast<int>(probe.devices.size()) && !probe.devices.empty())
    return Error("--device cuda:" + std::to_string(*index) + ": there is no CUDA device " + std::to_string(*index) +
                 ": this machine has " + std::to_string(probe.devices.size()) +
                 " (give --cuda-arch to compile for an architecture without its device)");
  const cuda::CudaDeviceInfo* chosen = nullptr;
  for (const cuda::CudaDeviceInfo& d : probe.devices)
    if (index ? d.index == *index : (d.usable() || !chosen)) {
      chosen = &d;
      if (index || d.usable()) break;
    }
  if (!chosen) return std::optional<cuda::CudaDeviceInfo>();
  return std::optional<cuda::CudaDeviceInfo>(*chosen);
}

}  // namespace kiln
