// VJP rules of the Contraction family: matmul, convolution (forward, transposed, weight gradient)
// and pooling.
// The Grad builder and the entry types are in passes/VjpSupport.h; the
// table at the end declares how each op of this family is differentiated.
#include "passes/VjpSupport.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <set>

namespace kiln::vjp {
namespace {

// --- Contractions ------------------------------------------------------------------------

/// The last two dims swapped.
Value* swapLast(Grad& g, Value* x) {
  int64_t rank = x->type().rank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return g.transpose(x, perm);
}

/// y = a @ b: da = dy @ b^T, db = a^T @ dy, summed over broadcast batch
/// dims; a vector operand is viewed as a [1,k] row or a [k,1] column.
Grads vjpMatMul(Grad& g, const Op& op, Value* dy) {
  Value *a = op.operand(0), *b = op.operand(1);
  bool vecA = a->type().rank() == 1, vecB = b->type().rank() == 1;
  Value* a2 = vecA ? g.reshape(a, {Dim::fixed(1), a->type().shape[0]}) : a;
  Value* b2 = vecB ? g.reshape(b, {b->type().shape[0], Dim::fixed(1)}) : b;
  Shape dyShape = dy->type().shape;
  if (vecA) dyShape.insert(dyShape.end() - (vecB ? 0 : 1), Dim::fixed(1));
  if (vecB) dyShape.push_back(Dim::fixed(1));
  Value* dy2 = (vecA || vecB) ? g.reshape(dy, dyShape) : dy;
  Value* da = g.emit(OpKind::MatMul, {dy2, swapLast(g, b2)});
  Value* db = g.emit(OpKind::MatMul, {swapLast(g, a2), dy2});
  if (vecA) da = g.reshape(g.unbroadcastTo(da, a2->type()), a->type().shape);
  if (vecB) db = g.reshape(g.unbroadcastTo(db, b2->type()), b->type().shape);
  return {g.unbroadcastTo(da, a->type()), g.unbroadcastTo(db, b->type())};
}

/// The spatial attributes of a conv or conv_transpose, defaults filled in.
struct ConvWindow {
  std::vector<int64_t> strides, dilations, pads;
};

ConvWindow convWindow(const Op& op, size_t spatial) {
  auto attr = [&](const char* name, int64_t fill, size_t n) {
    std::vector<int64_t> v = op.getInts(name);
    if (v.empty()) v.assign(n, fill);
    return v;
  };
  return {attr("strides", 1, spatial), attr("dilations", 1, spatial), attr("pads", 0, 2 * spatial)};
}

std::vector<int64_t> swapBatchAndChannels(size_t rank) {
  std::vector<int64_t> perm{1, 0};
  for (size_t i = 2; i < rank; ++i) perm.push_back(static_cast<int64_t>(i));
  return perm;
}

/// `v` with dims 2.. cut to `dims`' sizes.
Value* cropSpatial(Grad& g, Value* v, const std::vector<int64_t>& dims) {
  std::vector<int64_t> starts(dims.size(), 0), ends(dims.size(), kToEnd), steps(dims.size(), 1);
  for (size_t i = 2; i < dims.size(); ++i) ends[i] = dims[i];
  return g.slice(v, starts, ends, steps);
}

/// The weight gradient of one group: the convolution of dy^T [M,N,...] by
/// x^T [C,N,...] (conv) or of x^T by dy^T (conv_transpose) with stride and
/// dilation exchanged, cropped to the kernel and put in w's layout.
Value* convWeightGrad(Grad& g, Value* x, Value* dy, const ConvWindow& win, const std::vector<int64_t>& wDims,
                      bool transposed) {
  auto perm = swapBatchAndChannels(wDims.size());
  Value* input = transposed ? g.transpose(dy, perm) : g.transpose(x, perm);
  Value* kernel = transposed ? g.transpose(x, perm) : g.transpose(dy, perm);
  Value* full = g.emit(
      OpKind::Conv, {input, kernel},
      {{"strides", Attribute(win.dilations)}, {"pads", Attribute(win.pads)}, {"dilations", Attribute(win.strides)}});
  // conv: [C, M, K'] -> [M, C, K]; conv_transpose: [M, C, K'] -> [C, M, K].
  return g.transpose(cropSpatial(g, full, wDims), perm);
}

/// Slices [g*n, (g+1)*n) of dim `axis` of `v`.
Value* groupSlice(Grad& g, Value* v, int64_t axis, int64_t group, int64_t n) {
  int64_t rank = v->type().rank();
  std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
  starts[axis] = group * n;
  ends[axis] = (group + 1) * n;
  return g.slice(v, starts, ends, steps);
}

/// The gradients of a conv or conv_transpose after dx: dw, one
/// convWeightGrad per group (x's groups of `cg` channels, dy's of `mg`) with
/// the groups' kernels `groupW` concatenated, and db (when there is a bias)
/// dy summed over N and the spatial dims.
Grads withParamGrads(Grad& g, const Op& op, Value* x, Value* dy, Value* dx, const ConvWindow& win,
                     const std::vector<int64_t>& groupW, int64_t groups, int64_t cg, int64_t mg, bool transposed) {
  Value* dw = nullptr;
  if (!transposed) {
    // A conv's: one conv_weight_grad over all groups (oneDNN's backward
    // weights convolution on the CPU).
    dw = g.emit(OpKind::ConvWeightGrad, {x, dy},
                {{"kernel", Attribute(std::vector<int64_t>(groupW.begin() + 2, groupW.end()))},
                 {"strides", Attribute(win.strides)},
                 {"pads", Attribute(win.pads)},
                 {"dilations", Attribute(win.dilations)},
                 {"groups", Attribute(groups)}});
  } else {
    std::vector<Value*> dws;
    for (int64_t gi = 0; gi < groups; ++gi) {
      Value* xg = groups > 1 ? groupSlice(g, x, 1, gi, cg) : x;
      Value* dyg = groups > 1 ? groupSlice(g, dy, 1, gi, mg) : dy;
      dws.push_back(convWeightGrad(g, xg, dyg, win, groupW, transposed));
    }
    dw = dws.size() == 1 ? dws[0] : g.emit(OpKind::Concat, dws, {{"axis", Attribute(int64_t{0})}});
  }
  Grads grads{dx, dw};
  if (op.numOperands() == 3) {
    std::vector<int64_t> axes{0};
    for (size_t i = 2; i < groupW.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    grads.push_back(g.reduce(OpKind::ReduceSum, dy, axes, false));
  }
  return grads;
}

/// y = conv(x, w [M, C/G, K...], b). dx is the transposed convolution of dy
/// by the same w and groups (output_padding restoring x's size); dw is one
/// conv_weight_grad of x and dy; db sums dy over N and the spatial dims.
Grads vjpConv(Grad& g, const Op& op, Value* dy) {
  Value *x = op.operand(0), *w = op.operand(1);
  Grads none(op.numOperands(), nullptr);
  // Layouts are assigned after autodiff (assign-layouts), so a channels_last
  // conv is never differentiated; one written by hand is refused.
  if (op.getBool("channels_last")) {
    g.fail("conv with channels_last has no gradient rule; differentiate the channels-first conv");
    return none;
  }
  auto xd = g.dims(x, "conv");
  auto wd = g.dims(w, "conv");
  auto yd = g.dims(y0(op), "conv");
  if (!xd || !wd || !yd) return none;
  size_t spatial = xd->size() - 2;
  int64_t groups = op.getInt("groups"), cg = (*wd)[1], mg = (*wd)[0] / groups;
  ConvWindow win = convWindow(op, spatial);
  std::vector<int64_t> outputPadding(spatial);
  for (size_t i = 0; i < spatial; ++i) {
    int64_t k = (*wd)[i + 2], in = (*xd)[i + 2], out = (*yd)[i + 2];
    outputPadding[i] =
        in - ((out - 1) * win.strides[i] + win.dilations[i] * (k - 1) + 1 - win.pads[i] - win.pads[spatial + i]);
  }
  Value* dx = g.emit(OpKind::ConvTranspose, {dy, w},
                     {{"strides", Attribute(win.strides)},
                      {"pads", Attribute(win.pads)},
                      {"dilations", Attribute(win.dilations)},
                      {"output_padding", Attribute(outputPadding)},
                      {"groups", Attribute(groups)}});
  std::vector<int64_t> groupW = *wd;
  groupW[0] = mg;
  return withParamGrads(g, op, x, dy, dx, win, groupW, groups, cg, mg, false);
}

/// y = conv_transpose(x, w [C, M/G, K...], b), the adjoint of a conv: dx is
/// the convolution of dy by w (cropped to x's size where output_padding
/// reaches past a stride), dw per group as for conv with the roles of x and
/// dy exchanged, db sums dy.
Grads vjpConvTranspose(Grad& g, const Op& op, Value* dy) {
  Value *x = op.operand(0), *w = op.operand(1);
  Grads none(op.numOperands(), nullptr);
  auto xd = g.dims(x, "conv_transpose");
  auto wd = g.dims(w, "conv_transpose");
  if (!xd || !wd) return none;
  size_t spatial = xd->size() - 2;
  int64_t groups = op.getInt("groups"), cg = (*wd)[0] / groups, mg = (*wd)[1];
  ConvWindow win = convWindow(op, spatial);
  Value* dxFull = g.emit(OpKind::Conv, {dy, w},
                         {{"strides", Attribute(win.strides)},
                          {"pads", Attribute(win.pads)},
                          {"dilations", Attribute(win.dilations)},
                          {"groups", Attribute(groups)}});
  Value* dx = cropSpatial(g, dxFull, *xd);
  std::vector<int64_t> groupW = *wd;
  groupW[0] = cg;
  return withParamGrads(g, op, x, dy, dx, win, groupW, groups, cg, mg, true);
}

/// conv_weight_grad appears only in a gradient (conv's dw); differentiating
/// it again (a second derivative) is refused, not taken as zero.
Grads vjpConvWeightGrad(Grad& g, const Op& op, Value*) {
  g.fail("conv_weight_grad (a convolution's weight gradient) has no gradient rule: second derivatives of "
         "convolutions are not supported");
  return Grads(op.numOperands(), nullptr);
}

/// Pooling's adjoint. Each kernel tap t reads, for every output position,
/// one strided slice window_t of the padded input; the gradient of window_t
/// (g_t) is placed back by a transposed convolution of the stacked g_t
/// [N*C, taps, O...] with a one-hot kernel [taps, 1, K...] (tap t at its
/// offset), or, when the windows tile the input, by a transpose; then the
/// padding is cropped (windows that tile it exactly need none of this: see
/// below). max_pool: g_t = dy where window_t
/// equals the maximum, shared evenly by ties; avg_pool: g_t = dy / the
/// window's divisor.
Grads vjpPool(Grad& g, const Op& op, Value* dy, bool isMax) {
  if (op.getBool("channels_last")) {
    g.fail("a channels_last pool has no gradient rule; differentiate the channels-first pool");
    return Grads(op.numOperands(), nullptr);
  }
  Value *x = x0(op), *y = y0(op);
  auto xd = g.dims(x, isMax ? "max_pool" : "avg_pool");
  auto yd = g.dims(y, isMax ? "max_pool" : "avg_pool");
  if (!xd || !yd) return {nullptr};
  size_t sp = xd->size() - 2, rank = xd->size();
  auto attr = [&](const char* name, int64_t fill, size_t n) {
    std::vector<int64_t> v = op.attr(name) ? op.getInts(name) : std::vector<int64_t>{};
    if (v.empty()) v.assign(n, fill);
    return v;
  };
  auto kernel = op.getInts("kernel"), strides = attr("strides", 1, sp), pads = attr("pads", 0, 2 * sp);
  auto dilations = isMax ? attr("dilations", 1, sp) : std::vector<int64_t>(sp, 1);
  DType dt = x->type().dtype;
  // Windows that tile the input exactly (strides equal to the kernel, no
  // dilation or padding, each size a multiple of the kernel's): every
  // position is in one window, so the gradient is elementwise over x, with
  // y and dy repeated over each window by a broadcast between reshapes
  // (which fuse), and max_pool's ties counted by a reduction over each
  // window's taps. No slices, concatenation or placing.
  bool exactTiles = true;
  for (size_t i = 0; i < sp; ++i)
    exactTiles = exactTiles && strides[i] == kernel[i] && dilations[i] == 1 && pads[i] == 0 && pads[sp + i] == 0 &&
                 (*xd)[i + 2] == (*yd)[i + 2] * kernel[i];
  if (exactTiles) {
    Shape split = {Dim::fixed((*xd)[0]), Dim::fixed((*xd)[1])}, windows = split;
    std::vector<int64_t> tapAxes;
    for (size_t i = 0; i < sp; ++i) {
      split.push_back(Dim::fixed((*yd)[i + 2]));
      split.push_back(Dim::fixed(1));
      windows.push_back(Dim::fixed((*yd)[i + 2]));
      windows.push_back(Dim::fixed(kernel[i]));
      tapAxes.push_back(static_cast<int64_t>(3 + 2 * i));
    }
    auto repeat = [&](Value* v) {
      return g.reshape(g.broadcastTo(g.reshape(v, split), TensorType{dt, windows}), x->type().shape);
    };
    if (isMax) {
      Value* hit = g.cast(g.cmp(OpKind::Eq, x, repeat(y)), dt);
      Value* count = g.reduce(OpKind::ReduceSum, g.reshape(hit, windows), tapAxes, false);
      Value* share = g.div(dy, g.emit(OpKind::Max, {count, g.like(count, 1.0)}));
      return {g.mul(hit, repeat(share))};
    }
    int64_t size = 1;
    for (int64_t k : kernel) size *= k;
    Value* count = g.like(dy, static_cast<double>(size));
    return {g.div(repeat(dy), count)};
  }
  // Pads of every dim (begins, ends) that make room for every window,
  // including ceil_mode's partial last one; `span` is what the windows cover.
  std::vector<int64_t> padAll(2 * rank, 0), extra(2 * rank, 0), span(sp), crop(2 * rank, 0);
  for (size_t i = 0; i < sp; ++i) {
    int64_t in = (*xd)[i + 2], out = (*yd)[i + 2];
    span[i] = (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1;
    padAll[2 + i] = pads[i];
    padAll[rank + 2 + i] = pads[sp + i];
    extra[rank + 2 + i] = std::max<int64_t>(0, span[i] - in - pads[i] - pads[sp + i]);
    crop[2 + i] = -pads[i];
    crop[rank + 2 + i] = in + pads[i] - span[i];
  }
  auto padded = [&](Value* v, double value) {
    Value* p = g.emit(OpKind::Pad, {v}, {{"pads", Attribute(padAll)}, {"value", Attribute(value)}});
    return g.emit(OpKind::Pad, {p}, {{"pads", Attribute(extra)}, {"value", Attribute(0.0)}});
  };
  int64_t taps = 1;
  for (int64_t k : kernel) taps *= k;
  auto window = [&](Value* source, int64_t t) {
    std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
    for (size_t i = sp; i-- > 0;) {
      starts[i + 2] = (t % kernel[i]) * dilations[i];
      t /= kernel[i];
      ends[i + 2] = starts[i + 2] + ((*yd)[i + 2] - 1) * strides[i] + 1;
      steps[i + 2] = strides[i];
    }
    return g.slice(source, starts, ends, steps);
  };
  std::vector<Value*> parts;
  if (isMax) {
    // The lowest finite value (not -inf, which the text IR would have to
    // spell) stands for padding, which never wins.
    Value* source = padded(x, std::numeric_limits<double>::lowest());
    std::vector<Value*> hits;
    Value* total = nullptr;
    for (int64_t t = 0; t < taps; ++t) {
      hits.push_back(g.cast(g.cmp(OpKind::Eq, window(source, t), y), dt));
      total = total ? g.add(total, hits.back()) : hits.back();
    }
    Value* share = g.div(dy, g.emit(OpKind::Max, {total, g.like(total, 1.0)}));
    for (Value* hit : hits) parts.push_back(g.mul(hit, share));
  } else {
    // The divisor: real elements, or with count_include_pad those inside
    // the padded input, of each window (constants that fold).
    DenseTensor ones = DenseTensor::zeros(x->type());
    for (int64_t i = 0; i < numElements(x->type().shape); ++i) ones.setDouble(i, 1.0);
    Value* mask = padded(g.emit(OpKind::Constant, {}, {{"value", Attribute(std::move(ones))}}, {x->type()}),
                         op.getBool("count_include_pad") ? 1.0 : 0.0);
    Value* count = nullptr;
    for (int64_t t = 0; t < taps; ++t) count = count ? g.add(count, window(mask, t)) : window(mask, t);
    Value* share = g.div(dy, g.emit(OpKind::Max, {count, g.like(count, 1.0)}));
    parts.assign(taps, share);
  }
  Shape stackedPart = y->type().shape;
  stackedPart[0] = Dim::fixed((*xd)[0] * (*xd)[1]);
  stackedPart[1] = Dim::fixed(1);
  for (Value*& p : parts) p = g.reshape(p, stackedPart);
  Value* stacked = parts.size() == 1 ? parts[0] : g.emit(OpKind::Concat, parts, {{"axis", Attribute(int64_t{1})}});
  // Windows that tile the input (strides equal to the kernel, no
  // dilation): each position is in one window at one tap, so placing is a
  // transpose of [N*C, K..., O...] to [N*C, O1, K1, O2, K2, ...], which
  // costs a copy where the transposed convolution costs a multiply per tap.
  bool tiles = true;
  for (size_t i = 0; i < sp; ++i) tiles = tiles && strides[i] == kernel[i] && dilations[i] == 1;
  if (tiles) {
    Shape split = {Dim::fixed((*xd)[0] * (*xd)[1])}, placedShape = {split[0], Dim::fixed(1)};
    std::vector<int64_t> perm = {0};
    for (size_t i = 0; i < sp; ++i) split.push_back(Dim::fixed(kernel[i]));
    for (size_t i = 0; i < sp; ++i) {
      split.push_back(Dim::fixed((*yd)[i + 2]));
      perm.push_back(static_cast<int64_t>(1 + sp + i));
      perm.push_back(static_cast<int64_t>(1 + i));
      placedShape.push_back(Dim::fixed(span[i]));
    }
    Value* placed = g.reshape(g.transpose(g.reshape(stacked, split), perm), placedShape);
    return {g.reshape(g.pad(placed, crop), x->type().shape)};
  }
  std::vector<int64_t> weightDims{taps, 1};
  weightDims.insert(weightDims.end(), kernel.begin(), kernel.end());
  DenseTensor oneHot = DenseTensor::zeros(TensorType{dt, staticShape(weightDims)});
  for (int64_t t = 0; t < taps; ++t) oneHot.setDouble(t * taps + t, 1.0);
  Value* weight = g.emit(OpKind::Constant, {}, {{"value", Attribute(std::move(oneHot))}},
                         {TensorType{dt, staticShape(weightDims)}});
  Value* placed = g.emit(OpKind::ConvTranspose, {stacked, weight},
                         {{"strides", Attribute(strides)}, {"dilations", Attribute(dilations)}});
  return {g.reshape(g.pad(placed, crop), x->type().shape)};
}

Grads vjpMaxPool(Grad& g, const Op& op, Value* dy) { return vjpPool(g, op, dy, true); }

Grads vjpAvgPool(Grad& g, const Op& op, Value* dy) { return vjpPool(g, op, dy, false); }

}  // namespace

// --- Registration -------------------------------------------------------------

namespace entries {
const VjpEntry MatMul = rule(vjpMatMul);
const VjpEntry Conv = rule(vjpConv);
const VjpEntry ConvTranspose = rule(vjpConvTranspose);
const VjpEntry ConvWeightGrad = rule(vjpConvWeightGrad);
const VjpEntry MaxPool = rule(vjpMaxPool);
const VjpEntry AvgPool = rule(vjpAvgPool);
const VjpEntry QConv = kNone;
const VjpEntry QMatMul = kNone;
}  // namespace entries

}  // namespace kiln::vjp
