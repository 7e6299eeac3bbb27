// The differential fuzzer's graph generator (fuzz/difffuzz/README.md):
// small random graphs from the op table, each shaped after a pattern the
// backends treat specially — fused elementwise chains with broadcasting
// (size-1 dims and rank differences), reductions with their producers and
// consumers, matmul and convolution followed by the elementwise ops a
// library call takes as post-ops (bias add, relu, clip, tanh, sigmoid...),
// pooling, the composite normalizations, and layout ops between elementwise
// ones. Inputs mix ordinary random values with NaN, +-Inf, +-0, denormals
// and extreme magnitudes. Candidates the shape rules or the verifier refuse
// are dropped and drawn again.
#pragma once

#include <random>

#include "fuzz/difffuzz/Case.h"

namespace kiln::difffuzz {

/// A random case drawn from `rng`; always one that builds and verifies.
Case generate(std::mt19937_64& rng);

}  // namespace kiln::difffuzz
