// Prints a tensor the way `print(array)` does in NumPy, which is what the
// PyTorch users Kiln serves read every day: nested brackets, elements
// aligned to a common width, floats in NumPy's shortest-round-trip style
// (`[1.5  2.25]`, `[1.0e-05 2.5e+03]`), lines wrapped at 75 columns, and
// tensors of more than 1000 elements summarized with `...` around the
// first and last three items of each axis.
#pragma once

#include <string>

#include "runtime/Tensor.h"

namespace kiln::cli {

/// NumPy's `str(array)` of `t` (without a trailing newline).
std::string formatTensor(const Tensor& t);

}  // namespace kiln::cli
