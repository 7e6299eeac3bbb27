// The part of cuBLASLt's ABI that Kiln uses, as cublasLt.h, cublas_api.h and
// library_types.h of CUDA 13 declare it: status codes, data and compute
// types, the attributes of matmul descriptors, matrix layouts and search
// preferences, the epilogues, and the signatures of the entry points. Kiln
// includes no CUDA header (runtime/cuda/CudaLibraries.h says why); both
// runtime/cuda/CublasLtMatmul.cpp, which calls NVIDIA's cuBLASLt through
// dlopen, and the emulated GPU's cuBLASLt (test/devices/emulator/
// CublasLt.cpp), which implements these entry points, take the numbers from
// here, so the two cannot disagree with each other. Values are copied from
// the CUDA 13.0 headers; the handles are pointers to types that only the
// implementing library defines.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

struct CudaStreamState;  // CUstream (CudaLibraries.h) is cudaStream_t

namespace cublaslt {

using cudaStream_t = CudaStreamState*;

/// cublasStatus_t.
using cublasStatus_t = int;
constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
constexpr cublasStatus_t CUBLAS_STATUS_NOT_INITIALIZED = 1;
constexpr cublasStatus_t CUBLAS_STATUS_ALLOC_FAILED = 3;
constexpr cublasStatus_t CUBLAS_STATUS_INVALID_VALUE = 7;
constexpr cublasStatus_t CUBLAS_STATUS_ARCH_MISMATCH = 8;
constexpr cublasStatus_t CUBLAS_STATUS_MAPPING_ERROR = 11;
constexpr cublasStatus_t CUBLAS_STATUS_EXECUTION_FAILED = 13;
constexpr cublasStatus_t CUBLAS_STATUS_INTERNAL_ERROR = 14;
constexpr cublasStatus_t CUBLAS_STATUS_NOT_SUPPORTED = 15;
constexpr cublasStatus_t CUBLAS_STATUS_LICENSE_ERROR = 16;

/// The CUBLAS_STATUS_* name of `status`, or nullptr for a code not listed
/// above. The one table of these names: Kiln's error messages use it when a
/// cuBLASLt gives no name, and the emulated GPU's cublasLtGetStatusName
/// answers with it.
constexpr const char* cublasStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return nullptr;
  }
}

/// cudaDataType_t (library_types.h).
using cudaDataType_t = int;
constexpr cudaDataType_t CUDA_R_32F = 0;
constexpr cudaDataType_t CUDA_R_16F = 2;
constexpr cudaDataType_t CUDA_R_16BF = 14;

/// cublasComputeType_t.
using cublasComputeType_t = int;
constexpr cublasComputeType_t CUBLAS_COMPUTE_32F = 68;
constexpr cublasComputeType_t CUBLAS_COMPUTE_32F_PEDANTIC = 69;
constexpr cublasComputeType_t CUBLAS_COMPUTE_32F_FAST_TF32 = 77;

/// cublasOperation_t, cublasFillMode_t, cublasLtPointerMode_t, cublasLtOrder_t,
/// cublasLtBatchMode_t, cublasLtMatmulSearch_t.
constexpr int32_t CUBLAS_OP_N = 0;
constexpr int32_t CUBLAS_OP_T = 1;
constexpr int32_t CUBLAS_FILL_MODE_FULL = 2;
constexpr int32_t CUBLASLT_POINTER_MODE_HOST = 0;
constexpr int32_t CUBLASLT_ORDER_COL = 0;
constexpr int32_t CUBLASLT_ORDER_ROW = 1;
constexpr uint32_t CUBLASLT_BATCH_MODE_STRIDED = 0;
constexpr uint32_t CUBLASLT_SEARCH_BEST_FIT = 0;

/// cublasLtMatrixLayoutAttribute_t; the comment is the value's C type.
enum cublasLtMatrixLayoutAttribute_t : int {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                  // uint32_t
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,                 // int32_t
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_LD = 4,                    // int64_t
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,           // int32_t
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,  // int64_t, in elements
  CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET = 7,          // int64_t
  CUBLASLT_MATRIX_LAYOUT_BATCH_MODE = 8,            // uint32_t
};

/// cublasLtMatmulDescAttributes_t (the attributes of a plain matmul with
/// an epilogue; the scaling and auxiliary-output ones are not used).
enum cublasLtMatmulDescAttributes_t : int {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,       // int32_t
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,         // int32_t
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,       // int32_t
  CUBLASLT_MATMUL_DESC_TRANSA = 3,             // int32_t
  CUBLASLT_MATMUL_DESC_TRANSB = 4,             // int32_t
  CUBLASLT_MATMUL_DESC_TRANSC = 5,             // int32_t
  CUBLASLT_MATMUL_DESC_FILL_MODE = 6,          // int32_t
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,           // uint32_t
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,       // const void*
  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10, // int64_t
  CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = 15,   // int32_t
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,    // int32_t
};

/// cublasLtEpilogue_t: bias is a vector along D's rows (column-major m),
/// broadcast over its columns and added before the activation; GELU is the
/// tanh approximation.
constexpr uint32_t CUBLASLT_EPILOGUE_DEFAULT = 1;
constexpr uint32_t CUBLASLT_EPILOGUE_RELU = 2;
constexpr uint32_t CUBLASLT_EPILOGUE_BIAS = 4;
constexpr uint32_t CUBLASLT_EPILOGUE_RELU_BIAS = 6;
constexpr uint32_t CUBLASLT_EPILOGUE_GELU = 32;
constexpr uint32_t CUBLASLT_EPILOGUE_GELU_BIAS = 36;

/// cublasLtMatmulPreferenceAttributes_t.
enum cublasLtMatmulPreferenceAttributes_t : int {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,             // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,     // uint64_t
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,   // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,   // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,   // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,   // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,   // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = 9,         // float
  CUBLASLT_MATMUL_PREF_IMPL_MASK = 12,              // uint64_t
};

/// The handles: pointers to state only the library defines.
struct CublasLtContextState;
using cublasLtHandle_t = CublasLtContextState*;
struct CublasLtMatmulDescState;
using cublasLtMatmulDesc_t = CublasLtMatmulDescState*;
struct CublasLtMatrixLayoutState;
using cublasLtMatrixLayout_t = CublasLtMatrixLayoutState*;
struct CublasLtMatmulPreferenceState;
using cublasLtMatmulPreference_t = CublasLtMatmulPreferenceState*;

/// Semi-opaque: the caller holds these by value.
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
static_assert(sizeof(cublasLtMatmulHeuristicResult_t) == 96, "the layout of cublasLt.h");

// The entry points, as function types (the emulator checks its definitions
// against them).
using CublasLtCreateFn = cublasStatus_t(cublasLtHandle_t* handle);
using CublasLtDestroyFn = cublasStatus_t(cublasLtHandle_t handle);
using CublasLtGetVersionFn = size_t();
using CublasLtGetStatusNameFn = const char*(cublasStatus_t status);
using CublasLtMatmulDescCreateFn = cublasStatus_t(cublasLtMatmulDesc_t* desc, cublasComputeType_t computeType,
                                                  cudaDataType_t scaleType);
using CublasLtMatmulDescDestroyFn = cublasStatus_t(cublasLtMatmulDesc_t desc);
using CublasLtMatmulDescSetAttributeFn = cublasStatus_t(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                        const void* buf, size_t sizeInBytes);
using CublasLtMatrixLayoutCreateFn = cublasStatus_t(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                                    uint64_t cols, int64_t ld);
using CublasLtMatrixLayoutDestroyFn = cublasStatus_t(cublasLtMatrixLayout_t layout);
using CublasLtMatrixLayoutSetAttributeFn = cublasStatus_t(cublasLtMatrixLayout_t layout,
                                                          cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                          size_t sizeInBytes);
using CublasLtMatmulPreferenceCreateFn = cublasStatus_t(cublasLtMatmulPreference_t* pref);
using CublasLtMatmulPreferenceDestroyFn = cublasStatus_t(cublasLtMatmulPreference_t pref);
using CublasLtMatmulPreferenceSetAttributeFn = cublasStatus_t(cublasLtMatmulPreference_t pref,
                                                              cublasLtMatmulPreferenceAttributes_t attr,
                                                              const void* buf, size_t sizeInBytes);
using CublasLtMatmulAlgoGetHeuristicFn = cublasStatus_t(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                        cublasLtMatrixLayout_t aDesc, cublasLtMatrixLayout_t bDesc,
                                                        cublasLtMatrixLayout_t cDesc, cublasLtMatrixLayout_t dDesc,
                                                        cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                                        cublasLtMatmulHeuristicResult_t heuristicResults[],
                                                        int* returnAlgoCount);
using CublasLtMatmulFn = cublasStatus_t(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                        const void* a, cublasLtMatrixLayout_t aDesc, const void* b,
                                        cublasLtMatrixLayout_t bDesc, const void* beta, const void* c,
                                        cublasLtMatrixLayout_t cDesc, void* d, cublasLtMatrixLayout_t dDesc,
                                        const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceBytes,
                                        cudaStream_t stream);

}  // namespace cublaslt
}  // namespace kiln::cuda
