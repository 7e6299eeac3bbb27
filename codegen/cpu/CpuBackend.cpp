// The CPU backend of CpuBackend.h.
#include "codegen/cpu/CpuBackend.h"

#include "codegen/KernelCache.h"
#include "codegen/Schedule.h"
#include "codegen/cpu/CpuCompiler.h"
#include "codegen/cpu/CpuTarget.h"
#include "codegen/llvm/CpuJit.h"

namespace kiln::codegen {

namespace {

class CpuProgramCompiler : public ProgramCompiler {
 public:
  CpuProgramCompiler(std::unique_ptr<CpuJit> jit, const CpuCompilerOptions& options)
      : jit_(std::move(jit)), cache_(options.cacheDir), options_(options) {}

  Expected<BackendProgram> compile(const Function& optimized, std::vector<std::string>* unsupported) override {
    CpuCompileOptions o;
    o.kernelPrefix = options_.kernelPrefix;
    o.threads = options_.threads;
    o.cache = &cache_;
    o.report = options_.report;
    auto compiled = compileCpuProgram(optimized, *jit_, o, unsupported);
    if (!compiled) return compiled.takeError();
    BackendProgram out;
    out.device = std::string(kCpuTargetName);
    out.program = std::move(compiled->program);
    out.kernels = std::move(compiled->kernels);
    out.plan = std::move(compiled->plan);
    return out;
  }

 private:
  std::unique_ptr<CpuJit> jit_;
  KernelCache cache_;
  CpuCompilerOptions options_;
};

class CpuBackend : public Backend {
 public:
  std::string_view name() const override { return target_.name(); }
  std::string_view description() const override {
    return "this machine's CPU: oneDNN library calls, kernels compiled by LLVM into a shared object";
  }
  const Target& target() const override { return target_; }
  void schedule(kir::Kernel& kernel) const override { scheduleForCpu(kernel); }
  std::string describeLibraryCall(const LibraryCall& call) const override { return describeLibraryCallText(call); }

  Expected<std::unique_ptr<ProgramCompiler>> createCompiler(const BackendOptions* options) const override {
    CpuCompilerOptions defaults;
    const auto* own = options ? dynamic_cast<const CpuCompilerOptions*>(options) : &defaults;
    if (!own) return Error("the cpu backend was given another backend's options");
    auto jit = CpuJit::create();
    if (!jit) return jit.takeError();
    return std::unique_ptr<ProgramCompiler>(std::make_unique<CpuProgramCompiler>(std::move(*jit), *own));
  }

  Expected<BackendProgram> load(const CompiledArtifact& artifact, const std::string& filename) const override {
    if (artifact.device != name())
      return Error(filename + " holds a program for " + artifact.device + ", not for the CPU");
    if (std::string why = targetMismatch(*artifact.program, CpuJit::hostTarget()); !why.empty())
      return Error(filename + ": its code cannot run here: " + why);
    BackendProgram out;
    out.device = artifact.device;
    out.program = artifact.program;
    return out;
  }

 private:
  CpuTarget target_;
};

}  // namespace

std::unique_ptr<Backend> createCpuBackend() { return std::make_unique<CpuBackend>(); }

const Backend& cpuBackend() { return *backendNamed(kCpuTargetName); }

}  // namespace kiln::codegen
