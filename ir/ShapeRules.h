// Shape and dtype rules: for each op kind, the result types implied by the
// operand types and attributes. The verifier checks declared result types
// against them, `infer-shapes` refines declared types with them, the Builder
// fills in result types with them, and the interpreter uses them (on static
// shapes) to size its outputs.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "ir/IR.h"

namespace kiln {

/// What a shape rule sees: the op kind, its operand types, its attributes
/// (defaults applied through `attr`), and the declared result types, which
/// ops such as reshape, broadcast, cast, iota and random take their result
/// types from. `declared` may be empty when nothing is declared yet.
struct ShapeQuery {
  OpKind kind;
  std::span<const TensorType> operands;
  const AttrMap* attrs;
  std::span<const TensorType> declared;
  Location loc;

  /// The attribute if set, else the op table's default, else null.
  const Attribute* attr(std::string_view name) const;
};

/// The result types of an op, or an error naming the operand, attribute or
/// dim that is wrong and what was expected. Arity and attribute kinds are
/// assumed checked (the verifier does that first).
Expected<std::vector<TensorType>> inferResultTypes(const ShapeQuery& query);

/// Convenience: the rule applied to an op in the IR.
Expected<std::vector<TensorType>> inferResultTypes(const Op& op);

/// For a result of an op whose result sizes depend on operand values
/// (OpInfo::hasDataDependentShape): the most its one unknown dim can be,
/// from the operands' static dims (nonzero: the operand's elements; unique:
/// its elements, or its dim `axis`; non_max_suppression: batches * classes *
/// boxes). Nullopt for other ops and results, and where the operands' dims
/// are not static.
std::optional<int64_t> dataDependentBound(const Op& op, size_t result);

/// NumPy broadcasting of two shapes, or an error naming both.
Expected<Shape> broadcastShapes(const Shape& a, const Shape& b);

}  // namespace kiln
