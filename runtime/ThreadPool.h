// The CPU runtime's fork-join thread pool, built to stay fast when other
// programs keep every core busy. parallelFor cuts [0, n) into a few chunks
// per thread; each thread owns a contiguous run of them (its "home", the
// same on every call, so a thread reads the same data call after call) and,
// when its home is done, takes the chunks of the others that nobody has
// started. The calling thread starts at once and the call returns when every
// chunk is done, so it waits only for a chunk a worker has started, never
// for a worker that the OS has not scheduled yet: the threads that run do
// the work of one that does not. An idle worker spins for a bounded time
// (`ThreadPoolOptions::spin`: kernels follow each other within
// microseconds on a quiet machine; not after a call it came too late to
// help with) and then sleeps on a futex, so it gives
// its core back and, woken, gets one again without waiting out another
// program's time slice (a spinning thread that loses its core is not woken:
// it waits for its turn). park() puts the workers to sleep at once, before
// the caller hands the cores to another pool (oneDNN's OpenMP team).
//
// One caller at a time: a call made while another thread's call is running
// runs on its own calling thread alone. Calls do not nest.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

struct ThreadPoolOptions {
  /// Threads in all, the caller counting as one; 0 means one per hardware
  /// thread.
  int threads = 0;
  /// How long an idle worker, or a caller waiting for a worker's chunk,
  /// spins before it sleeps.
  std::chrono::microseconds spin{50};
  /// Chunks per thread: more let the running threads share out the work of
  /// a descheduled one more evenly; each costs an atomic operation.
  int chunksPerThread = 4;
  /// For tests: called on a worker each time it wakes for a call, before it
  /// takes a chunk (a test blocks a worker here to play a descheduled one).
  std::function<void(int worker)> onWake;
};

class ThreadPool {
 public:
  /// A pool of `threads` threads in all (0: one per hardware thread).
  explicit ThreadPool(int threads = 0);
  explicit ThreadPool(ThreadPoolOptions options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Calls `fn(begin, end)` on disjoint chunks covering [0, n), in parallel
  /// (at most size() * chunksPerThread chunks, contiguous, in order within a
  /// thread's home), and returns when all are done.
  void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  /// The number of chunks parallelFor cuts `n` into.
  int64_t chunksFor(int64_t n) const;

  /// Idle workers stop spinning and sleep until the next call.
  void park() { parked_.store(true, std::memory_order_relaxed); }

  /// Chunks run by workers (not by the caller) since the pool started.
  uint64_t workerChunks() const { return workerChunks_.load(std::memory_order_relaxed); }

  /// The process's pool of `threads` threads (0: one per hardware thread),
  /// created on first use and shared by every runner that asks for that
  /// count: one set of worker threads however many programs are loaded.
  static ThreadPool& shared(int threads);

 private:
  void workerLoop(int index);
  /// Runs the chunks of call `epoch` that thread `self` can claim, its home
  /// first, until none is left or a newer call has started; how many it ran.
  uint64_t runChunks(int self, uint32_t epoch);
  int64_t homeBegin(int thread, int64_t chunks) const { return chunks * thread / size(); }

  ThreadPoolOptions options_;
  std::vector<std::thread> workers_;
  std::mutex caller_;  // held by the call in progress

  // The call in progress. A worker reads epoch_, then the call's fields;
  // it claims chunk i of thread t's home by advancing cursors_[t] from
  // (epoch << 32 | i), so a worker that read an older call's fields (it
  // woke late) cannot claim a chunk of a newer call: the caller sets the
  // cursors to the new epoch before it writes the fields.
  struct alignas(64) Cursor {
    std::atomic<uint64_t> next{0};
  };
  std::unique_ptr<Cursor[]> cursors_;
  std::atomic<const std::function<void(int64_t, int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> extent_{0};
  std::atomic<int64_t> chunks_{0};
  alignas(64) std::atomic<uint32_t> epoch_{0};
  alignas(64) std::atomic<uint32_t> remaining_{0};  // chunks of the call not finished
  std::atomic<bool> parked_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> workerChunks_{0};
};

}  // namespace kiln
