// The CUDA program loader of CudaProgramLoader.h.
#include "runtime/cuda/CudaProgramLoader.h"

#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaDevices.h"
#include "runtime/cuda/CudaProgram.h"
#include "runtime/cuda/CudaRunner.h"

namespace kiln::cuda {

namespace {

class LoadedCudaProgram : public LoadedProgram {
 public:
  explicit LoadedCudaProgram(std::unique_ptr<CudaRunner> runner) : runner_(std::move(runner)) {}
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs) override { return runner_->run(inputs); }

 private:
  std::unique_ptr<CudaRunner> runner_;
};

}  // namespace

Status registerCudaProgramLoader(const LibrarySearchOptions& search) {
  static const Status registered = registerProgramLoader(
      kCudaDevice,
      [search](const CompiledArtifact& artifact, const std::string& filename,
               const ProgramRunOptions&) -> Expected<std::unique_ptr<LoadedProgram>> {
        auto program = cudaProgramOf(artifact, filename);
        if (!program) return program.takeError();
        auto device = requireCudaDevice(search, std::nullopt);
        if (!device) return Error(filename + ": " + device.error().message());
        auto context = CudaContext::get(*device, search);
        if (!context) return context.takeError();
        auto runner = CudaRunner::create(*program, *context, CudaRunOptions{});
        if (!runner) return Error(filename + ": " + runner.error().message());
        return std::unique_ptr<LoadedProgram>(std::make_unique<LoadedCudaProgram>(std::move(*runner)));
      });
  return registered;
}

}  // namespace kiln::cuda
