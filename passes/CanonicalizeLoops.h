// Loops that a counter stops, made counted loops: the `canonicalize-loops`
// pass (passes/CanonicalizeLoops.cpp) and the one-loop step it and the VJP
// of `loop` share.
#pragma once

#include <cstdint>
#include <optional>

#include "ir/IR.h"

namespace kiln {

/// The iterations of `loop` when its body's condition is a counter compared
/// with a constant, as PyTorch exports `while i < n` (ONNX Loop without a
/// trip count): the condition returned at iteration k is `lt(v_k, b)` or
/// `le(v_k, b)` with v_k = a + k*d, d > 0, v_k the iteration number or an
/// integer carried value that the body steps by a constant (plus constant
/// offsets). Iteration 0 runs when the initial condition is true, iteration
/// k > 0 when the condition of k - 1 was, so the count is
/// 1 + #{k >= 0 : v_k < b}, at most the trip bound. None when the loop does
/// not have this form.
std::optional<int64_t> counterTripCount(const Op& loop);

/// Makes `loop` a counted loop in place when counterTripCount gives its
/// count: its trip bound that constant and the condition its body returns
/// true. Its results do not change (the condition was true in every
/// iteration but the last, after which the bound stops it too). Returns
/// whether it changed the loop.
bool countLoop(Op& loop);

}  // namespace kiln
