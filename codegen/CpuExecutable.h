// The CPU executor: compiles a Function to JIT kernels for the shapes of its
// inputs and runs them. Compiling clones the function, gives its arguments
// the inputs' static shapes (resolving symbolic dims), runs the -O2 pipeline
// (infer-shapes, canonicalize, decompose, ...), lowers every op to a
// one-op kernel (codegen/Lowering.h) and JIT-compiles them together
// (codegen/llvm/CpuJit.h). A new set of input shapes compiles again; each
// compiled set is cached. Kernels run in order on host buffers, each
// kernel's parallel loop split across the thread pool.
//
// It lives in codegen/ rather than runtime/ because it runs passes and
// lowerings; runtime/ keeps what it needs to run (Tensor, ThreadPool).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "runtime/Tensor.h"
#include "runtime/ThreadPool.h"

namespace kiln::codegen {

struct CpuOptions {
  /// Threads that split parallel loops; 0 means one per hardware thread.
  int threads = 0;
  /// The pass pipeline run before lowering: -O2 by default; -O3 adds `fuse`,
  /// whose single-result groups lower to one kernel each.
  int optLevel = 2;
};

class CpuJit;
struct CompiledFunction;

class CpuExecutor {
 public:
  /// An executor for `f`; nothing is compiled until the first run.
  static Expected<std::unique_ptr<CpuExecutor>> create(const Function& f, CpuOptions options = {});
  ~CpuExecutor();

  /// Compiles for the shapes of `inputs` (one per argument) unless already
  /// compiled. When some ops cannot be lowered yet, the error lists them
  /// all and `unsupportedOps()` names them.
  Status prepare(const std::vector<Tensor>& inputs);
  /// The ops the last failed prepare() could not lower, as `name (why)`;
  /// empty when it failed for another reason.
  const std::vector<std::string>& unsupportedOps() const { return unsupported_; }

  /// Runs on `inputs`, compiling first when needed.
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);

  /// The kernel IR and the optimized LLVM IR of the compiled kernels for
  /// `inputs`' shapes (`kiln compile --emit=kernel|llvm`).
  Expected<std::string> kernelIR(const std::vector<Tensor>& inputs);
  Expected<std::string> llvmIR(const std::vector<Tensor>& inputs);

  /// Kernels compiled for the current shapes, for tests and --verbose.
  size_t numKernels(const std::vector<Tensor>& inputs);

 private:
  CpuExecutor(std::unique_ptr<Module> module, CpuOptions options);
  Expected<CompiledFunction*> compiled(const std::vector<Tensor>& inputs);

  std::unique_ptr<Module> module_;  // a private copy of the function
  CpuOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuJit> jit_;
  std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<CompiledFunction>> cache_;
  std::vector<std::string> unsupported_;
  int compiledCount_ = 0;
};

/// A copy of `f` (ops, names, locations, argument defaults) in a new module.
std::unique_ptr<Module> cloneFunction(const Function& f);

}  // namespace kiln::codegen
