// The run-time checks a compiled program makes on the host, because its
// kernels clamp gather indices and give 0 for an integer division by zero
// instead of failing: a gather's or scatter's indices in range, an integer
// divisor nonzero, an integer pow's exponent nonnegative. They come from the
// IR's `check` ops (the insert-host-checks pass) and fail with the message
// the interpreter gives for the checked op, at its location. The
// interpreter's kernel of `check` is the same code, so the two never differ.
#pragma once

#include <string>

#include "ir/IR.h"

namespace kiln {

/// One host check, as plain data (a compiled program stores it).
struct HostCheck {
  enum class Condition : uint8_t { InRange, NonZero, NonNegative };
  Condition condition = Condition::InRange;
  /// The checked op's name (`gather`, `div`, `pow`...), for the message.
  std::string of;
  /// InRange: the dim the indices index, and its size.
  int64_t axis = 0;
  int64_t size = 0;
  /// Where the checked op is, for the message.
  Location loc;
};

/// The check a `check` op describes.
Expected<HostCheck> hostCheckOf(const Op& check);

/// The error the interpreter gives for the first of `n` integer (or bool)
/// elements of dtype `dtype` at `data` that fails `check`, or success.
Status runHostCheck(const HostCheck& check, const void* data, DType dtype, int64_t n);

}  // namespace kiln
