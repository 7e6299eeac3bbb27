// The lowering table and one lowering function per primitive op. Every
// function maps a result multi-index to the scalar expression of that
// element; operands are read through the LoweringContext with indices that
// are always in bounds (broadcast dims read index 0, concat and pad clamp
// the index of the operand they do not select, gathers clamp their indices),
// because the emitters evaluate both sides of a select.
#include "codegen/Lowering.h"

#include <algorithm>
#include <limits>
#include <numbers>
#include <numeric>

namespace kiln::codegen {
namespace {

using kir::ExprPtr;
using Index = std::vector<ExprPtr>;

std::vector<int64_t> dimsOf(const Value* v) { return staticDims(v->type().shape); }

/// The index of an operand of shape `shape` that broadcasts to a result
/// indexed by `index` (NumPy rules: aligned at the back, size-1 dims read 0).
Index broadcastIndex(const Index& index, const std::vector<int64_t>& shape) {
  Index out;
  const size_t lead = index.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) out.push_back(shape[d] == 1 ? kir::index(0) : index[lead + d]);
  return out;
}

Index unravel(const ExprPtr& linear, const std::vector<int64_t>& shape);

bool indexConstant(const ExprPtr& e, int64_t& out) {
  if (e->kind != kir::ExprKind::Const || e->type != DType::I64) return false;
  out = e->intValue;
  return true;
}

/// Structural equality of two expressions.
bool sameExpr(const ExprPtr& a, const ExprPtr& b) {
  if (a == b) return true;
  if (a->kind != b->kind || a->type != b->type || a->intValue != b->intValue || a->floatValue != b->floatValue ||
      a->id != b->id || a->unary != b->unary || a->binary != b->binary || a->reduce != b->reduce ||
      a->selectLast != b->selectLast || a->extents != b->extents || a->args.size() != b->args.size())
    return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!sameExpr(a->args[i], b->args[i])) return false;
  return true;
}

/// The offset `linear` when `index` is unravel(linear, shape), else null. A
/// reshape reads its input at the unravelled offset of the index it
/// writes; read from a buffer of the same row-major layout, the divisions
/// and remainders of the unravelling cancel, and the load is at `linear`
/// (a plain copy that vectorizes, instead of a division chain per element).
ExprPtr unraveledOffset(const Index& index, const std::vector<int64_t>& shape) {
  if (index.size() != shape.size() || shape.empty()) return nullptr;
  ExprPtr linear;
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0 && !linear;) {
    if (shape[d] != 1 || d == 0) {
      ExprPtr q = index[d];
      if (d > 0) {
        int64_t size = 0;
        if (q->kind != kir::ExprKind::Binary || q->binary != kir::BinaryFn::Rem || !indexConstant(q->args[1], size) ||
            size != shape[d])
          return nullptr;
        q = q->args[0];
      }
      if (stride == 1) {
        linear = q;
      } else {
        int64_t by = 0;
        if (q->kind != kir::ExprKind::Binary || q->binary != kir::BinaryFn::Div || !indexConstant(q->args[1], by) ||
            by != stride)
          return nullptr;
        linear = q->args[0];
      }
    }
    stride *= shape[d];
  }
  const Index expected = unravel(linear, shape);
  for (size_t d = 0; d < shape.size(); ++d)
    if (!sameExpr(index[d], expected[d])) return nullptr;
  return linear;
}

/// Row-major linear offset of `index` in `shape`. A run of dims whose
/// index is an unravelled offset (a reshape's input index, see
/// reshapeIndex) contributes that offset, without its divisions.
ExprPtr linearize(const Index& index, const std::vector<int64_t>& shape) {
  ExprPtr offset = kir::index(0);
  for (size_t a = 0; a < shape.size();) {
    size_t b = shape.size();
    ExprPtr run;
    for (; b > a + 1; --b) {
      run = unraveledOffset(Index(index.begin() + static_cast<std::ptrdiff_t>(a),
                                  index.begin() + static_cast<std::ptrdiff_t>(b)),
                            std::vector<int64_t>(shape.begin() + static_cast<std::ptrdiff_t>(a),
                                                 shape.begin() + static_cast<std::ptrdiff_t>(b)));
      if (run) break;
    }
    if (!run) {
      run = index[a];
      b = a + 1;
    }
    int64_t size = 1;
    for (size_t d = a; d < b; ++d) size *= shape[d];
    offset = kir::add(kir::mul(offset, kir::index(size)), run);
    a = b;
  }
  return offset;
}

/// The multi-index of row-major offset `linear` in `shape`.
Index unravel(const ExprPtr& linear, const std::vector<int64_t>& shape) {
  Index out(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    ExprPtr q = kir::div(linear, kir::index(stride));
    // The first dim needs no modulo: the offset is below the element count.
    out[d] = d == 0 ? q : kir::rem(q, kir::index(shape[d]));
    stride *= shape[d];
  }
  return out;
}

ExprPtr clampIndex(const ExprPtr& i, int64_t size) {
  return kir::max(kir::min(i, kir::index(std::max<int64_t>(size - 1, 0))), kir::index(0));
}

/// The constant `value` in dtype `t`.
ExprPtr literal(DType t, int64_t value) {
  return isFloat(t) ? kir::constant(t, static_cast<double>(value)) : kir::constantInt(t, value);
}

/// The value no element of dtype `t` is below: -inf for floats, the
/// minimum of an integer type (0 for unsigned). Max reductions start there.
ExprPtr lowestOf(DType t) {
  if (isFloat(t)) return kir::constant(t, -std::numeric_limits<double>::infinity());
  switch (t) {
    case DType::I64: return kir::constantInt(t, std::numeric_limits<int64_t>::min());
    case DType::I32: return kir::constantInt(t, std::numeric_limits<int32_t>::min());
    case DType::I16: return kir::constantInt(t, std::numeric_limits<int16_t>::min());
    case DType::I8: return kir::constantInt(t, std::numeric_limits<int8_t>::min());
    default: return kir::constantInt(t, 0);  // unsigned, bool
  }
}

/// The largest value of dtype `t` (+inf for floats); Min reductions start there.
ExprPtr highestOf(DType t) {
  if (isFloat(t)) return kir::constant(t, std::numeric_limits<double>::infinity());
  switch (t) {
    case DType::I64: return kir::constantInt(t, std::numeric_limits<int64_t>::max());
    case DType::I32: return kir::constantInt(t, std::numeric_limits<int32_t>::max());
    case DType::I16: return kir::constantInt(t, std::numeric_limits<int16_t>::max());
    case DType::I8: return kir::constantInt(t, std::numeric_limits<int8_t>::max());
    case DType::U8: return kir::constantInt(t, std::numeric_limits<uint8_t>::max());
    case DType::U16: return kir::constantInt(t, std::numeric_limits<uint16_t>::max());
    case DType::U32: return kir::constantInt(t, std::numeric_limits<uint32_t>::max());
    case DType::U64: return kir::constantInt(t, -1);  // the bits of 2^64 - 1
    default: return kir::constantInt(t, 1);  // bool
  }
}

ExprPtr inRange(const ExprPtr& i, int64_t size) {
  return kir::binary(kir::BinaryFn::And, kir::binary(kir::BinaryFn::Ge, i, kir::index(0)),
                     kir::binary(kir::BinaryFn::Lt, i, kir::index(size)));
}

// --- Elementwise -----------------------------------------------------------------

template <kir::UnaryFn Fn>
Expected<ExprPtr> lowerUnary(const Op& op, LoweringContext& ctx, const Index& index) {
  auto x = ctx.operand(0, index);
  if (!x) return x;
  return kir::unary(Fn, *x);
}

/// Reads every operand of a broadcasting op at `index`.
Expected<std::vector<ExprPtr>> broadcastOperands(const Op& op, LoweringContext& ctx, const Index& index) {
  std::vector<ExprPtr> values;
  for (size_t i = 0; i < op.numOperands(); ++i) {
    auto v = ctx.operand(i, broadcastIndex(index, dimsOf(op.operand(i))));
    if (!v) return v.takeError();
    values.push_back(*v);
  }
  return values;
}

template <kir::BinaryFn Fn>
Expected<ExprPtr> lowerBinary(const Op& op, LoweringContext& ctx, const Index& index) {
  auto v = broadcastOperands(op, ctx, index);
  if (!v) return v.takeError();
  return kir::binary(Fn, (*v)[0], (*v)[1]);
}

Expected<ExprPtr> lowerSelect(const Op& op, LoweringContext& ctx, const Index& index) {
  auto v = broadcastOperands(op, ctx, index);
  if (!v) return v.takeError();
  return kir::select((*v)[0], (*v)[1], (*v)[2]);
}

Expected<ExprPtr> lowerCast(const Op& op, LoweringContext& ctx, const Index& index) {
  auto x = ctx.operand(0, index);
  if (!x) return x;
  return kir::cast(*x, op.result()->type().dtype);
}

// --- Constants ---------------------------------------------------------------------

bool isSplat(const DenseTensor& t) {
  for (int64_t i = 1; i < t.numElements(); ++i)
    if (t.getDouble(i) != t.getDouble(0) || t.getInt(i) != t.getInt(0)) return false;
  return true;
}

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

// --- Random ------------------------------------------------------------------------

/// `v >> k` on the 64 bits of i64 `v`, as unsigned (logical shift), built
/// from operations the kernel IR has: the low 63 bits divided by 2^k, plus
/// the sign bit moved to bit 63 - k. LLVM turns it back into one shift.
ExprPtr shiftRightLogical(const ExprPtr& v, int k) {
  const ExprPtr low = kir::binary(kir::BinaryFn::And, v, kir::index(std::numeric_limits<int64_t>::max()));
  const ExprPtr shifted = kir::binary(kir::BinaryFn::Div, low, kir::index(int64_t{1} << k));
  const ExprPtr top = kir::select(kir::binary(kir::BinaryFn::Lt, v, kir::index(0)), kir::index(int64_t{1} << (63 - k)),
                                  kir::index(0));
  return kir::binary(kir::BinaryFn::Add, shifted, top);
}

/// u_i in [0, 1) as an f64 expression: the interpreter's sample of element
/// `i` (runtime/RandomKernels.cpp), (splitmix64(seed * G + i) >> 11) * 2^-53,
/// in wrapping i64 arithmetic on the same bits.
ExprPtr uniformAt(int64_t seed, const ExprPtr& i) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  // splitmix64 adds G first; seed * G + G folds on the host (unsigned, so
  // wrapping is defined).
  const uint64_t start = static_cast<uint64_t>(seed) * kGolden + kGolden;
  auto bits = [](uint64_t u) { return kir::index(static_cast<int64_t>(u)); };
  ExprPtr z = kir::binary(kir::BinaryFn::Add, bits(start), i);
  z = kir::binary(kir::BinaryFn::Mul, kir::binary(kir::BinaryFn::Xor, z, shiftRightLogical(z, 30)),
                  bits(0xBF58476D1CE4E5B9ull));
  z = kir::binary(kir::BinaryFn::Mul, kir::binary(kir::BinaryFn::Xor, z, shiftRightLogical(z, 27)),
                  bits(0x94D049BB133111EBull));
  z = kir::binary(kir::BinaryFn::Xor, z, shiftRightLogical(z, 31));
  return kir::binary(kir::BinaryFn::Mul, kir::cast(shiftRightLogical(z, 11), DType::F64),
                     kir::constant(DType::F64, 0x1.0p-53));
}

/// random_uniform: low + (high - low) * u_i in f64, then the result dtype.
Expected<ExprPtr> lowerRandomUniform(const Op& op, LoweringContext&, const Index& index) {
  const ExprPtr i = linearize(index, dimsOf(op.result()));
  const double low = op.getFloat("low"), high = op.getFloat("high");
  const ExprPtr u = uniformAt(op.getInt("seed"), i);
  const ExprPtr v = kir::binary(kir::BinaryFn::Add, kir::constant(DType::F64, low),
                                kir::binary(kir::BinaryFn::Mul, kir::constant(DType::F64, high - low), u));
  return kir::cast(v, op.result()->type().dtype);
}

/// random_normal: Box-Muller of u_{2j}, u_{2j+1} (j = i / 2), the cosine
/// for even i and the sine for odd i, as the interpreter; in f64.
Expected<ExprPtr> lowerRandomNormal(const Op& op, LoweringContext&, const Index& index) {
  using kir::BinaryFn;
  const ExprPtr i = linearize(index, dimsOf(op.result()));
  const int64_t seed = op.getInt("seed");
  const ExprPtr odd = kir::binary(BinaryFn::Rem, i, kir::index(2));
  const ExprPtr even = kir::binary(BinaryFn::Sub, i, odd);  // 2j
  const ExprPtr u1 = kir::binary(BinaryFn::Max, uniformAt(seed, even), kir::constant(DType::F64, 0x1.0p-53));
  const ExprPtr u2 = uniformAt(seed, kir::binary(BinaryFn::Add, even, kir::index(1)));
  const ExprPtr radius = kir::unary(
      kir::UnaryFn::Sqrt, kir::binary(BinaryFn::Mul, kir::constant(DType::F64, -2.0), kir::unary(kir::UnaryFn::Log, u1)));
  const ExprPtr angle = kir::binary(BinaryFn::Mul, kir::constant(DType::F64, 2.0 * std::numbers::pi), u2);
  const ExprPtr z = kir::binary(
      BinaryFn::Mul, radius,
      kir::select(kir::binary(BinaryFn::Eq, odd, kir::index(0)), kir::unary(kir::UnaryFn::Cos, angle),
                  kir::unary(kir::UnaryFn::Sin, angle)));
  const ExprPtr v = kir::binary(BinaryFn::Add, kir::constant(DType::F64, op.getFloat("mean")),
                                kir::binary(BinaryFn::Mul, kir::constant(DType::F64, op.getFloat("std")), z));
  return kir::cast(v, op.result()->type().dtype);
}

// --- Reductions ----------------------------------------------------------------------

/// The input index of a reduction: kept dims from the result index, reduced
/// dims from the reduction variables starting at `firstVar`.
Index reductionInput(const Index& index, const std::vector<bool>& reduced, bool keepdims, int firstVar) {
  Index in;
  int next = firstVar;
  size_t r = 0;
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (reduced[d]) {
      in.push_back(kir::var(next++));
      if (keepdims) ++r;
    } else {
      in.push_back(index[r++]);
    }
  }
  return in;
}

template <kir::ReduceKind Kind, bool Mean = false>
Expected<ExprPtr> lowerReduce(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> shape = dimsOf(op.operand(0));
  std::vector<bool> reduced(shape.size(), op.getInts("axes").empty());
  for (int64_t axis : op.getInts("axes")) {
    auto checked = checkedAxis(op, axis, static_cast<int64_t>(shape.size()));
    if (!checked) return checked.takeError();
    reduced[*checked] = true;
  }
  std::vector<int64_t> extents;
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (reduced[d]) {
      extents.push_back(shape[d]);
      count *= shape[d];
    }
  const int first = ctx.newVars(static_cast<int>(extents.size()));
  auto body = ctx.operand(0, reductionInput(index, reduced, op.getBool("keepdims"), first));
  if (!body) return body;
  ExprPtr r = kir::reduce(Kind, first, extents, *body);
  if constexpr (Mean) {
    const DType t = r->type;
    const double n = static_cast<double>(count);
    // A count f32 cannot hold (above 2^24, not a multiple of its ulp there)
    // would be rounded before the division; dividing in f64 and rounding
    // once keeps the mean the sum over the count (f16 and bf16 compute in
    // f32, so theirs is the same test).
    if (isFloat(t) && t != DType::F64 && static_cast<double>(static_cast<float>(n)) != n)
      return kir::cast(kir::binary(kir::BinaryFn::Div, kir::cast(r, DType::F64), kir::constant(DType::F64, n)), t);
    if (isFloat(t)) return kir::binary(kir::BinaryFn::Div, r, kir::constant(t, n));
    if (count == 0) return op.emitError("integer mean over zero elements");
    return kir::binary(kir::BinaryFn::Div, r, kir::constantInt(t, count));
  }
  return r;
}

template <kir::ReduceKind Kind>
Expected<ExprPtr> lowerArgReduce(const Op& op, LoweringContext& ctx, const Index& index) {
  const std::vector<int64_t> shape = dimsOf(op.operand(0));
  auto checked = checkedAxis(op, op.getInt("axis"), static_cast<int64_t>(std::max<size_t>(shape.size(), 1)));
  if (!checked) return checked.takeError();
  const int64_t axis = *checked;
  if (shape.empty()) return kir::index(0);
  if (shape[axis] == 0) return op.emitError("cannot take the arg-reduction of an empty axis");
  std::vector<bool> reduced(shape.size(), false);
  reduced[axis] = true;
  const int first = ctx.newVars(1);
  auto body = ctx.operand(0, reductionInput(index, reduced, op.getBool("keepdims"), first));
  if (!body) return body;
  return kir::reduce(Kind, first, {shape[axis]}, *body, op.getBool("select_last_index"));
}

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

// One entry per op of ir/Ops.def; null where there is no lowering yet.
namespace lowerings {
using kir::BinaryFn;
using kir::ReduceKind;
using kir::UnaryFn;
constexpr LowerFn Neg = lowerUnary<UnaryFn::Neg>;
constexpr LowerFn Abs = lowerUnary<UnaryFn::Abs>;
constexpr LowerFn Sign = lowerUnary<UnaryFn::Sign>;
constexpr LowerFn Exp = lowerUnary<UnaryFn::Exp>;
constexpr LowerFn Log = lowerUnary<UnaryFn::Log>;
constexpr LowerFn Sqrt = lowerUnary<UnaryFn::Sqrt>;
constexpr LowerFn Rsqrt = lowerUnary<UnaryFn::Rsqrt>;
constexpr LowerFn Reciprocal = lowerUnary<UnaryFn::Reciprocal>;
constexpr LowerFn Tanh = lowerUnary<UnaryFn::Tanh>;
constexpr LowerFn Sigmoid = lowerUnary<UnaryFn::Sigmoid>;
constexpr LowerFn Relu = lowerUnary<UnaryFn::Relu>;
constexpr LowerFn Erf = lowerUnary<UnaryFn::Erf>;
constexpr LowerFn Sin = lowerUnary<UnaryFn::Sin>;
constexpr LowerFn Cos = lowerUnary<UnaryFn::Cos>;
constexpr LowerFn Tan = lowerUnary<UnaryFn::Tan>;
constexpr LowerFn Asin = lowerUnary<UnaryFn::Asin>;
constexpr LowerFn Acos = lowerUnary<UnaryFn::Acos>;
constexpr LowerFn Atan = lowerUnary<UnaryFn::Atan>;
constexpr LowerFn Sinh = lowerUnary<UnaryFn::Sinh>;
constexpr LowerFn Cosh = lowerUnary<UnaryFn::Cosh>;
constexpr LowerFn Asinh = lowerUnary<UnaryFn::Asinh>;
constexpr LowerFn Acosh = lowerUnary<UnaryFn::Acosh>;
constexpr LowerFn Atanh = lowerUnary<UnaryFn::Atanh>;
constexpr LowerFn Floor = lowerUnary<UnaryFn::Floor>;
constexpr LowerFn Ceil = lowerUnary<UnaryFn::Ceil>;
constexpr LowerFn Round = lowerUnary<UnaryFn::Round>;
constexpr LowerFn Not = lowerUnary<UnaryFn::Not>;
constexpr LowerFn IsNan = lowerUnary<UnaryFn::IsNan>;
constexpr LowerFn IsInf = lowerUnary<UnaryFn::IsInf>;
constexpr LowerFn Add = lowerBinary<BinaryFn::Add>;
constexpr LowerFn Sub = lowerBinary<BinaryFn::Sub>;
constexpr LowerFn Mul = lowerBinary<BinaryFn::Mul>;
constexpr LowerFn Div = lowerBinary<BinaryFn::Div>;
constexpr LowerFn Pow = lowerBinary<BinaryFn::Pow>;
constexpr LowerFn Max = lowerBinary<BinaryFn::Max>;
constexpr LowerFn Min = lowerBinary<BinaryFn::Min>;
constexpr LowerFn Mod = lowerBinary<BinaryFn::Mod>;
constexpr LowerFn Rem = lowerBinary<BinaryFn::Rem>;
constexpr LowerFn And = lowerBinary<BinaryFn::And>;
constexpr LowerFn Or = lowerBinary<BinaryFn::Or>;
constexpr LowerFn Xor = lowerBinary<BinaryFn::Xor>;
constexpr LowerFn Eq = lowerBinary<BinaryFn::Eq>;
constexpr LowerFn Ne = lowerBinary<BinaryFn::Ne>;
constexpr LowerFn Lt = lowerBinary<BinaryFn::Lt>;
constexpr LowerFn Le = lowerBinary<BinaryFn::Le>;
constexpr LowerFn Gt = lowerBinary<BinaryFn::Gt>;
constexpr LowerFn Ge = lowerBinary<BinaryFn::Ge>;
constexpr LowerFn Select = lowerSelect;
constexpr LowerFn Constant = lowerConstant;
constexpr LowerFn Iota = lowerIota;
constexpr LowerFn Cast = lowerCast;
constexpr LowerFn Broadcast = lowerBroadcast;
constexpr LowerFn Reshape = lowerReshape;
constexpr LowerFn Transpose = lowerTranspose;
constexpr LowerFn Slice = lowerSlice;
constexpr LowerFn Concat = lowerConcat;
constexpr LowerFn Pad = lowerPad;
constexpr LowerFn Gather = lowerGather;
constexpr LowerFn GatherElements = lowerGatherElements;
constexpr LowerFn ScatterElements = lowerScatterElements;
constexpr LowerFn ReduceSum = lowerReduce<ReduceKind::Sum>;
constexpr LowerFn ReduceMean = lowerReduce<ReduceKind::Sum, true>;
constexpr LowerFn ReduceMax = lowerReduce<ReduceKind::Max>;
constexpr LowerFn ReduceMin = lowerReduce<ReduceKind::Min>;
constexpr LowerFn ReduceProd = lowerReduce<ReduceKind::Prod>;
constexpr LowerFn ArgMax = lowerArgReduce<ReduceKind::ArgMax>;
constexpr LowerFn ArgMin = lowerArgReduce<ReduceKind::ArgMin>;
constexpr LowerFn MatMul = lowerMatMul;
constexpr LowerFn Conv = lowerConv;
constexpr LowerFn ConvTranspose = lowerConvTranspose;
constexpr LowerFn ConvWeightGrad = lowerConvWeightGrad;
constexpr LowerFn MaxPool = lowerMaxPool;
constexpr LowerFn AvgPool = lowerAvgPool;
// Quantized contractions run only as oneDNN int8 library calls (select-library).
constexpr LowerFn QConv = nullptr;
constexpr LowerFn QMatMul = nullptr;
constexpr LowerFn RandomUniform = lowerRandomUniform;
constexpr LowerFn RandomNormal = lowerRandomNormal;
// Composites are decomposed (-O2) before lowering.
constexpr LowerFn Softmax = nullptr;
constexpr LowerFn LogSoftmax = nullptr;
constexpr LowerFn LayerNorm = nullptr;
constexpr LowerFn BatchNorm = nullptr;
constexpr LowerFn Gelu = nullptr;
constexpr LowerFn Silu = nullptr;
constexpr LowerFn LeakyRelu = nullptr;
constexpr LowerFn Elu = nullptr;
constexpr LowerFn Softplus = nullptr;
constexpr LowerFn Rnn = nullptr;
constexpr LowerFn Lstm = nullptr;
constexpr LowerFn Gru = nullptr;
constexpr LowerFn Attention = nullptr;
constexpr LowerFn CrossEntropy = nullptr;
constexpr LowerFn NllLoss = nullptr;
constexpr LowerFn MseLoss = nullptr;
constexpr LowerFn Quantize = nullptr;
constexpr LowerFn Dequantize = nullptr;
constexpr LowerFn Return = nullptr;
// A check runs on the host before the step that reads its operand.
constexpr LowerFn Check = nullptr;
// Collectives are steps of their own that the runtime runs on the
// communicator (LowerToKernels.cpp, runtime/Collectives.h).
constexpr LowerFn AllReduce = nullptr;
constexpr LowerFn BroadcastFrom = nullptr;
constexpr LowerFn ReduceTo = nullptr;
constexpr LowerFn AllGather = nullptr;
constexpr LowerFn ReduceScatter = nullptr;
// Ops whose result sizes depend on values run on the host between the CPU
// executor's compiled stages (CpuExecutable.cpp); the CUDA path refuses them.
constexpr LowerFn NonZero = nullptr;
constexpr LowerFn Unique = nullptr;
constexpr LowerFn NonMaxSuppression = nullptr;
// A `fused` op is not one element function but a group: lowerOpToKernel
// composes its region's ops through a FusedContext.
constexpr LowerFn Fused = nullptr;
// `if` and `loop` are steps of their own that run their bodies as
// sub-programs (LowerToKernels.cpp).
constexpr LowerFn If = nullptr;
constexpr LowerFn Loop = nullptr;
}  // namespace lowerings

namespace {
constexpr LowerFn kLowerings[] = {
#define KILN_OP(Enum, ...) lowerings::Enum,
#include "ir/Ops.def"
};
static_assert(std::size(kLowerings) == kNumOpKinds);

}  // namespace

LowerFn loweringFor(OpKind kind) { return kLowerings[static_cast<size_t>(kind)]; }

std::string whyNotLowerable(const Op& op) {
  if (op.kind() == OpKind::Fused) {
    // A group lowers when each of its ops does; its constants must be
    // splats (literals), since a region has no buffers of its own.
    if (!op.region() || op.numResults() != 1) return "'fused' with more than one result (not lowered yet)";
    for (const auto& inner : op.region()->ops()) {
      if (inner->kind() == OpKind::Return) continue;
      if (std::string why = whyNotLowerable(*inner); !why.empty()) return why + " inside 'fused'";
      if (inner->kind() == OpKind::Constant && !isSplat(inner->getTensor("value")))
        return "a non-splat constant inside 'fused'";
    }
    return {};
  }
  if (op.kind() == OpKind::QConv || op.kind() == OpKind::QMatMul)
    return "'" + std::string(op.name()) +
           "' (int8) is computed only by a library call (oneDNN on the CPU), which this target did not take";
  if (!loweringFor(op.kind())) return "no CPU lowering for '" + std::string(op.name()) + "' yet";
  auto check = [&](const Value* v) -> std::string {
    if (!v->type().isStatic()) return "'" + std::string(op.name()) + "' with a non-static type " + v->type().str();
    return {};
  };
  for (const Value* v : op.operands())
    if (std::string why = check(v); !why.empty()) return why;
  for (const Value* v : op.results())
    if (std::string why = check(v); !why.empty()) return why;
  const OpKind k = op.kind();
  // An integer conv (ONNX ConvInteger's exact int32 sum) wraps as integer
  // arithmetic does everywhere; the others are lowered for floats only.
  if ((k == OpKind::ConvTranspose || k == OpKind::ConvWeightGrad || k == OpKind::AvgPool) &&
      !isFloat(op.result()->type().dtype))
    return "'" + std::string(op.name()) + "' on " + std::string(dtypeName(op.result()->type().dtype)) +
           " (transposed convolutions, their weight gradients and average pooling are lowered for floats only)";
  if (k == OpKind::Conv && op.result()->type().dtype == DType::Bool) return "'conv' on bool";
  return {};
}

namespace {

/// Answers operand reads of a one-op kernel with loads from its buffers.
class SingleOpContext : public LoweringContext {
 public:
  SingleOpContext(const Op& op, int firstFreeVar) : op_(op), nextVar_(firstFreeVar) {}
  Expected<ExprPtr> operand(size_t i, const Index& index) override {
    const Value* v = op_.operand(i);
    return kir::load(static_cast<int>(i), v->type().dtype, linearize(index, dimsOf(v)));
  }
  int newVars(int count) override {
    nextVar_ += count;
    return nextVar_ - count;
  }
  int numVars() const { return nextVar_; }

 private:
  const Op& op_;
  int nextVar_;
};

/// Answers operand reads inside a `fused` op's region: a region argument is
/// a load from the kernel buffer of the matching operand; any other value is
/// computed in place by its defining op's lowering at the same index, which
/// is how a group composes its ops' lowerings into one expression.
class FusedContext : public LoweringContext {
 public:
  FusedContext(const Op& op, const Function& region, int& nextVar) : op_(op), region_(region), nextVar_(nextVar) {}
  Expected<ExprPtr> operand(size_t i, const Index& index) override { return valueAt(op_.operand(i), index); }
  int newVars(int count) override {
    nextVar_ += count;
    return nextVar_ - count;
  }

  Expected<ExprPtr> valueAt(const Value* v, const Index& index) {
    if (v->isArgument()) {
      return kir::load(v->index(), v->type().dtype, linearize(index, dimsOf(v)));
    }
    const Op& def = *v->definingOp();
    FusedContext inner(def, region_, nextVar_);
    return loweringFor(def.kind())(def, inner, index);
  }

 private:
  const Op& op_;
  const Function& region_;
  int& nextVar_;
};

/// The expression of result `index` of a `fused` op: its region's returned
/// value, composed from the region's ops.
Expected<ExprPtr> lowerFusedResult(const Op& op, int& nextVar, const Index& index) {
  const Function& region = *op.region();
  FusedContext ctx(*region.returnOp(), region, nextVar);
  return ctx.valueAt(region.returnOp()->operand(0), index);
}

}  // namespace

/// scatter_elements as a scatter, not as the element function of
/// lowerScatterElements (which gathers every update along the axis for
/// each result element: O(result x updates along the axis); an embedding's
/// gradient, [4096,256] from 1024 tokens, took 1.1 s of a GPT's training
/// step). Each iteration of the parallel loop owns one line of the result
/// along the axis (every other coordinate fixed): it copies that line of
/// data, then applies, in order, the updates whose other coordinates are
/// the line's. Lines never share an element, so threads never write the
/// same one, and the updates apply in the interpreter's order (the last
/// write wins for reduction "none").
void lowerScatterKernel(const Op& op, kir::Kernel& kernel) {
  const std::vector<int64_t> data = dimsOf(op.operand(0)), indices = dimsOf(op.operand(1));
  const size_t rank = data.size();
  const int64_t raw = op.getInt("axis");
  const size_t axis = static_cast<size_t>(raw < 0 ? raw + static_cast<int64_t>(rank) : raw);
  const std::string& reduction = op.getString("reduction");
  const DType t = op.result()->type().dtype;
  const DType indexType = op.operand(1)->type().dtype;
  const int out = 3;
  std::vector<int64_t> lineDims;
  for (size_t d = 0; d < rank; ++d)
    if (d != axis) lineDims.push_back(data[d]);
  const int64_t lines = std::accumulate(lineDims.begin(), lineDims.end(), int64_t{1}, std::multiplies<>());
  const Index line = unravel(kir::var(0), lineDims);
  // The index of the line's element `along` the axis, in a tensor of `dims`
  // (data's, or indices' with the line's other coordinates clamped to them).
  auto at = [&](const ExprPtr& along, const std::vector<int64_t>& dims) {
    Index ix;
    for (size_t d = 0, l = 0; d < rank; ++d)
      ix.push_back(d == axis ? along : dims[d] < data[d] ? clampIndex(line[l++], dims[d]) : line[l++]);
    return linearize(ix, dims);
  };
  const ExprPtr copyAt = at(kir::var(1), data);
  std::vector<kir::StmtPtr> body = {
      kir::forLoop(1, data[axis], false, false, {kir::store(out, copyAt, kir::load(0, t, copyAt))})};
  bool empty = false;
  for (int64_t extent : indices) empty = empty || extent == 0;
  if (!empty) {
    // Lines beyond indices' shape take no updates.
    ExprPtr covered;
    for (size_t d = 0, l = 0; d < rank; ++d) {
      if (d == axis) continue;
      const ExprPtr& coordinate = line[l++];
      if (indices[d] >= data[d]) continue;
      ExprPtr ok = kir::binary(kir::BinaryFn::Lt, coordinate, kir::index(indices[d]));
      covered = covered ? kir::binary(kir::BinaryFn::And, covered, ok) : ok;
    }
    const ExprPtr updateAt = at(kir::var(2), indices);
    ExprPtr target = kir::cast(kir::load(1, indexType, updateAt), DType::I64);
    target = kir::select(kir::binary(kir::BinaryFn::Lt, target, kir::index(0)), kir::add(target, kir::index(data[axis])),
                         target);
    if (covered) target = kir::select(covered, target, kir::index(0));
    const ExprPtr targetAt = at(target, data);
    const ExprPtr current = kir::load(out, t, targetAt), update = kir::load(2, t, updateAt);
    ExprPtr value = update;
    if (reduction == "add") value = kir::binary(kir::BinaryFn::Add, current, update);
    if (reduction == "mul") value = kir::binary(kir::BinaryFn::Mul, current, update);
    if (reduction == "max") value = kir::binary(kir::BinaryFn::Max, current, update);
    if (reduction == "min") value = kir::binary(kir::BinaryFn::Min, current, update);
    if (covered) value = kir::select(covered, value, current);
    body.push_back(kir::forLoop(2, indices[axis], false, false, {kir::store(out, targetAt, value)}));
  }
  kernel.body.push_back(kir::forLoop(0, lines, true, false, std::move(body)));
  kernel.numVars = 3;
}

Expected<kir::Kernel> lowerOpToKernel(const Op& op, std::string name) {
  if (std::string why = whyNotLowerable(op); !why.empty()) return op.emitError(why);
  kir::Kernel kernel;
  kernel.name = std::move(name);
  for (const Value* v : op.operands())
    kernel.buffers.push_back({v->name(), v->type().dtype, dimsOf(v), kir::Buffer::Role::Input});
  const Value* result = op.result();
  const std::vector<int64_t> shape = dimsOf(result);
  kernel.buffers.push_back({result->name(), result->type().dtype, shape, kir::Buffer::Role::Output});
  const int out = static_cast<int>(op.numOperands());
  if (op.kind() == OpKind::ScatterElements) {
    lowerScatterKernel(op, kernel);
    return kernel;
  }

  // Variables 0 and 1: the flattened outer dims (parallel) and the last dim
  // (vectorized). A scalar result has neither loop.
  SingleOpContext ctx(op, 2);
  int fusedVars = 2;
  auto lowerResult = [&](const Index& index) -> Expected<ExprPtr> {
    if (op.kind() == OpKind::Fused) return lowerFusedResult(op, fusedVars, index);
    return loweringFor(op.kind())(op, ctx, index);
  };
  if (shape.empty()) {
    auto value = lowerResult({});
    if (!value) return value.takeError();
    kernel.body.push_back(kir::store(out, kir::index(0), *value));
    kernel.numVars = std::max(ctx.numVars(), fusedVars);
    return kernel;
  }
  const std::vector<int64_t> outerShape(shape.begin(), shape.end() - 1);
  const int64_t outer = std::accumulate(outerShape.begin(), outerShape.end(), int64_t{1}, std::multiplies<>());
  Index index = unravel(kir::var(0), outerShape);
  index.push_back(kir::var(1));
  auto value = lowerResult(index);
  if (!value) return value.takeError();
  const ExprPtr offset = kir::add(kir::mul(kir::var(0), kir::index(shape.back())), kir::var(1));
  auto inner = kir::forLoop(1, shape.back(), false, true, {kir::store(out, offset, *value)});
  kernel.body.push_back(kir::forLoop(0, outer, true, false, {inner}));
  kernel.numVars = std::max(ctx.numVars(), fusedVars);
  return kernel;
}

}  // namespace kiln::codegen
