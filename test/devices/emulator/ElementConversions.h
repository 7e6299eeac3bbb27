// Element conversions of the emulator's math libraries (its cuBLASLt,
// CublasLt.cpp, and its cuDNN, Cudnn.cpp): f16 and bf16 to and from f32,
// rounded to nearest even as the GPU's conversions are, and TF32 rounding.
// Header-only: the emulator links nothing of Kiln, so that it stays an
// independent stand-in for NVIDIA's libraries (Kiln's own conversions are
// in ir/Types.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln::cuda::emulator {

inline uint32_t bitsOf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

inline float floatOf(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return floatOf(sign | 0x7f800000 | (mant << 13));
  if (exp != 0) return floatOf(sign | ((exp + 112) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mant) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

/// Round to nearest even, as the GPU's conversions do.
inline uint16_t floatToHalf(float f) {
  const uint32_t x = bitsOf(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t exp = (x >> 23) & 0xff;
  uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  const int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // a carry into the exponent is right
  return static_cast<uint16_t>(half);
}

inline float bfloat16ToFloat(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }

inline uint16_t floatToBFloat16(float f) {
  const uint32_t x = bitsOf(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/// TF32 as the tensor cores take f32 inputs under CUBLAS_COMPUTE_32F_FAST_TF32:
/// 10 mantissa bits, rounded to nearest with ties away from zero (cvt.rna.tf32.f32).
inline float roundToTf32(float f) {
  const uint32_t x = bitsOf(f);
  if ((x & 0x7f800000) == 0x7f800000) return f;  // Inf and NaN stay
  return floatOf((x + 0x1000) & ~0x1fffu);
}

}  // namespace kiln::cuda::emulator
