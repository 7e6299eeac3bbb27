// The CPU backend (docs/codegen.md sections 3 and 5): kernel IR to LLVM IR,
// the O3 pipeline for the host CPU, machine code as relocatable object
// files (position independent), and lld, linked in as a library, to link
// them into one shared object per program, which the runtime loads
// (runtime/LoadedCode.h). Kernels are compiled as several modules on
// several threads; each module's object code, and each linked shared
// object, is looked up in and stored to the disk cache
// (codegen/KernelCache.h) under a hash of what it is made from. No LLVM
// header leaks through this interface, so the executor and the tools build
// without them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/Support.h"
#include "runtime/Program.h"
#include "runtime/LoadedCode.h"

namespace kiln::codegen {

class KernelCache;

/// Part of every cache key and of `.kc` headers: changes whenever what this
/// backend generates for the same LLVM IR could change (the LLVM version,
/// the pipeline in CpuJit.cpp). The emitter's changes show in the IR text.
inline constexpr std::string_view kCpuCodegenVersion = "kiln-0.1.0/llvm-16/cpujit-2-pic-lld";

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
  double link = 0;  // linking objects into a shared object, loading it and creating library calls
  int kernels = 0;
  int modules = 0;
  int cacheHits = 0;
  int threads = 0;
  int storedModules = 0;  // shared objects loaded as stored in a .kc
};

/// Prints `report` as a table like the pass manager's `--time-passes`.
std::string formatCompileReport(const CompileReport& report);


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
  /// cache), then links them into one shared object defining each kernel
  /// under its name (taken from `cache` too when it holds the same link).
  /// Adds times to `report` when given.
  Expected<std::string> compile(const std::vector<kir::Kernel>& kernels, int threads, KernelCache* cache,
                                CompileReport* report);

  /// The LLVM IR of `kernels` after the O3 pipeline, as text
  /// (`kiln compile --emit=llvm`).
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
