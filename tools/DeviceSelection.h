// `--device cpu|cuda|cuda:N|auto`, shared by the `kiln` commands that run
// code on a device: the exit statuses and messages of resolveDevice
// (driver/Device.h). `cuda` and `cuda:N` never fall back to the CPU:
// without a usable device the command fails with the reason runtime/cuda/
// CudaDevices.h gives (the same one `kiln devices` prints). `auto` picks
// CUDA when it is usable, else the CPU, and says which on stderr.
#pragma once

#include <string>
#include <string_view>

#include "driver/Device.h"

namespace kiln::cli {

/// Resolves the `--device` value `spec` for `command`. Returns kExitOk and
/// fills `choice`, or reports the problem and returns the exit status: a
/// usage error (2) for a malformed value, an error (1) when CUDA is asked
/// for and not usable.
int selectDevice(std::string_view command, const std::string& spec, DeviceChoice& choice);

}  // namespace kiln::cli
