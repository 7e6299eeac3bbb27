// The loader of CUDA programs for the runtime's registry
// (runtime/ProgramLoaders.h): a `.kc` compiled for CUDA (its device
// kCudaDevice) runs on a CudaRunner of the first usable CUDA device, with no
// compiler in the process. A program that links the CUDA runtime calls
// registerCudaProgramLoader once; then loadProgram, and the embedding API
// (runtime/Kiln.h) with it, run CUDA `.kc` files too.
#pragma once

#include "runtime/ProgramLoaders.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::cuda {

/// Registers the CUDA loader, which finds the driver and the math libraries
/// with `search`; later calls do nothing and return the first one's status.
Status registerCudaProgramLoader(const LibrarySearchOptions& search);

}  // namespace kiln::cuda
