// The CUDA target of CudaTarget.h: a matmul and its epilogue are read as one
// library call (codegen/CpuTarget.h, the reading both targets share), and
// cuBLASLt takes the call when runtime/cuda/CublasLtMatmul.h can plan it.
#include "codegen/cuda/CudaTarget.h"

#include "codegen/CpuTarget.h"
#include "runtime/cuda/CublasLtMatmul.h"

namespace kiln::codegen {

bool CudaTarget::acceptsLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) const {
  if (anchor.kind() != OpKind::MatMul) return false;
  const DType dtype = anchor.result()->type().dtype;
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return false;
  auto call = describeLibraryCall(anchor, epilogue);
  return call && cuda::cublasLtMatmulShape(*call).ok();
}

std::string describeCudaLibraryCallText(const LibraryCall& call) { return cuda::describeCublasLtMatmul(call); }

}  // namespace kiln::codegen
