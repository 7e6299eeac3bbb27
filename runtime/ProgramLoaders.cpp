// The loader registry of ProgramLoaders.h and the host CPU's loader.
#include "runtime/ProgramLoaders.h"

#include <mutex>

#include "runtime/CpuRunner.h"
#include "runtime/HostCpu.h"

namespace kiln {

namespace {

/// The host's program: its shared object loaded, run by a CpuRunner.
class HostProgram : public LoadedProgram {
 public:
  explicit HostProgram(std::unique_ptr<CpuRunner> runner) : runner_(std::move(runner)) {}
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs) override { return runner_->run(inputs); }

 private:
  std::unique_ptr<CpuRunner> runner_;
};

Expected<std::unique_ptr<LoadedProgram>> loadHostProgram(const CompiledArtifact& artifact, const std::string& filename,
                                                         const ProgramRunOptions& options) {
  if (std::string why = hostMachineMismatch(artifact.program->machine); !why.empty())
    return Error(filename + ": cannot run here: " + why + "; compile the model on this machine (kiln compile)");
  auto runner = CpuRunner::create(artifact.program, options.threads);
  if (!runner) return Error(filename + ": " + runner.error().message());
  return std::unique_ptr<LoadedProgram>(std::make_unique<HostProgram>(std::move(*runner)));
}

struct Registry {
  std::mutex mutex;
  std::vector<std::pair<std::string, ProgramLoader>> loaders;
};

Registry& registry() {
  static Registry* r = [] {
    auto* created = new Registry;
    created->loaders.emplace_back(std::string(kHostDevice), loadHostProgram);
    return created;
  }();
  return *r;
}

}  // namespace

std::string hostMachineMismatch(const CpuMachine& machine) {
#if defined(__x86_64__)
  if (machine.triple.rfind("x86_64", 0) != 0)
    return "it was compiled for '" + machine.triple + "', this machine is x86_64";
#endif
  const std::string missing = missingCpuFeatures(machine.features, hostCpuFeatures());
  if (!missing.empty()) return "it was compiled for a CPU with " + missing + ", which this CPU lacks";
  return "";
}

Status registerProgramLoader(std::string_view device, ProgramLoader loader) {
  if (device.empty() || !loader) return Error("registerProgramLoader needs a device name and a loader");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [name, existing] : r.loaders)
    if (name == device) return Error("programs for '" + std::string(device) + "' have a loader already");
  r.loaders.emplace_back(std::string(device), std::move(loader));
  return Status::success();
}

std::vector<std::string> programLoaderDevices() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> devices;
  for (const auto& [name, loader] : r.loaders) devices.push_back(name);
  return devices;
}

Expected<std::unique_ptr<LoadedProgram>> loadProgram(const CompiledArtifact& artifact, const std::string& filename,
                                                     const ProgramRunOptions& options) {
  ProgramLoader loader;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& [name, l] : r.loaders)
      if (name == artifact.device) loader = l;
  }
  if (!loader) {
    std::string devices;
    for (const std::string& d : programLoaderDevices()) devices += (devices.empty() ? "" : ", ") + d;
    return Error(filename + ": its program was compiled for '" + artifact.device +
                 "', which this process cannot run (it runs programs for: " + devices + ")");
  }
  return loader(artifact, filename, options);
}

}  // namespace kiln
