// The generate loop of text generation (docs/generate.md), on programs
// loaded by generation/Decoder.h and compiled by the caller: with a
// key/value cache, the prefill program runs the prompt once and the decode
// program one token per step, each cache donated (passes/MemoryPlan.h
// ResultAlias) so that its new value is written into the cache's own
// buffer, in place where the memory plan finds that safe; without a cache,
// the one program recomputes the whole sequence each step, the positions
// after the current one holding padding. In a causal model padding cannot
// change the logits before it: the first step checks that, by running
// twice with different padding, and refuses a model whose logits depend on
// later tokens. Every step runs a program compiled before the loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "generation/Decoder.h"
#include "ir/Support.h"
#include "runtime/Tensor.h"

namespace kiln::generation {

/// What to generate and how to choose each token.
struct GenerateOptions {
  int64_t newTokens = 0;   // tokens to generate after each prompt
  double temperature = 0;  // 0: greedy; else sample softmax(logits / temperature)
  int64_t topK = 0;        // sampling among the K most likely only (0: all)
  uint64_t seed = 0;       // the sampler's seed
  std::string modelPath;   // named in errors
};

/// The tokens generated and what the steps took.
struct Generation {
  Tensor sequence;    // i64[batch, length + newTokens]: the prompt, then the new tokens
  Tensor stepLogits;  // f32[batch, newTokens, vocab]: the logits each new token was chosen from
  double prefillSeconds = 0, decodeSeconds = 0;
  /// With a cache and the CPU JIT: how each donated cache received its new
  /// value ("N of M caches updated in place; ..."); else empty.
  std::string cacheUpdates;
};

/// Generates `options.newTokens` tokens after each row of `prompt`
/// (i64[batch, length], ids within the vocabulary) with `programs`
/// (generation/loadPrograms, each compiled and prepared).
Expected<Generation> generate(std::vector<Program>& programs, const Decoder& d, const Tensor& prompt,
                              const GenerateOptions& options);

}  // namespace kiln::generation
