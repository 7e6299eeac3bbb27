// The CPU backend (codegen/Backend.h): oneDNN for the library calls it
// takes (CpuTarget.h), the CPU schedule (codegen/Schedule.h
// scheduleForCpu), and programs compiled by LLVM and linked by lld into a
// shared object (CpuCompiler.h). A `.kc` it wrote runs here when its code
// was built for this CPU (targetMismatch).
#pragma once

#include <memory>
#include <string>

#include "codegen/Backend.h"

namespace kiln::codegen {

/// The CPU compiler's options.
struct CpuCompilerOptions : BackendOptions {
  /// Threads that compile kernels (0: one per core).
  int threads = 0;
  /// The folder of the disk cache of compiled kernels (codegen/KernelCache.h);
  /// empty: no cache.
  std::string cacheDir;
};

/// A new CPU backend (the registry holds the one `--target cpu` names).
std::unique_ptr<Backend> createCpuBackend();
/// The registered CPU backend.
const Backend& cpuBackend();

}  // namespace kiln::codegen
