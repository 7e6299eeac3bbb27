// The compile half of the CPU backend: from a function at the end of the
// CPU target's pipeline (static shapes; fused, library-selected, split,
// scheduled, host checks inserted) to a CpuProgram (runtime/CpuProgram.h),
// the plain data that the runtime executes. It lowers each op to a step
// (codegen/LowerToKernels.h), gives every value a slot, plans the arena
// (passes/MemoryPlan.h: donated arguments written in place where a kernel
// reads them only at the element it writes), compiles the kernels with LLVM
// and links them into the program's shared object (codegen/llvm/CpuJit.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/KernelIR.h"
#include "codegen/LowerToKernels.h"
#include "ir/IR.h"
#include "passes/MemoryPlan.h"
#include "runtime/CpuProgram.h"

namespace kiln::codegen {

class Backend;
class CpuJit;
class KernelCache;
struct CompileReport;

/// A compiled function: the program, and what only the compiler keeps for
/// tests and `--emit` (the kernels' IR, in program order, and the memory
/// plan of `f`'s values).
struct CpuCompilation {
  std::shared_ptr<CpuProgram> program;
  std::vector<kir::Kernel> kernels;
  MemoryPlan plan;
};

struct CpuCompileOptions {
  /// Kernel names are `<prefix><op>_<step>`.
  std::string kernelPrefix = "kiln_";
  /// Threads that compile kernels (0: one per core), and the disk cache of
  /// compiled kernels (null: none).
  int threads = 0;
  KernelCache* cache = nullptr;
  /// Compile times are added to it when given.
  CompileReport* report = nullptr;
};

/// The program of `f` without its code: steps (lowered and scheduled by
/// `backend`, lowerForBackend), slots, the memory plan and the arena, the
/// kernels' names and hashes. Both targets' compilers start from it
/// (codegen/cuda/CudaCompiler.h adds CUDA code instead of a shared object).
Expected<CpuCompilation> layoutProgram(const Function& f, const Backend& backend, const std::string& kernelPrefix,
                                       std::vector<std::string>* unsupported = nullptr);

/// Whether layoutProgram runs no step for `step`: its result is a view in
/// `plan` (MemoryPlan::Buffer::viewOf) and no host checks wait to run
/// before it.
bool elidedAsView(const LoweredStep& step, const MemoryPlan& plan, bool checksPending);

/// Compiles `f` for the CPU. Ops that cannot be lowered yet make an error
/// that names every one, each also in `unsupported` (`name (why) at loc`).
Expected<CpuCompilation> compileCpuProgram(const Function& f, CpuJit& jit, const CpuCompileOptions& options,
                                           std::vector<std::string>* unsupported = nullptr);

/// Why `program`'s machine code cannot run here: it was made by another code
/// generator than this Kiln's, or for another triple, CPU or CPU features
/// than `host`'s; "" when it can.
std::string targetMismatch(const CpuProgram& program, const CpuMachine& host);

/// The contentHash of each kernel's printed kernel IR, without the buffers'
/// value names (for reading only; a module printed and parsed again may name
/// unnamed values).
std::vector<std::string> kernelHashes(const std::vector<kir::Kernel>& kernels);

}  // namespace kiln::codegen
