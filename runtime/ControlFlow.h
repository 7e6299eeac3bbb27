// What `if` and `loop` (ir/Ops.def) mean at run time, written once for every
// executor: the interpreter runs their bodies by interpreting the regions,
// a compiled CPU program by running the bodies' compiled sub-programs. Both
// pass a BodyRunner; these functions choose the branch, count iterations,
// thread the carried values and stack the scan values.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "ir/Limits.h"
#include "ir/Support.h"
#include "ir/Types.h"
#include "runtime/Tensor.h"

namespace kiln {

/// Runs region `region` (an `if`'s 0 = then, 1 = else; a loop's 0) on
/// `inputs`, one per region argument, and returns its results.
using BodyRunner = std::function<Expected<std::vector<Tensor>>(size_t region, std::vector<Tensor> inputs)>;

/// An `if` on `operands` (the bool scalar condition, then the captures);
/// errors carry `loc`.
Expected<std::vector<Tensor>> runIf(std::span<const Tensor* const> operands, size_t numResults,
                                    const BodyRunner& runBody, const Location& loc);

/// A `loop` on `operands` (i64 trip bound, bool condition, `numCarried`
/// carried values, captures). `resultTypes` are the op's declared result
/// types: the carried values' and then the stacked scan values', whose dims
/// after the first size the empty stack of a loop that runs no iteration.
Expected<std::vector<Tensor>> runLoop(std::span<const Tensor* const> operands, int64_t numCarried,
                                      std::span<const TensorType> resultTypes, const BodyRunner& runBody,
                                      const Location& loc);

}  // namespace kiln
