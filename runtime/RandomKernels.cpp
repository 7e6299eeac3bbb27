// Random kernels. Samples are a pure function of (seed, element index), as
// docs/ops.md fixes, so every backend can reproduce them exactly:
//   u_i = (splitmix64(seed * 0x9E3779B97F4A7C15 + i) >> 11) * 2^-53
// where splitmix64(x) is one step of Vigna's SplitMix64 generator from
// state x (add the golden-ratio increment, then the two xor-shift-multiply
// rounds and a final xor-shift). Normal samples are Box-Muller of u_{2j},
// u_{2j+1}: the cosine branch for even elements, the sine branch for odd.
#include <cmath>
#include <numbers>

#include "runtime/Kernels.h"

namespace kiln {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// u_i in [0, 1) with 53 random bits.
double uniformAt(int64_t seed, int64_t i) {
  const uint64_t bits = splitmix64(static_cast<uint64_t>(seed) * kGolden + static_cast<uint64_t>(i));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace

namespace kernels {

Status RandomUniform(const KernelCall& c) {
  const double low = c.op.getFloat("low"), high = c.op.getFloat("high");
  const int64_t seed = c.op.getInt("seed");
  Tensor& out = c.out();
  for (int64_t i = 0; i < out.numElements(); ++i) out.setDouble(i, low + (high - low) * uniformAt(seed, i));
  return {};
}

Status RandomNormal(const KernelCall& c) {
  const double mean = c.op.getFloat("mean"), stddev = c.op.getFloat("std");
  const int64_t seed = c.op.getInt("seed");
  Tensor& out = c.out();
  for (int64_t i = 0; i < out.numElements(); ++i) {
    const int64_t j = i / 2;
    // u = 0 (probability 2^-53) would give an infinite radius; use the
    // smallest positive sample instead.
    const double u1 = std::max(uniformAt(seed, 2 * j), 0x1.0p-53);
    const double u2 = uniformAt(seed, 2 * j + 1);
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    const double z = radius * (i % 2 == 0 ? std::cos(angle) : std::sin(angle));
    out.setDouble(i, mean + stddev * z);
  }
  return {};
}

}  // namespace kernels
}  // namespace kiln
