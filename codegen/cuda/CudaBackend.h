// The CUDA backend (codegen/Backend.h): cuBLASLt and cuDNN for the library
// calls it takes (CudaTarget.h), the CUDA schedule (codegen/Schedule.h
// scheduleForCuda: grid-stride loops, warp and block row reductions), and
// programs whose kernels are one CUDA C++ translation unit compiled by NVRTC
// into CUBINs and PTX (CudaCompiler.h). No GPU is needed to compile; a
// `.kc` it wrote holds the CUBINs and PTX in its code section
// (runtime/cuda/CudaProgram.h serializeCudaCode).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "codegen/Backend.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::codegen {

/// The CUDA compiler's options.
struct CudaCompilerOptions : BackendOptions {
  /// CUBIN architectures (90 for sm_90) and architecture-specific ones
  /// (sm_90a); both empty: PTX alone for `ptxArch` when given, else those
  /// of a device of compute capability `deviceMajor`.`deviceMinor`
  /// (defaultCudaArchs; 0.0: no device, sm_90).
  std::vector<int> archs;
  std::vector<int> specificArchs;
  std::optional<int> ptxArch;
  int deviceMajor = 0;
  int deviceMinor = 0;
  /// Where NVRTC is looked for.
  cuda::LibrarySearchOptions search = cuda::LibrarySearchOptions::fromEnvironment();
};

/// A new CUDA backend (the registry holds the one `--target cuda` names).
std::unique_ptr<Backend> createCudaBackend();
/// The registered CUDA backend.
const Backend& cudaBackend();

}  // namespace kiln::codegen
