// Evaluation metrics (Metrics.h): the loss recomputed per label position
// with the loss ops' formulas, so that eval needs no compiled loss and
// reports the mean whatever the training step's reduction.
#include "training/Metrics.h"

#include <algorithm>
#include <cmath>

namespace kiln::training {

void accumulateEval(const Tensor& out, const Tensor& labels, const LossConfig& loss, bool classesLast, EvalResult& r) {
  const int64_t n = out.shape()[0];
  if (loss.kind == LossKind::Mse) {
    for (int64_t i = 0; i < out.numElements(); ++i) {
      const double d = out.getDouble(i) - labels.getDouble(i);
      r.loss += d * d;
    }
    r.counted += out.numElements();
    return;
  }
  // Element (sample b, class c, position k): [N, C, inner...] or, with
  // classesLast, [N, inner..., C].
  const int64_t classes = classesLast ? out.shape().back() : out.shape()[1];
  const int64_t inner = out.numElements() / std::max<int64_t>(1, n * classes);
  auto at = [&](int64_t b, int64_t c, int64_t k) {
    return classesLast ? (b * inner + k) * classes + c : (b * classes + c) * inner + k;
  };
  if (r.confusion.empty()) r.confusion.assign(classes, std::vector<int64_t>(classes, 0));
  const double eps = loss.labelSmoothing;
  std::vector<double> logits(classes);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t k = 0; k < inner; ++k) {
      for (int64_t c = 0; c < classes; ++c) logits[c] = out.getDouble(at(b, c, k));
      const int64_t label = labels.getInt(b * inner + k);
      if (label == loss.ignoreIndex) continue;  // no loss, not counted, as PyTorch
      const int64_t predicted = std::max_element(logits.begin(), logits.end()) - logits.begin();
      if (loss.kind == LossKind::Nll) {
        r.loss -= logits[label];
      } else {
        const double m = logits[predicted];
        double sum = 0;
        for (double v : logits) sum += std::exp(v - m);
        const double logSum = m + std::log(sum);
        double smooth = 0;
        for (double v : logits) smooth += logSum - v;
        r.loss += (1 - eps) * (logSum - logits[label]) + eps / classes * smooth;
      }
      r.correct += predicted == label;
      ++r.counted;
      ++r.confusion[label][predicted];
    }
  }
}

std::string formatConfusion(const std::vector<std::vector<int64_t>>& m) {
  size_t width = 4;
  for (const auto& row : m)
    for (int64_t v : row) width = std::max(width, std::to_string(v).size() + 1);
  width = std::max(width, std::to_string(m.size()).size() + 1);
  auto cell = [&](const std::string& s, size_t w) { return std::string(w > s.size() ? w - s.size() : 0, ' ') + s; };
  std::string out = "confusion matrix (rows: true class, columns: predicted class):\n";
  out += cell("true\\pred", 9);
  for (size_t c = 0; c < m.size(); ++c) out += cell(std::to_string(c), width);
  out += "\n";
  for (size_t t = 0; t < m.size(); ++t) {
    out += cell(std::to_string(t), 9);
    for (int64_t v : m[t]) out += cell(std::to_string(v), width);
    out += "\n";
  }
  return out;
}

}  // namespace kiln::training
