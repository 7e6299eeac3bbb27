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
/// dims; a vector operand is viewed as a [1,k] row or a [k,1] column. A b
/// without a batch (a Linear's weight applied to [batch..., M, K]) gets
/// db = sum over the batch of a_i^T dy_i as one product over all the rows,
/// a^T [K, B*M] by dy [B*M, N] (both reshapes views): a GPT's weight
/// gradients were a batched product writing 8 results of its size and a
/// reduction over them.
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
  Value* db = nullptr;
  if (!vecA && !vecB && b->type().rank() == 2 && a->type().rank() > 2 && a->type().isStatic() &&
      dy->type().isStatic()) {
    const Shape& as = a->type().shape;
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < as.size(); ++i) rows *= as[i].size;
    Value* aRows = g.reshape(a, {Dim::fixed(rows), as.back()});
    Value* dyRows = g.reshape(dy, {Dim::fixed(rows), dy->type().shape.back()});
    db = g.emit(OpKind::MatMul, {swapLast(g, aRows), dyRows});
  } else {
    db = g.emit(OpKind::MatMul, {swapLast(g, a2), dy2});
  }
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

/// The lowest finite value of float dtype `dt`: the padding of max_pool's
/// input, which never wins (not -inf, so that a real -inf, the maximum of a
/// window of -infs, is not tied with the padding).
double lowestFinite(DType dt) {
  switch (dt) {
    case DType::F16:
      return -65504.0;
    case DType::BF16:
      return -3.3895313892515355e38;
    case DType::F32:
      return static_cast<double>(std::numeric_limits<float>::lowest());
    default:
      return std::numeric_limits<double>::lowest();
  }
}

/// Pooling's adjoint as a gather, elementwise over x (docs/autodiff.md).
/// Along each spatial dim write an input position p = q*s + r (s the
/// stride, r < s) and let pb be the begin padding: window o holds p at tap
/// t exactly when t*d = (q - o)*s + r + pb (d the dilation). So with
/// o = q - m, every window that holds p is one of a few shifts m (at most
/// ceil(k*d/s) + 1 per dim), and whether shift m reaches p, and at which
/// tap, depends on r alone. dx is then a sum over the shifts of a value of
/// window q - m: the output-grid tensor padded by m (windows outside the
/// output read the padding) and repeated s times along each dim (a
/// reshape, broadcast, reshape and crop, which the fuser composes into the
/// reading kernel, docs/codegen.md section 1), selected where the shift
/// reaches p. No transposed convolution and no stacked taps.
///
/// max_pool: `first` [N, C, O...] holds, for each window, the row-major
/// index of its first tap equal to the maximum (PyTorch's choice among
/// ties), computed over the output grid from strided slices of x padded
/// with the dtype's lowest finite value; p receives the dy of each window
/// whose first maximal tap is p's tap in it. avg_pool: p receives dy over
/// the window's divisor from every window that holds it (the divisor and
/// the tap mask are one constant per shift, over x's spatial dims).
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
  int64_t taps = 1;
  for (int64_t k : kernel) taps *= k;
  std::vector<int64_t> in(sp), out(sp), q(sp);  // per spatial dim: x's size, y's, and ceil(in / stride)
  for (size_t i = 0; i < sp; ++i) {
    in[i] = (*xd)[i + 2];
    out[i] = (*yd)[i + 2];
    q[i] = (in[i] + strides[i] - 1) / strides[i];
  }
  // The tap of window q - m at position q*s + r of dim i, or -1 when that
  // window does not hold the position.
  auto tapAt = [&](size_t i, int64_t m, int64_t r) -> int64_t {
    int64_t v = m * strides[i] + r + pads[i];
    if (v < 0 || v % dilations[i] != 0 || v / dilations[i] >= kernel[i]) return -1;
    return v / dilations[i];
  };
  // The shifts m of each dim that reach some position: m*s + r + pb in
  // [0, (k-1)*d] for some r < s, and window q - m inside the output for some q.
  std::vector<std::vector<int64_t>> shifts(sp);
  for (size_t i = 0; i < sp; ++i) {
    int64_t lo = -(pads[i] + strides[i]) / strides[i] - 1, hi = (kernel[i] - 1) * dilations[i] / strides[i] + 1;
    for (int64_t m = lo; m <= hi; ++m) {
      bool reaches = false;
      for (int64_t r = 0; r < strides[i]; ++r) reaches = reaches || tapAt(i, m, r) >= 0;
      // Windows q - m for q in [0, Q) meet [0, O).
      if (reaches && std::max<int64_t>(0, m) < std::min(q[i], out[i] + m)) shifts[i].push_back(m);
    }
  }

  // An output-grid tensor [N, C, O...] read at window q - m: padded by m
  // at the begin and cropped or padded to Q at the end, with `fill`.
  auto shifted = [&](Value* v, const std::vector<int64_t>& m, double fill) {
    std::vector<int64_t> p(2 * rank, 0);
    bool any = false;
    for (size_t i = 0; i < sp; ++i) {
      p[2 + i] = m[i];
      p[rank + 2 + i] = q[i] - out[i] - m[i];
      any = any || p[2 + i] != 0 || p[rank + 2 + i] != 0;
    }
    return any ? g.emit(OpKind::Pad, {v}, {{"pads", Attribute(p)}, {"value", Attribute(fill)}}) : v;
  };
  // [A, B, Q...] repeated s times along each spatial dim and cropped to x's
  // spatial size: [A, B, Q1, 1, Q2, 1...] -> [A, B, Q1, s1, ...] -> [A, B,
  // Q1*s1, ...] -> [A, B, in...], only loads, which fuse into the reader.
  auto spread = [&](Value* v) {
    const Shape& s = v->type().shape;
    Shape split = {s[0], s[1]}, repeated = split, joined = split;
    bool strided = false, cropped = false;
    for (size_t i = 0; i < sp; ++i) {
      split.push_back(Dim::fixed(q[i]));
      split.push_back(Dim::fixed(1));
      repeated.push_back(Dim::fixed(q[i]));
      repeated.push_back(Dim::fixed(strides[i]));
      joined.push_back(Dim::fixed(q[i] * strides[i]));
      strided = strided || strides[i] != 1;
      cropped = cropped || q[i] * strides[i] != in[i];
    }
    if (strided)
      v = g.reshape(g.broadcastTo(g.reshape(v, split), TensorType{v->type().dtype, repeated}), joined);
    if (!cropped) return v;
    std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
    for (size_t i = 0; i < sp; ++i) ends[i + 2] = in[i];
    return g.slice(v, starts, ends, steps);
  };
  // Every combination of one shift per dim, and for each position residue
  // r (row-major over the dims, r_i < s_i) the flat tap that it is in window
  // q - m, or -1.
  std::vector<std::vector<int64_t>> combos = {{}};
  for (size_t i = 0; i < sp; ++i) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& c : combos)
      for (int64_t m : shifts[i]) {
        next.push_back(c);
        next.back().push_back(m);
      }
    combos = std::move(next);
  }
  int64_t residues = 1;
  for (int64_t s : strides) residues *= s;
  auto flatTaps = [&](const std::vector<int64_t>& m) {
    std::vector<int64_t> result(residues);
    for (int64_t flat = 0; flat < residues; ++flat) {
      int64_t rest = flat, tap = 0, scale = 1;
      for (size_t i = sp; i-- > 0;) {
        int64_t t = tapAt(i, m[i], rest % strides[i]);
        rest /= strides[i];
        if (t < 0) {
          tap = -1;
          break;
        }
        tap += t * scale;
        scale *= kernel[i];
      }
      result[flat] = tap;
    }
    return result;
  };

  Value* dx = nullptr;
  if (isMax) {
    // Padding (and ceil_mode's windows past it) at the lowest finite value,
    // which no real maximum is below.
    std::vector<int64_t> padAll(2 * rank, 0);
    for (size_t i = 0; i < sp; ++i) {
      int64_t span = (out[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1;
      padAll[2 + i] = pads[i];
      padAll[rank + 2 + i] = std::max<int64_t>(pads[sp + i], span - in[i] - pads[i]);
    }
    Value* source =
        g.emit(OpKind::Pad, {x}, {{"pads", Attribute(padAll)}, {"value", Attribute(lowestFinite(dt))}});
    // The first tap equal to the maximum: taps tried from the last, each
    // match replacing the later one; `taps` where none matches (a NaN).
    Value* first = g.scalar(DType::I32, static_cast<double>(taps));
    for (int64_t t = taps; t-- > 0;) {
      std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
      for (int64_t rest = t, i = static_cast<int64_t>(sp) - 1; i >= 0; --i) {
        starts[i + 2] = (rest % kernel[i]) * dilations[i];
        rest /= kernel[i];
        ends[i + 2] = starts[i + 2] + (out[i] - 1) * strides[i] + 1;
        steps[i + 2] = strides[i];
      }
      Value* hit = g.cmp(OpKind::Eq, g.slice(source, starts, ends, steps), y);
      first = g.select(hit, g.scalar(DType::I32, static_cast<double>(t)), first);
    }
    if (!first || first->type().rank() == 0) return {nullptr};  // an error, or no output
    std::vector<int64_t> tapDims{1, 1};
    for (size_t i = 0; i < sp; ++i) {
      tapDims.push_back(1);
      tapDims.push_back(strides[i]);
    }
    Shape repeatedTaps = {Dim::fixed(1), Dim::fixed(1)}, joinedTaps = repeatedTaps;
    for (size_t i = 0; i < sp; ++i) {
      repeatedTaps.push_back(Dim::fixed(q[i]));
      repeatedTaps.push_back(Dim::fixed(strides[i]));
      joinedTaps.push_back(Dim::fixed(q[i] * strides[i]));
    }
    for (const auto& m : combos) {
      std::vector<int64_t> tapOf = flatTaps(m);
      if (std::all_of(tapOf.begin(), tapOf.end(), [](int64_t t) { return t < 0; })) continue;
      // p's tap in window q - m, over x's spatial dims: a constant per
      // residue, repeated over q (a scalar when every stride is 1).
      Value* tap = nullptr;
      if (residues == 1) {
        tap = g.scalar(DType::I32, static_cast<double>(tapOf[0]));
      } else {
        DenseTensor t = DenseTensor::zeros(TensorType{DType::I32, staticShape(tapDims)});
        for (int64_t r = 0; r < residues; ++r) t.setDouble(r, static_cast<double>(tapOf[r]));
        std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
        for (size_t i = 0; i < sp; ++i) ends[i + 2] = in[i];
        tap = g.reshape(g.broadcastTo(g.constant(std::move(t)), TensorType{DType::I32, repeatedTaps}), joinedTaps);
        for (size_t i = 0; i < sp; ++i)
          if (q[i] * strides[i] != in[i]) {
            tap = g.slice(tap, starts, ends, steps);
            break;
          }
      }
      Value* wins = g.cmp(OpKind::Eq, spread(shifted(first, m, static_cast<double>(taps))), tap);
      Value* term = g.where(wins, spread(shifted(dy, m, 0.0)));
      dx = dx ? g.add(dx, term) : term;
    }
  } else {
    // The divisor of each window: its real elements, or with
    // count_include_pad those inside the padded input (never ceil_mode's
    // part past the padding).
    std::vector<int64_t> divisor(numElements(y->type().shape) / ((*yd)[0] * (*yd)[1]));
    bool countPad = op.getBool("count_include_pad");
    for (size_t o = 0; o < divisor.size(); ++o) {
      int64_t count = 1;
      for (int64_t rest = static_cast<int64_t>(o), i = static_cast<int64_t>(sp) - 1; i >= 0; --i) {
        int64_t oi = rest % out[i];
        rest /= out[i];
        int64_t begin = oi * strides[i] - pads[i], end = begin + kernel[i];
        int64_t lo = countPad ? -pads[i] : 0, hi = countPad ? in[i] + pads[sp + i] : in[i];
        count *= std::max<int64_t>(0, std::min(end, hi) - std::max(begin, lo));
      }
      divisor[o] = std::max<int64_t>(count, 1);
    }
    Shape spatial = {Dim::fixed(1), Dim::fixed(1)};
    for (size_t i = 0; i < sp; ++i) spatial.push_back(Dim::fixed(in[i]));
    int64_t positions = 1;
    for (int64_t n : in) positions *= n;
    for (const auto& m : combos) {
      // 1 / the divisor of window q - m where it holds p, else 0, over x's
      // spatial dims.
      DenseTensor weight = DenseTensor::zeros(TensorType{dt, spatial});
      bool any = false;
      for (int64_t p = 0; p < positions; ++p) {
        int64_t window = 0, scale = 1;
        bool holds = true;
        for (int64_t rest = p, i = static_cast<int64_t>(sp) - 1; i >= 0 && holds; --i) {
          int64_t pi = rest % in[i], o = pi / strides[i] - m[i];
          rest /= in[i];
          holds = o >= 0 && o < out[i] && tapAt(i, m[i], pi % strides[i]) >= 0;
          window += o * scale;
          scale *= out[i];
        }
        if (!holds) continue;
        weight.setDouble(p, 1.0 / static_cast<double>(divisor[window]));
        any = true;
      }
      if (!any) continue;
      // One op-emitting call per statement: C++ leaves the order of a call's
      // arguments unspecified, and the printed IR must not depend on the
      // compiler (GCC and Clang built these two in opposite orders).
      Value* w = g.constant(std::move(weight));
      Value* term = g.mul(spread(shifted(dy, m, 0.0)), w);
      dx = dx ? g.add(dx, term) : term;
    }
  }
  // Positions in no window (pads that skip them) get no gradient.
  if (!dx) return {g.zeros(x->type())};
  return {dx};
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
