// The CUDA target (passes/Target.h): which matmuls and convolutions, with
// which ops after them, select-library gives to a math library. cuBLASLt
// takes every matmul of f32, f16 or bf16 that one cublasLtMatmul can
// compute — batched, one operand broadcast over the whole batch, 1-D
// operands — with the epilogues cuBLASLt has: a bias add (a vector along the
// result's last dim), GELU in its tanh form, or the bias add followed by
// tanh GELU. The rule is runtime/cuda/CublasLtMatmul.h's
// cublasLtMatmulShape, which the runtime plans with, so the target never
// accepts a call the runtime refuses. GELU in its erf form is not
// cuBLASLt's GELU: an erf `gelu` stays outside the group, for a generated
// kernel. Nor is a relu given to cuBLASLt's ReLU epilogue, which the runtime
// can run: NVIDIA documents it as max(x, 0), and whether it keeps NaN as
// Kiln's relu does is unconfirmed on a GPU (docs/cuda.md).
//
// cuDNN, when it is present where Kiln compiles (cudnnPresentForCompilation),
// takes a conv or conv_transpose of f32, f16 or bf16 that
// runtime/cuda/CudnnConvolution.h's cudnnConvolutionShape can express, alone:
// its epilogue stays in generated kernels. Without cuDNN, convolutions are
// generated kernels, and so are products of other dtypes.
//
// Tiny products are accepted too: whether a generated kernel beats a
// library's launch on them is for a measurement on a GPU to decide.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ir/IR.h"
#include "passes/Target.h"
#include "runtime/LibraryCall.h"
#include "runtime/cuda/CudaProgram.h"

namespace kiln::codegen {

/// CUDA's name: `--target cuda`, a CUDA `.kc`'s device, a kernel's
/// schedule for CUDA.
inline constexpr std::string_view kCudaTargetName = cuda::kCudaDevice;

class CudaTarget : public Target {
 public:
  /// Convolutions go to cuDNN when cudnnPresentForCompilation() says so
  /// (asked at each call, so that KILN_NO_CUDNN set later is honoured).
  CudaTarget() = default;
  /// Convolutions go to cuDNN exactly when `useCudnn`.
  explicit CudaTarget(bool useCudnn) : useCudnn_(useCudnn) {}

  std::string_view name() const override { return kCudaTargetName; }
  bool acceptsLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) const override;

 private:
  std::optional<bool> useCudnn_;
};

/// Whether cuDNN loads from where the CUDA runtime would look for it
/// (mathLibraryOptions of LibrarySearchOptions::fromEnvironment(): with the
/// emulated GPU, its folder only), asked once per process; $KILN_NO_CUDNN=1
/// hides it, so convolutions compile to generated kernels.
bool cudnnPresentForCompilation();

/// `call` in its library's words, "cublasLt matmul [2,8,128]x[1,128,32] +
/// bias, relu" or "cudnn conv [1,3,10,10]*[4,3,3,3] pad [1,1]", or why the
/// library refuses it: what `kiln-opt --target cuda --print-kernels` prints
/// for a library step.
std::string describeCudaLibraryCallText(const LibraryCall& call);

}  // namespace kiln::codegen
