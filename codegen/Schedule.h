// Target schedules for kernel IR (codegen/KernelIR.h, Schedule): how each
// target runs a kernel's loops, decided once here and followed by its
// emitter. The CPU runs the outermost parallel loop as one contiguous slice
// per thread and asks for SIMD lanes on the vectorizable loop; CUDA flattens
// the parallel loop and the independent loops perfectly nested in it into
// one index space that the grid covers grid-stride, 256 threads per block
// (a reduction inside stays sequential in its thread: block and warp
// reductions are CUDA execution's next step).
#pragma once

#include <string_view>

#include "codegen/KernelIR.h"

namespace kiln::codegen {

/// Schedules `kernel` for the CPU (codegen/llvm/).
void scheduleForCpu(kir::Kernel& kernel);
/// Schedules `kernel` for CUDA (codegen/cuda/).
void scheduleForCuda(kir::Kernel& kernel);
/// Schedules `kernel` for the target named `target` ("cpu" or "cuda").
void scheduleFor(std::string_view target, kir::Kernel& kernel);

}  // namespace kiln::codegen
