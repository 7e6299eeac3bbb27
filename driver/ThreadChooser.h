// Picks the thread count of a loop of identical steps (kiln train's training
// steps) by timing them, between the cores' count and one.
//
// Why: oneDNN's calls run on OpenMP (Debian's build), whose threads spin at
// barriers. When other programs keep the cores busy, above all other
// OpenMP programs that spin too, a multi-threaded call waits for a
// descheduled thread: measured on 2 cores with two other OpenMP programs
// running, the CNN's training step took 330-490 ms on 2 threads and 67 ms
// on 1, the MLP's 55-110 ms against 0.05 ms (the quiet machine's time on
// either count). No setting of the OpenMP runtime can be changed once the
// process runs (OMP_WAIT_POLICY is read at load), so the count is chosen
// from what the steps measure:
//
//  - trial: kTrialSteps steps on the many threads, then kTrialSteps on one;
//    the count with the lower median runs next;
//  - then kTrialSteps steps on the other count after kProbeInterval steps;
//    it takes over when its median beats the current count's recent median
//    by kSwitchMargin (20%), so noise does not flip the choice. Each probe
//    that loses doubles the interval to the next (up to kMaxProbeInterval);
//    a switch starts it again from kProbeInterval.
//
// The probes cost kTrialSteps slower steps per interval: on a quiet machine
// a step on one thread is at most a few times one on all cores; on a busy
// one a step on all cores can take 15 times one on one thread, which the
// growing interval amortizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

class ThreadChooser {
 public:
  static constexpr int kTrialSteps = 3;
  static constexpr int kProbeInterval = 200;
  static constexpr int kMaxProbeInterval = 6400;
  static constexpr double kSwitchMargin = 0.2;

  /// Chooses between `many` threads and 1; with `many` <= 1 it always
  /// answers 1 and never probes.
  explicit ThreadChooser(int many);

  /// The thread count of the next step.
  int next() const { return probing_ ? other() : current_; }

  /// Records the time of the step just run on next()'s count. Returns a
  /// sentence for the user when the choice changes.
  std::optional<std::string> record(double seconds);

  int current() const { return current_; }
  int many() const { return many_; }

 private:
  int other() const { return current_ == 1 ? many_ : 1; }
  static double median(std::vector<double> v);

  int many_;
  int current_;
  bool probing_ = false;
  bool trial_ = true;             // the first comparison
  int stepsSinceProbe_ = 0;
  int interval_ = kProbeInterval;  // steps from one probe to the next
  std::vector<double> recent_;    // the current count's last kTrialSteps times
  std::vector<double> probe_;     // the other count's times in this probe
};

}  // namespace kiln
