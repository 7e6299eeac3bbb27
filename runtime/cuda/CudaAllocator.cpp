// The caching allocator of device memory and the pinned host staging pool
// (CudaAllocator.h), and the driver's implementations of the interfaces
// they take memory and events from.
#include "runtime/cuda/CudaAllocator.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdio>
#include <functional>
#include <limits>

#include "runtime/cuda/CudaDevices.h"

namespace kiln::cuda {

namespace {

constexpr CUresult kCudaErrorNotReady = 600;  // CUDA_ERROR_NOT_READY
constexpr size_t kMinPinnedBuffer = 4096;

size_t roundUp(size_t bytes, size_t multiple) { return (bytes + multiple - 1) / multiple * multiple; }

/// "512 B", "1.50 MiB"; from 1 GiB on, formatBytes ("79.65 GiB"), so that
/// device totals read as `kiln devices` prints them.
std::string formatMemorySize(uint64_t bytes) {
  constexpr double kKiB = 1024.0;
  const double value = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) return formatBytes(bytes);
  char text[32];
  if (bytes < 1024) {
    std::snprintf(text, sizeof(text), "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < (uint64_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%.2f KiB", value / kKiB);
  } else {
    std::snprintf(text, sizeof(text), "%.2f MiB", value / (kKiB * kKiB));
  }
  return text;
}

/// Whether the work before `event` has finished; with `wait`, after waiting
/// for it. An event that cannot be waited for belongs to a broken context,
/// whose streams run nothing more, so it counts as done.
bool eventDone(StreamEvents& events, CUevent event, bool wait) {
  if (!wait) return events.completed(event);
  Status waited = events.synchronize(event);
  (void)waited;
  return true;
}

std::string hexAddress(CUdeviceptr ptr) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", ptr);
  return text;
}

// ---------------------------------------------------------------------------
// The driver's implementations.

class DriverDeviceMemory final : public DeviceMemory {
 public:
  DriverDeviceMemory(const CudaDriverApi& driver, const CudaExecApi& exec) : driver_(driver), exec_(exec) {}

  Expected<std::optional<CUdeviceptr>> allocate(size_t bytes) override {
    CUdeviceptr ptr = 0;
    const CUresult result = exec_.cuMemAlloc(&ptr, bytes);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) return std::optional<CUdeviceptr>();
    if (result != CUDA_SUCCESS) {
      return Error("cuMemAlloc of " + std::to_string(bytes) + " bytes failed: " + driver_.errorString(result));
    }
    return std::optional<CUdeviceptr>(ptr);
  }

  // A failing cuMemFree means the context is already broken (a sticky
  // error), which the next launch or copy reports; there is nothing to undo.
  void release(CUdeviceptr ptr) override { exec_.cuMemFree(ptr); }

  size_t freeBytes() const override { return memoryInfo().first; }
  size_t totalBytes() const override { return memoryInfo().second; }

 private:
  std::pair<size_t, size_t> memoryInfo() const {
    size_t free = 0, total = 0;
    if (driver_.cuMemGetInfo(&free, &total) != CUDA_SUCCESS) return {0, 0};
    return {free, total};
  }

  const CudaDriverApi& driver_;
  const CudaExecApi& exec_;
};

class DriverStreamEvents final : public StreamEvents {
 public:
  using EventQuery = CUresult (*)(CUevent event);

  DriverStreamEvents(const CudaDriverApi& driver, const CudaExecApi& exec, EventQuery query)
      : driver_(driver), exec_(exec), query_(query) {}
  ~DriverStreamEvents() override {
    for (CUevent event : spare_) exec_.cuEventDestroy(event);
  }

  Expected<CUevent> record(CUstream stream) override {
    CUevent event = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!spare_.empty()) {
        event = spare_.back();
        spare_.pop_back();
      }
    }
    if (!event) {
      const CUresult result = exec_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING);
      if (result != CUDA_SUCCESS) return Error("cuEventCreate failed: " + driver_.errorString(result));
    }
    const CUresult result = exec_.cuEventRecord(event, stream);
    if (result != CUDA_SUCCESS) {
      destroy(event);
      return Error("cuEventRecord failed: " + driver_.errorString(result));
    }
    return event;
  }

  bool completed(CUevent event) override { return query_(event) != kCudaErrorNotReady; }

  Status synchronize(CUevent event) override {
    const CUresult result = exec_.cuEventSynchronize(event);
    if (result != CUDA_SUCCESS) return Error("cuEventSynchronize failed: " + driver_.errorString(result));
    return Status::success();
  }

  // Events are kept for the next record(): creating one is a driver call.
  void destroy(CUevent event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(event);
  }

 private:
  const CudaDriverApi& driver_;
  const CudaExecApi& exec_;
  EventQuery query_;
  std::mutex mutex_;
  std::vector<CUevent> spare_;
};

class DriverPinnedHostMemory final : public PinnedHostMemory {
 public:
  DriverPinnedHostMemory(const CudaDriverApi& driver, const CudaExecApi& exec) : driver_(driver), exec_(exec) {}

  Expected<void*> allocate(size_t bytes) override {
    void* ptr = nullptr;
    const CUresult result = exec_.cuMemHostAlloc(&ptr, bytes, CU_MEMHOSTALLOC_PORTABLE);
    if (result != CUDA_SUCCESS) {
      return Error("cuMemHostAlloc of " + std::to_string(bytes) + " bytes failed: " + driver_.errorString(result));
    }
    return ptr;
  }

  void release(void* ptr) override { exec_.cuMemFreeHost(ptr); }

 private:
  const CudaDriverApi& driver_;
  const CudaExecApi& exec_;
};

}  // namespace

std::unique_ptr<DeviceMemory> driverDeviceMemory(const CudaDriverApi& driver, const CudaExecApi& exec) {
  return std::make_unique<DriverDeviceMemory>(driver, exec);
}

Expected<std::unique_ptr<StreamEvents>> driverStreamEvents(const CudaDriverApi& driver, const CudaExecApi& exec) {
  // TODO(kiln): move cuEventQuery into CudaExecApi with the other event calls.
  auto query = exec.library.symbol("cuEventQuery");
  if (!query) return query.takeError();
  return std::unique_ptr<StreamEvents>(
      std::make_unique<DriverStreamEvents>(driver, exec, reinterpret_cast<DriverStreamEvents::EventQuery>(*query)));
}

std::unique_ptr<PinnedHostMemory> driverPinnedHostMemory(const CudaDriverApi& driver, const CudaExecApi& exec) {
  return std::make_unique<DriverPinnedHostMemory>(driver, exec);
}

// ---------------------------------------------------------------------------
// Statistics.

std::string MemoryStats::format(const std::string& device) const {
  std::string text = "CUDA memory of " + device + "\n";
  char line[160];
  std::snprintf(line, sizeof(line), "  %-14s %12s %12s\n", "", "current", "peak");
  text += line;
  std::snprintf(line, sizeof(line), "  %-14s %12s %12s\n", "allocated", formatMemorySize(allocated).c_str(),
                formatMemorySize(maxAllocated).c_str());
  text += line;
  std::snprintf(line, sizeof(line), "  %-14s %12s %12s\n", "reserved", formatMemorySize(reserved).c_str(),
                formatMemorySize(maxReserved).c_str());
  text += line;
  std::snprintf(line, sizeof(line), "  %-14s %12lld in %lld segments\n", "live blocks",
                static_cast<long long>(allocations), static_cast<long long>(segments));
  text += line;
  std::snprintf(line, sizeof(line), "  %-14s %12lld (%lld cache hits, %lld driver allocations)\n", "allocations",
                static_cast<long long>(numAllocs), static_cast<long long>(cacheHits),
                static_cast<long long>(driverAllocs));
  text += line;
  std::snprintf(line, sizeof(line), "  %-14s %12lld (%lld driver frees)\n", "frees", static_cast<long long>(numFrees),
                static_cast<long long>(driverFrees));
  text += line;
  std::snprintf(line, sizeof(line), "  %-14s %12lld\n", "out of memory", static_cast<long long>(ooms));
  text += line;
  return text;
}

std::string PinnedMemoryStats::format() const {
  return "pinned host memory: " + formatMemorySize(reserved) + " reserved (peak " + formatMemorySize(maxReserved) +
         "), " + formatMemorySize(inUse) + " in use, " + std::to_string(hostAllocs) + " host allocations, " +
         std::to_string(cacheHits) + " cache hits\n";
}

// ---------------------------------------------------------------------------
// CachingAllocator.

size_t segmentSizeFor(size_t bytes) {
  if (bytes <= kSmallRequest) return kSmallSegment;
  if (bytes <= kMediumRequest) return kMediumSegment;
  return roundUp(bytes, kLargeSegmentRounding);
}

/// A piece of a segment. The blocks of a segment form a list in address
/// order; the first keeps the segment's address (merging always keeps the
/// lower block), so a block with neither neighbour is a whole segment.
struct CachingAllocator::Block {
  enum class State { Free, Allocated, Pending };  // Pending: freed, waiting for events
  CUdeviceptr ptr = 0;
  size_t size = 0;
  CUstream stream = nullptr;  // the stream its segment was allocated for
  bool small = false;         // in the small pool (cut from a 2 MiB segment)
  State state = State::Free;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<CUstream> streamUses;  // other streams that used it (recordStream)
  int pendingEvents = 0;
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return std::less<CUstream>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(DeviceMemory& memory, StreamEvents& events, std::string device)
    : memory_(memory), events_(events), device_(std::move(device)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  processEvents(/*wait=*/true);
  for (auto& [ptr, block] : blocks_) {
    if (!block->prev) memory_.release(ptr);
  }
}

CachingAllocator::FreeBlocks& CachingAllocator::poolFor(size_t bytes) {
  return bytes <= kSmallRequest ? smallFree_ : largeFree_;
}

/// The smallest free block of at least `bytes` on `stream`, taken out of its
/// pool; null when there is none.
CachingAllocator::Block* CachingAllocator::takeFreeBlock(size_t bytes, CUstream stream) {
  FreeBlocks& pool = poolFor(bytes);
  Block key;
  key.stream = stream;
  key.size = bytes;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

/// A new segment from the driver as one block outside the free pools; null
/// with `failure` set when the device is out of memory or the limit would
/// be passed; an Error for any other driver failure.
Expected<CachingAllocator::Block*> CachingAllocator::newSegment(size_t segmentBytes, CUstream stream,
                                                                SegmentFailure& failure) {
  failure = SegmentFailure::None;
  if (limit_ && static_cast<size_t>(stats_.reserved) + segmentBytes > *limit_) {
    failure = SegmentFailure::OverLimit;
    return nullptr;
  }
  auto ptr = memory_.allocate(segmentBytes);
  if (!ptr) {
    return Error("CUDA allocation of " + formatMemorySize(segmentBytes) + " on " + device_ +
                 " failed: " + ptr.error().message());
  }
  if (!*ptr) {
    failure = SegmentFailure::OutOfMemory;
    return nullptr;
  }
  auto block = std::make_unique<Block>();
  block->ptr = **ptr;
  block->size = segmentBytes;
  block->stream = stream;
  block->small = segmentBytes == kSmallSegment;
  Block* result = block.get();
  blocks_.emplace(result->ptr, std::move(block));
  stats_.reserved += static_cast<int64_t>(segmentBytes);
  stats_.segments++;
  stats_.driverAllocs++;
  updatePeaks();
  return result;
}

/// Cuts `block` down to `bytes` and puts the rest in the free pool, when the
/// rest is worth keeping apart: any 512 bytes in the small pool, more than
/// 1 MiB in the large one (smaller remnants of large blocks would only
/// fragment it, as in PyTorch).
void CachingAllocator::splitBlock(Block* block, size_t bytes) {
  const size_t remaining = block->size - bytes;
  const bool split = block->small ? remaining >= kBlockRounding : remaining > kSmallRequest;
  if (!split) return;
  auto rest = std::make_unique<Block>();
  rest->ptr = block->ptr + bytes;
  rest->size = remaining;
  rest->stream = block->stream;
  rest->small = block->small;
  rest->prev = block;
  rest->next = block->next;
  if (block->next) block->next->prev = rest.get();
  block->next = rest.get();
  block->size = bytes;
  (block->small ? smallFree_ : largeFree_).insert(rest.get());
  blocks_.emplace(rest->ptr, std::move(rest));
}

/// Marks `block` free, merges it with free neighbours and puts the result in
/// its pool.
void CachingAllocator::insertFree(Block* block) {
  FreeBlocks& pool = block->small ? smallFree_ : largeFree_;
  block->state = Block::State::Free;
  if (Block* prev = block->prev; prev && prev->state == Block::State::Free) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    blocks_.erase(block->ptr);
    block = prev;
  }
  if (Block* next = block->next; next && next->state == Block::State::Free) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    blocks_.erase(next->ptr);
  }
  pool.insert(block);
}

/// Returns to the pools the blocks whose events have all completed; with
/// `wait`, waits for every event first.
void CachingAllocator::processEvents(bool wait) {
  std::vector<PendingFree> stillPending;
  for (const PendingFree& pending : pending_) {
    if (!eventDone(events_, pending.event, wait)) {
      stillPending.push_back(pending);
      continue;
    }
    events_.destroy(pending.event);
    if (--pending.block->pendingEvents == 0) insertFree(pending.block);
  }
  pending_ = std::move(stillPending);
}

void CachingAllocator::releaseSegment(Block* block) {
  (block->small ? smallFree_ : largeFree_).erase(block);
  memory_.release(block->ptr);
  stats_.reserved -= static_cast<int64_t>(block->size);
  stats_.segments--;
  stats_.driverFrees++;
  blocks_.erase(block->ptr);
}

void CachingAllocator::releaseFreeSegments() {
  std::vector<Block*> wholeSegments;
  for (FreeBlocks* pool : {&smallFree_, &largeFree_}) {
    for (Block* block : *pool) {
      if (!block->prev && !block->next) wholeSegments.push_back(block);
    }
  }
  for (Block* block : wholeSegments) releaseSegment(block);
}

Error CachingAllocator::outOfMemory(size_t requested, SegmentFailure failure) {
  std::string message =
      "CUDA out of memory: tried to allocate " + formatMemorySize(requested) + " on " + device_ + "; ";
  if (failure == SegmentFailure::OverLimit) {
    message += "the memory limit is " + formatMemorySize(*limit_);
  } else {
    message += formatMemorySize(memory_.freeBytes()) + " free of " + formatMemorySize(memory_.totalBytes());
  }
  message += ", " + formatMemorySize(stats_.allocated) + " allocated by Kiln, " + formatMemorySize(stats_.reserved) +
             " reserved by Kiln";
  return Error(message);
}

void CachingAllocator::updatePeaks() {
  stats_.maxAllocated = std::max(stats_.maxAllocated, stats_.allocated);
  stats_.maxReserved = std::max(stats_.maxReserved, stats_.reserved);
}

Expected<CUdeviceptr> CachingAllocator::allocate(size_t bytes, CUstream stream) {
  if (bytes == 0) return CUdeviceptr{0};
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > std::numeric_limits<size_t>::max() / 2) {  // no device has it, and rounding would overflow
    stats_.ooms++;
    return outOfMemory(bytes, SegmentFailure::OutOfMemory);
  }
  const size_t size = roundUp(bytes, kBlockRounding);
  processEvents(/*wait=*/false);
  Block* block = takeFreeBlock(size, stream);
  if (block) {
    stats_.cacheHits++;
  } else {
    SegmentFailure failure;
    auto segment = newSegment(segmentSizeFor(size), stream, failure);
    if (!segment) return segment.takeError();
    block = *segment;
    if (!block) {
      // Out of memory or over the limit: first the blocks whose frees wait
      // for other streams, then the cached segments, then the driver again.
      processEvents(/*wait=*/true);
      block = takeFreeBlock(size, stream);
      if (block) {
        stats_.cacheHits++;
      } else {
        releaseFreeSegments();
        segment = newSegment(segmentSizeFor(size), stream, failure);
        if (!segment) return segment.takeError();
        block = *segment;
        if (!block) {
          stats_.ooms++;
          return outOfMemory(bytes, failure);
        }
      }
    }
  }
  splitBlock(block, size);
  block->state = Block::State::Allocated;
  stats_.allocated += static_cast<int64_t>(block->size);
  stats_.allocations++;
  stats_.numAllocs++;
  updatePeaks();
  return block->ptr;
}

Status CachingAllocator::free(CUdeviceptr ptr) {
  if (ptr == 0) return Status::success();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second->state != Block::State::Allocated) {
    return Error("cannot free device address " + hexAddress(ptr) + ": it is not a live allocation of " + device_);
  }
  Block* block = it->second.get();
  std::vector<CUevent> recorded;
  for (CUstream stream : block->streamUses) {
    auto event = events_.record(stream);
    if (!event) {
      for (CUevent done : recorded) events_.destroy(done);
      return Error("cannot free device address " + hexAddress(ptr) + " on " + device_ +
                   ": recording an event on a stream that used it failed: " + event.error().message());
    }
    recorded.push_back(*event);
  }
  stats_.allocated -= static_cast<int64_t>(block->size);
  stats_.allocations--;
  stats_.numFrees++;
  block->streamUses.clear();
  if (recorded.empty()) {
    insertFree(block);
    return Status::success();
  }
  block->state = Block::State::Pending;
  block->pendingEvents = static_cast<int>(recorded.size());
  for (CUevent event : recorded) pending_.push_back({event, block});
  return Status::success();
}

void CachingAllocator::recordStream(CUdeviceptr ptr, CUstream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second->state != Block::State::Allocated) return;
  Block* block = it->second.get();
  if (stream == block->stream) return;
  for (CUstream used : block->streamUses) {
    if (used == stream) return;
  }
  block->streamUses.push_back(stream);
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  processEvents(/*wait=*/true);
  releaseFreeSegments();
}

void CachingAllocator::setLimit(std::optional<size_t> bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

std::optional<size_t> CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::resetPeakStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.maxAllocated = stats_.allocated;
  stats_.maxReserved = stats_.reserved;
}

size_t CachingAllocator::blockSize(CUdeviceptr ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second->state != Block::State::Allocated) return 0;
  return it->second->size;
}

// ---------------------------------------------------------------------------
// PinnedHostPool.

PinnedHostPool::PinnedHostPool(PinnedHostMemory& memory, StreamEvents& events) : memory_(memory), events_(events) {}

PinnedHostPool::~PinnedHostPool() {
  std::lock_guard<std::mutex> lock(mutex_);
  processEvents(/*wait=*/true);
  for (auto& [data, buffer] : buffers_) memory_.release(data);
}

Expected<PinnedBuffer> PinnedHostPool::acquire(size_t bytes) {
  const size_t size = std::max(kMinPinnedBuffer, std::bit_ceil(bytes));
  std::lock_guard<std::mutex> lock(mutex_);
  auto takeIdle = [&]() -> void* {
    auto it = idle_.find(size);
    if (it == idle_.end() || it->second.empty()) return nullptr;
    void* data = it->second.back();
    it->second.pop_back();
    return data;
  };
  processEvents(/*wait=*/false);
  void* data = takeIdle();
  if (data) {
    stats_.cacheHits++;
  } else {
    auto allocated = memory_.allocate(size);
    if (!allocated) {
      // Pinned memory is scarce host memory: wait for pending copies, give
      // the idle buffers back and try once more.
      processEvents(/*wait=*/true);
      data = takeIdle();
      if (data) {
        stats_.cacheHits++;
      } else {
        releaseIdleBuffers();
        allocated = memory_.allocate(size);
        if (!allocated) {
          return Error("cannot allocate " + formatMemorySize(size) + " of pinned host memory (" +
                       formatMemorySize(stats_.reserved) + " already held by Kiln): " + allocated.error().message());
        }
      }
    }
    if (!data) {
      data = *allocated;
      buffers_[data].size = size;
      stats_.reserved += static_cast<int64_t>(size);
      stats_.maxReserved = std::max(stats_.maxReserved, stats_.reserved);
      stats_.hostAllocs++;
    }
  }
  buffers_[data].inUse = true;
  stats_.inUse += static_cast<int64_t>(size);
  return PinnedBuffer{data, size};
}

void PinnedHostPool::release(void* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.find(data);
  assert(it != buffers_.end() && it->second.inUse && "release of a buffer the pinned pool did not hand out");
  it->second.inUse = false;
  stats_.inUse -= static_cast<int64_t>(it->second.size);
  idle_[it->second.size].push_back(data);
}

void PinnedHostPool::release(void* data, CUevent copyDone) {
  std::lock_guard<std::mutex> lock(mutex_);
  assert(buffers_.count(data) && buffers_[data].inUse && "release of a buffer the pinned pool did not hand out");
  pending_.push_back({copyDone, data});
}

Status PinnedHostPool::releaseAfter(void* data, CUstream stream) {
  auto event = events_.record(stream);
  if (!event) return Error("cannot release a pinned staging buffer: " + event.error().message());
  release(data, *event);
  return Status::success();
}

void PinnedHostPool::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  processEvents(/*wait=*/true);
  releaseIdleBuffers();
}

PinnedMemoryStats PinnedHostPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

/// Makes idle the buffers whose copies have completed (with `wait`, all).
void PinnedHostPool::processEvents(bool wait) {
  std::vector<PendingRelease> stillPending;
  for (const PendingRelease& pending : pending_) {
    if (!eventDone(events_, pending.event, wait)) {
      stillPending.push_back(pending);
      continue;
    }
    events_.destroy(pending.event);
    Buffer& buffer = buffers_[pending.data];
    buffer.inUse = false;
    stats_.inUse -= static_cast<int64_t>(buffer.size);
    idle_[buffer.size].push_back(pending.data);
  }
  pending_ = std::move(stillPending);
}

void PinnedHostPool::releaseIdleBuffers() {
  for (auto& [size, list] : idle_) {
    for (void* data : list) {
      memory_.release(data);
      buffers_.erase(data);
      stats_.reserved -= static_cast<int64_t>(size);
      stats_.hostFrees++;
    }
    list.clear();
  }
}

}  // namespace kiln::cuda
