// The `fold-qdq` pass: the QDQ form of a quantized model (ONNX Runtime's
// quantization tool writes float ops between QuantizeLinear and
// DequantizeLinear nodes) back into the int8 contractions it stands for. A
// convolution or matmul whose input and weights are dequantized int8 values
// and whose result (after a bias and a relu, where the graph has them) is
// quantized again becomes one `qconv` or `qmatmul`, which a CPU runs as a
// oneDNN int8 primitive (ir/Ops.def gives its arithmetic; docs/onnx.md).
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "ir/ConstantValue.h"
#include "ir/ShapeRules.h"
#include "passes/Pass.h"
#include "passes/Target.h"

namespace kiln {

namespace {

/// The only element of a one-element tensor.
std::optional<double> single(const DenseTensor* t) {
  if (!t || t->numElements() != 1) return std::nullopt;
  return t->getDouble(0);
}

/// A `dequantize` whose scale and zero point are constants.
struct Dequantized {
  Op* op = nullptr;
  Value* q = nullptr;
  const DenseTensor* scale = nullptr;
  const DenseTensor* zeroPoint = nullptr;
  int64_t axis = 0;  // normalized; meaningful for per-axis parameters only
};

std::optional<Dequantized> dequantized(Value* v) {
  // Other readers of the dequantized value (a residual add) keep it.
  Op* def = v->definingOp();
  if (!def || def->kind() != OpKind::Dequantize) return std::nullopt;
  Dequantized d{def, def->operand(0), constantTensor(def->operand(1)), constantTensor(def->operand(2)), 0};
  if (!d.scale || !d.zeroPoint) return std::nullopt;
  auto axis = normalizeAxis(def->getInt("axis"), std::max<int64_t>(d.q->type().rank(), 1));
  if (!axis) return std::nullopt;
  d.axis = *axis;
  return d;
}

/// Int8 weights: a constant i8 tensor dequantized with zero points of 0
/// (symmetric, as oneDNN takes them) and one scale, or one per index of
/// dim `channelAxis`. Returns the scale of each of `channels` channels.
std::optional<std::vector<double>> weightScales(const Dequantized& w, int64_t channelAxis, int64_t channels) {
  if (!constantTensor(w.q) || w.q->type().dtype != DType::I8) return std::nullopt;
  for (int64_t i = 0; i < w.zeroPoint->numElements(); ++i)
    if (w.zeroPoint->getInt(i) != 0) return std::nullopt;
  std::vector<double> scales(static_cast<size_t>(channels));
  const int64_t n = w.scale->numElements();
  if (n != 1 && (n != channels || w.axis != channelAxis)) return std::nullopt;
  for (int64_t m = 0; m < channels; ++m) scales[m] = w.scale->getDouble(n == 1 ? 0 : m);
  return scales;
}

/// The float value of each channel's bias: a float constant, or a
/// dequantized constant (an int32 bias), of one or `channels` elements.
std::optional<std::vector<double>> biasValues(Value* bias, int64_t channels) {
  std::vector<double> values(static_cast<size_t>(channels));
  if (const DenseTensor* c = constantTensor(bias)) {
    if (!isFloat(c->type.dtype) || (c->numElements() != 1 && c->numElements() != channels)) return std::nullopt;
    for (int64_t m = 0; m < channels; ++m) values[m] = c->getDouble(c->numElements() == 1 ? 0 : m);
    return values;
  }
  auto d = dequantized(bias);
  if (!d) return std::nullopt;
  const DenseTensor* q = constantTensor(d->q);
  if (!q || (q->numElements() != 1 && q->numElements() != channels)) return std::nullopt;
  for (int64_t m = 0; m < channels; ++m) {
    const int64_t i = q->numElements() == 1 ? 0 : m;
    const int64_t s = d->scale->numElements() == 1 ? 0 : i, z = d->zeroPoint->numElements() == 1 ? 0 : i;
    if (d->scale->numElements() != 1 && d->scale->numElements() != q->numElements()) return std::nullopt;
    if (d->zeroPoint->numElements() != 1 && d->zeroPoint->numElements() != q->numElements()) return std::nullopt;
    values[m] = static_cast<double>(q->getInt(i) - d->zeroPoint->getInt(z)) * d->scale->getDouble(s);
  }
  return values;
}

DenseTensor tensorOf(DType dtype, std::vector<int64_t> dims) {
  return DenseTensor::zeros(TensorType{dtype, staticShape(dims)});
}

/// What replaces one pattern, and where the contraction was.
struct Fold {
  OpKind kind = OpKind::QConv;
  Value* x = nullptr;
  /// The shape x is reshaped to first (a Flatten before a Gemm), if any.
  std::optional<Shape> xShape;
  DenseTensor weights;
  DenseTensor scales;
  std::optional<DenseTensor> bias;
  AttrMap attrs;
  Location loc;
};

/// The fold of the pattern that `quantize` ends, if it is one.
std::optional<Fold> match(Op& quantize) {
  Fold fold;
  auto yScale = constantScalar(quantize.operand(1));
  auto yZero = constantScalar(quantize.operand(2));
  if (!yScale || !yZero || *yScale <= 0 || !std::isfinite(*yScale)) return std::nullopt;
  Value* v = quantize.operand(0);
  Op* def = v->definingOp();
  bool relu = false;
  if (def && def->kind() == OpKind::Relu && v->users().size() == 1) {
    relu = true;
    v = def->operand(0);
    def = v->definingOp();
  }
  // A matmul's bias is an add after it (ONNX Gemm's C).
  Value* bias = nullptr;
  if (def && def->kind() == OpKind::Add && v->users().size() == 1) {
    for (size_t i = 0; i < 2 && !bias; ++i) {
      const Op* other = def->operand(i)->definingOp();
      if (other && other->kind() == OpKind::MatMul) {
        bias = def->operand(1 - i);
        v = def->operand(i);
      }
    }
    def = v->definingOp();
  }
  if (!def || v->users().size() != 1) return std::nullopt;
  const bool conv = def->kind() == OpKind::Conv && !def->getBool("channels_last") && !bias;
  if (!conv && def->kind() != OpKind::MatMul) return std::nullopt;
  fold.loc = def->loc();
  fold.kind = conv ? OpKind::QConv : OpKind::QMatMul;
  if (conv && def->numOperands() == 3) bias = def->operand(2);

  // A reshape of a per-tensor dequantize is the dequantize of the reshape.
  Value* xv = def->operand(0);
  if (const Op* r = xv->definingOp(); r && r->kind() == OpKind::Reshape && xv->type().isStatic()) {
    fold.xShape = xv->type().shape;
    xv = r->operand(0);
  }
  auto x = dequantized(xv);
  if (!x || (x->q->type().dtype != DType::U8 && x->q->type().dtype != DType::I8)) return std::nullopt;
  auto xScale = single(x->scale);
  auto xZero = single(x->zeroPoint);
  if (!xScale || !xZero) return std::nullopt;
  fold.x = x->q;

  // Weights: conv's w[M, C/g, K...] per filter; matmul's w[K, N] per
  // column, or the transpose of a w[N, K] per row (ONNX Gemm with transB).
  const TensorType& result = def->result()->type();
  if (!result.isStatic() || result.rank() < 1) return std::nullopt;
  Value* wv = def->operand(1);
  bool transposed = false;
  if (!conv) {
    if (wv->type().rank() != 2) return std::nullopt;
    const Op* t = wv->definingOp();
    if (t && t->kind() == OpKind::Transpose && wv->users().size() == 1 &&
        t->getInts("perm") == std::vector<int64_t>{1, 0}) {
      transposed = true;
      wv = t->operand(0);
    }
  }
  auto w = dequantized(wv);
  if (!w || !w->q->type().isStatic()) return std::nullopt;
  const std::vector<int64_t> resultDims = staticDims(result.shape);
  const int64_t channels = conv ? resultDims[1] : resultDims.back();
  auto wScales = weightScales(*w, conv || transposed ? 0 : 1, channels);
  if (!wScales) return std::nullopt;
  const DenseTensor& wq = *constantTensor(w->q);
  if (transposed) {
    const std::vector<int64_t> nk = staticDims(wq.type.shape);
    fold.weights = tensorOf(DType::I8, {nk[1], nk[0]});
    for (int64_t n = 0; n < nk[0]; ++n)
      for (int64_t k = 0; k < nk[1]; ++k) fold.weights.setInt(k * nk[0] + n, wq.getInt(n * nk[1] + k));
  } else {
    fold.weights = wq;
  }

  std::optional<std::vector<double>> biasFloat;
  if (bias) {
    biasFloat = biasValues(bias, channels);
    if (!biasFloat) return std::nullopt;
  }
  // The requantization: scale[m] = x_scale * w_scale[m] / y_scale; the
  // bias in the accumulator's units, x_scale * w_scale[m] (where ONNX
  // Runtime's int32 bias already is, so it comes back exactly).
  fold.scales = tensorOf(DType::F32, {channels});
  if (biasFloat) fold.bias = tensorOf(DType::I32, {channels});
  for (int64_t m = 0; m < channels; ++m) {
    const double accScale = *xScale * (*wScales)[m];
    if (!(accScale > 0) || !std::isfinite(accScale)) return std::nullopt;
    fold.scales.setDouble(m, accScale / *yScale);
    if (biasFloat) {
      const double b = std::nearbyint((*biasFloat)[m] / accScale);
      if (!(std::abs(b) <= std::numeric_limits<int32_t>::max())) return std::nullopt;
      fold.bias->setInt(m, static_cast<int64_t>(b));
    }
  }
  if (conv)
    for (const char* name : {"strides", "pads", "dilations", "groups"})
      if (const Attribute* a = def->attr(name)) fold.attrs[name] = *a;
  fold.attrs["x_zero_point"] = Attribute(static_cast<int64_t>(*xZero));
  fold.attrs["y_zero_point"] = Attribute(static_cast<int64_t>(*yZero));
  fold.attrs["relu"] = Attribute(relu);
  return fold;
}

/// Erases `op` if its results are unused, then the ops it read that are
/// left unused (dequantized weights, their constants).
void eraseIfDead(Function& f, Op* op) {
  if (op->kind() == OpKind::Return) return;
  for (const Value* r : op->results())
    if (r->hasUses()) return;
  std::vector<Op*> inputs;
  for (Value* v : op->operands())
    if (Op* d = v->definingOp(); d && d->parent() == &f) inputs.push_back(d);
  f.erase(op);
  for (Op* d : inputs) eraseIfDead(f, d);
}

}  // namespace

/// For each `quantize` of a conv or matmul of dequantized int8 operands:
///
///   %xd = dequantize(%xq, %sx, %zx) : f32[1,8,6,6]
///   %wd = dequantize(%wq, %sw, %zw) {axis = 0} : f32[16,8,3,3]
///   %c = conv(%xd, %wd, %bd) : f32[1,16,4,4]
///   %r = relu(%c) : f32[1,16,4,4]
///   %y = quantize(%r, %sy, %zy) : u8[1,16,4,4]
/// becomes
///   %y = qconv(%xq, %wq, %scale, %bias) {x_zero_point = zx, y_zero_point = zy, relu = true} : u8[1,16,4,4]
///
/// with scale[m] = sx * sw[m] / sy and the bias in the accumulator's units
/// (round(b[m] / (sx * sw[m]))). It applies where x's scale and zero point
/// and the result's are single constants (x may be reshaped after its
/// dequantize: ONNX Flatten before Gemm), the weights constant i8 with zero
/// points 0 (one scale, or one per output channel), the bias a float or
/// dequantized constant; a matmul's weights may be transposed, and its bias
/// is an add after it. Every intermediate must have no other reader. With a
/// target, a fold the target's library does not take is not made (CUDA has
/// no int8 kernels: the float ops stay).
class FoldQdqPass : public Pass {
 public:
  std::string_view name() const override { return "fold-qdq"; }

  Expected<bool> run(Module& m, const PassContext& ctx) override {
    bool changed = false;
    for (const auto& f : m.functions()) {
      std::vector<Op*> quantizes;
      for (const auto& op : f->ops())
        if (op->kind() == OpKind::Quantize) quantizes.push_back(op.get());
      for (Op* q : quantizes) {
        std::optional<Fold> fold = match(*q);
        if (!fold) continue;
        const Location loc = fold->loc;
        auto constant = [&](DenseTensor t) {
          TensorType type = t.type;
          return f->insert(q, Op::create(OpKind::Constant, {}, {type}, {{"value", Attribute(std::move(t))}}, loc));
        };
        std::vector<Op*> created = {constant(std::move(fold->weights)), constant(std::move(fold->scales))};
        if (fold->bias) created.push_back(constant(std::move(*fold->bias)));
        Value* x = fold->x;
        if (fold->xShape) {
          created.push_back(
              f->insert(q, Op::create(OpKind::Reshape, {x}, {TensorType{x->type().dtype, *fold->xShape}}, {}, loc)));
          x = created.back()->result();
        }
        std::vector<Value*> operands = {x};
        for (Op* c : created)
          if (c->kind() == OpKind::Constant) operands.push_back(c->result());
        Op* folded = f->insert(q, Op::create(fold->kind, operands, {q->result()->type()}, fold->attrs, loc));
        created.push_back(folded);
        auto types = inferResultTypes(*folded);
        const bool valid = types && (*types)[0] == q->result()->type();
        if (!valid || (ctx.target && !ctx.target->acceptsLibraryCall(*folded, {}))) {
          for (auto it = created.rbegin(); it != created.rend(); ++it) f->erase(*it);
          continue;
        }
        folded->result()->setName(q->result()->name());
        q->result()->replaceAllUsesWith(folded->result());
        eraseIfDead(*f, q);
        changed = true;
      }
    }
    return changed;
  }
};

std::unique_ptr<Pass> createFoldQdqPass() { return std::make_unique<FoldQdqPass>(); }

}  // namespace kiln
