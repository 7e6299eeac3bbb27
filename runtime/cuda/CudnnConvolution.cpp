// cudnnConvolutionShape, describeCudnnConvolution and CudnnConvolution
// (CudnnConvolution.h): the plan of a LibraryCall as one cuDNN forward or
// backward-data convolution, and the descriptors and algorithm made for it.
#include "runtime/cuda/CudnnConvolution.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "runtime/cuda/CudnnAbi.h"

namespace kiln::cuda {

using namespace cudnn;

namespace {

template <typename T>
std::string dimsText(const std::vector<T>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

/// cuDNN's legacy API takes dims as int and tensors of fewer than 2^31 elements.
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

Expected<std::vector<int>> toInts(const std::vector<int64_t>& dims, const char* what) {
  std::vector<int> ints;
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d < 1 || d > kMaxInt)
      return Error(std::string("cuDNN takes dims from 1 to 2^31-1; the ") + what + " " + dimsText(dims) + " has " +
                   std::to_string(d));
    elements = elements > kMaxInt / d ? kMaxInt + 1 : elements * d;
    ints.push_back(static_cast<int>(d));
  }
  if (elements > kMaxInt)
    return Error(std::string("cuDNN's legacy API takes tensors of fewer than 2^31 elements; the ") + what + " " +
                 dimsText(dims) + " has more");
  return ints;
}

/// The forward convolution's output length along one dim, with the begin
/// pad `pad` on both ends (-1 when the padded input is shorter than the filter).
int64_t forwardLength(int64_t input, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation) {
  const int64_t span = input + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? -1 : span / stride + 1;
}

/// CUDNN_STATUS_* names, for a cuDNN whose cudnnGetErrorString gives none.
std::string statusName(cudnnStatus_t status) {
  if (const char* name = cudnnStatusName(status)) return name;
  return "cuDNN status " + std::to_string(status);
}

template <typename Fn>
Status resolve(const CudaLibrary& library, const char* name, Fn*& fn) {
  auto symbol = library.symbol(name);
  if (!symbol) return symbol.takeError();
  fn = reinterpret_cast<Fn*>(*symbol);
  return Status::success();
}

/// The largest workspace an algorithm may take; the runner allocates the
/// largest any step asks for, once.
constexpr size_t kMaxWorkspaceBytes = 256ull << 20;

const char* mathText(cudnnMathType_t math) {
  switch (math) {
    case CUDNN_FMA_MATH: return "FMA math";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op math";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op math with conversion";
    default: return "default math";
  }
}

}  // namespace

Expected<CudnnConvolutionShape> cudnnConvolutionShape(const LibraryCall& call) {
  if (call.kind == LibraryCall::Kind::MatMul) return Error("cuDNN takes convolutions here, not matmuls");
  const bool transposed = call.kind == LibraryCall::Kind::ConvTranspose;
  if (call.operands.size() < 2 || call.operands.size() > 3 || call.operandDims.size() != call.operands.size())
    return Error("a convolution library call has data, weights and an optional bias, this one " +
                 std::to_string(call.operands.size()) + " operands");
  if (!call.postOps.empty())
    return Error("cuDNN's convolution here has no post-ops ('" + call.postOps.front().name +
                 "' stays for a generated kernel)");
  const std::vector<int64_t>& in = call.operandDims[0];
  const std::vector<int64_t>& w = call.operandDims[1];
  const std::vector<int64_t>& out = call.resultDims;
  const size_t rank = in.size();
  if (rank < 3 || rank > 5 || w.size() != rank || out.size() != rank)
    return Error("cuDNN convolves NCHW tensors with 1 to 3 spatial dims, not " + dimsText(in) + " by " + dimsText(w));
  const size_t spatial = rank - 2;
  if (call.strides.size() != spatial || call.dilations.size() != spatial || call.pads.size() != 2 * spatial)
    return Error("the convolution's strides, pads or dilations do not match its " + std::to_string(spatial) +
                 " spatial dims");
  if (transposed && !call.outputPadding.empty() && call.outputPadding.size() != spatial)
    return Error("the transposed convolution's output_padding does not match its spatial dims");
  const int64_t g = call.groups;
  if (g < 1 || g > kMaxInt) return Error("a convolution has at least one group, not " + std::to_string(g));
  // Channels: forward x [N,C], w [K,C/g], y [N,K]; transposed dy [N,K], w [K,C/g], dx [N,C].
  const int64_t n = in[0], k = w[0], cPerGroup = w[1];
  const int64_t c = transposed ? out[1] : in[1];
  const int64_t kSeen = transposed ? in[1] : out[1];
  if (out[0] != n || kSeen != k || c != cPerGroup * g || k % g != 0)
    return Error("the channels of " + dimsText(in) + ", " + dimsText(w) + " and " + dimsText(out) + " in " +
                 std::to_string(g) + " groups are not a convolution's");
  if (call.operands.size() == 3 && call.operandDims[2] != std::vector<int64_t>{out[1]})
    return Error("the convolution's bias " + dimsText(call.operandDims[2]) + " is not one value per output channel (" +
                 std::to_string(out[1]) + ")");
  const std::vector<int64_t>& xDims = transposed ? out : in;
  const std::vector<int64_t>& yDims = transposed ? in : out;
  CudnnConvolutionShape shape;
  shape.transposed = transposed;
  shape.groups = static_cast<int>(g);
  shape.dataBuffer = call.operands[0];
  shape.weightBuffer = call.operands[1];
  shape.biasBuffer = call.operands.size() == 3 ? call.operands[2] : -1;
  shape.resultBuffer = call.resultBuffer;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t begin = call.pads[i], end = call.pads[spatial + i];
    const int64_t stride = call.strides[i], dilation = call.dilations[i];
    if (begin < 0 || end < 0 || stride < 1 || dilation < 1 || begin > kMaxInt || stride > kMaxInt || dilation > kMaxInt)
      return Error("cuDNN takes pads >= 0 and strides and dilations >= 1 that fit in int32");
    const int64_t length = forwardLength(xDims[2 + i], w[2 + i], begin, stride, dilation);
    if (length != yDims[2 + i])
      return Error("cuDNN pads both ends of a dim alike: with pads " + std::to_string(begin) + " and " +
                   std::to_string(end) + " along spatial dim " + std::to_string(i) + " the " +
                   (transposed ? "transposed " : "") + "convolution is not one cuDNN computes");
    shape.pads.push_back(static_cast<int>(begin));
    shape.strides.push_back(static_cast<int>(stride));
    shape.dilations.push_back(static_cast<int>(dilation));
  }
  auto x = toInts(xDims, transposed ? "result" : "input");
  if (!x) return x.takeError();
  auto wi = toInts(w, "weights");
  if (!wi) return wi.takeError();
  auto y = toInts(yDims, transposed ? "input" : "result");
  if (!y) return y.takeError();
  shape.x = std::move(*x);
  shape.w = std::move(*wi);
  shape.y = std::move(*y);
  if (spatial == 1) {  // a unit trailing dim: cuDNN's convolutions have 2 or 3 spatial dims
    for (std::vector<int>* dims : {&shape.x, &shape.w, &shape.y}) dims->push_back(1);
    shape.pads.push_back(0);
    shape.strides.push_back(1);
    shape.dilations.push_back(1);
  }
  return shape;
}

std::string describeCudnnConvolution(const LibraryCall& call) {
  auto shape = cudnnConvolutionShape(call);
  if (!shape) return "a call cuDNN refuses: " + shape.error().message();
  std::string text = std::string("cudnn ") + (shape->transposed ? "conv_transpose " : "conv ") +
                     dimsText(call.operandDims[0]) + "*" + dimsText(call.operandDims[1]);
  auto unlessAll = [&](const char* name, const std::vector<int>& values, int neutral) {
    if (std::any_of(values.begin(), values.end(), [&](int v) { return v != neutral; }))
      text += std::string(" ") + name + " " + dimsText(values);
  };
  unlessAll("stride", shape->strides, 1);
  unlessAll("pad", shape->pads, 0);
  unlessAll("dilation", shape->dilations, 1);
  if (shape->groups > 1) text += " groups " + std::to_string(shape->groups);
  if (shape->biasBuffer >= 0) text += " + bias";
  return text;
}

struct CudnnConvolution::Impl {
  // Entry points, resolved from the library create() was given.
  CudnnCreateFn* create = nullptr;
  CudnnDestroyFn* destroy = nullptr;
  CudnnSetStreamFn* setStream = nullptr;
  CudnnGetErrorStringFn* errorString = nullptr;
  CudnnCreateTensorDescriptorFn* tensorCreate = nullptr;
  CudnnSetTensorNdDescriptorFn* tensorSet = nullptr;
  CudnnDestroyTensorDescriptorFn* tensorDestroy = nullptr;
  CudnnAddTensorFn* addTensor = nullptr;
  CudnnCreateFilterDescriptorFn* filterCreate = nullptr;
  CudnnSetFilterNdDescriptorFn* filterSet = nullptr;
  CudnnDestroyFilterDescriptorFn* filterDestroy = nullptr;
  CudnnCreateConvolutionDescriptorFn* convCreate = nullptr;
  CudnnSetConvolutionNdDescriptorFn* convSet = nullptr;
  CudnnSetConvolutionGroupCountFn* convSetGroups = nullptr;
  CudnnSetConvolutionMathTypeFn* convSetMath = nullptr;
  CudnnDestroyConvolutionDescriptorFn* convDestroy = nullptr;
  CudnnGetConvolutionForwardAlgorithm_v7Fn* forwardAlgorithms = nullptr;
  CudnnGetConvolutionForwardWorkspaceSizeFn* forwardWorkspace = nullptr;
  CudnnConvolutionForwardFn* forward = nullptr;
  CudnnGetConvolutionBackwardDataAlgorithm_v7Fn* backwardDataAlgorithms = nullptr;
  CudnnGetConvolutionBackwardDataWorkspaceSizeFn* backwardDataWorkspace = nullptr;
  CudnnConvolutionBackwardDataFn* backwardData = nullptr;

  CudnnConvolutionShape shape;
  DType dtype = DType::F32;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  std::string description;
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t xDesc = nullptr, yDesc = nullptr;
  cudnnTensorDescriptor_t biasDesc = nullptr;  // [1,channels,1,1(,1)]
  cudnnFilterDescriptor_t wDesc = nullptr;
  cudnnConvolutionDescriptor_t convDesc = nullptr;
  int algo = 0;
  size_t workspaceBytes = 0;

  ~Impl() {
    if (convDesc) convDestroy(convDesc);
    if (wDesc) filterDestroy(wDesc);
    if (yDesc) tensorDestroy(yDesc);
    if (biasDesc) tensorDestroy(biasDesc);
    if (xDesc) tensorDestroy(xDesc);
    if (handle) destroy(handle);
  }

  /// An error naming the entry point, this call and the status.
  Status check(cudnnStatus_t status, const char* entry) const {
    if (status == CUDNN_STATUS_SUCCESS) return Status::success();
    const char* text = errorString ? errorString(status) : nullptr;
    return Error(std::string(entry) + " failed for " + description + ": " + (text ? text : statusName(status)));
  }

  Status resolveAll(const CudaLibrary& l) {
    KILN_TRY(resolve(l, "cudnnCreate", create));
    KILN_TRY(resolve(l, "cudnnDestroy", destroy));
    KILN_TRY(resolve(l, "cudnnSetStream", setStream));
    KILN_TRY(resolve(l, "cudnnGetErrorString", errorString));
    KILN_TRY(resolve(l, "cudnnCreateTensorDescriptor", tensorCreate));
    KILN_TRY(resolve(l, "cudnnSetTensorNdDescriptor", tensorSet));
    KILN_TRY(resolve(l, "cudnnDestroyTensorDescriptor", tensorDestroy));
    KILN_TRY(resolve(l, "cudnnCreateFilterDescriptor", filterCreate));
    KILN_TRY(resolve(l, "cudnnSetFilterNdDescriptor", filterSet));
    KILN_TRY(resolve(l, "cudnnDestroyFilterDescriptor", filterDestroy));
    KILN_TRY(resolve(l, "cudnnCreateConvolutionDescriptor", convCreate));
    KILN_TRY(resolve(l, "cudnnSetConvolutionNdDescriptor", convSet));
    KILN_TRY(resolve(l, "cudnnSetConvolutionGroupCount", convSetGroups));
    KILN_TRY(resolve(l, "cudnnSetConvolutionMathType", convSetMath));
    KILN_TRY(resolve(l, "cudnnDestroyConvolutionDescriptor", convDestroy));
    if (shape.biasBuffer >= 0) KILN_TRY(resolve(l, "cudnnAddTensor", addTensor));
    if (shape.transposed) {
      KILN_TRY(resolve(l, "cudnnGetConvolutionBackwardDataAlgorithm_v7", backwardDataAlgorithms));
      KILN_TRY(resolve(l, "cudnnGetConvolutionBackwardDataWorkspaceSize", backwardDataWorkspace));
      KILN_TRY(resolve(l, "cudnnConvolutionBackwardData", backwardData));
    } else {
      KILN_TRY(resolve(l, "cudnnGetConvolutionForwardAlgorithm_v7", forwardAlgorithms));
      KILN_TRY(resolve(l, "cudnnGetConvolutionForwardWorkspaceSize", forwardWorkspace));
      KILN_TRY(resolve(l, "cudnnConvolutionForward", forward));
    }
    return Status::success();
  }

  /// A packed NCHW tensor descriptor of `dims`.
  Status tensor(cudnnTensorDescriptor_t& desc, cudnnDataType_t type, const std::vector<int>& dims) {
    KILN_TRY(check(tensorCreate(&desc), "cudnnCreateTensorDescriptor"));
    std::vector<int> strides(dims.size(), 1);
    for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
    return check(tensorSet(desc, type, static_cast<int>(dims.size()), dims.data(), strides.data()),
                 "cudnnSetTensorNdDescriptor");
  }

  /// Whether an algorithm's math keeps what was asked: an f32 convolution
  /// without TF32 takes no tensor-op math.
  bool mathAllowed(cudnnMathType_t m) const {
    return !(dtype == DType::F32 && math == CUDNN_FMA_MATH &&
             (m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  }

  /// Descriptors, then the heuristic's first algorithm that succeeds within
  /// kMaxWorkspaceBytes, and its workspace.
  Status plan() {
    KILN_TRY(check(create(&handle), "cudnnCreate"));
    const cudnnDataType_t type =
        dtype == DType::F16 ? CUDNN_DATA_HALF : dtype == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    KILN_TRY(tensor(xDesc, type, shape.x));
    KILN_TRY(tensor(yDesc, type, shape.y));
    if (shape.biasBuffer >= 0) {
      const std::vector<int>& result = shape.transposed ? shape.x : shape.y;
      std::vector<int> dims(result.size(), 1);
      dims[1] = result[1];
      KILN_TRY(tensor(biasDesc, type, dims));
    }
    KILN_TRY(check(filterCreate(&wDesc), "cudnnCreateFilterDescriptor"));
    KILN_TRY(check(filterSet(wDesc, type, CUDNN_TENSOR_NCHW, static_cast<int>(shape.w.size()), shape.w.data()),
                   "cudnnSetFilterNdDescriptor"));
    KILN_TRY(check(convCreate(&convDesc), "cudnnCreateConvolutionDescriptor"));
    KILN_TRY(check(convSet(convDesc, static_cast<int>(shape.pads.size()), shape.pads.data(), shape.strides.data(),
                           shape.dilations.data(), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   "cudnnSetConvolutionNdDescriptor"));
    KILN_TRY(check(convSetGroups(convDesc, shape.groups), "cudnnSetConvolutionGroupCount"));
    KILN_TRY(check(convSetMath(convDesc, math), "cudnnSetConvolutionMathType"));

    bool found = false;
    cudnnMathType_t chosenMath = math;
    if (shape.transposed) {
      cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT] = {};
      int count = 0;
      KILN_TRY(check(backwardDataAlgorithms(handle, wDesc, yDesc, convDesc, xDesc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                            &count, results),
                     "cudnnGetConvolutionBackwardDataAlgorithm_v7"));
      for (int i = 0; i < count && !found; ++i) {
        const auto& r = results[i];
        if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxWorkspaceBytes || !mathAllowed(r.mathType)) continue;
        size_t bytes = 0;
        if (backwardDataWorkspace(handle, wDesc, yDesc, convDesc, xDesc, r.algo, &bytes) != CUDNN_STATUS_SUCCESS ||
            bytes > kMaxWorkspaceBytes)
          continue;
        algo = r.algo;
        workspaceBytes = bytes;
        chosenMath = r.mathType;
        found = true;
      }
    } else {
      cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT] = {};
      int count = 0;
      KILN_TRY(check(forwardAlgorithms(handle, xDesc, wDesc, convDesc, yDesc, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count,
                                       results),
                     "cudnnGetConvolutionForwardAlgorithm_v7"));
      for (int i = 0; i < count && !found; ++i) {
        const auto& r = results[i];
        if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxWorkspaceBytes || !mathAllowed(r.mathType)) continue;
        size_t bytes = 0;
        if (forwardWorkspace(handle, xDesc, wDesc, convDesc, yDesc, r.algo, &bytes) != CUDNN_STATUS_SUCCESS ||
            bytes > kMaxWorkspaceBytes)
          continue;
        algo = r.algo;
        workspaceBytes = bytes;
        chosenMath = r.mathType;
        found = true;
      }
    }
    if (!found)
      return Error("cuDNN's heuristic found no algorithm for " + description + " within a workspace of " +
                   std::to_string(kMaxWorkspaceBytes >> 20) + " MiB");
    // The legacy API runs an algorithm with the math type its result names.
    if (chosenMath != math) KILN_TRY(check(convSetMath(convDesc, chosenMath), "cudnnSetConvolutionMathType"));
    description += ", algo " + std::to_string(algo) + ")";
    return Status::success();
  }
};

CudnnConvolution::CudnnConvolution(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnConvolution::~CudnnConvolution() = default;

Expected<std::unique_ptr<CudnnConvolution>> CudnnConvolution::create(const CudaMathLibrary& cudnn,
                                                                     const LibraryCall& call, DType dtype,
                                                                     bool allowTf32) {
  auto shape = cudnnConvolutionShape(call);
  if (!shape) return Error("cuDNN cannot compute this library call: " + shape.error().message());
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
    return Error("cuDNN convolutions take f32, f16 or bf16, not " + std::string(dtypeName(dtype)));
  auto impl = std::make_unique<Impl>();
  impl->shape = std::move(*shape);
  impl->dtype = dtype;
  impl->math = dtype != DType::F32 ? CUDNN_TENSOR_OP_MATH : allowTf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  // Completed by plan() with the algorithm.
  impl->description = describeCudnnConvolution(call) + " (" + std::string(dtypeName(dtype)) + ", " +
                      mathText(impl->math);
  KILN_TRY(impl->resolveAll(cudnn.library));
  if (Status planned = impl->plan(); !planned) return planned.error();
  return std::unique_ptr<CudnnConvolution>(new CudnnConvolution(std::move(impl)));
}

size_t CudnnConvolution::workspaceBytes() const { return impl_->workspaceBytes; }

std::string CudnnConvolution::describe() const { return impl_->description; }

Status CudnnConvolution::run(CUstream stream, const std::vector<CUdeviceptr>& buffers, CUdeviceptr workspace,
                             size_t workspaceBytes) const {
  const Impl& m = *impl_;
  const CudnnConvolutionShape& s = m.shape;
  const int needed = std::max({s.dataBuffer, s.weightBuffer, s.biasBuffer, s.resultBuffer}) + 1;
  if (static_cast<int>(buffers.size()) < needed)
    return Error(m.description + " takes " + std::to_string(needed) + " buffers, got " +
                 std::to_string(buffers.size()));
  if (workspaceBytes < m.workspaceBytes || (m.workspaceBytes > 0 && workspace == 0))
    return Error(m.description + " needs a workspace of " + std::to_string(m.workspaceBytes) + " bytes, got " +
                 std::to_string(workspace ? workspaceBytes : 0));
  auto pointer = [&](int index) {
    return reinterpret_cast<void*>(static_cast<uintptr_t>(buffers[static_cast<size_t>(index)]));
  };
  void* work = m.workspaceBytes ? reinterpret_cast<void*>(static_cast<uintptr_t>(workspace)) : nullptr;
  const size_t workBytes = m.workspaceBytes ? workspaceBytes : 0;
  const float alpha = 1.0f, beta = 0.0f;  // f32 scaling for f32, f16 and bf16 data alike
  std::lock_guard<std::mutex> lock(runMutex_);
  KILN_TRY(m.check(m.setStream(m.handle, stream), "cudnnSetStream"));
  if (s.transposed)
    KILN_TRY(m.check(m.backwardData(m.handle, &alpha, m.wDesc, pointer(s.weightBuffer), m.yDesc,
                                    pointer(s.dataBuffer), m.convDesc, m.algo, work, workBytes, &beta, m.xDesc,
                                    pointer(s.resultBuffer)),
                     "cudnnConvolutionBackwardData"));
  else
    KILN_TRY(m.check(m.forward(m.handle, &alpha, m.xDesc, pointer(s.dataBuffer), m.wDesc, pointer(s.weightBuffer),
                               m.convDesc, m.algo, work, workBytes, &beta, m.yDesc, pointer(s.resultBuffer)),
                     "cudnnConvolutionForward"));
  if (s.biasBuffer < 0) return Status::success();
  const float one = 1.0f;  // result += bias, broadcast over the batch and the spatial dims
  return m.check(m.addTensor(m.handle, &one, m.biasDesc, pointer(s.biasBuffer), &one,
                             s.transposed ? m.xDesc : m.yDesc, pointer(s.resultBuffer)),
                 "cudnnAddTensor");
}

}  // namespace kiln::cuda
