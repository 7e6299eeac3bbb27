// Builder: creates ops at an insertion point of a Function, inferring result
// types from the shape rules. Used by the parser-free producers of IR: the
// ONNX importer, decomposition, autodiff and tests.
#pragma once

#include "ir/IR.h"
#include "ir/ShapeRules.h"

namespace kiln {

class Builder {
 public:
  /// Inserts at the end of `f`, or before its `return` if it has one.
  explicit Builder(Function& f);

  Function& function() const { return *f_; }
  /// New ops go just before `op` (at the end of the function when null).
  void setInsertionPoint(Op* op) { before_ = op; }
  void setLocation(Location loc) { loc_ = std::move(loc); }
  const Location& location() const { return loc_; }

  /// Creates an op with explicit result types.
  Op* create(OpKind kind, std::vector<Value*> operands, std::vector<TensorType> resultTypes,
             AttrMap attrs = {});
  /// Creates an op whose result types come from its shape rule; `declared`
  /// supplies them for ops that take their type from the declaration.
  Expected<Op*> build(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {},
                      std::vector<TensorType> declared = {});
  /// Single-result form of build().
  Expected<Value*> value(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {},
                         std::vector<TensorType> declared = {});

  /// A constant holding `t`.
  Value* constant(DenseTensor t);
  /// A rank-0 constant of `dtype` with value `v`.
  Value* scalar(DType dtype, double v);
  /// The function's `return` of `values`.
  Op* ret(std::vector<Value*> values);

 private:
  Function* f_;
  Op* before_;
  Location loc_;
};

/// Declares `var` as the value `expr` (an Expected<Value*>) builds, or
/// returns its error.
#define KILN_TRY_VALUE(var, expr)              \
  auto var##_or = (expr);                      \
  if (!var##_or.ok()) return var##_or.error(); \
  Value* var = *var##_or

}  // namespace kiln
