// CudaProgram (CudaProgram.h): image selection and the code's bytes.
#include "runtime/cuda/CudaProgram.h"

#include "runtime/ByteIO.h"

namespace kiln::cuda {

std::string CudaImage::name() const { return "sm_" + std::to_string(arch) + (archSpecific ? "a" : ""); }

Status CudaProgram::validate() const {
  KILN_TRY(plan.validate());
  if (launches.size() != plan.kernelNames.size())
    return Error("CUDA program '" + plan.name + "' has " + std::to_string(launches.size()) + " launch sizes for " +
                 std::to_string(plan.kernelNames.size()) + " kernels");
  for (size_t i = 0; i < launches.size(); ++i)
    if (launches[i].workItems < 1 || launches[i].blockSize < 1 || launches[i].blockSize > 1024)
      return Error("CUDA program '" + plan.name + "': kernel " + plan.kernelNames[i] + " has work " +
                   std::to_string(launches[i].workItems) + " and block size " +
                   std::to_string(launches[i].blockSize) + " (expected work >= 1 and 1 to 1024 threads a block)");
  if (!plan.kernelNames.empty() && ptx.empty() && cubins.empty())
    return Error("CUDA program '" + plan.name + "' has kernels but neither CUBIN nor PTX");
  for (const CudaImage& image : cubins)
    if (image.arch < 10 || image.cubin.empty())
      return Error("CUDA program '" + plan.name + "' has an empty or unnamed CUBIN (" + image.name() + ")");
  return Status::success();
}

std::string ImageChoice::describe(const CudaProgram& program) const {
  if (cubin >= 0) return "CUBIN " + program.cubins[static_cast<size_t>(cubin)].name();
  return "PTX for sm_" + std::to_string(program.ptxArch) + ", compiled by the driver";
}

Expected<ImageChoice> selectCudaImage(const CudaProgram& program, int major, int minor) {
  const int device = major * 10 + minor;
  ImageChoice choice;
  int best = -1;
  for (size_t i = 0; i < program.cubins.size(); ++i) {
    const CudaImage& image = program.cubins[i];
    const bool fits = image.archSpecific ? image.arch == device
                                         : image.arch / 10 == major && image.arch % 10 <= minor;
    if (fits && image.arch > best) {
      best = image.arch;
      choice.cubin = static_cast<int>(i);
    }
  }
  if (choice.cubin >= 0) return choice;
  if (!program.ptx.empty() && program.ptxArch <= device) return choice;
  std::string held;
  for (const CudaImage& image : program.cubins) held += (held.empty() ? "CUBIN " : ", CUBIN ") + image.name();
  if (!program.ptx.empty()) held += (held.empty() ? "" : ", ") + std::string("PTX for sm_") + std::to_string(program.ptxArch);
  return Error("the compiled program '" + program.plan.name + "' cannot run on a GPU of compute capability " +
               std::to_string(major) + "." + std::to_string(minor) + " (sm_" + std::to_string(device) + "): it holds " +
               (held.empty() ? "no code" : held) + "; compile it again with --cuda-arch sm_" + std::to_string(device));
}

std::string serializeCudaCode(const CudaProgram& p) {
  std::string out;
  putString(out, p.nvrtcVersion);
  putLE(out, p.launches.size(), 4);
  for (const CudaKernelLaunch& l : p.launches) {
    putLE(out, static_cast<uint64_t>(l.workItems), 8);
    putLE(out, static_cast<uint64_t>(l.blockSize), 4);
  }
  putLE(out, p.cubins.size(), 4);
  for (const CudaImage& image : p.cubins) {
    putLE(out, static_cast<uint64_t>(image.arch), 4);
    putLE(out, image.archSpecific ? 1 : 0, 1);
    putLE(out, image.cubin.size(), 8);
    out += image.cubin;
  }
  putLE(out, static_cast<uint64_t>(p.ptxArch), 4);
  putLE(out, p.ptx.size(), 8);
  out += p.ptx;
  return out;
}

Status parseCudaCode(std::string_view bytes, const std::string& what, CudaProgram& p) {
  ByteReader r(bytes, what);
  auto version = r.string("the NVRTC version");
  if (!version) return version.takeError();
  p.nvrtcVersion = std::move(*version);
  auto launches = r.bounded(4, static_cast<int64_t>(r.remaining() / 12), "the number of kernels");
  if (!launches) return launches.takeError();
  for (int64_t i = 0; i < *launches; ++i) {
    auto work = r.uint(8, "a kernel's work size"), block = r.uint(4, "a kernel's block size");
    if (!work) return work.takeError();
    if (!block) return block.takeError();
    if (*work > static_cast<uint64_t>(INT64_MAX)) return r.error("corrupt: a kernel's work size");
    p.launches.push_back({static_cast<int64_t>(*work), static_cast<int>(*block)});
  }
  auto images = r.bounded(4, static_cast<int64_t>(r.remaining() / 17), "the number of CUBINs");
  if (!images) return images.takeError();
  for (int64_t i = 0; i < *images; ++i) {
    CudaImage image;
    auto arch = r.bounded(4, 1000, "a CUBIN's architecture");
    auto specific = r.bounded(1, 1, "a CUBIN's kind");
    if (!arch) return arch.takeError();
    if (!specific) return specific.takeError();
    auto size = r.uint(8, "a CUBIN's size");
    if (!size) return size.takeError();
    auto cubin = r.take(*size, "a CUBIN");
    if (!cubin) return cubin.takeError();
    image.arch = static_cast<int>(*arch);
    image.archSpecific = *specific != 0;
    image.cubin = std::string(*cubin);
    p.cubins.push_back(std::move(image));
  }
  auto ptxArch = r.bounded(4, 1000, "the PTX's architecture");
  if (!ptxArch) return ptxArch.takeError();
  p.ptxArch = static_cast<int>(*ptxArch);
  auto size = r.uint(8, "the PTX's size");
  if (!size) return size.takeError();
  auto ptx = r.take(*size, "the PTX");
  if (!ptx) return ptx.takeError();
  p.ptx = std::string(*ptx);
  if (r.remaining() != 0) return r.error("corrupt: " + std::to_string(r.remaining()) + " bytes after the PTX");
  return Status::success();
}

Expected<std::shared_ptr<CudaProgram>> cudaProgramOf(const CompiledArtifact& artifact, const std::string& filename) {
  if (artifact.device != kCudaDevice)
    return Error(filename + " was compiled for " + artifact.device +
                 ", not CUDA; compile the model with --device cuda to run it on a GPU");
  auto program = std::make_shared<CudaProgram>();
  program->plan = *artifact.program;
  KILN_TRY(parseCudaCode(artifact.deviceCode, filename + " (code section)", *program));
  if (Status s = program->validate(); !s) return Error(filename + ": corrupt: " + s.error().message());
  return program;
}

}  // namespace kiln::cuda
