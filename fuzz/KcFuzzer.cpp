// libFuzzer target for the `.kc` reader (codegen/CompiledArtifact.h): any
// bytes must either give an artifact or an error, never crash, hang or
// leak. An artifact that reads must hold a verified module and a kernel
// list with a hash per kernel, and writing it again and reading that back
// must give the same module text, target and code: the reader and writer
// agree on everything they accept. Object code is only carried here; it is
// never linked. Random bytes almost never carry valid section checksums, so
// each input is also read with its checksums repaired, which lets the
// fuzzer reach the parsers of the sections' contents.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "codegen/CompiledArtifact.h"
#include "codegen/KernelCache.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

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
    const std::string hex = kiln::codegen::contentHash(std::string_view(bytes).substr(pos + 48, size));
    for (size_t i = 0; i < 32; ++i)
      bytes[pos + 16 + i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    pos += 48 + size;
  }
  return bytes;
}

void check(std::string_view bytes) {
  auto artifact = kiln::codegen::parseArtifact(bytes, "fuzz.kc");
  if (!artifact) return;
  if (kiln::Status s = kiln::verify(*artifact->module); !s) {
    std::fprintf(stderr, "a .kc reads but its module does not verify: %s\n", s.error().str().c_str());
    std::abort();
  }
  if (artifact->code.names.size() != artifact->code.hashes.size()) {
    std::fprintf(stderr, "a .kc reads with %zu kernel names but %zu hashes\n", artifact->code.names.size(),
                 artifact->code.hashes.size());
    std::abort();
  }
  auto again = kiln::codegen::serializeArtifact(*artifact);
  if (!again) {
    std::fprintf(stderr, "a .kc reads but cannot be written: %s\n", again.error().str().c_str());
    std::abort();
  }
  auto back = kiln::codegen::parseArtifact(*again, "fuzz-again.kc");
  if (!back) {
    std::fprintf(stderr, "a written .kc does not read back: %s\n", back.error().str().c_str());
    std::abort();
  }
  if (kiln::print(*back->module) != kiln::print(*artifact->module) || !(back->target == artifact->target) ||
      back->code.names != artifact->code.names || back->code.hashes != artifact->code.hashes ||
      back->code.objects != artifact->code.objects || back->memoryPlan != artifact->memoryPlan) {
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
