// CPUID-based feature detection (HostCpu.h). The table gives, per feature,
// the CPUID leaf and subleaf, the register and the bit (Intel's and AMD's
// manuals: leaf 1, leaf 7 subleaves 0 and 1, leaf 0xD subleaf 1, leaves
// 0x80000001 and 0x80000008).
#include "runtime/HostCpu.h"

#include <sstream>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln {

namespace {

enum Reg { EAX, EBX, ECX, EDX };
/// Which registers' state the OS must save for a feature to be usable.
enum class OsState { None, Avx, Avx512, Amx };

struct FeatureBit {
  const char* name;
  unsigned leaf, subleaf;
  Reg reg;
  int bit;
  OsState state = OsState::None;
};

// clang-format off
const FeatureBit kFeatures[] = {
    {"sse3", 1, 0, ECX, 0}, {"pclmul", 1, 0, ECX, 1}, {"ssse3", 1, 0, ECX, 9},
    {"fma", 1, 0, ECX, 12, OsState::Avx}, {"cx16", 1, 0, ECX, 13}, {"sse4.1", 1, 0, ECX, 19},
    {"sse4.2", 1, 0, ECX, 20}, {"crc32", 1, 0, ECX, 20}, {"movbe", 1, 0, ECX, 22}, {"popcnt", 1, 0, ECX, 23},
    {"aes", 1, 0, ECX, 25}, {"xsave", 1, 0, ECX, 26}, {"avx", 1, 0, ECX, 28, OsState::Avx},
    {"f16c", 1, 0, ECX, 29, OsState::Avx}, {"rdrnd", 1, 0, ECX, 30},
    {"cx8", 1, 0, EDX, 8}, {"cmov", 1, 0, EDX, 15}, {"mmx", 1, 0, EDX, 23}, {"fxsr", 1, 0, EDX, 24},
    {"sse", 1, 0, EDX, 25}, {"sse2", 1, 0, EDX, 26},
    {"fsgsbase", 7, 0, EBX, 0}, {"bmi", 7, 0, EBX, 3}, {"avx2", 7, 0, EBX, 5, OsState::Avx},
    {"bmi2", 7, 0, EBX, 8}, {"invpcid", 7, 0, EBX, 10}, {"avx512f", 7, 0, EBX, 16, OsState::Avx512},
    {"avx512dq", 7, 0, EBX, 17, OsState::Avx512}, {"rdseed", 7, 0, EBX, 18}, {"adx", 7, 0, EBX, 19},
    {"avx512ifma", 7, 0, EBX, 21, OsState::Avx512}, {"clflushopt", 7, 0, EBX, 23}, {"clwb", 7, 0, EBX, 24},
    {"avx512cd", 7, 0, EBX, 28, OsState::Avx512}, {"sha", 7, 0, EBX, 29},
    {"avx512bw", 7, 0, EBX, 30, OsState::Avx512}, {"avx512vl", 7, 0, EBX, 31, OsState::Avx512},
    {"avx512vbmi", 7, 0, ECX, 1, OsState::Avx512}, {"pku", 7, 0, ECX, 4}, {"waitpkg", 7, 0, ECX, 5},
    {"avx512vbmi2", 7, 0, ECX, 6, OsState::Avx512}, {"shstk", 7, 0, ECX, 7}, {"gfni", 7, 0, ECX, 8},
    {"vaes", 7, 0, ECX, 9, OsState::Avx}, {"vpclmulqdq", 7, 0, ECX, 10, OsState::Avx},
    {"avx512vnni", 7, 0, ECX, 11, OsState::Avx512}, {"avx512bitalg", 7, 0, ECX, 12, OsState::Avx512},
    {"avx512vpopcntdq", 7, 0, ECX, 14, OsState::Avx512}, {"rdpid", 7, 0, ECX, 22}, {"movdiri", 7, 0, ECX, 27},
    {"movdir64b", 7, 0, ECX, 28},
    {"avx512vp2intersect", 7, 0, EDX, 8, OsState::Avx512}, {"serialize", 7, 0, EDX, 14},
    {"amx-bf16", 7, 0, EDX, 22, OsState::Amx}, {"avx512fp16", 7, 0, EDX, 23, OsState::Avx512},
    {"amx-tile", 7, 0, EDX, 24, OsState::Amx}, {"amx-int8", 7, 0, EDX, 25, OsState::Amx},
    {"avxvnni", 7, 1, EAX, 4, OsState::Avx}, {"avx512bf16", 7, 1, EAX, 5, OsState::Avx512},
    {"xsaveopt", 0xD, 1, EAX, 0}, {"xsavec", 0xD, 1, EAX, 1}, {"xsaves", 0xD, 1, EAX, 3},
    {"sahf", 0x80000001, 0, ECX, 0}, {"lzcnt", 0x80000001, 0, ECX, 5}, {"sse4a", 0x80000001, 0, ECX, 6},
    {"prfchw", 0x80000001, 0, ECX, 8}, {"xop", 0x80000001, 0, ECX, 11, OsState::Avx},
    {"fma4", 0x80000001, 0, ECX, 16, OsState::Avx}, {"tbm", 0x80000001, 0, ECX, 21},
    {"64bit", 0x80000001, 0, EDX, 29},
    {"clzero", 0x80000008, 0, EBX, 0}, {"wbnoinvd", 0x80000008, 0, EBX, 9},
};
// clang-format on

#if defined(__x86_64__) || defined(__i386__)
/// The OS-enabled register state, from XCR0 (0 without OSXSAVE).
uint64_t enabledState() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}
#endif

}  // namespace

const std::set<std::string>& hostCpuFeatureNames() {
  static const std::set<std::string> names = [] {
    std::set<std::string> all;
    for (const FeatureBit& f : kFeatures) all.insert(f.name);
    return all;
  }();
  return names;
}

std::set<std::string> hostCpuFeatures() {
  std::set<std::string> have;
#if defined(__x86_64__) || defined(__i386__)
  const uint64_t xcr0 = enabledState();
  const bool avx = (xcr0 & 0x6) == 0x6;                // SSE and AVX state
  const bool avx512 = avx && (xcr0 & 0xe0) == 0xe0;    // opmask and ZMM state
  const bool amx = (xcr0 & 0x60000) == 0x60000;        // tile config and data
  for (const FeatureBit& f : kFeatures) {
    unsigned r[4] = {0, 0, 0, 0};
    const unsigned maxLeaf = __get_cpuid_max(f.leaf & 0x80000000u, nullptr);
    if (maxLeaf < f.leaf) continue;
    __cpuid_count(f.leaf, f.subleaf, r[EAX], r[EBX], r[ECX], r[EDX]);
    if (!(r[f.reg] & (1u << f.bit))) continue;
    if ((f.state == OsState::Avx && !avx) || (f.state == OsState::Avx512 && !avx512) ||
        (f.state == OsState::Amx && !amx))
      continue;
    have.insert(f.name);
  }
#endif
  return have;
}

std::string missingCpuFeatures(std::string_view required, const std::set<std::string>& host) {
  std::string missing;
  std::istringstream in{std::string(required)};
  for (std::string feature; std::getline(in, feature, ',');) {
    if (feature.size() < 2 || feature[0] != '+') continue;
    const std::string name = feature.substr(1);
    if (!hostCpuFeatureNames().count(name) || host.count(name)) continue;
    missing += (missing.empty() ? "" : ", ") + name;
  }
  return missing;
}

}  // namespace kiln
