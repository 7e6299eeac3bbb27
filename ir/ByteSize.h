// Byte counts of tensors and the error of an allocation that cannot be made.
// Every buffer whose size comes from a model (a result, the arena, a
// constant, a copy of an input) is sized with tensorByteSize, which cannot
// overflow, and a failed allocation is reported with allocationError, which
// names the value, its type and the bytes, so that running out of memory is
// an error a user can act on rather than an abort.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ir/Support.h"
#include "ir/Types.h"

namespace kiln {

/// `bytes` as a person reads it: "64 B", "8.0 GiB", "4.0 TiB".
std::string formatBytes(uint64_t bytes);

/// The bytes of a dense tensor of `dtype` and `dims`, or nullopt when a dim
/// is negative or the count does not fit in 63 bits.
std::optional<uint64_t> tensorByteSize(DType dtype, std::span<const int64_t> dims);
/// The same for a static type (a symbolic dim counts as negative).
std::optional<uint64_t> tensorByteSize(const TensorType& type);

/// "cannot allocate 4.0 TiB for %y: f32[1024,1024,1024,1024] (broadcast
/// 'node_3')": the error of a buffer of `type` for `value` that cannot be
/// allocated; `bytes` nullopt says its size overflows; `origin`, when not
/// empty, says what computes it.
Error allocationError(std::optional<uint64_t> bytes, std::string_view value, const TensorType& type,
                      std::string_view origin = {});

}  // namespace kiln
