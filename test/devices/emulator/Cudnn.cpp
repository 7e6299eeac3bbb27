// The emulated GPU's cuDNN: libcudnn.so.9 in <build>/cuda-emulator, beside
// the emulator's libcuda.so.1, which Kiln opens instead of NVIDIA's when the
// driver is the emulator (runtime/cuda/CudaLibraries.h, mathLibraryOptions).
// It implements the legacy entry points Kiln's cuDNN convolutions call
// (runtime/cuda/CudnnConvolution.h) with the ABI of cuDNN 9's headers
// (runtime/cuda/CudnnAbi.h): handles and their streams, packed NCHW tensor
// and filter descriptors of 4 or 5 dims, convolution descriptors
// (cross-correlation, symmetric pads, strides, dilations, groups, math
// type), the _v7 algorithm queries (one algorithm each, no workspace),
// cudnnConvolutionForward and cudnnConvolutionBackwardData, y = alpha op(x,
// w) + beta y, and cudnnAddTensor (C = alpha A + beta C, A broadcast along
// its unit dims), on f32, f16 or bf16 data with f32 compute (f32 under the
// default or tensor-op math rounds its inputs to TF32, as tensor cores do).
//
// The convolution is computed on the host, in stream order: the call checks
// its arguments, copies the shapes (the descriptors may be destroyed once it
// returns) and enqueues the work with kilnEmulatorEnqueue, so it runs after
// the stream's earlier kernels and copies and is recorded by graph capture
// like a kernel launch. The work translates each tensor's whole range of
// device memory (kilnEmulatorTranslate); a range outside the live
// allocations fails the stream with an illegal address (kilnEmulatorFault).
// Every descriptor value or combination it does not implement is
// CUDNN_STATUS_NOT_SUPPORTED, never a silently different convolution.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "runtime/cuda/CudnnAbi.h"
#include "test/devices/emulator/ElementConversions.h"
#include "test/devices/emulator/EmulatorHooks.h"

namespace kiln::cuda::cudnn {

/// Handles carry a tag, so a destroyed or foreign handle is an error rather
/// than a crash where it can be.
constexpr uint32_t kHandleTag = 0x6e6e4468;      // "hDnn"
constexpr uint32_t kTensorTag = 0x6e6e4474;      // "tDnn"
constexpr uint32_t kFilterTag = 0x6e6e4466;      // "fDnn"
constexpr uint32_t kConvolutionTag = 0x6e6e4463;  // "cDnn"
/// The one algorithm each query returns.
constexpr int kForwardAlgo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
constexpr int kBackwardDataAlgo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;

struct cudnnContext {
  uint32_t tag = kHandleTag;
  cudaStream_t stream = nullptr;
};

struct cudnnTensorStruct {
  uint32_t tag = kTensorTag;
  bool set = false;
  int type = CUDNN_DATA_FLOAT;
  int nbDims = 0;
  int dims[CUDNN_DIM_MAX] = {};
  int strides[CUDNN_DIM_MAX] = {};
};

struct cudnnFilterStruct {
  uint32_t tag = kFilterTag;
  bool set = false;
  int type = CUDNN_DATA_FLOAT;
  int nbDims = 0;
  int dims[CUDNN_DIM_MAX] = {};
};

struct cudnnConvolutionStruct {
  uint32_t tag = kConvolutionTag;
  bool set = false;
  int spatial = 0;
  int pads[3] = {}, strides[3] = {}, dilations[3] = {};
  int computeType = CUDNN_DATA_FLOAT;
  int groups = 1;
  int math = CUDNN_DEFAULT_MATH;
};

}  // namespace kiln::cuda::cudnn

using namespace kiln::cuda::cudnn;

namespace {

using namespace kiln::cuda::emulator;

size_t elementSize(int type) { return type == CUDNN_DATA_FLOAT ? 4 : 2; }

/// A tensor's elements as floats (rounded to TF32 when `tf32`).
std::vector<float> loadAll(const uint8_t* base, int64_t count, int type, bool tf32) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    float v;
    if (type == CUDNN_DATA_FLOAT) {
      std::memcpy(&v, base + i * 4, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, base + i * 2, 2);
      v = type == CUDNN_DATA_HALF ? halfToFloat(h) : bfloat16ToFloat(h);
    }
    values[static_cast<size_t>(i)] = tf32 ? roundToTf32(v) : v;
  }
  return values;
}

void store(uint8_t* base, int64_t index, int type, float value) {
  if (type == CUDNN_DATA_FLOAT) {
    std::memcpy(base + index * 4, &value, 4);
    return;
  }
  const uint16_t h = type == CUDNN_DATA_HALF ? floatToHalf(value) : floatToBFloat16(value);
  std::memcpy(base + index * 2, &h, 2);
}

bool isDataType(int t) { return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16; }

// --- The convolution's shape ------------------------------------------------------

/// A convolution as the work item sees it: x [N,C,D,H,W], w [K,C/g,T,R,S],
/// y [N,K,...], 2-D ones with a unit depth.
struct ConvShape {
  int64_t n = 0, c = 0, k = 0, groups = 1;
  int64_t in[3] = {1, 1, 1}, kernel[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t pad[3] = {0, 0, 0}, stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1};
  int type = CUDNN_DATA_FLOAT;
  bool tf32 = false;

  int64_t xCount() const { return n * c * in[0] * in[1] * in[2]; }
  int64_t wCount() const { return k * (c / groups) * kernel[0] * kernel[1] * kernel[2]; }
  int64_t yCount() const { return n * k * out[0] * out[1] * out[2]; }
};

bool packed(const cudnnTensorStruct& t) {
  int64_t stride = 1;
  for (int i = t.nbDims - 1; i >= 0; --i) {
    if (t.strides[i] != stride) return false;
    stride *= t.dims[i];
  }
  return true;
}

/// Checks the descriptors of one convolution and reads its shape.
cudnnStatus_t plan(cudnnHandle_t handle, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                   const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y, ConvShape& s) {
  if (!handle || handle->tag != kHandleTag) return CUDNN_STATUS_BAD_PARAM;
  if (!x || !w || !conv || !y) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (x->tag != kTensorTag || y->tag != kTensorTag || w->tag != kFilterTag || conv->tag != kConvolutionTag)
    return CUDNN_STATUS_BAD_PARAM;
  if (!x->set || !y->set || !w->set || !conv->set) return CUDNN_STATUS_BAD_PARAM;
  if (x->type != w->type || y->type != w->type) return CUDNN_STATUS_NOT_SUPPORTED;
  if (conv->computeType != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;  // f32 compute only
  const int rank = x->nbDims;
  if ((rank != 4 && rank != 5) || w->nbDims != rank || y->nbDims != rank || conv->spatial != rank - 2)
    return CUDNN_STATUS_NOT_SUPPORTED;
  if (!packed(*x) || !packed(*y)) return CUDNN_STATUS_NOT_SUPPORTED;  // packed NCHW only
  s.type = x->type;
  s.tf32 = x->type == CUDNN_DATA_FLOAT && conv->math != CUDNN_FMA_MATH;
  s.n = x->dims[0];
  s.c = x->dims[1];
  s.k = w->dims[0];
  s.groups = conv->groups;
  if (s.groups < 1 || s.c % s.groups != 0 || s.k % s.groups != 0 || w->dims[1] * s.groups != s.c ||
      y->dims[0] != s.n || y->dims[1] != s.k)
    return CUDNN_STATUS_BAD_PARAM;
  const int spatial = rank - 2, offset = 3 - spatial;
  for (int i = 0; i < spatial; ++i) {
    const int j = offset + i;
    s.in[j] = x->dims[2 + i];
    s.kernel[j] = w->dims[2 + i];
    s.out[j] = y->dims[2 + i];
    s.pad[j] = conv->pads[i];
    s.stride[j] = conv->strides[i];
    s.dilation[j] = conv->dilations[i];
    const int64_t span = s.in[j] + 2 * s.pad[j] - s.dilation[j] * (s.kernel[j] - 1) - 1;
    if (span < 0 || span / s.stride[j] + 1 != s.out[j]) return CUDNN_STATUS_BAD_PARAM;
  }
  return CUDNN_STATUS_SUCCESS;
}

// --- The work item -----------------------------------------------------------------

struct ConvWork {
  ConvShape shape;
  bool backwardData = false;
  float alpha = 1, beta = 0;
  uint64_t x = 0, w = 0, y = 0;  // device pointers; for backward data x is dx and y dy
};

/// The host address of `count` elements at `pointer`, or nullptr after
/// failing the stream with a message naming the tensor.
uint8_t* translate(uint64_t pointer, int64_t count, int type, const char* entry, const char* name) {
  const unsigned long long bytes = static_cast<unsigned long long>(count) * elementSize(type);
  void* host = kilnEmulatorTranslate(pointer, bytes);
  if (!host) {
    char text[200];
    std::snprintf(text, sizeof(text), "%s: tensor %s at device address 0x%llx (%llu bytes) is not inside one live "
                  "allocation", entry, name, static_cast<unsigned long long>(pointer), bytes);
    kilnEmulatorFault(text);
  }
  return static_cast<uint8_t*>(host);
}

/// Calls `f(input offset, weight offset, output offset)` for every pair of an
/// output position and a filter tap, with offsets within one (n, channel)
/// image and one filter; a tap that reads the padding has input offset -1.
template <typename F>
void forEachTap(const ConvShape& s, F&& f) {
  for (int64_t o0 = 0; o0 < s.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < s.out[1]; ++o1)
      for (int64_t o2 = 0; o2 < s.out[2]; ++o2) {
        const int64_t outIndex = (o0 * s.out[1] + o1) * s.out[2] + o2;
        for (int64_t t0 = 0; t0 < s.kernel[0]; ++t0) {
          const int64_t i0 = o0 * s.stride[0] - s.pad[0] + t0 * s.dilation[0];
          const bool in0 = i0 >= 0 && i0 < s.in[0];
          for (int64_t t1 = 0; t1 < s.kernel[1]; ++t1) {
            const int64_t i1 = o1 * s.stride[1] - s.pad[1] + t1 * s.dilation[1];
            const bool in1 = in0 && i1 >= 0 && i1 < s.in[1];
            for (int64_t t2 = 0; t2 < s.kernel[2]; ++t2) {
              const int64_t i2 = o2 * s.stride[2] - s.pad[2] + t2 * s.dilation[2];
              const bool inside = in1 && i2 >= 0 && i2 < s.in[2];
              f(inside ? (i0 * s.in[1] + i1) * s.in[2] + i2 : -1, (t0 * s.kernel[1] + t1) * s.kernel[2] + t2,
                outIndex);
            }
          }
        }
      }
}

void runConvolution(void* user) {
  const ConvWork& work = *static_cast<const ConvWork*>(user);
  const ConvShape& s = work.shape;
  const char* entry = work.backwardData ? "cudnnConvolutionBackwardData" : "cudnnConvolutionForward";
  uint8_t* x = translate(work.x, s.xCount(), s.type, entry, work.backwardData ? "dx" : "x");
  if (!x) return;
  uint8_t* w = translate(work.w, s.wCount(), s.type, entry, "w");
  if (!w) return;
  uint8_t* y = translate(work.y, s.yCount(), s.type, entry, work.backwardData ? "dy" : "y");
  if (!y) return;
  const int64_t image = s.in[0] * s.in[1] * s.in[2], outImage = s.out[0] * s.out[1] * s.out[2];
  const int64_t taps = s.kernel[0] * s.kernel[1] * s.kernel[2];
  const int64_t cPerGroup = s.c / s.groups, kPerGroup = s.k / s.groups;
  const std::vector<float> wv = loadAll(w, s.wCount(), s.type, s.tf32);
  // The result accumulates in f32, then alpha and beta apply once.
  std::vector<float> acc;
  uint8_t* result = work.backwardData ? x : y;
  const int64_t resultCount = work.backwardData ? s.xCount() : s.yCount();
  if (!work.backwardData) {
    const std::vector<float> xv = loadAll(x, s.xCount(), s.type, s.tf32);
    acc.assign(static_cast<size_t>(resultCount), 0.0f);
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t k = 0; k < s.k; ++k) {
        const int64_t g = k / kPerGroup;
        float* out = acc.data() + (n * s.k + k) * outImage;
        for (int64_t cg = 0; cg < cPerGroup; ++cg) {
          const float* in = xv.data() + (n * s.c + g * cPerGroup + cg) * image;
          const float* filter = wv.data() + (k * cPerGroup + cg) * taps;
          // A padded tap multiplies a zero by the weight (the IR's conv,
          // docs/ops.md, as PyTorch's zero padding), so a NaN or infinite
          // weight there makes the output NaN.
          forEachTap(s, [&](int64_t i, int64_t t, int64_t o) { out[o] += (i < 0 ? 0.0f : in[i]) * filter[t]; });
        }
      }
  } else {
    const std::vector<float> dy = loadAll(y, s.yCount(), s.type, s.tf32);
    acc.assign(static_cast<size_t>(resultCount), 0.0f);
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t k = 0; k < s.k; ++k) {
        const int64_t g = k / kPerGroup;
        const float* grad = dy.data() + (n * s.k + k) * outImage;
        for (int64_t cg = 0; cg < cPerGroup; ++cg) {
          float* dx = acc.data() + (n * s.c + g * cPerGroup + cg) * image;
          const float* filter = wv.data() + (k * cPerGroup + cg) * taps;
          // The scatter of conv_transpose: a tap that lands in the padding
          // is dropped (PyTorch's semantics, docs/ops.md).
          forEachTap(s, [&](int64_t i, int64_t t, int64_t o) {
            if (i >= 0) dx[i] += grad[o] * filter[t];
          });
        }
      }
  }
  const std::vector<float> old =
      work.beta != 0 ? loadAll(result, resultCount, s.type, false) : std::vector<float>();
  for (int64_t i = 0; i < resultCount; ++i) {
    float v = work.alpha * acc[static_cast<size_t>(i)];
    if (work.beta != 0) v += work.beta * old[static_cast<size_t>(i)];
    store(result, i, s.type, v);
  }
}

/// cudnnAddTensor's work: C = alpha A + beta C, A's unit dims broadcast.
struct AddWork {
  int type = CUDNN_DATA_FLOAT;
  int nbDims = 0;
  int64_t aDims[CUDNN_DIM_MAX] = {}, cDims[CUDNN_DIM_MAX] = {};
  float alpha = 1, beta = 1;
  uint64_t a = 0, c = 0;
};

void runAdd(void* user) {
  const AddWork& work = *static_cast<const AddWork*>(user);
  int64_t aCount = 1, cCount = 1;
  for (int i = 0; i < work.nbDims; ++i) {
    aCount *= work.aDims[i];
    cCount *= work.cDims[i];
  }
  uint8_t* a = translate(work.a, aCount, work.type, "cudnnAddTensor", "A");
  if (!a) return;
  uint8_t* c = translate(work.c, cCount, work.type, "cudnnAddTensor", "C");
  if (!c) return;
  const std::vector<float> av = loadAll(a, aCount, work.type, false);
  const std::vector<float> cv = loadAll(c, cCount, work.type, false);
  for (int64_t i = 0; i < cCount; ++i) {
    // C's multi-index, read back into A's (a unit dim of A is index 0).
    int64_t rest = i, aIndex = 0, aStride = 1;
    for (int d = work.nbDims - 1; d >= 0; --d) {
      const int64_t coordinate = rest % work.cDims[d];
      rest /= work.cDims[d];
      if (work.aDims[d] != 1) aIndex += coordinate * aStride;
      aStride *= work.aDims[d];
    }
    const float old = work.beta != 0 ? cv[static_cast<size_t>(i)] : 0.0f;
    store(c, i, work.type, work.alpha * av[static_cast<size_t>(aIndex)] + work.beta * old);
  }
}

template <typename Work>
void deleteWork(void* user) {
  delete static_cast<Work*>(user);
}

template <typename Work>
cudnnStatus_t enqueue(cudnnHandle_t handle, std::unique_ptr<Work> work, void (*run)(void*)) {
  Work* item = work.release();
  if (kilnEmulatorEnqueue(handle->stream, run, item, deleteWork<Work>) != 0) {
    delete item;  // the context is broken by an earlier fault; nothing was enqueued
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

// --- The entry points -----------------------------------------------------------------

#define KILN_CUDNN_EXPORT extern "C" __attribute__((visibility("default")))

KILN_CUDNN_EXPORT size_t cudnnGetVersion() { return 91900; }

KILN_CUDNN_EXPORT const char* cudnnGetErrorString(cudnnStatus_t status) {
  const char* name = cudnnStatusName(status);
  return name ? name : "CUDNN_STATUS_UNKNOWN";
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!handle || handle->tag != kHandleTag) return CUDNN_STATUS_BAD_PARAM;
  handle->tag = 0;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle || handle->tag != kHandleTag) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *desc = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t desc, cudnnDataType_t dataType,
                                                           int nbDims, const int dimA[], const int strideA[]) {
  if (!desc || desc->tag != kTensorTag || !dimA || !strideA) return CUDNN_STATUS_BAD_PARAM;
  if (nbDims < 3 || nbDims > CUDNN_DIM_MAX) return CUDNN_STATUS_BAD_PARAM;
  if (!isDataType(dataType)) return CUDNN_STATUS_NOT_SUPPORTED;
  int64_t elements = 1;
  for (int i = 0; i < nbDims; ++i) {
    if (dimA[i] < 1 || strideA[i] < 1) return CUDNN_STATUS_BAD_PARAM;
    elements *= dimA[i];
    if (elements > INT32_MAX) return CUDNN_STATUS_NOT_SUPPORTED;
  }
  desc->type = dataType;
  desc->nbDims = nbDims;
  std::copy(dimA, dimA + nbDims, desc->dims);
  std::copy(strideA, strideA + nbDims, desc->strides);
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  if (!desc) return CUDNN_STATUS_SUCCESS;
  if (desc->tag != kTensorTag) return CUDNN_STATUS_BAD_PARAM;
  desc->tag = 0;
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *desc = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t dataType,
                                                           cudnnTensorFormat_t format, int nbDims,
                                                           const int filterDimA[]) {
  if (!desc || desc->tag != kFilterTag || !filterDimA) return CUDNN_STATUS_BAD_PARAM;
  if (nbDims < 3 || nbDims > CUDNN_DIM_MAX) return CUDNN_STATUS_BAD_PARAM;
  if (!isDataType(dataType) || format != CUDNN_TENSOR_NCHW) return CUDNN_STATUS_NOT_SUPPORTED;
  for (int i = 0; i < nbDims; ++i)
    if (filterDimA[i] < 1) return CUDNN_STATUS_BAD_PARAM;
  desc->type = dataType;
  desc->nbDims = nbDims;
  std::copy(filterDimA, filterDimA + nbDims, desc->dims);
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  if (!desc) return CUDNN_STATUS_SUCCESS;
  if (desc->tag != kFilterTag) return CUDNN_STATUS_BAD_PARAM;
  desc->tag = 0;
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *desc = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t desc, int arrayLength,
                                                                const int padA[], const int filterStrideA[],
                                                                const int dilationA[], cudnnConvolutionMode_t mode,
                                                                cudnnDataType_t computeType) {
  if (!desc || desc->tag != kConvolutionTag || !padA || !filterStrideA || !dilationA) return CUDNN_STATUS_BAD_PARAM;
  if (arrayLength < 1 || arrayLength > CUDNN_DIM_MAX - 2) return CUDNN_STATUS_BAD_PARAM;
  if (arrayLength > 3) return CUDNN_STATUS_NOT_SUPPORTED;
  // True convolution (a flipped filter) and half compute are not implemented.
  if (mode != CUDNN_CROSS_CORRELATION || computeType != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
  for (int i = 0; i < arrayLength; ++i)
    if (padA[i] < 0 || filterStrideA[i] < 1 || dilationA[i] < 1) return CUDNN_STATUS_BAD_PARAM;
  desc->spatial = arrayLength;
  std::copy(padA, padA + arrayLength, desc->pads);
  std::copy(filterStrideA, filterStrideA + arrayLength, desc->strides);
  std::copy(dilationA, dilationA + arrayLength, desc->dilations);
  desc->computeType = computeType;
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t desc, int groupCount) {
  if (!desc || desc->tag != kConvolutionTag || groupCount < 1) return CUDNN_STATUS_BAD_PARAM;
  desc->groups = groupCount;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc,
                                                            cudnnMathType_t mathType) {
  if (!desc || desc->tag != kConvolutionTag) return CUDNN_STATUS_BAD_PARAM;
  if (mathType != CUDNN_DEFAULT_MATH && mathType != CUDNN_TENSOR_OP_MATH &&
      mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && mathType != CUDNN_FMA_MATH)
    return CUDNN_STATUS_BAD_PARAM;
  desc->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  if (!desc) return CUDNN_STATUS_SUCCESS;
  if (desc->tag != kConvolutionTag) return CUDNN_STATUS_BAD_PARAM;
  desc->tag = 0;
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

namespace {

/// The one result of a _v7 query: the algorithm, no workspace, the
/// descriptor's math type.
template <typename Perf>
cudnnStatus_t oneAlgorithm(cudnnStatus_t planned, int algo, const cudnnConvolutionStruct* conv,
                           int requestedAlgoCount, int* returnedAlgoCount, Perf* perfResults) {
  if (!returnedAlgoCount || !perfResults || requestedAlgoCount < 1) return CUDNN_STATUS_BAD_PARAM;
  *returnedAlgoCount = 0;
  if (planned != CUDNN_STATUS_SUCCESS) return planned;
  std::memset(static_cast<void*>(perfResults), 0, sizeof(Perf));
  perfResults->algo = algo;
  perfResults->status = CUDNN_STATUS_SUCCESS;
  perfResults->memory = 0;
  perfResults->determinism = CUDNN_DETERMINISTIC;
  perfResults->mathType = conv->math;
  *returnedAlgoCount = 1;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

KILN_CUDNN_EXPORT cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  ConvShape shape;
  return oneAlgorithm(plan(handle, srcDesc, filterDesc, convDesc, destDesc, shape), kForwardAlgo, convDesc,
                      requestedAlgoCount, returnedAlgoCount, perfResults);
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  ConvShape shape;
  return oneAlgorithm(plan(handle, gradDesc, filterDesc, convDesc, diffDesc, shape), kBackwardDataAlgo, convDesc,
                      requestedAlgoCount, returnedAlgoCount, perfResults);
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, cudnnConvolutionFwdAlgo_t algo,
    size_t* sizeInBytes) {
  if (!sizeInBytes) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  ConvShape shape;
  if (cudnnStatus_t s = plan(handle, xDesc, wDesc, convDesc, yDesc, shape); s != CUDNN_STATUS_SUCCESS) return s;
  if (algo != kForwardAlgo) return CUDNN_STATUS_NOT_SUPPORTED;
  *sizeInBytes = 0;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  if (!sizeInBytes) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  ConvShape shape;
  if (cudnnStatus_t s = plan(handle, dxDesc, wDesc, convDesc, dyDesc, shape); s != CUDNN_STATUS_SUCCESS) return s;
  if (algo != kBackwardDataAlgo) return CUDNN_STATUS_NOT_SUPPORTED;
  *sizeInBytes = 0;
  return CUDNN_STATUS_SUCCESS;
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                                        const cudnnTensorDescriptor_t xDesc, const void* x,
                                                        const cudnnFilterDescriptor_t wDesc, const void* w,
                                                        const cudnnConvolutionDescriptor_t convDesc,
                                                        cudnnConvolutionFwdAlgo_t algo, void* workSpace,
                                                        size_t workSpaceSizeInBytes, const void* beta,
                                                        const cudnnTensorDescriptor_t yDesc, void* y) {
  auto work = std::make_unique<ConvWork>();
  if (cudnnStatus_t s = plan(handle, xDesc, wDesc, convDesc, yDesc, work->shape); s != CUDNN_STATUS_SUCCESS) return s;
  if (algo != kForwardAlgo) return CUDNN_STATUS_NOT_SUPPORTED;
  if (!alpha || !beta || !x || !w || !y) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  std::memcpy(&work->alpha, alpha, sizeof(float));  // f32 scaling for every data type Kiln uses
  std::memcpy(&work->beta, beta, sizeof(float));
  work->x = reinterpret_cast<uintptr_t>(x);
  work->w = reinterpret_cast<uintptr_t>(w);
  work->y = reinterpret_cast<uintptr_t>(y);
  return enqueue(handle, std::move(work), runConvolution);
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                                             const cudnnFilterDescriptor_t wDesc, const void* w,
                                                             const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                                             size_t workSpaceSizeInBytes, const void* beta,
                                                             const cudnnTensorDescriptor_t dxDesc, void* dx) {
  auto work = std::make_unique<ConvWork>();
  if (cudnnStatus_t s = plan(handle, dxDesc, wDesc, convDesc, dyDesc, work->shape); s != CUDNN_STATUS_SUCCESS)
    return s;
  if (algo != kBackwardDataAlgo) return CUDNN_STATUS_NOT_SUPPORTED;
  if (!alpha || !beta || !w || !dy || !dx) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  std::memcpy(&work->alpha, alpha, sizeof(float));
  std::memcpy(&work->beta, beta, sizeof(float));
  work->backwardData = true;
  work->x = reinterpret_cast<uintptr_t>(dx);
  work->w = reinterpret_cast<uintptr_t>(w);
  work->y = reinterpret_cast<uintptr_t>(dy);
  return enqueue(handle, std::move(work), runConvolution);
}

KILN_CUDNN_EXPORT cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void* alpha,
                                               const cudnnTensorDescriptor_t aDesc, const void* A, const void* beta,
                                               const cudnnTensorDescriptor_t cDesc, void* C) {
  if (!handle || handle->tag != kHandleTag) return CUDNN_STATUS_BAD_PARAM;
  if (!aDesc || !cDesc || !alpha || !beta || !A || !C) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (aDesc->tag != kTensorTag || cDesc->tag != kTensorTag || !aDesc->set || !cDesc->set)
    return CUDNN_STATUS_BAD_PARAM;
  if (aDesc->type != cDesc->type || aDesc->nbDims != cDesc->nbDims) return CUDNN_STATUS_NOT_SUPPORTED;
  if (!packed(*aDesc) || !packed(*cDesc)) return CUDNN_STATUS_NOT_SUPPORTED;
  auto work = std::make_unique<AddWork>();
  work->type = cDesc->type;
  work->nbDims = cDesc->nbDims;
  for (int i = 0; i < cDesc->nbDims; ++i) {
    if (aDesc->dims[i] != 1 && aDesc->dims[i] != cDesc->dims[i]) return CUDNN_STATUS_BAD_PARAM;
    work->aDims[i] = aDesc->dims[i];
    work->cDims[i] = cDesc->dims[i];
  }
  std::memcpy(&work->alpha, alpha, sizeof(float));
  std::memcpy(&work->beta, beta, sizeof(float));
  work->a = reinterpret_cast<uintptr_t>(A);
  work->c = reinterpret_cast<uintptr_t>(C);
  return enqueue(handle, std::move(work), runAdd);
}

// The definitions have the ABI's types (CudnnAbi.h).
static_assert(std::is_same_v<decltype(cudnnGetVersion), CudnnGetVersionFn>);
static_assert(std::is_same_v<decltype(cudnnGetErrorString), CudnnGetErrorStringFn>);
static_assert(std::is_same_v<decltype(cudnnCreate), CudnnCreateFn>);
static_assert(std::is_same_v<decltype(cudnnDestroy), CudnnDestroyFn>);
static_assert(std::is_same_v<decltype(cudnnSetStream), CudnnSetStreamFn>);
static_assert(std::is_same_v<decltype(cudnnCreateTensorDescriptor), CudnnCreateTensorDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnSetTensorNdDescriptor), CudnnSetTensorNdDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnDestroyTensorDescriptor), CudnnDestroyTensorDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnAddTensor), CudnnAddTensorFn>);
static_assert(std::is_same_v<decltype(cudnnCreateFilterDescriptor), CudnnCreateFilterDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnSetFilterNdDescriptor), CudnnSetFilterNdDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnDestroyFilterDescriptor), CudnnDestroyFilterDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnCreateConvolutionDescriptor), CudnnCreateConvolutionDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnSetConvolutionNdDescriptor), CudnnSetConvolutionNdDescriptorFn>);
static_assert(std::is_same_v<decltype(cudnnSetConvolutionGroupCount), CudnnSetConvolutionGroupCountFn>);
static_assert(std::is_same_v<decltype(cudnnSetConvolutionMathType), CudnnSetConvolutionMathTypeFn>);
static_assert(std::is_same_v<decltype(cudnnDestroyConvolutionDescriptor), CudnnDestroyConvolutionDescriptorFn>);
static_assert(
    std::is_same_v<decltype(cudnnGetConvolutionForwardAlgorithm_v7), CudnnGetConvolutionForwardAlgorithm_v7Fn>);
static_assert(std::is_same_v<decltype(cudnnGetConvolutionForwardWorkspaceSize),
                             CudnnGetConvolutionForwardWorkspaceSizeFn>);
static_assert(std::is_same_v<decltype(cudnnConvolutionForward), CudnnConvolutionForwardFn>);
static_assert(std::is_same_v<decltype(cudnnGetConvolutionBackwardDataAlgorithm_v7),
                             CudnnGetConvolutionBackwardDataAlgorithm_v7Fn>);
static_assert(std::is_same_v<decltype(cudnnGetConvolutionBackwardDataWorkspaceSize),
                             CudnnGetConvolutionBackwardDataWorkspaceSizeFn>);
static_assert(std::is_same_v<decltype(cudnnConvolutionBackwardData), CudnnConvolutionBackwardDataFn>);
