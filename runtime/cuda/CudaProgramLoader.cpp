// The CUDA program loader of CudaProgramLoader.h.
#include "runtime/cuda/CudaProgramLoader.h"

#include "runtime/StageDriver.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaDevices.h"
#include "runtime/cuda/CudaProgram.h"
#include "runtime/cuda/CudaRunner.h"

namespace kiln::cuda {

Status registerCudaProgramLoader(const LibrarySearchOptions& search) {
  static const Status registered = registerProgramLoader(
      kCudaDevice,
      [search](const CompiledArtifact& artifact, const std::string& filename,
               const ProgramRunOptions&) -> Expected<std::unique_ptr<LoadedProgram>> {
        auto device = requireCudaDevice(search, std::nullopt);
        if (!device) return Error(filename + ": " + device.error().message());
        auto context = CudaContext::get(*device, search);
        if (!context) return context.takeError();
        if (artifact.staged) {
          // A program with host steps: each part a CudaRunner on the same
          // device, the stages run by the runtime's stage driver.
          auto parts = cudaPartsOf(*artifact.staged, filename);
          if (!parts) return parts.takeError();
          auto runner = StagedRunner::create(
              artifact.staged, [&](size_t i) -> Expected<std::unique_ptr<LoadedProgram>> {
                auto part = CudaRunner::create((*parts)[i], *context, CudaRunOptions{});
                if (!part) return part.takeError();
                return std::unique_ptr<LoadedProgram>(std::move(*part));
              });
          if (!runner) return Error(filename + ": " + runner.error().message());
          return std::unique_ptr<LoadedProgram>(std::move(*runner));
        }
        auto program = cudaProgramOf(artifact, filename);
        if (!program) return program.takeError();
        auto runner = CudaRunner::create(*program, *context, CudaRunOptions{});
        if (!runner) return Error(filename + ": " + runner.error().message());
        return std::unique_ptr<LoadedProgram>(std::move(*runner));
      });
  return registered;
}

}  // namespace kiln::cuda
