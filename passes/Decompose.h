// Decomposition of composite ops (OpClass::Composite in ir/Ops.def) into the
// primitive ops, with the semantics of docs/ops.md. The `decompose` pass
// applies it to every function; other passes (autodiff, the importer's
// tests) can expand a single op or function directly.
#pragma once

#include "ir/IR.h"

namespace kiln {

/// Replaces composite `op` by primitives inserted just before it, rewires
/// its uses and erases it. On error (e.g. an RNN whose sequence length is
/// not static) the function is left as it was and the error names the op.
Status decomposeOp(Op& op);

/// Decomposes every composite op of `f`; true when any was expanded.
Expected<bool> decomposeFunction(Function& f);

}  // namespace kiln
