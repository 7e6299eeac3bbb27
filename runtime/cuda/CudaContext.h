// One CUDA device in use: its primary context (retained once per process,
// as the CUDA runtime does), the driver's entry points, and the two streams
// Kiln works on — a compute stream for kernels and library calls and a copy
// stream for host-to-device copies that overlap them — and its memory: the
// caching allocator every device buffer comes from and the pool of pinned
// host staging buffers (CudaAllocator.h), whose statistics
// `--memory-stats` prints. Every driver call goes
// through `check`, so each failure names the call (and the kernel) it came
// from, with the driver's own name and text for the error.
#pragma once

#include <memory>
#include <string>

#include "ir/Support.h"
#include "runtime/cuda/CudaAllocator.h"
#include "runtime/cuda/CudaDevices.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::cuda {

class CudaContext {
 public:
  /// The context of `device` (probed already), made current on this
  /// thread; the same object for every caller of the same device.
  static Expected<std::shared_ptr<CudaContext>> get(const CudaDeviceInfo& device,
                                                     const LibrarySearchOptions& options);
  ~CudaContext();

  const CudaDriverApi& driver() const { return *driver_; }
  const CudaExecApi& api() const { return *api_; }
  const CudaDeviceInfo& device() const { return device_; }
  const LibrarySearchOptions& searchOptions() const { return options_; }
  /// Not empty when the device is Kiln's emulated GPU.
  const std::string& emulated() const { return emulated_; }
  CUstream computeStream() const { return compute_; }
  CUstream copyStream() const { return copy_; }
  CachingAllocator& allocator() const { return *allocator_; }
  PinnedHostPool& pinnedPool() const { return *pinned_; }
  /// The allocator's and the pinned pool's statistics, as
  /// `kiln run|train --memory-stats` prints them.
  std::string memoryReport() const;
  /// "cuda:0 (NVIDIA H100 80GB HBM3)".
  std::string name() const;

  /// Makes the context current on the calling thread.
  Status makeCurrent() const;
  /// Success, or an error "CUDA error while <what> on cuda:0 (...):
  /// CUDA_ERROR_... (text)".
  Status check(CUresult result, const std::string& what) const;

 private:
  CudaContext() = default;
  const CudaDriverApi* driver_ = nullptr;
  const CudaExecApi* api_ = nullptr;
  CudaDeviceInfo device_;
  LibrarySearchOptions options_;
  std::string emulated_;
  CUcontext context_ = nullptr;
  CUstream compute_ = nullptr;
  CUstream copy_ = nullptr;
  std::unique_ptr<DeviceMemory> deviceMemory_;
  std::unique_ptr<StreamEvents> events_;
  std::unique_ptr<PinnedHostMemory> pinnedMemory_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<PinnedHostPool> pinned_;
};

}  // namespace kiln::cuda
