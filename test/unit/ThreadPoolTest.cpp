// The CPU runtime's thread pool (runtime/ThreadPool.h): every index once,
// a call that completes while a worker is held back (as the OS holds back a
// thread when other programs have every core), the chunks a held-back
// worker would have run taken by the caller, a worker that wakes late
// taking nothing of a later call, and the calls that stay on the caller.
#include "runtime/ThreadPool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace kiln {
namespace {

/// A gate a worker waits at in ThreadPoolOptions::onWake while closed.
struct Gate {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = true;
  std::atomic<int> held{0};  // workers waiting at it now

  void close() {
    std::lock_guard<std::mutex> lock(mutex);
    open = false;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    opened.notify_all();
  }
  void pass() {
    std::unique_lock<std::mutex> lock(mutex);
    ++held;
    opened.wait(lock, [&] { return open; });
    --held;
  }
};

/// Counts, per index, how often fn saw it; and which threads ran chunks.
struct Coverage {
  explicit Coverage(int64_t n) : hits(static_cast<size_t>(n)) {}
  std::vector<std::atomic<int>> hits;
  std::mutex mutex;
  std::set<std::thread::id> threads;

  std::function<void(int64_t, int64_t)> fn() {
    return [this](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
    };
  }
  bool once() const {
    for (const auto& h : hits)
      if (h.load() != 1) return false;
    return true;
  }
};

ThreadPoolOptions options(int threads, std::function<void(int)> onWake = {}) {
  ThreadPoolOptions o;
  o.threads = threads;
  o.onWake = std::move(onWake);
  return o;
}

TEST(ThreadPoolTest, CoversTheRangeOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 4, 7, 16, 1000}) {
      Coverage c(n);
      pool.parallelFor(n, c.fn());
      EXPECT_TRUE(c.once()) << threads << " threads, n = " << n;
    }
  }
}

TEST(ThreadPoolTest, ChunksAreAFewPerThreadAndNeverMoreThanTheRange) {
  ThreadPoolOptions o = options(2);
  o.chunksPerThread = 4;
  ThreadPool pool(o);
  EXPECT_EQ(pool.chunksFor(1000), 8);
  EXPECT_EQ(pool.chunksFor(5), 5);
  EXPECT_EQ(pool.chunksFor(1), 1);
}

/// The caller does not wait for a worker that has not started: with the
/// only worker held back (blocked before it takes a chunk, as a thread the
/// OS has not scheduled), the call returns, every index covered once by
/// the calling thread, which took the held worker's chunks.
TEST(ThreadPoolTest, CompletesWhileAWorkerIsHeldBackAndTheCallerTakesItsChunks) {
  Gate gate;
  gate.close();
  ThreadPool pool(options(2, [&](int) { gate.pass(); }));
  Coverage c(1000);
  pool.parallelFor(1000, c.fn());
  EXPECT_TRUE(c.once());
  EXPECT_EQ(c.threads, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(pool.workerChunks(), 0u);
  // The held worker comes back late: it must take nothing of the calls that
  // run meanwhile or after (each index still once), and then help again.
  for (int call = 0; call < 3; ++call) {
    Coverage again(1000);
    pool.parallelFor(1000, again.fn());
    EXPECT_TRUE(again.once()) << "call " << call;
  }
  gate.release();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pool.workerChunks() == 0 && std::chrono::steady_clock::now() < until) {
    Coverage more(1 << 16);
    pool.parallelFor(1 << 16, [&](int64_t b, int64_t e) {
      more.fn()(b, e);
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // time for the worker to arrive
    });
    EXPECT_TRUE(more.once());
  }
  EXPECT_GT(pool.workerChunks(), 0u) << "the released worker never took a chunk";
}

/// With one of three workers held back, the others and the caller share
/// its chunks out, and the call completes.
TEST(ThreadPoolTest, RunningWorkersTakeTheChunksOfAHeldOne) {
  Gate gate;
  gate.close();
  ThreadPool pool(options(4, [&](int worker) {
    if (worker == 3) gate.pass();
  }));
  Coverage c(4000);
  pool.parallelFor(4000, [&](int64_t b, int64_t e) {
    c.fn()(b, e);
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  });
  EXPECT_TRUE(c.once());
  gate.release();
}

/// A call of one chunk, or made while another thread's call holds the
/// pool, runs on the calling thread alone.
TEST(ThreadPoolTest, SmallAndConcurrentCallsRunOnTheCaller) {
  ThreadPool pool(2);
  Coverage one(1);
  pool.parallelFor(1, one.fn());
  EXPECT_TRUE(one.once());
  EXPECT_EQ(one.threads, std::set<std::thread::id>{std::this_thread::get_id()});

  std::atomic<bool> inside{false}, done{false};
  std::thread other([&] {
    pool.parallelFor(2, [&](int64_t, int64_t) {
      inside = true;
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  });
  while (!inside) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Coverage c(100);
  pool.parallelFor(100, c.fn());
  EXPECT_TRUE(c.once());
  EXPECT_EQ(c.threads, std::set<std::thread::id>{std::this_thread::get_id()});
  done = true;
  other.join();
}

/// A parked pool's workers sleep and still wake for the next call; many
/// calls in a row with and without parking cover their ranges.
TEST(ThreadPoolTest, ParkedWorkersWakeForTheNextCall) {
  ThreadPoolOptions o = options(2);
  o.spin = std::chrono::microseconds(0);
  ThreadPool pool(o);
  for (int call = 0; call < 200; ++call) {
    if (call % 2) pool.park();
    if (call % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    Coverage c(64);
    pool.parallelFor(64, c.fn());
    ASSERT_TRUE(c.once()) << "call " << call;
  }
}

TEST(ThreadPoolTest, SharedPoolsAreOnePerThreadCount) {
  ThreadPool& a = ThreadPool::shared(2);
  EXPECT_EQ(&a, &ThreadPool::shared(2));
  EXPECT_EQ(a.size(), 2);
  EXPECT_EQ(ThreadPool::shared(3).size(), 3);
}

}  // namespace
}  // namespace kiln
