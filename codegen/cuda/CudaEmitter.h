// Kernel IR to CUDA C++ (docs/codegen.md section 3): the same kernel
// descriptions the LLVM emitter compiles for the CPU become one
// `extern "C" __global__` function each, in one translation unit that NVRTC
// compiles (codegen/cuda/NvrtcCompiler.h).
//
// Grid mapping: the kernel's parallel loop and the loops perfectly nested
// in it that are marked parallel or vectorize (their iterations are
// independent) are flattened into one index space of `workItems` elements,
// which a grid-stride loop covers (`blockIdx.x * blockDim.x + threadIdx.x`,
// stepping by `gridDim.x * blockDim.x`), so any grid size is correct and the
// runtime picks one. Each thread computes whole result elements: reductions
// are sequential loops inside a thread, other loops plain loops. A kernel
// without a parallel loop (a scalar result) runs on thread 0 of block 0.
//
// Vector schedules (codegen/Schedule.h, vectorWidth 4: a plain elementwise
// map over f32/i32): each thread step takes 4 consecutive elements with
// one float4/int4 load per buffer read and one vector store, the index
// space is ceil(n / 4), and a scalar grid-stride loop takes the last n % 4.
//
// Row schedules (codegen/Schedule.h, threadsPerRow 32 or the block): the
// index space is rows times the threads of a row, each warp (or block)
// taking rows grid-stride, so any grid is still correct. The row's
// reductions that do not change along its Lanes loop are computed once per
// row by all its threads (strided slices, a __shfl_xor_sync butterfly, and
// shared memory between the warps of a block), then the row's elements are
// written strided over the Lanes loop, or by the row's first thread.
//
// The signature mirrors the CPU's (`void** buffers, const int64_t* sizes`):
// one `__restrict__` pointer per buffer, typed by its dtype (inputs const),
// then `sizes`, unused like on the CPU; `cuLaunchKernel` passes them as its
// array of argument pointers. Scalar semantics follow the LLVM emitter and
// the interpreter: max/min and max/min reductions propagate NaN, `mod`
// takes the divisor's sign, round is half-to-even, integer division by zero
// gives 0, float-to-integer casts truncate through i64. Math uses CUDA's
// device functions (expf, tanhf, erff, ...; f64 overloads for f64). Index
// arithmetic is i64 (`long long`), as in the kernel IR. f16 and bf16 are
// computed in f32 like on the CPU: loads widen, stores and casts round to
// nearest even, by bit arithmetic in the prelude (no cuda_fp16.h, which
// NVRTC cannot find without the toolkit's include path).
#pragma once

#include <string>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/Support.h"

namespace kiln::codegen {

/// How one emitted kernel is launched: the size of its flattened grid
/// index space (1 for a kernel without a parallel loop; rows times threads
/// per row for a row schedule; ceil(elements / 4) for a vector one) and the block size its `__launch_bounds__`
/// promises.
struct CudaLaunch {
  std::string name;
  int64_t workItems = 1;
  int blockSize = 256;
};

/// A translation unit holding `kernels`, and how to launch each.
struct CudaSource {
  std::string code;
  std::vector<CudaLaunch> launches;
};

/// Emits `kernels` as CUDA C++. Errors name the kernel and what it uses
/// that the emitter lacks (kernel IR it cannot map to the grid).
Expected<CudaSource> emitCudaSource(const std::vector<kir::Kernel>& kernels);

}  // namespace kiln::codegen
