// The verifier: structural and type checks every pass must preserve.
#pragma once

#include "ir/IR.h"

namespace kiln {

/// Checks `m` and reports every problem through `report` (when given).
/// Checks: unique function and value names; every operand defined before
/// use in the same function; arity and attributes (names, kinds, required)
/// against the op table; declared result types compatible with the shape
/// rule; `return` last and matching the signature; a region exactly on ops
/// that have one (`fused`), taking the operands' types, returning the op's
/// result types, holding only primitives and using only its own values;
/// the regions of `if` (two) and `loop` (one) admitting the operands' types
/// and giving types the op's results admit (docs/ir.md, "Control flow").
/// Returns the first error.
Status verify(const Module& m, const DiagnosticHandler& report = {});
Status verify(const Function& f, const DiagnosticHandler& report = {});

}  // namespace kiln
