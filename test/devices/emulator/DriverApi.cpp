// The driver API of Kiln's emulated GPU: the extern "C" entry points of
// CUDA 13's cuda.h (the _v2 names where cuda.h maps to them) that Kiln
// calls, over one emulated device and its primary context (Device.h), plus
// the emulator's own entry points (EmulatorHooks.h). Every entry point
// takes one process-wide lock, so calls from several threads are
// serialized; work runs on the thread that waits for it.
//
// Settings come from the environment when the primary context is created
// (so a process can release it, change them, and retain a new one):
//   KILN_EMULATOR_MEMORY=<bytes>  device memory (default 4 GiB)
//   KILN_EMULATOR_SEED=<n>        adversarial scheduling with this seed
//   KILN_EMULATOR_VERBOSE=1       print every fault and load error to stderr
//   KILN_EMULATOR_STATS=1         print interpreter counts when the context goes
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "test/devices/emulator/Device.h"
#include "test/devices/emulator/EmulatorHooks.h"

#define KILN_CU_EXPORT extern "C" __attribute__((visibility("default")))

namespace kiln::emulator {
namespace {

using CUdevice = int;
using CUdeviceptr = unsigned long long;

constexpr const char* kDeviceName = "Kiln emulated GPU";
constexpr const char* kDescription = "Kiln CUDA emulator 1 (PTX interpreter)";
constexpr int kDriverVersion = 13000;
constexpr uint32_t kMaxSharedPerBlock = 48 * 1024;

struct Driver {
  std::recursive_mutex mutex;
  bool initialized = false;
  EmulatorOptions options;
  std::unique_ptr<Context> context;
  int retains = 0;
  std::string lastFault;
  uint64_t modulesLoaded = 0;
  std::chrono::steady_clock::duration loadTime{};  // parsing and decoding PTX
};

/// Never destroyed: a host's static destructors may still call the driver.
Driver& driver() {
  static Driver* d = new Driver;
  return *d;
}

/// The primary context's handle (CUcontext) and the calling thread's
/// current context.
char primaryContextHandle;
thread_local void* currentContext = nullptr;

EmulatorOptions optionsFromEnvironment() {
  EmulatorOptions o;
  if (const char* m = std::getenv("KILN_EMULATOR_MEMORY"); m && *m) {
    char* end = nullptr;
    const unsigned long long bytes = std::strtoull(m, &end, 10);
    if (end && *end == '\0' && bytes > 0) o.memoryLimit = bytes;
  }
  if (const char* s = std::getenv("KILN_EMULATOR_SEED"); s && *s) {
    o.adversarial = true;
    o.seed = std::strtoull(s, nullptr, 10);
  }
  auto flag = [](const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
  };
  o.verbose = flag("KILN_EMULATOR_VERBOSE");
  o.stats = flag("KILN_EMULATOR_STATS");
  return o;
}

/// Locks the driver and runs `f(context)` when the calling thread has the
/// primary context current; `sticky` says whether a broken context fails
/// the call with its error first.
template <class F>
CUresult withContext(F&& f, bool sticky = true) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (!d.initialized) return kErrorNotInitialized;
  if (!d.context || currentContext != &primaryContextHandle) return kErrorInvalidContext;
  if (sticky && d.context->sticky()) return d.context->sticky();
  return f(*d.context);
}

/// Whether host pointer `p` is the address of a live device allocation of
/// `c` (a device pointer passed where a host one belongs). Not merely
/// whether it falls in the emulated device's address range: the host's own
/// mappings can land there too (Linux's randomized mmap base reaches below
/// 0x7f0000000000), and a pinned staging buffer there failed host-device
/// copies with CUDA_ERROR_INVALID_VALUE now and then (onnx-conformance-cuda,
/// CudaRowReductionTest).
bool isDeviceAddress(Context& c, const void* p) {
  const auto a = reinterpret_cast<uint64_t>(p);
  return a >= DeviceMemory::kFirstAddress && a < DeviceMemory::kLastAddress && c.memory().find(a, 1) != nullptr;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

const ErrorText kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {35, "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA driver version is insufficient for CUDA runtime version"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {710, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* findError(CUresult code) {
  for (const ErrorText& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}

/// Validates a device range for a copy or memset: inside one live allocation.
bool validRange(Context& c, CUdeviceptr address, uint64_t bytes) { return c.memory().find(address, bytes) != nullptr; }

/// Enqueues `work` on the legacy stream and waits for it (the synchronous
/// copies and memsets).
CUresult runSynchronously(Context& c, std::shared_ptr<Work> work) {
  std::shared_ptr<Stream> legacy = c.stream(nullptr);
  CUresult result = c.enqueue(legacy, std::move(work));
  if (result != kSuccess) return result;
  return c.runUntil({c.lastPoint(legacy)});
}

CUresult loadModule(Context& c, void** module, const void* image, std::string& log) {
  if (!module || !image) return kErrorInvalidValue;
  const char* text = static_cast<const char*>(image);
  if (!looksLikePtx(text)) {
    log = "the emulated GPU runs PTX only: this image is an ELF CUBIN or a fatbin (no SASS for an emulated device)";
    reportFault(kErrorNoBinaryForGpu, log);
    return kErrorNoBinaryForGpu;
  }
  auto loaded = std::make_shared<LoadedModule>();
  const auto start = std::chrono::steady_clock::now();
  try {
    loaded->ptx = loadPtx(std::string_view(text, std::strlen(text)));
    driver().loadTime += std::chrono::steady_clock::now() - start;
    ++driver().modulesLoaded;
  } catch (const PtxError& e) {
    log = std::string("PTX not loaded: ") + e.what();
    reportFault(kErrorInvalidPtx, log);
    return kErrorInvalidPtx;
  } catch (const std::exception& e) {
    // Malformed text the parser did not foresee (a number out of range, ...).
    log = std::string("PTX not loaded: malformed text (") + e.what() + ")";
    reportFault(kErrorInvalidPtx, log);
    return kErrorInvalidPtx;
  }
  loaded->memory = &c.memory();
  for (const ModuleVariable& v : loaded->ptx.variables) {
    uint64_t address = 0;
    if (v.space != Space::Shared) {
      address = c.memory().allocate(v.bytes);
      if (!address) return kErrorOutOfMemory;
      if (!v.init.empty()) std::memcpy(c.memory().translate(address, v.bytes), v.init.data(), v.init.size());
    }
    loaded->variableAddresses.push_back(address);
  }
  for (const Kernel& k : loaded->ptx.kernels) {
    auto lk = std::make_unique<LoadedKernel>();
    lk->kernel = &k;
    for (const ConstantSlot& constant : k.constants) {
      uint64_t value = constant.value;
      if (constant.variable >= 0) value += loaded->variableAddresses[static_cast<size_t>(constant.variable)];
      lk->constantValues.push_back(value);
    }
    loaded->kernels.push_back(std::move(lk));
  }
  *module = c.addModule(std::move(loaded));
  return kSuccess;
}

}  // namespace

void reportFault(CUresult code, const std::string& message) {
  Driver& d = driver();
  const ErrorText* e = findError(code);
  d.lastFault = std::string(e ? e->name : "CUDA error") + ": " + message;
  if (d.options.verbose) std::fprintf(stderr, "kiln emulator: %s\n", d.lastFault.c_str());
}

}  // namespace kiln::emulator

using namespace kiln::emulator;
using CUdevice = int;
using CUdeviceptr = unsigned long long;

// ---------------------------------------------------------------------------
// Errors, initialization, the device

KILN_CU_EXPORT CUresult cuGetErrorName(CUresult error, const char** str) {
  if (!str) return kErrorInvalidValue;
  const ErrorText* e = findError(error);
  *str = e ? e->name : nullptr;
  return e ? kSuccess : kErrorInvalidValue;
}

KILN_CU_EXPORT CUresult cuGetErrorString(CUresult error, const char** str) {
  if (!str) return kErrorInvalidValue;
  const ErrorText* e = findError(error);
  *str = e ? e->text : nullptr;
  return e ? kSuccess : kErrorInvalidValue;
}

/// NVRTC opens libcuda.so.1 too and asks for an export table, which the
/// emulator does not have.
KILN_CU_EXPORT CUresult cuGetExportTable(const void** table, const void* id) {
  if (table) *table = nullptr;
  return kErrorNotSupported;
}

KILN_CU_EXPORT CUresult cuInit(unsigned int flags) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (flags != 0) return kErrorInvalidValue;
  d.initialized = true;
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuDriverGetVersion(int* version) {
  if (!version) return kErrorInvalidValue;
  *version = kDriverVersion;
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (!driver().initialized) return kErrorNotInitialized;
  if (!count) return kErrorInvalidValue;
  *count = 1;
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!driver().initialized) return kErrorNotInitialized;
  if (!device) return kErrorInvalidValue;
  if (ordinal != 0) return kErrorInvalidDevice;
  *device = 0;
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!driver().initialized) return kErrorNotInitialized;
  if (dev != 0) return kErrorInvalidDevice;
  if (!name || len <= 0) return kErrorInvalidValue;
  std::snprintf(name, static_cast<size_t>(len), "%s", kDeviceName);
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice dev) {
  if (!driver().initialized) return kErrorNotInitialized;
  if (dev != 0) return kErrorInvalidDevice;
  if (!value) return kErrorInvalidValue;
  switch (attribute) {
    case 1: *value = 1024; break;                                   // MAX_THREADS_PER_BLOCK
    case 2: *value = 1024; break;                                   // MAX_BLOCK_DIM_X
    case 3: *value = 1024; break;                                   // MAX_BLOCK_DIM_Y
    case 4: *value = 64; break;                                     // MAX_BLOCK_DIM_Z
    case 5: *value = 2147483647; break;                             // MAX_GRID_DIM_X
    case 6: *value = 65535; break;                                  // MAX_GRID_DIM_Y
    case 7: *value = 65535; break;                                  // MAX_GRID_DIM_Z
    case 8: *value = static_cast<int>(kMaxSharedPerBlock); break;   // MAX_SHARED_MEMORY_PER_BLOCK
    case 10: *value = 32; break;                                    // WARP_SIZE
    case 16: *value = 2; break;                                     // MULTIPROCESSOR_COUNT
    case 20: *value = 0; break;                                     // COMPUTE_MODE: default
    case 75: *value = 15; break;                                    // COMPUTE_CAPABILITY_MAJOR: no CUBIN exists for it
    case 76: *value = 0; break;                                     // COMPUTE_CAPABILITY_MINOR
    case 97: *value = static_cast<int>(kMaxSharedPerBlock); break;  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    default: return kErrorInvalidValue;
  }
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (!d.initialized) return kErrorNotInitialized;
  if (dev != 0) return kErrorInvalidDevice;
  if (!bytes) return kErrorInvalidValue;
  *bytes = d.context ? d.context->memory().limit() : optionsFromEnvironment().memoryLimit;
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice dev) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (!d.initialized) return kErrorNotInitialized;
  if (dev != 0) return kErrorInvalidDevice;
  if (!ctx) return kErrorInvalidValue;
  if (!d.context) {
    d.options = optionsFromEnvironment();
    d.context = std::make_unique<Context>(d.options);
    d.modulesLoaded = 0;
    d.loadTime = {};
  }
  ++d.retains;
  *ctx = &primaryContextHandle;
  return kSuccess;
}

/// KILN_EMULATOR_STATS: what the context's interpreter did, printed when the
/// context goes (its last release, or the end of the process).
static void printStats(const Driver& d) {
  if (!d.context || !d.context->options().stats) return;
  const InterpreterStats& st = d.context->stats();
  std::fprintf(stderr,
               "kiln emulator: %llu kernel launches, %llu warp instructions, %llu lane instructions in %.3f s "
               "(%.1f M lane instructions/s); %llu modules loaded in %.3f s\n",
               static_cast<unsigned long long>(st.launches), static_cast<unsigned long long>(st.warpInstructions),
               static_cast<unsigned long long>(st.laneInstructions), st.seconds,
               st.seconds > 0 ? st.laneInstructions / st.seconds / 1e6 : 0.0,
               static_cast<unsigned long long>(d.modulesLoaded), std::chrono::duration<double>(d.loadTime).count());
}

struct StatsAtExit {
  ~StatsAtExit() { printStats(driver()); }
} statsAtExit;

KILN_CU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (!d.initialized) return kErrorNotInitialized;
  if (dev != 0) return kErrorInvalidDevice;
  if (d.retains == 0) return kErrorInvalidContext;
  if (--d.retains == 0) {
    // The last release destroys the context: memory, modules, streams, and a
    // sticky error with them.
    printStats(d);
    d.context.reset();
  }
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuCtxSetCurrent(void* ctx) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (!d.initialized) return kErrorNotInitialized;
  if (ctx && (ctx != &primaryContextHandle || !d.context)) return kErrorInvalidContext;
  currentContext = ctx;
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuCtxGetCurrent(void** ctx) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (!d.initialized) return kErrorNotInitialized;
  if (!ctx) return kErrorInvalidValue;
  *ctx = d.context ? currentContext : nullptr;
  return kSuccess;
}

KILN_CU_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  return withContext(
      [&](Context&) {
        if (!device) return kErrorInvalidValue;
        *device = 0;
        return kSuccess;
      },
      false);
}

KILN_CU_EXPORT CUresult cuCtxSynchronize() {
  return withContext([&](Context& c) {
    if (c.prohibitsUnsafeCall()) return kErrorStreamCaptureUnsupported;
    return c.runUntil(c.allPoints());
  });
}

KILN_CU_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  return withContext([&](Context& c) {
    if (!free || !total) return kErrorInvalidValue;
    *total = c.memory().limit();
    *free = c.memory().limit() - c.memory().used();
    return kSuccess;
  });
}

// ---------------------------------------------------------------------------
// Memory

KILN_CU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t bytes) {
  return withContext([&](Context& c) {
    if (!ptr || bytes == 0) return kErrorInvalidValue;
    if (c.prohibitsUnsafeCall()) return kErrorStreamCaptureUnsupported;
    const uint64_t address = c.memory().allocate(bytes);
    if (!address) return kErrorOutOfMemory;
    *ptr = address;
    return kSuccess;
  });
}

KILN_CU_EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  return withContext([&](Context& c) {
    if (ptr == 0) return kSuccess;
    if (c.prohibitsUnsafeCall()) return kErrorStreamCaptureUnsupported;
    // cuMemFree waits for the device, as a GPU's does.
    CUresult r = c.runUntil(c.allPoints());
    if (r != kSuccess) return r;
    return c.memory().free(ptr) ? kSuccess : kErrorInvalidValue;
  });
}

KILN_CU_EXPORT CUresult cuMemAllocHost_v2(void** ptr, size_t bytes) {
  return withContext([&](Context& c) {
    if (!ptr) return kErrorInvalidValue;
    if (c.prohibitsUnsafeCall()) return kErrorStreamCaptureUnsupported;
    *ptr = c.allocateHost(bytes);
    return *ptr ? kSuccess : kErrorOutOfMemory;
  });
}

KILN_CU_EXPORT CUresult cuMemHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  return withContext([&](Context& c) {
    if (!ptr) return kErrorInvalidValue;
    if (flags & 2) return kErrorNotSupported;
    if (c.prohibitsUnsafeCall())
      return kErrorStreamCaptureUnsupported;  // CU_MEMHOSTALLOC_DEVICEMAP: kernels cannot reach host memory
    *ptr = c.allocateHost(bytes);
    return *ptr ? kSuccess : kErrorOutOfMemory;
  });
}

KILN_CU_EXPORT CUresult cuMemFreeHost(void* ptr) {
  return withContext([&](Context& c) {
    if (c.prohibitsUnsafeCall()) return kErrorStreamCaptureUnsupported;
    // Queued copies may still read or write it.
    CUresult r = c.runUntil(c.allPoints());
    if (r != kSuccess) return r;
    return c.freeHost(ptr) ? kSuccess : kErrorInvalidValue;
  });
}

namespace {

CUresult copyAsync(CopyWork::Kind kind, CUdeviceptr dstDevice, void* dstHost, CUdeviceptr srcDevice,
                   const void* srcHost, size_t bytes, void* stream, bool synchronous) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    if (bytes == 0) return kSuccess;  // as the driver: nothing to copy, nothing checked
    if (kind != CopyWork::Kind::HostToDevice && !validRange(c, srcDevice, bytes)) return kErrorInvalidValue;
    if (kind != CopyWork::Kind::DeviceToHost && !validRange(c, dstDevice, bytes)) return kErrorInvalidValue;
    if (kind == CopyWork::Kind::HostToDevice && (!srcHost || isDeviceAddress(c, srcHost))) return kErrorInvalidValue;
    if (kind == CopyWork::Kind::DeviceToHost && (!dstHost || isDeviceAddress(c, dstHost))) return kErrorInvalidValue;
    auto work = std::make_shared<CopyWork>(kind, dstDevice, dstHost, srcDevice, srcHost, bytes);
    if (synchronous) {
      if (c.prohibitsUnsafeCall()) return kErrorStreamCaptureUnsupported;
      return runSynchronously(c, std::move(work));
    }
    return c.enqueue(s, std::move(work));
  });
}

CUresult memset(CUdeviceptr dst, uint32_t value, uint32_t elementBytes, size_t count, void* stream, bool synchronous) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    if (count == 0) return kSuccess;
    if (dst % elementBytes != 0 || !validRange(c, dst, count * elementBytes)) return kErrorInvalidValue;
    auto work = std::make_shared<MemsetWork>(dst, value, elementBytes, count);
    if (synchronous) {
      if (c.prohibitsUnsafeCall()) return kErrorStreamCaptureUnsupported;
      return runSynchronously(c, std::move(work));
    }
    return c.enqueue(s, std::move(work));
  });
}

}  // namespace

KILN_CU_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  return copyAsync(CopyWork::Kind::HostToDevice, dst, nullptr, 0, src, bytes, nullptr, true);
}

KILN_CU_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  return copyAsync(CopyWork::Kind::DeviceToHost, 0, dst, src, nullptr, bytes, nullptr, true);
}

KILN_CU_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copyAsync(CopyWork::Kind::DeviceToDevice, dst, nullptr, src, nullptr, bytes, nullptr, true);
}

KILN_CU_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, void* stream) {
  return copyAsync(CopyWork::Kind::HostToDevice, dst, nullptr, 0, src, bytes, stream, false);
}

KILN_CU_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, void* stream) {
  return copyAsync(CopyWork::Kind::DeviceToHost, 0, dst, src, nullptr, bytes, stream, false);
}

KILN_CU_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void* stream) {
  return copyAsync(CopyWork::Kind::DeviceToDevice, dst, nullptr, src, nullptr, bytes, stream, false);
}

KILN_CU_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  return memset(dst, value, 1, count, nullptr, true);
}

KILN_CU_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) {
  return memset(dst, value, 4, count, nullptr, true);
}

KILN_CU_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, void* stream) {
  return memset(dst, value, 1, count, stream, false);
}

KILN_CU_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, void* stream) {
  return memset(dst, value, 4, count, stream, false);
}

// ---------------------------------------------------------------------------
// Streams and events

KILN_CU_EXPORT CUresult cuStreamCreate(void** stream, unsigned int flags) {
  return withContext([&](Context& c) {
    if (!stream || (flags & ~1u)) return kErrorInvalidValue;
    *stream = c.createStream((flags & 1u) == 0);  // CU_STREAM_NON_BLOCKING = 1
    return kSuccess;
  });
}

KILN_CU_EXPORT CUresult cuStreamDestroy_v2(void* stream) {
  return withContext([&](Context& c) { return c.destroyStream(stream); }, false);
}

KILN_CU_EXPORT CUresult cuStreamSynchronize(void* stream) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    if (s->capture) {
      s->capture->invalidated = true;
      return kErrorStreamCaptureUnsupported;
    }
    return c.runUntil({c.lastPoint(s)});
  });
}

KILN_CU_EXPORT CUresult cuStreamQuery(void* stream) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    if (s->capture) return kErrorStreamCaptureUnsupported;
    // One command per query: a polling host makes progress, and a host that
    // queries once does not see everything done.
    return c.runUntil({c.lastPoint(s)}, 1);
  });
}

KILN_CU_EXPORT CUresult cuStreamWaitEvent(void* stream, void* event, unsigned int flags) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    std::shared_ptr<Event> e = c.event(event);
    if (!s || !e) return kErrorInvalidHandle;
    return c.waitEvent(s, e);
  });
}

KILN_CU_EXPORT CUresult cuEventCreate(void** event, unsigned int flags) {
  return withContext([&](Context& c) {
    if (!event) return kErrorInvalidValue;
    *event = c.createEvent(flags);
    return kSuccess;
  });
}

KILN_CU_EXPORT CUresult cuEventRecord(void* event, void* stream) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    std::shared_ptr<Event> e = c.event(event);
    if (!s || !e) return kErrorInvalidHandle;
    return c.recordEvent(e, s);
  });
}

KILN_CU_EXPORT CUresult cuEventQuery(void* event) {
  return withContext([&](Context& c) {
    std::shared_ptr<Event> e = c.event(event);
    if (!e) return kErrorInvalidHandle;
    if (e->capture) return kErrorCapturedEvent;
    if (!e->recorded) return kSuccess;
    return c.runUntil({e->point}, 1);
  });
}

KILN_CU_EXPORT CUresult cuEventSynchronize(void* event) {
  return withContext([&](Context& c) {
    std::shared_ptr<Event> e = c.event(event);
    if (!e) return kErrorInvalidHandle;
    if (e->capture) return kErrorCapturedEvent;
    if (!e->recorded) return kSuccess;
    return c.runUntil({e->point});
  });
}

KILN_CU_EXPORT CUresult cuEventDestroy_v2(void* event) {
  return withContext([&](Context& c) { return c.destroyEvent(event); }, false);
}

KILN_CU_EXPORT CUresult cuEventElapsedTime_v2(float* ms, void* start, void* end) {
  return withContext([&](Context& c) {
    std::shared_ptr<Event> a = c.event(start), b = c.event(end);
    if (!a || !b) return kErrorInvalidHandle;
    if (!ms) return kErrorInvalidValue;
    if ((a->flags | b->flags) & 2u) return kErrorInvalidHandle;  // CU_EVENT_DISABLE_TIMING
    if (!a->recorded || !b->recorded) return kErrorInvalidHandle;
    if (!a->timed || !b->timed) return kErrorNotReady;
    *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
    return kSuccess;
  });
}

KILN_CU_EXPORT CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
  return cuEventElapsedTime_v2(ms, start, end);
}

// ---------------------------------------------------------------------------
// Modules and launches

KILN_CU_EXPORT CUresult cuModuleLoadData(void** module, const void* image) {
  return withContext([&](Context& c) {
    std::string log;
    return loadModule(c, module, image, log);
  });
}

KILN_CU_EXPORT CUresult cuModuleLoadDataEx(void** module, const void* image, unsigned int numOptions, int* options,
                                           void** optionValues) {
  return withContext([&](Context& c) {
    std::string log;
    CUresult r = loadModule(c, module, image, log);
    // CU_JIT_ERROR_LOG_BUFFER (5) and its size (6): the load error, as NVIDIA's JIT writes its log.
    char* buffer = nullptr;
    int sizeIndex = -1;
    for (unsigned i = 0; options && optionValues && i < numOptions; ++i) {
      if (options[i] == 5) buffer = static_cast<char*>(optionValues[i]);
      if (options[i] == 6) sizeIndex = static_cast<int>(i);
    }
    if (buffer && sizeIndex >= 0) {
      const size_t size = reinterpret_cast<uintptr_t>(optionValues[sizeIndex]);
      if (size > 0) {
        const size_t n = std::min(size - 1, r == kSuccess ? size_t(0) : log.size());
        std::memcpy(buffer, log.data(), n);
        buffer[n] = '\0';
        optionValues[sizeIndex] = reinterpret_cast<void*>(static_cast<uintptr_t>(n + 1));
      }
    }
    return r;
  });
}

KILN_CU_EXPORT CUresult cuModuleUnload(void* module) {
  return withContext([&](Context& c) { return c.unloadModule(module); }, false);
}

KILN_CU_EXPORT CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
  return withContext([&](Context& c) {
    if (!function || !name) return kErrorInvalidValue;
    std::shared_ptr<LoadedModule> m = c.module(module);
    if (!m) return kErrorInvalidHandle;
    for (const auto& k : m->kernels) {
      if (k->kernel->name == name) {
        *function = c.function(m, k.get());
        return kSuccess;
      }
    }
    return kErrorNotFound;
  });
}

KILN_CU_EXPORT CUresult cuFuncGetAttribute(int* value, int attribute, void* function) {
  return withContext([&](Context& c) {
    Function* f = c.findFunction(function);
    if (!f) return kErrorInvalidHandle;
    if (!value) return kErrorInvalidValue;
    const Kernel& k = *f->kernel->kernel;
    switch (attribute) {
      case 0: *value = k.maxThreads ? static_cast<int>(std::min<uint32_t>(k.maxThreads, 1024)) : 1024; break;
      case 1: *value = static_cast<int>(k.staticSharedBytes); break;
      case 2: *value = 0; break;
      case 3: *value = static_cast<int>(k.localBytes); break;
      case 4: *value = static_cast<int>(std::min<uint32_t>(255, std::max<uint32_t>(16, k.slotCount / 4))); break;
      case 5: *value = 90; break;
      case 6: *value = 150; break;
      case 8: *value = static_cast<int>(kMaxSharedPerBlock - k.staticSharedBytes); break;
      default: return kErrorInvalidValue;
    }
    return kSuccess;
  });
}

KILN_CU_EXPORT CUresult cuLaunchKernel(void* function, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                                       unsigned blockY, unsigned blockZ, unsigned sharedBytes, void* stream,
                                       void** kernelParams, void** extra) {
  return withContext([&](Context& c) {
    Function* f = c.findFunction(function);
    if (!f) return kErrorInvalidHandle;
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    const Kernel& k = *f->kernel->kernel;
    auto invalid = [&](const std::string& why) {
      reportFault(kErrorInvalidValue, "cuLaunchKernel of '" + k.name + "': " + why);
      return kErrorInvalidValue;
    };
    if (gridX == 0 || gridY == 0 || gridZ == 0 || gridX > 2147483647u || gridY > 65535 || gridZ > 65535)
      return invalid("grid " + std::to_string(gridX) + "x" + std::to_string(gridY) + "x" + std::to_string(gridZ));
    const uint64_t threads = static_cast<uint64_t>(blockX) * blockY * blockZ;
    if (blockX == 0 || blockY == 0 || blockZ == 0 || blockX > 1024 || blockY > 1024 || blockZ > 64 || threads > 1024)
      return invalid("block " + std::to_string(blockX) + "x" + std::to_string(blockY) + "x" + std::to_string(blockZ) +
                     " (at most 1024 threads)");
    if (k.maxThreads && threads > k.maxThreads)
      return invalid(std::to_string(threads) + " threads, more than the kernel's .maxntid/.reqntid " +
                     std::to_string(k.maxThreads));
    if (k.reqntid[0] && (blockX != k.reqntid[0] || blockY != k.reqntid[1] || blockZ != k.reqntid[2]))
      return invalid("the block differs from the kernel's .reqntid");
    if (static_cast<uint64_t>(k.staticSharedBytes) + sharedBytes > kMaxSharedPerBlock)
      return invalid(std::to_string(k.staticSharedBytes) + " bytes of static and " + std::to_string(sharedBytes) +
                     " of dynamic shared memory (at most " + std::to_string(kMaxSharedPerBlock) + ")");
    std::vector<uint8_t> params(k.paramBytes);
    if (kernelParams) {
      for (size_t i = 0; i < k.params.size(); ++i) {
        if (!kernelParams[i]) return invalid("kernelParams[" + std::to_string(i) + "] is null");
        std::memcpy(params.data() + k.params[i].offset, kernelParams[i], k.params[i].bytes);
      }
    } else if (extra) {
      // CU_LAUNCH_PARAM_BUFFER_POINTER (1), CU_LAUNCH_PARAM_BUFFER_SIZE (2), CU_LAUNCH_PARAM_END (0).
      const void* buffer = nullptr;
      size_t size = 0;
      for (size_t i = 0; extra[i] != nullptr; i += 2) {
        if (extra[i] == reinterpret_cast<void*>(1))
          buffer = extra[i + 1];
        else if (extra[i] == reinterpret_cast<void*>(2))
          size = *static_cast<const size_t*>(extra[i + 1]);
        else
          return invalid("unknown entry in extra");
      }
      if (!buffer || size < k.paramBytes) return invalid("the parameter buffer is missing or too small");
      std::memcpy(params.data(), buffer, k.paramBytes);
    } else if (k.paramBytes) {
      return invalid("no parameters given");
    }
    LaunchShape shape;
    shape.grid[0] = gridX;
    shape.grid[1] = gridY;
    shape.grid[2] = gridZ;
    shape.block[0] = blockX;
    shape.block[1] = blockY;
    shape.block[2] = blockZ;
    shape.dynamicSharedBytes = sharedBytes;
    shape.orderSeed = c.launchOrderSeed();
    return c.enqueue(s, std::make_shared<KernelWork>(f->module, f->kernel, shape, std::move(params)));
  });
}

// ---------------------------------------------------------------------------
// Graphs

KILN_CU_EXPORT CUresult cuStreamBeginCapture_v2(void* stream, int mode) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    if (mode < 0 || mode > 2) return kErrorInvalidValue;
    return c.beginCapture(s, mode);
  });
}

KILN_CU_EXPORT CUresult cuStreamEndCapture(void* stream, void** graph) {
  return withContext(
      [&](Context& c) {
        std::shared_ptr<Stream> s = c.stream(stream);
        if (!s) return kErrorInvalidHandle;
        if (!graph) return kErrorInvalidValue;
        return c.endCapture(s, graph);
      },
      false);
}

KILN_CU_EXPORT CUresult cuStreamIsCapturing(void* stream, int* status) {
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    if (!status) return kErrorInvalidValue;
    *status = c.captureStatus(s);
    return kSuccess;
  });
}

KILN_CU_EXPORT CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
  return withContext([&](Context& c) {
    std::shared_ptr<Graph> g = c.graph(graph);
    if (!g) return kErrorInvalidHandle;
    if (!exec) return kErrorInvalidValue;
    *exec = c.instantiate(g);
    return kSuccess;
  });
}

KILN_CU_EXPORT CUresult cuGraphLaunch(void* exec, void* stream) {
  return withContext([&](Context& c) {
    std::shared_ptr<GraphExec> e = c.graphExec(exec);
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!e || !s) return kErrorInvalidHandle;
    return c.launchGraph(e, s);
  });
}

KILN_CU_EXPORT CUresult cuGraphExecDestroy(void* exec) {
  return withContext([&](Context& c) { return c.destroyGraphExec(exec); }, false);
}

KILN_CU_EXPORT CUresult cuGraphDestroy(void* graph) {
  return withContext([&](Context& c) { return c.destroyGraph(graph); }, false);
}

// ---------------------------------------------------------------------------
// Kiln's own entry points (EmulatorHooks.h)

extern "C" const char* kilnEmulatorDescription(void) { return kDescription; }

extern "C" const char* kilnEmulatorLastFault(void) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  return d.lastFault.c_str();
}

extern "C" int kilnEmulatorEnqueue(void* stream, void (*fn)(void* user), void* user, void (*destroy)(void* user)) {
  if (!fn) return kErrorInvalidValue;
  return withContext([&](Context& c) {
    std::shared_ptr<Stream> s = c.stream(stream);
    if (!s) return kErrorInvalidHandle;
    return c.enqueue(s, std::make_shared<HostWork>(fn, user, destroy));
  });
}

extern "C" void* kilnEmulatorTranslate(unsigned long long devicePtr, unsigned long long bytes) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (!d.context) return nullptr;
  return d.context->memory().translate(devicePtr, bytes ? bytes : 1);
}

extern "C" void kilnEmulatorFault(const char* message) {
  Driver& d = driver();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  const std::string text = message ? message : "fault in host work";
  if (d.context) {
    d.context->hostFault(text);
  } else {
    reportFault(kErrorIllegalAddress, text);
  }
}
