// The `canonicalize` pass: folds ops on constants through the reference
// interpreter and rewrites algebraic identities (x*1, transpose of
// transpose, cast of a lossless cast, ...) into simpler forms, repeating
// until nothing changes. Each identity is a small function in one table, so
// adding a rule is one function and one line.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ir/Builder.h"
#include "ir/ByteSize.h"
#include "ir/ConstantValue.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

/// Sweeps over one function before canonicalize gives up. Each sweep
/// rewrites whole chains in program order, so real IR settles in a handful;
/// reaching the cap means two rules undo each other.
constexpr int kMaxSweeps = 64;

/// The most elements a fold may read and write (operands plus results).
/// It bounds both the data a fold adds to the module and the time the
/// interpreter spends on it (a matmul of two large weights is left for run
/// time).
constexpr int64_t kMaxFoldedElements = int64_t{1} << 20;
/// The bound for ops that only move a constant's elements (transpose,
/// reshape, slice, concat): a weight an exporter stored transposed (Gemm's
/// transB) or stacked (an LSTM's directions) is rearranged once here
/// instead of on every run (MobileNetV2's 1280x1000 classifier took
/// 0.85 ms per run, 6% of it; an LSTM's weights 2 ms). A matmul weight's
/// transpose over the bound is not copied either: select-library gives the
/// library call the weight as stored, read through transposed strides
/// (transposeReadInPlace in passes/Target.h).
constexpr int64_t kMaxFoldedMoveElements = int64_t{1} << 26;
/// The bound for casts: autocast's (passes/Autocast.cpp) cast every weight
/// of an inference model to bf16 or f16, which folds here once instead of
/// reading the f32 weight and writing its copy on every run (ViT-B/16: 51
/// casts, 19 ms of a 150 ms bf16 run), and a GPT-2's untied 768 x 50257
/// LM head (77M elements, operand and result) is one of them. A cast reads
/// and writes each element once, and a narrowing one leaves the module
/// smaller.
constexpr int64_t kMaxFoldedCastElements = int64_t{1} << 28;

bool onlyMovesElements(OpKind k) {
  return k == OpKind::Transpose || k == OpKind::Reshape || k == OpKind::Slice || k == OpKind::Concat;
}

int64_t maxFoldedElements(OpKind k) {
  if (k == OpKind::Cast) return kMaxFoldedCastElements;
  return onlyMovesElements(k) ? kMaxFoldedMoveElements : kMaxFoldedElements;
}

// --- Matching helpers ------------------------------------------------------

bool isSplatOf(const Value* v, double x) {
  std::optional<double> splat = splatValue(v);
  return splat && *splat == x;
}

/// The op defining `v` when it is of `kind`, else null.
Op* definedBy(const Value* v, OpKind kind) {
  Op* def = v->definingOp();
  return def && def->kind() == kind ? def : nullptr;
}

/// True when broadcasting `small` against `big` leaves `big`'s shape as it
/// is at run time: each of `small`'s dims (aligned from the back) is a
/// static 1 or the very same static or symbolic dim. Two unknown dims do not
/// qualify: one may be 1 and the other 5.
bool broadcastsInto(const TensorType& small, const TensorType& big) {
  if (small.rank() > big.rank()) return false;
  const size_t offset = big.shape.size() - small.shape.size();
  for (size_t d = 0; d < small.shape.size(); ++d) {
    const Dim& s = small.shape[d];
    const Dim& b = big.shape[offset + d];
    if (s.isStatic() && s.size == 1) continue;
    if (s.isUnknown() || s != b) return false;
  }
  return true;
}

bool hasUnknownDims(const TensorType& type) {
  return std::any_of(type.shape.begin(), type.shape.end(), [](const Dim& d) { return d.isUnknown(); });
}

/// `v` when it has exactly the type of `op`'s result, so that users of the
/// result see the same type after the replacement; else null.
Value* ifSameType(const Op& op, Value* v) { return v->type() == op.result()->type() ? v : nullptr; }

/// Bits of precision of a float type, counting the implicit leading bit.
int significandBits(DType t) {
  switch (t) {
    case DType::F64: return 53;
    case DType::F32: return 24;
    case DType::F16: return 11;
    case DType::BF16: return 8;
    default: return 0;
  }
}

/// Bits an integer type uses for magnitude (the sign bit excluded).
int magnitudeBits(DType t) { return static_cast<int>(8 * dtypeSize(t)) - (isSigned(t) ? 1 : 0); }

/// True when converting `from` to `to` keeps every value exactly, so that a
/// later cast sees the original value: bool to anything, integer widening
/// that keeps the sign, integers into floats with enough precision, and
/// float widening.
bool isLosslessConversion(DType from, DType to) {
  if (from == to || from == DType::Bool) return true;
  if (isInteger(from) && isInteger(to)) {
    if (isSigned(from) && !isSigned(to)) return false;
    return magnitudeBits(to) >= magnitudeBits(from);
  }
  if (isInteger(from) && isFloat(to)) return significandBits(to) >= magnitudeBits(from);
  if (isFloat(from) && isFloat(to)) {
    if (from == DType::F64) return false;
    if (from == DType::F32) return to == DType::F64;
    return to == DType::F32 || to == DType::F64;  // f16 and bf16 widen to f32/f64 only
  }
  return false;
}

bool isIdentityPerm(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// --- Algebraic identities ----------------------------------------------------
//
// Each rule looks at one op and returns the value that replaces its result,
// or null when it does not apply. A rule that builds new ops does so through
// `b`, which inserts before the op and gives new ops the op's location.
// Rules only ever return values of exactly the op's result type.

using Rule = Value* (*)(Op& op, Builder& b);

/// `op(x, c)` or `op(c, x)` (x at `keep`) → x when c is a splat of
/// `identity` that does not broadcast x to a larger shape.
Value* dropIdentityOperand(Op& op, size_t keep, double identity) {
  Value* x = op.operand(keep);
  Value* c = op.operand(1 - keep);
  if (!isSplatOf(c, identity) || !broadcastsInto(c->type(), x->type())) return nullptr;
  return ifSameType(op, x);
}

// x * 1 and 1 * x → x.
Value* mulByOne(Op& op, Builder&) {
  if (Value* x = dropIdentityOperand(op, 0, 1.0)) return x;
  return dropIdentityOperand(op, 1, 1.0);
}

// x + 0 and 0 + x → x. For floats this turns -0.0 + 0.0 (+0.0) into -0.0, a
// difference no model can observe except through 1/x; XLA makes the same
// trade.
Value* addZero(Op& op, Builder&) {
  if (Value* x = dropIdentityOperand(op, 0, 0.0)) return x;
  return dropIdentityOperand(op, 1, 0.0);
}

// x - 0 → x.
Value* subZero(Op& op, Builder&) { return dropIdentityOperand(op, 0, 0.0); }

// x / 1 → x.
Value* divByOne(Op& op, Builder&) { return dropIdentityOperand(op, 0, 1.0); }

// x * 0 and 0 * x → 0 for integers. Not for floats: NaN * 0 and inf * 0 are
// NaN. The zero constant needs the result's static type.
Value* integerMulByZero(Op& op, Builder& b) {
  const TensorType& type = op.result()->type();
  if (!isInteger(type.dtype) || !type.isStatic() || numElements(type.shape) > kMaxFoldedElements) return nullptr;
  if (!isSplatOf(op.operand(0), 0.0) && !isSplatOf(op.operand(1), 0.0)) return nullptr;
  return b.constant(DenseTensor::zeros(type));
}

// transpose {perm = identity}(x) → x.
Value* identityTranspose(Op& op, Builder&) {
  if (!isIdentityPerm(op.getInts("perm"))) return nullptr;
  return ifSameType(op, op.operand(0));
}

// transpose(transpose(x)) → transpose(x) with the composed permutation, or x
// when they cancel.
Value* transposeOfTranspose(Op& op, Builder& b) {
  Op* inner = definedBy(op.operand(0), OpKind::Transpose);
  if (!inner) return nullptr;
  const std::vector<int64_t>& outerPerm = op.getInts("perm");
  const std::vector<int64_t>& innerPerm = inner->getInts("perm");
  const auto rank = static_cast<int64_t>(innerPerm.size());
  if (static_cast<int64_t>(outerPerm.size()) != rank) return nullptr;
  // Result dim i is the inner result's dim outerPerm[i], which is x's dim
  // innerPerm[outerPerm[i]].
  std::vector<int64_t> perm(innerPerm.size());
  for (int64_t i = 0; i < rank; ++i) {
    std::optional<int64_t> outer = normalizeAxis(outerPerm[i], rank);
    if (!outer) return nullptr;
    std::optional<int64_t> composed = normalizeAxis(innerPerm[*outer], rank);
    if (!composed) return nullptr;
    perm[i] = *composed;
  }
  Value* x = inner->operand(0);
  if (isIdentityPerm(perm)) return ifSameType(op, x);
  return b.create(OpKind::Transpose, {x}, {op.result()->type()}, {{"perm", Attribute(std::move(perm))}})->result();
}

/// The perm of `rank` dims that swaps the last two and keeps the others.
std::vector<int64_t> lastTwoSwapped(size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[rank - 2], perm[rank - 1]);
  return perm;
}

/// `v` with its last two dims swapped (a transpose the library call reads
/// in place, transposeReadInPlace in passes/Target.h).
Value* transposeLastTwo(Value* v, Builder& b) {
  TensorType type = v->type();
  std::swap(type.shape[type.shape.size() - 2], type.shape[type.shape.size() - 1]);
  return b.create(OpKind::Transpose, {v}, {type}, {{"perm", Attribute(lastTwoSwapped(type.rank()))}})->result();
}

/// Whether `v` is a transpose swapping its operand's last two dims, which
/// another such transpose cancels.
bool isLastTwoSwap(const Value* v) {
  const Op* t = definedBy(v, OpKind::Transpose);
  return t && v->type().rank() >= 2 && t->getInts("perm") == lastTwoSwapped(v->type().rank());
}

// transpose(matmul(a, b)) swapping the last two dims → matmul(b^T, a^T)
// ((a b)^T = b^T a^T, matrix by matrix; the batch dims broadcast alike),
// when the matmul's only user is the transpose and a or b is itself such a
// transpose, which then cancels: one transpose replaces another, never
// more, and a library call reads the one left in place (passes/Target.h,
// transposeReadInPlace). A weight's gradient comes out of autodiff as
// (x^T dy)^T, which becomes dy^T x, where the outer transpose was a copy of
// the gradient (or read at a stride by the optimizer update fused with it);
// attention's dk, (q^T ds)^T, becomes ds^T q.
Value* transposeOfMatmul(Op& op, Builder& b) {
  Op* matmul = definedBy(op.operand(0), OpKind::MatMul);
  if (!matmul || matmul->numOperands() != 2 || op.operand(0)->users().size() != 1) return nullptr;
  const size_t rank = op.result()->type().rank();
  Value* x = matmul->operand(0);
  Value* y = matmul->operand(1);
  if (rank < 2 || x->type().rank() < 2 || y->type().rank() < 2 || op.getInts("perm") != lastTwoSwapped(rank))
    return nullptr;
  if (!isLastTwoSwap(x) && !isLastTwoSwap(y)) return nullptr;
  Value* yt = transposeLastTwo(y, b);
  Value* xt = transposeLastTwo(x, b);
  return b.create(OpKind::MatMul, {yt, xt}, {op.result()->type()})->result();
}

// reshape(reshape(x)) → reshape(x): a reshape only depends on the element
// order, which the inner one keeps.
Value* reshapeOfReshape(Op& op, Builder& b) {
  Op* inner = definedBy(op.operand(0), OpKind::Reshape);
  if (!inner) return nullptr;
  return b.create(OpKind::Reshape, {inner->operand(0)}, {op.result()->type()})->result();
}

// reshape or broadcast of x to x's own type → x. An unknown dim may hide a
// different run-time size on either side, so both types must be free of
// them (symbols name the same size everywhere in a function).
Value* noOpReshapeOrBroadcast(Op& op, Builder&) {
  Value* x = op.operand(0);
  if (hasUnknownDims(x->type())) return nullptr;
  return ifSameType(op, x);
}

// cast of x to its own dtype → x.
Value* noOpCast(Op& op, Builder&) { return ifSameType(op, op.operand(0)); }

// cast(cast(x)) → cast(x) when the inner cast keeps every value exactly (say
// i8 → i32 → f32, or f16 → f32 → f64). A lossy inner cast (f32 → i32 → f32
// truncates) must stay.
Value* castOfLosslessCast(Op& op, Builder& b) {
  Op* inner = definedBy(op.operand(0), OpKind::Cast);
  if (!inner || !isLosslessConversion(inner->operand(0)->type().dtype, inner->result()->type().dtype))
    return nullptr;
  return b.create(OpKind::Cast, {inner->operand(0)}, {op.result()->type()})->result();
}

// neg(neg(x)) → x and not(not(x)) → x (integer negation wraps, so this holds
// for the most negative integer too).
Value* involutionOfItself(Op& op, Builder&) {
  Op* inner = definedBy(op.operand(0), op.kind());
  if (!inner) return nullptr;
  return ifSameType(op, inner->operand(0));
}

/// True when slicing `dim` from `start` to `end` with step 1 keeps all of it
/// (after the clamping of docs/ops.md). A dim of unknown size is only known
/// to be covered by 0 .. INT64_MAX.
bool coversDim(int64_t start, int64_t end, const Dim& dim) {
  if (!dim.isStatic()) return start == 0 && end == std::numeric_limits<int64_t>::max();
  const int64_t n = dim.size;
  if (start < 0) start += n;
  if (end < 0) end += n;
  return std::clamp<int64_t>(start, 0, n) == 0 && std::clamp<int64_t>(end, 0, n) == n;
}

// slice of all of x with step 1 → x.
Value* wholeSlice(Op& op, Builder&) {
  Value* x = op.operand(0);
  const std::vector<int64_t>& starts = op.getInts("starts");
  const std::vector<int64_t>& ends = op.getInts("ends");
  const std::vector<int64_t>& steps = op.getInts("steps");
  const size_t rank = x->type().shape.size();
  if (starts.size() != rank || ends.size() != rank || steps.size() != rank) return nullptr;
  for (size_t d = 0; d < rank; ++d)
    if (steps[d] != 1 || !coversDim(starts[d], ends[d], x->type().shape[d])) return nullptr;
  return ifSameType(op, x);
}

// pad by zero everywhere → x, whatever the mode.
Value* zeroPad(Op& op, Builder&) {
  const std::vector<int64_t>& pads = op.getInts("pads");
  if (!std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) return nullptr;
  return ifSameType(op, op.operand(0));
}

/// A pad by zeros along one axis only: (x, axis, begin) with begin >= 0 and
/// an end >= 0 there, every other entry 0.
struct ZeroPadAlongOneAxis {
  Value* x;
  size_t axis;
  int64_t begin;
};
std::optional<ZeroPadAlongOneAxis> zeroPadAlongOneAxis(const Value* v) {
  const Op* pad = definedBy(v, OpKind::Pad);
  if (!pad || pad->result()->users().size() != 1) return std::nullopt;
  const Attribute* mode = pad->attr("mode");
  if (mode && mode->getString() != "constant") return std::nullopt;
  const Attribute* value = pad->attr("value");
  if (value && value->getFloat() != 0.0) return std::nullopt;
  const std::vector<int64_t>& pads = pad->getInts("pads");
  const size_t rank = pad->operand(0)->type().rank();
  if (pads.size() != 2 * rank || !pad->operand(0)->type().isStatic()) return std::nullopt;
  std::optional<size_t> axis;
  for (size_t d = 0; d < rank; ++d) {
    if (pads[d] < 0 || pads[rank + d] < 0) return std::nullopt;
    if (pads[d] == 0 && pads[rank + d] == 0) continue;
    if (axis) return std::nullopt;
    axis = d;
  }
  if (!axis) return std::nullopt;
  return ZeroPadAlongOneAxis{pad->operand(0), *axis, pads[*axis]};
}

// add(pad(a), pad(b)), each padded by zeros along the same axis only, where
// b's range starts where a's ends → pad(concat(a, b)). The backward pass
// of a split writes each piece's gradient this way (GPT's q, k, v: three
// pads and two adds of a [B, T, 3C] gradient); as a concat its producers
// write straight into their slices of one buffer (memory planning), and the
// remaining zero pad folds away. Like x + 0 → x, a -0.0 piece stays -0.0.
Value* addOfAdjacentZeroPads(Op& op, Builder& b) {
  auto first = zeroPadAlongOneAxis(op.operand(0));
  auto second = zeroPadAlongOneAxis(op.operand(1));
  if (!first || !second || first->axis != second->axis) return nullptr;
  const TensorType& type = op.result()->type();
  if (!type.isStatic() || op.operand(0)->type() != type || op.operand(1)->type() != type) return nullptr;
  const size_t axis = first->axis;
  auto extent = [&](const ZeroPadAlongOneAxis& p) { return p.x->type().shape[axis].size; };
  if (first->begin == second->begin + extent(*second)) std::swap(first, second);  // b's range comes first
  if (second->begin != first->begin + extent(*first)) return nullptr;
  Shape joined = first->x->type().shape;
  joined[axis] = Dim::fixed(extent(*first) + extent(*second));
  TensorType concatType = type;
  concatType.shape = joined;
  Value* c = b.create(OpKind::Concat, {first->x, second->x}, {concatType},
                      {{"axis", Attribute(static_cast<int64_t>(axis))}})
                 ->result();
  std::vector<int64_t> pads(2 * type.rank(), 0);
  pads[axis] = first->begin;
  pads[type.rank() + axis] = type.shape[axis].size - first->begin - joined[axis].size;
  return b.create(OpKind::Pad, {c}, {type}, {{"pads", Attribute(std::move(pads))}})->result();
}

// concat(a, concat(b, c), d) → concat(a, b, c, d) along the same axis, when
// the inner concat has no other reader: one op, and one buffer to plan.
Value* concatOfConcat(Op& op, Builder& b) {
  const int64_t rank = static_cast<int64_t>(op.result()->type().rank());
  std::optional<int64_t> axis = normalizeAxis(op.getInt("axis"), rank);
  if (!axis) return nullptr;
  std::vector<Value*> operands;
  bool flattened = false;
  for (Value* v : op.operands()) {
    Op* inner = definedBy(v, OpKind::Concat);
    if (inner && v->users().size() == 1 && normalizeAxis(inner->getInt("axis"), rank) == axis) {
      operands.insert(operands.end(), inner->operands().begin(), inner->operands().end());
      flattened = true;
    } else {
      operands.push_back(v);
    }
  }
  if (!flattened) return nullptr;
  return b.create(OpKind::Concat, operands, {op.result()->type()}, {{"axis", Attribute(*axis)}})->result();
}

// concat of a single operand → that operand.
Value* singleConcat(Op& op, Builder&) {
  if (op.numOperands() != 1) return nullptr;
  return ifSameType(op, op.operand(0));
}

// select(true, x, y) → x and select(false, x, y) → y, when neither the
// condition nor the other operand broadcasts the chosen one larger.
Value* constantSelect(Op& op, Builder&) {
  std::optional<double> cond = splatValue(op.operand(0));
  if (!cond) return nullptr;
  Value* chosen = op.operand(*cond != 0.0 ? 1 : 2);
  Value* other = op.operand(*cond != 0.0 ? 2 : 1);
  if (!broadcastsInto(op.operand(0)->type(), chosen->type()) || !broadcastsInto(other->type(), chosen->type()))
    return nullptr;
  return ifSameType(op, chosen);
}

struct Pattern {
  OpKind kind;
  Rule rewrite;
};

/// Every identity, tried in this order on ops of its kind.
constexpr Pattern kPatterns[] = {
    {OpKind::Mul, mulByOne},
    {OpKind::Mul, integerMulByZero},
    {OpKind::Add, addZero},
    {OpKind::Add, addOfAdjacentZeroPads},
    {OpKind::Sub, subZero},
    {OpKind::Div, divByOne},
    {OpKind::Transpose, identityTranspose},
    {OpKind::Transpose, transposeOfTranspose},
    {OpKind::Transpose, transposeOfMatmul},
    {OpKind::Reshape, noOpReshapeOrBroadcast},
    {OpKind::Reshape, reshapeOfReshape},
    {OpKind::Broadcast, noOpReshapeOrBroadcast},
    {OpKind::Cast, noOpCast},
    {OpKind::Cast, castOfLosslessCast},
    {OpKind::Neg, involutionOfItself},
    {OpKind::Not, involutionOfItself},
    {OpKind::Slice, wholeSlice},
    {OpKind::Pad, zeroPad},
    {OpKind::Concat, singleConcat},
    {OpKind::Concat, concatOfConcat},
    {OpKind::Select, constantSelect},
};

// --- Constant folding --------------------------------------------------------

/// Ops that folding may evaluate: primitives computed from their operands
/// alone. Composites are left for `decompose` (their primitives fold
/// afterwards), random ops must draw at run time, and ops without operands
/// (`constant`, `iota`) would only be expanded into data.
bool isFoldable(const Op& op) {
  const OpInfo& info = op.info();
  return !info.isComposite() && !info.hasSideEffects() && op.kind() != OpKind::Return && op.numOperands() > 0;
}

/// Replaces an op whose operands are all constants with constants holding
/// its results. Returns the new values, none when the op is left alone
/// (not foldable, a non-constant operand, a result without a static type,
/// over kMaxFoldedElements, or an evaluation that fails, such as an integer
/// division by zero, which is left to fail when the program runs), or an
/// error when the evaluator's results contradict the op's declared types.
Expected<std::vector<Value*>> foldConstants(Op& op, Builder& b, const OpEvaluator& evaluator) {
  std::vector<Value*> none;
  if (!isFoldable(op)) return none;
  std::vector<const DenseTensor*> operands;
  int64_t elements = 0;
  for (Value* v : op.operands()) {
    const DenseTensor* data = constantTensor(v);
    if (!data) return none;
    operands.push_back(data);
    elements += data->numElements();
  }
  for (const Value* r : op.results()) {
    // Byte counts that cannot overflow: a result of 2^80 elements is not
    // small because its count wraps.
    const auto bytes = tensorByteSize(r->type());
    if (!bytes) return none;
    elements += static_cast<int64_t>(*bytes / dtypeSize(r->type().dtype));
  }
  if (elements > maxFoldedElements(op.kind())) return none;

  auto folded = evaluator.evaluate(op, operands);
  if (!folded) return none;
  if (folded->size() != op.numResults())
    return op.emitError("folds to " + std::to_string(folded->size()) + " values but has " +
                        std::to_string(op.numResults()) + " results");
  std::vector<Value*> constants;
  for (size_t i = 0; i < folded->size(); ++i) {
    const TensorType& declared = op.result(i)->type();
    if ((*folded)[i].type != declared)
      return op.emitError("folds to a value of type " + (*folded)[i].type.str() + " but result " + std::to_string(i) +
                          " is declared " + declared.str());
    constants.push_back(b.constant(std::move((*folded)[i])));
  }
  return constants;
}

// --- Driver --------------------------------------------------------------------

/// The values replacing `op`'s results: folded constants, or the first
/// identity that applies; empty when `op` stays.
Expected<std::vector<Value*>> simplify(Op& op, Builder& b, const OpEvaluator* evaluator) {
  if (evaluator) {
    auto folded = foldConstants(op, b, *evaluator);
    if (!folded || !folded->empty()) return folded;
  }
  for (const Pattern& pattern : kPatterns) {
    if (pattern.kind != op.kind()) continue;
    if (Value* replacement = pattern.rewrite(op, b)) return std::vector<Value*>{replacement};
  }
  return std::vector<Value*>{};
}

/// Erases `root`, whose results no longer have users, then every op that
/// this leaves unused, transitively through operands. Ops with side effects
/// are kept: erasing those is `dce`'s decision.
void eraseWithDeadProducers(Function& f, Op* root) {
  std::vector<Op*> worklist{root};
  std::unordered_set<Op*> queued{root};
  while (!worklist.empty()) {
    Op* op = worklist.back();
    worklist.pop_back();
    queued.erase(op);
    if (op->hasUses() || op->kind() == OpKind::Return || op->info().hasSideEffects()) continue;
    std::vector<Op*> producers;
    for (Value* v : op->operands())
      if (Op* def = v->definingOp()) producers.push_back(def);
    f.erase(op);
    // An op is queued at most once at a time, so it is never popped again
    // after being erased: nothing can use it any more to queue it.
    for (Op* def : producers)
      if (queued.insert(def).second) worklist.push_back(def);
  }
}

/// One pass over `f` in program order; returns whether anything changed.
/// Ops created by a rewrite are inserted before the op they replace, so they
/// are seen by the next sweep, while later users already see the new values.
Expected<bool> sweep(Function& f, const OpEvaluator* evaluator) {
  Builder b(f);
  bool changed = false;
  for (auto it = f.ops().begin(); it != f.ops().end();) {
    // Step past the op first: it and the producers it leaves dead (all
    // before it) may be erased below.
    Op* op = (it++)->get();
    if (op->numResults() > 0 && !op->hasUses()) continue;  // already dead: dce's to erase
    b.setInsertionPoint(op);
    b.setLocation(op->loc());
    auto replacements = simplify(*op, b, evaluator);
    if (!replacements) return replacements.takeError();
    if (replacements->empty()) continue;
    for (size_t i = 0; i < replacements->size(); ++i) {
      Value* old = op->result(i);
      Value* replacement = (*replacements)[i];
      // A value created just now has no users yet: give it the old name.
      if (!replacement->hasUses() && replacement->name().empty()) replacement->setName(old->name());
      old->replaceAllUsesWith(replacement);
    }
    eraseWithDeadProducers(f, op);
    changed = true;
  }
  return changed;
}

Expected<bool> canonicalizeFunction(Function& f, const OpEvaluator* evaluator) {
  bool changed = false;
  for (int i = 0; i < kMaxSweeps; ++i) {
    auto swept = sweep(f, evaluator);
    if (!swept) return swept.takeError();
    if (!*swept) return changed;
    changed = true;
  }
  return Error("canonicalize did not reach a fixed point in function @" + f.name() + " after " +
                   std::to_string(kMaxSweeps) + " sweeps; two rewrites undo each other",
               f.loc());
}

}  // namespace

/// Simplifies every function until no rule applies (or fails after
/// kMaxSweeps sweeps over a function, naming it). Two kinds of rewrite:
///
///  - Constant folding (when the context has an evaluator): a primitive op
///    whose operands are all `constant` ops and whose results have static
///    types is evaluated by the reference interpreter and replaced by
///    `constant` ops with the results, at the op's location. Composites,
///    random ops, `return` and ops without operands are never folded, nor
///    ops that would read and write more than 2^20 elements in all, so
///    folding cannot blow up the module or the compile time. An op that
///    fails to evaluate (an integer division by zero) stays, to fail at run
///    time.
///  - Algebraic identities, the table kPatterns: x*1, x+0, x-0, x/1 → x when
///    the constant is a splat that does not broadcast x larger; integer x*0
///    → 0 (not for floats: NaN*0 is NaN); transpose by the identity and
///    transposes that cancel → x, two transposes → one; the transpose of a
///    matmul read by nothing else, one of whose operands is a transpose →
///    the matmul of the transposed operands in the other order (one
///    transpose cancels, the other is read in place by the library call);
///    reshape of reshape
///    → one reshape; reshape, broadcast and cast to the operand's own type →
///    x; cast of a lossless cast → one cast; neg(neg(x)), not(not(x)) → x;
///    a slice of everything with step 1, a pad by zeros and a concat of one
///    operand → x; select with a constant all-true (all-false) condition →
///    its second (third) operand. A replacement always has exactly the
///    replaced result's type.
///
/// An op whose results were replaced is erased, and so are the producers
/// this leaves unused, transitively (a folded constant's operands, the 1 of
/// x*1). Ops that were already dead are neither rewritten nor erased: that
/// is `dce`'s job, and keeps each pass's effect easy to predict.
///
///   %c = constant() {value = dense<f32[2]>[1.0, 2.0]} : f32[2]
///   %d = add(%c, %c) : f32[2]
///   %one = constant() {value = dense<f32[]>[1.0]} : f32[]
///   %y = mul(%x, %one) : f32[2]
///   %t = transpose(%x2) {perm = [1, 0]} : f32[3,2]
///   %u = transpose(%t) {perm = [1, 0]} : f32[2,3]
///   return %d, %y, %u
/// becomes
///   %d = constant() {value = dense<f32[2]>[2.0, 4.0]} : f32[2]
///   return %d, %x, %x2
class CanonicalizePass : public Pass {
 public:
  std::string_view name() const override { return "canonicalize"; }

  Expected<bool> run(Module& m, const PassContext& ctx) override {
    bool changed = false;
    for (const auto& f : m.functions()) {
      auto fnChanged = canonicalizeFunction(*f, ctx.evaluator);
      if (!fnChanged) return fnChanged.takeError();
      changed |= *fnChanged;
    }
    return changed;
  }
};

std::unique_ptr<Pass> createCanonicalizePass() { return std::make_unique<CanonicalizePass>(); }

}  // namespace kiln
