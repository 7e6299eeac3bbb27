// A compiled CUDA program as plain data: what codegen/cuda/CudaCompiler.h
// produces and runtime/cuda/CudaRunner.h executes. Its steps, slots, host
// checks, library calls and memory plan are the same plain data a CPU
// program has (runtime/CpuProgram.h, whose shared object and machine stay
// empty here: the one lowering, codegen/LowerToKernels.h, serves both
// targets); what is CUDA's own is the code and how to launch it:
//
//   - per kernel, its flattened work size and block size (the grid is
//     chosen when launching: every kernel strides over its work, so any
//     grid is correct);
//   - a CUBIN per architecture it was compiled for, and the PTX of the
//     oldest one, which a driver compiles for any newer GPU.
//
// Which image a device loads (selectCudaImage): a CUBIN built for sm_XY
// runs on a device of the same major version X and a minor version of Y or
// more; one built for an architecture-specific target (sm_90a) runs on that
// exact architecture only; otherwise the PTX, when the device is at least
// its architecture, is compiled by the driver.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/CpuProgram.h"
#include "runtime/KcFile.h"

namespace kiln::cuda {

/// The device name of a CUDA program's `.kc` (CompiledArtifact::device),
/// the CUDA backend's name (codegen/cuda/CudaBackend.h).
inline constexpr std::string_view kCudaDevice = "cuda";

struct CudaKernelLaunch {
  /// Elements of the kernel's flattened parallel loop (1: a scalar kernel).
  int64_t workItems = 1;
  /// Threads per block, as its __launch_bounds__ promise.
  int blockSize = 256;
};

/// Machine code for one architecture.
struct CudaImage {
  int arch = 0;               // 90 for sm_90
  bool archSpecific = false;  // sm_90a: runs on sm_90 only
  std::string cubin;
  /// "sm_90", "sm_90a".
  std::string name() const;
};

struct CudaProgram {
  /// Steps, slots, arena and library calls; `kernelNames` are the CUDA
  /// kernels' names. Its sharedObject and machine are unused.
  CpuProgram plan;
  /// One per kernel of plan.kernelNames.
  std::vector<CudaKernelLaunch> launches;
  std::vector<CudaImage> cubins;
  /// PTX compiled for sm_<ptxArch>, the oldest architecture of the program.
  int ptxArch = 0;
  std::string ptx;
  std::string nvrtcVersion;

  /// The plan's checks, one launch per kernel, images and PTX present.
  Status validate() const;
};

/// What a device of compute capability major.minor loads.
struct ImageChoice {
  int cubin = -1;  // the index in CudaProgram::cubins, or -1 for the PTX
  /// "CUBIN sm_90" or "PTX for sm_80, compiled by the driver".
  std::string describe(const CudaProgram& program) const;
};

/// The image a device of compute capability `major`.`minor` runs: the CUBIN
/// of the newest compatible architecture, else the PTX; an error naming the
/// device's architecture and what the program holds when neither fits.
Expected<ImageChoice> selectCudaImage(const CudaProgram& program, int major, int minor);

/// Bytes of everything but the plan (launches, images, PTX), and back.
std::string serializeCudaCode(const CudaProgram& program);
Status parseCudaCode(std::string_view bytes, const std::string& what, CudaProgram& program);

/// The CUDA program of a `.kc` file compiled for CUDA (artifact.device is
/// kCudaDevice); `filename` names it in errors.
Expected<std::shared_ptr<CudaProgram>> cudaProgramOf(const CompiledArtifact& artifact, const std::string& filename);

}  // namespace kiln::cuda
