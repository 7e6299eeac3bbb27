// Lowering from Kiln IR ops to kernel IR (docs/codegen.md section 2). Each
// primitive op has one lowering function, kept in a table indexed by OpKind
// and filled from ir/Ops.def: given the op and the multi-index of one result
// element, it returns that element's scalar expression, reading operand
// elements through a LoweringContext. A one-op kernel answers those reads
// with loads from its buffers; a fused group will answer them with its
// producers' lowerings, so the same functions serve both.
//
// Lowerings assume static shapes (the CPU executor specializes functions to
// their inputs first). f16 and bf16 values are computed in f32 by the
// emitter (rounded when stored), so lowerings treat them as any float.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/IR.h"

namespace kiln::codegen {

/// What a lowering reads its operands through.
class LoweringContext {
 public:
  virtual ~LoweringContext() = default;
  /// The element of operand `i` at `index` (one i64 expression per dim of
  /// that operand, each within the dim's bounds).
  virtual Expected<kir::ExprPtr> operand(size_t i, const std::vector<kir::ExprPtr>& index) = 0;
  /// Reserves `count` fresh loop variables for a reduction; returns the first.
  virtual int newVars(int count) = 0;
};

/// The expression of the result element of `op` at `index`.
using LowerFn = Expected<kir::ExprPtr> (*)(const Op& op, LoweringContext& ctx, const std::vector<kir::ExprPtr>& index);

/// The lowering of `kind`, or null when it has none yet.
LowerFn loweringFor(OpKind kind);

/// Why `op` cannot be lowered (no lowering for its kind, a dtype the
/// emitters lack, a non-static shape), or empty when it can.
std::string whyNotLowerable(const Op& op);

/// Element strides of a kernel's buffers in memory, by buffer (its
/// operands, then its result): an empty entry, or none, is the buffer's own
/// row-major layout. A value placed in a strided slice of a concatenation's
/// buffer (passes/MemoryPlan.h Buffer::strides) is read and written there.
using BufferStrides = std::vector<std::vector<int64_t>>;

/// Lowers one op to a kernel named `name`: buffers 0..n-1 are its operands,
/// buffer n its result. The result's dims but the last are flattened into
/// one parallel loop (so a batch of 1 still splits across threads); the
/// last dim is the vectorized inner loop, or, when the others hold one
/// element, cut into runs (rowRun) that the parallel loop takes. A kernel
/// that reads an operand across the result's rows (a transpose, or an
/// elementwise group with a transposed operand: transposeTiling) runs in
/// tiles instead: the parallel loop over tiles of the dim `a` the operand
/// is contiguous in and of the last dim, a loop over the tile's rows
/// (parallel too, for CUDA's grid), the vectorized loop over a row. A
/// top-level `concat` is lowerConcatKernel's copy of every operand.
Expected<kir::Kernel> lowerOpToKernel(const Op& op, std::string name, const BufferStrides& strides = {});

/// The runs a result of `outer` rows of `row` elements is cut into along
/// its row: `row` itself (no cut) unless there is one row of at least
/// 2 * kMinRowRun elements, else the shortest divisor of `row` of at least
/// kMinRowRun and row / kRowRuns elements (a multiple of 16 where one is),
/// or `row` when none is at most half of it. A bias gradient over
/// [1024 rows, 1024] into f32[1024] was one iteration of the parallel loop,
/// so one thread summed it all; cut into 8 runs of 128 columns, each thread
/// sums its columns' rows with vectors of 16 lanes.
int64_t rowRun(int64_t outer, int64_t row);
/// The shortest run rowRun cuts (4 vectors of 16 lanes) ...
inline constexpr int64_t kMinRowRun = 64;
/// ... and how many runs it aims at, enough for the threads of a small
/// machine to share evenly.
inline constexpr int64_t kRowRuns = 8;

/// How lowerOpToKernel tiles a kernel that reads an operand across the
/// rows of its result: a row of the result is contiguous in memory, but
/// that operand's elements along it are a stride apart, each in a cache
/// line of its own. Walking whole rows, every element read brought in a
/// line of which one element was used before the line left L1 (and at
/// strides of 4 KB all the lines of a column fall in one cache set): a
/// [1024,1024] f32 transpose ran at 0.6-1.6 GB/s. A tile of 16 x 16 f32
/// (or 8 x 8) reads and writes its lines together, whole (or halves that
/// the next tile along the last dim completes).
struct TransposeTiling {
  /// The result dim (not the last) along which the operand is contiguous.
  size_t dim = 0;
  /// Elements of the tile along `dim` and along the last dim; each divides
  /// its dim (transposeTile).
  int64_t tileA = 1;
  int64_t tileB = 1;
};

/// The tiling of a kernel whose result, of dims `shape` (written at
/// `outStrides`, empty for row-major), has the element expression `value`
/// at the index (%i0, %i1, ..., one variable per dim): when some load steps
/// by neither 0 nor 1 element as the last dim's %i steps, and by exactly 1
/// as another dim's does (a dim above 1). Nothing when the last dim is 1,
/// when the result is written across rows itself, or when `value` holds a
/// reduction (those keep their row loops and vectorized reductions).
std::optional<TransposeTiling> transposeTiling(const kir::ExprPtr& value, const std::vector<int64_t>& shape,
                                               const std::vector<int64_t>& outStrides = {});

/// The tile of both dims when both divide by it and the transposed
/// elements are 4 bytes or narrower; otherwise each dim's transposeTile.
inline constexpr int64_t kWideTransposeTile = 16;

/// The elements a tile takes along a dim: its extent up to this ...
inline constexpr int64_t kTransposeTile = 8;
/// ... and beyond it, the tile of a dim of `extent`, which divides it (so
/// that every tile is whole and no element is written twice: an in-place
/// kernel reads the element it overwrites, passes/MemoryPlan.h).
int64_t transposeTile(int64_t extent);

/// The kernel of concat `op` that copies operands `copied` (by position)
/// into their slices of its result and writes nothing else (the other
/// operands are in their slices already, passes/MemoryPlan.h). One
/// parallel loop over the result's dims before the axis, each index of
/// them cut into equal chunks of every copied operand's row (its elements
/// along the axis and after it) when rows are long and few; inside it, each
/// copied operand's run is one vectorized loop, a plain copy when the
/// buffers are contiguous there.
Expected<kir::Kernel> lowerConcatKernel(const Op& op, std::string name, const std::vector<int>& copied,
                                        const BufferStrides& strides = {});

}  // namespace kiln::codegen
