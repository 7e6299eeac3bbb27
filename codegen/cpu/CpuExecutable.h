// The CPU executor: compiles a Function for the shapes of its inputs into a
// Program and runs it on the CPU runtime. Compiling clones the function,
// gives its arguments the inputs' static shapes (resolving symbolic dims),
// runs the CPU target's pipeline of `optLevel` (passes/PassManager.h: at
// -O3 library selection, fusion, splitting, scheduling and host checks),
// then compiles the result into a program (codegen/cpu/CpuCompiler.h: kernels
// through LLVM, linked by lld) that a CpuRunner executes
// (runtime/CpuRunner.h). A new set of input shapes compiles again; each
// compiled set is cached (runtime/ShapeCache.h). It runs one call at a time (one arena per set).
//
// A function with ops whose result sizes depend on values (nonzero, unique,
// non_max_suppression) or with control flow (`if`, `loop`) runs in stages
// (codegen/Stages.h): the ops before them compiled for the input shapes,
// those ops on the host (runtime/DataDependent.h, runtime/ControlFlow.h),
// and the rest by an executor of its own that compiles a program per set of
// sizes they give, cached like any input shapes (docs/codegen.md sections 6
// and 7). Each region of an `if` or `loop` is a function with an executor
// of its own, which compiles it per set of argument shapes: a loop body
// whose carried values keep their shapes compiles once, not per iteration.
//
// An executor can also start from a function already optimized (a `.kc`
// file's module, recompiled for this machine) or from a compiled program
// itself (a `.kc` file's program, nothing compiled; a program with host
// steps runs through the runtime's stage driver, runtime/StageDriver.h).
// artifact() of a staged function compiles every part for the shapes known
// at compile time into one StagedProgram (compileStagedProgram).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/IR.h"
#include "ir/Precision.h"
#include "passes/MemoryPlan.h"
#include "runtime/Program.h"
#include "runtime/CpuRunner.h"
#include "runtime/ShapeCache.h"
#include "runtime/Tensor.h"

namespace kiln::codegen {

class Backend;
class CpuJit;
class KernelCache;
struct CompileReport;
struct CompiledFunction;
template <typename Executor>
class StagedExecutors;

using kiln::defaultThreads;
using kiln::StepProfile;
using kiln::CpuMemoryStats;

struct CpuOptions {
  /// Threads that split parallel loops and oneDNN calls and compile kernels;
  /// 0 means one per hardware thread.
  int threads = 0;
  /// The pass pipeline run before lowering: -O3 (with `fuse`) by default;
  /// -O2 runs every op as its own step.
  int optLevel = 3;
  /// The folder of the disk cache of compiled kernels (codegen/KernelCache.h);
  /// empty: no cache.
  std::string cacheDir = {};
  /// When given, compile times are added to it (`--time-passes`), with the
  /// pass manager's timing table.
  CompileReport* report = nullptr;
  /// When given, each run adds its steps' times to it.
  StepProfile* profile = nullptr;
  /// When given, every program's runner counts its arena, constants and
  /// results there (`kiln run --memory-stats`).
  CpuMemoryStats* memory = nullptr;
  /// Donated arguments (passes/MemoryPlan.h): runInPlace writes result
  /// `result` into the tensor of argument `argument`, in place where the
  /// memory plan finds that safe, else by a copy after the last kernel. A
  /// training step donates its parameters and state
  /// (trainingStepAliases in passes/TrainingStep.h). They become the
  /// compiled function's result aliases (`-> (T aliases %arg)`).
  std::vector<ResultAlias> aliases = {};
  /// The precision the function was compiled for (autocast already run on
  /// it by the session or `kiln compile`): recorded in the `.kc` that
  /// artifact() writes.
  Precision precision = Precision::FP32;
};

class CpuExecutor {
 public:
  /// An executor for `f`; nothing is compiled until the first run.
  static Expected<std::unique_ptr<CpuExecutor>> create(const Function& f, CpuOptions options = {});
  /// An executor for `optimized`, a function already specialized to static
  /// argument shapes and through the CPU pipeline (the module of a `.kc`
  /// file): no passes run; its kernels are compiled for this machine.
  static Expected<std::unique_ptr<CpuExecutor>> createOptimized(const Function& optimized, CpuOptions options = {});
  /// An executor that runs `program` (a `.kc` file's): nothing is compiled,
  /// and only the shapes it was compiled for run.
  static Expected<std::unique_ptr<CpuExecutor>> fromProgram(std::shared_ptr<const Program> program,
                                                            CpuOptions options = {});
  /// An executor that runs `program`, a stored program with host steps (a
  /// `.kc` file's): its parts loaded as CpuRunners, nothing compiled.
  static Expected<std::unique_ptr<CpuExecutor>> fromStaged(std::shared_ptr<const StagedProgram> program,
                                                           CpuOptions options = {});
  ~CpuExecutor();

  /// Compiles for the shapes of `inputs` (one per argument) unless already
  /// compiled. When some ops cannot be lowered yet, the error lists them
  /// all and `unsupportedOps()` names them.
  Status prepare(const std::vector<Tensor>& inputs);
  /// Whether the shapes of `inputs` are compiled already, so that run()
  /// compiles nothing.
  bool isCompiled(const std::vector<Tensor>& inputs);
  /// The ops the last failed prepare() could not lower, as `name (why)`;
  /// empty when it failed for another reason.
  const std::vector<std::string>& unsupportedOps() const { return unsupported_; }

  /// Runs on `inputs`, compiling first when needed. With donated arguments
  /// (CpuOptions::aliases) it copies `inputs` and runs runInPlace on the
  /// copy, so the results are the same and `inputs` are left alone.
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);

  /// Runs on `inputs` and writes each donated argument's result into
  /// `inputs[argument]`'s memory (the caller gives up its old value); that
  /// result's entry in the returned vector is an empty Tensor, the other
  /// results are as run() returns them. A training loop keeps parameters
  /// and optimizer state in `inputs` across steps with no per-step
  /// allocation or copy of them:
  ///
  ///   CpuOptions o; o.aliases = trainingStepAliases(step);
  ///   auto exec = CpuExecutor::create(step, o);
  ///   for (...) { set batch, labels in inputs; loss = (*exec->runInPlace(inputs))[0]; }
  ///
  /// On an error the donated tensors may hold partly updated values.
  Expected<std::vector<Tensor>> runInPlace(std::vector<Tensor>& inputs);

  /// The steps compiled for `inputs`' shapes as text: host checks, library
  /// calls and the kernels' IR (`kiln compile --emit=kernel`), and the
  /// kernels' LLVM IR after O3 (`--emit=llvm`). Not kept for a program run
  /// from a file.
  Expected<std::string> kernelIR(const std::vector<Tensor>& inputs);
  Expected<std::string> llvmIR(const std::vector<Tensor>& inputs);

  /// The memory plan compiled for `inputs`' shapes, with how each donated
  /// argument receives its result (in place or copied, and why), for tests
  /// and `--print-memory-plan`.
  Expected<MemoryPlan> memoryPlan(const std::vector<Tensor>& inputs);

  /// Steps (generated kernels and library calls) compiled for `inputs`'
  /// shapes, for tests.
  size_t numKernels(const std::vector<Tensor>& inputs);

  /// The optimized module and the program compiled for `inputs`' shapes,
  /// for writing a `.kc`. Both live as long as the executor.
  Expected<std::pair<const Module*, std::shared_ptr<const Program>>> compiledProgram(
      const std::vector<Tensor>& inputs);

  /// The `.kc` file (runtime/KcFile.h) of the program compiled for
  /// `inputs`' shapes, at this executor's optimization level; `planText`,
  /// when given, receives its memory plan as `kiln compile
  /// --print-memory-plan` prints it. A function with host ops gives a
  /// program with host steps (stagedArtifact), `planText` its parts' plans.
  Expected<std::string> artifact(const std::vector<Tensor>& inputs, std::string* planText = nullptr);

  /// Notices since the last call (a damaged kernel cache entry, an unusable
  /// cache folder), for the tool to print.
  std::vector<std::string> takeNotices();

 private:
  CpuExecutor(std::unique_ptr<Module> module, CpuOptions options);
  /// The compiled function of `inputs`' shapes, compiled on a miss.
  Expected<CompiledFunction*> compiled(const std::vector<Tensor>& inputs);
  /// Compiles for `inputs`' shapes (a stored program: the error saying why
  /// they do not match it).
  Expected<std::unique_ptr<CompiledFunction>> compile(const std::vector<Tensor>& inputs);
  /// Compiles `optimized` (through the pipeline already) into a program
  /// and its runner.
  Expected<std::unique_ptr<CompiledFunction>> finish(std::unique_ptr<Module> optimized);
  Status addCompiled(std::unique_ptr<CompiledFunction> compiled);
  /// The error of a query that needs one program for the whole function.
  Error notOneProgram() const;
  /// artifact() of a function with host ops: every part compiled into one
  /// StagedProgram (compileStagedProgram).
  Expected<std::string> stagedArtifact(const std::vector<Tensor>& inputs, std::string* planText);

  std::unique_ptr<Module> module_;  // a private copy of the function; null for fromProgram
  CpuOptions options_;
  int threads_;  // OpenMP threads of parallel loops and oneDNN
  std::unique_ptr<CpuJit> jit_;
  std::unique_ptr<KernelCache> kernelCache_;
  ShapeCache<CompiledFunction> cache_;  // a program per set of input shapes
  std::vector<std::string> unsupported_;
  int compiledCount_ = 0;
  /// With host ops: the stages and the executors of their parts.
  std::unique_ptr<StagedExecutors<CpuExecutor>> staged_;
  /// A stored program with host steps (fromStaged), or null.
  std::unique_ptr<LoadedProgram> stored_;
};

/// A copy of `source` whose arguments have `types` (static shapes) and
/// whose results alias the donated arguments of `aliases`, run through
/// `backend`'s pipeline of `optLevel` (Backend::pipeline); compile times go
/// to `report` if given.
Expected<std::unique_ptr<Module>> specializeAndOptimize(const Function& source, const std::vector<TensorType>& types,
                                                        const std::vector<ResultAlias>& aliases, const Backend& backend,
                                                        int optLevel, CompileReport* report);

/// A copy of `f` (ops, names, locations, argument defaults) in a new module.
std::unique_ptr<Module> cloneFunction(const Function& f);

/// The kernels of `f` specialized to argument `types` (static shapes) and
/// optimized at `optLevel` by `backend`'s pipeline (on CUDA, matmuls
/// cuBLASLt takes become `library` groups, codegen/cuda/CudaTarget.h), then
/// lowered and scheduled by it (lowerForBackend): the kernel list of the
/// CUDA emitter (codegen/cuda/). Unlowerable ops are an error naming each.
/// With `optimized`, it receives the optimized module: kernel i is the i-th
/// op of its function that is not a `constant`, a `check`, a `library`
/// group or the `return`, and that kernel's buffers are the op's operands,
/// then its result.
Expected<std::vector<kir::Kernel>> lowerToKernels(const Function& f, const std::vector<TensorType>& types,
                                                  const Backend& backend, int optLevel,
                                                  std::unique_ptr<Module>* optimized = nullptr);

}  // namespace kiln::codegen
