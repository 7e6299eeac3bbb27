// The CPU backend (docs/codegen.md section 3): kernel IR to LLVM IR, the O3
// pipeline for the host CPU, and ORC LLJIT. No LLVM header leaks through
// this interface, so the executor and the tools build without them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/Support.h"

namespace kiln::codegen {

/// A compiled kernel: `[begin, end)` is the slice of its parallel loop.
using KernelFn = void (*)(void** buffers, const int64_t* sizes, int64_t begin, int64_t end);

/// Compiles kernels for the CPU this process runs on.
class CpuJit {
 public:
  /// A JIT for the host CPU (its name and features, e.g. AVX-512), or the
  /// error LLVM gives when the host is not supported.
  static Expected<std::unique_ptr<CpuJit>> create();
  ~CpuJit();

  /// Emits `kernels` into one LLVM module, optimizes it at O3 and adds it
  /// to the JIT; returns the entry points in the same order. Kernel names
  /// must be unique within this JIT.
  Expected<std::vector<KernelFn>> compile(const std::vector<kir::Kernel>& kernels);

  /// The LLVM IR of `kernels` after the O3 pipeline, as text
  /// (`kiln compile --emit=llvm`); nothing is added to the JIT.
  Expected<std::string> optimizedIR(const std::vector<kir::Kernel>& kernels);

  /// The host CPU name and whether it is known to LLVM, for messages.
  const std::string& cpuName() const;

 private:
  struct Impl;
  explicit CpuJit(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::codegen
