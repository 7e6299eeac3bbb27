// The emulated GPU's set-up for the CUDA unit tests (EmulatedGpu.h).
#include "test/unit/EmulatedGpu.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

#include "codegen/cuda/CudaExecutor.h"
#include "runtime/cuda/CudaDevices.h"

#ifndef KILN_CUDA_EMULATOR_DRIVER
#error "KILN_CUDA_EMULATOR_DRIVER must name the emulated GPU's libcuda.so.1 (test/CMakeLists.txt)"
#endif

namespace kiln::test {

const char* emulatorDriverPath() { return KILN_CUDA_EMULATOR_DRIVER; }

bool emulatorBuilt() {
  std::error_code ignored;
  return std::filesystem::exists(emulatorDriverPath(), ignored);
}

cuda::LibrarySearchOptions emulatorOptions() {
  cuda::LibrarySearchOptions options;
  options.driverPath = emulatorDriverPath();
  return options;
}

std::shared_ptr<cuda::CudaContext> emulatorContext() {
  const cuda::LibrarySearchOptions options = emulatorOptions();
  auto device = cuda::requireCudaDevice(options, std::nullopt);
  if (!device) {
    ADD_FAILURE() << "the emulated GPU has no usable device: " << device.error().message();
    return nullptr;
  }
  auto context = cuda::CudaContext::get(*device, options);
  if (!context) {
    ADD_FAILURE() << "the emulated GPU's context: " << context.error().message();
    return nullptr;
  }
  return *context;
}

std::optional<std::vector<Tensor>> emulatedGpuResults(const Function& f, const std::vector<Tensor>& inputs) {
  auto context = emulatorContext();
  if (!context) return std::nullopt;
  auto executor = codegen::CudaExecutor::create(f, context);
  if (!executor.ok()) {
    ADD_FAILURE() << "compiling for the emulated GPU: " << executor.error().str();
    return std::nullopt;
  }
  auto results = (*executor)->run(inputs);
  if (!results.ok()) {
    ADD_FAILURE() << "running on the emulated GPU: " << results.error().str();
    return std::nullopt;
  }
  return std::move(*results);
}

}  // namespace kiln::test
