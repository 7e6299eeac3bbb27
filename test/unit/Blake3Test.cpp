// BLAKE3 (runtime/Blake3.h) against the specification's test vector and
// LLVM's implementation, at every size where the tree changes shape: one
// block, one chunk, chunk boundaries, and inputs of several levels.
#include <gtest/gtest.h>

#include <string>

#include "codegen/KernelCache.h"
#include "runtime/Blake3.h"

namespace kiln {
namespace {

TEST(Blake3Test, EmptyInputIsTheSpecificationsVector) {
  EXPECT_EQ(contentHash(""), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
}

TEST(Blake3Test, MatchesLlvmAtEverySizeThatChangesTheTree) {
  std::string input;
  for (size_t i = 0; i < 70000; ++i) input += static_cast<char>((i * 31 + i / 251) & 0xff);
  for (size_t size : {1, 63, 64, 65, 127, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 3073, 4096, 5000, 8192, 8193,
                      16384, 31744, 65536, 65537, 70000}) {
    const std::string_view data(input.data(), size);
    EXPECT_EQ(contentHash(data), codegen::contentHash(data)) << size << " bytes";
  }
}

}  // namespace
}  // namespace kiln
