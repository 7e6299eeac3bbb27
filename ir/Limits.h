// Limits that the semantics of Kiln IR fix, shared by the passes, the
// interpreter and the compiled programs, so that each is stated once.
#pragma once

#include <cstdint>

namespace kiln {

/// The most iterations a `loop` may run: the interpreter and the compiled
/// programs stop a loop that runs more with an error (taking it for one
/// that never ends, rather than hanging), and the VJP of `loop` stacks at
/// most this many iterations' carried values.
inline constexpr int64_t kMaxLoopIterations = int64_t{1} << 31;

}  // namespace kiln
