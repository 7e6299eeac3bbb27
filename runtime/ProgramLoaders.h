// The runners of stored programs, by device: the runtime's own registry,
// which needs no compiler. A `.kc` names the device its program was
// compiled for (runtime/KcFile.h CompiledArtifact::device, a backend's
// name); loadProgram finds the loader registered for that device and gives
// back a program ready to run. The host CPU's loader (a CpuRunner, after the
// code is checked against this CPU) is built in; the CUDA runtime registers
// CUDA's (runtime/cuda/CudaProgramLoader.h: a CudaRunner on the first usable
// device); any other runtime registers its own with registerProgramLoader.
// The embedding API (runtime/Kiln.h) runs every `.kc` through it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/KcFile.h"
#include "runtime/Tensor.h"

namespace kiln {

/// A stored program loaded for its device, ready to run.
class LoadedProgram {
 public:
  virtual ~LoadedProgram() = default;
  /// Runs on `inputs` (one per argument, of the types it was compiled for)
  /// and returns its results on the host.
  virtual Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs) = 0;
};

/// How a loader runs what it loads.
struct ProgramRunOptions {
  /// Host threads of a CPU program's parallel loops and library calls
  /// (0: one per hardware thread).
  int threads = 0;
};

/// Loads an artifact of its device; `filename` names it in errors.
using ProgramLoader = std::function<Expected<std::unique_ptr<LoadedProgram>>(
    const CompiledArtifact& artifact, const std::string& filename, const ProgramRunOptions& options)>;

/// Registers the loader of programs for `device`; an error when that device
/// has one already.
Status registerProgramLoader(std::string_view device, ProgramLoader loader);

/// The devices that have a loader, the host's first.
std::vector<std::string> programLoaderDevices();

/// `artifact`'s program loaded by its device's loader; an error naming the
/// device and the devices this process can run when none is registered.
Expected<std::unique_ptr<LoadedProgram>> loadProgram(const CompiledArtifact& artifact, const std::string& filename,
                                                     const ProgramRunOptions& options = {});

/// Why this machine cannot run CPU code built for `machine` (another
/// architecture, missing CPU features), or "".
std::string hostMachineMismatch(const CpuMachine& machine);

}  // namespace kiln
