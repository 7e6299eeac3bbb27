// `--device` resolution (DeviceSelection.h).
#include "tools/DeviceSelection.h"

#include <iostream>

#include "tools/KilnCommands.h"

namespace kiln::cli {

std::string DeviceChoice::str() const {
  if (kind == Kind::Cpu) return "cpu";
  return "cuda:" + std::to_string(cuda.index) + " (" + cuda.name + ")";
}

int selectDevice(std::string_view command, const std::string& spec, DeviceChoice& choice) {
  cuda::LibrarySearchOptions options = cuda::LibrarySearchOptions::fromEnvironment();
  if (spec == "cpu") {
    choice = DeviceChoice{};
    return kExitOk;
  }
  if (spec == "auto") {
    cuda::CudaReport report = cuda::probeCuda(options);
    if (!report.usable()) {
      // One line on stderr; the missing driver's full search is for `kiln devices`.
      std::string reason = report.problem == cuda::CudaProblem::NoDriver
                               ? "no NVIDIA driver: libcuda.so.1 could not be loaded"
                               : report.message;
      if (!reason.empty() && reason.back() == '.') reason.pop_back();
      std::cerr << "kiln " << command << ": --device auto chose cpu (CUDA is not usable: " << reason
                << "; `kiln devices` tells more)\n";
      choice = DeviceChoice{};
      return kExitOk;
    }
    choice =
        DeviceChoice{DeviceChoice::Kind::Cuda, report.devices[static_cast<size_t>(report.usableDevices().front())]};
    std::cerr << "kiln " << command << ": --device auto chose " << choice.str() << "\n";
    return kExitOk;
  }
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    std::optional<int> index;
    if (spec != "cuda") {
      auto n = parseInteger(std::string_view(spec).substr(5), "the device index in --device cuda:N", 0, 1 << 20);
      if (!n) return usageError(command, n.error().message());
      index = static_cast<int>(*n);
    }
    auto device = cuda::requireCudaDevice(options, index);
    if (!device) {
      reportError(command, Error("--device " + spec + ": " + device.error().message()));
      return kExitError;
    }
    choice = DeviceChoice{DeviceChoice::Kind::Cuda, *device};
    return kExitOk;
  }
  return usageError(command, "unknown device '" + spec + "' (valid devices: cpu, cuda, cuda:N, auto)");
}

}  // namespace kiln::cli
