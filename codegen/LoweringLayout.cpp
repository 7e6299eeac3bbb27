// Lowerings of the Layout family: constants, iota and the ops that move data (broadcast,
// reshape, transpose, slice, concat, pad) or move it by index (gather,
// gather_elements, scatter_elements); every read index is clamped in bounds.
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

/// A constant lowers to a literal when all its elements are equal (the
/// splats that decompositions introduce); other constants are buffers that
/// the executor provides, never lowered.
Expected<ExprPtr> lowerConstant(const Op& op, LoweringContext&, const Index&) {
  const DenseTensor& t = op.getTensor("value");
  const int64_t n = t.numElements();
  if (!isSplat(t))
    return op.emitError("a non-splat constant has no scalar lowering; it is passed to kernels as a buffer");
  if (n == 0) return kir::constantInt(t.type.dtype, 0);
  return isFloat(t.type.dtype) ? kir::constant(t.type.dtype, t.getDouble(0))
                               : kir::constantInt(t.type.dtype, t.getInt(0));
}

Expected<ExprPtr> lowerIota(const Op& op, LoweringContext&, const Index& index) {
  auto axis = checkedAxis(op, op.getInt("axis"), op.result()->type().rank());
  if (!axis) return axis.takeError();
  return kir::cast(index[*axis], op.result()->type().dtype);
}

// --- Layout ------------------------------------------------------------------------

Expected<ExprPtr> lowerBroadcast(const Op& op, LoweringContext& ctx, const Index& index) {
  return ctx.operand(0, broadcastIndex(index, dimsOf(op.operand(0))));
}

/// The input index of a reshape from `in` to `out` dims read at `index`.
/// The dims split into runs with equal products on both sides ([N, C, 28]
/// and [N, C, 14, 2]: [N], [C], [28] = [14, 2]), and each run is unravelled
/// on its own, so a dim that a reshape keeps costs no division and a split
/// one a division by its inner size, instead of unravelling the whole flat
/// offset.
Index reshapeIndex(const Index& index, const std::vector<int64_t>& out, const std::vector<int64_t>& in) {
  Index result;
  size_t i = 0, j = 0;
  while (i < out.size() || j < in.size()) {
    const size_t i0 = i, j0 = j;
    int64_t outSize = 1, inSize = 1;
    // Take at least one dim from each side that has one left; unit dims
    // join the current run.
    if (i < out.size()) outSize *= out[i++];
    if (j < in.size()) inSize *= in[j++];
    while (outSize != inSize || (i < out.size() && out[i] == 1) || (j < in.size() && in[j] == 1)) {
      if (i < out.size() && (outSize < inSize || (outSize == inSize && out[i] == 1)))
        outSize *= out[i++];
      else if (j < in.size())
        inSize *= in[j++];
      else
        break;
    }
    if (outSize != inSize) return unravel(linearize(index, out), in);  // not expected: products of equal totals
    const Index part(index.begin() + static_cast<std::ptrdiff_t>(i0), index.begin() + static_cast<std::ptrdiff_t>(i));
    const std::vector<int64_t> outDims(out.begin() + static_cast<std::ptrdiff_t>(i0),
                                       out.begin() + static_cast<std::ptrdiff_t>(i));
    const std::vector<int64_t> inDims(in.begin() + static_cast<std::ptrdiff_t>(j0),
                                      in.begin() + static_cast<std::ptrdiff_t>(j));
    const Index mapped = unravel(linearize(part, outDims), inDims);
    result.insert(result.end(), mapped.begin(), mapped.end());
  }
  return result;
}

Expected<ExprPtr> lowerReshape(const Op& op, LoweringContext& ctx, const Index& index) {
  return ctx.operand(0, reshapeIndex(index, dimsOf(op.result()), dimsOf(op.operand(0))));
}

Expected<ExprPtr> lowerTranspose(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t>& perm = op.getInts("perm");
  Index in(index.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    auto axis = checkedAxis(op, perm[i], static_cast<int64_t>(index.size()));
    if (!axis) return axis.takeError();
    in[*axis] = index[i];
  }
  return ctx.operand(0, in);
}

Expected<ExprPtr> lowerSlice(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> shape = dimsOf(op.operand(0));
  const std::vector<int64_t>& starts = op.getInts("starts");
  const std::vector<int64_t>& steps = op.getInts("steps");
  Index in;
  for (size_t d = 0; d < shape.size(); ++d) {
    // The interpreter's normalization: negative starts count from the end,
    // then clamp to where a walk in the step's direction can begin.
    int64_t start = starts[d] < 0 ? starts[d] + shape[d] : starts[d];
    start = steps[d] > 0 ? std::clamp<int64_t>(start, 0, shape[d]) : std::clamp<int64_t>(start, -1, shape[d] - 1);
    in.push_back(kir::add(kir::index(start), kir::mul(index[d], kir::index(steps[d]))));
  }
  return ctx.operand(0, in);
}

Expected<ExprPtr> lowerConcat(const Op& op, LoweringContext& ctx, const Index& index) {
  auto checked = checkedAxis(op, op.getInt("axis"), static_cast<int64_t>(index.size()));
  if (!checked) return checked.takeError();
  const int64_t axis = *checked;
  // Operands are tried from the last: each select keeps the later operand
  // unless the index lies before that operand's start.
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (size_t k = 0; k < op.numOperands(); ++k) {
    offsets.push_back(offset);
    offset += dimsOf(op.operand(k))[axis];
  }
  ExprPtr result;
  for (size_t k = op.numOperands(); k-- > 0;) {
    const int64_t size = dimsOf(op.operand(k))[axis];
    if (size == 0) continue;
    Index in = index;
    in[axis] = clampIndex(kir::sub(index[axis], kir::index(offsets[k])), size);
    auto v = ctx.operand(k, in);
    if (!v) return v;
    result = result
                 ? kir::select(kir::binary(kir::BinaryFn::Lt, index[axis], kir::index(offsets[k] + size)), *v, result)
                 : *v;
  }
  if (!result) return op.emitError("concat of operands that are all empty along the axis has no elements");
  return result;
}

Expected<ExprPtr> lowerPad(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> shape = dimsOf(op.operand(0));
  const std::vector<int64_t>& pads = op.getInts("pads");
  const std::string& mode = op.getString("mode");
  const DType dtype = op.result()->type().dtype;
  const ExprPtr padValue = kir::constant(dtype, op.getFloat("value"));
  if (numElements(op.operand(0)->type().shape) == 0) {
    if (mode == "constant") return padValue;
    return op.emitError("mode '" + mode + "' cannot pad an empty tensor");
  }
  Index in;
  ExprPtr inside;
  for (size_t d = 0; d < shape.size(); ++d) {
    ExprPtr s = kir::sub(index[d], kir::index(pads[d]));
    if (mode == "constant") {
      ExprPtr ok = inRange(s, shape[d]);
      inside = inside ? kir::binary(kir::BinaryFn::And, inside, ok) : ok;
      s = clampIndex(s, shape[d]);
    } else if (mode == "edge") {
      s = clampIndex(s, shape[d]);
    } else if (mode == "reflect") {
      if (shape[d] == 1) {
        s = kir::index(0);
      } else {
        // Mirror without repeating the edge: period 2(dim-1), folded back.
        const ExprPtr period = kir::index(2 * (shape[d] - 1));
        ExprPtr m = kir::binary(kir::BinaryFn::Mod, s, period);
        s = kir::select(kir::binary(kir::BinaryFn::Ge, m, kir::index(shape[d])), kir::sub(period, m), m);
      }
    } else {
      return op.emitError("unknown mode '" + mode + "' (expected constant, reflect or edge)");
    }
    in.push_back(s);
  }
  auto v = ctx.operand(0, in);
  if (!v || !inside) return v;
  return kir::select(inside, *v, padValue);
}

/// A gathered index read from `indices`: negative counts from the end, and
/// clamped so that a bad index cannot read outside the data (the executor
/// checks indices before running the kernel and reports bad ones).
ExprPtr normalizedGatherIndex(const ExprPtr& raw, int64_t dim) {
  ExprPtr i = kir::cast(raw, DType::I64);
  i = kir::select(kir::binary(kir::BinaryFn::Lt, i, kir::index(0)), kir::add(i, kir::index(dim)), i);
  return clampIndex(i, dim);
}

Expected<ExprPtr> lowerGather(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> data = dimsOf(op.operand(0));
  const int64_t indicesRank = op.operand(1)->type().rank();
  auto checked = checkedAxis(op, op.getInt("axis"), static_cast<int64_t>(data.size()));
  if (!checked) return checked.takeError();
  const int64_t axis = *checked;
  Index idx(index.begin() + axis, index.begin() + axis + indicesRank);
  auto raw = ctx.operand(1, idx);
  if (!raw) return raw;
  Index in(index.begin(), index.begin() + axis);
  in.push_back(normalizedGatherIndex(*raw, data[axis]));
  in.insert(in.end(), index.begin() + axis + indicesRank, index.end());
  return ctx.operand(0, in);
}

Expected<ExprPtr> lowerGatherElements(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> data = dimsOf(op.operand(0));
  auto checked = checkedAxis(op, op.getInt("axis"), static_cast<int64_t>(data.size()));
  if (!checked) return checked.takeError();
  const int64_t axis = *checked;
  auto raw = ctx.operand(1, index);
  if (!raw) return raw;
  Index in = index;
  in[axis] = normalizedGatherIndex(*raw, data[axis]);
  return ctx.operand(0, in);
}

/// scatter_elements as a gather: result element `index` is data's element
/// combined with every update whose (normalized) index along `axis` is
/// index[axis] and whose other coordinates are index's. Each update is
/// found by a reduction over the `axis` dim of indices, so the cost is
/// result elements x indices.shape[axis]. Without a reduction the last
/// matching update wins (the interpreter writes them in order); with one,
/// matching updates are combined (sum, product, max, min) and then with
/// data, in another order than the interpreter's (floats may differ in the
/// last bits). The executor checks the indices first, as for gathers.
Expected<ExprPtr> lowerScatterElements(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> data = dimsOf(op.operand(0)), indices = dimsOf(op.operand(1));
  auto checked = checkedAxis(op, op.getInt("axis"), static_cast<int64_t>(data.size()));
  if (!checked) return checked.takeError();
  const int64_t axis = *checked;
  const std::string& reduction = op.getString("reduction");
  const DType t = op.result()->type().dtype;
  auto current = ctx.operand(0, index);
  if (!current) return current;
  if (indices[axis] == 0) return *current;
  // Updates exist only where index lies within indices' shape (other dims).
  ExprPtr covered;
  for (size_t d = 0; d < data.size(); ++d) {
    if (static_cast<int64_t>(d) == axis || indices[d] >= data[d]) continue;
    ExprPtr ok = kir::binary(kir::BinaryFn::Lt, index[d], kir::index(indices[d]));
    covered = covered ? kir::binary(kir::BinaryFn::And, covered, ok) : ok;
  }
  for (int64_t extent : indices)
    if (extent == 0) return *current;
  // Reads indices and updates at index with index[axis] replaced by the
  // reduction variable `j`, other coordinates clamped to indices' shape.
  auto readAt = [&](int j) -> Expected<std::pair<ExprPtr, ExprPtr>> {
    Index at;
    for (size_t d = 0; d < data.size(); ++d)
      at.push_back(static_cast<int64_t>(d) == axis ? kir::var(j) : clampIndex(index[d], indices[d]));
    auto raw = ctx.operand(1, at);
    if (!raw) return raw.takeError();
    auto update = ctx.operand(2, at);
    if (!update) return update.takeError();
    ExprPtr target = kir::cast(*raw, DType::I64);
    target = kir::select(kir::binary(kir::BinaryFn::Lt, target, kir::index(0)), kir::add(target, kir::index(data[axis])),
                         target);
    ExprPtr match = kir::binary(kir::BinaryFn::Eq, target, index[axis]);
    if (covered) match = kir::binary(kir::BinaryFn::And, covered, match);
    return std::make_pair(match, *update);
  };
  const int j = ctx.newVars(1);
  auto read = readAt(j);
  if (!read) return read.takeError();
  const auto& [match, update] = *read;
  if (reduction == "none") {
    // The last matching j, or -1.
    ExprPtr last = kir::reduce(kir::ReduceKind::Max, j, {indices[axis]},
                               kir::select(match, kir::var(j), kir::index(-1)));
    Index at;
    for (size_t d = 0; d < data.size(); ++d)
      at.push_back(static_cast<int64_t>(d) == axis ? clampIndex(last, indices[d]) : clampIndex(index[d], indices[d]));
    auto lastUpdate = ctx.operand(2, at);
    if (!lastUpdate) return lastUpdate;
    return kir::select(kir::binary(kir::BinaryFn::Ge, last, kir::index(0)), *lastUpdate, *current);
  }
  if (reduction == "add") {
    ExprPtr sum = kir::reduce(kir::ReduceKind::Sum, j, {indices[axis]}, kir::select(match, update, literal(t, 0)));
    return kir::binary(kir::BinaryFn::Add, *current, sum);
  }
  if (reduction == "mul") {
    ExprPtr prod =
        kir::reduce(kir::ReduceKind::Prod, j, {indices[axis]}, kir::select(match, update, literal(t, 1)));
    return kir::binary(kir::BinaryFn::Mul, *current, prod);
  }
  if (reduction == "max") {
    ExprPtr m = kir::reduce(kir::ReduceKind::Max, j, {indices[axis]}, kir::select(match, update, lowestOf(t)));
    return kir::binary(kir::BinaryFn::Max, *current, m);
  }
  if (reduction == "min") {
    ExprPtr m = kir::reduce(kir::ReduceKind::Min, j, {indices[axis]}, kir::select(match, update, highestOf(t)));
    return kir::binary(kir::BinaryFn::Min, *current, m);
  }
  return op.emitError("unknown reduction '" + reduction + "' (expected none, add, mul, max or min)");
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace lowerings {
using kir::BinaryFn;
using kir::ReduceKind;
using kir::UnaryFn;
const LowerFn Constant = lowerConstant;
const LowerFn Iota = lowerIota;
const LowerFn Broadcast = lowerBroadcast;
const LowerFn Reshape = lowerReshape;
const LowerFn Transpose = lowerTranspose;
const LowerFn Slice = lowerSlice;
const LowerFn Concat = lowerConcat;
const LowerFn Pad = lowerPad;
const LowerFn Gather = lowerGather;
const LowerFn GatherElements = lowerGatherElements;
const LowerFn ScatterElements = lowerScatterElements;
}  // namespace lowerings

}  // namespace kiln::codegen
