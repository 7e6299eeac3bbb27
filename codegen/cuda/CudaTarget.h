// The CUDA target (passes/Target.h): which matmuls, with which ops after
// them, select-library gives to cuBLASLt. It takes every matmul of f32, f16
// or bf16 that one cublasLtMatmul can compute — batched, one operand
// broadcast over the whole batch, 1-D operands — with the epilogues
// cuBLASLt has: a bias add (a vector along the result's last dim), ReLU,
// GELU in its tanh form, or the bias add followed by ReLU or tanh GELU. The
// rule is runtime/cuda/CublasLtMatmul.h's cublasLtMatmulShape, which the
// runtime plans with, so the target never accepts a call the runtime
// refuses. GELU in its erf form is not cuBLASLt's GELU: an erf `gelu` stays
// outside the group, for a generated kernel. Convolutions are generated
// kernels (cuDNN comes later), and so are products of other dtypes.
//
// Tiny products are accepted too: whether a generated kernel beats
// cuBLASLt's launch on them is for a measurement on a GPU to decide.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "ir/IR.h"
#include "passes/Target.h"
#include "runtime/LibraryCall.h"

namespace kiln::codegen {

class CudaTarget : public Target {
 public:
  std::string_view name() const override { return "cuda"; }
  bool acceptsLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) const override;
};

/// `call` in cuBLASLt's words, "cublasLt matmul [2,8,128]x[1,128,32] +
/// bias, relu", or why cuBLASLt refuses it: what `kiln-opt --target cuda
/// --print-kernels` prints for a library step.
std::string describeCudaLibraryCallText(const LibraryCall& call);

}  // namespace kiln::codegen
