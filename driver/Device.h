// Device resolution: which device a `--device` value (or Python's
// `device=`) names, for running (resolveDevice: the device must answer) and
// for compiling (resolveCompileDevice: no device is needed, so `cuda:N` is
// checked for form only; compileArchDevice: the device whose architecture
// compiled code targets by default). `cuda` and `cuda:N` never fall back to
// the CPU; `auto` picks CUDA when a usable device answers, else the CPU, and
// says which. The command line only prints these answers
// (tools/DeviceSelection.h); the session runs on the first
// (driver/Session.h).
#pragma once

#include <optional>
#include <string>
#include <variant>

#include "ir/Support.h"
#include "runtime/cuda/CudaDevices.h"

namespace kiln {

/// The device a session runs on.
struct DeviceChoice {
  enum class Kind { Cpu, Cuda };
  Kind kind = Kind::Cpu;
  cuda::CudaDeviceInfo cuda;  // the CUDA device, when kind is Cuda
  /// "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)".
  std::string str() const;
};

/// Why a device could not be chosen: a malformed `--device` value (a usage
/// error) or a device that is not usable.
struct DeviceError {
  bool usage = false;
  Error error;
};

/// Resolves a device value `cpu`, `cuda`, `cuda:N` or `auto`. `auto` picks
/// CUDA when it is usable, else the CPU, and says which in `notice`.
/// `cuda` and `cuda:N` are an error when no usable device answers, with the
/// reason `kiln devices` gives.
std::variant<DeviceChoice, DeviceError> resolveDevice(const std::string& spec, std::string* notice);

/// The device `kiln compile` compiles for.
struct CompileDevice {
  DeviceChoice::Kind kind = DeviceChoice::Kind::Cpu;
  /// The N of `cuda:N`; none for `cuda` (and the CPU).
  std::optional<int> index;
};

/// Resolves a device value `cpu`, `cuda`, `cuda:N` or `auto` to compile
/// for. No device is needed to compile for CUDA, so `cuda:N`'s N is checked
/// for form only; `auto` picks CUDA when a usable device answers, else the
/// CPU, and says which in `notice`. A malformed value is a usage error.
std::variant<CompileDevice, DeviceError> resolveCompileDevice(const std::string& spec, std::string* notice);

/// The CUDA device whose architecture code compiled for `device` targets
/// when no architecture is given: the one `cuda:N` names, else the first
/// usable one, else the first the driver shows; none when it shows none
/// (no driver, no device). An N past the devices shown is an error naming
/// how many there are. `search` finds the driver.
Expected<std::optional<cuda::CudaDeviceInfo>> compileArchDevice(const CompileDevice& device,
                                                                const cuda::LibrarySearchOptions& search);

}  // namespace kiln
