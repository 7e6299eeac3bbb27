// The part of cuDNN 9's legacy (descriptor) API that Kiln uses, as
// cudnn_graph.h, cudnn_ops.h and cudnn_cnn.h of cuDNN 9 declare it: status
// codes, data, math and convolution types, the algorithm results of the
// _v7 queries, and the signatures of the entry points. Kiln includes no
// CUDA header (runtime/cuda/CudaLibraries.h says why); both
// runtime/cuda/CudnnConvolution.cpp, which calls NVIDIA's cuDNN through
// dlopen, and the emulated GPU's cuDNN (test/devices/emulator/Cudnn.cpp),
// which implements these entry points, take the numbers from here. Values
// are copied from the cuDNN 9 headers; the handles are pointers to types
// that only the implementing library defines.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

struct CudaStreamState;  // CUstream (CudaLibraries.h) is cudaStream_t

namespace cudnn {

using cudaStream_t = CudaStreamState*;

/// cudnnStatus_t (the codes Kiln and the emulator use).
using cudnnStatus_t = int;
constexpr cudnnStatus_t CUDNN_STATUS_SUCCESS = 0;
constexpr cudnnStatus_t CUDNN_STATUS_NOT_INITIALIZED = 1001;
constexpr cudnnStatus_t CUDNN_STATUS_BAD_PARAM = 2000;
constexpr cudnnStatus_t CUDNN_STATUS_BAD_PARAM_NULL_POINTER = 2002;
constexpr cudnnStatus_t CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH = 2008;
constexpr cudnnStatus_t CUDNN_STATUS_NOT_SUPPORTED = 3000;
constexpr cudnnStatus_t CUDNN_STATUS_INTERNAL_ERROR = 4000;
constexpr cudnnStatus_t CUDNN_STATUS_EXECUTION_FAILED = 5000;

/// The CUDNN_STATUS_* name of `status`, or nullptr for a code not listed
/// above. The one table of these names: Kiln's error messages use it when
/// cuDNN gives no text, and the emulated GPU's cudnnGetErrorString answers
/// with it.
constexpr const char* cudnnStatusName(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return nullptr;
  }
}

/// cudnnDataType_t.
using cudnnDataType_t = int;
constexpr cudnnDataType_t CUDNN_DATA_FLOAT = 0;
constexpr cudnnDataType_t CUDNN_DATA_HALF = 2;
constexpr cudnnDataType_t CUDNN_DATA_BFLOAT16 = 9;

/// cudnnMathType_t: DEFAULT lets f32 use TF32 tensor cores; FMA does not.
using cudnnMathType_t = int;
constexpr cudnnMathType_t CUDNN_DEFAULT_MATH = 0;
constexpr cudnnMathType_t CUDNN_TENSOR_OP_MATH = 1;
constexpr cudnnMathType_t CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2;
constexpr cudnnMathType_t CUDNN_FMA_MATH = 3;

/// cudnnTensorFormat_t, cudnnConvolutionMode_t, cudnnDeterminism_t.
using cudnnTensorFormat_t = int;
constexpr cudnnTensorFormat_t CUDNN_TENSOR_NCHW = 0;
using cudnnConvolutionMode_t = int;
constexpr cudnnConvolutionMode_t CUDNN_CONVOLUTION = 0;
constexpr cudnnConvolutionMode_t CUDNN_CROSS_CORRELATION = 1;
using cudnnDeterminism_t = int;
constexpr cudnnDeterminism_t CUDNN_NON_DETERMINISTIC = 0;
constexpr cudnnDeterminism_t CUDNN_DETERMINISTIC = 1;

/// cudnnConvolutionFwdAlgo_t and cudnnConvolutionBwdDataAlgo_t.
using cudnnConvolutionFwdAlgo_t = int;
constexpr cudnnConvolutionFwdAlgo_t CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0;
constexpr int CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8;
using cudnnConvolutionBwdDataAlgo_t = int;
constexpr cudnnConvolutionBwdDataAlgo_t CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1;  // deterministic
constexpr int CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6;

/// CUDNN_DIM_MAX: the most dims a tensor descriptor has.
constexpr int CUDNN_DIM_MAX = 8;

/// The handles: pointers to state only the library defines.
struct cudnnContext;
using cudnnHandle_t = cudnnContext*;
struct cudnnTensorStruct;
using cudnnTensorDescriptor_t = cudnnTensorStruct*;
struct cudnnFilterStruct;
using cudnnFilterDescriptor_t = cudnnFilterStruct*;
struct cudnnConvolutionStruct;
using cudnnConvolutionDescriptor_t = cudnnConvolutionStruct*;

/// The _v7 queries' results, held by the caller.
struct cudnnConvolutionFwdAlgoPerf_t {
  cudnnConvolutionFwdAlgo_t algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
};
struct cudnnConvolutionBwdDataAlgoPerf_t {
  cudnnConvolutionBwdDataAlgo_t algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
};
static_assert(sizeof(cudnnConvolutionFwdAlgoPerf_t) == 48, "the layout of cudnn_cnn.h");
static_assert(sizeof(cudnnConvolutionBwdDataAlgoPerf_t) == 48, "the layout of cudnn_cnn.h");

// The entry points, as function types (the emulator checks its definitions
// against them).
using CudnnGetVersionFn = size_t();
using CudnnGetErrorStringFn = const char*(cudnnStatus_t status);
using CudnnCreateFn = cudnnStatus_t(cudnnHandle_t* handle);
using CudnnDestroyFn = cudnnStatus_t(cudnnHandle_t handle);
using CudnnSetStreamFn = cudnnStatus_t(cudnnHandle_t handle, cudaStream_t stream);
using CudnnCreateTensorDescriptorFn = cudnnStatus_t(cudnnTensorDescriptor_t* desc);
using CudnnSetTensorNdDescriptorFn = cudnnStatus_t(cudnnTensorDescriptor_t desc, cudnnDataType_t dataType, int nbDims,
                                                   const int dimA[], const int strideA[]);
using CudnnDestroyTensorDescriptorFn = cudnnStatus_t(cudnnTensorDescriptor_t desc);
using CudnnAddTensorFn = cudnnStatus_t(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t aDesc,
                                       const void* A, const void* beta, const cudnnTensorDescriptor_t cDesc, void* C);
using CudnnCreateFilterDescriptorFn = cudnnStatus_t(cudnnFilterDescriptor_t* desc);
using CudnnSetFilterNdDescriptorFn = cudnnStatus_t(cudnnFilterDescriptor_t desc, cudnnDataType_t dataType,
                                                   cudnnTensorFormat_t format, int nbDims, const int filterDimA[]);
using CudnnDestroyFilterDescriptorFn = cudnnStatus_t(cudnnFilterDescriptor_t desc);
using CudnnCreateConvolutionDescriptorFn = cudnnStatus_t(cudnnConvolutionDescriptor_t* desc);
using CudnnSetConvolutionNdDescriptorFn = cudnnStatus_t(cudnnConvolutionDescriptor_t desc, int arrayLength,
                                                        const int padA[], const int filterStrideA[],
                                                        const int dilationA[], cudnnConvolutionMode_t mode,
                                                        cudnnDataType_t computeType);
using CudnnSetConvolutionGroupCountFn = cudnnStatus_t(cudnnConvolutionDescriptor_t desc, int groupCount);
using CudnnSetConvolutionMathTypeFn = cudnnStatus_t(cudnnConvolutionDescriptor_t desc, cudnnMathType_t mathType);
using CudnnDestroyConvolutionDescriptorFn = cudnnStatus_t(cudnnConvolutionDescriptor_t desc);
using CudnnGetConvolutionForwardAlgorithm_v7Fn =
    cudnnStatus_t(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
                  const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,
                  const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults);
using CudnnGetConvolutionForwardWorkspaceSizeFn =
    cudnnStatus_t(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
                  const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
                  cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes);
using CudnnConvolutionForwardFn =
    cudnnStatus_t(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc, const void* x,
                  const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnConvolutionDescriptor_t convDesc,
                  cudnnConvolutionFwdAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                  const cudnnTensorDescriptor_t yDesc, void* y);
using CudnnGetConvolutionBackwardDataAlgorithm_v7Fn =
    cudnnStatus_t(cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
                  const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,
                  const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults);
using CudnnGetConvolutionBackwardDataWorkspaceSizeFn =
    cudnnStatus_t(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
                  const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
                  cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes);
using CudnnConvolutionBackwardDataFn =
    cudnnStatus_t(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc, const void* w,
                  const cudnnTensorDescriptor_t dyDesc, const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                  cudnnConvolutionBwdDataAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                  const cudnnTensorDescriptor_t dxDesc, void* dx);

}  // namespace cudnn
}  // namespace kiln::cuda
