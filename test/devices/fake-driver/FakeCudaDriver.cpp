// A fake CUDA driver library for tests on machines without a GPU: built as
// libcuda.so.1 (in <build>/test/fake-cuda/, test/devices/CMakeLists.txt; the
// real file is named libcuda.so.999.0.1, the fake driver release) and loaded by Kiln through
// $KILN_CUDA_DRIVER. It exports the driver API entry points Kiln calls
// (runtime/cuda/CudaLibraries.h) with their documented ABI, and
// $KILN_FAKE_CUDA chooses what it pretends:
//
//   h100 (default)       one NVIDIA H100 80GB HBM3, driver supporting CUDA 13.0
//   2xh100               two of them
//   no-device            cuInit fails with CUDA_ERROR_NO_DEVICE
//   insufficient-driver  cuInit fails with CUDA_ERROR_INSUFFICIENT_DRIVER
//   old-driver           one H100, but the driver supports only CUDA 12.4
//   stub                 cuInit fails with CUDA_ERROR_STUB_LIBRARY
//   mismatch             cuInit fails with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
//   oom                  one H100 whose context creation runs out of memory
//   2xh100-oom1          two H100s, the second out of memory
//   busy                 one H100 in exclusive-process mode held by another process
//
// Entry points called before cuInit succeeds fail with
// CUDA_ERROR_NOT_INITIALIZED, as the real driver's do. Built with
// KILN_FAKE_CUDA_WITHOUT_MEMINFO, cuMemGetInfo_v2 is left out, to test the
// message for a driver that lacks an entry point.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using CUresult = int;
using CUdevice = int;
struct FakeContext {
  int device;
};

constexpr CUresult kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3, kStubLibrary = 34,
                   kInsufficientDriver = 35, kDeviceUnavailable = 46, kNoDevice = 100, kInvalidDevice = 101,
                   kInvalidContext = 201, kSystemDriverMismatch = 803;

constexpr size_t kH100Memory = 85520809984;  // 81559 MiB, as an H100 80GB HBM3 reports
constexpr size_t kUsedMemory = 536870912;    // what another process holds: 512 MiB

FakeContext contexts[2] = {{0}, {1}};
FakeContext* current = nullptr;
bool initialized = false;

std::string scenario() {
  const char* s = std::getenv("KILN_FAKE_CUDA");
  return s && *s ? s : "h100";
}

int deviceCount() {
  std::string s = scenario();
  return s.rfind("2x", 0) == 0 ? 2 : 1;
}

bool validDevice(CUdevice dev) { return dev >= 0 && dev < deviceCount(); }

}  // namespace

extern "C" {

// NVRTC opens libcuda.so.1 too (the fake, once loaded) and asks it for an
// export table; the fake has none, as a driver too old for the request.
CUresult cuGetExportTable(const void** table, const void* id) {
  if (table) *table = nullptr;
  return 801;  // CUDA_ERROR_NOT_SUPPORTED
}

CUresult cuGetErrorName(CUresult error, const char** str) {
  switch (error) {
    case kSuccess: *str = "CUDA_SUCCESS"; return kSuccess;
    case kInvalidValue: *str = "CUDA_ERROR_INVALID_VALUE"; return kSuccess;
    case kOutOfMemory: *str = "CUDA_ERROR_OUT_OF_MEMORY"; return kSuccess;
    case kNotInitialized: *str = "CUDA_ERROR_NOT_INITIALIZED"; return kSuccess;
    case kStubLibrary: *str = "CUDA_ERROR_STUB_LIBRARY"; return kSuccess;
    case kInsufficientDriver: *str = "CUDA_ERROR_INSUFFICIENT_DRIVER"; return kSuccess;
    case kDeviceUnavailable: *str = "CUDA_ERROR_DEVICE_UNAVAILABLE"; return kSuccess;
    case kNoDevice: *str = "CUDA_ERROR_NO_DEVICE"; return kSuccess;
    case kInvalidDevice: *str = "CUDA_ERROR_INVALID_DEVICE"; return kSuccess;
    case kInvalidContext: *str = "CUDA_ERROR_INVALID_CONTEXT"; return kSuccess;
    case kSystemDriverMismatch: *str = "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"; return kSuccess;
    default: *str = nullptr; return kInvalidValue;
  }
}

CUresult cuGetErrorString(CUresult error, const char** str) {
  switch (error) {
    case kSuccess: *str = "no error"; return kSuccess;
    case kInvalidValue: *str = "invalid argument"; return kSuccess;
    case kOutOfMemory: *str = "out of memory"; return kSuccess;
    case kNotInitialized: *str = "initialization error"; return kSuccess;
    case kStubLibrary: *str = "CUDA driver is a stub library"; return kSuccess;
    case kInsufficientDriver: *str = "CUDA driver version is insufficient for CUDA runtime version"; return kSuccess;
    case kDeviceUnavailable: *str = "CUDA-capable device(s) is/are busy or unavailable"; return kSuccess;
    case kNoDevice: *str = "no CUDA-capable device is detected"; return kSuccess;
    case kInvalidDevice: *str = "invalid device ordinal"; return kSuccess;
    case kInvalidContext: *str = "invalid device context"; return kSuccess;
    case kSystemDriverMismatch:
      *str = "system has unsupported display driver / cuda driver combination";
      return kSuccess;
    default: *str = nullptr; return kInvalidValue;
  }
}

CUresult cuInit(unsigned int flags) {
  if (flags != 0) return kInvalidValue;
  std::string s = scenario();
  if (s == "no-device") return kNoDevice;
  if (s == "insufficient-driver") return kInsufficientDriver;
  if (s == "stub") return kStubLibrary;
  if (s == "mismatch") return kSystemDriverMismatch;
  initialized = true;
  return kSuccess;
}

CUresult cuDriverGetVersion(int* version) {
  if (!version) return kInvalidValue;
  std::string s = scenario();
  *version = s == "old-driver" || s == "insufficient-driver" ? 12040 : 13000;
  return kSuccess;
}

CUresult cuDeviceGetCount(int* count) {
  if (!initialized) return kNotInitialized;
  if (!count) return kInvalidValue;
  *count = deviceCount();
  return kSuccess;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!initialized) return kNotInitialized;
  if (!device) return kInvalidValue;
  if (!validDevice(ordinal)) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!initialized) return kNotInitialized;
  if (!validDevice(dev)) return kInvalidDevice;
  if (!name || len <= 0) return kInvalidValue;
  std::strncpy(name, "NVIDIA H100 80GB HBM3", static_cast<size_t>(len) - 1);
  name[len - 1] = '\0';
  return kSuccess;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice dev) {
  if (!initialized) return kNotInitialized;
  if (!validDevice(dev)) return kInvalidDevice;
  if (!value) return kInvalidValue;
  switch (attribute) {
    case 16: *value = 132; return kSuccess;                           // MULTIPROCESSOR_COUNT
    case 20: *value = scenario() == "busy" ? 3 : 0; return kSuccess;  // COMPUTE_MODE
    case 75: *value = 9; return kSuccess;                             // COMPUTE_CAPABILITY_MAJOR
    case 76: *value = 0; return kSuccess;                             // COMPUTE_CAPABILITY_MINOR
    default: return kInvalidValue;
  }
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (!initialized) return kNotInitialized;
  if (!validDevice(dev)) return kInvalidDevice;
  if (!bytes) return kInvalidValue;
  *bytes = kH100Memory;
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRetain(FakeContext** ctx, CUdevice dev) {
  if (!initialized) return kNotInitialized;
  if (!validDevice(dev)) return kInvalidDevice;
  if (!ctx) return kInvalidValue;
  std::string s = scenario();
  if (s == "oom" || (s == "2xh100-oom1" && dev == 1)) return kOutOfMemory;
  if (s == "busy") return kDeviceUnavailable;
  *ctx = &contexts[dev];
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (!initialized) return kNotInitialized;
  if (!validDevice(dev)) return kInvalidDevice;
  if (current == &contexts[dev]) current = nullptr;
  return kSuccess;
}

CUresult cuCtxSetCurrent(FakeContext* ctx) {
  if (!initialized) return kNotInitialized;
  current = ctx;
  return kSuccess;
}

#ifndef KILN_FAKE_CUDA_WITHOUT_MEMINFO
CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (!initialized) return kNotInitialized;
  if (!current) return kInvalidContext;
  if (!free || !total) return kInvalidValue;
  *total = kH100Memory;
  *free = kH100Memory - kUsedMemory * static_cast<size_t>(current->device + 1);
  return kSuccess;
}
#endif

}  // extern "C"
