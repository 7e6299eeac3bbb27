// Matrix products of a few rows by a constant matrix, [M, K] x [K, N] with
// M small — a recurrent net's h R^T at each time step, a classifier head at
// batch 1 — on the CPU runtime's own kernel instead of oneDNN's.
//
// Such a product reads all of b to compute little, so its time is the time
// to stream b: oneDNN's matmul reads the plain row-major b from wherever it
// is (an LSTM's 1 MiB recurrent weight from L3, 22 us a step on 2 threads),
// and a oneDNN primitive of its own per time step cannot share a packed copy
// with the others. Here b is packed once per runner into panels of 64
// columns ([panel][k][64], zero-padded), shared by every call that
// multiplies by the same constant, and the panels are split among the
// threads the same way on every call: thread t always reads the same half,
// which stays in its core's L2 from one time step to the next.
//
// The post-ops of the call are applied to each finished tile: add, sub,
// mul and div with a tensor that broadcasts into the result (a bias row, or
// a full [M, N]), alpha*x+beta, relu, tanh and sigmoid. One source is
// compiled for AVX-512, AVX2 and baseline x86-64 (GCC vector extensions, one
// vector of 16 floats), and the widest the CPU has is chosen at run time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/Support.h"
#include "runtime/LibraryCall.h"

namespace kiln {

class PackedMatmul {
 public:
  /// b [K, N] packed into panels of 64 columns, read by every call with it.
  struct Weights;

  /// At most this many rows (a's dims but the last, multiplied): above, b
  /// is read once per 4 rows, and oneDNN's blocked GEMM is the better kernel.
  static constexpr int64_t kMaxRows = 8;

  /// Whether `call` is one this kernel computes: an f32 matmul whose a has
  /// at most kMaxRows rows, whose b has no batch (leading dims all 1) and at
  /// least 2 dims, and whose post-ops it has. The caller checks that b is a
  /// constant.
  static bool accepts(const LibraryCall& call);
  /// b's panels; `b` is row-major [k, n], or [n, k] when `transposed` (a
  /// call's LibraryCall::transposedB: read once here, strided).
  static std::shared_ptr<const Weights> pack(const float* b, int64_t k, int64_t n, bool transposed = false);
  /// The kernel of `call` (accepts(call) must hold) with b packed in `b`,
  /// whose k and n must be the call's.
  static Expected<std::unique_ptr<PackedMatmul>> create(const LibraryCall& call, std::shared_ptr<const Weights> b);
  ~PackedMatmul();

  /// Computes thread `thread`'s part of the result out of `threads`:
  /// panels [P*thread/threads, P*(thread+1)/threads) for P panels, so a
  /// thread reads the same columns of b on every call. `buffers` are the
  /// call's (operands, then the result).
  void run(void* const* buffers, int thread, int threads) const;

  /// Multiply-adds.
  int64_t work() const;
  /// "packed matmul [1,256]x[256,1024] + add (avx512)".
  const std::string& description() const;

  /// The instruction set the kernels run with here: "avx512", "avx2" or
  /// "x86-64" (or "generic" off x86).
  static const char* isa();

  struct Impl;

 private:
  explicit PackedMatmul(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
