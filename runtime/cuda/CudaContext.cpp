// CudaContext (CudaContext.h).
#include "runtime/cuda/CudaContext.h"

#include <map>
#include <mutex>

namespace kiln::cuda {

Expected<std::shared_ptr<CudaContext>> CudaContext::get(const CudaDeviceInfo& device,
                                                        const LibrarySearchOptions& options) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<CudaContext>> contexts;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = contexts.find(device.index); it != contexts.end()) {
    KILN_TRY(it->second->makeCurrent());
    return it->second;
  }
  auto driver = loadCudaDriver(options);
  if (!driver) return driver.takeError();
  auto api = loadCudaExec(options);
  if (!api) return api.takeError();
  std::shared_ptr<CudaContext> c(new CudaContext());
  c->driver_ = *driver;
  c->api_ = *api;
  c->device_ = device;
  c->options_ = options;
  c->emulated_ = emulatorDescription(**driver);
  KILN_TRY(c->check(c->driver_->cuInit(0), "initializing the driver (cuInit)"));
  CUdevice handle = 0;
  KILN_TRY(c->check(c->driver_->cuDeviceGet(&handle, device.index), "opening the device (cuDeviceGet)"));
  KILN_TRY(c->check(c->driver_->cuDevicePrimaryCtxRetain(&c->context_, handle),
                    "creating the device's context (cuDevicePrimaryCtxRetain)"));
  KILN_TRY(c->makeCurrent());
  KILN_TRY(c->check(c->api_->cuStreamCreate(&c->compute_, CU_STREAM_NON_BLOCKING), "creating the compute stream"));
  KILN_TRY(c->check(c->api_->cuStreamCreate(&c->copy_, CU_STREAM_NON_BLOCKING), "creating the copy stream"));
  c->deviceMemory_ = driverDeviceMemory(**driver, **api);
  auto events = driverStreamEvents(**driver, **api);
  if (!events) return events.takeError();
  c->events_ = std::move(*events);
  c->pinnedMemory_ = driverPinnedHostMemory(**driver, **api);
  c->allocator_ = std::make_unique<CachingAllocator>(*c->deviceMemory_, *c->events_, c->name());
  c->pinned_ = std::make_unique<PinnedHostPool>(*c->pinnedMemory_, *c->events_);
  contexts.emplace(device.index, c);
  return c;
}

// Contexts live until the process exits (they are cached above); the driver
// releases the primary context and its streams then.
CudaContext::~CudaContext() = default;

std::string CudaContext::name() const {
  return "cuda:" + std::to_string(device_.index) + " (" + device_.name + ")";
}

std::string CudaContext::memoryReport() const {
  return allocator_->stats().format(name()) + pinned_->stats().format();
}

Status CudaContext::makeCurrent() const {
  return check(driver_->cuCtxSetCurrent(context_), "making the device's context current (cuCtxSetCurrent)");
}

Status CudaContext::check(CUresult result, const std::string& what) const {
  if (result == CUDA_SUCCESS) return Status::success();
  return Error("CUDA error while " + what + " on " + name() + ": " + driver_->errorString(result));
}

}  // namespace kiln::cuda
