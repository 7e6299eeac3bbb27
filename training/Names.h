// The names by which the command line (and a checkpoint) calls the
// training step's choices: the loss, the optimizer, the learning-rate
// schedule and the batch-norm mode (docs/training.md).
#pragma once

#include <optional>
#include <string_view>

#include "passes/TrainingStep.h"

namespace kiln::training {

/// cross_entropy, nll, mse.
std::optional<LossKind> lossKindNamed(std::string_view name);
/// sgd, adam, adamw.
std::optional<OptimizerKind> optimizerKindNamed(std::string_view name);
/// constant, step, cosine (CosineWarmup).
std::optional<LrScheduleKind> lrScheduleKindNamed(std::string_view name);
/// train, frozen.
std::optional<BatchNormMode> batchNormModeNamed(std::string_view name);

}  // namespace kiln::training
