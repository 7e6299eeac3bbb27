// Run-time loading of the CUDA libraries: the driver API (libcuda.so.1),
// NVRTC, cuBLAS, cuBLASLt and cuDNN are opened with dlopen when first asked
// for, never linked, so that one `kiln` binary runs on machines with and
// without a GPU and can say exactly which piece is missing. Kiln does not
// include cuda.h or nvrtc.h (they are not Debian packages); it declares here
// the few entry points and types it calls, with the ABI NVIDIA documents.
//
// Search order. The driver (libcuda.so.1) is installed with the NVIDIA
// driver, so only the loader path is searched (LD_LIBRARY_PATH, the ldconfig
// cache); the toolkit's lib64/stubs/libcuda.so is a link-time stub and is
// never used. An explicit driver path (`LibrarySearchOptions::driverPath`,
// which the tools take from $KILN_CUDA_DRIVER for tests and diagnosis)
// replaces that search. The toolkit libraries are looked for on the loader
// path, then in $CUDA_HOME/lib64, then in /usr/local/cuda/lib64, first by
// the soname of the CUDA major version Kiln targets (libnvrtc.so.13), then
// by the unversioned development name (libnvrtc.so).
//
// Every failure is an Error naming the library, each place tried and
// dlerror's text there; a library that opens but lacks an entry point names
// the symbol. Libraries stay loaded for the life of the process.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ir/Support.h"

namespace kiln::cuda {

/// The CUDA version Kiln was built against, as CUDA_VERSION spells it
/// (13000 for 13.0); 0 when CMake found no toolkit.
int builtAgainstCudaVersion();
/// The CUDA version Kiln requires of the driver: the built-against version,
/// or 13000 (the CUDA 13 that Kiln targets) when built without a toolkit.
int requiredCudaVersion();
/// "13.0" for 13000; "none" for 0.
std::string formatCudaVersion(int version);

/// Where to look for the CUDA libraries. Passed in, so that tests and tools
/// choose; `fromEnvironment()` is what the `kiln` tool uses.
struct LibrarySearchOptions {
  /// The driver library to open instead of searching for libcuda.so.1.
  std::string driverPath;
  /// The CUDA toolkit root searched after the loader path ($CUDA_HOME).
  std::string cudaHome;
  /// Also search /usr/local/cuda/lib64 (tests turn it off).
  bool searchDefaultToolkit = true;
  /// When set, the toolkit libraries are looked for in this folder only
  /// (the emulated GPU's, see mathLibraryOptions).
  std::string onlyFolder;

  /// driverPath from $KILN_CUDA_DRIVER, cudaHome from $CUDA_HOME.
  static LibrarySearchOptions fromEnvironment();
};

/// A shared library opened by dlopen, and where it came from.
struct CudaLibrary {
  std::string description;  // "NVRTC", "the CUDA driver"
  std::string path;         // the file the loader opened
  void* handle = nullptr;
  /// The address of `symbol`, or an error naming it and this library.
  Expected<void*> symbol(const char* name) const;
};

/// How to find one library: a description for messages and the file names
/// to try, most specific first.
struct LibrarySpec {
  std::string description;
  std::vector<std::string> names;
  bool driver = false;  // search the loader path only (or driverPath)
  std::string hint;     // what to do when it is missing, appended to the error
};

/// Opens the library `spec` describes, searching as the file comment says.
/// The error lists every place tried with dlerror's text.
Expected<CudaLibrary> openCudaLibrary(const LibrarySpec& spec, const LibrarySearchOptions& options);

// ---------------------------------------------------------------------------
// NVRTC: CUDA C++ to PTX and CUBIN, usable without a GPU.

using nvrtcResult = int;  // enum nvrtcResult; 0 is NVRTC_SUCCESS
constexpr nvrtcResult NVRTC_SUCCESS = 0;
struct NvrtcProgramState;  // struct _nvrtcProgram, opaque
using nvrtcProgram = NvrtcProgramState*;

/// NVRTC's entry points, with the signatures of nvrtc.h.
struct NvrtcApi {
  CudaLibrary library;
  const char* (*nvrtcGetErrorString)(nvrtcResult result);
  nvrtcResult (*nvrtcVersion)(int* major, int* minor);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int* numArchs);
  nvrtcResult (*nvrtcGetSupportedArchs)(int* supportedArchs);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram* prog, const char* src, const char* name, int numHeaders,
                                    const char* const* headers, const char* const* includeNames);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram* prog);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram prog, int numOptions, const char* const* options);
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram prog, size_t* ptxSizeRet);
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram prog, char* ptx);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram prog, size_t* cubinSizeRet);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram prog, char* cubin);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram prog, size_t* logSizeRet);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram prog, char* log);

  /// `NVRTC_ERROR_COMPILATION` for a result code.
  std::string errorString(nvrtcResult result) const;
  /// "13.0" from nvrtcVersion.
  std::string version() const;
  /// The virtual architectures this NVRTC compiles for (75, 80, 86, 90, ...).
  std::vector<int> supportedArchs() const;
};

/// Loads NVRTC once per process (later calls return the same table; a
/// failure is retried on the next call).
Expected<const NvrtcApi*> loadNvrtc(const LibrarySearchOptions& options = LibrarySearchOptions::fromEnvironment());

// ---------------------------------------------------------------------------
// The driver API: devices, contexts, memory. Types and constants as cuda.h
// declares them for CUDA 12 and 13 (the _v2 entry points cuda.h maps to).

using CUresult = int;  // enum cudaError_enum
using CUdevice = int;
struct CudaContextState;  // struct CUctx_st, opaque
using CUcontext = CudaContextState*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_INSUFFICIENT_DRIVER = 35;
constexpr CUresult CUDA_ERROR_DEVICE_UNAVAILABLE = 46;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216;
constexpr CUresult CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803;
constexpr CUresult CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804;

/// CUdevice_attribute values Kiln reads.
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
/// CUcomputemode values.
constexpr int CU_COMPUTEMODE_DEFAULT = 0;
constexpr int CU_COMPUTEMODE_PROHIBITED = 2;
constexpr int CU_COMPUTEMODE_EXCLUSIVE_PROCESS = 3;

/// The driver's entry points, with the signatures of cuda.h.
struct CudaDriverApi {
  CudaLibrary library;
  CUresult (*cuGetErrorName)(CUresult error, const char** str);
  CUresult (*cuGetErrorString)(CUresult error, const char** str);
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuDriverGetVersion)(int* driverVersion);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice dev);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice dev);
  CUresult (*cuDeviceTotalMem)(size_t* bytes, CUdevice dev);  // cuDeviceTotalMem_v2
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);  // cuDevicePrimaryCtxRelease_v2
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuMemGetInfo)(size_t* free, size_t* total);  // cuMemGetInfo_v2

  /// `CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)`, from the
  /// driver's own names, or the number when it has none.
  std::string errorString(CUresult result) const;
};

// The entry points that run work: memory, streams, events, modules,
// launches and CUDA graphs. Resolved separately from CudaDriverApi, which is
// all that device discovery (`kiln devices`) needs.

using CUdeviceptr = unsigned long long;
struct CudaStreamState;
using CUstream = CudaStreamState*;
struct CudaEventState;
using CUevent = CudaEventState*;
struct CudaModuleState;
using CUmodule = CudaModuleState*;
struct CudaFunctionState;
using CUfunction = CudaFunctionState*;
struct CudaGraphState;
using CUgraph = CudaGraphState*;
struct CudaGraphExecState;
using CUgraphExec = CudaGraphExecState*;

constexpr CUresult CUDA_ERROR_INVALID_PTX = 218;
constexpr CUresult CUDA_ERROR_NO_BINARY_FOR_GPU = 209;
constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
constexpr CUresult CUDA_ERROR_LAUNCH_FAILED = 719;

constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 2;
constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 1;
constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr int CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10;
constexpr int CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0;

struct CudaExecApi {
  CudaLibrary library;
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, size_t bytes);                     // cuMemAlloc_v2
  CUresult (*cuMemFree)(CUdeviceptr ptr);                                     // cuMemFree_v2
  CUresult (*cuMemHostAlloc)(void** ptr, size_t bytes, unsigned int flags);
  CUresult (*cuMemFreeHost)(void* ptr);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes, CUstream stream);        // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);  // _v2
  CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream);
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned int flags);
  CUresult (*cuStreamDestroy)(CUstream stream);  // _v2
  CUresult (*cuStreamSynchronize)(CUstream stream);
  CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);
  CUresult (*cuEventCreate)(CUevent* event, unsigned int flags);
  CUresult (*cuEventRecord)(CUevent event, CUstream stream);
  CUresult (*cuEventSynchronize)(CUevent event);
  CUresult (*cuEventDestroy)(CUevent event);  // _v2
  /// Milliseconds between two completed records of events created without
  /// CU_EVENT_DISABLE_TIMING (`kiln run --profile` on CUDA).
  CUresult (*cuEventElapsedTime)(float* ms, CUevent start, CUevent end);
  CUresult (*cuModuleLoadData)(CUmodule* module, const void* image);
  CUresult (*cuModuleUnload)(CUmodule module);
  CUresult (*cuModuleGetFunction)(CUfunction* function, CUmodule module, const char* name);
  CUresult (*cuFuncGetAttribute)(int* value, int attribute, CUfunction function);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                             unsigned blockY, unsigned blockZ, unsigned sharedBytes, CUstream stream,
                             void** kernelParams, void** extra);
  CUresult (*cuStreamBeginCapture)(CUstream stream, int mode);  // _v2
  CUresult (*cuStreamEndCapture)(CUstream stream, CUgraph* graph);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec* exec, CUgraph graph, unsigned long long flags);
  CUresult (*cuGraphLaunch)(CUgraphExec exec, CUstream stream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec exec);
  CUresult (*cuGraphDestroy)(CUgraph graph);
};

/// Opens the driver library and resolves its entry points; cuInit is not
/// called here (runtime/cuda/CudaDevices.h interprets its result). With an
/// explicit driverPath, only that file is opened.
Expected<const CudaDriverApi*> loadCudaDriver(
    const LibrarySearchOptions& options = LibrarySearchOptions::fromEnvironment());

/// The execution entry points of the same driver library that
/// loadCudaDriver opens (which is called first).
Expected<const CudaExecApi*> loadCudaExec(
    const LibrarySearchOptions& options = LibrarySearchOptions::fromEnvironment());

/// Kiln's emulated GPU (test/devices/emulator/) describes itself through an
/// entry point no NVIDIA driver has; empty for a real driver.
std::string emulatorDescription(const CudaDriverApi& driver);

// ---------------------------------------------------------------------------
// cuBLAS, cuBLASLt and cuDNN: opened on demand. Only their version entry
// points are resolved here; the matmul and convolution code that uses them
// resolves what it calls through CudaLibrary::symbol.

/// With the emulated GPU, the math libraries (cuBLASLt, cuDNN, NCCL) are
/// the emulator's own, from the driver's folder only: Kiln never mixes the
/// emulator with NVIDIA's libraries. These options say where to look.
LibrarySearchOptions mathLibraryOptions(const LibrarySearchOptions& options);

/// An opened math library and the version it reports ("13.0.0", "9.13.0").
struct CudaMathLibrary {
  CudaLibrary library;
  std::string version;
};

Expected<const CudaMathLibrary*> loadCublas(
    const LibrarySearchOptions& options = LibrarySearchOptions::fromEnvironment());
Expected<const CudaMathLibrary*> loadCublasLt(
    const LibrarySearchOptions& options = LibrarySearchOptions::fromEnvironment());
Expected<const CudaMathLibrary*> loadCudnn(
    const LibrarySearchOptions& options = LibrarySearchOptions::fromEnvironment());
/// NCCL (libnccl.so.2), for data-parallel training on CUDA
/// (runtime/cuda/NcclCollectives.h); the emulated GPU brings its own.
Expected<const CudaMathLibrary*> loadNccl(
    const LibrarySearchOptions& options = LibrarySearchOptions::fromEnvironment());

}  // namespace kiln::cuda
