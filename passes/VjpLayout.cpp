// VJP rules of the Layout family: the ops that move data (broadcast, reshape, transpose, slice,
// concat, pad) or move it by index (gather, gather_elements,
// scatter_elements); rules that need static shapes say so in their error.
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

Grads vjpBroadcast(Grad& g, const Op& op, Value* dy) { return {g.unbroadcastTo(dy, x0(op)->type())}; }

Grads vjpReshape(Grad& g, const Op& op, Value* dy) { return {g.reshape(dy, x0(op)->type().shape)}; }

Grads vjpTranspose(Grad& g, const Op& op, Value* dy) {
  const auto& perm = op.getInts("perm");
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return {g.transpose(dy, inverse)};
}

/// A slice is undone axis by axis: dy is reversed along negative steps, a
/// step of |s| > 1 spreads its elements s apart (a trailing axis of s - 1
/// zeros, flattened), and zero padding puts the result back in place.
Grads vjpSlice(Grad& g, const Op& op, Value* dy) {
  auto in = g.dims(x0(op), "slice");
  auto out = g.dims(y0(op), "slice");
  if (!in || !out) return {nullptr};
  const auto &starts = op.getInts("starts"), &steps = op.getInts("steps");
  size_t rank = in->size();
  for (int64_t n : *out)
    if (n == 0) return {g.zeros(x0(op)->type())};
  std::vector<int64_t> pads(2 * rank), revStarts(rank, 0), revEnds(rank, kToEnd), revSteps(rank, 1);
  bool reversed = false;
  for (size_t d = 0; d < rank; ++d) {
    int64_t dim = (*in)[d], n = (*out)[d], step = steps[d], s = starts[d] < 0 ? starts[d] + dim : starts[d];
    int64_t first = step > 0 ? std::clamp<int64_t>(s, 0, dim) : std::clamp<int64_t>(s, -1, dim - 1) + (n - 1) * step;
    pads[d] = first;
    pads[rank + d] = dim - first - ((n - 1) * std::abs(step) + 1);
    if (step < 0) {
      revStarts[d] = -1;
      revEnds[d] = std::numeric_limits<int64_t>::min();
      revSteps[d] = -1;
      reversed = true;
    }
  }
  Value* grad = reversed ? g.slice(dy, revStarts, revEnds, revSteps) : dy;
  for (size_t d = 0; d < rank; ++d) {
    int64_t stride = std::abs(steps[d]), n = (*out)[d];
    if (stride == 1 || n == 1) continue;
    // [.., n, ..] -> [.., n, 1, ..] -> [.., n, stride, ..] -> [.., n * stride, ..] -> first (n-1)*stride+1.
    Shape shape = grad->type().shape;
    Shape split = shape;
    split.insert(split.begin() + d + 1, Dim::fixed(1));
    std::vector<int64_t> spread(2 * (rank + 1), 0);
    spread[rank + 1 + d + 1] = stride - 1;
    Value* spreadOut = g.pad(g.reshape(grad, split), spread);
    shape[d] = Dim::fixed(n * stride);
    std::vector<int64_t> sliceStarts(rank, 0), sliceEnds(rank, kToEnd), sliceSteps(rank, 1);
    sliceEnds[d] = (n - 1) * stride + 1;
    grad = g.slice(g.reshape(spreadOut, shape), sliceStarts, sliceEnds, sliceSteps);
    if (!grad) return {nullptr};
  }
  return {g.pad(grad, pads)};
}

/// Each operand gets its own piece of dy along the axis.
Grads vjpConcat(Grad& g, const Op& op, Value* dy) {
  int64_t rank = y0(op)->type().rank();
  int64_t axis = *normalizeAxis(op.getInt("axis"), rank);
  Grads grads;
  int64_t offset = 0;
  for (Value* x : op.operands()) {
    const Dim& d = x->type().shape[axis];
    if (!d.isStatic()) {
      g.fail("the gradient of concat needs static sizes along the axis, got " + x->type().str());
      return Grads(op.numOperands(), nullptr);
    }
    std::vector<int64_t> starts(rank, 0), ends(rank, kToEnd), steps(rank, 1);
    starts[axis] = offset;
    ends[axis] = offset + d.size;
    grads.push_back(g.slice(dy, starts, ends, steps));
    offset += d.size;
  }
  return grads;
}

/// The input index that output index `i` of a padded dim reads in modes
/// reflect and edge (the interpreter's Pad, runtime/LayoutKernels.cpp).
int64_t paddedSource(int64_t i, int64_t begin, int64_t dim, bool edge) {
  int64_t s = i - begin;
  if (s >= 0 && s < dim) return s;
  if (edge) return std::clamp<int64_t>(s, 0, dim - 1);
  if (dim == 1) return 0;
  const int64_t period = 2 * (dim - 1);  // mirror without repeating the edge
  s = ((s % period) + period) % period;
  return s >= dim ? period - s : s;
}

/// Constant padding is undone by the opposite padding (cropping what was
/// padded, zero-filling what was cropped). Reflect and edge padding read
/// each dim through its own index map (out[i, j] = x[m0(i), m1(j)]), so the
/// adjoint sums dy back one padded dim at a time: a scatter_elements(add)
/// along the dim into zeros, at the map's indices (constants).
Grads vjpPad(Grad& g, const Op& op, Value* dy) {
  const std::string& mode = op.getString("mode");
  std::vector<int64_t> pads = op.getInts("pads");
  if (mode == "constant") {
    for (int64_t& p : pads) p = -p;
    return {g.pad(dy, pads)};
  }
  Value* x = x0(op);
  auto in = g.dims(x, "pad");
  auto out = g.dims(y0(op), "pad");
  if (!in || !out) return {nullptr};
  const size_t rank = in->size();
  const DType dtype = x->type().dtype;
  std::vector<int64_t> shape = *out;
  Value* grad = dy;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t begin = pads[d], end = pads[rank + d];
    if (begin == 0 && end == 0) continue;
    std::vector<int64_t> mapShape(rank, 1);
    mapShape[d] = shape[d];
    DenseTensor map = DenseTensor::zeros(TensorType{DType::I64, staticShape(mapShape)});
    for (int64_t i = 0; i < shape[d]; ++i) map.setInt(i, paddedSource(i, begin, (*in)[d], mode == "edge"));
    Value* indices = g.broadcastTo(g.constant(std::move(map)), TensorType{DType::I64, staticShape(shape)});
    shape[d] = (*in)[d];
    grad = g.emit(OpKind::ScatterElements, {g.zeros(TensorType{dtype, staticShape(shape)}), indices, grad},
                  {{"axis", Attribute(static_cast<int64_t>(d))}, {"reduction", Attribute("add")}});
  }
  return {grad};
}

/// gather's adjoint adds dy's slices into zeros at the indices: a
/// scatter_elements(add) over data viewed as [outer, dim, inner].
Grads vjpGather(Grad& g, const Op& op, Value* dy) {
  Value *data = op.operand(0), *indices = op.operand(1);
  auto dataDims = g.dims(data, "gather");
  auto indexDims = g.dims(indices, "gather");
  if (!dataDims || !indexDims) return {nullptr, nullptr};
  int64_t axis = *normalizeAxis(op.getInt("axis"), data->type().rank());
  int64_t outer = 1, inner = 1, count = numElements(indices->type().shape);
  for (int64_t d = 0; d < axis; ++d) outer *= (*dataDims)[d];
  for (size_t d = axis + 1; d < dataDims->size(); ++d) inner *= (*dataDims)[d];
  Shape viewed = staticShape({outer, count, inner});
  Value* idx = g.reshape(indices, staticShape({1, count, 1}));
  idx = g.broadcastTo(idx, TensorType{indices->type().dtype, viewed});
  Value* zeros = g.zeros(TensorType{data->type().dtype, staticShape({outer, (*dataDims)[axis], inner})});
  Value* summed = g.emit(OpKind::ScatterElements, {zeros, idx, g.reshape(dy, viewed)},
                         {{"axis", Attribute(int64_t{1})}, {"reduction", Attribute("add")}});
  return {g.reshape(summed, data->type().shape), nullptr};
}

Grads vjpGatherElements(Grad& g, const Op& op, Value* dy) {
  Value* data = op.operand(0);
  auto dims = g.dims(data, "gather_elements");
  if (!dims) return {nullptr, nullptr};
  Value* zeros = g.zeros(data->type());
  return {g.emit(OpKind::ScatterElements, {zeros, op.operand(1), dy},
                 {{"axis", Attribute(op.getInt("axis"))}, {"reduction", Attribute("add")}}),
          nullptr};
}

/// The updates' gradient is dy gathered at the indices. Without a
/// reduction, data's is dy with the overwritten places zeroed; with
/// reduction add, dy itself. Mul, max and min follow PyTorch's
/// scatter_reduce (include_self=True) backward:
///  - mul: out[p] = data[p] * prod of the updates at p. data's gradient is
///    dy times that product (a scatter of the updates into ones, no
///    division); an update's is dy[p] times the product of everything else
///    at p: out[p] / u where u != 0, and, where u == 0, the product of the
///    nonzero others when u is the only zero at p, else 0 (zeros counted by
///    a scatter add).
///  - max / min: dy[p] is split evenly among data[p] and the updates equal
///    to out[p] (ties share it, as PyTorch does).
Grads vjpScatterElements(Grad& g, const Op& op, Value* dy) {
  const std::string& reduction = op.getString("reduction");
  Value *data = op.operand(0), *indices = op.operand(1), *updates = op.operand(2), *out = y0(op);
  AttrMap axis{{"axis", Attribute(op.getInt("axis"))}};
  auto scatter = [&](Value* into, Value* values, const char* how) {
    AttrMap attrs = axis;
    attrs["reduction"] = Attribute(how);
    return g.emit(OpKind::ScatterElements, {into, indices, values}, attrs);
  };
  auto gather = [&](Value* v) { return g.emit(OpKind::GatherElements, {v, indices}, axis); };
  if (reduction == "add") return {dy, nullptr, gather(dy)};
  if (reduction == "none") {
    auto dims = g.dims(updates, "scatter_elements");
    if (!dims) return {nullptr, nullptr, nullptr};
    Value* cleared = g.emit(OpKind::ScatterElements, {dy, indices, g.zeros(updates->type())}, axis);
    return {cleared, nullptr, gather(dy)};
  }
  if (!g.dims(data, "scatter_elements") || !g.dims(updates, "scatter_elements")) return {nullptr, nullptr, nullptr};
  Value* zerosData = g.zeros(data->type());
  if (reduction == "mul") {
    Value* ones = g.add(zerosData, 1.0);
    Value* product = scatter(ones, updates, "mul");  // the updates' product at each place
    Value* dData = g.mul(dy, product);
    Value* isZero = g.cmp(OpKind::Eq, updates, g.like(updates, 0.0));
    Value* nonzero = g.select(isZero, g.like(updates, 1.0), updates);
    Value* othersTimesU = scatter(data, nonzero, "mul");  // data times the nonzero updates
    Value* zero = g.like(updates, 0.0);
    Value* one = g.like(updates, 1.0);
    Value* zeroCount = gather(scatter(zerosData, g.select(isZero, one, zero), "add"));
    Value* atPlace = gather(othersTimesU);
    Value* noZeros = g.cmp(OpKind::Eq, zeroCount, g.like(updates, 0.0));
    Value* oneZero = g.cmp(OpKind::Eq, zeroCount, g.like(updates, 1.0));
    // u != 0: the product without u; u == 0: the others' product when u is the only zero.
    Value* whenNonzero = g.where(noZeros, g.div(atPlace, nonzero));
    Value* whenZero = g.where(oneZero, atPlace);
    Value* withoutU = g.select(isZero, whenZero, whenNonzero);
    return {dData, nullptr, g.mul(gather(dy), withoutU)};
  }
  if (reduction == "max" || reduction == "min") {
    Value* dataIsOut = g.cmp(OpKind::Eq, data, out);
    Value* updateIsOut = g.cmp(OpKind::Eq, updates, gather(out));
    auto indicator = [&](Value* c, Value* like) {
      Value* zero = g.like(like, 0.0);
      Value* one = g.like(like, 1.0);
      return g.select(c, one, zero);
    };
    Value* fromUpdates = indicator(updateIsOut, updates);
    Value* fromData = indicator(dataIsOut, data);
    Value* count = scatter(fromData, fromUpdates, "add");
    Value* share = g.div(dy, count);
    return {g.where(dataIsOut, share), nullptr, g.where(updateIsOut, gather(share))};
  }
  g.fail("the gradient of scatter_elements with reduction '" + reduction + "' is not implemented");
  return {nullptr, nullptr, nullptr};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace entries {
const VjpEntry Constant = kNone;
const VjpEntry Iota = kNone;
const VjpEntry Broadcast = rule(vjpBroadcast);
const VjpEntry Reshape = rule(vjpReshape);
const VjpEntry Transpose = rule(vjpTranspose);
const VjpEntry Slice = rule(vjpSlice);
const VjpEntry Concat = rule(vjpConcat);
const VjpEntry Pad = rule(vjpPad);
const VjpEntry Gather = rule(vjpGather);
const VjpEntry GatherElements = rule(vjpGatherElements);
const VjpEntry ScatterElements = rule(vjpScatterElements);
}  // namespace entries

}  // namespace kiln::vjp
