// The CPU executor: compiles a Function to JIT kernels and oneDNN calls for
// the shapes of its inputs and runs them. Compiling clones the function,
// gives its arguments the inputs' static shapes (resolving symbolic dims),
// runs the pass pipeline of `optLevel` (infer-shapes, canonicalize,
// decompose, ..., and `fuse` at -O3), splits `fused` groups with several
// results into one group per result, sends matmuls and convolutions (with
// their epilogues as post-ops) to oneDNN where that measures faster
// (codegen/DnnlKernels.h, docs/matmul.md), lowers every other op or group
// to one kernel (codegen/Lowering.h) and JIT-compiles them together
// (codegen/llvm/CpuJit.h). A new set of input shapes compiles again; each
// compiled set is cached. Steps run in order on host buffers; a kernel's
// parallel loop and oneDNN's own loops are split across one OpenMP team of
// `threads` threads (Debian's oneDNN runs on OpenMP, so sharing its team
// keeps two sets of threads from competing for the cores).
//
// It lives in codegen/ rather than runtime/ because it runs passes and
// lowerings; runtime/ keeps what it needs to run (Tensor).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/IR.h"
#include "passes/MemoryPlan.h"
#include "runtime/Tensor.h"

namespace kiln::codegen {

class CpuJit;
class KernelCache;
struct CompileReport;
struct CompiledFunction;

/// Time spent in each step of a compiled function, added up over the runs
/// of an executor given it (CpuOptions::profile; `kiln-train-bench
/// --profile`). One entry per step, in step order; a run of another compiled
/// shape set starts the table again. Timing each step adds two clock reads
/// per step and nothing when no profile is given.
struct StepProfile {
  struct Entry {
    /// The op the step computes: its result's name and its op name (or
    /// "fused"), and for oneDNN calls the primitive's description.
    std::string name;
    std::string what;
    double seconds = 0;
    int64_t calls = 0;
  };
  std::vector<Entry> entries;
  /// The table sorted by time, largest first, with each step's share and
  /// milliseconds per call; at most `limit` rows.
  std::string format(size_t limit = 40) const;
};

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
  /// Donated arguments (passes/MemoryPlan.h): runInPlace writes result
  /// `result` into the tensor of argument `argument`, in place where the
  /// memory plan finds that safe, else by a copy after the last kernel. A
  /// training step donates its parameters and state
  /// (trainingStepAliases in passes/TrainingStep.h).
  std::vector<ResultAlias> aliases = {};
};

/// The code of a compiled function's kernels, in step order: what a `.kc`
/// file stores (codegen/CompiledArtifact.h).
struct KernelCode {
  std::vector<std::string> names;
  /// contentHash of each kernel's printed kernel IR: a stored module that
  /// no longer lowers to the same kernels is caught before code is bound.
  std::vector<std::string> hashes;
  /// Relocatable object files holding the kernels (codegen/llvm/CpuJit.h).
  std::vector<std::string> objects;
};

/// The threads CpuOptions::threads = 0 stands for: the cores this process
/// may run on.
int defaultThreads();

class CpuExecutor {
 public:
  /// An executor for `f`; nothing is compiled until the first run.
  static Expected<std::unique_ptr<CpuExecutor>> create(const Function& f, CpuOptions options = {});
  /// An executor for `optimized`, a function already specialized to static
  /// argument shapes and optimized (the module of a `.kc` file): no passes
  /// run. Its steps are rebuilt from the module by the same code as a
  /// normal compile; the kernels' code is linked from `code` when given,
  /// without LLVM's optimizer or code generator (their names and kernel IR
  /// hashes must match the module's kernels), and compiled otherwise (a
  /// `.kc` built for another CPU).
  static Expected<std::unique_ptr<CpuExecutor>> createOptimized(const Function& optimized, const KernelCode* code,
                                                                CpuOptions options = {});
  ~CpuExecutor();

  /// Compiles for the shapes of `inputs` (one per argument) unless already
  /// compiled. When some ops cannot be lowered yet, the error lists them
  /// all and `unsupportedOps()` names them.
  Status prepare(const std::vector<Tensor>& inputs);
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

  /// The kernel IR and the optimized LLVM IR of the compiled kernels for
  /// `inputs`' shapes (`kiln compile --emit=kernel|llvm`).
  Expected<std::string> kernelIR(const std::vector<Tensor>& inputs);
  Expected<std::string> llvmIR(const std::vector<Tensor>& inputs);

  /// The memory plan compiled for `inputs`' shapes, with how each donated
  /// argument receives its result (in place or copied, and why), for tests
  /// and `--print-memory-plan`.
  Expected<MemoryPlan> memoryPlan(const std::vector<Tensor>& inputs);

  /// Steps (generated kernels and oneDNN calls) compiled for `inputs`'
  /// shapes, for tests.
  size_t numKernels(const std::vector<Tensor>& inputs);

  /// The optimized module and kernel code compiled for `inputs`' shapes,
  /// for writing a `.kc`. The module lives as long as the executor.
  Expected<std::pair<const Module*, KernelCode>> compiledCode(const std::vector<Tensor>& inputs);

  /// Notices since the last call (a damaged kernel cache entry, an unusable
  /// cache folder), for the tool to print.
  std::vector<std::string> takeNotices();

 private:
  CpuExecutor(std::unique_ptr<Module> module, CpuOptions options);
  Expected<CompiledFunction*> compiled(const std::vector<Tensor>& inputs);
  /// Builds the steps of `optimized` and binds their kernels: linked from
  /// `code` when given, else compiled.
  Expected<std::unique_ptr<CompiledFunction>> finish(std::unique_ptr<Module> optimized, const KernelCode* code);
  /// Runs the steps of `cf` on `inputs`, writing donated arguments.
  Expected<std::vector<Tensor>> execute(CompiledFunction& cf, const std::vector<Tensor>& inputs);

  std::unique_ptr<Module> module_;  // a private copy of the function
  CpuOptions options_;
  int threads_;  // OpenMP threads of parallel loops and oneDNN
  std::unique_ptr<CpuJit> jit_;
  std::unique_ptr<KernelCache> kernelCache_;
  std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<CompiledFunction>> cache_;
  std::vector<std::string> unsupported_;
  int compiledCount_ = 0;
};

/// A copy of `f` (ops, names, locations, argument defaults) in a new module.
std::unique_ptr<Module> cloneFunction(const Function& f);

/// The kernels of `f` specialized to argument `types` (static shapes) and
/// optimized at `optLevel`, by the executor's pipeline (passes, then one
/// kernel per op or single-result fused group) but with every op a
/// generated kernel: matmul and conv become loop nests instead of oneDNN
/// steps. The kernel list of a device without the CPU's libraries (the
/// CUDA emitter, codegen/cuda/). Unlowerable ops are an error naming each.
/// With `optimized`, it receives the optimized module: kernel i is the i-th
/// op of its function that is neither a `constant` nor the `return`, and
/// that kernel's buffers are the op's operands, then its result.
Expected<std::vector<kir::Kernel>> lowerToKernels(const Function& f, const std::vector<TensorType>& types, int optLevel,
                                                  std::unique_ptr<Module>* optimized = nullptr);

}  // namespace kiln::codegen
