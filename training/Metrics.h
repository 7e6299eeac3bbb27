// Evaluation metrics, computed on the host in double from a model's output
// and the labels: the loss by the training loss's formula (label smoothing
// included; summed here, so that batches of any size add up to the mean
// over the whole evaluation set), and for class losses the accuracy
// (argmax over the class axis) and the confusion matrix. Labels equal to
// the ignored label add nothing and are not counted, as in PyTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "passes/TrainingStep.h"
#include "runtime/Tensor.h"

namespace kiln::training {

/// Sums over an evaluation.
struct EvalResult {
  double loss = 0;                              // summed over the counted labels
  int64_t correct = 0, counted = 0;             // class losses: argmax == label
  std::vector<std::vector<int64_t>> confusion;  // class losses: [true][predicted]

  /// The mean loss over the counted labels (MSE: elements).
  double meanLoss() const { return loss / static_cast<double>(counted > 0 ? counted : 1); }
  /// The fraction of counted labels predicted right.
  double accuracy() const { return static_cast<double>(correct) / static_cast<double>(counted > 0 ? counted : 1); }
};

/// Adds the loss and predictions of `out` (the model's output on a batch)
/// against `labels` under `loss` to `r`. The classes are dim 1 of `out`
/// ([N, C, inner...]), or its last dim with `classesLast` ([N, inner..., C]);
/// `labels` is [N, inner...] (int64) for class losses, like `out` for MSE.
void accumulateEval(const Tensor& out, const Tensor& labels, const LossConfig& loss, bool classesLast, EvalResult& r);

/// The confusion matrix as a table, rows the true class, columns the
/// predicted one, each line ending in a newline.
std::string formatConfusion(const std::vector<std::vector<int64_t>>& m);

}  // namespace kiln::training
