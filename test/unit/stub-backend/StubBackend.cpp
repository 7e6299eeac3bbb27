// The stub backend of StubBackend.h.
#include "test/unit/stub-backend/StubBackend.h"

#include "codegen/cpu/CpuCompiler.h"

namespace kiln::test {

namespace {

/// Takes no library call: every matmul and convolution is a kernel.
class StubTarget : public Target {
 public:
  std::string_view name() const override { return kStubBackendName; }
  bool acceptsLibraryCall(const Op&, std::span<const Op* const>) const override { return false; }
};

class StubCompiler : public codegen::ProgramCompiler {
 public:
  StubCompiler(const codegen::Backend& backend, std::string prefix) : backend_(backend), prefix_(std::move(prefix)) {}

  Expected<codegen::BackendProgram> compile(const Function& optimized, std::vector<std::string>* unsupported) override {
    auto laid = codegen::layoutProgram(optimized, backend_, prefix_, unsupported);
    if (!laid) return laid.takeError();
    codegen::BackendProgram out;
    out.device = std::string(backend_.name());
    out.program = std::move(laid->program);
    out.kernels = std::move(laid->kernels);
    out.plan = std::move(laid->plan);
    return out;
  }

 private:
  const codegen::Backend& backend_;
  std::string prefix_;
};

class StubBackend : public codegen::Backend {
 public:
  std::string_view name() const override { return kStubBackendName; }
  std::string_view description() const override { return "a test's backend: graph passes, one kernel per op"; }
  const Target& target() const override { return target_; }
  std::string pipeline(int level) const override {
    // Its own pipeline, which no built-in backend runs: no fusion at any
    // level, so `kiln-opt --target stub -O3` shows one kernel per op.
    return level == 0 ? "infer-shapes" : "infer-shapes,canonicalize,decompose,canonicalize,cse,dce";
  }
  void schedule(kir::Kernel& kernel) const override {
    kir::Schedule schedule;
    schedule.target = std::string(kStubBackendName);
    kernel.schedule = std::move(schedule);
  }
  std::string describeLibraryCall(const LibraryCall&) const override { return "a library call (the stub takes none)"; }
  Expected<std::unique_ptr<codegen::ProgramCompiler>> createCompiler(
      const codegen::BackendOptions* options) const override {
    return std::unique_ptr<codegen::ProgramCompiler>(
        std::make_unique<StubCompiler>(*this, options ? options->kernelPrefix : "kiln_"));
  }
  Expected<codegen::BackendProgram> load(const CompiledArtifact& artifact, const std::string& filename) const override {
    if (artifact.device != name()) return Error(filename + " holds a program for " + artifact.device + ", not the stub");
    codegen::BackendProgram out;
    out.device = artifact.device;
    out.program = artifact.program;
    return out;
  }

 private:
  StubTarget target_;
};

}  // namespace

std::unique_ptr<codegen::Backend> createStubBackend() { return std::make_unique<StubBackend>(); }

Status registerStubBackend() {
  static const Status registered = codegen::registerBackend(createStubBackend());
  return registered;
}

}  // namespace kiln::test
