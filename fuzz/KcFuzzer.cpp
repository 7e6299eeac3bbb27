// libFuzzer target for the `.kc` reader (runtime/KcFile.h): any bytes must
// either give an artifact or an error, never crash, hang or leak. An
// artifact that reads must hold a program that validates; when its module
// reads too, writing both again and reading that back must give the same
// module, program and code: the reader and writer agree on everything they
// accept. Machine code is only carried here; it is never loaded. Random
// bytes almost never carry valid section checksums, so each input is also
// read with its checksums repaired, which lets the fuzzer reach the parsers
// of the sections' contents.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "runtime/Blake3.h"
#include "runtime/KcFile.h"

namespace {

/// `bytes` with the checksum of every complete section set to its
/// payload's, following the layout of CompiledArtifact.h.
std::string repairChecksums(std::string bytes) {
  auto get = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
    return v;
  };
  size_t pos = 16;
  while (pos + 48 <= bytes.size()) {
    const uint64_t size = get(pos + 8, 8);
    if (size > bytes.size() - pos - 48) break;
    const std::string hex = kiln::contentHash(std::string_view(bytes).substr(pos + 48, size));
    for (size_t i = 0; i < 32; ++i)
      bytes[pos + 16 + i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    pos += 48 + size;
  }
  return bytes;
}

void check(std::string_view bytes) {
  auto artifact = kiln::parseArtifact(bytes, "fuzz.kc");
  if (!artifact) return;
  if (artifact->staged) {
    // A program with host steps: validated by the reader, and written back
    // it reads back the same.
    if (kiln::Status s = artifact->staged->validate(); !s) {
      std::fprintf(stderr, "a staged .kc reads but does not validate: %s\n", s.error().str().c_str());
      std::abort();
    }
    auto module = kiln::artifactModule(*artifact, "fuzz.kc");
    if (!module) return;
    const kiln::StagedProgram& p = *artifact->staged;
    const kiln::CpuMachine machine = p.programs.empty() ? kiln::CpuMachine{} : p.programs[0].machine;
    const std::string version = p.programs.empty() ? std::string() : p.programs[0].codegenVersion;
    auto again = kiln::serializeStagedArtifact(*(*module)->functions().front(), p, artifact->optLevel,
                                               artifact->memoryPlan, artifact->device, machine, version);
    if (!again) return;
    auto back = kiln::parseArtifact(*again, "fuzz-again.kc");
    if (!back || !back->staged ||
        kiln::serializeStagedProgram(*back->staged) != kiln::serializeStagedProgram(p)) {
      std::fprintf(stderr, "a staged .kc written and read back differs from what was read\n");
      std::abort();
    }
    return;
  }
  if (kiln::Status s = artifact->program->validate(); !s) {
    std::fprintf(stderr, "a .kc reads but its program does not validate: %s\n", s.error().str().c_str());
    std::abort();
  }
  // The module is read only on request; one that reads must verify and
  // write back, with the program, into a file that reads back the same.
  auto module = kiln::artifactModule(*artifact, "fuzz.kc");
  if (!module) return;
  if (kiln::Status s = kiln::verify(**module); !s) {
    std::fprintf(stderr, "a .kc's module reads but does not verify: %s\n", s.error().str().c_str());
    std::abort();
  }
  auto again = kiln::serializeArtifact(*(*module)->functions().front(), *artifact->program, artifact->optLevel,
                                       artifact->memoryPlan);
  if (!again) return;  // a module that does not fit its program (another constant count) is refused on writing
  auto back = kiln::parseArtifact(*again, "fuzz-again.kc");
  if (!back) {
    std::fprintf(stderr, "a written .kc does not read back: %s\n", back.error().str().c_str());
    std::abort();
  }
  auto backModule = kiln::artifactModule(*back, "fuzz-again.kc");
  const kiln::Program &p = *artifact->program, &q = *back->program;
  if (!backModule || kiln::print(**backModule) != kiln::print(**module) ||
      kiln::serializeProgram(p, 0) != kiln::serializeProgram(q, 0) || p.sharedObject != q.sharedObject ||
      back->memoryPlan != artifact->memoryPlan || back->optLevel != artifact->optLevel) {
    std::fprintf(stderr, "a .kc written and read back differs from what was read\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  check(bytes);
  check(repairChecksums(std::move(bytes)));
  return 0;
}
