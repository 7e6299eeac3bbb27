// The scans of FiniteBound.h. A float's magnitude is its bits without the
// sign, and as unsigned integers those order as the magnitudes do, with the
// infinities and NaNs (exponent all ones) above every finite value: one
// integer max over the data says both whether all are finite and how large
// the largest is.
#include "runtime/FiniteBound.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kiln {

namespace {

constexpr uint32_t kMagnitudeMask = 0x7fffffffu;
constexpr uint32_t kInfinityBits = 0x7f800000u;
/// Below this many floats one thread scans (about a microsecond of work).
constexpr int64_t kParallelScan = int64_t{1} << 16;

#define KILN_SCAN_INLINE __attribute__((always_inline)) inline

KILN_SCAN_INLINE uint32_t maxBits(const float* data, int64_t n) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(data);
  uint32_t m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, bits[i] & kMagnitudeMask);
  return m;
}

using MaxBitsFn = uint32_t (*)(const float*, int64_t);

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512vl,avx2"))) uint32_t maxBitsAvx512(const float* data, int64_t n) {
  return maxBits(data, n);
}
__attribute__((target("avx2"))) uint32_t maxBitsAvx2(const float* data, int64_t n) { return maxBits(data, n); }
#endif
uint32_t maxBitsBaseline(const float* data, int64_t n) { return maxBits(data, n); }

MaxBitsFn hostMaxBits() {
  static const MaxBitsFn fn = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return &maxBitsAvx512;
    if (__builtin_cpu_supports("avx2")) return &maxBitsAvx2;
#endif
    return &maxBitsBaseline;
  }();
  return fn;
}

float magnitudeOf(uint32_t bits) {
  if (bits >= kInfinityBits) return std::numeric_limits<float>::infinity();
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace

float maxMagnitude(const float* data, int64_t n) {
  const MaxBitsFn scan = hostMaxBits();
  if (n < kParallelScan || omp_get_max_threads() == 1) return magnitudeOf(scan(data, n));
  uint32_t m = 0;
#pragma omp parallel reduction(max : m)
  {
    const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
    // Chunks of 16 floats, so that no thread starts mid-cache-line.
    const int64_t chunks = (n + 15) / 16;
    const int64_t begin = std::min(n, chunks * t / threads * 16), end = std::min(n, chunks * (t + 1) / threads * 16);
    if (begin < end) m = scan(data + begin, end - begin);
  }
  return magnitudeOf(m);
}

double maxRowMagnitudeSum(const float* data, int64_t rows, int64_t rowLength) {
  double largest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    const float* row = data + r * rowLength;
    for (int64_t i = 0; i < rowLength; ++i) sum += std::fabs(static_cast<double>(row[i]));
    // A NaN makes the sum NaN, an infinity +inf: neither is finite.
    if (!std::isfinite(sum)) return std::numeric_limits<double>::infinity();
    largest = std::max(largest, sum);
  }
  return largest;
}

double maxColumnMagnitudeSum(const float* data, int64_t batch, int64_t k, int64_t n) {
  double largest = 0;
  std::vector<double> sums(static_cast<size_t>(n));
  for (int64_t b = 0; b < batch; ++b) {
    std::fill(sums.begin(), sums.end(), 0.0);
    for (int64_t i = 0; i < k; ++i) {
      const float* row = data + (b * k + i) * n;
      for (int64_t j = 0; j < n; ++j) sums[static_cast<size_t>(j)] += std::fabs(static_cast<double>(row[j]));
    }
    for (double s : sums) {
      if (!std::isfinite(s)) return std::numeric_limits<double>::infinity();
      largest = std::max(largest, s);
    }
  }
  return largest;
}

}  // namespace kiln
