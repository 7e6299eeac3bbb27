// Reference kernels for the ONNX recurrent layers rnn, lstm and gru, in
// ONNX's layout 0 (see docs/ops.md): X[seq, batch, in], W[dirs, G*H, in],
// R[dirs, G*H, H], B[dirs, 2*G*H], h0/c0[dirs, batch, H] -> Y[seq, dirs,
// batch, H], Y_h (and Y_c)[dirs, batch, H]. One driver walks the directions
// and time steps; each cell type is a step function over the gate
// pre-activations. Everything is computed in double.
#include <cmath>

#include "runtime/Kernels.h"

namespace kiln {
namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

/// The operands of a recurrent layer, read into double, and their sizes.
class RecurrentLayer {
 public:
  /// Checks the operand shapes of `c` against `gates` gates per unit.
  static Expected<RecurrentLayer> create(const KernelCall& c, int64_t gates) {
    for (size_t k = 0; k < c.numOperands(); ++k)
      if (!isFloat(c.in(k).dtype())) return dtypeError(c.op, c.in(k).dtype(), "float operands");
    RecurrentLayer l;
    const std::string& direction = c.op.getString("direction");
    if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
      return c.op.emitError("unknown direction '" + direction + "' (expected forward, reverse or bidirectional)");
    l.reverse_ = direction == "reverse";
    l.dirs_ = direction == "bidirectional" ? 2 : 1;
    l.hidden_ = c.op.getInt("hidden_size");
    l.gates_ = gates;
    const Tensor& x = c.in(0);
    if (x.rank() != 3) return c.op.emitError("expects X[seq,batch,input], got " + x.type().str());
    l.seq_ = x.shape()[0];
    l.batch_ = x.shape()[1];
    l.input_ = x.shape()[2];
    const int64_t rows = gates * l.hidden_;
    const std::vector<std::vector<int64_t>> expected = {{l.seq_, l.batch_, l.input_},   {l.dirs_, rows, l.input_},
                                                        {l.dirs_, rows, l.hidden_},     {l.dirs_, 2 * rows},
                                                        {l.dirs_, l.batch_, l.hidden_}, {l.dirs_, l.batch_, l.hidden_}};
    static constexpr const char* kNames[] = {"X", "W", "R", "B", "h0", "c0"};
    for (size_t k = 0; k < c.numOperands() && k < expected.size(); ++k)
      if (c.in(k).shape() != expected[k])
        return c.op.emitError(std::string(kNames[k]) + " is " + c.in(k).type().str() + ", expected shape " +
                              shapeStr(staticShape(expected[k])));
    l.x_ = readAs<double>(c.in(0));
    l.w_ = readAs<double>(c.in(1));
    l.r_ = readAs<double>(c.in(2));
    l.b_ = readAs<double>(c.in(3));
    l.h0_ = readAs<double>(c.in(4));
    if (c.numOperands() > 5) l.c0_ = readAs<double>(c.in(5));
    return l;
  }

  /// X[t, b, :] . W[d, row, :] + Wb[d, row]: the input part of gate row `row`.
  double input(int64_t d, int64_t t, int64_t b, int64_t row) const {
    const int64_t rows = gates_ * hidden_;
    double s = b_[d * 2 * rows + row];
    for (int64_t i = 0; i < input_; ++i) s += x_[(t * batch_ + b) * input_ + i] * w_[(d * rows + row) * input_ + i];
    return s;
  }

  /// h[b, :] . R[d, row, :] + Rb[d, row]: the recurrent part of gate row `row`.
  double recurrent(int64_t d, const std::vector<double>& h, int64_t b, int64_t row) const {
    const int64_t rows = gates_ * hidden_;
    double s = b_[d * 2 * rows + rows + row];
    for (int64_t j = 0; j < hidden_; ++j) s += h[b * hidden_ + j] * r_[(d * rows + row) * hidden_ + j];
    return s;
  }

  /// Runs every direction over the sequence. `step(d, t, h, cell)` replaces
  /// the state [batch*H] of h (and of cell, for lstm) by the next step's.
  /// Writes Y, Y_h and, when there is a third result, Y_c.
  template <typename Step>
  void run(const KernelCall& c, Step step) const {
    const int64_t state = batch_ * hidden_;
    for (int64_t d = 0; d < dirs_; ++d) {
      const bool backward = reverse_ || d == 1;
      std::vector<double> h(h0_.begin() + d * state, h0_.begin() + (d + 1) * state);
      std::vector<double> cell = c0_.empty()
                                     ? std::vector<double>(static_cast<size_t>(state), 0.0)
                                     : std::vector<double>(c0_.begin() + d * state, c0_.begin() + (d + 1) * state);
      for (int64_t s = 0; s < seq_; ++s) {
        const int64_t t = backward ? seq_ - 1 - s : s;
        step(d, t, h, cell);
        for (int64_t i = 0; i < state; ++i) c.out(0).setDouble((t * dirs_ + d) * state + i, h[i]);
      }
      for (int64_t i = 0; i < state; ++i) c.out(1).setDouble(d * state + i, h[i]);
      if (c.results.size() > 2)
        for (int64_t i = 0; i < state; ++i) c.out(2).setDouble(d * state + i, cell[i]);
    }
  }

  int64_t batch() const { return batch_; }
  int64_t hidden() const { return hidden_; }

 private:
  bool reverse_ = false;
  int64_t dirs_ = 1, hidden_ = 0, gates_ = 1, seq_ = 0, batch_ = 0, input_ = 0;
  std::vector<double> x_, w_, r_, b_, h0_, c0_;
};

}  // namespace

namespace kernels {

Status Rnn(const KernelCall& c) {
  auto layer = RecurrentLayer::create(c, 1);
  if (!layer) return layer.takeError();
  const std::string& activation = c.op.getString("activation");
  double (*f)(double) = nullptr;
  if (activation == "tanh")
    f = [](double v) { return std::tanh(v); };
  else if (activation == "relu")
    f = [](double v) { return v > 0 ? v : 0.0; };
  else if (activation == "sigmoid")
    f = sigmoid;
  else
    return c.op.emitError("unknown activation '" + activation + "' (expected tanh, relu or sigmoid)");
  const int64_t batch = layer->batch(), hidden = layer->hidden();
  layer->run(c, [&](int64_t d, int64_t t, std::vector<double>& h, std::vector<double>&) {
    std::vector<double> next(h.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < hidden; ++j)
        next[b * hidden + j] = f(layer->input(d, t, b, j) + layer->recurrent(d, h, b, j));
    h = std::move(next);
  });
  return {};
}

Status Lstm(const KernelCall& c) {
  auto layer = RecurrentLayer::create(c, 4);
  if (!layer) return layer.takeError();
  const int64_t batch = layer->batch(), hidden = layer->hidden();
  layer->run(c, [&](int64_t d, int64_t t, std::vector<double>& h, std::vector<double>& cell) {
    // Gate rows in ONNX order: input, output, forget, cell.
    auto gate = [&](int64_t g, int64_t b, int64_t j) {
      return layer->input(d, t, b, g * hidden + j) + layer->recurrent(d, h, b, g * hidden + j);
    };
    std::vector<double> next(h.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < hidden; ++j) {
        const double i = sigmoid(gate(0, b, j)), o = sigmoid(gate(1, b, j));
        const double f = sigmoid(gate(2, b, j)), candidate = std::tanh(gate(3, b, j));
        double& ct = cell[b * hidden + j];
        ct = f * ct + i * candidate;
        next[b * hidden + j] = o * std::tanh(ct);
      }
    h = std::move(next);
  });
  return {};
}

Status Gru(const KernelCall& c) {
  auto layer = RecurrentLayer::create(c, 3);
  if (!layer) return layer.takeError();
  const bool linearBeforeReset = c.op.getBool("linear_before_reset");
  const int64_t batch = layer->batch(), hidden = layer->hidden();
  layer->run(c, [&](int64_t d, int64_t t, std::vector<double>& h, std::vector<double>&) {
    // Gate rows in ONNX order: update z, reset r, hidden h.
    std::vector<double> next(h.size()), reset(h.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < hidden; ++j)
        reset[b * hidden + j] = sigmoid(layer->input(d, t, b, hidden + j) + layer->recurrent(d, h, b, hidden + j));
    // Without linear_before_reset the reset gate scales h before R_h.
    std::vector<double> resetH(h.size());
    for (size_t i = 0; i < h.size(); ++i) resetH[i] = reset[i] * h[i];
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < hidden; ++j) {
        const int64_t k = b * hidden + j;
        const double z = sigmoid(layer->input(d, t, b, j) + layer->recurrent(d, h, b, j));
        const double recurrentH = linearBeforeReset ? reset[k] * layer->recurrent(d, h, b, 2 * hidden + j)
                                                    : layer->recurrent(d, resetH, b, 2 * hidden + j);
        const double candidate = std::tanh(layer->input(d, t, b, 2 * hidden + j) + recurrentH);
        next[k] = (1 - z) * candidate + z * h[k];
      }
    h = std::move(next);
  });
  return {};
}

}  // namespace kernels
}  // namespace kiln
