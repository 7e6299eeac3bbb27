// The ops whose result sizes depend on their operands' values (nonzero,
// unique, non_max_suppression; OpClass::DataDependent in ir/Ops.def), as
// host functions that size their results as they compute them. The
// interpreter's kernels of these ops and the CPU executor, which runs them
// between its compiled stages (codegen/cpu/CpuExecutable.h), call the same code,
// so the two never differ.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "ir/IR.h"
#include "runtime/Tensor.h"

namespace kiln {

/// One data-dependent op as plain data: its kind and attributes.
struct DataDependentOp {
  OpKind kind = OpKind::NonZero;
  /// unique: the axis whose slices are compared, or none (the flattened
  /// operand's elements).
  std::optional<int64_t> axis;
  /// unique: values ascending (else in order of first occurrence).
  bool sorted = true;
  /// non_max_suppression: boxes are [x_center, y_center, width, height]
  /// (else corners [y1, x1, y2, x2]).
  bool centerPointBox = false;
  /// Where the op is, for errors.
  Location loc;
};

/// The data-dependent op `op` describes; an error for other ops.
Expected<DataDependentOp> dataDependentOpOf(const Op& op);

/// Runs `op` on `operands` (static, as the op's shape rule accepts them) and
/// returns its results, each allocated at the size the values give.
Expected<std::vector<Tensor>> runDataDependentOp(const DataDependentOp& op, std::span<const Tensor* const> operands);

}  // namespace kiln
