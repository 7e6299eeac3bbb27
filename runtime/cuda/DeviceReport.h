// What `kiln devices` reports and the Python package's kiln.devices()
// returns: the CUDA probe (CudaDevices.h), the CUDA libraries Kiln loads at
// run time, the verdict line, and the one JSON object of `--json`.
#pragma once

#include <string>
#include <vector>

#include "runtime/cuda/CudaDevices.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::cuda {

/// One of the libraries loaded at run time: found (version, path) or why not.
struct LibraryStatus {
  std::string key;       // "nvrtc": the JSON name
  std::string name;      // "NVRTC"
  bool required = true;  // cuDNN is optional
  bool found = false;
  std::string version, path, error;
};

/// NVRTC from the toolkit; the math libraries from where the driver wants
/// them (the emulated GPU brings its own, mathLibraryOptions). Kiln calls
/// cuBLASLt for matrix products; cuBLAS, cuDNN and NCCL (data-parallel
/// training) are optional.
std::vector<LibraryStatus> probeLibraries(const LibrarySearchOptions& options);

/// "9.0".
std::string computeCapability(const CudaDeviceInfo& d);

/// The verdict, as `torch.cuda.is_available()` would answer it, with the
/// reason.
std::string verdict(const CudaReport& report);

/// `kiln devices --json`: one JSON object (no trailing newline).
std::string devicesJson(const CudaReport& report, const std::vector<LibraryStatus>& libraries);

}  // namespace kiln::cuda
