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
// 16 bytes) and a scalar tail.
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

/// Schedules `kernel` for the CPU (codegen/llvm/).
void scheduleForCpu(kir::Kernel& kernel);
/// Schedules `kernel` for CUDA (codegen/cuda/).
void scheduleForCuda(kir::Kernel& kernel, const CudaScheduleOptions& options = {});
/// Schedules `kernel` for the target named `target` ("cpu" or "cuda").
void scheduleFor(std::string_view target, kir::Kernel& kernel);

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

/// A text equal for two reductions exactly when they compute the same
/// value: the expression with each reduction's own variables numbered by
/// nesting depth instead of by id.
std::string reductionKey(const kir::Expr& reduction);

}  // namespace kiln::codegen
