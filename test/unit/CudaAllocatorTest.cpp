// The caching allocator of device memory and the pinned host pool
// (runtime/cuda/CudaAllocator.h), against a fake device memory (a capacity,
// counted calls, failures on demand) and fake events that complete only
// when the test says so; and once on the emulated GPU's driver, through
// the real driverDeviceMemory, driverStreamEvents and driverPinnedHostMemory.
#include "runtime/cuda/CudaAllocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "test/unit/EmulatedGpu.h"

namespace kiln::cuda {
namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;
const std::string kDevice = "cuda:0 (NVIDIA H100 80GB HBM3)";

CUstream stream(uintptr_t id) { return reinterpret_cast<CUstream>(id); }

/// Device memory with a capacity: addresses are handed out upwards and never
/// reused, so a repeated address can only come from the cache.
class FakeDeviceMemory : public DeviceMemory {
 public:
  explicit FakeDeviceMemory(size_t capacity) : capacity_(capacity) {}

  Expected<std::optional<CUdeviceptr>> allocate(size_t bytes) override {
    allocateCalls++;
    if (!failure.empty()) return Error(failure);
    if (usedElsewhere + used() + bytes > capacity_) return std::optional<CUdeviceptr>();
    const CUdeviceptr ptr = next_;
    next_ += bytes;
    live[ptr] = bytes;
    allocatedSizes.push_back(bytes);
    return std::optional<CUdeviceptr>(ptr);
  }
  void release(CUdeviceptr ptr) override {
    EXPECT_EQ(live.count(ptr), 1u) << "release of " << ptr << ", which is not allocated";
    live.erase(ptr);
    releaseCalls++;
  }
  size_t freeBytes() const override { return capacity_ - usedElsewhere - used(); }
  size_t totalBytes() const override { return capacity_; }

  size_t used() const {
    size_t sum = 0;
    for (const auto& [ptr, bytes] : live) sum += bytes;
    return sum;
  }

  std::map<CUdeviceptr, size_t> live;
  std::vector<size_t> allocatedSizes;  // of the successful calls, in order
  int allocateCalls = 0;
  int releaseCalls = 0;
  size_t usedElsewhere = 0;  // by other processes
  std::string failure;       // when set, allocate fails with this message

 private:
  size_t capacity_;
  CUdeviceptr next_ = CUdeviceptr{1} << 40;
};

/// Events that complete when the test calls complete() (or synchronize()
/// waits for them).
class FakeEvents : public StreamEvents {
 public:
  Expected<CUevent> record(CUstream stream) override {
    if (failRecord) return Error("cuEventRecord failed: CUDA_ERROR_LAUNCH_FAILED");
    CUevent event = reinterpret_cast<CUevent>(++lastId_);
    events[event] = false;
    recordedOn.push_back(stream);
    return event;
  }
  bool completed(CUevent event) override {
    EXPECT_EQ(events.count(event), 1u);
    return events[event];
  }
  Status synchronize(CUevent event) override {
    synchronized++;
    events[event] = true;
    return Status::success();
  }
  void destroy(CUevent event) override {
    EXPECT_EQ(events.count(event), 1u);
    events.erase(event);
  }
  void completeAll() {
    for (auto& [event, done] : events) done = true;
  }

  std::map<CUevent, bool> events;  // live events and whether they completed
  std::vector<CUstream> recordedOn;
  int synchronized = 0;
  bool failRecord = false;

 private:
  uintptr_t lastId_ = 0;
};

/// Pinned host memory from malloc, counted.
class FakePinnedMemory : public PinnedHostMemory {
 public:
  Expected<void*> allocate(size_t bytes) override {
    allocateCalls++;
    if (held + bytes > capacity) return Error("cuMemHostAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
    held += bytes;
    void* data = std::malloc(bytes);
    sizes[data] = bytes;
    return data;
  }
  void release(void* data) override {
    ASSERT_EQ(sizes.count(data), 1u);
    held -= sizes[data];
    sizes.erase(data);
    std::free(data);
  }

  std::map<void*, size_t> sizes;
  size_t held = 0;
  size_t capacity = 1 << 30;
  int allocateCalls = 0;
};

TEST(CudaAllocatorTest, RoundingAndSizeClasses) {
  EXPECT_EQ(segmentSizeFor(512), 2 * MiB);
  EXPECT_EQ(segmentSizeFor(1 * MiB), 2 * MiB);
  EXPECT_EQ(segmentSizeFor(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(segmentSizeFor(10 * MiB), 20 * MiB);
  EXPECT_EQ(segmentSizeFor(10 * MiB + 512), 12 * MiB);

  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  // A large request first: the small ones after it do not come from the
  // rest of its segment, which belongs to the large pool.
  auto medium = allocator.allocate(3 * MiB + 1, stream(1));
  ASSERT_TRUE(medium) << medium.error().message();
  EXPECT_EQ(allocator.blockSize(*medium), 3 * MiB + 512);
  auto a = allocator.allocate(1, stream(1));
  auto b = allocator.allocate(1000, stream(1));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(allocator.blockSize(*a), 512u);
  EXPECT_EQ(allocator.blockSize(*b), 1024u);
  EXPECT_EQ(*b, *a + 512) << "two small blocks are cut from one segment";
  // Large requests share the rest of a large segment when it is big enough ...
  auto rest = allocator.allocate(11 * MiB, stream(1));
  ASSERT_TRUE(rest);
  EXPECT_EQ(*rest, *medium + 3 * MiB + 512);
  // ... and otherwise get a segment of their size rounded to 2 MiB.
  auto large = allocator.allocate(21 * MiB + 1, stream(1));
  ASSERT_TRUE(large);
  // The 1 MiB - 512 left is not split off: the large pool keeps no pieces of 1 MiB or less.
  EXPECT_EQ(allocator.blockSize(*large), 22 * MiB);
  EXPECT_EQ(memory.allocatedSizes, (std::vector<size_t>{20 * MiB, 2 * MiB, 22 * MiB}));
  EXPECT_EQ(allocator.stats().reserved, int64_t(44 * MiB));
  EXPECT_EQ(allocator.stats().allocated, int64_t(3 * MiB + 512 + 512 + 1024 + 11 * MiB + 22 * MiB));
  // allocate(0) gives the null address and counts nothing.
  auto none = allocator.allocate(0, stream(1));
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, 0u);
  EXPECT_EQ(allocator.stats().numAllocs, 5);
  EXPECT_TRUE(allocator.free(0).ok());
}

TEST(CudaAllocatorTest, SameStreamReuseIsACacheHit) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto a = allocator.allocate(4096, stream(1));
  ASSERT_TRUE(a);
  ASSERT_TRUE(allocator.free(*a).ok());
  EXPECT_TRUE(events.recordedOn.empty()) << "a block only its own stream used needs no event";
  auto again = allocator.allocate(4000, stream(1));
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *a);
  EXPECT_EQ(memory.allocateCalls, 1);
  EXPECT_EQ(allocator.stats().cacheHits, 1);
  // Another stream does not take the first stream's cached memory.
  auto other = allocator.allocate(4096, stream(2));
  ASSERT_TRUE(other);
  EXPECT_EQ(memory.allocateCalls, 2);
  EXPECT_EQ(allocator.stats().driverAllocs, 2);
}

TEST(CudaAllocatorTest, CrossStreamReuseWaitsForTheEvent) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto a = allocator.allocate(1 * MiB, stream(1));
  ASSERT_TRUE(a);
  allocator.recordStream(*a, stream(2));
  allocator.recordStream(*a, stream(2));  // noted once
  allocator.recordStream(*a, stream(1));  // its own stream: nothing to note
  ASSERT_TRUE(allocator.free(*a).ok());
  ASSERT_EQ(events.recordedOn, std::vector<CUstream>{stream(2)});
  EXPECT_EQ(allocator.stats().allocated, 0);

  // Stream 2 may still be reading the block: stream 1 gets the rest of the segment.
  auto b = allocator.allocate(1 * MiB, stream(1));
  ASSERT_TRUE(b);
  EXPECT_EQ(*b, *a + 1 * MiB);
  // Still pending: a third request needs a new segment.
  auto c = allocator.allocate(1 * MiB, stream(1));
  ASSERT_TRUE(c);
  EXPECT_EQ(memory.allocateCalls, 2);
  EXPECT_NE(*c, *a);

  events.completeAll();
  auto d = allocator.allocate(1 * MiB, stream(1));
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, *a) << "reused once the event completed";
  EXPECT_EQ(memory.allocateCalls, 2);
  EXPECT_TRUE(events.events.empty()) << "the completed event was destroyed";
}

TEST(CudaAllocatorTest, FreedNeighboursCoalesce) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto a = allocator.allocate(512 * KiB, stream(1));
  auto b = allocator.allocate(512 * KiB, stream(1));
  auto c = allocator.allocate(512 * KiB, stream(1));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*b, *a + 512 * KiB);
  EXPECT_EQ(*c, *b + 512 * KiB);
  ASSERT_TRUE(allocator.free(*a).ok());
  ASSERT_TRUE(allocator.free(*c).ok());
  // c merged with the free last quarter: 1 MiB at c, where a's 512 KiB is too small.
  auto merged = allocator.allocate(1 * MiB, stream(1));
  ASSERT_TRUE(merged);
  EXPECT_EQ(*merged, *c);
  ASSERT_TRUE(allocator.free(*merged).ok());
  ASSERT_TRUE(allocator.free(*b).ok());
  // All three merged back into the whole segment, which emptyCache returns.
  EXPECT_EQ(memory.allocateCalls, 1);
  allocator.emptyCache();
  EXPECT_TRUE(memory.live.empty());
  EXPECT_EQ(allocator.stats().segments, 0);
  EXPECT_EQ(allocator.stats().driverFrees, 1);
}

TEST(CudaAllocatorTest, OutOfMemoryRetriesAfterFreeingTheCache) {
  FakeDeviceMemory memory(20 * MiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto large = allocator.allocate(2 * MiB, stream(1));
  ASSERT_TRUE(large);
  ASSERT_TRUE(allocator.free(*large).ok());
  // The cached 20 MiB segment fills the device; a small request needs a new
  // 2 MiB segment, which the driver grants once the cache is given back.
  auto small = allocator.allocate(4096, stream(1));
  ASSERT_TRUE(small) << small.error().message();
  EXPECT_EQ(memory.allocateCalls, 3);
  EXPECT_EQ(memory.allocatedSizes, (std::vector<size_t>{20 * MiB, 2 * MiB}));
  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.reserved, int64_t(2 * MiB));
  EXPECT_EQ(stats.driverAllocs, 2);
  EXPECT_EQ(stats.driverFrees, 1);
  EXPECT_EQ(stats.ooms, 0);
}

TEST(CudaAllocatorTest, OutOfMemoryWaitsForPendingFrees) {
  FakeDeviceMemory memory(20 * MiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto a = allocator.allocate(16 * MiB, stream(1));
  ASSERT_TRUE(a);
  allocator.recordStream(*a, stream(2));
  ASSERT_TRUE(allocator.free(*a).ok());
  // The device is full and the only free block waits for stream 2: the
  // allocator waits for that event rather than fail.
  auto b = allocator.allocate(16 * MiB, stream(1));
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(events.synchronized, 1);
  EXPECT_EQ(allocator.stats().cacheHits, 1);
}

TEST(CudaAllocatorTest, OutOfMemoryErrorSaysWhatWasAskedAndWhatIsFree) {
  FakeDeviceMemory memory(85520809984u);  // an H100's 79.65 GiB
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  // 3.5 GiB reserved in one segment, of which 3 GiB is allocated: the free
  // rest is not a whole segment, so the retry cannot give it back.
  auto first = allocator.allocate(3 * GiB + GiB / 2, stream(1));
  ASSERT_TRUE(first);
  ASSERT_TRUE(allocator.free(*first).ok());
  auto held = allocator.allocate(3 * GiB, stream(1));
  ASSERT_TRUE(held);
  memory.usedElsewhere = memory.totalBytes() - memory.used() - (3 * GiB / 2);

  auto failed = allocator.allocate(2 * GiB, stream(1));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message(),
            "CUDA out of memory: tried to allocate 2.00 GiB on cuda:0 (NVIDIA H100 80GB HBM3); 1.50 GiB free of "
            "79.65 GiB, 3.00 GiB allocated by Kiln, 3.50 GiB reserved by Kiln");
  EXPECT_EQ(memory.allocateCalls, 3) << "one segment, then the request and its retry";
  EXPECT_EQ(allocator.stats().ooms, 1);
  auto absurd = allocator.allocate(~size_t{0}, stream(1));
  ASSERT_FALSE(absurd);
  EXPECT_EQ(absurd.error().message().rfind("CUDA out of memory: tried to allocate 17179869184.00 GiB on ", 0), 0u)
      << absurd.error().message();
  EXPECT_EQ(allocator.stats().ooms, 2);
  EXPECT_EQ(allocator.stats().numAllocs, 2);
}

TEST(CudaAllocatorTest, OtherDriverErrorsAreNotRetried) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  memory.failure = "cuMemAlloc of 2097152 bytes failed: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access)";
  auto failed = allocator.allocate(100, stream(1));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message(),
            "CUDA allocation of 2.00 MiB on cuda:0 (NVIDIA H100 80GB HBM3) failed: cuMemAlloc of 2097152 bytes "
            "failed: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access)");
  EXPECT_EQ(memory.allocateCalls, 1);
  EXPECT_EQ(allocator.stats().ooms, 0);
}

TEST(CudaAllocatorTest, LimitCapsReservedMemory) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  EXPECT_FALSE(allocator.limit().has_value());
  allocator.setLimit(4 * MiB);
  EXPECT_EQ(allocator.limit(), std::optional<size_t>(4 * MiB));
  auto small = allocator.allocate(1 * MiB, stream(1));
  ASSERT_TRUE(small);
  auto over = allocator.allocate(3 * MiB, stream(1));  // needs a 20 MiB segment
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().message(),
            "CUDA out of memory: tried to allocate 3.00 MiB on cuda:0 (NVIDIA H100 80GB HBM3); the memory limit is "
            "4.00 MiB, 1.00 MiB allocated by Kiln, 2.00 MiB reserved by Kiln");
  EXPECT_EQ(memory.allocateCalls, 1) << "the driver is not asked past the limit";
  EXPECT_EQ(allocator.stats().ooms, 1);

  // Reaching the limit gives back cached segments first.
  ASSERT_TRUE(allocator.free(*small).ok());
  allocator.setLimit(20 * MiB);
  auto fits = allocator.allocate(3 * MiB, stream(1));
  ASSERT_TRUE(fits) << fits.error().message();
  EXPECT_EQ(allocator.stats().reserved, int64_t(20 * MiB));
  EXPECT_EQ(allocator.stats().driverFrees, 1);

  allocator.setLimit(std::nullopt);
  EXPECT_TRUE(allocator.allocate(100 * MiB, stream(1)).ok());
}

TEST(CudaAllocatorTest, StatsAfterAScriptedSequence) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto a = allocator.allocate(1000, stream(1));     // 1 KiB from a new 2 MiB segment
  auto b = allocator.allocate(3 * MiB, stream(1));  // from a new 20 MiB segment
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(allocator.free(*a).ok());
  auto c = allocator.allocate(1024, stream(1));      // a's block again
  auto d = allocator.allocate(18 * MiB, stream(1));  // more than b's segment has left: an 18 MiB segment
  ASSERT_TRUE(c && d);
  EXPECT_EQ(*c, *a);
  ASSERT_TRUE(allocator.free(*d).ok());
  ASSERT_TRUE(allocator.free(*b).ok());

  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.allocated, 1024);
  EXPECT_EQ(stats.reserved, int64_t(40 * MiB));
  EXPECT_EQ(stats.maxAllocated, int64_t(1024 + 3 * MiB + 18 * MiB));
  EXPECT_EQ(stats.maxReserved, int64_t(40 * MiB));
  EXPECT_EQ(stats.allocations, 1);
  EXPECT_EQ(stats.segments, 3);
  EXPECT_EQ(stats.numAllocs, 4);
  EXPECT_EQ(stats.numFrees, 3);
  EXPECT_EQ(stats.cacheHits, 1);
  EXPECT_EQ(stats.driverAllocs, 3);
  EXPECT_EQ(stats.driverFrees, 0);
  EXPECT_EQ(stats.ooms, 0);
  EXPECT_EQ(stats.format(kDevice),
            "CUDA memory of cuda:0 (NVIDIA H100 80GB HBM3)\n"
            "                      current         peak\n"
            "  allocated          1.00 KiB    21.00 MiB\n"
            "  reserved          40.00 MiB    40.00 MiB\n"
            "  live blocks               1 in 3 segments\n"
            "  allocations               4 (1 cache hits, 3 driver allocations)\n"
            "  frees                     3 (0 driver frees)\n"
            "  out of memory             0\n");

  allocator.resetPeakStats();
  EXPECT_EQ(allocator.stats().maxAllocated, 1024);
  EXPECT_EQ(allocator.stats().maxReserved, int64_t(40 * MiB));
  allocator.emptyCache();
  stats = allocator.stats();
  EXPECT_EQ(stats.reserved, int64_t(2 * MiB));
  EXPECT_EQ(stats.segments, 1);
  EXPECT_EQ(stats.driverFrees, 2);
  EXPECT_EQ(stats.maxReserved, int64_t(40 * MiB));
  EXPECT_EQ(memory.live.size(), 1u);
}

TEST(CudaAllocatorTest, EmptyCacheReturnsOnlyUnusedSegments) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  {
    CachingAllocator allocator(memory, events, kDevice);
    auto kept = allocator.allocate(4096, stream(1));
    auto dropped = allocator.allocate(4 * MiB, stream(1));
    auto waiting = allocator.allocate(12 * MiB, stream(1));
    ASSERT_TRUE(kept && dropped && waiting);
    ASSERT_TRUE(allocator.free(*dropped).ok());
    allocator.recordStream(*waiting, stream(2));
    ASSERT_TRUE(allocator.free(*waiting).ok());
    // The pending free is waited for, and both free segments go back.
    allocator.emptyCache();
    EXPECT_EQ(events.synchronized, 1);
    EXPECT_TRUE(events.events.empty());
    EXPECT_EQ(memory.live.size(), 1u);
    EXPECT_EQ(memory.live.begin()->second, 2 * MiB);
    EXPECT_EQ(allocator.stats().reserved, int64_t(2 * MiB));
    EXPECT_EQ(allocator.stats().allocated, 4096);
  }
  EXPECT_TRUE(memory.live.empty()) << "the allocator gives back every segment when destroyed";
}

TEST(CudaAllocatorTest, FreeingWhatIsNotLiveIsAnError) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto a = allocator.allocate(4096, stream(1));
  ASSERT_TRUE(a);
  Status unknown = allocator.free(*a + 512);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().message(),
            "cannot free device address 0x10000000200: it is not a live allocation of "
            "cuda:0 (NVIDIA H100 80GB HBM3)");
  ASSERT_TRUE(allocator.free(*a).ok());
  EXPECT_FALSE(allocator.free(*a).ok()) << "a second free";
  EXPECT_EQ(allocator.stats().numFrees, 1);

  // An event that cannot be recorded leaves the block allocated.
  auto b = allocator.allocate(4096, stream(1));
  ASSERT_TRUE(b);
  allocator.recordStream(*b, stream(2));
  events.failRecord = true;
  Status failed = allocator.free(*b);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message().find("CUDA_ERROR_LAUNCH_FAILED"), std::string::npos);
  EXPECT_EQ(allocator.blockSize(*b), 4096u);
  EXPECT_EQ(allocator.stats().allocations, 1);
  events.failRecord = false;
  EXPECT_TRUE(allocator.free(*b).ok());
}

TEST(CudaAllocatorTest, ThreadsShareOneAllocator) {
  FakeDeviceMemory memory(80 * GiB);
  FakeEvents events;
  CachingAllocator allocator(memory, events, kDevice);
  auto work = [&](uintptr_t id) {
    for (int i = 0; i < 500; ++i) {
      auto ptr = allocator.allocate(512 * (1 + i % 7), stream(id));
      ASSERT_TRUE(ptr);
      ASSERT_TRUE(allocator.free(*ptr).ok());
    }
  };
  std::thread first(work, 1), second(work, 2);
  first.join();
  second.join();
  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.allocated, 0);
  EXPECT_EQ(stats.numAllocs, 1000);
  EXPECT_EQ(stats.numFrees, 1000);
  EXPECT_EQ(stats.driverAllocs, 2) << "one small segment per stream";
  EXPECT_EQ(stats.cacheHits, 998);
}

TEST(CudaAllocatorTest, PinnedPoolReusesBySizeClass) {
  FakePinnedMemory memory;
  FakeEvents events;
  PinnedHostPool pool(memory, events);
  auto a = pool.acquire(1000);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->size, 4096u);
  auto big = pool.acquire(5000);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->size, 8192u);
  pool.release(a->data);
  auto again = pool.acquire(4096);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->data, a->data);
  EXPECT_EQ(memory.allocateCalls, 2);
  PinnedMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.reserved, 12288);
  EXPECT_EQ(stats.inUse, 12288);
  EXPECT_EQ(stats.hostAllocs, 2);
  EXPECT_EQ(stats.cacheHits, 1);
  EXPECT_EQ(stats.format(),
            "pinned host memory: 12.00 KiB reserved (peak 12.00 KiB), 12.00 KiB in use, 2 host allocations, 1 cache "
            "hits\n");
}

TEST(CudaAllocatorTest, PinnedBufferWaitsForItsCopy) {
  FakePinnedMemory memory;
  FakeEvents events;
  PinnedHostPool pool(memory, events);
  auto staging = pool.acquire(64 * KiB);
  ASSERT_TRUE(staging);
  ASSERT_TRUE(pool.releaseAfter(staging->data, stream(3)).ok());
  ASSERT_EQ(events.recordedOn, std::vector<CUstream>{stream(3)});
  EXPECT_EQ(pool.stats().inUse, int64_t(64 * KiB)) << "a pending copy still reads it";

  auto second = pool.acquire(64 * KiB);
  ASSERT_TRUE(second);
  EXPECT_NE(second->data, staging->data) << "not handed out while the copy may be reading it";
  events.completeAll();
  pool.release(second->data);
  auto third = pool.acquire(64 * KiB);
  auto fourth = pool.acquire(64 * KiB);
  ASSERT_TRUE(third && fourth);
  EXPECT_EQ(memory.allocateCalls, 2);
  EXPECT_TRUE(events.events.empty());
  EXPECT_EQ(pool.stats().inUse, int64_t(128 * KiB));
  pool.release(third->data);
  pool.release(fourth->data);
  pool.emptyCache();
  EXPECT_TRUE(memory.sizes.empty());
  EXPECT_EQ(pool.stats().reserved, 0);
  EXPECT_EQ(pool.stats().maxReserved, int64_t(128 * KiB));
  EXPECT_EQ(pool.stats().hostFrees, 2);
}

TEST(CudaAllocatorTest, PinnedPoolFreesIdleBuffersWhenTheDriverFails) {
  FakePinnedMemory memory;
  memory.capacity = 16 * KiB;
  FakeEvents events;
  PinnedHostPool pool(memory, events);
  auto small = pool.acquire(8 * KiB);
  ASSERT_TRUE(small);
  pool.release(small->data);
  auto large = pool.acquire(16 * KiB);  // fits once the idle 8 KiB buffer is freed
  ASSERT_TRUE(large) << large.error().message();
  EXPECT_EQ(pool.stats().reserved, int64_t(16 * KiB));
  auto failed = pool.acquire(4 * KiB);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message(),
            "cannot allocate 4.00 KiB of pinned host memory (16.00 KiB already held by Kiln): cuMemHostAlloc failed: "
            "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
}

// The real driver entry points, on Kiln's emulated GPU.
TEST(CudaAllocatorTest, EmulatedGpu) {
  KILN_REQUIRE_EMULATOR();
  const LibrarySearchOptions options = test::emulatorOptions();
  auto driver = loadCudaDriver(options);
  ASSERT_TRUE(driver) << driver.error().message();
  auto exec = loadCudaExec(options);
  ASSERT_TRUE(exec) << exec.error().message();
  const CudaDriverApi& d = **driver;
  const CudaExecApi& x = **exec;
  ASSERT_EQ(d.cuInit(0), CUDA_SUCCESS);
  CUdevice device = 0;
  ASSERT_EQ(d.cuDeviceGet(&device, 0), CUDA_SUCCESS);
  CUcontext context = nullptr;
  ASSERT_EQ(d.cuDevicePrimaryCtxRetain(&context, device), CUDA_SUCCESS);
  ASSERT_EQ(d.cuCtxSetCurrent(context), CUDA_SUCCESS);
  CUstream first = nullptr, second = nullptr;
  ASSERT_EQ(x.cuStreamCreate(&first, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(x.cuStreamCreate(&second, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

  auto memory = driverDeviceMemory(d, x);
  auto events = driverStreamEvents(d, x);
  ASSERT_TRUE(events) << events.error().message();
  auto pinnedMemory = driverPinnedHostMemory(d, x);
  EXPECT_GT(memory->totalBytes(), 0u);
  {
    CachingAllocator allocator(*memory, **events, "cuda:0 (emulated)");
    PinnedHostPool pinned(*pinnedMemory, **events);
    auto a = allocator.allocate(1000, first);
    auto b = allocator.allocate(5000, first);
    ASSERT_TRUE(a) << a.error().message();
    ASSERT_TRUE(b) << b.error().message();
    EXPECT_EQ(*b, *a + 1024);
    EXPECT_LE(memory->freeBytes(), memory->totalBytes() - 2 * MiB);

    // The blocks are real, disjoint device memory: fill both, read back.
    auto staging = pinned.acquire(5000);
    ASSERT_TRUE(staging) << staging.error().message();
    auto* bytes = static_cast<unsigned char*>(staging->data);
    for (int i = 0; i < 5000; ++i) bytes[i] = static_cast<unsigned char>(i % 251);
    ASSERT_EQ(x.cuMemsetD8Async(*a, 0x5a, 1000, first), CUDA_SUCCESS);
    ASSERT_EQ(x.cuMemcpyHtoDAsync(*b, bytes, 5000, first), CUDA_SUCCESS);
    ASSERT_TRUE(pinned.releaseAfter(staging->data, first).ok());
    std::vector<unsigned char> readA(1000), readB(5000);
    ASSERT_EQ(x.cuMemcpyDtoHAsync(readA.data(), *a, 1000, first), CUDA_SUCCESS);
    ASSERT_EQ(x.cuMemcpyDtoHAsync(readB.data(), *b, 5000, first), CUDA_SUCCESS);
    ASSERT_EQ(x.cuStreamSynchronize(first), CUDA_SUCCESS);
    EXPECT_EQ(readA, std::vector<unsigned char>(1000, 0x5a));
    for (int i = 0; i < 5000; ++i) ASSERT_EQ(readB[i], i % 251) << "byte " << i;
    auto reused = pinned.acquire(5000);
    ASSERT_TRUE(reused);
    EXPECT_EQ(reused->data, staging->data) << "the copy has finished, so the buffer is reused";
    pinned.release(reused->data);

    // A block used by the second stream is reused once that stream's work is done.
    allocator.recordStream(*b, second);
    ASSERT_TRUE(allocator.free(*b).ok());
    ASSERT_EQ(x.cuCtxSynchronize(), CUDA_SUCCESS);
    auto c = allocator.allocate(5000, first);
    ASSERT_TRUE(c);
    EXPECT_EQ(*c, *b);

    // More than the device has: the error names what was asked and what is free.
    auto tooMuch = allocator.allocate(memory->totalBytes() + GiB, first);
    ASSERT_FALSE(tooMuch);
    EXPECT_NE(tooMuch.error().message().find("CUDA out of memory: tried to allocate "), std::string::npos)
        << tooMuch.error().message();
    EXPECT_EQ(allocator.stats().ooms, 1);
    EXPECT_EQ(allocator.stats().driverAllocs, 1);
  }
  events->reset();  // its spare events belong to the context
  EXPECT_EQ(x.cuStreamDestroy(first), CUDA_SUCCESS);
  EXPECT_EQ(x.cuStreamDestroy(second), CUDA_SUCCESS);
  EXPECT_EQ(d.cuDevicePrimaryCtxRelease(device), CUDA_SUCCESS);
}

}  // namespace
}  // namespace kiln::cuda
