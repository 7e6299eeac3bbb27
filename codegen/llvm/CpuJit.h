// The CPU backend (docs/codegen.md sections 3 and 5): kernel IR to LLVM IR,
// the O3 pipeline for the host CPU, machine code as relocatable object
// files, and ORC LLJIT to link them into the process. Kernels are compiled
// as several modules on several threads; each module's object code is
// looked up in, and stored to, the disk cache (codegen/KernelCache.h) under
// a hash of its LLVM IR text and the target. The objects are also what a
// `.kc` file stores, and `load` links stored objects without running LLVM's
// optimizer or code generator. No LLVM header leaks through this interface,
// so the executor and the tools build without them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/Support.h"

namespace kiln::codegen {

class KernelCache;

/// A compiled kernel: `[begin, end)` is the slice of its parallel loop.
using KernelFn = void (*)(void** buffers, const int64_t* sizes, int64_t begin, int64_t end);

/// Part of every cache key and of `.kc` headers: changes whenever what this
/// backend generates for the same LLVM IR could change (the LLVM version,
/// the pipeline in CpuJit.cpp). The emitter's changes show in the IR text.
inline constexpr std::string_view kCpuCodegenVersion = "kiln-0.1.0/llvm-16/cpujit-1";

/// What code is generated for: an object built for one target runs only on
/// a CPU with the same triple, name and features.
struct CpuMachine {
  std::string triple;
  std::string cpu;
  std::string features;  // "+avx,+avx2,-sse4a,...", as LLVM lists them
  bool operator==(const CpuMachine&) const = default;
};

/// Where compile time goes (`--time-passes`). Times are seconds; the LLVM
/// phases run on several threads and are summed over them, `llvmWall` is
/// the wall time of that parallel part.
struct CompileReport {
  std::string passTimings;  // the pass manager's table, when asked for
  double passes = 0;
  double lowering = 0;     // graph ops to kernel IR
  double emit = 0;         // kernel IR to LLVM IR, and printing it for the key
  double optimize = 0;     // LLVM's O3 pipeline
  double codegen = 0;      // machine code generation to object files
  double cacheLookup = 0;  // reading (and checking) cache entries
  double cacheStore = 0;
  double llvmWall = 0;
  double link = 0;  // adding objects to the JIT and resolving kernel symbols
  int kernels = 0;
  int modules = 0;
  int cacheHits = 0;
  int threads = 0;
  int storedModules = 0;  // object files linked as stored in a .kc
};

/// Prints `report` as a table like the pass manager's `--time-passes`.
std::string formatCompileReport(const CompileReport& report);

/// Kernels linked into the JIT, and the object files their code came from.
struct CompiledKernels {
  std::vector<KernelFn> entries;     // in the order of the kernels given
  std::vector<std::string> objects;  // relocatable object files (ELF on Linux)
};

/// Compiles kernels for the CPU this process runs on.
class CpuJit {
 public:
  /// A JIT for the host CPU (its name and features, e.g. AVX-512), or the
  /// error LLVM gives when the host is not supported.
  static Expected<std::unique_ptr<CpuJit>> create();
  ~CpuJit();

  /// The target create() generates code for, without creating a JIT.
  static CpuMachine hostTarget();

  /// Emits `kernels` into modules of a few kernels each, optimizes them at
  /// O3 and generates object code on up to `threads` threads (0: one per
  /// core), taking objects from `cache` when it holds them (null: no
  /// cache), then links them; returns the entry points in the same order.
  /// Kernel names must be unique within this JIT. Adds times to `report`
  /// when given.
  Expected<CompiledKernels> compile(const std::vector<kir::Kernel>& kernels, int threads, KernelCache* cache,
                                    CompileReport* report);

  /// Links object files made by compile() for this target and returns the
  /// entry points of `names`, in order; no LLVM optimization or code
  /// generation runs. A missing symbol or a malformed object is an error.
  Expected<std::vector<KernelFn>> load(const std::vector<std::string>& objects, const std::vector<std::string>& names,
                                       CompileReport* report);

  /// The LLVM IR of `kernels` after the O3 pipeline, as text
  /// (`kiln compile --emit=llvm`); nothing is added to the JIT.
  Expected<std::string> optimizedIR(const std::vector<kir::Kernel>& kernels);

  /// The host target code is generated for.
  const CpuMachine& target() const;
  /// The host CPU name, for messages.
  const std::string& cpuName() const;

 private:
  struct Impl;
  explicit CpuJit(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::codegen
