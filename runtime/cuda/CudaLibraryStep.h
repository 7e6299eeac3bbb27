// A step of a CUDA program that a math library computes (a cuBLASLt matmul,
// a cuDNN convolution): what the runner (CudaRunner.cpp) needs of it, so that
// it holds one list of library steps whatever the library.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ir/Support.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::cuda {

/// One planned library call, enqueued on a stream by run().
class CudaLibraryStep {
 public:
  virtual ~CudaLibraryStep() = default;

  /// The device workspace run() needs (0 when none).
  virtual size_t workspaceBytes() const = 0;

  /// Enqueues the call on `stream`. `buffers` are the device pointers of the
  /// call's buffers in LibraryCall order (operands..., result); `workspace`
  /// holds at least workspaceBytes() bytes.
  virtual Status run(CUstream stream, const std::vector<CUdeviceptr>& buffers, CUdeviceptr workspace,
                     size_t workspaceBytes) const = 0;

  /// The call in its library's words, for profiles and error messages.
  virtual std::string describe() const = 0;
};

}  // namespace kiln::cuda
