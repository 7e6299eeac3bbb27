// Device and pinned host memory for CUDA execution, in the manner of
// PyTorch's CUDA caching allocator, simplified. cuMemAlloc and cuMemFree
// synchronize the device and cost microseconds to milliseconds, so memory
// taken from the driver is kept: a request is rounded to 512 bytes and cut
// from a segment (small requests, up to 1 MiB, from 2 MiB segments; requests
// up to 10 MiB from 20 MiB segments; larger ones from a segment of their own
// size rounded to 2 MiB). A freed block returns to its segment's free list,
// merged with free neighbours, and the stream it was allocated on may use it
// again at once, since that stream's later work runs after the work that
// used it. A block that other streams used (recordStream) is reused only
// once events recorded on those streams when it was freed have completed.
// When the driver is out of memory (or the limit would be passed), every
// cached free segment is returned to it and the allocation is tried once
// more; a second failure is an error saying how much was asked for, how much
// is free and how much Kiln holds.
//
// The driver is reached through two small interfaces, DeviceMemory and
// StreamEvents, so that tests run the allocator against fakes; the driver's
// implementations are driverDeviceMemory and driverStreamEvents. Their
// calls, like every CUDA call, need the device's context current on the
// calling thread.
//
// PinnedHostPool does the same for page-locked host memory (the staging
// buffers of asynchronous host-to-device copies): a buffer handed to a copy
// is reused only after the event recorded behind that copy has completed,
// so nothing overwrites memory that a pending copy still reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/Support.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::cuda {

/// Device memory as the allocator takes it from the driver.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  /// `bytes` of device memory; std::nullopt when the device is out of memory
  /// (the allocator then frees its cache and tries again); an Error carrying
  /// the driver's message for any other failure.
  virtual Expected<std::optional<CUdeviceptr>> allocate(size_t bytes) = 0;
  virtual void release(CUdeviceptr ptr) = 0;
  /// The device's free memory, as cuMemGetInfo reports it.
  virtual size_t freeBytes() const = 0;
  virtual size_t totalBytes() const = 0;
};

/// cuMemAlloc and cuMemFree of the current context.
std::unique_ptr<DeviceMemory> driverDeviceMemory(const CudaDriverApi& driver, const CudaExecApi& exec);

/// Events recorded on streams: whether work queued so far on a stream has
/// finished.
class StreamEvents {
 public:
  virtual ~StreamEvents() = default;
  /// An event recorded on `stream` now.
  virtual Expected<CUevent> record(CUstream stream) = 0;
  /// Whether the work before the event has finished (never blocks).
  virtual bool completed(CUevent event) = 0;
  /// Blocks until the work before the event has finished.
  virtual Status synchronize(CUevent event) = 0;
  /// Gives back an event from record().
  virtual void destroy(CUevent event) = 0;
};

/// cuEventRecord on events created with CU_EVENT_DISABLE_TIMING, kept for
/// reuse; completed() is cuEventQuery (resolved here, which is why this can
/// fail: a driver without it is named in the error). A query that fails
/// with anything but CUDA_ERROR_NOT_READY counts as completed: the context
/// is then broken and no work will touch the memory again.
Expected<std::unique_ptr<StreamEvents>> driverStreamEvents(const CudaDriverApi& driver, const CudaExecApi& exec);

/// The caching allocator's counters, as torch.cuda.memory_stats names them.
/// Byte counts are of rounded blocks and whole segments.
struct MemoryStats {
  int64_t allocated = 0;     // bytes in live blocks
  int64_t reserved = 0;      // bytes in segments taken from the driver
  int64_t maxAllocated = 0;  // peaks since creation or resetPeakStats()
  int64_t maxReserved = 0;
  int64_t allocations = 0;  // live blocks
  int64_t segments = 0;     // segments held
  int64_t numAllocs = 0;    // successful allocate() calls
  int64_t numFrees = 0;
  int64_t cacheHits = 0;     // allocations served without a driver call
  int64_t driverAllocs = 0;  // segments taken from the driver
  int64_t driverFrees = 0;   // segments given back
  int64_t ooms = 0;          // out-of-memory errors returned

  /// A short table for `--memory-stats`, headed by `device` ("cuda:0 (NVIDIA H100 80GB HBM3)").
  std::string format(const std::string& device) const;
};

/// The allocator's sizes, as PyTorch's CUDACachingAllocator chooses them.
constexpr size_t kBlockRounding = 512;             // every request is rounded up to this
constexpr size_t kSmallRequest = 1 << 20;          // requests up to 1 MiB are small
constexpr size_t kSmallSegment = 2 << 20;          // small requests share 2 MiB segments
constexpr size_t kMediumRequest = 10 << 20;        // requests up to 10 MiB ...
constexpr size_t kMediumSegment = 20 << 20;        // ... share 20 MiB segments
constexpr size_t kLargeSegmentRounding = 2 << 20;  // larger segments are the request rounded to 2 MiB

/// The segment size a request of `bytes` (already rounded) is cut from.
size_t segmentSizeFor(size_t bytes);

/// Device memory for one device, cached across allocations (file comment).
/// Thread-safe: one mutex guards everything.
class CachingAllocator {
 public:
  /// `memory` and `events` must outlive the allocator. `device` names the
  /// device in errors and stats: "cuda:0 (NVIDIA H100 80GB HBM3)".
  CachingAllocator(DeviceMemory& memory, StreamEvents& events, std::string device);
  /// Waits for pending frees and gives every segment back to the driver,
  /// including any still holding live blocks: memory never outlives its
  /// allocator.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// `bytes` (rounded up to 512) for work on `stream`; 0 for 0 bytes. The
  /// error for out of memory or the limit says what was asked and what is
  /// held; any other driver failure carries the driver's message.
  Expected<CUdeviceptr> allocate(size_t bytes, CUstream stream);
  /// Gives a block back. Reusable at once on its own stream, or, when other
  /// streams used it (recordStream), once the events recorded on them now
  /// have completed. Fails, changing nothing, when `ptr` is not a live block
  /// of this allocator or an event cannot be recorded. free(0) does nothing.
  Status free(CUdeviceptr ptr);
  /// Notes that work on `stream` uses the live block at `ptr` (the block's
  /// own stream needs no note). Pointers this allocator did not give out are
  /// ignored, as PyTorch's recordStream ignores memory it does not manage.
  void recordStream(CUdeviceptr ptr, CUstream stream);

  /// Waits for pending frees, then gives every wholly free segment back to
  /// the driver.
  void emptyCache();
  /// Caps reserved memory at `bytes` (std::nullopt: no cap, the default).
  /// An allocation that would pass it fails as out-of-memory does. Memory
  /// already reserved is not taken back: emptyCache() does that.
  void setLimit(std::optional<size_t> bytes);
  std::optional<size_t> limit() const;

  MemoryStats stats() const;
  /// Peaks become the current values.
  void resetPeakStats();
  /// The size of the live block at `ptr` (its rounded size, or larger when
  /// the rest of a free block was too small to split off); 0 if none.
  size_t blockSize(CUdeviceptr ptr) const;

 private:
  struct Block;
  /// Free blocks of one pool ordered by (stream, size, address): the
  /// smallest block that fits on a stream is one lower_bound away.
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeBlocks = std::set<Block*, BlockOrder>;
  struct PendingFree {
    CUevent event;
    Block* block;
  };
  /// Why a new segment could not be had.
  enum class SegmentFailure { None, OutOfMemory, OverLimit };

  FreeBlocks& poolFor(size_t bytes);
  Block* takeFreeBlock(size_t bytes, CUstream stream);
  Expected<Block*> newSegment(size_t segmentBytes, CUstream stream, SegmentFailure& failure);
  void splitBlock(Block* block, size_t bytes);
  void insertFree(Block* block);
  void processEvents(bool wait);
  void releaseFreeSegments();
  void releaseSegment(Block* block);
  Error outOfMemory(size_t requested, SegmentFailure failure);
  void updatePeaks();

  DeviceMemory& memory_;
  StreamEvents& events_;
  std::string device_;
  mutable std::mutex mutex_;
  std::optional<size_t> limit_;
  MemoryStats stats_;
  std::unordered_map<CUdeviceptr, std::unique_ptr<Block>> blocks_;  // every block, by address
  FreeBlocks smallFree_;
  FreeBlocks largeFree_;
  std::vector<PendingFree> pending_;
};

/// Page-locked host memory, as the staging pool takes it from the driver.
class PinnedHostMemory {
 public:
  virtual ~PinnedHostMemory() = default;
  /// `bytes` of pinned host memory, or an Error with the driver's message.
  virtual Expected<void*> allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
};

/// cuMemHostAlloc (CU_MEMHOSTALLOC_PORTABLE) and cuMemFreeHost.
std::unique_ptr<PinnedHostMemory> driverPinnedHostMemory(const CudaDriverApi& driver, const CudaExecApi& exec);

/// The pinned pool's counters.
struct PinnedMemoryStats {
  int64_t reserved = 0;  // bytes of pinned memory held
  int64_t maxReserved = 0;
  int64_t inUse = 0;       // bytes in buffers handed out or with a copy pending
  int64_t hostAllocs = 0;  // buffers taken from the driver
  int64_t hostFrees = 0;
  int64_t cacheHits = 0;  // acquire() calls served from the pool

  /// One line for `--memory-stats`.
  std::string format() const;
};

/// A pinned host buffer of `size` bytes (the size class: at least what was
/// asked for).
struct PinnedBuffer {
  void* data = nullptr;
  size_t size = 0;
};

/// Pinned host buffers reused by size class (powers of two, 4 KiB at least).
/// Thread-safe.
class PinnedHostPool {
 public:
  /// `memory` and `events` must outlive the pool.
  PinnedHostPool(PinnedHostMemory& memory, StreamEvents& events);
  /// Waits for pending copies and frees every buffer.
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  /// A buffer of at least `bytes`. When the driver fails, the idle buffers
  /// are freed and the allocation tried once more.
  Expected<PinnedBuffer> acquire(size_t bytes);
  /// Gives back a buffer no copy is reading: reusable at once.
  void release(void* data);
  /// Gives back a buffer that an asynchronous copy still reads; it is reused
  /// only after `copyDone` (from this pool's StreamEvents, recorded behind
  /// the copy) has completed. The pool destroys the event.
  void release(void* data, CUevent copyDone);
  /// Records the event behind the copies queued on `stream`, then
  /// release(data, event). On failure the buffer is still held by the caller.
  Status releaseAfter(void* data, CUstream stream);
  /// Waits for pending copies, then frees every idle buffer.
  void emptyCache();

  PinnedMemoryStats stats() const;

 private:
  struct Buffer {
    size_t size = 0;
    bool inUse = false;  // handed out, or released with a copy pending
  };
  struct PendingRelease {
    CUevent event;
    void* data;
  };

  void processEvents(bool wait);
  void releaseIdleBuffers();

  PinnedHostMemory& memory_;
  StreamEvents& events_;
  mutable std::mutex mutex_;
  PinnedMemoryStats stats_;
  std::unordered_map<void*, Buffer> buffers_;  // every buffer held
  std::map<size_t, std::vector<void*>> idle_;  // idle buffers by size class
  std::vector<PendingRelease> pending_;
};

}  // namespace kiln::cuda
