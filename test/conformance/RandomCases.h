// The ONNX test cases whose expected outputs are draws of NumPy's random
// generator (Bernoulli, training-mode Dropout). No other generator
// reproduces them, Kiln's random ops included (a pure function of seed and
// element index, docs/ops.md), so kiln-conformance checks these cases, and
// only these, statistically instead of element by element; docs/onnx.md
// ("Random cases") gives the list and the reasons.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/Attributes.h"
#include "ir/Support.h"
#include "runtime/Tensor.h"

namespace kiln::conformance {

/// What a random case computes.
enum class RandomCase {
  Bernoulli,          // output 0 is 1 with probability input 0, else 0
  BernoulliFunction,  // Bernoulli's ONNX function body: Greater(RandomUniformLike, p), 1 with probability 1 - p
  Dropout,            // output 0 = input 0 * mask / (1 - ratio), mask (output 1) kept with probability 1 - ratio
};

/// The random case `name` ("node/test_bernoulli") is, or nullopt for a case
/// compared element by element.
std::optional<RandomCase> randomCaseOf(std::string_view name);

/// Runs the model at a path on inputs by graph input name, on the backend
/// under test (`reference` false) or on the interpreter (`reference` true).
using RunModel = std::function<Expected<std::vector<Tensor>>(
    const std::string& path, const std::map<std::string, DenseTensor>& inputs, bool reference)>;

/// Checks one data set of a random case; "" when it passes. `inputs` are
/// the data set's tensors with their graph input names, in order, `want`
/// its expected outputs,
/// used for their count, types and shapes only. The checks: those types;
/// the values' domain ({0, 1}, or {0, x / (1 - ratio)} agreeing with the
/// mask); the same output from two runs (the seed is in the model); the
/// backend's output equal to the interpreter's; and, on the model enlarged
/// kSampleCopies times along dim 0 (inputs tiled) to have enough samples,
/// the frequency of ones (kept elements) at each input position and in all
/// within kSigmas binomial standard deviations of the expected count.
std::string checkRandomCase(RandomCase kind, const std::filesystem::path& modelPath,
                            const std::vector<std::pair<std::string, DenseTensor>>& inputs,
                            const std::vector<DenseTensor>& want, const RunModel& run);

inline constexpr int64_t kSampleCopies = 1000;
/// A correct generator misses a 5-sigma bound with probability < 1e-6 (the
/// normal approximation); the samples are fixed by the seed, so a result
/// never flakes.
inline constexpr double kSigmas = 5.0;

}  // namespace kiln::conformance
