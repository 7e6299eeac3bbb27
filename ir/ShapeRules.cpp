// Shape and dtype rules for every op in ir/Ops.def, following docs/ops.md.
// Each op's rule is found through one array indexed by OpKind and filled
// from Ops.def: an op uses its own rule when it has one (kOwnRule) and its
// class's shared rule otherwise (kClassRule); an op with neither fails to
// compile. Rules work on static, symbolic (`N`) and unknown (`?`) dims: a
// result dim is static when it follows from static inputs, keeps a symbol
// when it is provably that symbolic input dim, and is unknown otherwise.
// Every failure is an Error naming the op, the operand or attribute, and
// what was expected; rules never assert on bad input.
#include "ir/ShapeRules.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

namespace kiln {

const Attribute* ShapeQuery::attr(std::string_view name) const {
  if (attrs) {
    auto it = attrs->find(std::string(name));
    if (it != attrs->end()) return &it->second;
  }
  if (const AttrSpec* spec = opInfo(kind).findAttr(name); spec && !spec->required) return &spec->defaultValue;
  return nullptr;
}

namespace {

/// Window and slice arithmetic on attribute values that may be anywhere in
/// int64's range: computed wide, then checked to fit.
using Wide = __int128;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

/// The broadcast of two dims, or nullopt when they cannot broadcast.
std::optional<Dim> broadcastDim(const Dim& a, const Dim& b) {
  if (a == b) return a;
  if (a.isStatic() && a.size == 1) return b;
  if (b.isStatic() && b.size == 1) return a;
  if (a.isStatic() && b.isStatic()) return std::nullopt;
  // A static non-1 dim fixes the result whatever the other dim is at run time
  // (it is either 1 or equal). Between two non-static dims that differ (two
  // symbols, or a symbol and `?`) either may be 1, so the result is unknown:
  // claiming the symbol would be wrong when it is 1 and the other is not.
  if (a.isStatic()) return a;
  if (b.isStatic()) return b;
  return Dim::unknown();
}

/// Where `from` fails to broadcast to exactly `to`, or nullopt when it does.
std::optional<std::string> broadcastToMismatch(const Shape& from, const Shape& to) {
  if (from.size() > to.size())
    return "rank " + std::to_string(from.size()) + " exceeds the target rank " + std::to_string(to.size());
  size_t offset = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    const Dim& d = from[i];
    const Dim& t = to[offset + i];
    if ((d.isStatic() && d.size == 1) || dimsCompatible(d, t)) continue;
    return "dim " + std::to_string(i) + " = " + d.str() + " is neither 1 nor " + t.str();
  }
  return std::nullopt;
}

using Types = std::vector<TensorType>;
using Result = Expected<Types>;
using Rule = Result (*)(const ShapeQuery&);

/// Which operand dtypes an op accepts.
enum class DTypes { Any, Numeric, Float, Bool, Index };

bool accepts(DTypes set, DType t) {
  switch (set) {
    case DTypes::Any: return true;
    case DTypes::Numeric: return t != DType::Bool;
    case DTypes::Float: return isFloat(t);
    case DTypes::Bool: return t == DType::Bool;
    case DTypes::Index: return t == DType::I32 || t == DType::I64;
  }
  return false;
}

std::string_view describe(DTypes set) {
  switch (set) {
    case DTypes::Any: return "any dtype";
    case DTypes::Numeric: return "a numeric dtype (not bool)";
    case DTypes::Float: return "a float dtype";
    case DTypes::Bool: return "bool";
    case DTypes::Index: return "i32 or i64";
  }
  return "";
}

Error fail(const ShapeQuery& q, const std::string& message) {
  return Error("'" + std::string(opName(q.kind)) + "' " + message, q.loc);
}

std::string operandName(size_t i) { return "operand " + std::to_string(i); }

const TensorType& operand(const ShapeQuery& q, size_t i) { return q.operands[i]; }
const Shape& shapeOf(const ShapeQuery& q, size_t i) { return q.operands[i].shape; }
int64_t rankOf(const ShapeQuery& q, size_t i) { return q.operands[i].rank(); }

Status expectDType(const ShapeQuery& q, size_t i, DTypes set) {
  DType t = operand(q, i).dtype;
  if (accepts(set, t)) return Status::success();
  return fail(q,
              operandName(i) + " has dtype " + std::string(dtypeName(t)) + ", expected " + std::string(describe(set)));
}

/// Operand `i` must have operand `ref`'s dtype.
Status expectSameDType(const ShapeQuery& q, size_t ref, size_t i) {
  DType want = operand(q, ref).dtype;
  DType got = operand(q, i).dtype;
  if (got == want) return Status::success();
  return fail(q, operandName(i) + " has dtype " + std::string(dtypeName(got)) + ", expected " +
                     std::string(dtypeName(want)) + " (" + operandName(ref) + "'s dtype)");
}

Status expectRank(const ShapeQuery& q, size_t i, int64_t rank, std::string_view what = {}) {
  if (rankOf(q, i) == rank) return Status::success();
  std::string detail = what.empty() ? "" : " (" + std::string(what) + ")";
  return fail(q,
              operandName(i) + " has type " + operand(q, i).str() + ", expected rank " + std::to_string(rank) + detail);
}

Status expectMinRank(const ShapeQuery& q, size_t i, int64_t rank, std::string_view what) {
  if (rankOf(q, i) >= rank) return Status::success();
  return fail(q, operandName(i) + " has type " + operand(q, i).str() + ", expected rank at least " +
                     std::to_string(rank) + " (" + std::string(what) + ")");
}

/// Dim `d` of operand `i` must be compatible with `want`, which `why` explains.
Status expectDim(const ShapeQuery& q, size_t i, size_t d, const Dim& want, const std::string& why) {
  const Dim& got = shapeOf(q, i)[d];
  if (dimsCompatible(got, want)) return Status::success();
  return fail(q, operandName(i) + " has dim " + std::to_string(d) + " = " + got.str() + ", expected " + want.str() +
                     " (" + why + ")");
}

/// Operands `a` and `b` must have the same rank and compatible dims; returns
/// the refined common shape.
Expected<Shape> expectSameShape(const ShapeQuery& q, size_t a, size_t b) {
  KILN_TRY(expectRank(q, b, rankOf(q, a), operandName(a) + "'s rank"));
  Shape shape = shapeOf(q, a);
  for (size_t d = 0; d < shape.size(); ++d) {
    KILN_TRY(expectDim(q, b, d, shape[d], operandName(a) + "'s dim " + std::to_string(d)));
    shape[d] = refineDim(shape[d], shapeOf(q, b)[d]);
  }
  return shape;
}

/// The declared type of result 0, for ops whose result type is not a
/// function of their operands.
Expected<TensorType> declaredType(const ShapeQuery& q) {
  if (q.declared.empty()) return fail(q, "takes its result type from the declaration, but no result type was declared");
  return q.declared[0];
}

// --- Attributes -----------------------------------------------------------

Expected<const Attribute*> lookupAttr(const ShapeQuery& q, std::string_view name, AttrKind kind) {
  const Attribute* a = q.attr(name);
  if (!a) return fail(q, "requires attribute '" + std::string(name) + "'");
  if (a->kind() != kind)
    return fail(q, "attribute '" + std::string(name) + "' must be " + std::string(attrKindName(kind)) + ", got " +
                       std::string(attrKindName(a->kind())));
  return a;
}

Expected<int64_t> intAttr(const ShapeQuery& q, std::string_view name) {
  auto a = lookupAttr(q, name, AttrKind::Int);
  if (!a) return a.takeError();
  return (*a)->getInt();
}

Expected<double> floatAttr(const ShapeQuery& q, std::string_view name) {
  auto a = lookupAttr(q, name, AttrKind::Float);
  if (!a) return a.takeError();
  return (*a)->getFloat();
}

Expected<bool> boolAttr(const ShapeQuery& q, std::string_view name) {
  auto a = lookupAttr(q, name, AttrKind::Bool);
  if (!a) return a.takeError();
  return (*a)->getBool();
}

Expected<std::vector<int64_t>> intsAttr(const ShapeQuery& q, std::string_view name) {
  auto a = lookupAttr(q, name, AttrKind::Ints);
  if (!a) return a.takeError();
  return (*a)->getInts();
}

/// A string attribute that must be one of `allowed`.
Expected<std::string> choiceAttr(const ShapeQuery& q, std::string_view name,
                                 std::initializer_list<std::string_view> allowed) {
  auto a = lookupAttr(q, name, AttrKind::String);
  if (!a) return a.takeError();
  const std::string& value = (*a)->getString();
  std::string list;
  for (std::string_view option : allowed) {
    if (value == option) return value;
    list += (list.empty() ? "\"" : ", \"") + std::string(option) + "\"";
  }
  return fail(q, "attribute '" + std::string(name) + "' is \"" + value + "\", expected one of " + list);
}

/// An axis attribute normalized against `rank`.
Expected<int64_t> axisAttr(const ShapeQuery& q, std::string_view name, int64_t rank) {
  auto axis = intAttr(q, name);
  if (!axis) return axis.takeError();
  if (auto n = normalizeAxis(*axis, rank)) return *n;
  if (rank == 0)
    return fail(q, "attribute '" + std::string(name) + "' = " + std::to_string(*axis) +
                       " is out of range: the operand is a scalar and has no axes");
  return fail(q, "attribute '" + std::string(name) + "' = " + std::to_string(*axis) + " is out of range for rank " +
                     std::to_string(rank) + " (expected " + std::to_string(-rank) + " to " + std::to_string(rank - 1) +
                     ")");
}

/// A per-spatial-dim list: empty means `count` copies of `fill`; otherwise
/// exactly `count` entries, each at least `min`.
Expected<std::vector<int64_t>> spatialAttr(const ShapeQuery& q, std::string_view name, size_t count, int64_t fill,
                                           int64_t min) {
  auto values = intsAttr(q, name);
  if (!values) return values.takeError();
  if (values->empty()) return std::vector<int64_t>(count, fill);
  if (values->size() != count)
    return fail(q, "attribute '" + std::string(name) + "' has " + std::to_string(values->size()) +
                       " entries, expected " + std::to_string(count));
  for (size_t i = 0; i < count; ++i)
    if ((*values)[i] < min)
      return fail(q, "attribute '" + std::string(name) + "' entry " + std::to_string(i) + " = " +
                         std::to_string((*values)[i]) + ", expected at least " + std::to_string(min));
  return values;
}

// --- Elementwise ----------------------------------------------------------

/// The broadcast shape of several operands.
Expected<Shape> broadcastOperands(const ShapeQuery& q, std::initializer_list<size_t> indices) {
  Shape shape;
  bool first = true;
  for (size_t i : indices) {
    if (first) {
      shape = shapeOf(q, i);
      first = false;
      continue;
    }
    auto merged = broadcastShapes(shape, shapeOf(q, i));
    if (!merged) return fail(q, operandName(i) + ": " + merged.error().message());
    shape = std::move(*merged);
  }
  return shape;
}

template <DTypes In, bool BoolOut = false>
Result inferUnary(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, In));
  TensorType result = operand(q, 0);
  if (BoolOut) result.dtype = DType::Bool;
  return Types{result};
}

template <DTypes In, bool BoolOut>
Result inferBinary(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, In));
  KILN_TRY(expectSameDType(q, 0, 1));
  auto shape = broadcastOperands(q, {0, 1});
  if (!shape) return shape.takeError();
  return Types{{BoolOut ? DType::Bool : operand(q, 0).dtype, std::move(*shape)}};
}

Result inferSelect(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Bool));
  KILN_TRY(expectSameDType(q, 1, 2));
  auto shape = broadcastOperands(q, {0, 1, 2});
  if (!shape) return shape.takeError();
  return Types{{operand(q, 1).dtype, std::move(*shape)}};
}

Result inferCast(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  const Shape& in = shapeOf(q, 0);
  if (declared->rank() != rankOf(q, 0))
    return fail(
        q, "declared result type " + declared->str() + " must have the operand's rank " + std::to_string(rankOf(q, 0)));
  Shape shape = in;
  for (size_t d = 0; d < in.size(); ++d) shape[d] = refineDim(in[d], declared->shape[d]);
  return Types{{declared->dtype, std::move(shape)}};
}

/// Product of the static dims of `shape`, or nullopt when it exceeds int64.
std::optional<int64_t> staticProduct(const Shape& shape) {
  Wide product = 1;
  for (const Dim& d : shape) {
    if (!d.isStatic()) continue;
    product *= d.size;
    if (product > kInt64Max) return std::nullopt;
  }
  return static_cast<int64_t>(product);
}

// --- Constants and random -------------------------------------------------

Result inferConstant(const ShapeQuery& q) {
  auto value = lookupAttr(q, "value", AttrKind::Tensor);
  if (!value) return value.takeError();
  const DenseTensor& t = (*value)->getTensor();
  if (!t.type.isStatic()) return fail(q, "attribute 'value' has type " + t.type.str() + ", expected a static shape");
  auto count = staticProduct(t.type.shape);
  if (!count || static_cast<uint64_t>(*count) != t.bytes.size() / dtypeSize(t.type.dtype) ||
      t.bytes.size() % dtypeSize(t.type.dtype) != 0)
    return fail(q, "attribute 'value' of type " + t.type.str() + " holds " + std::to_string(t.bytes.size()) +
                       " bytes, which does not match its type");
  return Types{t.type};
}

Result inferIota(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  if (!accepts(DTypes::Numeric, declared->dtype))
    return fail(q, "declared result type " + declared->str() + " must have a numeric dtype");
  KILN_TRY(axisAttr(q, "axis", declared->rank()));
  return Types{*declared};
}

Result inferRandom(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  if (!isFloat(declared->dtype)) return fail(q, "declared result type " + declared->str() + " must have a float dtype");
  if (q.kind == OpKind::RandomUniform) {
    auto low = floatAttr(q, "low");
    if (!low) return low.takeError();
    auto high = floatAttr(q, "high");
    if (!high) return high.takeError();
    if (!(*low <= *high))
      return fail(q,
                  "attribute 'low' = " + std::to_string(*low) + " must not exceed 'high' = " + std::to_string(*high));
  } else {
    auto stddev = floatAttr(q, "std");
    if (!stddev) return stddev.takeError();
    if (!(*stddev >= 0)) return fail(q, "attribute 'std' = " + std::to_string(*stddev) + ", expected >= 0");
  }
  KILN_TRY(intAttr(q, "seed"));
  return Types{*declared};
}

// --- Data movement --------------------------------------------------------

Result inferBroadcast(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  const TensorType& in = operand(q, 0);
  if (declared->dtype != in.dtype)
    return fail(q, "declared result type " + declared->str() + " must have the operand's dtype " +
                       std::string(dtypeName(in.dtype)));
  if (auto mismatch = broadcastToMismatch(in.shape, declared->shape))
    return fail(q, "operand 0 of type " + in.str() + " does not broadcast to " + declared->str() + ": " + *mismatch);
  // A static non-1 operand dim fixes the result dim it maps to.
  TensorType result = *declared;
  size_t offset = result.shape.size() - in.shape.size();
  for (size_t i = 0; i < in.shape.size(); ++i)
    if (in.shape[i].isStatic() && in.shape[i].size != 1)
      result.shape[offset + i] = refineDim(result.shape[offset + i], in.shape[i]);
  return Types{result};
}

Result inferReshape(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  const TensorType& in = operand(q, 0);
  if (declared->dtype != in.dtype)
    return fail(q, "declared result type " + declared->str() + " must have the operand's dtype " +
                       std::string(dtypeName(in.dtype)));
  TensorType result = *declared;
  if (!in.isStatic()) return Types{result};
  auto count = staticProduct(in.shape);
  auto known = staticProduct(result.shape);
  if (!count || !known) return fail(q, "element count overflows int64");
  if (result.isStatic()) {
    if (*count != *known)
      return fail(q, "result " + result.str() + " has " + std::to_string(*known) + " elements, but operand 0 " +
                         in.str() + " has " + std::to_string(*count));
    return Types{result};
  }
  // Static input, partly unknown result: the static dims must divide the
  // count, and a single non-static dim is the quotient.
  if (*known == 0) return Types{result};
  if (*count % *known != 0)
    return fail(q, "result " + result.str() + " cannot hold the " + std::to_string(*count) + " elements of operand 0 " +
                       in.str() + ": its static dims multiply to " + std::to_string(*known));
  auto open = std::count_if(result.shape.begin(), result.shape.end(), [](const Dim& d) { return !d.isStatic(); });
  if (open == 1)
    for (Dim& d : result.shape)
      if (!d.isStatic()) d = Dim::fixed(*count / *known);
  return Types{result};
}

Result inferTranspose(const ShapeQuery& q) {
  auto perm = intsAttr(q, "perm");
  if (!perm) return perm.takeError();
  int64_t rank = rankOf(q, 0);
  if (static_cast<int64_t>(perm->size()) != rank)
    return fail(q, "attribute 'perm' has " + std::to_string(perm->size()) + " entries, expected " +
                       std::to_string(rank) + " (the operand's rank)");
  std::vector<bool> seen(rank, false);
  Shape shape;
  for (size_t i = 0; i < perm->size(); ++i) {
    auto axis = normalizeAxis((*perm)[i], rank);
    if (!axis || seen[*axis])
      return fail(q, "attribute 'perm' is not a permutation of 0.." + std::to_string(rank - 1) + ": entry " +
                         std::to_string(i) + " = " + std::to_string((*perm)[i]) +
                         (axis ? " is repeated" : " is out of range"));
    seen[*axis] = true;
    shape.push_back(shapeOf(q, 0)[*axis]);
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// The length of `[start:end:step]` over a static dim, Python/ONNX semantics.
int64_t sliceLength(int64_t dim, int64_t start, int64_t end, int64_t step) {
  Wide s = start, e = end, d = dim;
  if (s < 0) s += d;
  if (e < 0) e += d;
  Wide lo = step > 0 ? 0 : -1;
  Wide hi = step > 0 ? d : d - 1;
  s = std::clamp(s, lo, hi);
  e = std::clamp(e, lo, hi);
  Wide span = step > 0 ? e - s : s - e;
  if (span <= 0) return 0;
  Wide mag = step > 0 ? Wide(step) : -Wide(step);
  return static_cast<int64_t>((span + mag - 1) / mag);
}

/// True when `[start:end:step]` takes a whole dim of any size, in order or
/// reversed, so a non-static dim is kept.
bool takesWholeDim(int64_t start, int64_t end, int64_t step) {
  if (step == 1) return (start == 0 || start == kInt64Min) && end == kInt64Max;
  if (step == -1) return (start == -1 || start == kInt64Max) && end == kInt64Min;
  return false;
}

Result inferSlice(const ShapeQuery& q) {
  auto starts = intsAttr(q, "starts");
  if (!starts) return starts.takeError();
  auto ends = intsAttr(q, "ends");
  if (!ends) return ends.takeError();
  auto steps = intsAttr(q, "steps");
  if (!steps) return steps.takeError();
  size_t rank = shapeOf(q, 0).size();
  for (auto [name, list] : {std::pair{"starts", &*starts}, std::pair{"ends", &*ends}, std::pair{"steps", &*steps}})
    if (list->size() != rank)
      return fail(q, "attribute '" + std::string(name) + "' has " + std::to_string(list->size()) +
                         " entries, expected " + std::to_string(rank) + " (one per dim of operand 0)");
  Shape shape;
  for (size_t d = 0; d < rank; ++d) {
    int64_t start = (*starts)[d], end = (*ends)[d], step = (*steps)[d];
    if (step == 0) return fail(q, "attribute 'steps' entry " + std::to_string(d) + " is 0, expected non-zero");
    const Dim& in = shapeOf(q, 0)[d];
    if (in.isStatic())
      shape.push_back(Dim::fixed(sliceLength(in.size, start, end, step)));
    else
      shape.push_back(takesWholeDim(start, end, step) ? in : Dim::unknown());
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferConcat(const ShapeQuery& q) {
  int64_t rank = rankOf(q, 0);
  auto axis = axisAttr(q, "axis", rank);
  if (!axis) return axis.takeError();
  Shape shape = shapeOf(q, 0);
  Wide staticSum = 0;
  std::vector<Dim> open;  // the non-static dims along `axis`
  for (size_t i = 0; i < q.operands.size(); ++i) {
    if (i > 0) {
      KILN_TRY(expectSameDType(q, 0, i));
      KILN_TRY(expectRank(q, i, rank, "operand 0's rank"));
    }
    for (int64_t d = 0; d < rank; ++d) {
      const Dim& dim = shapeOf(q, i)[d];
      if (d == *axis) {
        if (dim.isStatic())
          staticSum += dim.size;
        else
          open.push_back(dim);
        continue;
      }
      KILN_TRY(expectDim(q, i, d, shape[d], "the dim of the operands before it"));
      shape[d] = refineDim(shape[d], dim);
    }
  }
  if (staticSum > kInt64Max) return fail(q, "result dim " + std::to_string(*axis) + " overflows int64");
  if (open.empty())
    shape[*axis] = Dim::fixed(static_cast<int64_t>(staticSum));
  else if (open.size() == 1 && staticSum == 0)
    shape[*axis] = open[0];
  else
    shape[*axis] = Dim::unknown();
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferPad(const ShapeQuery& q) {
  auto pads = intsAttr(q, "pads");
  if (!pads) return pads.takeError();
  auto mode = choiceAttr(q, "mode", {"constant", "reflect", "edge"});
  if (!mode) return mode.takeError();
  KILN_TRY(floatAttr(q, "value"));
  const Shape& in = shapeOf(q, 0);
  size_t rank = in.size();
  if (pads->size() != 2 * rank)
    return fail(q, "attribute 'pads' has " + std::to_string(pads->size()) + " entries, expected " +
                       std::to_string(2 * rank) + " (begins then ends for rank " + std::to_string(rank) + ")");
  Shape shape;
  for (size_t d = 0; d < rank; ++d) {
    int64_t begin = (*pads)[d], end = (*pads)[rank + d];
    if (!in[d].isStatic()) {
      shape.push_back(begin == 0 && end == 0 ? in[d] : Dim::unknown());
      continue;
    }
    Wide size = Wide(in[d].size) + begin + end;
    if (size < 0 || size > kInt64Max)
      return fail(q, "attribute 'pads' gives dim " + std::to_string(d) + " of size " + in[d].str() +
                         " a size out of range (pads " + std::to_string(begin) + " and " + std::to_string(end) + ")");
    // Reflection mirrors without the edge, so it needs more than `pad` elements.
    if (*mode == "reflect" && std::max(begin, end) > 0 && std::max(begin, end) >= in[d].size)
      return fail(q, "attribute 'pads' reflects dim " + std::to_string(d) + " of size " + in[d].str() + " by " +
                         std::to_string(std::max(begin, end)) + ", expected less than the dim");
    if (*mode == "edge" && std::max(begin, end) > 0 && in[d].size == 0)
      return fail(q, "mode \"edge\" cannot pad dim " + std::to_string(d) + " of size 0");
    shape.push_back(Dim::fixed(static_cast<int64_t>(size)));
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

// --- Indexing ---------------------------------------------------------------

Result inferGather(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 1, DTypes::Index));
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  const Shape& data = shapeOf(q, 0);
  Shape shape(data.begin(), data.begin() + *axis);
  shape.insert(shape.end(), shapeOf(q, 1).begin(), shapeOf(q, 1).end());
  shape.insert(shape.end(), data.begin() + *axis + 1, data.end());
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// Common checks of gather_elements and scatter_elements: indices of the
/// data's rank, no longer than the data along the other axes.
Status checkElementIndices(const ShapeQuery& q, int64_t axis) {
  KILN_TRY(expectDType(q, 1, DTypes::Index));
  KILN_TRY(expectRank(q, 1, rankOf(q, 0), "operand 0's rank"));
  for (int64_t d = 0; d < rankOf(q, 0); ++d) {
    const Dim& index = shapeOf(q, 1)[d];
    const Dim& data = shapeOf(q, 0)[d];
    if (d != axis && index.isStatic() && data.isStatic() && index.size > data.size)
      return fail(q, "operand 1 has dim " + std::to_string(d) + " = " + index.str() + ", expected at most " +
                         data.str() + " (operand 0's dim " + std::to_string(d) + ")");
  }
  return Status::success();
}

Result inferGatherElements(const ShapeQuery& q) {
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  KILN_TRY(checkElementIndices(q, *axis));
  return Types{{operand(q, 0).dtype, shapeOf(q, 1)}};
}

Result inferScatterElements(const ShapeQuery& q) {
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  KILN_TRY(choiceAttr(q, "reduction", {"none", "add", "mul", "max", "min"}));
  KILN_TRY(checkElementIndices(q, *axis));
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectSameShape(q, 1, 2));
  return Types{operand(q, 0)};
}

// --- Reductions -------------------------------------------------------------

Result inferReduce(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  auto axes = intsAttr(q, "axes");
  if (!axes) return axes.takeError();
  auto keepdims = boolAttr(q, "keepdims");
  if (!keepdims) return keepdims.takeError();
  int64_t rank = rankOf(q, 0);
  std::vector<bool> reduced(rank, axes->empty());
  for (size_t i = 0; i < axes->size(); ++i) {
    auto axis = normalizeAxis((*axes)[i], rank);
    if (!axis)
      return fail(q, "attribute 'axes' entry " + std::to_string(i) + " = " + std::to_string((*axes)[i]) +
                         " is out of range for rank " + std::to_string(rank));
    if (reduced[*axis]) return fail(q, "attribute 'axes' names axis " + std::to_string(*axis) + " more than once");
    reduced[*axis] = true;
  }
  Shape shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[d])
      shape.push_back(shapeOf(q, 0)[d]);
    else if (*keepdims)
      shape.push_back(Dim::fixed(1));
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferArgReduce(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  auto keepdims = boolAttr(q, "keepdims");
  if (!keepdims) return keepdims.takeError();
  KILN_TRY(boolAttr(q, "select_last_index"));
  Shape shape = shapeOf(q, 0);
  if (*keepdims)
    shape[*axis] = Dim::fixed(1);
  else
    shape.erase(shape.begin() + *axis);
  return Types{{DType::I64, std::move(shape)}};
}

// --- Contractions, convolution, pooling -----------------------------------

Result inferMatMul(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 1, "matmul needs at least a vector"));
  KILN_TRY(expectMinRank(q, 1, 1, "matmul needs at least a vector"));
  const Shape& a = shapeOf(q, 0);
  const Shape& b = shapeOf(q, 1);
  // Contraction dims: a's last, b's second-to-last (its only dim for a vector).
  size_t aK = a.size() - 1;
  size_t bK = b.size() == 1 ? 0 : b.size() - 2;
  KILN_TRY(expectDim(q, 1, bK, a[aK], "operand 0's dim " + std::to_string(aK)));
  Shape aBatch(a.begin(), a.size() > 2 ? a.end() - 2 : a.begin());
  Shape bBatch(b.begin(), b.size() > 2 ? b.end() - 2 : b.begin());
  auto batch = broadcastShapes(aBatch, bBatch);
  if (!batch) return fail(q, "batch dims: " + batch.error().message());
  Shape shape = std::move(*batch);
  if (a.size() >= 2) shape.push_back(a[a.size() - 2]);
  if (b.size() >= 2) shape.push_back(b.back());
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// One spatial output dim of a sliding window: conv and pooling.
struct Window {
  int64_t stride = 1;
  int64_t dilation = 1;
  int64_t padBegin = 0;
  int64_t padEnd = 0;
  bool ceilMode = false;
};

Expected<Dim> windowOutput(const ShapeQuery& q, size_t spatial, const Dim& in, const Dim& kernel, const Window& w) {
  if (!in.isStatic() || !kernel.isStatic()) return Dim::unknown();
  if (kernel.size < 1) return fail(q, "spatial dim " + std::to_string(spatial) + ": the kernel is empty");
  Wide padded = Wide(in.size) + w.padBegin + w.padEnd;
  Wide extent = Wide(w.dilation) * (kernel.size - 1) + 1;
  if (padded < extent) {
    std::string kernelSpan = extent > kInt64Max ? "over 2^63" : std::to_string(static_cast<int64_t>(extent));
    return fail(q, "spatial dim " + std::to_string(spatial) + ": the padded input (" + in.str() + " + " +
                       std::to_string(w.padBegin) + " + " + std::to_string(w.padEnd) +
                       ") is smaller than the dilated kernel (" + kernelSpan + "), so the output would be empty");
  }
  Wide span = padded - extent;
  Wide out = (w.ceilMode ? (span + w.stride - 1) / w.stride : span / w.stride) + 1;
  // With ceil_mode, a last window that would start in the end padding is dropped.
  if (w.ceilMode && (out - 1) * w.stride >= Wide(in.size) + w.padBegin) --out;
  if (out > kInt64Max) return fail(q, "spatial dim " + std::to_string(spatial) + " of the output overflows int64");
  return Dim::fixed(static_cast<int64_t>(out));
}

/// The strides, pads and dilations of a `count`-d window, with defaults.
Expected<std::vector<Window>> windowAttrs(const ShapeQuery& q, size_t count) {
  auto strides = spatialAttr(q, "strides", count, 1, 1);
  if (!strides) return strides.takeError();
  auto pads = spatialAttr(q, "pads", 2 * count, 0, 0);
  if (!pads) return pads.takeError();
  std::vector<int64_t> dilations(count, 1);
  if (opInfo(q.kind).findAttr("dilations")) {
    auto d = spatialAttr(q, "dilations", count, 1, 1);
    if (!d) return d.takeError();
    dilations = std::move(*d);
  }
  bool ceilMode = false;
  if (opInfo(q.kind).findAttr("ceil_mode")) {
    auto c = boolAttr(q, "ceil_mode");
    if (!c) return c.takeError();
    ceilMode = *c;
  }
  std::vector<Window> windows(count);
  for (size_t i = 0; i < count; ++i)
    windows[i] = {(*strides)[i], dilations[i], (*pads)[i], (*pads)[count + i], ceilMode};
  return windows;
}

/// Checks conv's optional bias (operand 2) against the output channels.
Status checkBias(const ShapeQuery& q, const Dim& channels) {
  if (q.operands.size() < 3) return Status::success();
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectRank(q, 2, 1, "one bias per output channel"));
  return expectDim(q, 2, 0, channels, "the output channels");
}

Result inferConv(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  int64_t rank = rankOf(q, 0);
  KILN_TRY(expectRank(q, 1, rank, "w[M, C/groups, K...] has x's rank"));
  auto groups = intAttr(q, "groups");
  if (!groups) return groups.takeError();
  if (*groups < 1) return fail(q, "attribute 'groups' = " + std::to_string(*groups) + ", expected at least 1");
  auto channelsLast = boolAttr(q, "channels_last");
  if (!channelsLast) return channelsLast.takeError();
  // channels_last: x[N, D..., C] read as x[N, C, D...]; the result likewise.
  Shape x = shapeOf(q, 0);
  if (*channelsLast) std::rotate(x.begin() + 1, x.end() - 1, x.end());
  const Shape& w = shapeOf(q, 1);
  if (x[1].isStatic() && x[1].size % *groups != 0)
    return fail(q, "operand 0 has " + x[1].str() + " channels, not divisible by groups = " + std::to_string(*groups));
  if (w[0].isStatic() && w[0].size % *groups != 0)
    return fail(
        q, "operand 1 has " + w[0].str() + " output channels, not divisible by groups = " + std::to_string(*groups));
  Dim perGroup = x[1].isStatic() ? Dim::fixed(x[1].size / *groups) : Dim::unknown();
  if (*groups == 1) perGroup = x[1];
  KILN_TRY(expectDim(q, 1, 1, perGroup, "operand 0's channels / groups"));
  KILN_TRY(checkBias(q, w[0]));
  size_t spatial = static_cast<size_t>(rank - 2);
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  Shape shape{x[0], w[0]};
  for (size_t i = 0; i < spatial; ++i) {
    auto out = windowOutput(q, i, x[i + 2], w[i + 2], (*windows)[i]);
    if (!out) return out.takeError();
    shape.push_back(*out);
  }
  if (*channelsLast) std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// conv_weight_grad(x[N, C, D...], dy[N, M, O...]) -> [M, C/groups, kernel...],
/// with dy's spatial dims those of conv(x, w) for a w of that shape.
Result inferConvWeightGrad(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  const int64_t rank = rankOf(q, 0);
  KILN_TRY(expectRank(q, 1, rank, "dy[N, M, O...] has x's rank"));
  auto groups = intAttr(q, "groups");
  if (!groups) return groups.takeError();
  if (*groups < 1) return fail(q, "attribute 'groups' = " + std::to_string(*groups) + ", expected at least 1");
  const size_t spatial = static_cast<size_t>(rank - 2);
  auto kernel = intsAttr(q, "kernel");
  if (!kernel) return kernel.takeError();
  if (kernel->size() != spatial)
    return fail(q, "attribute 'kernel' has " + std::to_string(kernel->size()) + " entries, expected " +
                       std::to_string(spatial) + " (one per spatial dim)");
  const Shape& x = shapeOf(q, 0);
  const Shape& dy = shapeOf(q, 1);
  KILN_TRY(expectDim(q, 1, 0, x[0], "operand 0's batch"));
  if (x[1].isStatic() && x[1].size % *groups != 0)
    return fail(q, "operand 0 has " + x[1].str() + " channels, not divisible by groups = " + std::to_string(*groups));
  if (dy[1].isStatic() && dy[1].size % *groups != 0)
    return fail(q, "operand 1 has " + dy[1].str() + " channels, not divisible by groups = " + std::to_string(*groups));
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  Shape shape{dy[1], x[1].isStatic() ? Dim::fixed(x[1].size / *groups) : Dim::unknown()};
  for (size_t i = 0; i < spatial; ++i) {
    if ((*kernel)[i] < 1)
      return fail(q, "attribute 'kernel' entry " + std::to_string(i) + " = " + std::to_string((*kernel)[i]) +
                         ", expected at least 1");
    auto out = windowOutput(q, i, x[i + 2], Dim::fixed((*kernel)[i]), (*windows)[i]);
    if (!out) return out.takeError();
    KILN_TRY(expectDim(q, 1, i + 2, *out, "the convolution's output size"));
    shape.push_back(Dim::fixed((*kernel)[i]));
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferConvTranspose(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  int64_t rank = rankOf(q, 0);
  KILN_TRY(expectRank(q, 1, rank, "w[C, M/groups, K...] has x's rank"));
  auto groups = intAttr(q, "groups");
  if (!groups) return groups.takeError();
  if (*groups < 1) return fail(q, "attribute 'groups' = " + std::to_string(*groups) + ", expected at least 1");
  const Shape& x = shapeOf(q, 0);
  const Shape& w = shapeOf(q, 1);
  KILN_TRY(expectDim(q, 1, 0, x[1], "operand 0's channels"));
  Dim channels = Dim::unknown();
  if (w[1].isStatic()) {
    Wide m = Wide(w[1].size) * *groups;
    if (m > kInt64Max) return fail(q, "output channels overflow int64");
    channels = Dim::fixed(static_cast<int64_t>(m));
  } else if (*groups == 1) {
    channels = w[1];
  }
  KILN_TRY(checkBias(q, channels));
  size_t spatial = static_cast<size_t>(rank - 2);
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  auto outputPadding = spatialAttr(q, "output_padding", spatial, 0, 0);
  if (!outputPadding) return outputPadding.takeError();
  Shape shape{x[0], channels};
  for (size_t i = 0; i < spatial; ++i) {
    const Window& win = (*windows)[i];
    int64_t extra = (*outputPadding)[i];
    if (extra >= std::max(win.stride, win.dilation))
      return fail(q, "attribute 'output_padding' entry " + std::to_string(i) + " = " + std::to_string(extra) +
                         ", expected less than the stride or the dilation");
    const Dim& in = x[i + 2];
    const Dim& k = w[i + 2];
    if (!in.isStatic() || !k.isStatic()) {
      shape.push_back(Dim::unknown());
      continue;
    }
    Wide out =
        Wide(win.stride) * (in.size - 1) + extra + Wide(win.dilation) * (k.size - 1) + 1 - win.padBegin - win.padEnd;
    if (in.size < 1 || k.size < 1 || out < 1)
      return fail(q, "spatial dim " + std::to_string(i) + ": input " + in.str() + " and kernel " + k.str() +
                         " give an empty output after removing pads " + std::to_string(win.padBegin) + " and " +
                         std::to_string(win.padEnd));
    if (out > kInt64Max) return fail(q, "spatial dim " + std::to_string(i) + " of the output overflows int64");
    shape.push_back(Dim::fixed(static_cast<int64_t>(out)));
  }
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

Result inferPool(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, q.kind == OpKind::AvgPool ? DTypes::Float : DTypes::Numeric));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  if (opInfo(q.kind).findAttr("count_include_pad")) KILN_TRY(boolAttr(q, "count_include_pad"));
  size_t spatial = static_cast<size_t>(rankOf(q, 0) - 2);
  auto kernel = intsAttr(q, "kernel");
  if (!kernel) return kernel.takeError();
  if (kernel->size() != spatial)
    return fail(q, "attribute 'kernel' has " + std::to_string(kernel->size()) + " entries, expected " +
                       std::to_string(spatial) + " (one per spatial dim)");
  for (size_t i = 0; i < spatial; ++i)
    if ((*kernel)[i] < 1)
      return fail(q, "attribute 'kernel' entry " + std::to_string(i) + " = " + std::to_string((*kernel)[i]) +
                         ", expected at least 1");
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  auto channelsLast = boolAttr(q, "channels_last");
  if (!channelsLast) return channelsLast.takeError();
  Shape x = shapeOf(q, 0);
  if (*channelsLast) std::rotate(x.begin() + 1, x.end() - 1, x.end());
  Shape shape{x[0], x[1]};
  for (size_t i = 0; i < spatial; ++i) {
    auto out = windowOutput(q, i, x[i + 2], Dim::fixed((*kernel)[i]), (*windows)[i]);
    if (!out) return out.takeError();
    shape.push_back(*out);
  }
  if (*channelsLast) std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

// --- Composites ---------------------------------------------------------------

/// Softmax-like ops: a float operand, one axis, same type out.
Result inferAlongAxis(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(axisAttr(q, "axis", rankOf(q, 0)));
  return Types{operand(q, 0)};
}

Result inferGelu(const ShapeQuery& q) {
  KILN_TRY(choiceAttr(q, "approximate", {"none", "tanh"}));
  return inferUnary<DTypes::Float>(q);
}

Result inferLayerNorm(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  KILN_TRY(floatAttr(q, "epsilon"));
  const Shape& x = shapeOf(q, 0);
  Shape normalized(x.begin() + *axis, x.end());
  for (size_t i = 1; i < q.operands.size(); ++i) {
    KILN_TRY(expectSameDType(q, 0, i));
    if (auto mismatch = broadcastToMismatch(shapeOf(q, i), normalized))
      return fail(q, operandName(i) + " of type " + operand(q, i).str() +
                         " does not broadcast to the normalized dims " + shapeStr(normalized) + ": " + *mismatch);
  }
  return Types{operand(q, 0)};
}

Result inferBatchNorm(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectMinRank(q, 0, 2, "x[N, C, ...]"));
  KILN_TRY(floatAttr(q, "epsilon"));
  static constexpr const char* kNames[] = {"", "scale", "bias", "mean", "var"};
  for (size_t i = 1; i < 5; ++i) {
    KILN_TRY(expectSameDType(q, 0, i));
    KILN_TRY(expectRank(q, i, 1, std::string(kNames[i]) + "[C]"));
    KILN_TRY(expectDim(q, i, 0, shapeOf(q, 0)[1], "operand 0's channels"));
  }
  return Types{operand(q, 0)};
}

/// rnn, gru and lstm (ONNX layout 0) with `Gates` gates; lstm also takes
/// and returns a cell state.
template <int Gates>
Result inferRecurrent(const ShapeQuery& q) {
  auto hidden = intAttr(q, "hidden_size");
  if (!hidden) return hidden.takeError();
  if (*hidden < 1 || *hidden > kInt64Max / (2 * Gates))
    return fail(q, "attribute 'hidden_size' = " + std::to_string(*hidden) + ", expected a positive size");
  auto direction = choiceAttr(q, "direction", {"forward", "reverse", "bidirectional"});
  if (!direction) return direction.takeError();
  if (q.kind == OpKind::Rnn) KILN_TRY(choiceAttr(q, "activation", {"tanh", "relu", "sigmoid"}));
  if (q.kind == OpKind::Gru) KILN_TRY(boolAttr(q, "linear_before_reset"));
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  for (size_t i = 1; i < q.operands.size(); ++i) KILN_TRY(expectSameDType(q, 0, i));

  KILN_TRY(expectRank(q, 0, 3, "X[seq, batch, input]"));
  const Shape& x = shapeOf(q, 0);
  Dim dirs = Dim::fixed(*direction == "bidirectional" ? 2 : 1);
  Dim h = Dim::fixed(*hidden);
  Dim gh = Dim::fixed(Gates * *hidden);
  std::string ghWhy = std::to_string(Gates) + " gates * hidden_size";
  KILN_TRY(expectRank(q, 1, 3, "W[dirs, gates * hidden, input]"));
  KILN_TRY(expectDim(q, 1, 0, dirs, "directions"));
  KILN_TRY(expectDim(q, 1, 1, gh, ghWhy));
  KILN_TRY(expectDim(q, 1, 2, x[2], "operand 0's input size"));
  KILN_TRY(expectRank(q, 2, 3, "R[dirs, gates * hidden, hidden]"));
  KILN_TRY(expectDim(q, 2, 0, dirs, "directions"));
  KILN_TRY(expectDim(q, 2, 1, gh, ghWhy));
  KILN_TRY(expectDim(q, 2, 2, h, "hidden_size"));
  KILN_TRY(expectRank(q, 3, 2, "B[dirs, 2 * gates * hidden]"));
  KILN_TRY(expectDim(q, 3, 0, dirs, "directions"));
  KILN_TRY(expectDim(q, 3, 1, Dim::fixed(2 * Gates * *hidden), "2 * " + ghWhy));
  Dim batch = x[1];
  for (size_t i = 4; i < q.operands.size(); ++i) {
    KILN_TRY(expectRank(q, i, 3, "initial state [dirs, batch, hidden]"));
    KILN_TRY(expectDim(q, i, 0, dirs, "directions"));
    KILN_TRY(expectDim(q, i, 1, x[1], "operand 0's batch"));
    KILN_TRY(expectDim(q, i, 2, h, "hidden_size"));
    batch = refineDim(batch, shapeOf(q, i)[1]);
  }
  DType dtype = operand(q, 0).dtype;
  Types results{{dtype, {x[0], dirs, batch, h}}, {dtype, {dirs, batch, h}}};
  if (q.kind == OpKind::Lstm) results.push_back({dtype, {dirs, batch, h}});
  return results;
}

Result inferAttention(const ShapeQuery& q) {
  KILN_TRY(floatAttr(q, "scale"));
  KILN_TRY(boolAttr(q, "causal"));
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectMinRank(q, 0, 2, "q[..., Lq, D]"));
  size_t rank = shapeOf(q, 0).size();
  KILN_TRY(expectRank(q, 1, static_cast<int64_t>(rank), "k[..., Lk, D] has q's rank"));
  KILN_TRY(expectRank(q, 2, static_cast<int64_t>(rank), "v[..., Lk, Dv] has q's rank"));
  const Shape& query = shapeOf(q, 0);
  const Shape& key = shapeOf(q, 1);
  const Shape& value = shapeOf(q, 2);
  Shape shape;
  for (size_t d = 0; d + 2 < rank; ++d) {
    KILN_TRY(expectDim(q, 1, d, query[d], "operand 0's leading dim " + std::to_string(d)));
    KILN_TRY(expectDim(q, 2, d, query[d], "operand 0's leading dim " + std::to_string(d)));
    shape.push_back(refineDim(refineDim(query[d], key[d]), value[d]));
  }
  KILN_TRY(expectDim(q, 1, rank - 1, query[rank - 1], "operand 0's feature size D"));
  KILN_TRY(expectDim(q, 2, rank - 2, key[rank - 2], "operand 1's key length Lk"));
  if (q.operands.size() == 4) {
    DType maskType = operand(q, 3).dtype;
    if (maskType != DType::Bool && maskType != operand(q, 0).dtype)
      return fail(q, "operand 3 (mask) has dtype " + std::string(dtypeName(maskType)) + ", expected bool or " +
                         std::string(dtypeName(operand(q, 0).dtype)));
    Shape scores = shape;
    scores.push_back(query[rank - 2]);
    scores.push_back(refineDim(key[rank - 2], value[rank - 2]));
    if (auto mismatch = broadcastToMismatch(shapeOf(q, 3), scores))
      return fail(q, "operand 3 (mask) of type " + operand(q, 3).str() + " does not broadcast to the scores " +
                         shapeStr(scores) + ": " + *mismatch);
  }
  shape.push_back(query[rank - 2]);
  shape.push_back(value[rank - 1]);
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// Result of a loss with `reduction`: a scalar, or the per-element `shape`.
Result lossResult(const ShapeQuery& q, DType dtype, Shape shape) {
  auto reduction = choiceAttr(q, "reduction", {"mean", "sum", "none"});
  if (!reduction) return reduction.takeError();
  if (*reduction != "none") shape.clear();
  return Types{{dtype, std::move(shape)}};
}

/// cross_entropy and nll_loss: scores[N, C, d...] and labels[N, d...].
Result inferClassLoss(const ShapeQuery& q) {
  KILN_TRY(intAttr(q, "ignore_index"));
  if (q.kind == OpKind::CrossEntropy) {
    auto smoothing = floatAttr(q, "label_smoothing");
    if (!smoothing) return smoothing.takeError();
    if (!(*smoothing >= 0 && *smoothing <= 1))
      return fail(q, "attribute 'label_smoothing' = " + std::to_string(*smoothing) + ", expected a value in [0, 1]");
  }
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectMinRank(q, 0, 2, "scores[N, C, d...]"));
  KILN_TRY(expectDType(q, 1, DTypes::Index));
  const Shape& scores = shapeOf(q, 0);
  KILN_TRY(expectRank(q, 1, static_cast<int64_t>(scores.size()) - 1, "labels[N, d...]: operand 0's rank - 1"));
  Shape shape{refineDim(scores[0], shapeOf(q, 1)[0])};
  KILN_TRY(expectDim(q, 1, 0, scores[0], "operand 0's batch dim 0"));
  for (size_t d = 2; d < scores.size(); ++d) {
    KILN_TRY(expectDim(q, 1, d - 1, scores[d], "operand 0's dim " + std::to_string(d)));
    shape.push_back(refineDim(scores[d], shapeOf(q, 1)[d - 1]));
  }
  return lossResult(q, operand(q, 0).dtype, std::move(shape));
}

Result inferMseLoss(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  auto shape = expectSameShape(q, 0, 1);
  if (!shape) return shape.takeError();
  return lossResult(q, operand(q, 0).dtype, std::move(*shape));
}

// --- Quantization -------------------------------------------------------------

bool isInt8(DType t) { return t == DType::U8 || t == DType::I8; }

/// Operand `i` (a scale or zero point) is a scalar, a one-element vector, or
/// one value per index of dim `axis` of operand 0.
Status expectPerAxis(const ShapeQuery& q, size_t i, std::string_view what) {
  if (rankOf(q, i) == 0) return Status::success();
  if (rankOf(q, i) != 1)
    return fail(q, operandName(i) + " (the " + std::string(what) + ") has type " + operand(q, i).str() +
                       ", expected a scalar or a vector along `axis`");
  const Dim& n = shapeOf(q, i)[0];
  if (n.isStatic() && n.size == 1) return Status::success();
  if (rankOf(q, 0) == 0)
    return fail(q, operandName(i) + " (the " + std::string(what) + ") is a vector but operand 0 is a scalar");
  auto axis = axisAttr(q, "axis", rankOf(q, 0));
  if (!axis) return axis.takeError();
  return expectDim(q, i, 0, shapeOf(q, 0)[static_cast<size_t>(*axis)],
                   "operand 0's dim " + std::to_string(*axis) + ", the quantization axis");
}

/// quantize(x, scale, zero_point): x's shape in zero_point's dtype (u8, i8).
Result inferQuantize(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  if (!isInt8(operand(q, 2).dtype))
    return fail(q, "operand 2 (the zero point) has dtype " + std::string(dtypeName(operand(q, 2).dtype)) +
                       ", expected u8 or i8 (it gives the result's dtype)");
  KILN_TRY(expectPerAxis(q, 1, "scale"));
  KILN_TRY(expectPerAxis(q, 2, "zero point"));
  return Types{{operand(q, 2).dtype, shapeOf(q, 0)}};
}

/// dequantize(x, scale, zero_point): x's shape in scale's dtype.
Result inferDequantize(const ShapeQuery& q) {
  const DType x = operand(q, 0).dtype;
  if (!isInt8(x) && x != DType::I32)
    return fail(q, "operand 0 has dtype " + std::string(dtypeName(x)) + ", expected u8, i8 or i32");
  KILN_TRY(expectDType(q, 1, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectPerAxis(q, 1, "scale"));
  KILN_TRY(expectPerAxis(q, 2, "zero point"));
  return Types{{operand(q, 1).dtype, shapeOf(q, 0)}};
}

/// qconv and qmatmul: the shape of the float conv or matmul of x and w (a
/// query of that op on the same attributes), in the declared dtype (u8 or
/// i8); scale f32[M] and bias i32[M] per output channel.
Result inferQuantizedContraction(const ShapeQuery& q) {
  const bool conv = q.kind == OpKind::QConv;
  if (!isInt8(operand(q, 0).dtype))
    return fail(q, "operand 0 has dtype " + std::string(dtypeName(operand(q, 0).dtype)) + ", expected u8 or i8");
  if (operand(q, 1).dtype != DType::I8)
    return fail(q,
                "operand 1 (the weights) has dtype " + std::string(dtypeName(operand(q, 1).dtype)) + ", expected i8");
  if (!conv) KILN_TRY(expectRank(q, 1, 2, "w[K, N]"));
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  if (!isInt8(declared->dtype)) return fail(q, "declared result type " + declared->str() + " must be u8 or i8");
  const std::vector<TensorType> floats = {{DType::F32, shapeOf(q, 0)}, {DType::F32, shapeOf(q, 1)}};
  auto shape = inferResultTypes(ShapeQuery{conv ? OpKind::Conv : OpKind::MatMul, floats, q.attrs, {}, q.loc});
  if (!shape) return fail(q, std::string(conv ? "as a convolution: " : "as a matmul: ") + shape.error().message());
  const Shape& result = (*shape)[0].shape;
  const Dim& channels = conv ? result[1] : result.back();
  const char* why = conv ? "one per output channel" : "one per output column";
  if (operand(q, 2).dtype != DType::F32)
    return fail(q,
                "operand 2 (the scales) has dtype " + std::string(dtypeName(operand(q, 2).dtype)) + ", expected f32");
  KILN_TRY(expectRank(q, 2, 1, why));
  KILN_TRY(expectDim(q, 2, 0, channels, why));
  if (q.operands.size() == 4) {
    if (operand(q, 3).dtype != DType::I32)
      return fail(q,
                  "operand 3 (the bias) has dtype " + std::string(dtypeName(operand(q, 3).dtype)) + ", expected i32");
    KILN_TRY(expectRank(q, 3, 1, why));
    KILN_TRY(expectDim(q, 3, 0, channels, why));
  }
  for (const char* name : {"x_zero_point", "y_zero_point"}) {
    auto zp = intAttr(q, name);
    if (!zp) return zp.takeError();
    const int64_t lo = operand(q, 0).dtype == DType::U8 ? 0 : -128, hi = lo + 255;
    const int64_t ylo = declared->dtype == DType::U8 ? 0 : -128, yhi = ylo + 255;
    const bool isX = std::string_view(name) == "x_zero_point";
    if (*zp < (isX ? lo : ylo) || *zp > (isX ? hi : yhi))
      return fail(q, "attribute '" + std::string(name) + "' = " + std::to_string(*zp) + " is out of range for " +
                         std::string(dtypeName(isX ? operand(q, 0).dtype : declared->dtype)));
  }
  return Types{{declared->dtype, result}};
}

Result inferReturn(const ShapeQuery&) { return Types{}; }

/// A fused op's results are what its region returns, which a ShapeQuery
/// does not see: the rule accepts the declared types (the verifier checks
/// the region against them) and checks that `kind` names a kernel kind.
Result inferFused(const ShapeQuery& q) {
  auto kind = lookupAttr(q, "kind", AttrKind::String);
  if (!kind) return kind.takeError();
  const std::string& name = (*kind)->getString();
  if (name != "elementwise" && name != "reduction" && name != "matmul_epilogue" && name != "conv_epilogue" &&
      name != "library")
    return fail(q, "has kind \"" + name +
                       "\", expected elementwise, reduction, matmul_epilogue, conv_epilogue or library");
  return Types(q.declared.begin(), q.declared.end());
}

/// The operand types of `if` and `loop` that the op itself reads: a bool
/// scalar condition and, for a loop, an i64 scalar trip bound. The results
/// are declared: what the bodies compute (checked by the verifier against the
/// regions, which the rule does not see).
Status expectScalar(const ShapeQuery& q, size_t i, DType dtype, std::string_view what) {
  const TensorType& t = operand(q, i);
  if (t.dtype == dtype && t.rank() == 0) return Status::success();
  return fail(q, operandName(i) + " (" + std::string(what) + ") has type " + t.str() + ", expected " +
                     std::string(dtypeName(dtype)) + "[]");
}

Result inferIf(const ShapeQuery& q) {
  KILN_TRY(expectScalar(q, 0, DType::Bool, "the condition"));
  return Types(q.declared.begin(), q.declared.end());
}

Result inferLoop(const ShapeQuery& q) {
  KILN_TRY(expectScalar(q, 0, DType::I64, "the trip bound"));
  KILN_TRY(expectScalar(q, 1, DType::Bool, "the condition"));
  auto carried = lookupAttr(q, "num_carried", AttrKind::Int);
  if (!carried) return carried.takeError();
  const int64_t n = (*carried)->getInt();
  if (n < 0 || n > static_cast<int64_t>(q.operands.size()) - 2)
    return fail(q, "has num_carried " + std::to_string(n) + ", expected 0 to " +
                       std::to_string(q.operands.size() - 2) + " (the operands after the bound and condition)");
  if (!q.declared.empty() && static_cast<int64_t>(q.declared.size()) < n)
    return fail(q, "has " + std::to_string(q.declared.size()) + " results, fewer than its " + std::to_string(n) +
                       " carried values");
  return Types(q.declared.begin(), q.declared.end());
}

/// A check reads an integer (or bool) tensor and gives nothing; its
/// condition is one of three, and an index check names a dim size.
Result inferCheck(const ShapeQuery& q) {
  auto condition = lookupAttr(q, "condition", AttrKind::String);
  if (!condition) return condition.takeError();
  const std::string& name = (*condition)->getString();
  if (name != "in_range" && name != "nonzero" && name != "nonnegative")
    return fail(q, "has condition \"" + name + "\", expected in_range, nonzero or nonnegative");
  if (isFloat(q.operands[0].dtype)) return fail(q, "checks integer tensors, got " + q.operands[0].str());
  if (name == "in_range") {
    auto size = lookupAttr(q, "size", AttrKind::Int);
    if (!size) return size.takeError();
    if ((*size)->getInt() < 0) return fail(q, "has a negative size " + std::to_string((*size)->getInt()));
  }
  return Types{};
}

/// Collectives keep their operand's type, except that all_gather multiplies
/// dim `axis` by the world size and reduce_scatter divides it.
Result inferCollective(const ShapeQuery& q) {
  const TensorType& x = operand(q, 0);
  if (const Attribute* r = q.attr("reduction")) {
    const std::string& name = r->getString();
    if (name != "sum" && name != "mean") return fail(q, "has reduction \"" + name + "\", expected sum or mean");
    if (name == "mean" && !isFloat(x.dtype)) return fail(q, "averages float tensors, got " + x.str());
    if (x.dtype == DType::Bool) return fail(q, "reduces numbers, got " + x.str());
  }
  if (const Attribute* root = q.attr("root"); root && root->getInt() < 0)
    return fail(q, "has a negative root rank " + std::to_string(root->getInt()));
  if (q.kind != OpKind::AllGather && q.kind != OpKind::ReduceScatter) return Types{x};
  const int64_t world = q.attr("world_size")->getInt();
  if (world < 1) return fail(q, "has world_size " + std::to_string(world) + ", expected at least 1");
  auto axis = normalizeAxis(q.attr("axis")->getInt(), x.rank());
  if (!axis) return fail(q, "has axis " + std::to_string(q.attr("axis")->getInt()) + ", out of range for " + x.str());
  Shape shape = x.shape;
  Dim& d = shape[*axis];
  if (d.isStatic()) {
    if (q.kind == OpKind::AllGather) {
      d.size *= world;
    } else {
      if (d.size % world != 0)
        return fail(q, "splits dim " + std::to_string(*axis) + " of " + x.str() + " into " + std::to_string(world) +
                           " blocks; it must divide evenly");
      d.size /= world;
    }
  } else {
    d = Dim();  // unknown
  }
  return Types{{x.dtype, std::move(shape)}};
}

// --- Data-dependent shapes -------------------------------------------------

/// The element count of `shape` when every dim is static, else nullopt.
std::optional<int64_t> staticCount(const Shape& shape) {
  if (!isStaticShape(shape)) return std::nullopt;
  return numElements(shape);
}

/// nonzero: one row of indices per dim (a scalar counts as a 1-element
/// vector, as in NumPy), one column per nonzero element.
Result inferNonZero(const ShapeQuery& q) {
  const int64_t rows = std::max<int64_t>(rankOf(q, 0), 1);
  return Types{{DType::I64, {Dim::fixed(rows), Dim::unknown()}}};
}

/// unique's axis: nullopt when it flattens x.
Expected<std::optional<int64_t>> uniqueAxis(const ShapeQuery& q) {
  auto axes = intsAttr(q, "axis");
  if (!axes) return axes.takeError();
  if (axes->empty()) return std::optional<int64_t>{};
  if (axes->size() > 1)
    return fail(q, "attribute 'axis' has " + std::to_string(axes->size()) +
                       " entries, expected at most one (none flattens the operand)");
  auto axis = normalizeAxis(axes->front(), rankOf(q, 0));
  if (!axis)
    return fail(q,
                "attribute 'axis' is " + std::to_string(axes->front()) + ", out of range for " + operand(q, 0).str());
  return std::optional<int64_t>{*axis};
}

/// unique: (values, first indices, inverse indices, counts); the number of
/// distinct values is unknown, the inverse has one entry per element (or
/// per slice along the axis).
Result inferUnique(const ShapeQuery& q) {
  KILN_TRY(boolAttr(q, "sorted"));
  auto axis = uniqueAxis(q);
  if (!axis) return axis.takeError();
  const TensorType& x = operand(q, 0);
  TensorType values{x.dtype, {Dim::unknown()}};
  Dim perValue = Dim::unknown();
  if (*axis) {
    values.shape = x.shape;
    values.shape[**axis] = Dim::unknown();
    perValue = x.shape[**axis];
  } else if (auto count = staticCount(x.shape)) {
    perValue = Dim::fixed(*count);
  }
  const TensorType vector{DType::I64, {Dim::unknown()}};
  return Types{values, vector, {DType::I64, {perValue}}, vector};
}

/// non_max_suppression: boxes[B,N,4], scores[B,C,N] of one float dtype and
/// optional one-element thresholds to the selected [?,3] triples.
Result inferNonMaxSuppression(const ShapeQuery& q) {
  KILN_TRY(boolAttr(q, "center_point_box"));
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectRank(q, 0, 3, "boxes[batch, box, 4]"));
  KILN_TRY(expectRank(q, 1, 3, "scores[batch, class, box]"));
  KILN_TRY(expectDim(q, 0, 2, Dim::fixed(4), "four coordinates per box"));
  KILN_TRY(expectDim(q, 1, 0, shapeOf(q, 0)[0], "the batch of operand 0"));
  KILN_TRY(expectDim(q, 1, 2, shapeOf(q, 0)[1], "the boxes of operand 0"));
  static constexpr std::string_view kNames[] = {"", "", "max_output_boxes_per_class", "iou_threshold",
                                                "score_threshold"};
  for (size_t i = 2; i < q.operands.size(); ++i) {
    KILN_TRY(expectDType(q, i, i == 2 ? DTypes::Index : DTypes::Float));
    if (auto count = staticCount(shapeOf(q, i)); !count || *count != 1)
      return fail(q, operandName(i) + " (" + std::string(kNames[i]) + ") has type " + operand(q, i).str() +
                         ", expected one element");
  }
  return Types{{DType::I64, {Dim::unknown(), Dim::fixed(3)}}};
}

// --- Dispatch -----------------------------------------------------------------

// Marks "no rule here" in the tables below; ruleFor() rejects an op that
// ends up with it at compile time, so it is never called.
Result noRule(const ShapeQuery& q) { return fail(q, "has no shape rule"); }

// clang-format off
// The rule shared by a class, where its ops have one.
template <OpClass C>
constexpr Rule kClassRule = &noRule;
template <> constexpr Rule kClassRule<OpClass::Unary> = &inferUnary<DTypes::Float>;
template <> constexpr Rule kClassRule<OpClass::Binary> = &inferBinary<DTypes::Numeric, false>;
template <> constexpr Rule kClassRule<OpClass::Logical> = &inferBinary<DTypes::Bool, false>;
template <> constexpr Rule kClassRule<OpClass::Compare> = &inferBinary<DTypes::Any, true>;
template <> constexpr Rule kClassRule<OpClass::Select> = &inferSelect;
template <> constexpr Rule kClassRule<OpClass::Cast> = &inferCast;
template <> constexpr Rule kClassRule<OpClass::Reduce> = &inferReduce;
template <> constexpr Rule kClassRule<OpClass::ArgReduce> = &inferArgReduce;
template <> constexpr Rule kClassRule<OpClass::Pool> = &inferPool;
template <> constexpr Rule kClassRule<OpClass::Random> = &inferRandom;
template <> constexpr Rule kClassRule<OpClass::Composite> = &inferUnary<DTypes::Float>;
template <> constexpr Rule kClassRule<OpClass::Terminator> = &inferReturn;
template <> constexpr Rule kClassRule<OpClass::Check> = &inferCheck;
template <> constexpr Rule kClassRule<OpClass::Collective> = &inferCollective;

// Ops whose rule differs from their class's (or whose class has none).
template <OpKind K>
constexpr Rule kOwnRule = &noRule;
template <> constexpr Rule kOwnRule<OpKind::Neg> = &inferUnary<DTypes::Numeric>;
template <> constexpr Rule kOwnRule<OpKind::Abs> = &inferUnary<DTypes::Numeric>;
template <> constexpr Rule kOwnRule<OpKind::Sign> = &inferUnary<DTypes::Numeric>;
template <> constexpr Rule kOwnRule<OpKind::Relu> = &inferUnary<DTypes::Numeric>;
template <> constexpr Rule kOwnRule<OpKind::Not> = &inferUnary<DTypes::Bool>;
template <> constexpr Rule kOwnRule<OpKind::IsNan> = &inferUnary<DTypes::Float, true>;
template <> constexpr Rule kOwnRule<OpKind::IsInf> = &inferUnary<DTypes::Float, true>;
template <> constexpr Rule kOwnRule<OpKind::Constant> = &inferConstant;
template <> constexpr Rule kOwnRule<OpKind::Iota> = &inferIota;
template <> constexpr Rule kOwnRule<OpKind::Broadcast> = &inferBroadcast;
template <> constexpr Rule kOwnRule<OpKind::Reshape> = &inferReshape;
template <> constexpr Rule kOwnRule<OpKind::Transpose> = &inferTranspose;
template <> constexpr Rule kOwnRule<OpKind::Slice> = &inferSlice;
template <> constexpr Rule kOwnRule<OpKind::Concat> = &inferConcat;
template <> constexpr Rule kOwnRule<OpKind::Pad> = &inferPad;
template <> constexpr Rule kOwnRule<OpKind::Gather> = &inferGather;
template <> constexpr Rule kOwnRule<OpKind::GatherElements> = &inferGatherElements;
template <> constexpr Rule kOwnRule<OpKind::ScatterElements> = &inferScatterElements;
template <> constexpr Rule kOwnRule<OpKind::MatMul> = &inferMatMul;
template <> constexpr Rule kOwnRule<OpKind::Conv> = &inferConv;
template <> constexpr Rule kOwnRule<OpKind::ConvTranspose> = &inferConvTranspose;
template <> constexpr Rule kOwnRule<OpKind::ConvWeightGrad> = &inferConvWeightGrad;
template <> constexpr Rule kOwnRule<OpKind::QConv> = &inferQuantizedContraction;
template <> constexpr Rule kOwnRule<OpKind::QMatMul> = &inferQuantizedContraction;
template <> constexpr Rule kOwnRule<OpKind::Softmax> = &inferAlongAxis;
template <> constexpr Rule kOwnRule<OpKind::LogSoftmax> = &inferAlongAxis;
template <> constexpr Rule kOwnRule<OpKind::LayerNorm> = &inferLayerNorm;
template <> constexpr Rule kOwnRule<OpKind::BatchNorm> = &inferBatchNorm;
template <> constexpr Rule kOwnRule<OpKind::Gelu> = &inferGelu;
template <> constexpr Rule kOwnRule<OpKind::Rnn> = &inferRecurrent<1>;
template <> constexpr Rule kOwnRule<OpKind::Lstm> = &inferRecurrent<4>;
template <> constexpr Rule kOwnRule<OpKind::Gru> = &inferRecurrent<3>;
template <> constexpr Rule kOwnRule<OpKind::Attention> = &inferAttention;
template <> constexpr Rule kOwnRule<OpKind::CrossEntropy> = &inferClassLoss;
template <> constexpr Rule kOwnRule<OpKind::NllLoss> = &inferClassLoss;
template <> constexpr Rule kOwnRule<OpKind::MseLoss> = &inferMseLoss;
template <> constexpr Rule kOwnRule<OpKind::Quantize> = &inferQuantize;
template <> constexpr Rule kOwnRule<OpKind::Dequantize> = &inferDequantize;
template <> constexpr Rule kOwnRule<OpKind::Fused> = &inferFused;
template <> constexpr Rule kOwnRule<OpKind::If> = &inferIf;
template <> constexpr Rule kOwnRule<OpKind::Loop> = &inferLoop;
template <> constexpr Rule kOwnRule<OpKind::NonZero> = &inferNonZero;
template <> constexpr Rule kOwnRule<OpKind::Unique> = &inferUnique;
template <> constexpr Rule kOwnRule<OpKind::NonMaxSuppression> = &inferNonMaxSuppression;
// clang-format on

template <OpKind K, OpClass C>
constexpr Rule ruleFor() {
  constexpr Rule rule = kOwnRule<K> != &noRule ? kOwnRule<K> : kClassRule<C>;
  static_assert(rule != &noRule, "an op in Ops.def has no shape rule: add a kOwnRule specialization");
  return rule;
}

constexpr Rule kRules[] = {
#define KILN_OP(Enum, Mnemonic, Class, ...) ruleFor<OpKind::Enum, OpClass::Class>(),
#include "ir/Ops.def"
};
static_assert(std::size(kRules) == kNumOpKinds);

}  // namespace

Expected<Shape> broadcastShapes(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape result(rank);
  // `i` counts dims from the back, where NumPy aligns shapes.
  for (size_t i = 0; i < rank; ++i) {
    Dim& out = result[rank - 1 - i];
    if (i >= a.size() || i >= b.size()) {
      out = i < a.size() ? a[a.size() - 1 - i] : b[b.size() - 1 - i];
      continue;
    }
    const Dim& da = a[a.size() - 1 - i];
    const Dim& db = b[b.size() - 1 - i];
    auto dim = broadcastDim(da, db);
    if (!dim)
      return Error("shapes " + shapeStr(a) + " and " + shapeStr(b) + " do not broadcast: dim -" +
                   std::to_string(i + 1) + " is " + da.str() + " vs " + db.str());
    out = *dim;
  }
  return result;
}

Expected<std::vector<TensorType>> inferResultTypes(const ShapeQuery& q) {
  const OpInfo& info = opInfo(q.kind);
  int count = static_cast<int>(q.operands.size());
  if (count < info.minOperands || (info.maxOperands >= 0 && count > info.maxOperands)) {
    std::string expected = info.maxOperands < 0 ? "at least " + std::to_string(info.minOperands)
                           : info.minOperands == info.maxOperands
                               ? std::to_string(info.minOperands)
                               : std::to_string(info.minOperands) + " to " + std::to_string(info.maxOperands);
    return fail(q, "has " + std::to_string(count) + (count == 1 ? " operand" : " operands") + ", expected " + expected);
  }
  return kRules[static_cast<size_t>(q.kind)](q);
}

Expected<std::vector<TensorType>> inferResultTypes(const Op& op) {
  std::vector<TensorType> operands;
  operands.reserve(op.numOperands());
  for (size_t i = 0; i < op.numOperands(); ++i) {
    if (!op.operand(i)) return op.emitError("operand " + std::to_string(i) + " is missing");
    operands.push_back(op.operand(i)->type());
  }
  std::vector<TensorType> declared;
  declared.reserve(op.numResults());
  for (size_t i = 0; i < op.numResults(); ++i) declared.push_back(op.result(i)->type());
  return inferResultTypes(ShapeQuery{op.kind(), operands, &op.attrs(), declared, op.loc()});
}

std::optional<int64_t> dataDependentBound(const Op& op, size_t result) {
  if (!op.info().hasDataDependentShape() || result >= op.numResults() || op.numOperands() == 0) return std::nullopt;
  const Shape& x = op.operand(0)->type().shape;
  switch (op.kind()) {
    case OpKind::NonZero: return staticCount(x);
    case OpKind::Unique: {
      if (result == 2) return std::nullopt;  // the inverse's size is static or symbolic
      const std::vector<int64_t>& axis = op.getInts("axis");
      if (axis.empty()) return staticCount(x);
      auto a = normalizeAxis(axis.front(), static_cast<int64_t>(x.size()));
      if (!a || !x[*a].isStatic()) return std::nullopt;
      return x[*a].size;
    }
    case OpKind::NonMaxSuppression: {
      // At most every box of every batch and class.
      if (op.numOperands() < 2 || x.size() != 3) return std::nullopt;
      const Shape& scores = op.operand(1)->type().shape;
      if (scores.size() != 3 || !x[0].isStatic() || !x[1].isStatic() || !scores[1].isStatic()) return std::nullopt;
      return x[0].size * scores[1].size * x[1].size;
    }
    default: return std::nullopt;
  }
}

}  // namespace kiln
