// Bounds on the values of a kernel's integer expressions, from its loop
// extents and constants. Both emitters ask it one question: can this
// integer operation leave its dtype's range? Index arithmetic (loop
// variables times strides, divided by dim sizes) provably cannot, so it is
// written as plain machine operations, which keeps the generated CUDA C++
// readable and its `t / 8LL`-style index math as before; any other integer
// arithmetic (on loaded data, or SplitMix64's deliberate overflow) calls
// the wrapping functions of ir/ScalarSemantics.h, which is what makes it
// wrap in CUDA C++, where signed overflow is undefined.
//
// The bounds are conservative: a load, a sum or a pow may take any value of
// its dtype. Each bound is for the value an expression has after its dtype
// wrapped it, so it always lies inside the dtype's range.
#pragma once

#include <unordered_map>

#include "codegen/KernelIR.h"

namespace kiln::kir {

/// Bounds are remembered by node address, so the expressions asked about
/// must outlive the ValueRanges (an emitter's kernel does).
class ValueRanges {
 public:
  /// Collects the extents of `kernel`'s loop and reduction variables.
  explicit ValueRanges(const Kernel& kernel);

  /// Whether integer Add, Sub, Mul (Binary) or Neg, Abs (Unary) `e`,
  /// computed exactly, always lies inside its dtype's range, so that plain
  /// (non-wrapping) arithmetic gives the same result as wrapping arithmetic.
  bool cannotOverflow(const Expr& e);
  /// Whether integer expression `e` is always at least `bound`: a divisor of
  /// at least 1 makes division trap-free without the zero and -1 cases.
  bool atLeast(const Expr& e, int64_t bound);
  /// Whether the machine's plain operator computes integer Binary `e` (Add,
  /// Sub, Mul, Div, Rem, or Mod as the remainder) exactly as ir/ScalarSemantics.h
  /// defines it: + - * when the exact result fits the dtype, / and % when the
  /// divisor is at least 1, and mod when the dividend is also at least 0.
  bool plainOperatorSuffices(const Expr& e);

 private:
  /// Inclusive bounds, wide enough for the exact result of any operation on
  /// two 64-bit bounds.
  struct Range {
    __int128 lo, hi;
  };
  Range range(const Expr& e);
  Range exact(const Expr& e);

  std::unordered_map<int, int64_t> extents_;
  std::unordered_map<const Expr*, Range> ranges_;
};

}  // namespace kiln::kir
