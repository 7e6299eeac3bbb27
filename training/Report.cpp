// The progress line and the formatted reports of a training run
// (training/Report.h).
#include "training/Report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "training/Metrics.h"
#include "training/Numerics.h"

namespace kiln::training {

std::string formatFixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

ProgressLine::ProgressLine(std::ostream& out, bool terminal, int64_t total, std::optional<int64_t> logEvery)
    : out_(out), total_(total), logEvery_(logEvery), tty_(terminal), last_(Clock::now()) {
  setFirst(0);
}

void ProgressLine::setFirst(int64_t first) {
  first_ = first;
  every_ = logEvery_.value_or(std::max<int64_t>(1, (total_ - first) / 10));
}

void ProgressLine::stepDone(const StepReport& r) {
  lossSum_ += r.loss;
  ++lossCount_;
  const int64_t done = r.step + 1;
  const auto now = Clock::now();
  if (tty_) {
    if (now - last_ < std::chrono::milliseconds(100) && done != total_) return;
    out_ << "\r" << line(r) << "\033[K" << std::flush;
    drawn_ = true;
  } else {
    if (done % every_ != 0 && done != total_) return;
    out_ << line(r) << "\n";
  }
  last_ = now;
  lossSum_ = 0;
  lossCount_ = 0;
}

void ProgressLine::breakLine() {
  if (tty_ && drawn_) out_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

std::string ProgressLine::line(const StepReport& r) const {
  const int64_t done = r.step + 1;
  const double eta = done > first_ ? r.seconds / static_cast<double>(done - first_) * (total_ - done) : 0;
  return "step " + std::to_string(done) + "/" + std::to_string(total_) + " epoch " + std::to_string(r.epoch + 1) +
         " loss " + formatFixed(lossSum_ / std::max(lossCount_, 1), 6) + " lr " + shortest(r.lr) +
         (r.lossScale > 0 ? " loss scale " + shortest(r.lossScale) : std::string()) + " samples/s " +
         formatFixed(static_cast<double>(r.samples) / std::max(r.seconds, 1e-9), 1) + " eta " + formatFixed(eta, 1) +
         "s";
}

std::string formatEpoch(const EpochReport& r) {
  return "epoch " + std::to_string(r.epoch + 1) + ": mean loss " + formatFixed(r.meanLoss, 6) + " over " +
         std::to_string(r.steps) + " steps";
}

std::string formatEval(const EvalReport& r, bool classLoss) {
  const std::string when = r.epoch > 0 ? "after epoch " + std::to_string(r.epoch) : "at step " + std::to_string(r.step);
  std::string text = "eval " + when + ": loss " + formatFixed(r.result.meanLoss(), 6);
  if (classLoss)
    text += " accuracy " + formatFixed(r.result.accuracy(), 4) + " (" + std::to_string(r.result.correct) + "/" +
            std::to_string(r.result.counted) + ")";
  return text;
}

std::string formatSummary(const TrainSummary& s, bool classLoss) {
  std::ostringstream out;
  out << "trained " << s.steps() << (s.steps() == 1 ? " step (" : " steps (") << s.samples << " samples) in "
      << formatFixed(s.seconds, 2) << " s (not counting compilation and evaluation), "
      << formatFixed(s.samplesPerSecond(), 1) << " samples/s; final loss " << formatFixed(s.finalLoss, 6) << "\n";
  // A wider table reads worse than none (a language model's vocabulary).
  constexpr size_t kMaxConfusionClasses = 32;
  if (s.lastEval && classLoss && s.lastEval->confusion.size() <= kMaxConfusionClasses)
    out << formatConfusion(s.lastEval->confusion);
  else if (s.lastEval && classLoss)
    out << "(no confusion matrix: " << s.lastEval->confusion.size() << " classes, more than " << kMaxConfusionClasses
        << ")\n";
  return out.str();
}

}  // namespace kiln::training
