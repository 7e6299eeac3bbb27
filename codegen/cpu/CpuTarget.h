// The targets passes compile for (passes/Target.h), and how a `library`
// group of the IR becomes a library call (runtime/LibraryCall.h).
//
// On the CPU, oneDNN computes f32 matmuls large enough to pay for a call
// (k >= 64, or more than 2^16 multiply-adds: below that a generated loop
// nest is faster, docs/matmul.md), and every f32 convolution and transposed
// convolution, with the ops after them that it has post-ops for and
// computes as the ops are defined, NaN, infinities and signed zeros included
// (DnnlKernel::exactPostOp, docs/ops.md "Special values"): relu, tanh,
// sigmoid, abs, sqrt, neg, tanh gelu, silu, one scale or shift by a scalar
// constant, and add, sub, mul, div with a tensor that broadcasts into the
// result. Clips, max and min, exp, log and erf gelu are left to generated
// kernels: oneDNN's turn NaN into a bound or inf, or -0 into +0. A combination for which oneDNN
// has only its reference implementation (binary post-ops on some batched
// products: 6 ms against 0.05 ms for the product and a generated epilogue
// on the GPT's backward matmuls) is refused, so select-library offers a
// shorter epilogue. The CUDA target is codegen/cuda/CudaTarget.h (cuBLASLt);
// both read a contraction and its epilogue as a call the same way here.
#pragma once

#include <span>
#include <string_view>

#include "ir/IR.h"
#include "passes/Target.h"
#include "runtime/KcFile.h"
#include "runtime/LibraryCall.h"

namespace kiln::codegen {

/// The CPU's name: `--target cpu`, a CPU `.kc`'s device, a kernel's
/// schedule for the CPU.
inline constexpr std::string_view kCpuTargetName = kHostDevice;

class CpuTarget : public Target {
 public:
  std::string_view name() const override { return kCpuTargetName; }
  bool acceptsLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) const override;
  /// oneDNN's backward-weights convolution computes it.
  bool takesConvWeightGrad() const override { return true; }
  /// f32 2-d convolutions for which oneDNN has a brgemm (brgconv, brdgmm_dw) or jit kernel that
  /// reads and writes [N, H, W, C] (its reference and gemm-based ones are
  /// slower than a channels-first call with its own reorders).
  bool prefersChannelsLast(const Op& conv) const override;
};

/// The library call a `library` group (made by select-library) computes: its
/// contraction on the group's operands, then its other ops as post-ops. An
/// error names what does not fit. The call has no dtype: the group's (f32,
/// f16 or bf16, one for all its values) is what its target accepted.
Expected<LibraryCall> describeLibraryCall(const Op& group);

/// The call of the group select-library would make of `anchor` and
/// `epilogue` (passes/Target.h), buffers numbered as the group's operands
/// will be: what a target checks before accepting.
Expected<LibraryCall> describeLibraryCall(const Op& anchor, std::span<const Op* const> epilogue);

/// `call` in oneDNN's words: "onednn matmul [8,64]x[64,12] + add, gelu_erf
/// (brg:avx512_core)", or why oneDNN refuses it.
std::string describeLibraryCallText(const LibraryCall& call);

}  // namespace kiln::codegen
