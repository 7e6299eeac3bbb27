// BLAKE3 (Blake3.h), written from the specification (O'Connor, Aumasson,
// Neves, Wilcox-O'Hearn, "BLAKE3: one function, fast everywhere", 2020),
// sections 2.2 to 2.6: the compression function of 7 rounds over a 16-word
// state, 1024-byte chunks of 64-byte blocks, and the binary tree of chunk
// chaining values built with a stack as chunks complete. Unkeyed hashing
// only, one thread, no SIMD: the inputs are file sections and cache keys,
// where a few hundred MB/s is plenty.
#include "runtime/Blake3.h"

#include <cstring>
#include <vector>

namespace kiln {

namespace {

constexpr uint32_t kIv[8] = {0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
                             0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19};
constexpr size_t kMessagePermutation[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};
constexpr uint32_t kChunkStart = 1, kChunkEnd = 2, kParent = 4, kRoot = 8;
constexpr size_t kBlockBytes = 64, kChunkBytes = 1024;

uint32_t rotateRight(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void mix(uint32_t* s, size_t a, size_t b, size_t c, size_t d, uint32_t mx, uint32_t my) {
  s[a] = s[a] + s[b] + mx;
  s[d] = rotateRight(s[d] ^ s[a], 16);
  s[c] = s[c] + s[d];
  s[b] = rotateRight(s[b] ^ s[c], 12);
  s[a] = s[a] + s[b] + my;
  s[d] = rotateRight(s[d] ^ s[a], 8);
  s[c] = s[c] + s[d];
  s[b] = rotateRight(s[b] ^ s[c], 7);
}

void round(uint32_t* s, const uint32_t* m) {
  mix(s, 0, 4, 8, 12, m[0], m[1]);
  mix(s, 1, 5, 9, 13, m[2], m[3]);
  mix(s, 2, 6, 10, 14, m[4], m[5]);
  mix(s, 3, 7, 11, 15, m[6], m[7]);
  mix(s, 0, 5, 10, 15, m[8], m[9]);
  mix(s, 1, 6, 11, 12, m[10], m[11]);
  mix(s, 2, 7, 8, 13, m[12], m[13]);
  mix(s, 3, 4, 9, 14, m[14], m[15]);
}

/// The compression function: the first 8 words of its output are the next
/// chaining value (all 16 would be the extended output, unused here).
void compress(const uint32_t cv[8], const uint32_t block[16], uint64_t counter, uint32_t blockLen, uint32_t flags,
              uint32_t out[8]) {
  uint32_t s[16] = {cv[0],   cv[1],   cv[2],   cv[3],
                    cv[4],   cv[5],   cv[6],   cv[7],
                    kIv[0],  kIv[1],  kIv[2],  kIv[3],
                    static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), blockLen, flags};
  uint32_t m[16];
  std::memcpy(m, block, sizeof m);
  for (int r = 0; r < 7; ++r) {
    round(s, m);
    if (r == 6) break;
    uint32_t permuted[16];
    for (size_t i = 0; i < 16; ++i) permuted[i] = m[kMessagePermutation[i]];
    std::memcpy(m, permuted, sizeof m);
  }
  for (size_t i = 0; i < 8; ++i) out[i] = s[i] ^ s[i + 8];
}

/// Up to 64 bytes as 16 little-endian words, zero-padded.
void loadBlock(const uint8_t* bytes, size_t n, uint32_t words[16]) {
  uint8_t padded[kBlockBytes] = {};
  std::memcpy(padded, bytes, n);
  for (size_t i = 0; i < 16; ++i)
    words[i] = uint32_t{padded[4 * i]} | uint32_t{padded[4 * i + 1]} << 8 | uint32_t{padded[4 * i + 2]} << 16 |
               uint32_t{padded[4 * i + 3]} << 24;
}

/// The chaining value of chunk `index` (at most 1024 bytes), or, for the
/// only chunk of an input, the root output when `root`.
void chunkValue(const uint8_t* data, size_t n, uint64_t index, bool root, uint32_t out[8]) {
  uint32_t cv[8];
  std::memcpy(cv, kIv, sizeof cv);
  const size_t blocks = n == 0 ? 1 : (n + kBlockBytes - 1) / kBlockBytes;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t len = b + 1 < blocks ? kBlockBytes : n - b * kBlockBytes;
    uint32_t words[16];
    loadBlock(data + b * kBlockBytes, len, words);
    uint32_t flags = (b == 0 ? kChunkStart : 0) | (b + 1 == blocks ? kChunkEnd : 0);
    if (root && b + 1 == blocks) flags |= kRoot;
    compress(cv, words, index, static_cast<uint32_t>(len), flags, cv);
  }
  std::memcpy(out, cv, sizeof cv);
}

/// The chaining value of a parent node over two children (the root output
/// when `root`).
void parentValue(const uint32_t left[8], const uint32_t right[8], bool root, uint32_t out[8]) {
  uint32_t block[16];
  std::memcpy(block, left, 32);
  std::memcpy(block + 8, right, 32);
  compress(kIv, block, 0, kBlockBytes, kParent | (root ? kRoot : 0), out);
}

}  // namespace

std::array<uint8_t, 32> blake3(std::string_view input) {
  const auto* data = reinterpret_cast<const uint8_t*>(input.data());
  const size_t n = input.size();
  uint32_t root[8];
  if (n <= kChunkBytes) {
    chunkValue(data, n, 0, /*root=*/true, root);
  } else {
    // Chunks complete left to right; after chunk k (counting from 1), as
    // many pairs merge as k has trailing zero bits (the spec's stack of
    // subtree values). The last chunk then merges with everything left on
    // the stack, right to left, the final merge being the root.
    const size_t chunks = (n + kChunkBytes - 1) / kChunkBytes;
    std::vector<std::array<uint32_t, 8>> stack;
    for (size_t c = 0; c + 1 < chunks; ++c) {
      std::array<uint32_t, 8> cv;
      chunkValue(data + c * kChunkBytes, kChunkBytes, c, false, cv.data());
      for (uint64_t total = c + 1; (total & 1) == 0; total >>= 1) {
        std::array<uint32_t, 8> merged;
        parentValue(stack.back().data(), cv.data(), false, merged.data());
        stack.pop_back();
        cv = merged;
      }
      stack.push_back(cv);
    }
    std::array<uint32_t, 8> right;
    chunkValue(data + (chunks - 1) * kChunkBytes, n - (chunks - 1) * kChunkBytes, chunks - 1, false, right.data());
    while (!stack.empty()) {
      std::array<uint32_t, 8> merged;
      parentValue(stack.back().data(), right.data(), stack.size() == 1, merged.data());
      stack.pop_back();
      right = merged;
    }
    std::memcpy(root, right.data(), sizeof root);
  }
  std::array<uint8_t, 32> digest;
  for (size_t i = 0; i < 8; ++i)
    for (size_t b = 0; b < 4; ++b) digest[4 * i + b] = static_cast<uint8_t>(root[i] >> (8 * b));
  return digest;
}

std::string contentHash(std::string_view data) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t byte : blake3(data)) {
    hex += kHex[byte >> 4];
    hex += kHex[byte & 15];
  }
  return hex;
}

}  // namespace kiln
