// compileCudaProgram (CudaCompiler.h).
#include "codegen/cuda/CudaCompiler.h"

#include <algorithm>
#include <cstdint>

#include "codegen/cpu/CpuCompiler.h"
#include "codegen/cuda/CudaBackend.h"
#include "codegen/cuda/CudaEmitter.h"
#include "codegen/cuda/NvrtcCompiler.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::codegen {

std::vector<int> defaultCudaArchs(const cuda::NvrtcApi& nvrtc, int major, int minor, int* ptxArch) {
  if (major == 0) {
    *ptxArch = 90;
    return {90};
  }
  const int device = major * 10 + minor;
  const std::vector<int> archs = nvrtc.supportedArchs();
  if (std::find(archs.begin(), archs.end(), device) != archs.end()) {
    *ptxArch = device;
    return {device};
  }
  // A GPU newer than this NVRTC: PTX of the newest architecture it has
  // below the device's, for the driver to compile.
  int best = 0;
  for (int a : archs)
    if (a <= device) best = std::max(best, a);
  *ptxArch = best > 0 ? best : 75;
  return {};
}

Expected<CudaCompilation> compileCudaProgram(const Function& f, const cuda::NvrtcApi& nvrtc,
                                             const CudaCompileOptions& options,
                                             std::vector<std::string>* unsupported) {
  auto laid = layoutProgram(f, cudaBackend(), options.kernelPrefix, unsupported);
  if (!laid) return laid.takeError();
  CudaCompilation out;
  out.program = std::make_shared<cuda::CudaProgram>();
  cuda::CudaProgram& p = *out.program;
  p.plan = std::move(*laid->program);
  out.kernels = std::move(laid->kernels);
  out.plan = std::move(laid->plan);
  p.nvrtcVersion = nvrtc.version();
  if (!out.kernels.empty()) {
    auto source = emitCudaSource(out.kernels);
    if (!source) return source.takeError();
    for (const CudaLaunch& launch : source->launches) p.launches.push_back({launch.workItems, launch.blockSize});
    out.source = std::move(source->code);
    std::vector<int> archs = options.archs;
    std::sort(archs.begin(), archs.end());
    archs.erase(std::unique(archs.begin(), archs.end()), archs.end());
    std::vector<int> specific = options.specificArchs;
    std::sort(specific.begin(), specific.end());
    specific.erase(std::unique(specific.begin(), specific.end()), specific.end());
    // The PTX is for the oldest architecture asked for, specific or not (as
    // plain compute_XY PTX, which runs on any newer GPU).
    p.ptxArch = options.ptxArch;
    if (!archs.empty() || !specific.empty())
      p.ptxArch = std::min(archs.empty() ? INT32_MAX : archs.front(), specific.empty() ? INT32_MAX : specific.front());
    const std::string name = f.name() + ".cu";
    for (int arch : archs) {
      auto binary = compileCudaSource(nvrtc, out.source, name, arch);
      if (!binary) return binary.takeError();
      const size_t found = countKernelsInCubin(binary->cubin, p.plan.kernelNames);
      if (found != p.plan.kernelNames.size())
        return Error("the CUBIN NVRTC produced for sm_" + std::to_string(arch) + " defines " + std::to_string(found) +
                     " of the " + std::to_string(p.plan.kernelNames.size()) + " kernels of '" + f.name() + "'");
      if (arch == p.ptxArch) p.ptx = binary->ptx;
      out.log += binary->log;
      p.cubins.push_back({arch, false, std::move(binary->cubin)});
    }
    for (int arch : specific) {
      auto binary = compileCudaSource(nvrtc, out.source, name, arch, /*ptxOnly=*/false, /*archSpecific=*/true);
      if (!binary) return binary.takeError();
      const size_t found = countKernelsInCubin(binary->cubin, p.plan.kernelNames);
      if (found != p.plan.kernelNames.size())
        return Error("the CUBIN NVRTC produced for sm_" + std::to_string(arch) + "a defines " + std::to_string(found) +
                     " of the " + std::to_string(p.plan.kernelNames.size()) + " kernels of '" + f.name() + "'");
      out.log += binary->log;
      p.cubins.push_back({arch, true, std::move(binary->cubin)});
    }
    if (p.ptx.empty()) {
      auto binary = compileCudaSource(nvrtc, out.source, name, p.ptxArch, /*ptxOnly=*/true);
      if (!binary) return binary.takeError();
      p.ptx = std::move(binary->ptx);
      out.log += binary->log;
    }
  }
  KILN_TRY(p.validate());
  return out;
}

}  // namespace kiln::codegen
