// The index arithmetic that the lowerings of every op family share
// (internal to codegen/): broadcasting, linearizing and unravelling indices,
// clamping them in bounds, and the literals of a dtype. Each family's
// lowerings live in codegen/Lowering<Family>.cpp (the families of
// runtime/*Kernels.cpp) and register, in `lowerings::<Enum>`, the lowering
// of each of their ops; the declarations below, one per op of ir/Ops.def,
// make an op added there without its entry fail to link.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/Lowering.h"

namespace kiln::codegen {

namespace lower {

/// A result or operand multi-index: one i64 expression per dim.
using kir::ExprPtr;
using Index = std::vector<ExprPtr>;

/// The static dims of `v` (lowerings run on static shapes).
std::vector<int64_t> dimsOf(const Value* v);

/// The index of an operand of shape `shape` that broadcasts to a result
/// indexed by `index` (NumPy rules: aligned at the back, size-1 dims read 0).
Index broadcastIndex(const Index& index, const std::vector<int64_t>& shape);

/// Whether `e` is an i64 constant, and then its value in `out`.
bool indexConstant(const ExprPtr& e, int64_t& out);

/// Structural equality of two expressions.
bool sameExpr(const ExprPtr& a, const ExprPtr& b);

/// The offset `linear` when `index` is unravel(linear, shape), else null. A
/// reshape reads its input at the unravelled offset of the index it
/// writes; read from a buffer of the same row-major layout, the divisions
/// and remainders of the unravelling cancel, and the load is at `linear`
/// (a plain copy that vectorizes, instead of a division chain per element).
ExprPtr unraveledOffset(const Index& index, const std::vector<int64_t>& shape);

/// Row-major linear offset of `index` in `shape`. A run of dims whose
/// index is an unravelled offset (a reshape's input index, see
/// reshapeIndex) contributes that offset, without its divisions.
ExprPtr linearize(const Index& index, const std::vector<int64_t>& shape);

/// The offset of `index` in a buffer of dims `shape` laid out with element
/// `strides`; a run of dims laid out row-major among themselves whose index
/// is an unravelled offset contributes that offset times the run's stride
/// (linearize's shortcut, for a strided slice).
ExprPtr stridedOffset(const Index& index, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);

/// The multi-index of row-major offset `linear` in `shape`.
Index unravel(const ExprPtr& linear, const std::vector<int64_t>& shape);

/// `i` clamped into [0, size), so that a read it indexes is in bounds.
ExprPtr clampIndex(const ExprPtr& i, int64_t size);

/// The constant `value` in dtype `t`.
ExprPtr literal(DType t, int64_t value);

/// The value no element of dtype `t` is below: -inf for floats, the
/// minimum of an integer type (0 for unsigned). Max reductions start there.
ExprPtr lowestOf(DType t);

/// The largest value of dtype `t` (+inf for floats); Min reductions start there.
ExprPtr highestOf(DType t);

/// Whether 0 <= i < size, as a bool expression.
ExprPtr inRange(const ExprPtr& i, int64_t size);

/// Whether every element of `t` is the same (a constant the kernel can
/// inline as one literal).
bool isSplat(const DenseTensor& t);

}  // namespace lower

/// The lowering of each op (null where it has none), defined by its family's file.
namespace lowerings {
#define KILN_OP(Enum, ...) extern const LowerFn Enum;
#include "ir/Ops.def"
#undef KILN_OP
}  // namespace lowerings

}  // namespace kiln::codegen
