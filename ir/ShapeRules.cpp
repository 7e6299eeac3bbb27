// Shape and dtype rules for every op in ir/Ops.def, following docs/ops.md:
// the dispatch and the helpers that the rules share (ir/ShapeRuleSupport.h).
// The rules themselves live with their op family, in
// ir/ShapeRules<Family>.cpp (Elementwise, Layout, Reduce, Contraction,
// Random, Composite, Recurrent, Collective, DataDependent, ControlFlow, the
// families of runtime/*Kernels.cpp); each family registers one rule per op
// in `shape_rules::rules::<Enum>`, and the array below, filled from Ops.def,
// refers to every one of them, so an op without a rule fails to link.
// Rules work on static, symbolic (`N`) and unknown (`?`) dims: a
// result dim is static when it follows from static inputs, keeps a symbol
// when it is provably that symbolic input dim, and is unknown otherwise.
// Every failure is an Error naming the op, the operand or attribute, and
// what was expected; rules never assert on bad input.
#include "ir/ShapeRules.h"

#include "ir/ShapeRuleSupport.h"

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

namespace shape_rules {

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

Status expectSameDType(const ShapeQuery& q, size_t ref, size_t i) {
  DType want = operand(q, ref).dtype;
  DType got = operand(q, i).dtype;
  if (got == want) return Status::success();
  return fail(q, operandName(i) + " has dtype " + std::string(dtypeName(got)) + ", expected " +
                     std::string(dtypeName(want)) + " (" + operandName(ref) + "'s dtype)");
}

Status expectRank(const ShapeQuery& q, size_t i, int64_t rank, std::string_view what) {
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

Status expectDim(const ShapeQuery& q, size_t i, size_t d, const Dim& want, const std::string& why) {
  const Dim& got = shapeOf(q, i)[d];
  if (dimsCompatible(got, want)) return Status::success();
  return fail(q, operandName(i) + " has dim " + std::to_string(d) + " = " + got.str() + ", expected " + want.str() +
                     " (" + why + ")");
}

Expected<Shape> expectSameShape(const ShapeQuery& q, size_t a, size_t b) {
  KILN_TRY(expectRank(q, b, rankOf(q, a), operandName(a) + "'s rank"));
  Shape shape = shapeOf(q, a);
  for (size_t d = 0; d < shape.size(); ++d) {
    KILN_TRY(expectDim(q, b, d, shape[d], operandName(a) + "'s dim " + std::to_string(d)));
    shape[d] = refineDim(shape[d], shapeOf(q, b)[d]);
  }
  return shape;
}

Expected<TensorType> declaredType(const ShapeQuery& q) {
  if (q.declared.empty()) return fail(q, "takes its result type from the declaration, but no result type was declared");
  return q.declared[0];
}

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

std::optional<int64_t> staticProduct(const Shape& shape) {
  Wide product = 1;
  for (const Dim& d : shape) {
    if (!d.isStatic()) continue;
    product *= d.size;
    if (product > kInt64Max) return std::nullopt;
  }
  return static_cast<int64_t>(product);
}

bool isInt8(DType t) { return t == DType::U8 || t == DType::I8; }

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

}  // namespace shape_rules

using namespace shape_rules;

namespace {

// The dispatch: one rule per op kind, in Ops.def order, each defined by its
// family's file (an op without one fails to link).
constexpr const Rule* kRules[] = {
#define KILN_OP(Enum, ...) &rules::Enum,
#include "ir/Ops.def"
#undef KILN_OP
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
  return (*kRules[static_cast<size_t>(q.kind)])(q);
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


}  // namespace kiln
