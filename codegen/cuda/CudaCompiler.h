// The compile half of the CUDA backend: from a function at the end of the
// CUDA target's pipeline to a CudaProgram (runtime/cuda/CudaProgram.h). The
// steps, slots and memory plan are laid out as for the CPU
// (codegen/cpu/CpuCompiler.h layoutProgram, kernels scheduled for CUDA); the
// kernels become one CUDA C++ translation unit (CudaEmitter.h) that NVRTC
// compiles into a CUBIN for each architecture asked for, and into PTX for
// the oldest of them, which drivers of newer GPUs compile themselves.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/IR.h"
#include "passes/MemoryPlan.h"
#include "runtime/cuda/CudaProgram.h"

namespace kiln::cuda {
struct NvrtcApi;
}

namespace kiln::codegen {

struct CudaCompilation {
  std::shared_ptr<cuda::CudaProgram> program;
  std::vector<kir::Kernel> kernels;
  MemoryPlan plan;
  /// The translation unit NVRTC compiled, and its warnings.
  std::string source;
  std::string log;
};

struct CudaCompileOptions {
  /// Architectures to build CUBINs for (90 for sm_90; empty: PTX only, for
  /// `ptxArch`).
  std::vector<int> archs;
  /// Architecture-specific CUBINs (90 for sm_90a), which run on that exact
  /// architecture only.
  std::vector<int> specificArchs;
  /// The architecture of the PTX when `archs` and `specificArchs` are empty.
  int ptxArch = 75;
  std::string kernelPrefix = "kiln_";
};

/// Compiles `f` for CUDA. Ops that cannot be lowered yet are an error naming
/// each (also in `unsupported`).
Expected<CudaCompilation> compileCudaProgram(const Function& f, const cuda::NvrtcApi& nvrtc,
                                             const CudaCompileOptions& options,
                                             std::vector<std::string>* unsupported = nullptr);

/// The architectures to compile for when none is given, for a device of
/// compute capability major.minor (0.0: no device): its own when NVRTC can
/// build it, else none (PTX only, of the newest NVRTC architecture below
/// the device's, which `ptxArch` receives); sm_90 without a device.
std::vector<int> defaultCudaArchs(const cuda::NvrtcApi& nvrtc, int major, int minor, int* ptxArch);

}  // namespace kiln::codegen
