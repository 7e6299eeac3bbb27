// The CUDA backend of CudaBackend.h.
#include "codegen/cuda/CudaBackend.h"

#include "codegen/Schedule.h"
#include "codegen/cuda/CudaCompiler.h"
#include "codegen/cuda/CudaTarget.h"
#include "runtime/cuda/CudaProgram.h"

namespace kiln::codegen {

namespace {

class CudaProgramCompiler : public ProgramCompiler {
 public:
  CudaProgramCompiler(const cuda::NvrtcApi& nvrtc, const CudaCompilerOptions& options)
      : nvrtc_(nvrtc), options_(options) {}

  Expected<BackendProgram> compile(const Function& optimized, std::vector<std::string>* unsupported) override {
    CudaCompileOptions o;
    o.kernelPrefix = options_.kernelPrefix;
    o.archs = options_.archs;
    o.specificArchs = options_.specificArchs;
    if (o.archs.empty() && o.specificArchs.empty() && options_.ptxArch)
      o.ptxArch = *options_.ptxArch;
    else if (o.archs.empty() && o.specificArchs.empty())
      o.archs = defaultCudaArchs(nvrtc_, options_.deviceMajor, options_.deviceMinor, &o.ptxArch);
    auto compiled = compileCudaProgram(optimized, nvrtc_, o, unsupported);
    if (!compiled) return compiled.takeError();
    BackendProgram out;
    out.device = std::string(kCudaTargetName);
    out.program = std::make_shared<CpuProgram>(compiled->program->plan);
    out.code = cuda::serializeCudaCode(*compiled->program);
    out.kernels = std::move(compiled->kernels);
    out.plan = std::move(compiled->plan);
    out.log = std::move(compiled->log);
    return out;
  }

 private:
  const cuda::NvrtcApi& nvrtc_;
  CudaCompilerOptions options_;
};

class CudaBackend : public Backend {
 public:
  std::string_view name() const override { return target_.name(); }
  std::string_view description() const override {
    return "NVIDIA GPUs: cuBLASLt and cuDNN library calls, kernels compiled by NVRTC into CUBINs and PTX";
  }
  const Target& target() const override { return target_; }
  void schedule(kir::Kernel& kernel) const override { scheduleForCuda(kernel); }
  std::string describeLibraryCall(const LibraryCall& call) const override { return describeCudaLibraryCallText(call); }

  Expected<std::unique_ptr<ProgramCompiler>> createCompiler(const BackendOptions* options) const override {
    CudaCompilerOptions defaults;
    const auto* own = options ? dynamic_cast<const CudaCompilerOptions*>(options) : &defaults;
    if (!own) return Error("the cuda backend was given another backend's options");
    auto nvrtc = cuda::loadNvrtc(own->search);
    if (!nvrtc) return nvrtc.takeError();
    return std::unique_ptr<ProgramCompiler>(std::make_unique<CudaProgramCompiler>(**nvrtc, *own));
  }

  Expected<BackendProgram> load(const CompiledArtifact& artifact, const std::string& filename) const override {
    auto program = cuda::cudaProgramOf(artifact, filename);
    if (!program) return program.takeError();
    BackendProgram out;
    out.device = artifact.device;
    out.program = artifact.program;
    out.code = artifact.deviceCode;
    return out;
  }

 private:
  CudaTarget target_;
};

}  // namespace

std::unique_ptr<Backend> createCudaBackend() { return std::make_unique<CudaBackend>(); }

const Backend& cudaBackend() { return *backendNamed(kCudaTargetName); }

}  // namespace kiln::codegen
