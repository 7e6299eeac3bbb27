// Library kernels from oneDNN for the CPU runtime (docs/matmul.md): a
// LibraryCall (runtime/LibraryCall.h) — an f32 matmul (batched, batch dims
// broadcast, 1-D operands), N-d convolution or transposed convolution
// (strides, pads, dilations, groups, bias) with its post-ops (relu, tanh,
// sigmoid, exp, log, abs, sqrt, alpha*x+beta, GELU in erf or tanh form,
// swish; binary add, sub, mul, div, max, min with a tensor that broadcasts
// into the result) — becomes one oneDNN primitive, created once. Matmuls use
// plain row-major layouts, so they read and write the program's buffers
// directly; convolutions take the blocked layouts oneDNN prefers, with
// reorders in and out (constant weights once).
//
// Nothing of oneDNN leaks through this header. oneDNN (3.2, PyPI's
// onednn-cpu-gomp) runs its parallel regions on OpenMP (libgomp);
// setDnnlThreads sets their size.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/Support.h"
#include "runtime/LibraryCall.h"

namespace kiln {

/// One oneDNN primitive with its post-ops, bound to an op's buffers.
class DnnlKernel {
 public:
  /// The oneDNN kernel of `call`, or an error saying why oneDNN cannot take
  /// it (rank, or oneDNN refusing the shapes or post-ops).
  /// `constantBuffers[i]` says buffer i never changes between runs (a
  /// constant), so a reordered copy of it is made once.
  static Expected<std::unique_ptr<DnnlKernel>> create(const LibraryCall& call,
                                                      const std::vector<bool>& constantBuffers = {});

  /// The implementation oneDNN chooses for `call` ("brg:avx512_core",
  /// "ref:any", ...), without creating the primitive; an error when oneDNN
  /// cannot take it.
  static Expected<std::string> implementation(const LibraryCall& call);
  /// What create() would make of `call`, as description() says it, without
  /// creating the primitive.
  static Expected<std::string> describe(const LibraryCall& call);
  /// Success when oneDNN computes the f32 post-op `p` as the IR op it
  /// came from is defined (ir/ScalarSemantics.h, docs/ops.md), NaN, +-Inf
  /// and the sign of zero included; else an error naming the difference
  /// ("clip turns NaN into its lower bound"). The CPU target gives oneDNN
  /// only post-ops that pass (codegen/cpu/CpuTarget.h); the others stay
  /// generated kernels.
  static Status exactPostOp(const PostOp& p);
  /// Success when every post-op of `call` is computed as the IR defines it:
  /// exactPostOp's, and the clips that a guarded call (a relu or clip
  /// after an f32 convolution or matmul, with bounded ops before it) runs
  /// as oneDNN's where its operands prove the value finite, and on the host
  /// otherwise, with the relus and clips after them.
  static Status exactCall(const LibraryCall& call);
  ~DnnlKernel();

  /// Runs on the call's buffers (LibraryCall::operands index them; the
  /// result is the last). A call with relu or clip post-ops first bounds
  /// its operands: oneDNN's max and min run where they are the IR's relu
  /// and clip (no NaN or infinity reaches them), and the exact variant
  /// (relu as elu and an add, clips on the host) otherwise, made on the
  /// first run that needs it, which is the only error.
  ///
  /// `bounds`, when given, holds a bound on max|v| of each of the call's
  /// buffers (operands, then the result), negative where none is known: the
  /// call takes the operands' instead of scanning them, and writes the
  /// result's (an f32 convolution or matmul whose post-ops pass a bound on;
  /// -1 otherwise or when it is too large).
  Status run(void* const* buffers, std::span<double> bounds = {}) const;
  /// How many runs took the guarded variant (oneDNN's max and min), and
  /// how many the exact one; both 0 for a call without a guard.
  int64_t guardedRuns() const;
  int64_t exactRuns() const;

  /// Multiply-adds of the matmul or convolution, for deciding whether the
  /// call is worth splitting across threads.
  int64_t work() const;

  /// What runs, e.g. `onednn matmul [1,64]x[64,32] + binary_add, relu
  /// (gemm:jit)`: the implementation oneDNN chose is last.
  const std::string& description() const;

  /// The primitive, its memory objects and bindings (DnnlKernels.cpp).
  struct Impl;

 private:
  explicit DnnlKernel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The threads oneDNN's parallel regions use from now on in this thread
/// (omp_set_num_threads: the OpenMP runtime oneDNN is built with).
void setDnnlThreads(int threads);

}  // namespace kiln
