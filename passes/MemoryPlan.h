// The memory plan of one function: where each intermediate tensor lives in a
// single arena, and for which kernels. It is plain data, computed by
// planMemory (passes/PlanMemory.cpp, algorithm in docs/codegen.md §4), read
// by the runtime to bind kernel buffers, and printed by
// `kiln-opt --print-memory-plan` for lit tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace kiln {

/// Where the intermediates of one function live in one arena.
struct MemoryPlan {
  /// Every offset is a multiple of this (a cache line, and the widest vector
  /// load of AVX-512), so kernels may use aligned vector accesses.
  static constexpr int64_t kAlignment = 64;

  /// One intermediate value and its place in the arena.
  struct Buffer {
    const Value* value = nullptr;
    /// The value's name hint, printed as `%name`.
    std::string name;
    int64_t size = 0;  // bytes
    int64_t alignment = kAlignment;
    int64_t offset = 0;  // bytes from the arena's start
    /// The kernels (indices into the function's kernel sequence) that write
    /// it first and read it last; it occupies memory for all of [first, last].
    int first = 0;
    int last = 0;
    /// Index in `buffers` of the input whose memory this value overwrites
    /// in place, or -1.
    int inPlaceOf = -1;
  };

  std::string function;  // the function's name
  /// In order of definition.
  std::vector<Buffer> buffers;
  /// The number of kernels: top-level ops other than constants and `return`.
  int numKernels = 0;
  /// The arena size: the end of the highest buffer, rounded to kAlignment.
  int64_t peak = 0;
  /// The arena size if nothing were reused: every buffer rounded to
  /// kAlignment, one after another.
  int64_t noReuseTotal = 0;

  /// The buffer of `v`, or null when `v` is not in the arena.
  const Buffer* find(const Value* v) const;
  /// One line per buffer (`%name: offset O, size S, live [a, b]`, plus `, in
  /// place of %x`), then `peak P bytes, no reuse T bytes`.
  std::string str() const;
};

/// Plans the arena of `f`: each top-level op other than a constant or the
/// `return` is one kernel, in order. An error names the first value whose
/// shape is not static.
Expected<MemoryPlan> planMemory(const Function& f);

}  // namespace kiln
