// The checkpoint format of training: a .npz file (runtime/Npz.h, written
// atomically) holding the training step's leading arguments (parameters,
// batch-norm statistics and optimizer state) by name, and two arrays about
// the run that wrote it:
//
//   kiln.train_state    int64[7]:  format (2), step, seed, batch size,
//                                  shuffle, drop-last, number of samples
//   kiln.train_options  float64[15]: optimizer, lr, momentum, dampening,
//                                  nesterov, weight decay, beta1, beta2, eps,
//                                  schedule, step size, gamma, warm-up steps,
//                                  min lr, the cosine schedule's total steps
//
// The step count and the seed are the whole state of the sample order
// (Data.h's epochOrder), so a resumed run continues exactly. Reading checks
// every field against the run that resumes and names the first that
// differs, with both values. Format 1 (before kiln.train_options) is
// refused with a message saying why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "passes/TrainingStep.h"
#include "runtime/Tensor.h"

namespace kiln::training {

/// The checkpoint format this library writes and reads.
constexpr int64_t kCheckpointVersion = 2;

/// Names and values of a training step's leading arguments (parameters,
/// then state), as a checkpoint stores them.
struct TrainState {
  std::vector<std::string> names;
  std::vector<Tensor> values;
};

/// What a resumed run must share with the run that wrote a checkpoint to
/// continue the same optimization: the batching and the optimizer and
/// learning-rate options.
struct CheckpointRun {
  uint64_t seed = 0;
  int64_t batchSize = 0;
  bool shuffle = true, dropLast = false;
  int64_t samples = 0;  // training samples
  double lr = 0;        // the base learning rate
  OptimizerConfig optimizer;
  LrScheduleConfig schedule;
};

/// Writes `state` at step `step` of `run` to `path` (atomically).
Status writeCheckpoint(const std::string& path, const TrainState& state, const CheckpointRun& run, int64_t step);

/// Loads the checkpoint at `path` into `state`, whose names and value types
/// (the resuming run's training step) it must hold exactly, and returns the
/// step it was written at. Every disagreement with `run` is an error naming
/// the option and both values.
Expected<int64_t> readCheckpoint(const std::string& path, const CheckpointRun& run, TrainState& state);

}  // namespace kiln::training
