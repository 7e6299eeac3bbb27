// The generation library's sampler (generation/Sampler.h): greedy takes the
// first of equal maxima, as torch.argmax; top-1 sampling is greedy; the
// same seed gives the same draws; a sample never leaves the top k.
#include <gtest/gtest.h>

#include <vector>

#include "generation/Sampler.h"

namespace kiln::generation {
namespace {

TEST(GenerationTest, GreedyTakesTheFirstOfEqualMaxima) {
  Sampler greedy(0, 0, 0);
  EXPECT_EQ(greedy.choose({0.5, 2.0, 2.0, -1.0}), 1);
}

TEST(GenerationTest, TopOneSamplingIsGreedy) {
  Sampler sampler(1.5, 1, 7);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.choose({0.1, 0.3, 0.2}), 1);
}

TEST(GenerationTest, SameSeedSameDrawsWithinTopK) {
  const std::vector<double> logits = {1.0, 0.9, 0.8, -5.0, 0.95};
  Sampler a(1.0, 3, 42), b(1.0, 3, 42);
  for (int i = 0; i < 50; ++i) {
    const int64_t token = a.choose(logits);
    EXPECT_EQ(token, b.choose(logits));
    EXPECT_TRUE(token == 0 || token == 4 || token == 1) << token;  // the 3 most likely
  }
}

TEST(GenerationTest, LogitsRowReadsOnePosition) {
  Tensor logits(DType::F32, {2, 3, 2});
  for (int64_t i = 0; i < 12; ++i) logits.setDouble(i, static_cast<double>(i));
  EXPECT_EQ(logitsRow(logits, 1, 2), (std::vector<double>{10, 11}));
}

}  // namespace
}  // namespace kiln::generation
