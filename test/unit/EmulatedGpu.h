// The emulated GPU (test/devices/emulator/) as the CUDA unit tests load it:
// where its libcuda.so.1 is, the LibrarySearchOptions that load it (and,
// through mathLibraryOptions, its own cuBLASLt, cuDNN and NCCL beside it),
// device 0's primary context on it, and the skip of a test where it is not
// built. One copy of the set-up the CUDA tests each had: the tests know the
// emulator only as a driver library at a path, as Kiln does through
// $KILN_CUDA_DRIVER.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaLibraries.h"
#include "ir/IR.h"
#include "runtime/Tensor.h"

namespace kiln::test {

/// The emulated GPU's libcuda.so.1 in the build tree
/// (KILN_CUDA_EMULATOR_DRIVER, which test/CMakeLists.txt defines).
const char* emulatorDriverPath();

/// Whether the emulated GPU is built (its libcuda.so.1 exists).
bool emulatorBuilt();

/// Options that load the emulated GPU's driver instead of the system's.
/// The math libraries then come from the driver's folder only
/// (mathLibraryOptions), never NVIDIA's.
cuda::LibrarySearchOptions emulatorOptions();

/// Device 0 of the emulated GPU and its primary context (CudaContext::get,
/// shared by the process). On an error, fails the calling test with its
/// message and returns null.
std::shared_ptr<cuda::CudaContext> emulatorContext();

/// The results of `f` on `inputs` compiled for and run on the emulated GPU
/// (emulatorContext); on an error, fails the test with its message and
/// returns nullopt.
std::optional<std::vector<Tensor>> emulatedGpuResults(const Function& f, const std::vector<Tensor>& inputs);

}  // namespace kiln::test

/// Skips the calling test, saying why, where the emulated GPU is not built.
#define KILN_REQUIRE_EMULATOR()                                                                  \
  if (!::kiln::test::emulatorBuilt())                                                             \
  GTEST_SKIP() << "the emulated GPU (" << ::kiln::test::emulatorDriverPath() << ") is not built"
