// The token sampler (generation/Sampler.h).
#include "generation/Sampler.h"

#include <algorithm>
#include <cmath>

namespace kiln::generation {

int64_t Sampler::choose(const std::vector<double>& logits) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (temperature_ <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  std::vector<int64_t> order(logits.size());
  for (int64_t i = 0; i < vocab; ++i) order[i] = i;
  const int64_t k = topK_ > 0 ? std::min(topK_, vocab) : vocab;
  // The k most likely, most likely first; equal logits in index order.
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> weights(k);
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += weights[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature_);
  // A uniform double in [0, total) from 53 random bits, the same on every
  // standard library (std::uniform_real_distribution is not specified).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (int64_t i = 0; i < k; ++i)
    if (u < (cumulative += weights[i])) return order[i];
  return order[k - 1];
}

std::vector<double> logitsRow(const Tensor& logits, int64_t b, int64_t t) {
  const int64_t length = logits.shape()[1], vocab = logits.shape()[2];
  std::vector<double> row(vocab);
  const int64_t base = (b * length + t) * vocab;
  for (int64_t v = 0; v < vocab; ++v) row[v] = logits.getDouble(base + v);
  return row;
}

}  // namespace kiln::generation
