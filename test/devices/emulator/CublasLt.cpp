// The emulated GPU's cuBLASLt: libcublasLt.so.13 in <build>/cuda-emulator,
// beside the emulator's libcuda.so.1, which Kiln opens instead of NVIDIA's
// when the driver is the emulator (runtime/cuda/CudaLibraries.h,
// mathLibraryOptions). It implements the entry points Kiln's cuBLASLt
// matmuls call (runtime/cuda/CublasLtMatmul.h) with the ABI of CUDA 13's
// cublasLt.h (runtime/cuda/CublasLtAbi.h): handles, matmul descriptors,
// matrix layouts (column- or row-major, leading dims, strided batches),
// search preferences, the heuristic (one algorithm, no workspace) and
// cublasLtMatmul itself, D = epilogue(alpha op(A) op(B) + beta C [+ bias])
// with the epilogues DEFAULT, RELU, BIAS, RELU_BIAS, GELU and GELU_BIAS, on
// f32, f16 or bf16 matrices with f32 compute (FAST_TF32 rounds f32 inputs
// to TF32 as the tensor cores do).
//
// The product is computed on the host, in stream order: cublasLtMatmul
// checks its arguments, copies everything it needs (the descriptors may be
// destroyed once it returns) and enqueues the work with kilnEmulatorEnqueue,
// so it runs after the stream's earlier kernels and copies, and is recorded
// by graph capture like a kernel launch. The work translates each matrix's
// whole range of device memory (kilnEmulatorTranslate); a range outside the
// live allocations fails the stream with an illegal address
// (kilnEmulatorFault), as a stray read on a GPU would. Every attribute or
// combination it does not implement is CUBLAS_STATUS_NOT_SUPPORTED, never
// a silently different product.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/ScalarSemantics.h"
#include "runtime/cuda/CublasLtAbi.h"
#include "test/devices/emulator/ElementConversions.h"
#include "test/devices/emulator/EmulatorHooks.h"

namespace kiln::cuda::cublaslt {

/// Handles carry a tag, so a destroyed or foreign handle is an error rather
/// than a crash where it can be.
constexpr uint32_t kHandleTag = 0x4c74486e;      // "nHtL"
constexpr uint32_t kDescTag = 0x4c744d64;        // "dMtL"
constexpr uint32_t kLayoutTag = 0x4c744c79;      // "yLtL"
constexpr uint32_t kPreferenceTag = 0x4c745066;  // "fPtL"
/// algo.data[0] of the one algorithm the heuristic returns.
constexpr uint64_t kAlgoTag = 0x6b696c6e2d616c67;  // "kiln-alg"

struct CublasLtContextState {
  uint32_t tag = kHandleTag;
};

struct CublasLtMatmulDescState {
  uint32_t tag = kDescTag;
  int32_t computeType = CUBLAS_COMPUTE_32F;
  int32_t scaleType = CUDA_R_32F;
  int32_t transA = CUBLAS_OP_N;
  int32_t transB = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  uint64_t bias = 0;  // a device pointer
  int64_t biasBatchStride = 0;
  int32_t biasType = -1;  // -1: D's type
};

struct CublasLtMatrixLayoutState {
  uint32_t tag = kLayoutTag;
  int32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batchCount = 1;
  int64_t batchStride = 0;  // elements
};

struct CublasLtMatmulPreferenceState {
  uint32_t tag = kPreferenceTag;
  uint64_t maxWorkspaceBytes = 0;
};

}  // namespace kiln::cuda::cublaslt

using namespace kiln::cuda::cublaslt;

namespace {

using namespace kiln::cuda::emulator;

size_t elementSize(int32_t type) { return type == CUDA_R_32F ? 4 : 2; }

float load(const uint8_t* base, int64_t index, int32_t type) {
  if (type == CUDA_R_32F) {
    float f;
    std::memcpy(&f, base + index * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, base + index * 2, 2);
  return type == CUDA_R_16F ? halfToFloat(h) : bfloat16ToFloat(h);
}

void store(uint8_t* base, int64_t index, int32_t type, float value) {
  if (type == CUDA_R_32F) {
    std::memcpy(base + index * 4, &value, 4);
    return;
  }
  const uint16_t h = type == CUDA_R_16F ? floatToHalf(value) : floatToBFloat16(value);
  std::memcpy(base + index * 2, &h, 2);
}

// --- Checking the arguments ---------------------------------------------------

bool isDataType(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

bool hasBias(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
         epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
}

/// One matrix of a matmul as the work item sees it: a copy of its layout.
struct Matrix {
  uint64_t pointer = 0;
  int32_t type = CUDA_R_32F;
  bool rowMajor = false;
  int64_t rows = 0, cols = 0, ld = 0, batchStride = 0;

  /// The element index of (r, c) in matrix `b` of the batch.
  int64_t index(int64_t b, int64_t r, int64_t c) const {
    return b * batchStride + (rowMajor ? r * ld + c : c * ld + r);
  }
  /// Bytes from the first element of the batch's first matrix past the last
  /// element of its last one; 0 when empty.
  unsigned __int128 span(int64_t batch) const {
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    const unsigned __int128 last = static_cast<unsigned __int128>(batch - 1) * static_cast<uint64_t>(batchStride) +
                                   static_cast<unsigned __int128>((rowMajor ? rows : cols) - 1) *
                                       static_cast<uint64_t>(ld) +
                                   static_cast<uint64_t>(rowMajor ? cols : rows);
    return last * elementSize(type);
  }
};

/// Everything one cublasLtMatmul computes, copied out of its descriptors.
struct MatmulWork {
  Matrix a, b, c, d;
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool tf32 = false;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  uint64_t bias = 0;
  int64_t biasBatchStride = 0;
  float alpha = 1, beta = 0;
};

Matrix matrixOf(const CublasLtMatrixLayoutState& l) {
  Matrix m;
  m.type = l.type;
  m.rowMajor = l.order == CUBLASLT_ORDER_ROW;
  m.rows = static_cast<int64_t>(l.rows);
  m.cols = static_cast<int64_t>(l.cols);
  m.ld = l.ld;
  m.batchStride = l.batchStride;
  return m;
}

/// Checks a matmul's descriptors and layouts and fills `work` from them
/// (pointers and scalars aside): what the heuristic and cublasLtMatmul
/// both require.
cublasStatus_t plan(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t aDesc,
                    cublasLtMatrixLayout_t bDesc, cublasLtMatrixLayout_t cDesc, cublasLtMatrixLayout_t dDesc,
                    MatmulWork& work) {
  if (!handle || handle->tag != kHandleTag) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || desc->tag != kDescTag) return CUBLAS_STATUS_INVALID_VALUE;
  for (cublasLtMatrixLayout_t l : {aDesc, bDesc, cDesc, dDesc})
    if (!l || l->tag != kLayoutTag) return CUBLAS_STATUS_INVALID_VALUE;
  // Types: one data type throughout, or f16/bf16 A and B into f32 C and D
  // (mixed precision); f32 compute and scale; TF32 for f32 data only.
  const int32_t type = dDesc->type;
  const bool mixed = type == CUDA_R_32F && aDesc->type != CUDA_R_32F;
  if (!isDataType(type) || !isDataType(aDesc->type) || bDesc->type != aDesc->type || cDesc->type != type ||
      (aDesc->type != type && !mixed))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->scaleType != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->computeType == CUBLAS_COMPUTE_32F_FAST_TF32) {
    if (type != CUDA_R_32F || mixed) return CUBLAS_STATUS_NOT_SUPPORTED;
    work.tf32 = true;
  } else if (desc->computeType != CUBLAS_COMPUTE_32F && desc->computeType != CUBLAS_COMPUTE_32F_PEDANTIC) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (hasBias(desc->epilogue) && desc->biasType != -1 && desc->biasType != type) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Shapes: op(A) is m x k, op(B) k x n, C and D m x n, all with one batch count.
  work.a = matrixOf(*aDesc);
  work.b = matrixOf(*bDesc);
  work.c = matrixOf(*cDesc);
  work.d = matrixOf(*dDesc);
  work.transA = desc->transA == CUBLAS_OP_T;
  work.transB = desc->transB == CUBLAS_OP_T;
  work.m = work.d.rows;
  work.n = work.d.cols;
  work.k = work.transA ? work.a.rows : work.a.cols;
  const int64_t aM = work.transA ? work.a.cols : work.a.rows;
  const int64_t bK = work.transB ? work.b.cols : work.b.rows;
  const int64_t bN = work.transB ? work.b.rows : work.b.cols;
  if (aM != work.m || bK != work.k || bN != work.n || work.c.rows != work.m || work.c.cols != work.n)
    return CUBLAS_STATUS_INVALID_VALUE;
  work.batch = dDesc->batchCount;
  for (cublasLtMatrixLayout_t l : {aDesc, bDesc, cDesc})
    if (l->batchCount != dDesc->batchCount) return CUBLAS_STATUS_INVALID_VALUE;
  work.epilogue = desc->epilogue;
  work.biasBatchStride = desc->biasBatchStride;
  return CUBLAS_STATUS_SUCCESS;
}

// --- The work item --------------------------------------------------------------

float gelu(float x) {
  // cuBLASLt's GELU: the tanh approximation.
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

/// The host address of `matrix`'s whole batch, or nullptr after failing the
/// stream with a message naming it.
uint8_t* translate(const Matrix& matrix, int64_t batch, const char* name) {
  const unsigned __int128 bytes = matrix.span(batch);
  if (bytes == 0) return nullptr;
  void* host = bytes >> 62 ? nullptr : kilnEmulatorTranslate(matrix.pointer, static_cast<uint64_t>(bytes));
  if (!host) {
    char text[160];
    std::snprintf(text, sizeof(text), "cublasLtMatmul: matrix %s at device address 0x%llx (%llu bytes) is not inside "
                  "one live allocation", name, static_cast<unsigned long long>(matrix.pointer),
                  static_cast<unsigned long long>(bytes));
    kilnEmulatorFault(text);
  }
  return static_cast<uint8_t*>(host);
}

void runMatmul(void* user) {
  const MatmulWork& w = *static_cast<const MatmulWork*>(user);
  if (w.m == 0 || w.n == 0 || w.batch == 0) return;
  // Every range is checked before anything is written.
  const uint8_t* a = w.k ? translate(w.a, w.batch, "A") : nullptr;
  if (w.k && !a) return;
  const uint8_t* b = w.k ? translate(w.b, w.batch, "B") : nullptr;
  if (w.k && !b) return;
  const uint8_t* c = nullptr;
  if (w.beta != 0) {
    c = translate(w.c, w.batch, "C");
    if (!c) return;
  }
  uint8_t* d = translate(w.d, w.batch, "D");
  if (!d) return;
  const uint8_t* bias = nullptr;
  if (hasBias(w.epilogue)) {
    Matrix vector;
    vector.pointer = w.bias;
    vector.type = w.d.type;
    vector.rows = w.m;
    vector.cols = 1;
    vector.ld = w.m;
    vector.batchStride = w.biasBatchStride;
    bias = translate(vector, w.batch, "bias");
    if (!bias) return;
  }

  std::vector<float> opA(static_cast<size_t>(w.m * w.k)), opB(static_cast<size_t>(w.k * w.n)),
      acc(static_cast<size_t>(w.m * w.n));
  for (int64_t batch = 0; batch < w.batch; ++batch) {
    // op(A) row-major m x k and op(B) row-major k x n, as f32 (TF32 if asked).
    for (int64_t i = 0; i < w.m; ++i)
      for (int64_t p = 0; p < w.k; ++p) {
        const float v = load(a, w.transA ? w.a.index(batch, p, i) : w.a.index(batch, i, p), w.a.type);
        opA[static_cast<size_t>(i * w.k + p)] = w.tf32 ? roundToTf32(v) : v;
      }
    for (int64_t p = 0; p < w.k; ++p)
      for (int64_t j = 0; j < w.n; ++j) {
        const float v = load(b, w.transB ? w.b.index(batch, j, p) : w.b.index(batch, p, j), w.b.type);
        opB[static_cast<size_t>(p * w.n + j)] = w.tf32 ? roundToTf32(v) : v;
      }
    // f32 sums in order of k.
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t i = 0; i < w.m; ++i)
      for (int64_t p = 0; p < w.k; ++p) {
        const float x = opA[static_cast<size_t>(i * w.k + p)];
        float* row = &acc[static_cast<size_t>(i * w.n)];
        const float* bRow = &opB[static_cast<size_t>(p * w.n)];
        for (int64_t j = 0; j < w.n; ++j) row[j] += x * bRow[j];
      }
    for (int64_t i = 0; i < w.m; ++i)
      for (int64_t j = 0; j < w.n; ++j) {
        float v = w.alpha * acc[static_cast<size_t>(i * w.n + j)];
        if (c) v += w.beta * load(c, w.c.index(batch, i, j), w.c.type);
        if (bias) v += load(bias, batch * w.biasBatchStride + i, w.d.type);
        switch (w.epilogue) {
          case CUBLASLT_EPILOGUE_RELU:
          case CUBLASLT_EPILOGUE_RELU_BIAS:
            // TODO(kiln): NaN is kept, as Kiln's relu keeps it; confirm on a lent GPU what cuBLASLt's does.
            v = kiln_frelu(v);
            break;
          case CUBLASLT_EPILOGUE_GELU:
          case CUBLASLT_EPILOGUE_GELU_BIAS: v = gelu(v); break;
          default: break;
        }
        store(d, w.d.index(batch, i, j), w.d.type, v);
      }
  }
}

void deleteMatmul(void* user) { delete static_cast<MatmulWork*>(user); }

// --- Attributes -----------------------------------------------------------------

/// Reads an attribute value of type T from `buf`: INVALID_VALUE unless the
/// buffer holds exactly one.
template <typename T>
cublasStatus_t readValue(const void* buf, size_t size, T& out) {
  if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&out, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

/// Reads a value that must be one of `allowed`; any other is NOT_SUPPORTED.
template <typename T>
cublasStatus_t readChoice(const void* buf, size_t size, std::initializer_list<T> allowed, T& out) {
  T value{};
  if (cublasStatus_t s = readValue(buf, size, value); s != CUBLAS_STATUS_SUCCESS) return s;
  for (T a : allowed)
    if (a == value) {
      out = value;
      return CUBLAS_STATUS_SUCCESS;
    }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

/// The dims and leading dim of a layout: cuBLASLt takes int32 sizes, and ld
/// must cover a column (a row, row-major).
cublasStatus_t checkLayout(const CublasLtMatrixLayoutState& l) {
  constexpr uint64_t kMaxDim = 0x7fffffff;
  if (l.rows > kMaxDim || l.cols > kMaxDim) return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t need = l.order == CUBLASLT_ORDER_ROW ? l.cols : l.rows;
  if (l.ld < 1 || static_cast<uint64_t>(l.ld) < need) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// --- The entry points -------------------------------------------------------------

#define KILN_CUBLASLT_EXPORT extern "C" __attribute__((visibility("default")))

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new CublasLtContextState;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle || handle->tag != kHandleTag) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->tag = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

/// CUDA 13.0's cuBLAS, as MAJOR * 10000 + MINOR * 100 + PATCH.
KILN_CUBLASLT_EXPORT size_t cublasLtGetVersion() { return 130000; }

KILN_CUBLASLT_EXPORT const char* cublasLtGetStatusName(cublasStatus_t status) {
  const char* name = cublasStatusName(status);
  return name ? name : "CUBLAS_STATUS_UNKNOWN";
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                                             cublasComputeType_t computeType,
                                                             cudaDataType_t scaleType) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new CublasLtMatmulDescState;
  (*desc)->computeType = computeType;
  (*desc)->scaleType = scaleType;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  if (!desc || desc->tag != kDescTag) return CUBLAS_STATUS_INVALID_VALUE;
  desc->tag = 0;
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                                   cublasLtMatmulDescAttributes_t attr,
                                                                   const void* buf, size_t sizeInBytes) {
  if (!desc || desc->tag != kDescTag) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return readValue(buf, sizeInBytes, desc->computeType);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return readValue(buf, sizeInBytes, desc->scaleType);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: {
      int32_t mode = 0;
      return readChoice<int32_t>(buf, sizeInBytes, {CUBLASLT_POINTER_MODE_HOST}, mode);
    }
    case CUBLASLT_MATMUL_DESC_TRANSA: return readChoice<int32_t>(buf, sizeInBytes, {CUBLAS_OP_N, CUBLAS_OP_T}, desc->transA);
    case CUBLASLT_MATMUL_DESC_TRANSB: return readChoice<int32_t>(buf, sizeInBytes, {CUBLAS_OP_N, CUBLAS_OP_T}, desc->transB);
    case CUBLASLT_MATMUL_DESC_TRANSC: {
      int32_t op = 0;
      return readChoice<int32_t>(buf, sizeInBytes, {CUBLAS_OP_N}, op);
    }
    case CUBLASLT_MATMUL_DESC_FILL_MODE: {
      int32_t mode = 0;
      return readChoice<int32_t>(buf, sizeInBytes, {CUBLAS_FILL_MODE_FULL}, mode);
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return readChoice<uint32_t>(buf, sizeInBytes,
                                  {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_BIAS,
                                   CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS},
                                  desc->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: {
      const void* pointer = nullptr;
      cublasStatus_t s = readValue(buf, sizeInBytes, pointer);
      desc->bias = reinterpret_cast<uintptr_t>(pointer);
      return s;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: {
      int64_t stride = 0;
      if (cublasStatus_t s = readValue(buf, sizeInBytes, stride); s != CUBLAS_STATUS_SUCCESS) return s;
      if (stride < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
      desc->biasBatchStride = stride;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return readValue(buf, sizeInBytes, desc->biasType);
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: {
      int32_t count = 0;  // a hint for the heuristic; one algorithm here
      return readValue(buf, sizeInBytes, count);
    }
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                                               uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  auto* l = new CublasLtMatrixLayoutState;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = l;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  if (!layout || layout->tag != kLayoutTag) return CUBLAS_STATUS_INVALID_VALUE;
  layout->tag = 0;
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                                     cublasLtMatrixLayoutAttribute_t attr,
                                                                     const void* buf, size_t sizeInBytes) {
  if (!layout || layout->tag != kLayoutTag) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
      uint32_t type = 0;
      if (cublasStatus_t s = readValue(buf, sizeInBytes, type); s != CUBLAS_STATUS_SUCCESS) return s;
      layout->type = static_cast<int32_t>(type);
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return readChoice<int32_t>(buf, sizeInBytes, {CUBLASLT_ORDER_COL, CUBLASLT_ORDER_ROW}, layout->order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return readValue(buf, sizeInBytes, layout->rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return readValue(buf, sizeInBytes, layout->cols);
    case CUBLASLT_MATRIX_LAYOUT_LD: return readValue(buf, sizeInBytes, layout->ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
      int32_t count = 0;
      if (cublasStatus_t s = readValue(buf, sizeInBytes, count); s != CUBLAS_STATUS_SUCCESS) return s;
      if (count < 1) return CUBLAS_STATUS_INVALID_VALUE;
      layout->batchCount = count;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: {
      int64_t stride = 0;
      if (cublasStatus_t s = readValue(buf, sizeInBytes, stride); s != CUBLAS_STATUS_SUCCESS) return s;
      if (stride < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
      layout->batchStride = stride;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: {
      int64_t offset = 0;  // planar complex: no complex types here
      return readChoice<int64_t>(buf, sizeInBytes, {0}, offset);
    }
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: {
      uint32_t mode = 0;
      return readChoice<uint32_t>(buf, sizeInBytes, {CUBLASLT_BATCH_MODE_STRIDED}, mode);
    }
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new CublasLtMatmulPreferenceState;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (!pref || pref->tag != kPreferenceTag) return CUBLAS_STATUS_INVALID_VALUE;
  pref->tag = 0;
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                         cublasLtMatmulPreferenceAttributes_t attr,
                                                                         const void* buf, size_t sizeInBytes) {
  if (!pref || pref->tag != kPreferenceTag) return CUBLAS_STATUS_INVALID_VALUE;
  // The one algorithm needs no workspace, reads elements one at a time (any
  // alignment) and reduces in one sequence, so every limit is met; the
  // values are still checked.
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
      uint32_t mode = 0;
      return readChoice<uint32_t>(buf, sizeInBytes, {CUBLASLT_SEARCH_BEST_FIT}, mode);
    }
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return readValue(buf, sizeInBytes, pref->maxWorkspaceBytes);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      uint32_t value = 0;
      return readValue(buf, sizeInBytes, value);
    }
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: {
      float waves = 0;
      return readValue(buf, sizeInBytes, waves);
    }
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: {
      uint64_t mask = 0;
      return readValue(buf, sizeInBytes, mask);
    }
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t aDesc, cublasLtMatrixLayout_t bDesc,
    cublasLtMatrixLayout_t cDesc, cublasLtMatrixLayout_t dDesc, cublasLtMatmulPreference_t preference,
    int requestedAlgoCount, cublasLtMatmulHeuristicResult_t heuristicResults[], int* returnAlgoCount) {
  if (requestedAlgoCount <= 0 || !heuristicResults || !returnAlgoCount) return CUBLAS_STATUS_INVALID_VALUE;
  if (!preference || preference->tag != kPreferenceTag) return CUBLAS_STATUS_INVALID_VALUE;
  *returnAlgoCount = 0;
  MatmulWork work;
  if (cublasStatus_t s = plan(handle, desc, aDesc, bDesc, cDesc, dDesc, work); s != CUBLAS_STATUS_SUCCESS) return s;
  for (cublasLtMatrixLayout_t l : {aDesc, bDesc, cDesc, dDesc})
    if (cublasStatus_t s = checkLayout(*l); s != CUBLAS_STATUS_SUCCESS) return s;
  cublasLtMatmulHeuristicResult_t& result = heuristicResults[0];
  std::memset(&result, 0, sizeof(result));
  result.algo.data[0] = kAlgoTag;
  result.workspaceSize = 0;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

KILN_CUBLASLT_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                   const void* alpha, const void* a, cublasLtMatrixLayout_t aDesc,
                                                   const void* b, cublasLtMatrixLayout_t bDesc, const void* beta,
                                                   const void* c, cublasLtMatrixLayout_t cDesc, void* d,
                                                   cublasLtMatrixLayout_t dDesc, const cublasLtMatmulAlgo_t* algo,
                                                   void* workspace, size_t workspaceBytes, cudaStream_t stream) {
  auto work = std::make_unique<MatmulWork>();
  if (cublasStatus_t s = plan(handle, desc, aDesc, bDesc, cDesc, dDesc, *work); s != CUBLAS_STATUS_SUCCESS) return s;
  for (cublasLtMatrixLayout_t l : {aDesc, bDesc, cDesc, dDesc})
    if (cublasStatus_t s = checkLayout(*l); s != CUBLAS_STATUS_SUCCESS) return s;
  if (algo && algo->data[0] != kAlgoTag) return CUBLAS_STATUS_INVALID_VALUE;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&work->alpha, alpha, sizeof(float));  // host pointer mode, f32 scale type
  std::memcpy(&work->beta, beta, sizeof(float));
  work->a.pointer = reinterpret_cast<uintptr_t>(a);
  work->b.pointer = reinterpret_cast<uintptr_t>(b);
  work->c.pointer = reinterpret_cast<uintptr_t>(c);
  work->d.pointer = reinterpret_cast<uintptr_t>(d);
  work->bias = desc->bias;
  if (!d || (work->k && (!a || !b)) || (work->beta != 0 && !c) || (hasBias(work->epilogue) && !work->bias))
    return CUBLAS_STATUS_INVALID_VALUE;
  MatmulWork* item = work.release();
  if (kilnEmulatorEnqueue(stream, runMatmul, item, deleteMatmul) != 0) {
    // The context is broken by an earlier fault; nothing was enqueued.
    delete item;
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The definitions have the ABI's types (CublasLtAbi.h).
static_assert(std::is_same_v<decltype(cublasLtCreate), CublasLtCreateFn>);
static_assert(std::is_same_v<decltype(cublasLtDestroy), CublasLtDestroyFn>);
static_assert(std::is_same_v<decltype(cublasLtGetVersion), CublasLtGetVersionFn>);
static_assert(std::is_same_v<decltype(cublasLtGetStatusName), CublasLtGetStatusNameFn>);
static_assert(std::is_same_v<decltype(cublasLtMatmulDescCreate), CublasLtMatmulDescCreateFn>);
static_assert(std::is_same_v<decltype(cublasLtMatmulDescDestroy), CublasLtMatmulDescDestroyFn>);
static_assert(std::is_same_v<decltype(cublasLtMatmulDescSetAttribute), CublasLtMatmulDescSetAttributeFn>);
static_assert(std::is_same_v<decltype(cublasLtMatrixLayoutCreate), CublasLtMatrixLayoutCreateFn>);
static_assert(std::is_same_v<decltype(cublasLtMatrixLayoutDestroy), CublasLtMatrixLayoutDestroyFn>);
static_assert(std::is_same_v<decltype(cublasLtMatrixLayoutSetAttribute), CublasLtMatrixLayoutSetAttributeFn>);
static_assert(std::is_same_v<decltype(cublasLtMatmulPreferenceCreate), CublasLtMatmulPreferenceCreateFn>);
static_assert(std::is_same_v<decltype(cublasLtMatmulPreferenceDestroy), CublasLtMatmulPreferenceDestroyFn>);
static_assert(
    std::is_same_v<decltype(cublasLtMatmulPreferenceSetAttribute), CublasLtMatmulPreferenceSetAttributeFn>);
static_assert(std::is_same_v<decltype(cublasLtMatmulAlgoGetHeuristic), CublasLtMatmulAlgoGetHeuristicFn>);
static_assert(std::is_same_v<decltype(cublasLtMatmul), CublasLtMatmulFn>);
