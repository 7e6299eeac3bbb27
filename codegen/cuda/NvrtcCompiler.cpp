// NVRTC compilation (NvrtcCompiler.h). One program per translation unit:
// `--gpu-architecture=sm_NN` makes NVRTC produce both the PTX and the CUBIN
// assembled from it, so a single compilation gives both.
#include "codegen/cuda/NvrtcCompiler.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "runtime/cuda/CudaLibraries.h"

namespace kiln::codegen {
namespace {

/// The kernel whose definition holds line `line` (1-based) of `source`:
/// the last `__global__` line at or before it.
std::string kernelAtLine(const std::string& source, size_t line) {
  std::istringstream in(source);
  std::string text, kernel;
  for (size_t n = 1; n <= line && std::getline(in, text); ++n) {
    if (text.find("__global__") == std::string::npos) continue;
    const size_t open = text.rfind('(');
    const size_t start = text.rfind(' ', open);
    if (open != std::string::npos && start != std::string::npos) kernel = text.substr(start + 1, open - start - 1);
  }
  return kernel;
}

/// NVRTC's log with "(in kernel K)" after each `name(LINE): error` line.
std::string annotateLog(const std::string& log, const std::string& source, const std::string& name) {
  std::istringstream in(log);
  std::string out, text;
  while (std::getline(in, text)) {
    out += text;
    if (text.rfind(name + "(", 0) == 0) {
      const size_t close = text.find(')', name.size());
      if (close != std::string::npos) {
        const std::string digits = text.substr(name.size() + 1, close - name.size() - 1);
        if (!digits.empty() && std::all_of(digits.begin(), digits.end(), ::isdigit))
          if (std::string k = kernelAtLine(source, std::stoul(digits)); !k.empty()) out += " (in kernel " + k + ")";
      }
    }
    out += "\n";
  }
  return out;
}

std::string archList(const std::vector<int>& archs) {
  std::string list;
  for (int a : archs) list += (list.empty() ? "sm_" : ", sm_") + std::to_string(a);
  return list;
}

}  // namespace

Expected<int> parseCudaArch(std::string_view text) {
  const std::string_view digits = text.substr(std::min<size_t>(3, text.size()));
  if (text.substr(0, 3) != "sm_" || digits.size() < 2 || digits.size() > 3 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits[0] == '0')
    return Error("--cuda-arch expects a real GPU architecture such as sm_80 or sm_90, got '" + std::string(text) + "'");
  return std::stoi(std::string(digits));
}

Expected<CudaArchSpec> parseCudaArchSpec(std::string_view text) {
  const bool specific = text.size() > 4 && text.back() == 'a';
  auto arch = parseCudaArch(specific ? text.substr(0, text.size() - 1) : text);
  if (!arch)
    return Error("--cuda-arch expects a real GPU architecture such as sm_80, sm_90 or sm_90a, got '" +
                 std::string(text) + "'");
  return CudaArchSpec{*arch, specific};
}

Expected<CudaBinary> compileCudaSource(const cuda::NvrtcApi& nvrtc, const std::string& source, const std::string& name,
                                       int arch, bool ptxOnly, bool archSpecific) {
  CudaBinary binary;
  binary.arch = arch;
  binary.nvrtcVersion = nvrtc.version();
  const std::vector<int> archs = nvrtc.supportedArchs();
  if (std::find(archs.begin(), archs.end(), arch) == archs.end())
    return Error("NVRTC " + binary.nvrtcVersion + " (" + nvrtc.library.path + ") cannot compile for sm_" +
                 std::to_string(arch) + "; it supports " + archList(archs));

  cuda::nvrtcProgram program = nullptr;
  if (cuda::nvrtcResult r = nvrtc.nvrtcCreateProgram(&program, source.c_str(), name.c_str(), 0, nullptr, nullptr);
      r != cuda::NVRTC_SUCCESS)
    return Error("NVRTC cannot create a program for " + name + ": " + nvrtc.errorString(r));
  struct Destroy {
    const cuda::NvrtcApi& api;
    cuda::nvrtcProgram& p;
    ~Destroy() { api.nvrtcDestroyProgram(&p); }
  } destroy{nvrtc, program};

  const std::string archOption = (ptxOnly ? "--gpu-architecture=compute_" : "--gpu-architecture=sm_") +
                                 std::to_string(arch) + (archSpecific && !ptxOnly ? "a" : "");
  const char* options[] = {archOption.c_str(), "--std=c++17"};
  const cuda::nvrtcResult compiled = nvrtc.nvrtcCompileProgram(program, 2, options);
  size_t logSize = 0;
  if (nvrtc.nvrtcGetProgramLogSize(program, &logSize) == cuda::NVRTC_SUCCESS && logSize > 1) {
    binary.log.resize(logSize);
    if (nvrtc.nvrtcGetProgramLog(program, binary.log.data()) != cuda::NVRTC_SUCCESS) binary.log.clear();
    while (!binary.log.empty() && (binary.log.back() == '\0' || binary.log.back() == '\n')) binary.log.pop_back();
  }
  if (compiled != cuda::NVRTC_SUCCESS)
    return Error("NVRTC " + binary.nvrtcVersion + " failed to compile " + name + " for sm_" + std::to_string(arch) +
                 " (" + nvrtc.errorString(compiled) + "):\n" +
                 (binary.log.empty() ? std::string("(NVRTC gave no log)\n") : annotateLog(binary.log, source, name)));

  size_t size = 0;
  if (ptxOnly) {
  } else if (cuda::nvrtcResult r = nvrtc.nvrtcGetCUBINSize(program, &size); r != cuda::NVRTC_SUCCESS || size == 0)
    return Error("NVRTC compiled " + name + " but gave no CUBIN for sm_" + std::to_string(arch) + " (" +
                 nvrtc.errorString(r) + ")");
  binary.cubin.resize(size);
  if (cuda::nvrtcResult r = ptxOnly ? cuda::NVRTC_SUCCESS : nvrtc.nvrtcGetCUBIN(program, binary.cubin.data());
      r != cuda::NVRTC_SUCCESS)
    return Error("NVRTC cannot return the CUBIN of " + name + ": " + nvrtc.errorString(r));
  if (cuda::nvrtcResult r = nvrtc.nvrtcGetPTXSize(program, &size); r != cuda::NVRTC_SUCCESS || size == 0)
    return Error("NVRTC compiled " + name + " but gave no PTX (" + nvrtc.errorString(r) + ")");
  binary.ptx.resize(size);
  if (cuda::nvrtcResult r = nvrtc.nvrtcGetPTX(program, binary.ptx.data()); r != cuda::NVRTC_SUCCESS)
    return Error("NVRTC cannot return the PTX of " + name + ": " + nvrtc.errorString(r));
  if (!binary.ptx.empty() && binary.ptx.back() == '\0') binary.ptx.pop_back();
  return binary;
}

size_t countKernelsInCubin(const std::string& cubin, const std::vector<std::string>& kernels) {
  // ELF64, little-endian: the section headers, then each symbol table's
  // names in its linked string table. Every offset is bounds-checked.
  const auto read = [&](size_t offset, size_t bytes, uint64_t& value) {
    value = 0;
    if (offset > cubin.size() || bytes > cubin.size() - offset) return false;
    std::memcpy(&value, cubin.data() + offset, bytes);
    return true;
  };
  uint64_t shoff = 0, shentsize = 0, shnum = 0;
  if (cubin.size() < 64 || cubin.compare(0, 4, "\x7f" "ELF") != 0 || cubin[4] != 2 || !read(0x28, 8, shoff) ||
      !read(0x3a, 2, shentsize) || !read(0x3c, 2, shnum) || shentsize < 64)
    return 0;
  std::set<std::string> symbols;
  for (uint64_t i = 0; i < shnum; ++i) {
    const size_t header = shoff + i * shentsize;
    uint64_t type = 0, offset = 0, size = 0, link = 0, entsize = 0;
    if (!read(header + 4, 4, type) || type != 2 /* SHT_SYMTAB */) continue;
    if (!read(header + 0x18, 8, offset) || !read(header + 0x20, 8, size) || !read(header + 0x28, 4, link) ||
        !read(header + 0x38, 8, entsize) || entsize < 24 || link >= shnum)
      continue;
    uint64_t strOffset = 0, strSize = 0;
    const size_t strHeader = shoff + link * shentsize;
    if (!read(strHeader + 0x18, 8, strOffset) || !read(strHeader + 0x20, 8, strSize)) continue;
    if (strOffset > cubin.size() || strSize > cubin.size() - strOffset) continue;
    for (uint64_t s = 0; s + entsize <= size; s += entsize) {
      uint64_t nameOffset = 0;
      if (!read(offset + s, 4, nameOffset) || nameOffset >= strSize) continue;
      const char* start = cubin.data() + strOffset + nameOffset;
      symbols.insert(std::string(start, strnlen(start, strSize - nameOffset)));
    }
  }
  return static_cast<size_t>(
      std::count_if(kernels.begin(), kernels.end(), [&](const std::string& k) { return symbols.count(k) != 0; }));
}

}  // namespace kiln::codegen
