// The values that `constant` ops give, read at compile time: the tensor a
// constant defines, the scalar a one-element constant gives, and the value
// a splat constant repeats. Passes, the VJP rules and the importer match
// patterns on these (a loop's trip bound, a select on a known condition,
// a quantization scale); they read them here rather than each through the
// op's `value` attribute.
#pragma once

#include <cstdint>
#include <optional>

#include "ir/IR.h"

namespace kiln {

/// The tensor of the `constant` op that defines `v`, or null when another
/// op defines it, or none does (a function argument).
const DenseTensor* constantTensor(const Value* v);

/// The scalar a constant gives: the only element of `v`, as a double, when
/// a `constant` op defines it with exactly one element (of any rank); else
/// none.
std::optional<double> constantScalar(const Value* v);

/// The scalar an integer or bool constant gives, exactly, as an int64
/// (constantScalar's condition, and an integer or bool dtype); none for
/// other values, floats included.
std::optional<int64_t> constantIntegerScalar(const Value* v);

/// The value every element of `v` holds when a `constant` op defines it
/// with a non-empty tensor whose elements are bitwise equal (a splat);
/// else none.
std::optional<double> splatValue(const Value* v);

}  // namespace kiln
