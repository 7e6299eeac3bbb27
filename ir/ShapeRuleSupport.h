// The helpers that the shape rules of every op family share (internal to
// ir/): the rule type, dtype sets, operand and attribute checks that fail
// with an Error naming the op and what was expected, and broadcasting.
// Each family's rules live in ir/ShapeRules<Family>.cpp (the families of
// runtime/*Kernels.cpp); each registers its ops' rules in `rules::<Enum>`,
// declared below for every op of ir/Ops.def, so an op added there without
// a rule does not link.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "ir/ShapeRules.h"

namespace kiln::shape_rules {

/// Window and slice arithmetic on attribute values that may be anywhere in
/// int64's range: computed wide, then checked to fit.
using Wide = __int128;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

/// A rule's result: one type per op result, or an Error.
using Types = std::vector<TensorType>;
using Result = Expected<Types>;
/// A shape rule.
using Rule = Result (*)(const ShapeQuery&);

/// Which operand dtypes an op accepts.
enum class DTypes { Any, Numeric, Float, Bool, Index };

/// The broadcast of two dims, or nullopt when they cannot broadcast.
std::optional<Dim> broadcastDim(const Dim& a, const Dim& b);

/// Where `from` fails to broadcast to exactly `to`, or nullopt when it does.
std::optional<std::string> broadcastToMismatch(const Shape& from, const Shape& to);

/// Whether `set` holds `t`.
bool accepts(DTypes set, DType t);

/// `set` in words, for errors ("a float dtype").
std::string_view describe(DTypes set);

/// An Error naming the op of `q`, then `message`.
Error fail(const ShapeQuery& q, const std::string& message);

/// "operand i", for errors.
std::string operandName(size_t i);

/// Operand `i`'s type, shape and rank.
const TensorType& operand(const ShapeQuery& q, size_t i);
const Shape& shapeOf(const ShapeQuery& q, size_t i);
int64_t rankOf(const ShapeQuery& q, size_t i);

/// Operand `i` must have a dtype in `set`.
Status expectDType(const ShapeQuery& q, size_t i, DTypes set);

/// Operand `i` must have operand `ref`'s dtype.
Status expectSameDType(const ShapeQuery& q, size_t ref, size_t i);

/// Operand `i` must have rank `rank`; `what` names it in the error.
Status expectRank(const ShapeQuery& q, size_t i, int64_t rank, std::string_view what = {});

/// Operand `i` must have at least rank `rank`.
Status expectMinRank(const ShapeQuery& q, size_t i, int64_t rank, std::string_view what);

/// Dim `d` of operand `i` must be compatible with `want`, which `why` explains.
Status expectDim(const ShapeQuery& q, size_t i, size_t d, const Dim& want, const std::string& why);

/// Operands `a` and `b` must have the same rank and compatible dims; returns
/// the refined common shape.
Expected<Shape> expectSameShape(const ShapeQuery& q, size_t a, size_t b);

/// The declared type of result 0, for ops whose result type is not a
/// function of their operands.
Expected<TensorType> declaredType(const ShapeQuery& q);

/// Attribute `name` (or its default), which must be of `kind`.
Expected<const Attribute*> lookupAttr(const ShapeQuery& q, std::string_view name, AttrKind kind);

/// Attribute `name` as an int, float, bool or int list (an error when it
/// has another kind).
Expected<int64_t> intAttr(const ShapeQuery& q, std::string_view name);
Expected<double> floatAttr(const ShapeQuery& q, std::string_view name);
Expected<bool> boolAttr(const ShapeQuery& q, std::string_view name);
Expected<std::vector<int64_t>> intsAttr(const ShapeQuery& q, std::string_view name);

/// A string attribute that must be one of `allowed`.
Expected<std::string> choiceAttr(const ShapeQuery& q, std::string_view name,
                                 std::initializer_list<std::string_view> allowed);

/// An axis attribute normalized against `rank`.
Expected<int64_t> axisAttr(const ShapeQuery& q, std::string_view name, int64_t rank);

/// A per-spatial-dim list: empty means `count` copies of `fill`; otherwise
/// exactly `count` entries, each at least `min`.
Expected<std::vector<int64_t>> spatialAttr(const ShapeQuery& q, std::string_view name, size_t count, int64_t fill,
                                           int64_t min);

/// The broadcast shape of several operands.
Expected<Shape> broadcastOperands(const ShapeQuery& q, std::initializer_list<size_t> indices);

/// Product of the static dims of `shape`, or nullopt when it exceeds int64.
std::optional<int64_t> staticProduct(const Shape& shape);

/// u8 or i8, the dtypes of quantized tensors.
bool isInt8(DType t);

/// Operand `i` (a scale or zero point) is a scalar, a one-element vector, or
/// one value per index of dim `axis` of operand 0.
Status expectPerAxis(const ShapeQuery& q, size_t i, std::string_view what);

/// The rule of elementwise unary ops (and of the composites that keep
/// their operand's type): operand 0 of a dtype in `In`, the same type out
/// (bool when `BoolOut`).
template <DTypes In, bool BoolOut = false>
Result inferUnary(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, In));
  TensorType result = operand(q, 0);
  if (BoolOut) result.dtype = DType::Bool;
  return Types{result};
}

/// The shape rule of each op, defined by its family's file.
namespace rules {
#define KILN_OP(Enum, ...) extern const Rule Enum;
#include "ir/Ops.def"
#undef KILN_OP
}  // namespace rules

}  // namespace kiln::shape_rules
