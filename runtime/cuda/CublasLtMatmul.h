// Matmuls through cuBLASLt for the CUDA runtime (docs/matmul.md): a
// LibraryCall of kind MatMul — Kiln's row-major matmul, batched, one operand
// possibly broadcast over the batch, 1-D operands — with the epilogues
// cuBLASLt has (a bias along the result's last dim, ReLU, GELU in its tanh
// form, a bias and then either activation) becomes one cublasLtMatmul call,
// planned once. cuBLASLt is column-major: the row-major product C = A B is
// computed as C^T = B^T A^T, which is the same memory, so that cuBLASLt's
// "A" is Kiln's b, its "B" Kiln's a, and its bias (a vector along D's m
// rows) runs along the result's last dim. A batch is a strided batch; an
// operand shared by every matrix of it has batch stride 0.
//
// cublasLtMatmulShape is the whole rule of what cuBLASLt can express: the
// CUDA target (codegen/cuda/CudaTarget.h) accepts exactly the calls it
// plans, and CublasLtMatmul::create refuses the rest with its error.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/Support.h"
#include "ir/Types.h"
#include "runtime/LibraryCall.h"
#include "runtime/cuda/CublasLtAbi.h"
#include "runtime/cuda/CudaLibraries.h"
#include "runtime/cuda/CudaLibraryStep.h"

namespace kiln::cuda {

/// What one cublasLtMatmul computes for a LibraryCall, in Kiln's row-major
/// terms: `batch` products [m,k] x [k,n] -> [m,n], then the epilogue.
struct CublasLtMatmulShape {
  enum class Epilogue { None, Relu, GeluTanh, Bias, BiasRelu, BiasGeluTanh };
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  /// Elements between consecutive matrices of a (and b); 0 when one matrix
  /// serves the whole batch. The result's is m * n.
  int64_t aBatchStride = 0, bBatchStride = 0;
  /// a stored with its last two dims swapped (LibraryCall::transposedA):
  /// cuBLASLt's B read with CUBLAS_OP_T instead of copied by a kernel.
  bool transposedA = false;
  /// b stored with its last two dims swapped (LibraryCall::transposedB):
  /// cuBLASLt's A read with CUBLAS_OP_T instead of copied by a kernel.
  bool transposedB = false;
  Epilogue epilogue = Epilogue::None;
  /// The call's buffers (indices into LibraryCall order): a, b, the bias
  /// vector of n elements (-1 without one), the result.
  int aBuffer = 0, bBuffer = 1, biasBuffer = -1, resultBuffer = 2;
  /// A tensor of the result's dims added to it (cuBLASLt's C, beta = 1),
  /// or -1.
  int residualBuffer = -1;
};

/// cuBLASLt's plan for `call`, or an error saying what it cannot express
/// (a convolution, an empty or too large dim, a batch broadcast over only
/// some of the batch dims, a post-op other than a bias add and a residual
/// add first and one ReLU or tanh-GELU after them).
Expected<CublasLtMatmulShape> cublasLtMatmulShape(const LibraryCall& call);

/// `call` in cuBLASLt's words, "cublasLt matmul [2,8,128]x[1,128,32] + bias,
/// relu", or why cuBLASLt cannot take it.
std::string describeCublasLtMatmul(const LibraryCall& call);

/// One planned cublasLtMatmul: descriptors, layouts and the algorithm the
/// heuristic chose, made once; run() enqueues it on a stream.
class CublasLtMatmul : public CudaLibraryStep {
 public:
  /// The matmul of `call` on `dtype` (a, b, the bias and the result; f32,
  /// f16 or bf16), accumulating in f32. `allowTf32` lets an f32 product use
  /// CUBLAS_COMPUTE_32F_FAST_TF32 (inputs rounded to TF32); without it f32
  /// is CUBLAS_COMPUTE_32F. Errors name the call and cuBLASLt's status.
  static Expected<std::unique_ptr<CublasLtMatmul>> create(const CudaMathLibrary& cublasLt, const LibraryCall& call,
                                                          DType dtype, bool allowTf32);
  ~CublasLtMatmul() override;
  CublasLtMatmul(const CublasLtMatmul&) = delete;
  CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;

  /// The device workspace run() needs (0 when the algorithm needs none).
  size_t workspaceBytes() const override;

  /// Enqueues the matmul on `stream`. `buffers` are the device pointers of
  /// the call's buffers in LibraryCall order (operands..., result), each
  /// aligned to kMinAlignment bytes; `workspace` holds at least
  /// workspaceBytes() bytes.
  Status run(CUstream stream, const std::vector<CUdeviceptr>& buffers, CUdeviceptr workspace,
             size_t workspaceBytes) const override;

  /// "cublasLt matmul [8,64]x[64,12] + bias, relu (f16, compute 32F)", for
  /// profiles and --print-kernels.
  std::string describe() const override;

  /// The buffer alignment the algorithm is chosen for. cuMemAlloc gives
  /// 256 bytes and Kiln's arenas 64; 16 keeps cuBLASLt's vectorized kernels.
  static constexpr uint64_t kMinAlignment = 16;

  /// The resolved entry points and the cuBLASLt objects (CublasLtMatmul.cpp).
  struct Impl;

 private:
  explicit CublasLtMatmul(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  /// run() sets the bias pointer on the shared descriptor before each call.
  mutable std::mutex runMutex_;
};

}  // namespace kiln::cuda
