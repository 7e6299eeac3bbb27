// Library kernels from oneDNN for the CPU executor (docs/matmul.md): f32
// matmul (batched, batch dims broadcast, 1-D operands) and N-d convolution
// (strides, pads, dilations, groups, bias), each optionally with the
// epilogue of a `matmul_epilogue` / `conv_epilogue` fused group as oneDNN
// post-ops (elementwise: relu, tanh, sigmoid, exp, log, abs, sqrt, x*a+b by
// splat constants, and GELU (erf or tanh form) or SiLU recognized from the
// ops that compute them; binary: add, sub, mul, div, max, min with a
// tensor that broadcasts into the result). A primitive is created once per
// op and shape set. Matmuls use plain row-major layouts, so they read and
// write the executor's buffers directly; convolutions take the blocked
// layouts oneDNN prefers, with reorders in and out (constant weights once).
//
// Nothing of oneDNN leaks through this header. Debian's oneDNN runs its
// parallel regions on OpenMP (libgomp); setDnnlThreads sets their size.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace kiln::codegen {

/// One oneDNN primitive with its post-ops, bound to an op's buffers.
class DnnlKernel {
 public:
  /// The oneDNN kernel of `op`: a `matmul`, a `conv`, or a `fused` op whose
  /// region is one of them followed by an epilogue that maps onto post-ops
  /// (a chain in which each op consumes the previous result). An error says
  /// why oneDNN cannot take it (dtype, rank, an epilogue op without a
  /// post-op, or oneDNN refusing the shapes); the caller then generates a
  /// kernel instead.
  /// `constantOperands[i]` says operand i never changes between runs (a
  /// constant's buffer), so a reordered copy of it is made once.
  static Expected<std::unique_ptr<DnnlKernel>> create(const Op& op, const std::vector<bool>& constantOperands = {});
  ~DnnlKernel();

  /// Runs on the op's buffers: operands in order, then the result.
  void run(void* const* buffers) const;

  /// Multiply-adds of the matmul or convolution, for deciding whether the
  /// call is worth splitting across threads.
  int64_t work() const;

  /// What runs, e.g. `onednn matmul [1,64]x[64,32] + binary_add, relu
  /// (gemm:jit)`: the implementation oneDNN chose is last.
  const std::string& description() const;

 private:
  struct Impl;
  explicit DnnlKernel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The threads oneDNN's parallel regions use from now on in this thread
/// (omp_set_num_threads: the OpenMP runtime Debian's oneDNN is built with).
void setDnnlThreads(int threads);

}  // namespace kiln::codegen
