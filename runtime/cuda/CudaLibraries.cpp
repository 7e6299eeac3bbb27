// Opening the CUDA libraries with dlopen and resolving their entry points
// (CudaLibraries.h). Each loaded table is kept per library file for the life
// of the process, so repeated loads are cheap and a pointer handed out stays
// valid.
#include "runtime/cuda/CudaLibraries.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#ifndef KILN_CUDA_TOOLKIT_VERSION
#define KILN_CUDA_TOOLKIT_VERSION 0
#endif

namespace kiln::cuda {

namespace {

constexpr int kTargetCudaVersion = 13000;  // CUDA 13: what Kiln targets without a toolkit
constexpr const char* kDefaultToolkit = "/usr/local/cuda";

int targetMajor() { return requiredCudaVersion() / 1000; }

std::string lastDlError() {
  const char* message = dlerror();
  return message ? message : "unknown dlopen error";
}

/// The file the loader actually opened for `handle` (a name found on the
/// loader path becomes its full path).
std::string loadedPath(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0]) return map->l_name;
  return fallback;
}

/// Tables loaded so far, by library file; never freed. Each instance is a
/// function-local static made with `new` and never destroyed: a CudaContext in
/// another file's static map may still call through a table while the
/// process exits, after this file's statics would have been destroyed
/// (AddressSanitizer: heap-use-after-free in PinnedHostPool's destructor).
template <typename Table>
class LoadedTables {
 public:
  /// The table for `library`, made by `make` the first time.
  template <typename Make>
  Expected<const Table*> get(CudaLibrary library, Make make) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = tables_.find(library.path);
    if (it != tables_.end()) return static_cast<const Table*>(it->second.get());
    auto table = std::make_unique<Table>();
    table->library = std::move(library);
    KILN_TRY(make(*table));
    const Table* result = table.get();
    tables_.emplace(result->library.path, std::move(table));
    return result;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Table>> tables_;
};

/// Resolves `name` into the function pointer `slot`.
template <typename Fn>
Status resolve(const CudaLibrary& library, const char* name, Fn*& slot) {
  auto address = library.symbol(name);
  if (!address) return address.takeError();
  slot = reinterpret_cast<Fn*>(*address);
  return Status::success();
}

std::string soname(const std::string& stem) { return stem + ".so." + std::to_string(targetMajor()); }

}  // namespace

int builtAgainstCudaVersion() { return KILN_CUDA_TOOLKIT_VERSION; }

int requiredCudaVersion() { return builtAgainstCudaVersion() > 0 ? builtAgainstCudaVersion() : kTargetCudaVersion; }

std::string formatCudaVersion(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

LibrarySearchOptions LibrarySearchOptions::fromEnvironment() {
  LibrarySearchOptions options;
  if (const char* driver = std::getenv("KILN_CUDA_DRIVER")) options.driverPath = driver;
  if (const char* home = std::getenv("CUDA_HOME")) options.cudaHome = home;
  return options;
}

Expected<void*> CudaLibrary::symbol(const char* name) const {
  dlerror();
  void* address = dlsym(handle, name);
  if (!address)
    return Error(description + " at " + path + " lacks the entry point " + name + " (" + lastDlError() +
                 "); it is too old or not the library Kiln expects");
  return address;
}

Expected<CudaLibrary> openCudaLibrary(const LibrarySpec& spec, const LibrarySearchOptions& options) {
  // Each attempt: the string passed to dlopen and how to describe where it is.
  std::vector<std::pair<std::string, std::string>> attempts;
  if (spec.driver && !options.driverPath.empty()) {
    attempts.push_back({options.driverPath, "(from $KILN_CUDA_DRIVER or the driver path given)"});
  } else if (!spec.driver && !options.onlyFolder.empty()) {
    for (const std::string& name : spec.names)
      attempts.push_back({options.onlyFolder + "/" + name, "(the emulated GPU's folder)"});
  } else {
    for (const std::string& name : spec.names) {
      attempts.push_back({name, "on the loader path (LD_LIBRARY_PATH, ldconfig cache)"});
      if (spec.driver) continue;
      if (!options.cudaHome.empty()) attempts.push_back({options.cudaHome + "/lib64/" + name, "($CUDA_HOME/lib64)"});
      if (options.searchDefaultToolkit && options.cudaHome != kDefaultToolkit)
        attempts.push_back({std::string(kDefaultToolkit) + "/lib64/" + name, ""});
    }
  }
  std::string tried;
  for (const auto& [file, where] : attempts) {
    dlerror();
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) return CudaLibrary{spec.description, loadedPath(handle, file), handle};
    tried += "\n  " + file + (where.empty() ? "" : " " + where) + ": " + lastDlError();
  }
  std::string message = spec.description + " could not be loaded; tried:" + tried;
  if (!spec.driver && options.cudaHome.empty())
    message += "\n  ($CUDA_HOME is not set: set it to a CUDA toolkit to search there too)";
  if (!spec.hint.empty()) message += "\n" + spec.hint;
  return Error(message);
}

// ---------------------------------------------------------------------------
// NVRTC

std::string NvrtcApi::errorString(nvrtcResult result) const {
  const char* text = nvrtcGetErrorString ? nvrtcGetErrorString(result) : nullptr;
  return text ? text : "NVRTC error " + std::to_string(result);
}

std::string NvrtcApi::version() const {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

std::vector<int> NvrtcApi::supportedArchs() const {
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0 || count > 1024) return {};
  std::vector<int> archs(static_cast<size_t>(count));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
  return archs;
}

Expected<const NvrtcApi*> loadNvrtc(const LibrarySearchOptions& options) {
  static auto& tables = *new LoadedTables<NvrtcApi>;
  LibrarySpec spec{"NVRTC (the CUDA runtime compiler, " + soname("libnvrtc") + ")",
                   {soname("libnvrtc"), "libnvrtc.so"},
                   false,
                   "Install the CUDA " + std::to_string(targetMajor()) +
                       " toolkit's NVRTC (NVIDIA's cuda-nvrtc package) or set CUDA_HOME to a toolkit that has it."};
  auto library = openCudaLibrary(spec, options);
  if (!library) return library.takeError();
  return tables.get(std::move(*library), [](NvrtcApi& api) -> Status {
    const CudaLibrary& l = api.library;
    KILN_TRY(resolve(l, "nvrtcGetErrorString", api.nvrtcGetErrorString));
    KILN_TRY(resolve(l, "nvrtcVersion", api.nvrtcVersion));
    KILN_TRY(resolve(l, "nvrtcGetNumSupportedArchs", api.nvrtcGetNumSupportedArchs));
    KILN_TRY(resolve(l, "nvrtcGetSupportedArchs", api.nvrtcGetSupportedArchs));
    KILN_TRY(resolve(l, "nvrtcCreateProgram", api.nvrtcCreateProgram));
    KILN_TRY(resolve(l, "nvrtcDestroyProgram", api.nvrtcDestroyProgram));
    KILN_TRY(resolve(l, "nvrtcCompileProgram", api.nvrtcCompileProgram));
    KILN_TRY(resolve(l, "nvrtcGetPTXSize", api.nvrtcGetPTXSize));
    KILN_TRY(resolve(l, "nvrtcGetPTX", api.nvrtcGetPTX));
    KILN_TRY(resolve(l, "nvrtcGetCUBINSize", api.nvrtcGetCUBINSize));
    KILN_TRY(resolve(l, "nvrtcGetCUBIN", api.nvrtcGetCUBIN));
    KILN_TRY(resolve(l, "nvrtcGetProgramLogSize", api.nvrtcGetProgramLogSize));
    KILN_TRY(resolve(l, "nvrtcGetProgramLog", api.nvrtcGetProgramLog));
    return Status::success();
  });
}

// ---------------------------------------------------------------------------
// The driver API

std::string CudaDriverApi::errorString(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName && cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (cuGetErrorString && cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  std::string out = name ? name : "CUDA error " + std::to_string(result);
  if (text) out += std::string(" (") + text + ")";
  return out;
}

Expected<const CudaDriverApi*> loadCudaDriver(const LibrarySearchOptions& options) {
  static auto& tables = *new LoadedTables<CudaDriverApi>;
  LibrarySpec spec{
      "the CUDA driver library (libcuda.so.1)",
      {"libcuda.so.1"},
      true,
      "libcuda.so.1 comes with the NVIDIA driver: install the driver (nvidia-smi should then list the GPU); "
      "in a container, start it with the GPU exposed (docker run --gpus all)."};
  auto library = openCudaLibrary(spec, options);
  if (!library) return library.takeError();
  return tables.get(std::move(*library), [](CudaDriverApi& api) -> Status {
    const CudaLibrary& l = api.library;
    KILN_TRY(resolve(l, "cuGetErrorName", api.cuGetErrorName));
    KILN_TRY(resolve(l, "cuGetErrorString", api.cuGetErrorString));
    KILN_TRY(resolve(l, "cuInit", api.cuInit));
    KILN_TRY(resolve(l, "cuDriverGetVersion", api.cuDriverGetVersion));
    KILN_TRY(resolve(l, "cuDeviceGetCount", api.cuDeviceGetCount));
    KILN_TRY(resolve(l, "cuDeviceGet", api.cuDeviceGet));
    KILN_TRY(resolve(l, "cuDeviceGetName", api.cuDeviceGetName));
    KILN_TRY(resolve(l, "cuDeviceGetAttribute", api.cuDeviceGetAttribute));
    KILN_TRY(resolve(l, "cuDeviceTotalMem_v2", api.cuDeviceTotalMem));
    KILN_TRY(resolve(l, "cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain));
    KILN_TRY(resolve(l, "cuDevicePrimaryCtxRelease_v2", api.cuDevicePrimaryCtxRelease));
    KILN_TRY(resolve(l, "cuCtxSetCurrent", api.cuCtxSetCurrent));
    KILN_TRY(resolve(l, "cuMemGetInfo_v2", api.cuMemGetInfo));
    return Status::success();
  });
}

Expected<const CudaExecApi*> loadCudaExec(const LibrarySearchOptions& options) {
  static auto& tables = *new LoadedTables<CudaExecApi>;
  auto driver = loadCudaDriver(options);
  if (!driver) return driver.takeError();
  return tables.get((*driver)->library, [](CudaExecApi& api) -> Status {
    const CudaLibrary& l = api.library;
    KILN_TRY(resolve(l, "cuCtxGetCurrent", api.cuCtxGetCurrent));
    KILN_TRY(resolve(l, "cuCtxSynchronize", api.cuCtxSynchronize));
    KILN_TRY(resolve(l, "cuMemAlloc_v2", api.cuMemAlloc));
    KILN_TRY(resolve(l, "cuMemFree_v2", api.cuMemFree));
    KILN_TRY(resolve(l, "cuMemHostAlloc", api.cuMemHostAlloc));
    KILN_TRY(resolve(l, "cuMemFreeHost", api.cuMemFreeHost));
    KILN_TRY(resolve(l, "cuMemcpyHtoDAsync_v2", api.cuMemcpyHtoDAsync));
    KILN_TRY(resolve(l, "cuMemcpyDtoHAsync_v2", api.cuMemcpyDtoHAsync));
    KILN_TRY(resolve(l, "cuMemcpyDtoDAsync_v2", api.cuMemcpyDtoDAsync));
    KILN_TRY(resolve(l, "cuMemsetD8Async", api.cuMemsetD8Async));
    KILN_TRY(resolve(l, "cuStreamCreate", api.cuStreamCreate));
    KILN_TRY(resolve(l, "cuStreamDestroy_v2", api.cuStreamDestroy));
    KILN_TRY(resolve(l, "cuStreamSynchronize", api.cuStreamSynchronize));
    KILN_TRY(resolve(l, "cuStreamWaitEvent", api.cuStreamWaitEvent));
    KILN_TRY(resolve(l, "cuEventCreate", api.cuEventCreate));
    KILN_TRY(resolve(l, "cuEventRecord", api.cuEventRecord));
    KILN_TRY(resolve(l, "cuEventSynchronize", api.cuEventSynchronize));
    KILN_TRY(resolve(l, "cuEventDestroy_v2", api.cuEventDestroy));
    // The unversioned name, which every driver Kiln supports exports.
    KILN_TRY(resolve(l, "cuEventElapsedTime", api.cuEventElapsedTime));
    KILN_TRY(resolve(l, "cuModuleLoadData", api.cuModuleLoadData));
    KILN_TRY(resolve(l, "cuModuleUnload", api.cuModuleUnload));
    KILN_TRY(resolve(l, "cuModuleGetFunction", api.cuModuleGetFunction));
    KILN_TRY(resolve(l, "cuFuncGetAttribute", api.cuFuncGetAttribute));
    KILN_TRY(resolve(l, "cuLaunchKernel", api.cuLaunchKernel));
    KILN_TRY(resolve(l, "cuStreamBeginCapture_v2", api.cuStreamBeginCapture));
    KILN_TRY(resolve(l, "cuStreamEndCapture", api.cuStreamEndCapture));
    KILN_TRY(resolve(l, "cuGraphInstantiateWithFlags", api.cuGraphInstantiateWithFlags));
    KILN_TRY(resolve(l, "cuGraphLaunch", api.cuGraphLaunch));
    KILN_TRY(resolve(l, "cuGraphExecDestroy", api.cuGraphExecDestroy));
    KILN_TRY(resolve(l, "cuGraphDestroy", api.cuGraphDestroy));
    return Status::success();
  });
}

std::string emulatorDescription(const CudaDriverApi& driver) {
  void* entry = dlsym(driver.library.handle, "kilnEmulatorDescription");
  if (!entry) return "";
  const char* text = reinterpret_cast<const char* (*)()>(entry)();
  return text ? text : "Kiln's emulated GPU";
}

LibrarySearchOptions mathLibraryOptions(const LibrarySearchOptions& options) {
  LibrarySearchOptions result = options;
  if (options.driverPath.empty()) return result;
  auto driver = loadCudaDriver(options);
  if (!driver || emulatorDescription(**driver).empty()) return result;
  const std::string& path = (*driver)->library.path;
  const size_t slash = path.rfind('/');
  result.onlyFolder = slash == std::string::npos ? "." : path.substr(0, slash);
  return result;
}

// ---------------------------------------------------------------------------
// cuBLAS, cuBLASLt, cuDNN

namespace {

/// "13.1.0" from a MAJOR*10000 + MINOR*100 + PATCH number (cuBLAS, cuDNN 9).
std::string formatLibraryVersion(size_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100);
}

std::string mathLibraryHint(const std::string& what) {
  return "Install the CUDA " + std::to_string(targetMajor()) + " " + what +
         " or set CUDA_HOME to a toolkit that has it.";
}

}  // namespace

Expected<const CudaMathLibrary*> loadCublas(const LibrarySearchOptions& options) {
  static auto& tables = *new LoadedTables<CudaMathLibrary>;
  LibrarySpec spec{"cuBLAS (" + soname("libcublas") + ")",
                   {soname("libcublas"), "libcublas.so"},
                   false,
                   mathLibraryHint("toolkit's cuBLAS (NVIDIA's libcublas package)")};
  auto library = openCudaLibrary(spec, options);
  if (!library) return library.takeError();
  return tables.get(std::move(*library), [](CudaMathLibrary& math) -> Status {
    // cublasStatus_t cublasGetProperty(libraryPropertyType, int*): MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2.
    int (*getProperty)(int, int*) = nullptr;
    KILN_TRY(resolve(math.library, "cublasGetProperty", getProperty));
    int major = 0, minor = 0, patch = 0;
    if (getProperty(0, &major) != 0 || getProperty(1, &minor) != 0 || getProperty(2, &patch) != 0)
      return Error("cuBLAS at " + math.library.path + " did not report its version (cublasGetProperty failed)");
    math.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    return Status::success();
  });
}

Expected<const CudaMathLibrary*> loadCublasLt(const LibrarySearchOptions& options) {
  static auto& tables = *new LoadedTables<CudaMathLibrary>;
  LibrarySpec spec{"cuBLASLt (" + soname("libcublasLt") + ")",
                   {soname("libcublasLt"), "libcublasLt.so"},
                   false,
                   mathLibraryHint("toolkit's cuBLASLt (NVIDIA's libcublas package)")};
  auto library = openCudaLibrary(spec, options);
  if (!library) return library.takeError();
  return tables.get(std::move(*library), [](CudaMathLibrary& math) -> Status {
    size_t (*getVersion)() = nullptr;
    KILN_TRY(resolve(math.library, "cublasLtGetVersion", getVersion));
    math.version = formatLibraryVersion(getVersion());
    return Status::success();
  });
}

Expected<const CudaMathLibrary*> loadCudnn(const LibrarySearchOptions& options) {
  static auto& tables = *new LoadedTables<CudaMathLibrary>;
  LibrarySpec spec{"cuDNN (libcudnn.so.9)",
                   {"libcudnn.so.9", "libcudnn.so"},
                   false,
                   "cuDNN is optional: convolutions then use Kiln's own kernels. To use it, install cuDNN 9 for "
                   "CUDA " +
                       std::to_string(targetMajor()) + " or set CUDA_HOME to a toolkit that has it."};
  auto library = openCudaLibrary(spec, options);
  if (!library) return library.takeError();
  return tables.get(std::move(*library), [](CudaMathLibrary& math) -> Status {
    size_t (*getVersion)() = nullptr;
    KILN_TRY(resolve(math.library, "cudnnGetVersion", getVersion));
    math.version = formatLibraryVersion(getVersion());
    return Status::success();
  });
}

Expected<const CudaMathLibrary*> loadNccl(const LibrarySearchOptions& options) {
  static auto& tables = *new LoadedTables<CudaMathLibrary>;
  LibrarySpec spec{"NCCL (libnccl.so.2)",
                   {"libnccl.so.2", "libnccl.so"},
                   false,
                   "NCCL is needed for data-parallel training on CUDA (mpirun -np N kiln train --device cuda). "
                   "Install NVIDIA's NCCL 2 (libnccl2) for CUDA " +
                       std::to_string(targetMajor()) + ", or set CUDA_HOME to a toolkit that has it."};
  auto library = openCudaLibrary(spec, options);
  if (!library) return library.takeError();
  return tables.get(std::move(*library), [](CudaMathLibrary& math) -> Status {
    int (*getVersion)(int*) = nullptr;
    KILN_TRY(resolve(math.library, "ncclGetVersion", getVersion));
    int v = 0;
    if (getVersion(&v) != 0) return Error("NCCL at " + math.library.path + " did not report its version");
    // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
    math.version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    return Status::success();
  });
}

}  // namespace kiln::cuda
