// Device discovery and the reasons CUDA may be unusable (CudaDevices.h).
#include "runtime/cuda/CudaDevices.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

namespace kiln::cuda {

namespace {

/// What to do when cuInit finds no device.
std::string noDeviceAdvice() {
  std::string advice =
      "Check that nvidia-smi lists a GPU; in a container, start it with the GPU exposed (docker run --gpus all)";
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"))
    advice += "; CUDA_VISIBLE_DEVICES is set to '" + std::string(visible) + "', which may hide the devices";
  return advice + ". Use --device cpu to run on the CPU.";
}

/// "Kiln was built for CUDA 13.0" (or "needs" without a toolkit at build time).
std::string kilnCudaVersion() {
  return std::string(builtAgainstCudaVersion() > 0 ? "Kiln was built for" : "Kiln needs") + " CUDA " +
         formatCudaVersion(requiredCudaVersion());
}

std::string driverTooOldAdvice() {
  std::string advice = "Update the NVIDIA driver to one that supports CUDA " + formatCudaVersion(requiredCudaVersion());
  if (requiredCudaVersion() / 1000 == 13) advice += " (release 580 or newer)";
  return advice + ", or use --device cpu.";
}

/// The driver release, "580.65.06", from the real file name of the loaded
/// libcuda.so.1 (libcuda.so.580.65.06), else from the kernel module's
/// /proc/driver/nvidia/version; "unknown" otherwise.
std::string driverRelease(const std::string& libraryPath) {
  std::error_code error;
  std::filesystem::path real = std::filesystem::canonical(libraryPath, error);
  std::smatch match;
  static const std::regex kFileName(R"(libcuda\.so\.([0-9]+\.[0-9]+(\.[0-9]+)?)$)");
  if (!error) {
    std::string name = real.filename().string();
    if (std::regex_search(name, match, kFileName)) return match[1];
  }
  std::ifstream proc("/proc/driver/nvidia/version");
  std::string line;
  static const std::regex kModule(R"(Kernel Module\s+([0-9]+\.[0-9]+(\.[0-9]+)?))");
  if (proc && std::getline(proc, line) && std::regex_search(line, match, kModule)) return match[1];
  return "unknown";
}

std::string deviceLabel(const CudaDeviceInfo& device) {
  return "cuda:" + std::to_string(device.index) + " (" + (device.name.empty() ? "unnamed" : device.name) + ")";
}

/// Describes device `index`; with `createContext`, retains its primary
/// context to check that it is usable and to read its free memory.
CudaDeviceInfo describeDevice(const CudaDriverApi& api, int index, bool createContext) {
  CudaDeviceInfo info;
  info.index = index;
  CUdevice device = 0;
  if (CUresult r = api.cuDeviceGet(&device, index); r != CUDA_SUCCESS) {
    info.problem = CudaProblem::DeviceUnavailable;
    info.message = "cuda:" + std::to_string(index) + " could not be opened (cuDeviceGet: " + api.errorString(r) + ")";
    return info;
  }
  char name[256] = {};
  if (api.cuDeviceGetName(name, sizeof(name), device) == CUDA_SUCCESS) info.name = name;
  api.cuDeviceGetAttribute(&info.computeMajor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  api.cuDeviceGetAttribute(&info.computeMinor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  api.cuDeviceGetAttribute(&info.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
  api.cuDeviceGetAttribute(&info.computeMode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, device);
  size_t total = 0;
  if (api.cuDeviceTotalMem(&total, device) == CUDA_SUCCESS) info.totalBytes = total;
  if (!createContext) return info;

  if (info.computeMode == CU_COMPUTEMODE_PROHIBITED) {
    info.problem = CudaProblem::DeviceUnavailable;
    info.message = deviceLabel(info) +
                   " is in compute-prohibited mode: no process may use it. An administrator can allow it with "
                   "`nvidia-smi -i " +
                   std::to_string(index) + " -c DEFAULT`; or choose another device or --device cpu.";
    return info;
  }
  CUcontext context = nullptr;
  CUresult retained = api.cuDevicePrimaryCtxRetain(&context, device);
  if (retained == CUDA_ERROR_OUT_OF_MEMORY) {
    info.problem = CudaProblem::OutOfMemory;
    info.message = deviceLabel(info) + " is out of memory: creating a CUDA context failed (cuDevicePrimaryCtxRetain: " +
                   api.errorString(retained) +
                   "). Other processes hold its memory (nvidia-smi lists them); end them, or choose another device or "
                   "--device cpu.";
    return info;
  }
  if (retained != CUDA_SUCCESS) {
    info.problem = CudaProblem::DeviceUnavailable;
    info.message =
        deviceLabel(info) + " is busy or unavailable (cuDevicePrimaryCtxRetain: " + api.errorString(retained) + ")";
    if (info.computeMode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS)
      info.message +=
          "; it is in exclusive-process mode and another process is using it. Wait for that process "
          "(nvidia-smi lists it), or have an administrator run `nvidia-smi -i " +
          std::to_string(index) + " -c DEFAULT`";
    info.message += ". Choose another device, or use --device cpu.";
    return info;
  }
  size_t freeBytes = 0, totalBytes = 0;
  CUresult set = api.cuCtxSetCurrent(context);
  CUresult memory = set == CUDA_SUCCESS ? api.cuMemGetInfo(&freeBytes, &totalBytes) : set;
  if (memory == CUDA_SUCCESS) {
    info.freeBytes = freeBytes;
  } else if (memory == CUDA_ERROR_OUT_OF_MEMORY) {
    info.problem = CudaProblem::OutOfMemory;
    info.message = deviceLabel(info) + " is out of memory (cuMemGetInfo: " + api.errorString(memory) +
                   "); end the processes nvidia-smi lists, or choose another device or --device cpu.";
  } else {
    info.problem = CudaProblem::DeviceUnavailable;
    info.message = deviceLabel(info) + " does not answer (" +
                   std::string(set == CUDA_SUCCESS ? "cuMemGetInfo" : "cuCtxSetCurrent") + ": " +
                   api.errorString(memory) + "). Choose another device, or use --device cpu.";
  }
  api.cuCtxSetCurrent(nullptr);
  api.cuDevicePrimaryCtxRelease(device);
  return info;
}

}  // namespace

const char* cudaProblemName(CudaProblem problem) {
  switch (problem) {
    case CudaProblem::None: return "none";
    case CudaProblem::NoDriver: return "no-driver";
    case CudaProblem::DriverError: return "driver-error";
    case CudaProblem::DriverTooOld: return "driver-too-old";
    case CudaProblem::NoDevice: return "no-device";
    case CudaProblem::DeviceUnavailable: return "device-unavailable";
    case CudaProblem::OutOfMemory: return "out-of-memory";
  }
  return "unknown";
}

std::vector<int> CudaReport::usableDevices() const {
  std::vector<int> indices;
  for (const CudaDeviceInfo& device : devices)
    if (device.usable()) indices.push_back(device.index);
  return indices;
}

CudaReport probeCuda(const LibrarySearchOptions& options, std::optional<int> onlyDevice) {
  CudaReport report;
  auto loaded = loadCudaDriver(options);
  if (!loaded) {
    report.problem = CudaProblem::NoDriver;
    report.message = "no usable NVIDIA driver: " + loaded.error().message();
    return report;
  }
  const CudaDriverApi& api = **loaded;
  report.driverPath = api.library.path;
  report.driverRelease = driverRelease(api.library.path);
  report.emulated = emulatorDescription(api);
  if (api.cuDriverGetVersion(&report.driverCudaVersion) != CUDA_SUCCESS) report.driverCudaVersion = 0;

  CUresult init = api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const std::string call = " (cuInit: " + api.errorString(init) + ")";
    switch (init) {
      case CUDA_ERROR_NO_DEVICE:
        report.problem = CudaProblem::NoDevice;
        report.message = "the NVIDIA driver found no CUDA device" + call + ". " + noDeviceAdvice();
        break;
      case CUDA_ERROR_INSUFFICIENT_DRIVER:
        report.problem = CudaProblem::DriverTooOld;
        report.message = "the NVIDIA driver is too old: it supports CUDA " +
                         formatCudaVersion(report.driverCudaVersion) + ", " + kilnCudaVersion() + call + ". " +
                         driverTooOldAdvice();
        break;
      case CUDA_ERROR_STUB_LIBRARY:
        report.problem = CudaProblem::DriverError;
        report.message = report.driverPath + " is the CUDA toolkit's stub library, not a driver" + call +
                         ". Remove the toolkit's stubs folder from LD_LIBRARY_PATH and install the NVIDIA driver.";
        break;
      case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        report.problem = CudaProblem::DriverError;
        report.message = "the NVIDIA driver library (" + report.driverPath + ", release " + report.driverRelease +
                         ") does not match the loaded kernel module" + call +
                         ". Reboot after a driver update, or reinstall the driver.";
        break;
      case CUDA_ERROR_DEVICE_UNAVAILABLE:
        report.problem = CudaProblem::DeviceUnavailable;
        report.message = "every CUDA device is busy or unavailable" + call +
                         ". Wait for the processes nvidia-smi lists, or use --device cpu.";
        break;
      default:
        report.problem = CudaProblem::DriverError;
        report.message = "the NVIDIA driver (" + report.driverPath + ") failed to initialize" + call +
                         ". Check that nvidia-smi works; reinstalling the driver or rebooting may help.";
        break;
    }
    return report;
  }

  int count = 0;
  if (CUresult r = api.cuDeviceGetCount(&count); r != CUDA_SUCCESS || count <= 0) {
    report.problem = CudaProblem::NoDevice;
    report.message = "the NVIDIA driver found no CUDA device (cuDeviceGetCount: " +
                     (r == CUDA_SUCCESS ? std::string("0 devices") : api.errorString(r)) + "). " + noDeviceAdvice();
    return report;
  }
  for (int i = 0; i < count; ++i) report.devices.push_back(describeDevice(api, i, !onlyDevice || *onlyDevice == i));

  if (report.driverCudaVersion < requiredCudaVersion()) {
    report.problem = CudaProblem::DriverTooOld;
    report.message = "the NVIDIA driver is too old: it supports CUDA " + formatCudaVersion(report.driverCudaVersion) +
                     ", " + kilnCudaVersion() + ". " + driverTooOldAdvice();
    // The devices are there, but none can run what Kiln builds.
    for (CudaDeviceInfo& device : report.devices) {
      device.problem = CudaProblem::DriverTooOld;
      device.message = report.message;
    }
    return report;
  }
  if (onlyDevice) return report;  // requireCudaDevice judges the one device it asked for
  if (report.usableDevices().empty()) {
    report.problem = report.devices.front().problem;
    report.message = report.devices.front().message;
    for (size_t i = 1; i < report.devices.size(); ++i) report.message += " " + report.devices[i].message;
  }
  return report;
}

Expected<CudaDeviceInfo> requireCudaDevice(const LibrarySearchOptions& options, std::optional<int> index) {
  CudaReport report = probeCuda(options, index);
  if (!report.usable()) return Error("CUDA is not usable: " + report.message);
  if (!index) return report.devices[static_cast<size_t>(report.usableDevices().front())];
  int count = static_cast<int>(report.devices.size());
  if (*index < 0 || *index >= count)
    return Error("there is no CUDA device " + std::to_string(*index) + ": this machine has " + std::to_string(count) +
                 (count == 1 ? " device (cuda:0)" : " devices (cuda:0 to cuda:" + std::to_string(count - 1) + ")"));
  const CudaDeviceInfo& device = report.devices[static_cast<size_t>(*index)];
  if (!device.usable()) return Error("CUDA is not usable: " + device.message);
  return device;
}

std::string formatBytes(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace kiln::cuda
