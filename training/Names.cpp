// The names of the training step's choices (training/Names.h).
#include "training/Names.h"

namespace kiln::training {

std::optional<LossKind> lossKindNamed(std::string_view name) {
  if (name == "cross_entropy") return LossKind::CrossEntropy;
  if (name == "nll") return LossKind::Nll;
  if (name == "mse") return LossKind::Mse;
  return std::nullopt;
}

std::optional<OptimizerKind> optimizerKindNamed(std::string_view name) {
  if (name == "sgd") return OptimizerKind::Sgd;
  if (name == "adam") return OptimizerKind::Adam;
  if (name == "adamw") return OptimizerKind::AdamW;
  return std::nullopt;
}

std::optional<LrScheduleKind> lrScheduleKindNamed(std::string_view name) {
  if (name == "constant") return LrScheduleKind::Constant;
  if (name == "step") return LrScheduleKind::Step;
  if (name == "cosine") return LrScheduleKind::CosineWarmup;
  return std::nullopt;
}

std::optional<BatchNormMode> batchNormModeNamed(std::string_view name) {
  if (name == "train") return BatchNormMode::Train;
  if (name == "frozen") return BatchNormMode::Frozen;
  return std::nullopt;
}

}  // namespace kiln::training
