// The CUDA executor: the CpuExecutor's counterpart for a GPU. It compiles a
// Function for the shapes of its inputs — the CUDA target's pipeline
// (codegen/cpu/CpuExecutable.h specializeAndOptimize), then compileCudaProgram
// (NVRTC) — and runs the program on a CudaRunner of its device. Each set of
// input shapes compiles once. It can also run a stored program (a `.kc`
// file compiled for CUDA) without compiling anything.
//
// A function with ops whose result sizes depend on values or with control
// flow (`if`, `loop`) runs in stages as on the CPU (codegen/Stages.h,
// docs/codegen.md sections 6 and 7): the prefix, the suffix and each body
// of an `if` or `loop` are CUDA programs of their own, each run by an
// executor of its own (a body compiled once per set of argument shapes);
// the host ops run on the host, so the values they read and give cross
// between the host and the device at each stage (docs/cuda.md).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "passes/MemoryPlan.h"
#include "runtime/Tensor.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaProgram.h"
#include "runtime/cuda/CudaRunner.h"

namespace kiln::codegen {

struct CompileReport;
template <typename Executor>
class StagedExecutors;

struct CudaOptions {
  /// The CUDA backend's pipeline run before lowering (codegen/Backend.h):
  /// -O3 by default; its own, apart from CpuOptions::optLevel.
  int optLevel = 3;
  /// CUBIN architectures (empty: the device's, see defaultCudaArchs).
  std::vector<int> archs = {};
  cuda::CudaRunOptions run = {};
  /// Donated arguments, as CpuOptions::aliases.
  std::vector<ResultAlias> aliases = {};
  /// When given, compile times are added to it.
  CompileReport* report = nullptr;
};

class CudaExecutor {
 public:
  static Expected<std::unique_ptr<CudaExecutor>> create(const Function& f, std::shared_ptr<cuda::CudaContext> context,
                                                        CudaOptions options = {});
  /// Runs `program` (a `.kc` file's): nothing is compiled.
  static Expected<std::unique_ptr<CudaExecutor>> fromProgram(std::shared_ptr<const cuda::CudaProgram> program,
                                                             std::shared_ptr<cuda::CudaContext> context,
                                                             CudaOptions options = {});
  ~CudaExecutor();

  Status prepare(const std::vector<Tensor>& inputs);
  const std::vector<std::string>& unsupportedOps() const { return unsupported_; }
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);
  /// `next`: the next runInPlace's inputs, copied to the device ahead
  /// (CudaRunner::runInPlace) when they have this run's shapes.
  Expected<std::vector<Tensor>> runInPlace(std::vector<Tensor>& inputs,
                                           const std::vector<const Tensor*>* next = nullptr);
  /// Copies donated values kept on the device back to the host (every
  /// runner's; CudaRunOptions::keepDonated).
  Status syncDonated();

  /// The optimized module and program compiled for `inputs`' shapes (for a
  /// `.kc`), and the translation unit NVRTC compiled.
  Expected<std::pair<const Module*, std::shared_ptr<const cuda::CudaProgram>>> compiledProgram(
      const std::vector<Tensor>& inputs);
  Expected<MemoryPlan> memoryPlan(const std::vector<Tensor>& inputs);
  /// The `.kc` bytes of the program compiled for `inputs`' shapes, as
  /// `kiln compile --device cuda -o` writes them: the optimized module, the
  /// program, its CUBINs and PTX (this device's architectures, unless
  /// CudaOptions::archs names others) and the memory plan's text. A stored
  /// program (fromProgram) or a function run in stages is an error.
  Expected<std::string> artifact(const std::vector<Tensor>& inputs);
  /// The runner of the last run (its image, graph replays), or null.
  const cuda::CudaRunner* lastRunner() const;
  cuda::CudaContext& context() const { return *context_; }

 private:
  struct Compiled;
  CudaExecutor();
  Expected<Compiled*> compiled(const std::vector<Tensor>& inputs);

  std::unique_ptr<Module> module_;
  std::shared_ptr<cuda::CudaContext> context_;
  CudaOptions options_;
  std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<Compiled>> cache_;
  std::vector<std::string> unsupported_;
  Compiled* last_ = nullptr;
  /// With host ops: the stages and the executors of their parts.
  std::unique_ptr<StagedExecutors<CudaExecutor>> staged_;
};

}  // namespace kiln::codegen
