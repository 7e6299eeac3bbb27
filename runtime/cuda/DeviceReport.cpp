// What `kiln devices` and kiln.devices() report (DeviceReport.h).
#include "runtime/cuda/DeviceReport.h"

#include <sstream>

#include "ir/Json.h"

namespace kiln::cuda {

namespace {

template <typename Table, typename Version>
LibraryStatus libraryStatus(std::string key, std::string name, bool required, Expected<const Table*> loaded,
                            Version version) {
  LibraryStatus status;
  status.key = std::move(key);
  status.name = std::move(name);
  status.required = required;
  if (!loaded) {
    status.error = loaded.error().message();
    return status;
  }
  status.found = true;
  status.version = version(**loaded);
  status.path = (*loaded)->library.path;
  return status;
}

}  // namespace

std::vector<LibraryStatus> probeLibraries(const LibrarySearchOptions& options) {
  auto mathVersion = [](const CudaMathLibrary& l) { return l.version; };
  const LibrarySearchOptions math = mathLibraryOptions(options);
  return {
      libraryStatus("nvrtc", "NVRTC", true, loadNvrtc(options),
                    [](const NvrtcApi& api) { return api.version(); }),
      libraryStatus("cublas", "cuBLAS", false, loadCublas(math), mathVersion),
      libraryStatus("cublaslt", "cuBLASLt", true, loadCublasLt(math), mathVersion),
      libraryStatus("cudnn", "cuDNN", false, loadCudnn(math), mathVersion),
      libraryStatus("nccl", "NCCL", false, loadNccl(math), mathVersion),
  };
}

std::string computeCapability(const CudaDeviceInfo& d) {
  return std::to_string(d.computeMajor) + "." + std::to_string(d.computeMinor);
}

std::string verdict(const CudaReport& report) {
  if (!report.usable()) return "CUDA available: no: " + report.message;
  std::vector<int> usable = report.usableDevices();
  std::string line = "CUDA available: yes: ";
  for (size_t i = 0; i < usable.size(); ++i)
    line += (i ? ", " : "") + std::string("cuda:") + std::to_string(usable[i]) + " (" +
            report.devices[static_cast<size_t>(usable[i])].name + ")";
  line += "; --device cuda uses cuda:" + std::to_string(usable.front());
  if (!report.emulated.empty()) line += " (emulated: " + report.emulated + ", a CPU running the PTX, not a GPU)";
  return line;
}

std::string devicesJson(const CudaReport& report, const std::vector<LibraryStatus>& libraries) {
  std::ostringstream out;
  out << "{\"cuda_available\": " << (report.usable() ? "true" : "false");
  out << ", \"problem\": " << (report.usable() ? "null" : jsonString(cudaProblemName(report.problem)));
  out << ", \"message\": " << (report.usable() ? "null" : jsonString(report.message));
  out << ", \"verdict\": " << jsonString(verdict(report));
  out << ", \"emulated\": " << (report.emulated.empty() ? "null" : jsonString(report.emulated));
  out << ", \"kiln_cuda_version\": " << jsonString(formatCudaVersion(builtAgainstCudaVersion()));
  out << ", \"required_cuda_version\": " << jsonString(formatCudaVersion(requiredCudaVersion()));
  if (report.driverPath.empty()) {
    out << ", \"driver\": null";
  } else {
    out << ", \"driver\": {\"path\": " << jsonString(report.driverPath)
        << ", \"release\": " << jsonString(report.driverRelease) << ", \"cuda_version\": "
        << (report.driverCudaVersion ? jsonString(formatCudaVersion(report.driverCudaVersion)) : "null") << "}";
  }
  out << ", \"devices\": [";
  for (size_t i = 0; i < report.devices.size(); ++i) {
    const auto& d = report.devices[i];
    out << (i ? ", " : "") << "{\"index\": " << d.index << ", \"name\": " << jsonString(d.name)
        << ", \"compute_capability\": " << jsonString(computeCapability(d))
        << ", \"multiprocessors\": " << d.multiprocessors << ", \"memory_total_bytes\": " << d.totalBytes
        << ", \"memory_free_bytes\": " << (d.freeBytes ? std::to_string(*d.freeBytes) : "null")
        << ", \"usable\": " << (d.usable() ? "true" : "false")
        << ", \"problem\": " << (d.usable() ? "null" : jsonString(cudaProblemName(d.problem)))
        << ", \"message\": " << (d.usable() ? "null" : jsonString(d.message)) << "}";
  }
  out << "], \"libraries\": {";
  for (size_t i = 0; i < libraries.size(); ++i) {
    const LibraryStatus& l = libraries[i];
    out << (i ? ", " : "") << jsonString(l.key) << ": {\"found\": " << (l.found ? "true" : "false")
        << ", \"required\": " << (l.required ? "true" : "false");
    if (l.found)
      out << ", \"version\": " << jsonString(l.version) << ", \"path\": " << jsonString(l.path) << "}";
    else
      out << ", \"error\": " << jsonString(l.error) << "}";
  }
  out << "}}";
  return out.str();
}

}  // namespace kiln::cuda
