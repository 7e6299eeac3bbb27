// Byte counts of tensors, computed without overflow, and the text of an
// allocation that cannot be made (ByteSize.h).
#include "ir/ByteSize.h"

#include <cstdio>
#include <iterator>

namespace kiln {

std::string formatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  return text;
}

std::optional<uint64_t> tensorByteSize(DType dtype, std::span<const int64_t> dims) {
  int64_t bytes = static_cast<int64_t>(dtypeSize(dtype));
  for (int64_t d : dims)
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::optional<uint64_t> tensorByteSize(const TensorType& type) {
  if (!type.isStatic()) return std::nullopt;
  return tensorByteSize(type.dtype, staticDims(type.shape));
}

Error allocationError(std::optional<uint64_t> bytes, std::string_view value, const TensorType& type,
                      std::string_view origin) {
  std::string message = "cannot allocate " + (bytes ? formatBytes(*bytes) : std::string("more than 8 EiB")) + " for " +
                        std::string(value) + ": " + type.str();
  if (!bytes) message += " (its size overflows 64 bits)";
  if (!origin.empty()) message += " (" + std::string(origin) + ")";
  return Error(std::move(message));
}

}  // namespace kiln
