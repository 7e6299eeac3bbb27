// The thread policy of ThreadChooser.h.
#include "driver/ThreadChooser.h"

#include <algorithm>
#include <cstdio>

namespace kiln {

ThreadChooser::ThreadChooser(int many) : many_(std::max(1, many)), current_(std::max(1, many)) {}

double ThreadChooser::median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::optional<std::string> ThreadChooser::record(double seconds) {
  if (many_ == 1) return std::nullopt;
  if (!probing_) {
    recent_.push_back(seconds);
    if (recent_.size() > static_cast<size_t>(kTrialSteps)) recent_.erase(recent_.begin());
    ++stepsSinceProbe_;
    if (recent_.size() == static_cast<size_t>(kTrialSteps) && (trial_ || stepsSinceProbe_ >= interval_))
      probing_ = true;
    return std::nullopt;
  }
  probe_.push_back(seconds);
  if (probe_.size() < static_cast<size_t>(kTrialSteps)) return std::nullopt;
  const double mine = median(recent_), theirs = median(probe_);
  // The first comparison picks the faster; later ones switch only on a
  // clear gain.
  const bool wasTrial = trial_;
  const bool switchTo = theirs < (wasTrial ? 1.0 : 1.0 - kSwitchMargin) * mine;
  probing_ = false;
  trial_ = false;
  stepsSinceProbe_ = 0;
  std::optional<std::string> note;
  interval_ = switchTo || wasTrial ? kProbeInterval : std::min(2 * interval_, kMaxProbeInterval);
  if (switchTo) {
    const int from = current_;
    current_ = other();
    recent_ = probe_;
    char text[256];
    std::snprintf(text, sizeof text,
                  "steps run faster on %d thread%s than on %d now (median %.3g ms against %.3g ms%s); using %d "
                  "until that changes",
                  current_, current_ == 1 ? "" : "s", from, theirs * 1e3, mine * 1e3,
                  current_ == 1 ? ": other programs keep the cores busy" : "", current_);
    note = text;
  }
  probe_.clear();
  return note;
}

}  // namespace kiln
