// driver/ThreadChooser: the trial picks the count with the faster steps,
// later probes switch only on a clear gain, and one thread is never probed
// against itself.
#include "driver/ThreadChooser.h"

#include <gtest/gtest.h>

#include <vector>

namespace kiln {
namespace {

/// Runs `steps` steps whose time on one thread is `one` and on several
/// `many`; returns the counts used.
std::vector<int> run(ThreadChooser& c, int steps, double one, double many, int* notes = nullptr) {
  std::vector<int> used;
  for (int i = 0; i < steps; ++i) {
    used.push_back(c.next());
    if (c.record(used.back() == 1 ? one : many) && notes) ++*notes;
  }
  return used;
}

TEST(ThreadChooserTest, TrialKeepsManyThreadsWhenTheyAreFaster) {
  ThreadChooser c(2);
  int notes = 0;
  std::vector<int> used = run(c, 500, 2.0, 1.0, &notes);
  // Three steps on 2 threads, three on 1, then 2 again.
  EXPECT_EQ(std::vector<int>(used.begin(), used.begin() + 7), (std::vector<int>{2, 2, 2, 1, 1, 1, 2}));
  EXPECT_EQ(c.current(), 2);
  EXPECT_EQ(notes, 0);
  // Probes of one thread: after 200 steps, then 400 more (each lost probe
  // doubles the interval).
  int onOne = 0;
  for (int n : used) onOne += n == 1;
  EXPECT_EQ(onOne, 3 + 3);
  std::vector<int> later = run(c, 700, 2.0, 1.0);
  onOne = 0;
  for (int n : later) onOne += n == 1;
  EXPECT_EQ(onOne, 3);
}

TEST(ThreadChooserTest, SwitchesToOneThreadOnABusyMachineAndBack) {
  ThreadChooser c(2);
  int notes = 0;
  run(c, 10, 0.067, 0.400, &notes);
  EXPECT_EQ(c.current(), 1);
  EXPECT_EQ(notes, 1);
  // The machine quiets down: the next probe of 2 threads wins back.
  run(c, 210, 0.067, 0.030, &notes);
  EXPECT_EQ(c.current(), 2);
  EXPECT_EQ(notes, 2);
}

TEST(ThreadChooserTest, LaterProbesNeedAClearGain) {
  ThreadChooser c(4);
  run(c, 6, 1.0, 0.9);  // trial: 4 threads faster
  EXPECT_EQ(c.current(), 4);
  run(c, 300, 0.85, 0.9);  // one thread 6% faster: within the margin
  EXPECT_EQ(c.current(), 4);
  run(c, 500, 0.6, 0.9);  // 33% faster: switch at the next probe (400 steps on)
  EXPECT_EQ(c.current(), 1);
}

TEST(ThreadChooserTest, OneThreadNeverProbes) {
  ThreadChooser c(1);
  std::vector<int> used = run(c, 50, 1.0, 0.1);
  EXPECT_EQ(used, std::vector<int>(50, 1));
}

}  // namespace
}  // namespace kiln
