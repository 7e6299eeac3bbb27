// BLAKE3 (Blake3.h), written from the specification (O'Connor, Aumasson,
// Neves, Wilcox-O'Hearn, "BLAKE3: one function, fast everywhere", 2020),
// sections 2.1 to 2.6: the compression function of 7 rounds over a 16-word
// state, 1024-byte chunks of 64-byte blocks, and the binary tree of chunk
// chaining values, whose subtrees are hashed on every core for inputs of
// 4 MiB or more (the weights of a `.kc`, checked when it loads: about
// 0.8 GB/s per thread without SIMD). Unkeyed hashing only.
#include "runtime/Blake3.h"

#include <bit>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace kiln {

namespace {

constexpr uint32_t kIv[8] = {0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
                             0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19};
constexpr size_t kMessagePermutation[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};
constexpr uint32_t kChunkStart = 1, kChunkEnd = 2, kParent = 4, kRoot = 8;
constexpr size_t kBlockBytes = 64, kChunkBytes = 1024;

inline uint32_t rotateRight(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/// The message word order of each of the 7 rounds: the permutation of the
/// specification applied 0..6 times.
constexpr auto kSchedule = [] {
  std::array<std::array<uint8_t, 16>, 7> schedule{};
  for (size_t i = 0; i < 16; ++i) schedule[0][i] = static_cast<uint8_t>(i);
  for (size_t r = 1; r < 7; ++r)
    for (size_t i = 0; i < 16; ++i) schedule[r][i] = schedule[r - 1][kMessagePermutation[i]];
  return schedule;
}();

#define KILN_BLAKE3_G(a, b, c, d, x, y) \
  a = a + b + (x);                      \
  d = rotateRight(d ^ a, 16);           \
  c = c + d;                            \
  b = rotateRight(b ^ c, 12);           \
  a = a + b + (y);                      \
  d = rotateRight(d ^ a, 8);            \
  c = c + d;                            \
  b = rotateRight(b ^ c, 7);

/// The compression function: the first 8 words of its output are the next
/// chaining value (all 16 would be the extended output, unused here). The
/// state lives in 16 locals, so that the compiler keeps it in registers.
inline void compress(const uint32_t cv[8], const uint32_t m[16], uint64_t counter, uint32_t blockLen, uint32_t flags,
                     uint32_t out[8]) {
  uint32_t s0 = cv[0], s1 = cv[1], s2 = cv[2], s3 = cv[3], s4 = cv[4], s5 = cv[5], s6 = cv[6], s7 = cv[7];
  uint32_t s8 = kIv[0], s9 = kIv[1], s10 = kIv[2], s11 = kIv[3];
  uint32_t s12 = static_cast<uint32_t>(counter), s13 = static_cast<uint32_t>(counter >> 32), s14 = blockLen,
           s15 = flags;
  for (const std::array<uint8_t, 16>& w : kSchedule) {
    KILN_BLAKE3_G(s0, s4, s8, s12, m[w[0]], m[w[1]])
    KILN_BLAKE3_G(s1, s5, s9, s13, m[w[2]], m[w[3]])
    KILN_BLAKE3_G(s2, s6, s10, s14, m[w[4]], m[w[5]])
    KILN_BLAKE3_G(s3, s7, s11, s15, m[w[6]], m[w[7]])
    KILN_BLAKE3_G(s0, s5, s10, s15, m[w[8]], m[w[9]])
    KILN_BLAKE3_G(s1, s6, s11, s12, m[w[10]], m[w[11]])
    KILN_BLAKE3_G(s2, s7, s8, s13, m[w[12]], m[w[13]])
    KILN_BLAKE3_G(s3, s4, s9, s14, m[w[14]], m[w[15]])
  }
  out[0] = s0 ^ s8, out[1] = s1 ^ s9, out[2] = s2 ^ s10, out[3] = s3 ^ s11;
  out[4] = s4 ^ s12, out[5] = s5 ^ s13, out[6] = s6 ^ s14, out[7] = s7 ^ s15;
}

#undef KILN_BLAKE3_G

/// Up to 64 bytes as 16 little-endian words, zero-padded.
void loadBlock(const uint8_t* bytes, size_t n, uint32_t words[16]) {
  if constexpr (std::endian::native == std::endian::little) {
    if (n == kBlockBytes) {
      std::memcpy(words, bytes, kBlockBytes);
      return;
    }
  }
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

namespace {

/// Inputs at least this long are hashed on several threads.
constexpr size_t kParallelBytes = size_t{4} << 20;

/// The chaining value of the subtree over the `n` bytes at `data`, whose
/// first chunk is chunk `firstChunk` of the input; the root's output when
/// `root`. A tree's left subtree is the largest power of two of chunks that
/// leaves the right one at least a byte (the specification's section 2.1).
void subtreeValue(const uint8_t* data, size_t n, uint64_t firstChunk, bool root, uint32_t out[8]) {
  if (n <= kChunkBytes) {
    chunkValue(data, n, firstChunk, root, out);
    return;
  }
  size_t left = kChunkBytes;
  while (2 * left < n) left *= 2;
  uint32_t l[8], r[8];
  subtreeValue(data, left, firstChunk, false, l);
  subtreeValue(data + left, n - left, firstChunk + left / kChunkBytes, false, r);
  parentValue(l, r, root, out);
}

/// The root output of a large input on `threads` threads: the input is cut
/// into blocks of a power of two of chunks, whole subtrees of the tree,
/// which the threads hash from a shared counter; the blocks' chaining values
/// then merge as the chunks' would (a pair for each trailing zero of the
/// count so far), and the rest, at least a byte, is the rightmost subtree.
void parallelRoot(const uint8_t* data, size_t n, unsigned threads, uint32_t out[8]) {
  size_t blockChunks = 1;
  while (blockChunks * 2 * kChunkBytes * 8 * threads <= n) blockChunks *= 2;
  const size_t blockBytes = blockChunks * kChunkBytes;
  const size_t blocks = (n - 1) / blockBytes;
  std::vector<std::array<uint32_t, 8>> values(blocks);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t b = next++; b < blocks; b = next++)
      subtreeValue(data + b * blockBytes, blockBytes, b * blockChunks, false, values[b].data());
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::vector<std::array<uint32_t, 8>> stack;
  for (size_t b = 0; b < blocks; ++b) {
    std::array<uint32_t, 8> cv = values[b];
    for (uint64_t total = b + 1; (total & 1) == 0; total >>= 1) {
      std::array<uint32_t, 8> merged;
      parentValue(stack.back().data(), cv.data(), false, merged.data());
      stack.pop_back();
      cv = merged;
    }
    stack.push_back(cv);
  }
  std::array<uint32_t, 8> right;
  subtreeValue(data + blocks * blockBytes, n - blocks * blockBytes, blocks * blockChunks, false, right.data());
  while (!stack.empty()) {
    std::array<uint32_t, 8> merged;
    parentValue(stack.back().data(), right.data(), stack.size() == 1, merged.data());
    stack.pop_back();
    right = merged;
  }
  std::memcpy(out, right.data(), 32);
}

}  // namespace

std::array<uint8_t, 32> blake3(std::string_view input) {
  static const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  const auto* data = reinterpret_cast<const uint8_t*>(input.data());
  uint32_t root[8];
  if (threads > 1 && input.size() >= kParallelBytes)
    parallelRoot(data, input.size(), threads, root);
  else
    subtreeValue(data, input.size(), 0, true, root);
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
