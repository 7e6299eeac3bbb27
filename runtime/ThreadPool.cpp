// The thread pool of ThreadPool.h. Each parallelFor is one epoch: the
// caller sets every thread's home cursor to (epoch, first home chunk),
// publishes the call and bumps epoch_ (waking sleeping workers), then runs
// chunks itself. Each finished chunk counts remaining_ down; the caller
// returns when it reaches 0, spinning for a while and then sleeping on it.
#include "runtime/ThreadPool.h"

#include <algorithm>

namespace kiln {

namespace {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

/// Spins until `done()` or `budget` has passed; whether `done()` held.
template <typename Done>
bool spinFor(std::chrono::microseconds budget, Done done) {
  if (done()) return true;
  if (budget.count() <= 0) return false;
  const auto until = std::chrono::steady_clock::now() + budget;
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpuRelax();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}

}  // namespace

namespace {
ThreadPoolOptions withThreads(int threads) {
  ThreadPoolOptions options;
  options.threads = threads;
  return options;
}
}  // namespace

ThreadPool::ThreadPool(int threads) : ThreadPool(withThreads(threads)) {}

ThreadPool::ThreadPool(ThreadPoolOptions options) : options_(std::move(options)) {
  int threads = options_.threads;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options_.chunksPerThread = std::max(1, options_.chunksPerThread);
  cursors_ = std::make_unique<Cursor[]>(static_cast<size_t>(threads));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::shared(int threads) {
  static std::mutex mutex;
  static std::vector<std::pair<int, std::unique_ptr<ThreadPool>>> pools;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& [count, pool] : pools)
    if (count == threads) return *pool;
  pools.emplace_back(threads, std::make_unique<ThreadPool>(threads));
  return *pools.back().second;
}

int64_t ThreadPool::chunksFor(int64_t n) const {
  return std::min<int64_t>(n, static_cast<int64_t>(size()) * options_.chunksPerThread);
}

void ThreadPool::workerLoop(int index) {
  uint32_t seen = 0;
  // Whether this worker took a chunk of the last call. One that came too
  // late to take any (the OS ran it late: other programs have the cores)
  // sleeps at once instead of spinning, as spinning would only use up its
  // share of a core; it spins again once it is in time.
  bool inTime = true;
  while (true) {
    const auto woken = [&] { return epoch_.load() != seen || parked_.load(std::memory_order_relaxed); };
    if (!spinFor(inTime ? options_.spin : std::chrono::microseconds(0), woken) || epoch_.load() == seen) {
      // Parked, or nothing within the spin: sleep until the next call.
      for (uint32_t e = seen; e == seen; e = epoch_.load()) epoch_.wait(seen);
    }
    if (stopping_.load()) return;
    seen = epoch_.load();
    if (options_.onWake) options_.onWake(index);
    inTime = runChunks(index, seen) > 0;
  }
}

uint64_t ThreadPool::runChunks(int self, uint32_t epoch) {
  const auto* fn = fn_.load();
  const int64_t n = extent_.load(), chunks = chunks_.load();
  const int threads = size();
  uint64_t ran = 0;
  for (int k = 0; k < threads; ++k) {
    const int home = (self + k) % threads;
    const uint64_t end = static_cast<uint64_t>(homeBegin(home + 1, chunks));
    std::atomic<uint64_t>& cursor = cursors_[static_cast<size_t>(home)].next;
    uint64_t at = cursor.load();
    while (true) {
      // A cursor of another epoch: this call is over (the caller moved the
      // cursors on only after every chunk of it was done).
      if (static_cast<uint32_t>(at >> 32) != epoch) goto done;
      const uint64_t chunk = at & 0xffffffffu;
      if (chunk >= end) break;
      if (!cursor.compare_exchange_weak(at, at + 1)) continue;
      const int64_t c = static_cast<int64_t>(chunk);
      (*fn)(n * c / chunks, n * (c + 1) / chunks);
      ++ran;
      if (remaining_.fetch_sub(1) == 1) remaining_.notify_one();
      at = cursor.load();
    }
  }
done:
  if (self != 0 && ran) workerChunks_.fetch_add(ran, std::memory_order_relaxed);
  return ran;
}

void ThreadPool::parallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  std::unique_lock<std::mutex> caller(caller_, std::try_to_lock);
  const int64_t chunks = chunksFor(n);
  if (workers_.empty() || chunks <= 1 || !caller.owns_lock()) {
    fn(0, n);
    return;
  }
  const uint32_t epoch = epoch_.load() + 1;
  for (int t = 0; t < size(); ++t)
    cursors_[static_cast<size_t>(t)].next.store(static_cast<uint64_t>(epoch) << 32 |
                                                static_cast<uint64_t>(homeBegin(t, chunks)));
  fn_.store(&fn);
  extent_.store(n);
  chunks_.store(chunks);
  remaining_.store(static_cast<uint32_t>(chunks));
  parked_.store(false, std::memory_order_relaxed);
  epoch_.store(epoch);
  epoch_.notify_all();
  runChunks(0, epoch);
  // Only chunks that a worker has started are left: wait for them.
  if (!spinFor(options_.spin, [&] { return remaining_.load() == 0; }))
    for (uint32_t left = remaining_.load(); left != 0; left = remaining_.load()) remaining_.wait(left);
}

}  // namespace kiln
