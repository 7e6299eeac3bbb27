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

#include "runtime/cuda/DeviceReport.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "devices";

constexpr OptionSpec kOptions[] = {
    {"--json", "", "print one JSON object instead of the table"},
    {"--help", "", "show this help", false, "-h"},
};

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out = prefix;
  for (char c : text) {
    out += c;
    if (c == '\n') out += prefix;
  }
  return out;
}

void printTable(const cuda::CudaReport& report, const std::vector<cuda::LibraryStatus>& libraries) {
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
          << std::setw(9) << cuda::computeCapability(d) << std::setw(5) << d.multiprocessors << std::setw(14)
          << cuda::formatBytes(d.totalBytes) << std::setw(13) << (d.freeBytes ? cuda::formatBytes(*d.freeBytes) : "-")
          << (d.usable() ? "usable" : cuda::cudaProblemName(d.problem)) << "\n";
    }
    out << std::right;
    for (const auto& d : report.devices)  // the verdict says the reason when it is the same
      if (!d.usable() && d.message != report.message) out << "  " << d.message << "\n";
  }
  out << "\nlibraries (loaded when a model is compiled or run):\n";
  for (const cuda::LibraryStatus& l : libraries) {
    out << "  " << std::left << std::setw(10) << l.name << std::right;
    if (l.found)
      out << std::left << std::setw(9) << l.version << std::right << l.path << "\n";
    else
      out << (l.required ? "missing" : "missing (optional)") << ":\n" << indent(l.error, "      ") << "\n";
  }
  out << "\n" << cuda::verdict(report) << "\n";
}

int run(const ParsedArgs& args) {
  if (!args.positionals().empty())
    return usageError(kName, "unexpected argument '" + args.positionals().front() + "': kiln devices takes no MODEL");
  cuda::LibrarySearchOptions options = cuda::LibrarySearchOptions::fromEnvironment();
  cuda::CudaReport report = cuda::probeCuda(options);
  std::vector<cuda::LibraryStatus> libraries = cuda::probeLibraries(options);
  if (args.has("--json"))
    std::cout << cuda::devicesJson(report, libraries) << "\n";
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
