// Convolutions through cuDNN for the CUDA runtime: a LibraryCall of kind Conv
// (NCHW, 1 to 3 spatial dims, strides, pads, dilations, groups) becomes one
// cudnnConvolutionForward (and a bias operand one cudnnAddTensor after it),
// and one of kind ConvTranspose — also the input
// gradient of a training step — one cudnnConvolutionBackwardData, whose
// weights [C_in, C_out/groups, k...] are exactly the transposed
// convolution's. Both use cuDNN's legacy descriptor API (runtime/cuda/
// CudnnAbi.h), planned once: descriptors, then the first algorithm of the
// _v7 heuristic whose workspace fits. A 1-D convolution is a 2-D one with a
// unit trailing dim.
//
// cuDNN pads both ends of a dim alike. Kiln's pads may differ: the begin
// pad is used for both, which is the same convolution whenever the output
// shape cuDNN then computes is the call's (the extra end padding reaches no
// output, or the end's shortfall removes none). Anything else — post-ops (epilogues stay in generated kernels), more than 3
// spatial dims, sizes past int32 — is an error from cudnnConvolutionShape,
// which the CUDA target (codegen/cuda/CudaTarget.h) asks before taking a
// convolution, so the target never accepts a call the runtime refuses.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/Support.h"
#include "ir/Types.h"
#include "runtime/LibraryCall.h"
#include "runtime/cuda/CudaLibraries.h"
#include "runtime/cuda/CudaLibraryStep.h"

namespace kiln::cuda {

/// What one cuDNN call computes for a LibraryCall, in cuDNN's terms: the
/// forward convolution's x [N,C,...], w [K,C/g,...] and y [N,K,...], with 2
/// or 3 spatial dims. A transposed convolution is the backward data of this
/// forward convolution: its input is dy (`y`), its result dx (`x`).
struct CudnnConvolutionShape {
  bool transposed = false;
  std::vector<int> x, w, y;
  std::vector<int> pads, strides, dilations;
  int groups = 1;
  /// The call's buffers (indices into LibraryCall order): the data operand
  /// (x, or dy when transposed), the weights, the bias along the result's
  /// channels (-1 without one), the result.
  int dataBuffer = 0, weightBuffer = 1, biasBuffer = -1, resultBuffer = 2;
};

/// cuDNN's plan for `call`, or an error saying what it cannot express.
Expected<CudnnConvolutionShape> cudnnConvolutionShape(const LibraryCall& call);

/// `call` in cuDNN's words, "cudnn conv [1,3,10,10]*[4,3,3,3] stride [2,2] pad [1,1]",
/// or why cuDNN cannot take it.
std::string describeCudnnConvolution(const LibraryCall& call);

/// One planned cuDNN convolution: handle, descriptors and the algorithm the
/// heuristic chose, made once; run() enqueues it on a stream.
class CudnnConvolution : public CudaLibraryStep {
 public:
  /// The convolution of `call` on `dtype` (f32, f16 or bf16; f32 compute).
  /// f32 uses CUDNN_FMA_MATH unless `allowTf32` (then cuDNN's default,
  /// which allows TF32 tensor cores). Errors name the call and cuDNN's status.
  static Expected<std::unique_ptr<CudnnConvolution>> create(const CudaMathLibrary& cudnn, const LibraryCall& call,
                                                            DType dtype, bool allowTf32);
  ~CudnnConvolution() override;
  CudnnConvolution(const CudnnConvolution&) = delete;
  CudnnConvolution& operator=(const CudnnConvolution&) = delete;

  size_t workspaceBytes() const override;
  Status run(CUstream stream, const std::vector<CUdeviceptr>& buffers, CUdeviceptr workspace,
             size_t workspaceBytes) const override;
  /// "cudnn conv [8,3,32,32]*[16,3,3,3] pad [1,1] + bias (f32, FMA math, algo 0)".
  std::string describe() const override;

  /// The resolved entry points and the cuDNN objects (CudnnConvolution.cpp).
  struct Impl;

 private:
  explicit CudnnConvolution(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  /// run() sets the handle's stream before each call.
  mutable std::mutex runMutex_;
};

}  // namespace kiln::cuda
