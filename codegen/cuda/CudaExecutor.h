// The CUDA executor: the CpuExecutor's counterpart for a GPU. It compiles a
// Function for the shapes of its inputs — the CUDA target's pipeline
// (codegen/cpu/CpuExecutable.h specializeAndOptimize), then compileCudaProgram
// (NVRTC) — and runs the program on a CudaRunner of its device. Each set of
// input shapes compiles once (runtime/ShapeCache.h). It can also run a stored program (a `.kc`
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

#include <memory>
#include <string>
#include <vector>

#include "codegen/cuda/CudaBackend.h"
#include "ir/IR.h"
#include "passes/MemoryPlan.h"
#include "runtime/ShapeCache.h"
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
  /// The precision the function was compiled for (autocast already run on
  /// it by the session): recorded in the `.kc` that artifact() writes.
  Precision precision = Precision::FP32;
};

class CudaExecutor {
 public:
  static Expected<std::unique_ptr<CudaExecutor>> create(const Function& f, std::shared_ptr<cuda::CudaContext> context,
                                                        CudaOptions options = {});
  /// Runs `program` (a `.kc` file's): nothing is compiled.
  static Expected<std::unique_ptr<CudaExecutor>> fromProgram(std::shared_ptr<const cuda::CudaProgram> program,
                                                             std::shared_ptr<cuda::CudaContext> context,
                                                             CudaOptions options = {});
  /// Runs `program`, a stored program with host steps compiled for CUDA
  /// (a `.kc` file's): each part a CudaRunner on `context`, the stages run
  /// by the runtime's stage driver; nothing is compiled.
  static Expected<std::unique_ptr<CudaExecutor>> fromStaged(std::shared_ptr<const StagedProgram> program,
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
  /// CudaOptions::archs names others) and the memory plan's text; for a
  /// function with host ops, every part compiled into one StagedProgram
  /// (stagedCudaArtifact). A stored program (fromProgram) is an error.
  Expected<std::string> artifact(const std::vector<Tensor>& inputs);
  /// The runner of the shapes last run (its image, graph replays); before
  /// any run, a stored program's; else null.
  const cuda::CudaRunner* lastRunner() const;
  cuda::CudaContext& context() const { return *context_; }

 private:
  struct Compiled;
  CudaExecutor();
  /// The compilation of `inputs`' shapes, compiled on a miss.
  Expected<Compiled*> compiled(const std::vector<Tensor>& inputs);
  Expected<std::unique_ptr<Compiled>> compile(const std::vector<Tensor>& inputs);

  std::unique_ptr<Module> module_;
  std::shared_ptr<cuda::CudaContext> context_;
  CudaOptions options_;
  ShapeCache<Compiled> cache_;  // a program and its runner per set of input shapes
  std::vector<std::string> unsupported_;
  /// With host ops: the stages and the executors of their parts.
  std::unique_ptr<StagedExecutors<CudaExecutor>> staged_;
  /// A stored program with host steps (fromStaged), or null.
  std::unique_ptr<LoadedProgram> stored_;
};

/// The `.kc` bytes of `f`, a function with host ops (codegen/Stages.h), for
/// input `types` at `optLevel`: every part through the CUDA pipeline and
/// compiled by NVRTC with `options` (compileStagedProgram). `plans`, when
/// given, receives the parts' memory plans as text. No GPU is needed.
Expected<std::string> stagedCudaArtifact(const Function& f, const std::vector<TensorType>& types,
                                         const CudaCompilerOptions& options, int optLevel, CompileReport* report,
                                         std::string* plans = nullptr, Precision precision = Precision::FP32);

}  // namespace kiln::codegen
