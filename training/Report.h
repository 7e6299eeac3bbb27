// What a training run reports, as `kiln train` prints it (docs/cli.md,
// docs/training.md): the progress line after each step, the epoch
// summaries, the evaluations and the final summary with its confusion
// matrix. The trainer itself prints nothing (training/README.md); these
// format its reports for a stream the caller chooses.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "training/Trainer.h"

namespace kiln::training {

/// `v` with `digits` digits after the point ("%.*f").
std::string formatFixed(double v, int digits);

/// The progress line after each step: redrawn in place on a terminal (at
/// most every 100 ms), else a plain line every `logEvery` steps (by
/// default about ten a run) and at the last.
class ProgressLine {
 public:
  /// `out` is a terminal when `terminal`; `total` is the run's last step.
  ProgressLine(std::ostream& out, bool terminal, int64_t total, std::optional<int64_t> logEvery);

  /// The step training starts at (a resumed checkpoint's).
  void setFirst(int64_t first);

  /// Counts the step's loss and prints the line when it is due.
  void stepDone(const StepReport& r);

  /// Erases the updating line before other output, which then takes its
  /// place; the next step draws it again below.
  void breakLine();

 private:
  using Clock = std::chrono::steady_clock;

  /// The loss is the mean since the previous line; samples/s and the ETA
  /// leave out compiling and evaluating.
  std::string line(const StepReport& r) const;

  std::ostream& out_;
  int64_t total_, first_ = 0;
  std::optional<int64_t> logEvery_;
  bool tty_;
  int64_t every_ = 1;
  Clock::time_point last_;
  double lossSum_ = 0;
  int lossCount_ = 0;
  bool drawn_ = false;
};

/// "epoch E: mean loss X over N steps".
std::string formatEpoch(const EpochReport& r);

/// "eval after epoch E: loss X" or "eval at step S: ...", with the accuracy
/// for a class loss.
std::string formatEval(const EvalReport& r, bool classLoss);

/// The final summary: steps, samples, time, samples/s and the final loss,
/// then for a class loss the last evaluation's confusion matrix (or why
/// there is none: more classes than a table reads well with).
std::string formatSummary(const TrainSummary& s, bool classLoss);

}  // namespace kiln::training
