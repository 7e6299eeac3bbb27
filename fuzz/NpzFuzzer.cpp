// libFuzzer target for the .npz reader (runtime/Npz.h): any bytes must give
// a list of arrays or an error, never crash, hang, leak or allocate beyond
// what the input can justify. Arrays that read must have unique, non-empty
// names and survive the writer: serializeNpz then parseNpz gives the same
// names, dtypes, shapes and bytes. Random bytes almost never carry the right
// CRC-32, so each input is also read with the CRCs of its stored members
// repaired (as KcFuzzer repairs checksums), which lets the fuzzer reach the
// .npy parser of the members' contents.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <string_view>

#include "runtime/Npz.h"

namespace {

uint64_t get(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

void put32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

/// `bytes` with the CRC-32 of each stored member, in its central directory
/// entry and local header, set to its data's. Only an archive whose end
/// record is its last 22 bytes is repaired; every read is bounds-checked
/// here, since the input is arbitrary.
std::string repairCrcs(std::string bytes) {
  if (bytes.size() < 22 || get(bytes, bytes.size() - 22, 4) != 0x06054b50) return bytes;
  const size_t end = bytes.size() - 22;
  uint64_t count = get(bytes, end + 10, 2), pos = get(bytes, end + 16, 4);
  for (uint64_t i = 0; i < count && pos + 46 <= end; ++i) {
    if (get(bytes, pos, 4) != 0x02014b50) break;
    const uint64_t size = get(bytes, pos + 20, 4), local = get(bytes, pos + 42, 4);
    const uint64_t next = pos + 46 + get(bytes, pos + 28, 2) + get(bytes, pos + 30, 2) + get(bytes, pos + 32, 2);
    if (get(bytes, pos + 10, 2) == 0 && local + 30 <= end) {
      const uint64_t data = local + 30 + get(bytes, local + 26, 2) + get(bytes, local + 28, 2);
      if (data <= end && size <= end - data) {
        uint32_t crc = static_cast<uint32_t>(
            crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(bytes.data() + data), size));
        put32(bytes, pos + 16, crc);
        put32(bytes, local + 14, crc);
      }
    }
    pos = next;
  }
  return bytes;
}

void check(std::string_view bytes) {
  auto arrays = kiln::parseNpz(bytes, "fuzz.npz");
  if (!arrays) return;
  std::set<std::string> names;
  for (const kiln::NpzArray& a : *arrays) {
    if (a.name.empty() || !names.insert(a.name).second) {
      std::fprintf(stderr, "parseNpz returned an empty or repeated name '%s'\n", a.name.c_str());
      std::abort();
    }
  }
  auto written = kiln::serializeNpz(*arrays);
  if (!written) {
    std::fprintf(stderr, "arrays that read do not write: %s\n", written.error().message().c_str());
    std::abort();
  }
  auto back = kiln::parseNpz(*written, "rewritten.npz");
  if (!back || back->size() != arrays->size()) {
    std::fprintf(stderr, "a written .npz does not read back: %s\n",
                 back ? "different count" : back.error().message().c_str());
    std::abort();
  }
  for (size_t i = 0; i < arrays->size(); ++i) {
    const kiln::NpzArray &a = (*arrays)[i], &b = (*back)[i];
    if (a.name != b.name || a.tensor.dtype() != b.tensor.dtype() || a.tensor.shape() != b.tensor.shape() ||
        a.tensor.numBytes() != b.tensor.numBytes() ||
        (a.tensor.numBytes() != 0 && std::memcmp(a.tensor.raw(), b.tensor.raw(), a.tensor.numBytes()) != 0)) {
      std::fprintf(stderr, "array '%s' changes through serializeNpz and parseNpz\n", a.name.c_str());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  check(bytes);
  std::string repaired = repairCrcs(bytes);
  if (repaired != bytes) check(repaired);
  return 0;
}
