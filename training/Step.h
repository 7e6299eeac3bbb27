// One training step, built and fed: turning a model function specialized to
// a batch shape into its training step (passes/TrainingStep.h's
// buildTrainingStep, after moving a classes-last output's class axis to
// dim 1 where the loss ops read it), the step's initial state, and binding
// its arguments for a run: the leading parameters and state, then by name
// the labels, the learning rate, the model inputs of the batch, and each
// other argument's default. `kiln train`'s Trainer, kiln-train-bench and
// the training-step benchmark build and feed their steps this one way.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "passes/TrainingStep.h"
#include "runtime/Tensor.h"
#include "training/Checkpoint.h"

namespace kiln::training {

/// Rewrites `f` (a model function with static shapes, as loadTrainableModel
/// loads it) into its training step. With `classesLast`, a first output
/// [N, T..., C] of rank > 2 is transposed to [N, C, T...] first, as
/// PyTorch's cross_entropy(logits.transpose(1, 2), labels).
Status makeTrainingStep(Function& f, const TrainingStepOptions& options, bool classesLast);

/// The leading arguments of training step `step` (one per result after the
/// loss: parameters, then state) with their default values: the state of a
/// first step.
TrainState initialState(const Function& step);

/// The values a training step takes besides its leading arguments.
struct StepFeed {
  /// Model inputs by name (the batch; zeros for inputs fed none).
  std::map<std::string, Tensor> inputs;
  /// The "labels" argument.
  Tensor labels;
  /// The "lr" argument: the base learning rate, a scalar of the output's
  /// float type (learningRateTensor).
  Tensor lr;
};

/// The scalar "lr" argument of a step whose model output is `dtype`.
Tensor learningRateTensor(DType dtype, double lr);

/// The arguments of `step` in order: `leading` first (parameters and state;
/// may be empty, then they come from their defaults too), then each other
/// argument by name: "labels", "lr", a model input of `feed.inputs`, or the
/// argument's default. An argument without a value, or with a value of
/// another type than the argument's, is an error naming it; `leading` is
/// then left as it was (the caller's state survives a refused batch), and
/// taken (moved from) only on success.
Expected<std::vector<Tensor>> bindStepInputs(const Function& step, std::vector<Tensor>&& leading, StepFeed feed);

}  // namespace kiln::training
