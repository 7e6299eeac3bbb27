// Lowerings of the Contraction family: matmul, convolution (forward, transposed, weight
// gradient) and pooling, as reductions over their windows; the quantized
// contractions have no element function.
// The index helpers are in codegen/LoweringSupport.h; the table at the end
// registers this family's lowering of each of its ops (null where it has none).
#include "codegen/LoweringSupport.h"

#include <algorithm>
#include <limits>
#include <numbers>
#include <numeric>

namespace kiln::codegen {
namespace {

using namespace lower;

// --- Contractions ------------------------------------------------------------------------

/// NumPy matmul as a sum over k for each result element; a 1-D operand is a
/// row (left) or column (right) whose dim does not appear in the result.
Expected<ExprPtr> lowerMatMul(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> a = dimsOf(op.operand(0));
  const std::vector<int64_t> b = dimsOf(op.operand(1));
  const int64_t K = a.back();
  const int k = ctx.newVars(1);
  const ExprPtr kv = kir::var(k);
  // The result index split into batch dims, then m (if a is 2-D+), then n
  // (if b is 2-D+).
  const size_t tail = (a.size() >= 2) + (b.size() >= 2);
  const Index batch(index.begin(), index.end() - tail);
  Index ai, bi;
  if (a.size() >= 2) {
    const std::vector<int64_t> aBatch(a.begin(), a.end() - 2);
    ai = broadcastIndex(batch, aBatch);
    ai.push_back(index[batch.size()]);
  }
  ai.push_back(kv);
  if (b.size() >= 2) {
    const std::vector<int64_t> bBatch(b.begin(), b.end() - 2);
    bi = broadcastIndex(batch, bBatch);
    bi.push_back(kv);
    bi.push_back(index.back());
  } else {
    bi.push_back(kv);
  }
  auto x = ctx.operand(0, ai);
  if (!x) return x;
  auto y = ctx.operand(1, bi);
  if (!y) return y;
  return kir::reduce(kir::ReduceKind::Sum, k, {K}, kir::binary(kir::BinaryFn::Mul, *x, *y));
}

// --- Convolution and pooling -------------------------------------------------------

/// strides, dilations and pads of a windowed op with defaults filled in.
struct Window {
  std::vector<int64_t> strides, dilations, padBegin, padEnd;
};

Window readWindow(const Op& op, size_t k) {
  auto intsOr = [&](std::string_view name, int64_t fill, size_t n) {
    const Attribute* a = op.attr(name);
    std::vector<int64_t> v = a ? a->getInts() : std::vector<int64_t>{};
    if (v.empty()) v.assign(n, fill);
    return v;
  };
  Window w;
  w.strides = intsOr("strides", 1, k);
  w.dilations = op.info().findAttr("dilations") ? intsOr("dilations", 1, k) : std::vector<int64_t>(k, 1);
  const std::vector<int64_t> pads = intsOr("pads", 0, 2 * k);
  w.padBegin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(k));
  w.padEnd.assign(pads.begin() + static_cast<std::ptrdiff_t>(k), pads.end());
  return w;
}

/// For result index `index` of a windowed op over x[N,C,D...] and window
/// taps given by variables `firstTap..`: the input position of each spatial
/// dim, whether all of them lie inside x, and those positions clamped.
struct WindowRead {
  Index positions;       // clamped, safe to read
  ExprPtr inside;        // all positions within the input
  ExprPtr insidePadded;  // all positions within the padded input
};

WindowRead windowRead(const Index& index, const Window& w, const std::vector<int64_t>& inDims, int firstTap) {
  WindowRead r;
  for (size_t d = 0; d < inDims.size(); ++d) {
    ExprPtr pos = kir::add(kir::sub(kir::mul(index[2 + d], kir::index(w.strides[d])), kir::index(w.padBegin[d])),
                           kir::mul(kir::var(firstTap + static_cast<int>(d)), kir::index(w.dilations[d])));
    ExprPtr ok = inRange(pos, inDims[d]);
    ExprPtr okPadded = inRange(kir::add(pos, kir::index(w.padBegin[d])), inDims[d] + w.padBegin[d] + w.padEnd[d]);
    r.inside = r.inside ? kir::binary(kir::BinaryFn::And, r.inside, ok) : ok;
    r.insidePadded = r.insidePadded ? kir::binary(kir::BinaryFn::And, r.insidePadded, okPadded) : okPadded;
    r.positions.push_back(clampIndex(pos, inDims[d]));
  }
  return r;
}

/// A conv's or pool's x dims and result index as channels first: with
/// channels_last, x[N, D..., C] and the result [N, D..., M] are read as
/// x[N, C, D...] and [N, M, D...], and `toX` moves the channel of an x
/// index built that way back to the end.
struct ChannelsFirst {
  std::vector<int64_t> x;
  Index index;
  bool channelsLast = false;

  ChannelsFirst(const Op& op, const Index& resultIndex)
      : x(dimsOf(op.operand(0))), index(resultIndex), channelsLast(op.getBool("channels_last")) {
    if (channelsLast) {
      std::rotate(x.begin() + 1, x.end() - 1, x.end());
      std::rotate(index.begin() + 1, index.end() - 1, index.end());
    }
  }
  Index toX(Index xi) const {
    if (channelsLast) std::rotate(xi.begin() + 1, xi.begin() + 2, xi.end());
    return xi;
  }
};

/// conv as a sum over the group's input channels and the kernel taps;
/// taps in the padding read a clamped element and multiply zero by the
/// weight (so a NaN or infinite weight there gives NaN, as in PyTorch).
Expected<ExprPtr> lowerConv(const Op& op, LoweringContext& ctx, const Index& resultIndex) {
  const ChannelsFirst view(op, resultIndex);
  const std::vector<int64_t>& x = view.x;
  const Index& index = view.index;
  const std::vector<int64_t> w = dimsOf(op.operand(1));
  const std::vector<int64_t> inDims(x.begin() + 2, x.end()), kernel(w.begin() + 2, w.end());
  const int64_t groups = op.getInt("groups");
  const int64_t groupIn = w[1], groupOut = w[0] / groups;
  const Window window = readWindow(op, inDims.size());
  const int first = ctx.newVars(1 + static_cast<int>(kernel.size()));
  const WindowRead read = windowRead(index, window, inDims, first + 1);
  const ExprPtr channel =
      kir::add(kir::mul(kir::div(index[1], kir::index(groupOut)), kir::index(groupIn)), kir::var(first));
  Index xi = {index[0], channel};
  xi.insert(xi.end(), read.positions.begin(), read.positions.end());
  Index wi = {index[1], kir::var(first)};
  for (size_t d = 0; d < kernel.size(); ++d) wi.push_back(kir::var(first + 1 + static_cast<int>(d)));
  auto xv = ctx.operand(0, view.toX(std::move(xi)));
  if (!xv) return xv;
  auto wv = ctx.operand(1, wi);
  if (!wv) return wv;
  const DType t = op.result()->type().dtype;
  ExprPtr term = kir::binary(kir::BinaryFn::Mul, kir::select(read.inside, *xv, kir::constant(t, 0)), *wv);
  std::vector<int64_t> extents = {groupIn};
  extents.insert(extents.end(), kernel.begin(), kernel.end());
  ExprPtr sum = kir::reduce(kir::ReduceKind::Sum, first, extents, term);
  if (op.numOperands() < 3) return sum;
  auto bias = ctx.operand(2, {index[1]});
  if (!bias) return bias;
  return kir::binary(kir::BinaryFn::Add, sum, *bias);
}

/// conv_transpose as a gather: the interpreter scatters input position i
/// with tap k to output position i * stride - pad + k * dilation, so output
/// position o gathers from each tap k the input at (o + pad - k * dilation)
/// / stride where that divides exactly and lies inside x. A sum over the
/// group's input channels and the taps; output_padding only sizes the
/// result (its declared type).
Expected<ExprPtr> lowerConvTranspose(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> x = dimsOf(op.operand(0)), w = dimsOf(op.operand(1));
  const std::vector<int64_t> inDims(x.begin() + 2, x.end()), kernel(w.begin() + 2, w.end());
  const int64_t groups = op.getInt("groups");
  const int64_t groupIn = x[1] / groups, groupOut = w[1];
  const Window window = readWindow(op, inDims.size());
  const int first = ctx.newVars(1 + static_cast<int>(kernel.size()));
  // x channel: the output channel's group, then the reduction variable.
  const ExprPtr channel =
      kir::add(kir::mul(kir::div(index[1], kir::index(groupOut)), kir::index(groupIn)), kir::var(first));
  Index xi = {index[0], channel};
  Index wi = {channel, kir::rem(index[1], kir::index(groupOut))};
  ExprPtr inside;
  for (size_t d = 0; d < inDims.size(); ++d) {
    const ExprPtr tap = kir::var(first + 1 + static_cast<int>(d));
    const ExprPtr t = kir::sub(kir::add(index[2 + d], kir::index(window.padBegin[d])),
                               kir::mul(tap, kir::index(window.dilations[d])));
    const ExprPtr pos = kir::div(t, kir::index(window.strides[d]));
    ExprPtr ok = kir::binary(kir::BinaryFn::And, kir::binary(kir::BinaryFn::Ge, t, kir::index(0)),
                             kir::binary(kir::BinaryFn::Lt, pos, kir::index(inDims[d])));
    if (window.strides[d] != 1)
      ok = kir::binary(kir::BinaryFn::And, ok,
                       kir::binary(kir::BinaryFn::Eq, kir::rem(t, kir::index(window.strides[d])), kir::index(0)));
    inside = inside ? kir::binary(kir::BinaryFn::And, inside, ok) : ok;
    xi.push_back(clampIndex(pos, inDims[d]));
    wi.push_back(tap);
  }
  auto xv = ctx.operand(0, xi);
  if (!xv) return xv;
  auto wv = ctx.operand(1, wi);
  if (!wv) return wv;
  const DType t = op.result()->type().dtype;
  // A tap that lands in a stride's gap or in the cropped padding adds
  // nothing (not 0 * w: a NaN or infinite weight there must not reach the
  // output, as in the interpreter's and PyTorch's scatter).
  ExprPtr term = kir::select(inside, kir::binary(kir::BinaryFn::Mul, *xv, *wv), kir::constant(t, 0));
  std::vector<int64_t> extents = {groupIn};
  extents.insert(extents.end(), kernel.begin(), kernel.end());
  ExprPtr sum = kir::reduce(kir::ReduceKind::Sum, first, extents, term);
  if (op.numOperands() < 3) return sum;
  auto bias = ctx.operand(2, {index[1]});
  if (!bias) return bias;
  return kir::binary(kir::BinaryFn::Add, sum, *bias);
}

/// conv_weight_grad: dw[m, c, k...] as a sum over the batch and dy's
/// positions o of dy[n, m, o] times x at o * stride - pad + k * dilation
/// (0 in the padding).
Expected<ExprPtr> lowerConvWeightGrad(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> x = dimsOf(op.operand(0)), dy = dimsOf(op.operand(1));
  const std::vector<int64_t> inDims(x.begin() + 2, x.end()), outDims(dy.begin() + 2, dy.end());
  const size_t k = inDims.size();
  const int64_t groups = op.getInt("groups");
  const int64_t groupIn = x[1] / groups, groupOut = dy[1] / groups;
  const Window window = readWindow(op, k);
  const int first = ctx.newVars(1 + static_cast<int>(k));
  const ExprPtr n = kir::var(first);
  Index dyi = {n, index[0]};
  Index xi = {n, kir::add(kir::mul(kir::div(index[0], kir::index(groupOut)), kir::index(groupIn)), index[1])};
  ExprPtr inside;
  for (size_t d = 0; d < k; ++d) {
    const ExprPtr o = kir::var(first + 1 + static_cast<int>(d));
    dyi.push_back(o);
    const ExprPtr pos = kir::add(kir::sub(kir::mul(o, kir::index(window.strides[d])), kir::index(window.padBegin[d])),
                                 kir::mul(index[2 + d], kir::index(window.dilations[d])));
    ExprPtr ok = inRange(pos, inDims[d]);
    inside = inside ? kir::binary(kir::BinaryFn::And, inside, ok) : ok;
    xi.push_back(clampIndex(pos, inDims[d]));
  }
  auto xv = ctx.operand(0, xi);
  if (!xv) return xv;
  auto dv = ctx.operand(1, dyi);
  if (!dv) return dv;
  const DType t = op.result()->type().dtype;
  std::vector<int64_t> extents = {x[0]};
  extents.insert(extents.end(), outDims.begin(), outDims.end());
  return kir::reduce(kir::ReduceKind::Sum, first, extents,
                     kir::binary(kir::BinaryFn::Mul, *dv, kir::select(inside, *xv, kir::constant(t, 0))));
}

/// max_pool: padding never wins (it reads as -inf, or an integer type's
/// minimum); NaN propagates.
Expected<ExprPtr> lowerMaxPool(const Op& op, LoweringContext& ctx, const Index& resultIndex) {
  const ChannelsFirst view(op, resultIndex);
  const std::vector<int64_t>& x = view.x;
  const Index& index = view.index;
  const std::vector<int64_t> inDims(x.begin() + 2, x.end());
  const std::vector<int64_t>& kernel = op.getInts("kernel");
  const int first = ctx.newVars(static_cast<int>(kernel.size()));
  const WindowRead read = windowRead(index, readWindow(op, inDims.size()), inDims, first);
  Index xi = {index[0], index[1]};
  xi.insert(xi.end(), read.positions.begin(), read.positions.end());
  auto v = ctx.operand(0, view.toX(std::move(xi)));
  if (!v) return v;
  const DType t = op.result()->type().dtype;
  return kir::reduce(kir::ReduceKind::Max, first, kernel, kir::select(read.inside, *v, lowestOf(t)));
}

/// avg_pool: the window's sum over the count of its real elements, or with
/// count_include_pad of its positions inside the padded input.
Expected<ExprPtr> lowerAvgPool(const Op& op, LoweringContext& ctx, const Index& resultIndex) {
  const ChannelsFirst view(op, resultIndex);
  const std::vector<int64_t>& x = view.x;
  const Index& index = view.index;
  const std::vector<int64_t> inDims(x.begin() + 2, x.end());
  const std::vector<int64_t>& kernel = op.getInts("kernel");
  const Window window = readWindow(op, inDims.size());
  const DType t = op.result()->type().dtype;
  const int first = ctx.newVars(static_cast<int>(kernel.size()));
  const WindowRead read = windowRead(index, window, inDims, first);
  Index xi = {index[0], index[1]};
  xi.insert(xi.end(), read.positions.begin(), read.positions.end());
  auto v = ctx.operand(0, view.toX(std::move(xi)));
  if (!v) return v;
  const ExprPtr zero = kir::constant(t, 0), one = kir::constant(t, 1);
  ExprPtr sum = kir::reduce(kir::ReduceKind::Sum, first, kernel, kir::select(read.inside, *v, zero));
  // The count is a second reduction over the same taps (its own variables).
  const int countFirst = ctx.newVars(static_cast<int>(kernel.size()));
  const WindowRead countRead = windowRead(index, window, inDims, countFirst);
  ExprPtr counted = op.getBool("count_include_pad") ? countRead.insidePadded : countRead.inside;
  ExprPtr count = kir::reduce(kir::ReduceKind::Sum, countFirst, kernel, kir::select(counted, one, zero));
  return kir::binary(kir::BinaryFn::Div, sum, count);
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace lowerings {
using kir::BinaryFn;
using kir::ReduceKind;
using kir::UnaryFn;
const LowerFn MatMul = lowerMatMul;
const LowerFn Conv = lowerConv;
const LowerFn ConvTranspose = lowerConvTranspose;
const LowerFn ConvWeightGrad = lowerConvWeightGrad;
const LowerFn MaxPool = lowerMaxPool;
const LowerFn AvgPool = lowerAvgPool;
// Quantized contractions run only as oneDNN int8 library calls (select-library).
const LowerFn QConv = nullptr;
const LowerFn QMatMul = nullptr;
}  // namespace lowerings

}  // namespace kiln::codegen
