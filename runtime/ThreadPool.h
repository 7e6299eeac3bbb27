// A small fork-join thread pool: parallelFor splits a range into one
// contiguous slice per thread and waits for all of them. The CPU executor
// uses it to split a kernel's outermost parallel loop; the calling thread
// runs a slice itself, so a pool of one thread is just a call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  /// A pool of `threads` threads in all (the caller counts as one); 0 means
  /// one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Calls `fn(begin, end)` on disjoint slices covering [0, n), in parallel,
  /// and returns when all are done. Not reentrant.
  void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void workerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* task_ = nullptr;
  int64_t extent_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
};

}  // namespace kiln
