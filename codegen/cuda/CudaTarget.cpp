// The CUDA target of CudaTarget.h: a matmul or convolution and its epilogue
// are read as one library call (codegen/cpu/CpuTarget.h, the reading both
// targets share); cuBLASLt takes the call when runtime/cuda/CublasLtMatmul.h
// can plan it, cuDNN (when present) when runtime/cuda/CudnnConvolution.h can.
#include "codegen/cuda/CudaTarget.h"

#include <cstdlib>
#include <string_view>

#include "codegen/cpu/CpuTarget.h"
#include "runtime/cuda/CublasLtMatmul.h"
#include "runtime/cuda/CudnnConvolution.h"

namespace kiln::codegen {

bool cudnnPresentForCompilation() {
  const char* hidden = std::getenv("KILN_NO_CUDNN");
  if (hidden && std::string_view(hidden) == "1") return false;
  static const bool present = [] {
    const cuda::LibrarySearchOptions options = cuda::mathLibraryOptions(cuda::LibrarySearchOptions::fromEnvironment());
    return cuda::loadCudnn(options).ok();
  }();
  return present;
}

bool CudaTarget::acceptsLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) const {
  const DType dtype = anchor.result()->type().dtype;
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return false;
  // A mixed-precision contraction (bf16 or f16 operands, f32 result):
  // cuBLASLt takes it (A and B low precision, C and D f32); a convolution
  // of one is a generated kernel until the cuDNN calls take mixed types.
  const bool mixed = anchor.numOperands() > 0 && anchor.operand(0)->type().dtype != dtype;
  if (mixed && anchor.kind() != OpKind::MatMul) return false;
  // A result stored in bf16 or f16 (an epilogue ending in a cast) is CPU
  // only for now: the cast stays a generated kernel.
  if (!epilogue.empty() && epilogue.back()->kind() == OpKind::Cast) return false;
  if (anchor.kind() == OpKind::MatMul) {
    auto call = describeLibraryCall(anchor, epilogue);
    if (!call) return false;
    // cuBLASLt's ReLU epilogue is documented as max(x, 0), and CUDA's fmaxf
    // turns NaN into 0; until a GPU shows it keeps NaN (scripts/gpu-check
    // --part e2e checks), a relu stays a generated kernel (docs/cuda.md).
    for (const PostOp& p : call->postOps)
      if (p.kind == PostOp::Kind::Relu || p.kind == PostOp::Kind::Clip) return false;
    return cuda::cublasLtMatmulShape(*call).ok();
  }
  // (conv_weight_grad is a generated kernel on CUDA.)
  if (anchor.kind() != OpKind::Conv && anchor.kind() != OpKind::ConvTranspose) return false;
  if (!epilogue.empty() || !useCudnn_.value_or(cudnnPresentForCompilation())) return false;
  // cuDNN is given channels-first convolutions only; a channels_last one
  // (written so by hand: assign-layouts leaves CUDA's alone) is a kernel.
  if (anchor.kind() == OpKind::Conv && anchor.getBool("channels_last")) return false;
  auto call = describeLibraryCall(anchor, epilogue);
  return call && cuda::cudnnConvolutionShape(*call).ok();
}

std::string describeCudaLibraryCallText(const LibraryCall& call) {
  return call.kind == LibraryCall::Kind::MatMul ? cuda::describeCublasLtMatmul(call)
                                                : cuda::describeCudnnConvolution(call);
}

}  // namespace kiln::codegen
