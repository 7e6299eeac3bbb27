// BLAKE3, the hash of `.kc` section checksums and kernel cache keys: one
// definition that the runtime (which links no LLVM) and code generation
// share. Blake3Test checks it against LLVM's implementation.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

/// The 32-byte BLAKE3 hash of `data`.
std::array<uint8_t, 32> blake3(std::string_view data);

/// The BLAKE3 hash of `data` as 64 lowercase hex digits.
std::string contentHash(std::string_view data);

}  // namespace kiln
