// Reverse-mode automatic differentiation as a graph transform: the backward
// graph of a function's scalar loss is appended to the function as new ops
// (the VJP rules of passes/Vjp.h), and the gradients become extra results
// named "grad.<parameter name>". docs/autodiff.md describes the design.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/Builder.h"
#include "ir/IR.h"

namespace kiln {

struct AutodiffOptions {
  /// The arguments to differentiate, by name. When unset: every float
  /// argument that has a default value (an ONNX model's float initializers).
  std::optional<std::vector<std::string>> parameters;
  /// Which result is the loss; it must be a scalar f32 or f64.
  size_t lossIndex = 0;
};

/// Appends to `f` the gradients of result `options.lossIndex` with respect
/// to the chosen parameters, one result "grad.<name>" each (in argument
/// order), of the parameter's type. Composite ops are decomposed first.
/// Forward values are reused by the backward ops; gradients of a value used
/// several times are summed; a parameter the loss does not depend on gets
/// zeros. Errors (a non-scalar or integer loss, an unknown parameter, an op
/// without a rule on the path from a parameter to the loss) name what was
/// wrong; on error `f` may be partly decomposed (and a loop may stack its
/// carried values, vjpLoop) but has no backward ops.
Status differentiateFunction(Function& f, const AutodiffOptions& options = {});

/// Builds with `b`, in `b`'s function, the gradient of the sum of `y`'s
/// elements (y's gradient seeded with ones) with respect to each of `xs`,
/// from the ops of the function as they stand; `zs` are held constant (no
/// gradient flows through them, even where they are computed from an x).
/// The forward ops are left as they are: a composite op on the way is
/// differentiated through a decomposed copy. An x that y does not depend on
/// gets zeros. Errors name the op without a rule, or the non-float x or y.
/// ONNX's Gradient op (ai.onnx.preview.training) is imported with it.
Expected<std::vector<Value*>> buildGradients(Builder& b, Value* y, std::span<Value* const> xs,
                                             std::span<Value* const> zs);

}  // namespace kiln
