// The machine code of a compiled CPU program's kernels, loaded into the
// process: a shared object (ELF) held in memory, written to an anonymous
// memory file (memfd_create) and opened with dlopen, so that nothing is
// written to disk and each program has its own symbols (RTLD_LOCAL).
// Kernels call libm (expf, tanhf, ...), which the process has loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/Support.h"

namespace kiln {

/// A compiled kernel: `[begin, end)` is the slice of its parallel loop that
/// one thread runs.
using KernelFn = void (*)(void** buffers, const int64_t* sizes, int64_t begin, int64_t end);

class LoadedCode {
 public:
  /// Loads `sharedObject` and resolves each of `names`; an error says what
  /// the dynamic loader said, or which kernel is missing.
  static Expected<std::unique_ptr<LoadedCode>> load(std::string_view sharedObject,
                                                    const std::vector<std::string>& names);
  ~LoadedCode();
  LoadedCode(const LoadedCode&) = delete;
  LoadedCode& operator=(const LoadedCode&) = delete;

  KernelFn kernel(size_t i) const { return kernels_[i]; }

 private:
  LoadedCode() = default;
  void* handle_ = nullptr;
  int fd_ = -1;  // the memory file the library was loaded from
  std::vector<KernelFn> kernels_;
};

}  // namespace kiln
