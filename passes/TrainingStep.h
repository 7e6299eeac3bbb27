// The `training-step` transform: turns a function computing a model's output
// into ONE function that runs a whole optimizer step as graph ops,
//
//   (params..., optimizer state..., batch inputs..., labels, lr)
//     -> (loss, new params..., new state...)
//
// built from the forward ops, a loss op (cross_entropy, nll_loss or
// mse_loss, the composites of ir/Ops.def), the backward graph of the
// `autodiff` pass (passes/Autodiff.h) and the optimizer's update ops, which
// follow torch.optim.SGD / Adam / AdamW (PyTorch 1.13) formula for formula.
// The learning rate is a scalar argument so that the caller applies any
// schedule. The optimizer state arguments default to zeros, so a first step
// needs no state from the caller; feeding each step's new params and state
// back as the next step's arguments continues training. docs/training.md
// describes the design and what is not done.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace kiln {

enum class LossKind { CrossEntropy, Nll, Mse };

struct LossConfig {
  LossKind kind = LossKind::CrossEntropy;
  /// "mean", "sum" (the composites' attribute).
  std::string reduction = "mean";
  /// cross_entropy and nll_loss: labels equal to this contribute nothing.
  int64_t ignoreIndex = -100;
  /// cross_entropy only, in [0, 1].
  double labelSmoothing = 0.0;
  /// Which result of the function is the model output the loss reads.
  size_t outputIndex = 0;
};

enum class OptimizerKind { Sgd, Adam, AdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Sgd;
  /// SGD: torch.optim.SGD's momentum, dampening and nesterov.
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  /// SGD and Adam: L2 added to the gradient; AdamW: decoupled decay
  /// (p *= 1 - lr * weightDecay). PyTorch's AdamW default is 0.01.
  double weightDecay = 0.0;
  /// Adam and AdamW.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

struct TrainingStepOptions {
  LossConfig loss;
  OptimizerConfig optimizer;
  /// The arguments to train, by name. When unset: every float argument with
  /// a default value (see liftConstantsToParameters for ONNX weights).
  std::optional<std::vector<std::string>> parameters;
};

/// Rewrites `f` into its training step. Arguments, in order: the parameters
/// (in their original order, defaults kept), the optimizer state (defaults
/// zeros; SGD with momentum: "<p>.momentum_buffer" each and a step counter
/// "step"; Adam/AdamW: "<p>.exp_avg", "<p>.exp_avg_sq" each and "step"; plain
/// SGD: none), the other original arguments (the batch), "labels" (i64 of
/// the output's shape without dim 1 for cross-entropy and NLL, the output's
/// type for MSE) and "lr" (a scalar of the output's float type). Results:
/// "loss", then each new parameter and each new state value, named like the
/// argument it replaces. Errors name what was wrong (an output index out of
/// range, a non-float output, a bad option value, no or unknown
/// parameters) leave `f` unchanged; an error from autodiff (an op without a
/// VJP rule) leaves it with the loss op added.
Status buildTrainingStep(Function& f, const TrainingStepOptions& options);

/// Makes each named float constant with at least one dim (an ONNX weight
/// the importer turned into a constant because it is not a graph input) an
/// argument with that value as its default, so that the default parameter
/// choice finds it. Returns how many were lifted.
size_t liftConstantsToParameters(Function& f);

}  // namespace kiln
