// Target schedules for kernel IR (codegen/KernelIR.h, Schedule): how each
// target runs a kernel's loops, decided once here and followed by its
// emitter. The CPU runs the outermost parallel loop as one contiguous slice
// per thread and asks for SIMD lanes on the vectorizable loop. CUDA
// flattens the parallel loop and the independent loops perfectly nested in
// it into one index space that the grid covers grid-stride, 256 threads per
// block, one thread per result element; except for row reductions, where
// a warp (or, for long rows, a block) shares each row: its threads reduce
// strided slices of the row and combine them with warp shuffles (and shared
// memory across the warps of a block), then write the row's elements.
// A plain elementwise map over 4-byte dtypes, whose store and every load
// index their buffers at the flat element index, takes 4 consecutive
// elements per thread step instead, with float4/int4 loads and stores
// (aligned: every buffer the runner hands a kernel starts at a multiple of
// 16 bytes) and a scalar tail. Long float sums are cut into blocks that
// both emitters sum from zero and combine pairwise (sumBlocking).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "codegen/KernelIR.h"

namespace kiln::codegen {

/// How scheduleForCuda may map a kernel's loops.
struct CudaScheduleOptions {
  /// Whether row reductions may be shared by the threads of a warp or a
  /// block (false: every thread computes whole elements, the schedule that
  /// the host emulation of CudaEmitterTest, one thread after another, runs).
  bool cooperativeRows = true;
  /// A row gets a warp when its largest reduction has at least this many
  /// iterations, counting them once for each element of the row that would
  /// repeat them with one thread per element (a fused softmax of 8 computes
  /// its max and sum 8 times per row: 64) ...
  int64_t warpRowMin = 32;
  /// ... and a block when its largest reduction has at least this many.
  int64_t blockRowMin = 1024;
};

/// Schedules `kernel` for the CPU (codegen/llvm/). A loop of 8 or 16
/// iterations (isRegisterTileSide) holding only a Vector loop of as many
/// around one store that reads a transposed operand (tileTransposedLoads:
/// the tiles of codegen/Lowering.h transposeTiling) is mapped Tile.
void scheduleForCpu(kir::Kernel& kernel);

/// Whether the CPU transposes square tiles of side `n` in registers: 8
/// vectors of 8 elements in 3 rounds of 8 two-vector shuffles, or 16 of 16
/// in 4 rounds of 16.
inline bool isRegisterTileSide(int64_t n) { return n == 8 || n == 16; }

/// The loads of `store` that the rows of a tile read transposed: the
/// index steps by exactly 1 element as `rowVar` steps and by neither 0 nor
/// 1 as `colVar` (the vectorized loop along a row) steps. One per distinct
/// load (printExpr), innermost reads first.
std::vector<kir::ExprPtr> tileTransposedLoads(const kir::Stmt& store, int rowVar, int colVar);
/// Schedules `kernel` for CUDA (codegen/cuda/).
void scheduleForCuda(kir::Kernel& kernel, const CudaScheduleOptions& options = {});

/// The reductions in `store` (its index and value) whose variables other
/// than their own are all in `rowVars`: what the threads of a row compute
/// together before the row's elements are written. Innermost first (one
/// that another's body uses comes before it); copies that differ only in
/// the ids of their own variables (a fused softmax repeats its max) are
/// listed once, as reductionKey tells.
std::vector<kir::ExprPtr> rowInvariantReductions(const kir::Stmt& store, const std::vector<int>& rowVars);

/// The constant step of i64 index `e` when `var` steps by one, if `e` is
/// affine in `var` with a constant coefficient (other terms anything).
std::optional<int64_t> strideIn(const kir::Expr& e, int var);

/// The number of elements `reduction` combines: the product of its extents.
int64_t iterations(const kir::Expr& reduction);

/// How a long float sum is computed in blocks (docs/codegen.md, "Long
/// sums"): the iterations of reduction level `level` are taken `chunk` at
/// a time, with the levels inside it whole, so a block holds at most
/// kSumBlock elements; each block is summed from zero (on the CPU by SIMD
/// lanes, each a strided slice) and the blocks' partial sums are combined
/// pairwise, as a binary counter carries: block k is added to the partials
/// of the ctz(k) complete subtrees before it (`levels` partials are live at
/// most). The error then grows with log2(blocks), not with the length.
struct SumBlocking {
  size_t level = 0;
  int64_t chunk = 0;
  /// The chunks of `level` (ceil(extent / chunk)).
  int64_t chunks = 0;
  /// The blocks in all: the iterations of the levels outside `level` times
  /// `chunks`.
  int64_t blocks = 0;
  /// The partials the pairwise combination keeps: bit width of `blocks`.
  int levels = 0;
};

/// The most elements one block of a long sum holds. Within a block the
/// CPU's vectorized loop keeps 64 accumulators (16 lanes, 4 interleaved),
/// so each adds 32 elements; a CUDA thread alone adds them in order.
inline constexpr int64_t kSumBlock = 2048;

/// The blocking of `reduction` when it is a float Sum of more than `block`
/// elements (nothing otherwise: short sums and every other kind keep one
/// accumulator).
std::optional<SumBlocking> sumBlocking(const kir::Expr& reduction, int64_t block = kSumBlock);

/// A text equal for two reductions exactly when they compute the same
/// value: the expression with each reduction's own variables numbered by
/// nesting depth instead of by id.
std::string reductionKey(const kir::Expr& reduction);

}  // namespace kiln::codegen
