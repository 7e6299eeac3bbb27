// A function split at its host ops, so that the CPU executor can compile
// what it can before them for the input shapes, run them on the host, and
// compile the rest for the sizes they gave (docs/codegen.md sections 6
// and 7). Host ops are
//
//   - the ops whose result sizes depend on values
//     (OpInfo::hasDataDependentShape: nonzero, unique, non_max_suppression),
//     run by runtime/DataDependent.h;
//   - the control-flow ops `if` and `loop` (OpInfo::isControlFlow), run by
//     runtime/ControlFlow.h, whose regions become functions of their own
//     (`bodies`) that the executor compiles as sub-programs.
//
// The parts:
//
//   prefix: the ops that depend on no host op's result, as a function of
//           the original arguments whose results are the values the later
//           parts read;
//   host:   the host ops whose operands the prefix (or the arguments) give;
//   suffix: every other op, as a function of the arguments, prefix values
//           and host results it reads, returning the original results it
//           computes (the others are taken from where they are).
//
// The suffix may hold further host ops (a nonzero of a unique's values, a
// loop over an if's results); the executor that runs it splits it again, as
// the executor of a body splits the control flow nested in it. The stages
// themselves are plain data (runtime/Program.h Stages) run by the runtime's
// stage driver (runtime/StageDriver.h); compileStagedProgram compiles every
// part for the shapes known at compile time into one StagedProgram, which a
// `.kc` stores and the runtime runs with no compiler.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/Backend.h"
#include "ir/IR.h"
#include "runtime/DataDependent.h"
#include "runtime/Program.h"
#include "runtime/StageDriver.h"
#include "runtime/Tensor.h"

namespace kiln::codegen {

using kiln::StageValue;
using kiln::HostStep;
using kiln::Stages;
using kiln::StageRunners;

/// A function split at its host ops: the plain stages (runtime/Program.h:
/// `layout.prefix` and `layout.suffix` are 0 where that part exists, each
/// host step's `bodies` its region numbers) and the parts as functions.
struct FunctionStages {
  Stages layout;
  /// The prefix (arguments: the original ones), or null when no value
  /// the later parts read needs an op of it.
  std::unique_ptr<Module> prefix;
  /// Per host step, each region of an `if` or `loop` as a function of its
  /// own (`if`: then, else; `loop`: its body) whose arguments are the
  /// region's and whose results its `return`'s; none for a data-dependent
  /// op.
  std::vector<std::vector<std::unique_ptr<Module>>> bodies;
  /// The suffix, or null when the original results are all arguments,
  /// prefix results or host results. Its results are the original results
  /// its ops compute, only those.
  std::unique_ptr<Module> suffix;

  const Function& body(size_t host, size_t region) const { return *bodies[host][region]->functions().front(); }
};

/// `f` split at its top-level host ops (data-dependent and control-flow
/// ops), or nullopt when it has none.
Expected<std::optional<FunctionStages>> splitAtHostOps(const Function& f);

/// Whether `f` has top-level ops run on the host between compiled stages
/// (control flow, data-dependent results): then it cannot take donated
/// arguments.
bool hasHostOps(const Function& f);

/// Runs `stages` of function `f` on `inputs` with the runtime's stage
/// driver (runtime/StageDriver.h), each body's inputs checked against its
/// function's arguments before `runners` runs it.
Expected<std::vector<Tensor>> runStages(const FunctionStages& stages, const std::vector<Tensor>& inputs,
                                        const StageRunners& runners);

/// `inputs` against the arguments of `f`: their number, dtypes, ranks and
/// static dims.
Status checkInputs(const Function& f, const std::vector<Tensor>& inputs);

/// Zero tensors of the argument types of `f` when all are static (a body
/// that prepare can compile before any run gives its shapes), else nullopt.
std::optional<std::vector<Tensor>> staticArgumentsOf(const Function& f);

/// What makes `stages` run in stages, after the function's name in errors:
/// `has control flow (loop)`, `has ops whose result sizes depend on values
/// (nonzero)`.
std::string whyStaged(const FunctionStages& stages);

/// The error of a query that needs one program for staged function `name`
/// (a memory plan, kernel IR).
Error notOneProgram(const std::string& name, const FunctionStages& stages);

/// Compiles one part of a staged function for argument `types` (static):
/// the backend's pipeline and compiler. `index` numbers the parts compiled
/// (for kernel names that differ between them).
using PartCompiler =
    std::function<Expected<BackendProgram>(const Function& part, const std::vector<TensorType>& types, size_t index)>;

/// A staged function compiled whole, for a `.kc`.
struct StagedCompilation {
  std::shared_ptr<StagedProgram> program;
  /// The parts' memory plans as text.
  std::string plans;
};

/// `f` (with host ops) compiled for input `types` into one StagedProgram:
/// the prefix for the input types, each `if` or `loop` region for the
/// types its operands have (nested control flow staged again), the suffix
/// for the types the earlier parts give. A part whose shapes are not known
/// at compile time (the ops after a nonzero, a loop whose carried values
/// change shape) is an error naming the op and why; such a function runs
/// only compiled as it runs (kiln run model.onnx).
Expected<StagedCompilation> compileStagedProgram(const Function& f, const std::vector<TensorType>& types,
                                                 const PartCompiler& compile);

/// The stages of a function and an executor (CpuExecutor, CudaExecutor) for
/// each compiled part: the prefix and suffix (null where that part is
/// absent) and each host op's bodies (none for a data-dependent op). Each
/// executor that runs a function with host ops owns one and keeps only what
/// differs between the targets (how a part's executor is made, what else a
/// run does). `Executor` has `prepare`, `run` and `unsupportedOps`.
template <typename Executor>
class StagedExecutors {
 public:
  /// The stages of `f` with an executor from `make(const Function&)` for
  /// each part, or null when `f` has no host ops. `donatesArguments`: the
  /// executor of `f` was given donated arguments, which a staged function
  /// cannot take.
  template <typename Make>
  static Expected<std::unique_ptr<StagedExecutors>> create(const Function& f, bool donatesArguments, Make make) {
    auto split = splitAtHostOps(f);
    if (!split) return split.takeError();
    if (!*split) return std::unique_ptr<StagedExecutors>();
    if (donatesArguments)
      return Error("'" + f.name() + "' " + whyStaged(**split) +
                   ", which runs between compiled stages; such a function cannot take donated arguments");
    std::unique_ptr<StagedExecutors> staged(new StagedExecutors(std::move(**split)));
    const FunctionStages& s = staged->stages_;
    // Each body of an `if` or `loop` is compiled by an executor of its
    // own, per set of argument shapes.
    for (const auto& regions : s.bodies) {
      std::vector<std::unique_ptr<Executor>> bodies;
      for (const auto& body : regions) {
        auto b = make(*body->functions().front());
        if (!b) return b.takeError();
        bodies.push_back(std::move(*b));
      }
      staged->bodies_.push_back(std::move(bodies));
    }
    if (s.prefix) {
      auto prefix = make(*s.prefix->functions().front());
      if (!prefix) return prefix.takeError();
      staged->prefix_ = std::move(*prefix);
    }
    if (s.suffix) {
      auto suffix = make(*s.suffix->functions().front());
      if (!suffix) return suffix.takeError();
      staged->suffix_ = std::move(*suffix);
    }
    return staged;
  }

  const FunctionStages& stages() const { return stages_; }

  /// Compiles what can be compiled before a run: the prefix for `inputs`'
  /// shapes and the bodies whose arguments have static shapes; the others
  /// (and the suffix) compile on the run that gives their shapes.
  /// `unsupported`: the unlowerable ops of the part that failed.
  Status prepare(const std::vector<Tensor>& inputs, std::vector<std::string>& unsupported) {
    unsupported.clear();
    if (prefix_) {
      Status prepared = prefix_->prepare(inputs);
      unsupported = prefix_->unsupportedOps();
      if (!prepared) return prepared;
    }
    for (size_t h = 0; h < bodies_.size(); ++h) {
      for (size_t r = 0; r < bodies_[h].size(); ++r) {
        auto example = staticArgumentsOf(stages_.body(h, r));
        if (!example) continue;
        Status prepared = bodies_[h][r]->prepare(*example);
        unsupported = bodies_[h][r]->unsupportedOps();
        if (!prepared) return prepared;
      }
    }
    return Status::success();
  }

  /// Runs the stages on `inputs` (runStages), each part by its executor.
  /// `unsupported`: the unlowerable ops of a part that failed, named as
  /// the staged executor's.
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs, std::vector<std::string>& unsupported) {
    unsupported.clear();
    auto noted = [&unsupported](Executor& part, const std::vector<Tensor>& in) {
      auto ran = part.run(in);
      if (!part.unsupportedOps().empty()) unsupported = part.unsupportedOps();
      return ran;
    };
    StageRunners runners;
    runners.prefix = [&](const std::vector<Tensor>& in) { return noted(*prefix_, in); };
    runners.suffix = [&](const std::vector<Tensor>& in) { return noted(*suffix_, in); };
    runners.body = [&](size_t host, size_t region, const std::vector<Tensor>& in) {
      return noted(*bodies_[host][region], in);
    };
    return runStages(stages_, inputs, runners);
  }

  /// The executors of every part.
  std::vector<Executor*> parts() const {
    std::vector<Executor*> all;
    if (prefix_) all.push_back(prefix_.get());
    if (suffix_) all.push_back(suffix_.get());
    for (const auto& bodies : bodies_)
      for (const auto& body : bodies) all.push_back(body.get());
    return all;
  }

 private:
  explicit StagedExecutors(FunctionStages stages) : stages_(std::move(stages)) {}

  FunctionStages stages_;
  std::unique_ptr<Executor> prefix_;
  std::unique_ptr<Executor> suffix_;
  std::vector<std::vector<std::unique_ptr<Executor>>> bodies_;
};

}  // namespace kiln::codegen
