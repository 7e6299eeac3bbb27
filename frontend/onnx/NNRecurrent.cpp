// The ONNX recurrent ops, LSTM, GRU and RNN. Kiln's lstm/gru/rnn composites
// have ONNX's layout 0 and gate orders (iofc, zrh), so a node with the
// default activations, no clip, no peepholes, no input_forget and no
// sequence_lens maps onto one composite (with zero bias and initial states
// where the node has none). Any other node is unrolled over its static
// sequence length here, with the same per-step formulas as the composites'
// decomposition plus: named activations with their alpha/beta, clipping of
// every gate's pre-activation to [-clip, clip], peepholes (P = [Pi Po Pf]),
// input_forget (f = 1 - i) and per-batch sequence lengths (a batch entry's
// state stops changing, and its Y rows are 0, from its length on; a reverse
// direction starts at its last valid step). layout 1 (batch first) is
// transposed to layout 0 around the op.
#include <algorithm>
#include <cctype>

#include "frontend/onnx/NNEmitter.h"
#include "frontend/onnx/NNOpsInternal.h"

namespace kiln::onnx_import {

namespace {

enum class Cell { Rnn, Gru, Lstm };

/// One activation of the `activations` list with its parameters.
struct Activation {
  std::string name;  // lower case
  double alpha = 0;
  double beta = 0;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

/// Which of alpha and beta an activation takes, and their defaults (those of
/// the ONNX op of the same name; onnxruntime's for Affine and ScaledTanh).
struct ActivationInfo {
  std::string_view name;
  bool usesAlpha, usesBeta;
  double alpha, beta;
};
constexpr ActivationInfo kActivations[] = {
    {"relu", false, false, 0, 0},     {"tanh", false, false, 0, 0},          {"sigmoid", false, false, 0, 0},
    {"affine", true, true, 1, 0},     {"leakyrelu", true, false, 0.01, 0},   {"thresholdedrelu", true, false, 1, 0},
    {"scaledtanh", true, true, 1, 1}, {"hardsigmoid", true, true, 0.2, 0.5}, {"elu", true, false, 1, 0},
    {"softsign", false, false, 0, 0}, {"softplus", false, false, 0, 0},
};

/// f(x) for one activation.
Value *activate(NNEmitter &e, const Activation &a, Value *x) {
  const std::string &n = a.name;
  if (n == "relu") return e.unary(OpKind::Relu, x);
  if (n == "tanh") return e.unary(OpKind::Tanh, x);
  if (n == "sigmoid") return e.unary(OpKind::Sigmoid, x);
  if (n == "affine") return e.add(e.mul(x, a.alpha), a.beta);
  if (n == "leakyrelu") return e.emit(OpKind::LeakyRelu, {x}, {{"alpha", Attribute(a.alpha)}});
  if (n == "thresholdedrelu") {
    Value *above = e.binary(OpKind::Gt, x, e.scalarLike(x, a.alpha));
    return e.select(above, x, e.scalarLike(x, 0.0));
  }
  if (n == "scaledtanh") return e.mul(e.unary(OpKind::Tanh, e.mul(x, a.beta)), a.alpha);
  if (n == "hardsigmoid") return e.max(e.min(e.add(e.mul(x, a.alpha), a.beta), 1.0), 0.0);
  if (n == "elu") return e.emit(OpKind::Elu, {x}, {{"alpha", Attribute(a.alpha)}});
  if (n == "softsign") return e.div(x, e.add(e.unary(OpKind::Abs, x), 1.0));
  if (n == "softplus") return e.unary(OpKind::Softplus, x);
  return e.fail("unknown activation '" + n + "'");
}

/// Everything a recurrent node says, in layout 0.
struct Recurrence {
  Cell cell = Cell::Rnn;
  int64_t gates = 1;
  int64_t hidden = 0;
  std::string direction;
  int64_t dirs = 1;
  std::vector<Activation> activations;  // per direction: f (RNN); f, g (GRU); f, g, h (LSTM)
  std::optional<double> clip;
  bool linearBeforeReset = false;
  bool inputForget = false;
  bool batchFirst = false;
  Value *x = nullptr;  // [seq, batch, input]
  Value *w = nullptr;
  Value *r = nullptr;
  Value *b = nullptr;        // null when absent
  Value *seqLens = nullptr;  // null when absent or all equal to seq
  Value *h0 = nullptr;       // [dirs, batch, hidden]; null when absent
  Value *c0 = nullptr;
  Value *p = nullptr;
};

/// Reads `activations`, `activation_alpha` and `activation_beta`: `count`
/// per direction; alphas and betas are consumed in list order by the
/// activations that take them, as onnxruntime does.
std::vector<Activation> readActivations(NNEmitter &e, Cell cell, int64_t dirs) {
  std::vector<std::string> defaults;
  if (cell == Cell::Rnn) defaults = {"tanh"};
  if (cell == Cell::Gru) defaults = {"sigmoid", "tanh"};
  if (cell == Cell::Lstm) defaults = {"sigmoid", "tanh", "tanh"};
  size_t count = defaults.size();
  std::vector<std::string> names = e.stringsAttr("activations");
  if (names.empty())
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  if (dirs == 2 && names.size() == count) names.insert(names.end(), names.begin(), names.end());
  std::vector<Activation> result;
  if (names.size() != count * static_cast<size_t>(dirs)) {
    e.fail("attribute 'activations' has " + std::to_string(names.size()) + " entries; expected " +
           std::to_string(count * static_cast<size_t>(dirs)) + " (" + std::to_string(count) + " per direction)");
    return result;
  }
  std::vector<double> alphas = e.floatsAttr("activation_alpha", {});
  std::vector<double> betas = e.floatsAttr("activation_beta", {});
  size_t nextAlpha = 0, nextBeta = 0;
  for (const std::string &name : names) {
    Activation a;
    a.name = lower(name);
    auto info = std::find_if(std::begin(kActivations), std::end(kActivations),
                             [&](const ActivationInfo &i) { return i.name == a.name; });
    if (info == std::end(kActivations)) {
      e.fail("activation '" + name +
             "' is not supported (expected Relu, Tanh, Sigmoid, Affine, "
             "LeakyRelu, ThresholdedRelu, ScaledTanh, "
             "HardSigmoid, Elu, Softsign or Softplus)");
      return result;
    }
    a.alpha = info->usesAlpha && nextAlpha < alphas.size() ? alphas[nextAlpha++] : info->alpha;
    a.beta = info->usesBeta && nextBeta < betas.size() ? betas[nextBeta++] : info->beta;
    result.push_back(a);
  }
  return result;
}

/// The part of a [dirs, d...] value for direction `dir`, without the dirs axis.
Value *ofDirection(NNEmitter &e, Value *v, int64_t dir) {
  if (!v) return nullptr;
  const Shape &shape = v->type().shape;
  Value *part = shape[0] == Dim::fixed(1) ? v : e.sliceAxis(v, 0, dir, dir + 1);
  return e.reshape(part, Shape(shape.begin() + 1, shape.end()));
}

/// Zeros of [dirs, batch, hidden] for an absent initial state, batch taken from
/// x[seq, batch, input].
Value *zeroState(NNEmitter &e, const Recurrence &rec) {
  DType dtype = rec.x->type().dtype;
  const Dim &batch = rec.x->type().shape[1];
  if (batch.isStatic()) return e.tensor(dtype, {rec.dirs, batch.size, rec.hidden}, {});
  Value *column = e.sliceAxis(e.sliceAxis(rec.x, 0, 0, 1), 2, 0, 1);  // [1, batch, 1]
  Value *zeros = e.filledLike(column, dtype, 0.0);
  return e.add(zeros, e.tensor(dtype, {rec.dirs, 1, rec.hidden}, {}));
}

/// Reads and checks the node; x and the initial states come back in layout 0.
Recurrence readRecurrence(NNEmitter &e, Cell cell) {
  NodeContext &ctx = e.ctx();
  Recurrence rec;
  rec.cell = cell;
  rec.gates = cell == Cell::Lstm ? 4 : cell == Cell::Gru ? 3 : 1;
  if (cell == Cell::Lstm)
    e.expectOnlyAttributes({"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
                            "input_forget", "layout", "output_sequence"});
  else if (cell == Cell::Gru)
    e.expectOnlyAttributes({"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
                            "layout", "linear_before_reset", "output_sequence"});
  else
    e.expectOnlyAttributes({"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
                            "layout", "output_sequence"});
  rec.direction = e.stringAttr("direction", "forward");
  if (rec.direction != "forward" && rec.direction != "reverse" && rec.direction != "bidirectional") {
    e.fail("attribute 'direction' = \"" + rec.direction + "\"; expected forward, reverse or bidirectional");
    return rec;
  }
  rec.dirs = rec.direction == "bidirectional" ? 2 : 1;
  rec.activations = readActivations(e, cell, rec.dirs);
  if (e.hasAttr("clip")) rec.clip = e.floatAttr("clip", 0.0);
  rec.linearBeforeReset = e.intAttr("linear_before_reset", 0) != 0;
  rec.inputForget = e.intAttr("input_forget", 0) != 0;
  int64_t layout = e.intAttr("layout", 0);
  if (layout != 0 && layout != 1) e.fail("attribute 'layout' = " + std::to_string(layout) + "; expected 0 or 1");
  rec.batchFirst = layout == 1;

  rec.x = e.input(0);
  rec.w = e.input(1);
  rec.r = e.input(2);
  rec.b = e.optionalInput(3);
  rec.seqLens = e.optionalInput(4);
  rec.h0 = e.optionalInput(5);
  if (cell == Cell::Lstm) {
    rec.c0 = e.optionalInput(6);
    rec.p = e.optionalInput(7);
  }
  if (e.failed()) return rec;
  for (Value *v : {rec.x, rec.w, rec.r})
    if (v->type().rank() != 3) {
      e.fail("inputs X, W and R must have rank 3; got " + rec.x->type().str() + ", " + rec.w->type().str() + " and " +
             rec.r->type().str());
      return rec;
    }
  const Dim &rHidden = rec.r->type().shape[2];
  rec.hidden = e.intAttr("hidden_size", rHidden.isStatic() ? rHidden.size : 0);
  if (rec.hidden < 1) {
    e.fail(
        "needs attribute 'hidden_size' (or a static R) to know the hidden "
        "size");
    return rec;
  }
  if (rec.clip && *rec.clip < 0) e.fail("attribute 'clip' = " + std::to_string(*rec.clip) + "; expected >= 0");

  if (rec.batchFirst) {
    rec.x = e.transpose(rec.x, {1, 0, 2});
    if (rec.h0) rec.h0 = e.transpose(rec.h0, {1, 0, 2});
    if (rec.c0) rec.c0 = e.transpose(rec.c0, {1, 0, 2});
  }
  // Sequence lengths that are all the full length change nothing.
  if (rec.seqLens && rec.x && rec.x->type().shape[0].isStatic()) {
    if (const DenseTensor *lens = ctx.constantInput(4)) {
      bool full = true;
      for (int64_t i = 0; i < lens->numElements(); ++i) full &= lens->getInt(i) == rec.x->type().shape[0].size;
      if (full) rec.seqLens = nullptr;
    }
  }
  if (rec.seqLens && (rec.seqLens->type().rank() != 1 || !isInteger(rec.seqLens->type().dtype)))
    e.fail("input sequence_lens must be an integer [batch] tensor; got " + rec.seqLens->type().str());
  return rec;
}

/// True when the node is exactly what Kiln's composite computes.
bool fitsComposite(NNEmitter &e, const Recurrence &rec) {
  if (rec.clip || rec.inputForget || rec.seqLens) return false;
  if (rec.p) {
    const DenseTensor *p = e.ctx().constantInput(7);
    if (!p) return false;
    for (int64_t i = 0; i < p->numElements(); ++i)
      if (p->getDouble(i) != 0.0) return false;
  }
  // Kiln's lstm and gru apply sigmoid to their gates and tanh elsewhere; its
  // rnn one activation for all directions.
  size_t perDirection = rec.activations.size() / static_cast<size_t>(rec.dirs);
  for (size_t i = 0; i < rec.activations.size(); ++i) {
    const std::string &name = rec.activations[i].name;
    if (rec.cell == Cell::Rnn) {
      if (name != rec.activations[0].name || (name != "tanh" && name != "relu" && name != "sigmoid")) return false;
    } else if (name != (i % perDirection == 0 ? "sigmoid" : "tanh")) {
      return false;
    }
  }
  return true;
}

/// The composite for `rec`: [Y, Y_h(, Y_c)] in layout 0.
std::vector<Value *> viaComposite(NNEmitter &e, const Recurrence &rec) {
  DType dtype = rec.x->type().dtype;
  Value *b = rec.b ? rec.b : e.tensor(dtype, {rec.dirs, 2 * rec.gates * rec.hidden}, {});
  Value *h0 = rec.h0 ? rec.h0 : zeroState(e, rec);
  std::vector<Value *> operands{rec.x, rec.w, rec.r, b, h0};
  AttrMap attrs{{"hidden_size", Attribute(rec.hidden)}, {"direction", Attribute(rec.direction)}};
  OpKind kind = OpKind::Rnn;
  if (rec.cell == Cell::Lstm) {
    kind = OpKind::Lstm;
    operands.push_back(rec.c0 ? rec.c0 : zeroState(e, rec));
  } else if (rec.cell == Cell::Gru) {
    kind = OpKind::Gru;
    attrs["linear_before_reset"] = Attribute(rec.linearBeforeReset);
  } else {
    attrs["activation"] = Attribute(rec.activations[0].name);
  }
  return e.emitMulti(kind, operands, rec.cell == Cell::Lstm ? 3 : 2, attrs);
}

/// The longest sequence unrolled (about 20 Kiln ops a step).
constexpr int64_t kMaxUnrolledSteps = 8192;

/// Unrolls `rec` over its static sequence length: [Y, Y_h(, Y_c)] in layout 0.
std::vector<Value *> unrolled(NNEmitter &e, const Recurrence &rec, bool wantY) {
  size_t numStates = rec.cell == Cell::Lstm ? 2 : 1;
  std::vector<Value *> none(numStates + 1, nullptr);
  const TensorType &xType = rec.x->type();
  if (!xType.shape[0].isStatic() || xType.shape[0].size < 1) {
    e.fail(
        "needs a static, non-zero sequence length to unroll (for its "
        "activations, clip, peepholes, input_forget "
        "or sequence_lens); X has type " +
        xType.str());
    return none;
  }
  int64_t seq = xType.shape[0].size;
  if (seq > kMaxUnrolledSteps) {
    e.fail("unrolls one step per element of the sequence, at most " + std::to_string(kMaxUnrolledSteps) +
           "; X has type " + xType.str());
    return none;
  }
  int64_t h = rec.hidden;
  int64_t gh = rec.gates * h;
  Dim batch = xType.shape[1];
  size_t perDirection = rec.activations.size() / static_cast<size_t>(rec.dirs);
  auto clip = [&](Value *v) { return rec.clip ? e.min(e.max(v, -*rec.clip), *rec.clip) : v; };
  auto gate = [&](Value *v, int64_t k) { return e.sliceAxis(v, 1, k * h, (k + 1) * h); };

  // mask[t]: [batch, 1], true where step t is within the batch entry's length.
  std::vector<Value *> masks(static_cast<size_t>(seq), nullptr);
  if (rec.seqLens) {
    Shape column{rec.seqLens->type().shape[0], Dim::fixed(1)};
    for (int64_t t = 0; t < seq; ++t) {
      Value *step = e.scalar(rec.seqLens->type().dtype, static_cast<double>(t));
      masks[static_cast<size_t>(t)] = e.reshape(e.binary(OpKind::Lt, step, rec.seqLens), column);
    }
  }

  std::vector<Value *> ys;
  std::vector<std::vector<Value *>> finals(numStates);
  for (int64_t dir = 0; dir < rec.dirs; ++dir) {
    bool reverse = rec.direction == "reverse" || dir == 1;
    const Activation *act = &rec.activations[static_cast<size_t>(dir) * perDirection];
    Value *wT = e.transpose(ofDirection(e, rec.w, dir), {1, 0});
    Value *rT = e.transpose(ofDirection(e, rec.r, dir), {1, 0});
    Value *projections = e.emit(OpKind::MatMul, {rec.x, wT});  // [seq, batch, G*H]
    Value *recurrentBias = nullptr;
    if (rec.b) {
      Value *bias = ofDirection(e, rec.b, dir);
      Value *inputBias = e.sliceAxis(bias, 0, 0, gh);
      recurrentBias = e.sliceAxis(bias, 0, gh, 2 * gh);
      // GRU keeps the recurrent bias of its h gate apart (linear_before_reset
      // needs it inside r * (...)).
      if (rec.cell != Cell::Gru) {
        inputBias = e.add(inputBias, recurrentBias);
        recurrentBias = nullptr;
      }
      projections = e.add(projections, inputBias);
    }
    Value *peepholes = rec.p ? ofDirection(e, rec.p, dir) : nullptr;  // [3H]: i, o, f
    Value *pi = peepholes ? e.sliceAxis(peepholes, 0, 0, h) : nullptr;
    Value *po = peepholes ? e.sliceAxis(peepholes, 0, h, 2 * h) : nullptr;
    Value *pf = peepholes ? e.sliceAxis(peepholes, 0, 2 * h, 3 * h) : nullptr;

    Value *state = ofDirection(e, rec.h0 ? rec.h0 : zeroState(e, rec), dir);
    Value *cell = rec.cell == Cell::Lstm ? ofDirection(e, rec.c0 ? rec.c0 : zeroState(e, rec), dir) : nullptr;
    std::vector<Value *> steps(static_cast<size_t>(seq), nullptr);
    for (int64_t i = 0; i < seq; ++i) {
      int64_t t = reverse ? seq - 1 - i : i;
      Value *xp = e.reshape(e.sliceAxis(projections, 0, t, t + 1), {batch, Dim::fixed(gh)});
      Value *newState = nullptr;
      Value *newCell = nullptr;
      if (rec.cell == Cell::Rnn) {
        newState = activate(e, act[0], clip(e.add(xp, e.emit(OpKind::MatMul, {state, rT}))));
      } else if (rec.cell == Cell::Lstm) {
        Value *g = e.add(xp, e.emit(OpKind::MatMul, {state, rT}));
        Value *gi = gate(g, 0);
        Value *gf = gate(g, 2);
        if (peepholes) {
          gi = e.add(gi, e.mul(pi, cell));
          gf = e.add(gf, e.mul(pf, cell));
        }
        Value *input = activate(e, act[0], clip(gi));
        Value *forget = rec.inputForget ? e.sub(1.0, input) : activate(e, act[0], clip(gf));
        Value *candidate = activate(e, act[1], clip(gate(g, 3)));
        Value *kept = e.mul(forget, cell);
        newCell = e.add(kept, e.mul(input, candidate));
        Value *go = gate(g, 1);
        if (peepholes) go = e.add(go, e.mul(po, newCell));
        Value *output = activate(e, act[0], clip(go));
        newState = e.mul(output, activate(e, act[2], newCell));
      } else {
        Value *rTzr = e.sliceAxis(rT, 1, 0, 2 * h);
        Value *rTh = e.sliceAxis(rT, 1, 2 * h, 3 * h);
        Value *hzr = e.emit(OpKind::MatMul, {state, rTzr});
        Value *zr = e.add(e.sliceAxis(xp, 1, 0, 2 * h), hzr);
        Value *rbh = nullptr;
        if (recurrentBias) {
          zr = e.add(zr, e.sliceAxis(recurrentBias, 0, 0, 2 * h));
          rbh = e.sliceAxis(recurrentBias, 0, 2 * h, 3 * h);
        }
        Value *z = activate(e, act[0], clip(gate(zr, 0)));
        Value *reset = activate(e, act[0], clip(gate(zr, 1)));
        Value *recurrent;
        if (rec.linearBeforeReset) {
          Value *hr = e.emit(OpKind::MatMul, {state, rTh});
          if (rbh) hr = e.add(hr, rbh);
          recurrent = e.mul(reset, hr);
        } else {
          recurrent = e.emit(OpKind::MatMul, {e.mul(reset, state), rTh});
          if (rbh) recurrent = e.add(recurrent, rbh);
        }
        Value *candidate = activate(e, act[1], clip(e.add(gate(xp, 2), recurrent)));
        Value *update = e.mul(e.sub(1.0, z), candidate);
        newState = e.add(update, e.mul(z, state));
      }
      Value *y = newState;
      if (Value *mask = masks[static_cast<size_t>(t)]) {
        y = e.select(mask, newState, e.scalarLike(newState, 0.0));
        newState = e.select(mask, newState, state);
        if (newCell) newCell = e.select(mask, newCell, cell);
      }
      state = newState;
      cell = newCell;
      if (wantY) steps[static_cast<size_t>(t)] = e.reshape(y, {Dim::fixed(1), Dim::fixed(1), batch, Dim::fixed(h)});
    }
    if (wantY) ys.push_back(e.concat(steps, 0));
    finals[0].push_back(e.reshape(state, {Dim::fixed(1), batch, Dim::fixed(h)}));
    if (cell) finals[1].push_back(e.reshape(cell, {Dim::fixed(1), batch, Dim::fixed(h)}));
  }
  std::vector<Value *> results{wantY ? e.concat(ys, 1) : nullptr};
  for (auto &f : finals) results.push_back(e.concat(f, 0));
  return results;
}

Status convertRecurrent(NodeContext &ctx, Cell cell) {
  NNEmitter e(ctx);
  Recurrence rec = readRecurrence(e, cell);
  if (e.failed()) return e.status();
  std::vector<Value *> results = fitsComposite(e, rec) ? viaComposite(e, rec) : unrolled(e, rec, e.hasOutput(0));
  if (e.failed()) return e.status();
  for (size_t i = 0; i < results.size(); ++i) {
    Value *v = results[i];
    if (rec.batchFirst && v) v = i == 0 ? e.transpose(v, {2, 0, 1, 3}) : e.transpose(v, {1, 0, 2});
    e.setOutput(i, v);
  }
  return e.status();
}

}  // namespace

Status convertLSTM(NodeContext &ctx) { return convertRecurrent(ctx, Cell::Lstm); }
Status convertGRU(NodeContext &ctx) { return convertRecurrent(ctx, Cell::Gru); }
Status convertRNN(NodeContext &ctx) { return convertRecurrent(ctx, Cell::Rnn); }

}  // namespace kiln::onnx_import
