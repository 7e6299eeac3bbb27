// Choosing the next token from a row of logits (generation/Generate.h):
// greedy, the most likely token (the first of equals, as torch.argmax), or a
// sample of softmax(logits / temperature) among the top-k from a seeded
// generator whose draws are the same on every standard library.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/Tensor.h"

namespace kiln::generation {

/// Picks the next token from one row of logits: the most likely (the first
/// of equals, as torch.argmax), or a sample of softmax(logits / temperature)
/// among the top-k.
class Sampler {
 public:
  Sampler(double temperature, int64_t topK, uint64_t seed) : temperature_(temperature), topK_(topK), rng_(seed) {}

  /// The index of the token chosen from `logits` (one per token of the vocabulary).
  int64_t choose(const std::vector<double>& logits);

 private:
  double temperature_;
  int64_t topK_;
  std::mt19937_64 rng_;
};

/// Row `t` of batch `b` of logits [batch, length, vocab], as doubles.
std::vector<double> logitsRow(const Tensor& logits, int64_t b, int64_t t);

}  // namespace kiln::generation
