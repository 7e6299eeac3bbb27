// `kiln devices`: is CUDA usable here? Like `nvidia-smi` plus
// `torch.cuda.is_available()`: the driver (file, release, the newest CUDA
// version it supports), the CUDA version Kiln was built for, each device
// (name, compute capability, multiprocessors, memory total and free,
// whether it can be used), the CUDA libraries Kiln loads at run time, and a
// plain verdict line. The answer comes from runtime/cuda/CudaDevices.h,
// the same probe `--device cuda` relies on, so the two always agree. The
// exit status is 0 only when CUDA is usable.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "runtime/cuda/CudaDevices.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "devices";

constexpr OptionSpec kOptions[] = {
    {"--json", "", "print one JSON object instead of the table"},
    {"--help", "", "show this help", false, "-h"},
};

/// One of the libraries loaded at run time: found (version, path) or why not.
struct LibraryStatus {
  std::string key;       // "nvrtc": the --json name
  std::string name;      // "NVRTC"
  bool required = true;  // cuDNN is optional
  bool found = false;
  std::string version, path, error;
};

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

/// NVRTC from the toolkit; the math libraries from where the driver wants
/// them (the emulated GPU brings its own, cuda::mathLibraryOptions). Kiln
/// calls cuBLASLt for matrix products; cuBLAS and cuDNN are optional.
std::vector<LibraryStatus> probeLibraries(const cuda::LibrarySearchOptions& options) {
  auto mathVersion = [](const cuda::CudaMathLibrary& l) { return l.version; };
  const cuda::LibrarySearchOptions math = cuda::mathLibraryOptions(options);
  return {
      libraryStatus("nvrtc", "NVRTC", true, cuda::loadNvrtc(options),
                    [](const cuda::NvrtcApi& api) { return api.version(); }),
      libraryStatus("cublas", "cuBLAS", false, cuda::loadCublas(math), mathVersion),
      libraryStatus("cublaslt", "cuBLASLt", true, cuda::loadCublasLt(math), mathVersion),
      libraryStatus("cudnn", "cuDNN", false, cuda::loadCudnn(math), mathVersion),
  };
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out = prefix;
  for (char c : text) {
    out += c;
    if (c == '\n') out += prefix;
  }
  return out;
}

std::string computeCapability(const cuda::CudaDeviceInfo& d) {
  return std::to_string(d.computeMajor) + "." + std::to_string(d.computeMinor);
}

/// The verdict, as `torch.cuda.is_available()` would answer it, with the reason.
std::string verdict(const cuda::CudaReport& report) {
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

void printTable(const cuda::CudaReport& report, const std::vector<LibraryStatus>& libraries) {
  std::ostream& out = std::cout;
  out << "driver:            "
      << (report.driverPath.empty() ? "none" : report.driverPath + " (release " + report.driverRelease + ")") << "\n";
  if (!report.emulated.empty())
    out << "emulated:          yes: " << report.emulated
        << " (chosen by $KILN_CUDA_DRIVER; it runs Kiln's PTX on the CPU, for tests, and is never a GPU)\n";
  out << "driver CUDA:       "
      << (report.driverCudaVersion
              ? cuda::formatCudaVersion(report.driverCudaVersion) + " (the newest CUDA version the driver supports)"
              : std::string("unknown"))
      << "\n";
  out << "Kiln built for:    CUDA " << cuda::formatCudaVersion(cuda::builtAgainstCudaVersion());
  if (cuda::builtAgainstCudaVersion() == 0)
    out << " (no toolkit at build time; needs a driver for CUDA "
        << cuda::formatCudaVersion(cuda::requiredCudaVersion()) << ")";
  out << "\n";
  out << "devices:           " << report.devices.size() << "\n";
  if (!report.devices.empty()) {
    size_t nameWidth = 4;
    for (const auto& d : report.devices) nameWidth = std::max(nameWidth, d.name.size());
    out << "\n"
        << std::left << std::setw(8) << "device" << std::setw(static_cast<int>(nameWidth) + 2) << "name" << std::setw(9)
        << "compute" << std::setw(5) << "SMs" << std::setw(14) << "memory total" << std::setw(13) << "memory free"
        << "status\n";
    for (const auto& d : report.devices) {
      out << std::setw(8) << ("cuda:" + std::to_string(d.index)) << std::setw(static_cast<int>(nameWidth) + 2) << d.name
          << std::setw(9) << computeCapability(d) << std::setw(5) << d.multiprocessors << std::setw(14)
          << cuda::formatBytes(d.totalBytes) << std::setw(13) << (d.freeBytes ? cuda::formatBytes(*d.freeBytes) : "-")
          << (d.usable() ? "usable" : cuda::cudaProblemName(d.problem)) << "\n";
    }
    out << std::right;
    for (const auto& d : report.devices)  // the verdict says the reason when it is the same
      if (!d.usable() && d.message != report.message) out << "  " << d.message << "\n";
  }
  out << "\nlibraries (loaded when a model is compiled or run):\n";
  for (const LibraryStatus& l : libraries) {
    out << "  " << std::left << std::setw(10) << l.name << std::right;
    if (l.found)
      out << std::left << std::setw(9) << l.version << std::right << l.path << "\n";
    else
      out << (l.required ? "missing" : "missing (optional)") << ":\n" << indent(l.error, "      ") << "\n";
  }
  out << "\n" << verdict(report) << "\n";
}

void printJson(const cuda::CudaReport& report, const std::vector<LibraryStatus>& libraries) {
  std::ostream& out = std::cout;
  out << "{\"cuda_available\": " << (report.usable() ? "true" : "false");
  out << ", \"problem\": " << (report.usable() ? "null" : jsonString(cuda::cudaProblemName(report.problem)));
  out << ", \"message\": " << (report.usable() ? "null" : jsonString(report.message));
  out << ", \"verdict\": " << jsonString(verdict(report));
  out << ", \"emulated\": " << (report.emulated.empty() ? "null" : jsonString(report.emulated));
  out << ", \"kiln_cuda_version\": " << jsonString(cuda::formatCudaVersion(cuda::builtAgainstCudaVersion()));
  out << ", \"required_cuda_version\": " << jsonString(cuda::formatCudaVersion(cuda::requiredCudaVersion()));
  if (report.driverPath.empty()) {
    out << ", \"driver\": null";
  } else {
    out << ", \"driver\": {\"path\": " << jsonString(report.driverPath)
        << ", \"release\": " << jsonString(report.driverRelease) << ", \"cuda_version\": "
        << (report.driverCudaVersion ? jsonString(cuda::formatCudaVersion(report.driverCudaVersion)) : "null") << "}";
  }
  out << ", \"devices\": [";
  for (size_t i = 0; i < report.devices.size(); ++i) {
    const auto& d = report.devices[i];
    out << (i ? ", " : "") << "{\"index\": " << d.index << ", \"name\": " << jsonString(d.name)
        << ", \"compute_capability\": " << jsonString(computeCapability(d))
        << ", \"multiprocessors\": " << d.multiprocessors << ", \"memory_total_bytes\": " << d.totalBytes
        << ", \"memory_free_bytes\": " << (d.freeBytes ? std::to_string(*d.freeBytes) : "null")
        << ", \"usable\": " << (d.usable() ? "true" : "false")
        << ", \"problem\": " << (d.usable() ? "null" : jsonString(cuda::cudaProblemName(d.problem)))
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
  out << "}}\n";
}

int run(const ParsedArgs& args) {
  if (!args.positionals().empty())
    return usageError(kName, "unexpected argument '" + args.positionals().front() + "': kiln devices takes no MODEL");
  cuda::LibrarySearchOptions options = cuda::LibrarySearchOptions::fromEnvironment();
  cuda::CudaReport report = cuda::probeCuda(options);
  std::vector<LibraryStatus> libraries = probeLibraries(options);
  if (args.has("--json"))
    printJson(report, libraries);
  else
    printTable(report, libraries);
  return report.usable() ? kExitOk : kExitError;
}

}  // namespace

const Command& devicesCommand() {
  static const Command command{
      kName,
      "show the CUDA driver, devices and libraries, and whether CUDA is usable",
      "[--json]",
      "Loads the NVIDIA driver (libcuda.so.1) and lists each CUDA device: name, compute capability,\n"
      "multiprocessors, memory total and free, and whether Kiln can use it. Shows the driver's release and\n"
      "the newest CUDA version it supports, the CUDA version Kiln was built for, and the CUDA libraries\n"
      "(NVRTC, cuBLAS, cuBLASLt, cuDNN) Kiln loads at run time. The last line is the verdict; when CUDA is\n"
      "not usable it says why (no driver, driver too old, no device, device busy or out of memory) and what\n"
      "to do. Exit status 0 only when CUDA is usable. $KILN_CUDA_DRIVER names a driver library to use instead\n"
      "of libcuda.so.1 (for tests and diagnosis).",
      kOptions,
      &run,
  };
  return command;
}

}  // namespace kiln::cli
