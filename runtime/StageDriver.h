// The stage driver: runs a function split at its host ops (Program.h
// Stages; docs/codegen.md sections 6 and 7) — its prefix, each host step
// (runtime/DataDependent.h; runtime/ControlFlow.h, whose bodies run as
// sub-programs), its suffix — with no IR and no compiler: the compiler's
// staged executors (codegen/Stages.h) run their parts, compiled per set of
// shapes, through it, and a stored staged program (StagedProgram, a `.kc`)
// runs through StagedRunner with each part a loaded program of its device.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/Program.h"
#include "runtime/ProgramLoaders.h"
#include "runtime/Tensor.h"

namespace kiln {

/// What runs each sub-program of Stages: `prefix` and `suffix` are called
/// only where the stages have that part; `body` runs region `region` of
/// host step `host` (and checks its inputs against the body's arguments).
struct StageRunners {
  std::function<Expected<std::vector<Tensor>>(const std::vector<Tensor>&)> prefix;
  std::function<Expected<std::vector<Tensor>>(const std::vector<Tensor>&)> suffix;
  std::function<Expected<std::vector<Tensor>>(size_t host, size_t region, const std::vector<Tensor>& inputs)> body;
};

/// Runs `stages` on `inputs` (checked against its argument types first,
/// since host steps may read arguments directly) and returns the
/// function's results. Every stage value is checked against what the parts
/// gave, so stages from a file cannot make it read out of bounds.
Expected<std::vector<Tensor>> runStages(const Stages& stages, const std::vector<Tensor>& inputs,
                                        const StageRunners& runners);

/// `inputs` against `types`, the argument types of function `name`: their
/// number, dtypes, ranks and static dims.
Status checkStageInputs(const std::string& name, const std::vector<TensorType>& types,
                        const std::vector<Tensor>& inputs);

/// Loads a Program part of a staged program for its device (a CpuRunner, a
/// CudaRunner): `program` is the index in StagedProgram::programs.
using PartLoader = std::function<Expected<std::unique_ptr<LoadedProgram>>(size_t program)>;

/// A stored staged program, ready to run: every Program part loaded by
/// `load` up front (nothing is compiled), the stages run by runStages.
/// A body that meets other shapes than its program was compiled for (a
/// loop whose carried values change shape) is an error naming it.
class StagedRunner : public LoadedProgram {
 public:
  static Expected<std::unique_ptr<StagedRunner>> create(std::shared_ptr<const StagedProgram> program,
                                                        const PartLoader& load);
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs) override;

 private:
  StagedRunner() = default;
  Expected<std::vector<Tensor>> runPart(size_t part, const std::vector<Tensor>& inputs, const std::string& role);

  std::shared_ptr<const StagedProgram> program_;
  std::vector<std::unique_ptr<LoadedProgram>> loaded_;  // per program
};

}  // namespace kiln
