// CUDA C++ to CUBIN with NVRTC, which needs no GPU: the CUDA emitter's
// translation unit (CudaEmitter.h) is compiled for one real architecture
// (`sm_90`), giving the CUBIN a device loads with cuModuleLoadData and the
// PTX that NVRTC produced on the way, kept for drivers of newer GPUs to JIT.
// NVRTC itself is loaded with dlopen (runtime/cuda/CudaLibraries.h), so a
// machine without the CUDA toolkit gets an error naming the library and the
// paths tried, never a link failure.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/Support.h"

namespace kiln::cuda {
struct NvrtcApi;
}

namespace kiln::codegen {

/// The architecture of `sm_90` (90); an error saying what is expected for
/// anything else. Whether NVRTC supports it is checked when compiling.
Expected<int> parseCudaArch(std::string_view text);
/// `sm_90` or the architecture-specific `sm_90a` (code for that exact
/// architecture, with its own instructions): the number, and whether the
/// `a` was there.
struct CudaArchSpec {
  int arch = 90;
  bool specific = false;
};
Expected<CudaArchSpec> parseCudaArchSpec(std::string_view text);

/// What NVRTC made of one translation unit.
struct CudaBinary {
  int arch = 0;             // 90 for sm_90
  std::string nvrtcVersion; // "13.0"
  std::string cubin;        // ELF for sm_<arch>
  std::string ptx;          // the PTX it was assembled from
  std::string log;          // NVRTC's warnings, if any
};

/// Compiles `source` (named `name` in NVRTC's messages) for sm_<arch>. An
/// architecture this NVRTC lacks is an error listing the ones it has; a
/// failed compilation is an error holding NVRTC's log, with the kernel each
/// error line falls in. With `ptxOnly`, only PTX is made (for the virtual
/// architecture compute_<arch>), and `cubin` stays empty.
/// With `archSpecific`, the CUBIN is for sm_<arch>a.
Expected<CudaBinary> compileCudaSource(const cuda::NvrtcApi& nvrtc, const std::string& source, const std::string& name,
                                       int arch, bool ptxOnly = false, bool archSpecific = false);

/// How many of `kernels` the CUBIN defines (their names in its symbol
/// table), as a check that what NVRTC produced holds every kernel.
size_t countKernelsInCubin(const std::string& cubin, const std::vector<std::string>& kernels);

}  // namespace kiln::codegen
