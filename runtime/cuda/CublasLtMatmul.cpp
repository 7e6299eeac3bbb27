// cublasLtMatmulShape, describeCublasLtMatmul and CublasLtMatmul
// (CublasLtMatmul.h): the plan of a LibraryCall as one column-major
// cuBLASLt matmul, and the descriptors, layouts and algorithm made for it.
#include "runtime/cuda/CublasLtMatmul.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace kiln::cuda {

using namespace cublaslt;

namespace {

std::string dimsText(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

/// cuBLASLt takes sizes and batch counts as int32 ("usually only values
/// that can be expressed as int32_t are supported").
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();

/// The product of `dims`, or kMaxDim + 1 once it passes kMaxDim (no overflow).
int64_t boundedProduct(const std::vector<int64_t>& dims) {
  int64_t p = 1;
  for (int64_t d : dims) {
    if (d <= 0) return 0;
    p = p > kMaxDim / d ? kMaxDim + 1 : p * d;
  }
  return p;
}

/// The batch stride of an operand with batch dims `dims` (right-aligned to
/// the result's `batch` dims) holding matrices of `matrix` elements: the
/// matrix size when it has the whole batch, 0 when one matrix serves all.
Expected<int64_t> batchStride(const std::vector<int64_t>& dims, const std::vector<int64_t>& batch, int64_t matrix,
                              const char* which) {
  if (dims.size() > batch.size()) return Error(std::string("operand ") + which + " has more batch dims than the result");
  std::vector<int64_t> aligned(batch.size() - dims.size(), 1);
  aligned.insert(aligned.end(), dims.begin(), dims.end());
  if (aligned == batch) return boundedProduct(batch) > 1 ? matrix : 0;
  if (std::all_of(aligned.begin(), aligned.end(), [](int64_t d) { return d == 1; })) return 0;
  return Error(std::string("operand ") + which + "'s batch dims " + dimsText(dims) + " broadcast over only some of " +
               dimsText(batch) + "; cuBLASLt's strided batch takes a whole batch or one matrix for all");
}

const char* epilogueText(CublasLtMatmulShape::Epilogue e) {
  switch (e) {
    case CublasLtMatmulShape::Epilogue::None: return "";
    case CublasLtMatmulShape::Epilogue::Relu: return " + relu";
    case CublasLtMatmulShape::Epilogue::GeluTanh: return " + gelu_tanh";
    case CublasLtMatmulShape::Epilogue::Bias: return " + bias";
    case CublasLtMatmulShape::Epilogue::BiasRelu: return " + bias, relu";
    case CublasLtMatmulShape::Epilogue::BiasGeluTanh: return " + bias, gelu_tanh";
  }
  return "";
}

uint32_t epilogueCode(CublasLtMatmulShape::Epilogue e) {
  switch (e) {
    case CublasLtMatmulShape::Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case CublasLtMatmulShape::Epilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
    case CublasLtMatmulShape::Epilogue::GeluTanh: return CUBLASLT_EPILOGUE_GELU;
    case CublasLtMatmulShape::Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case CublasLtMatmulShape::Epilogue::BiasRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case CublasLtMatmulShape::Epilogue::BiasGeluTanh: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

/// The epilogue of `call`'s post-ops: adds first, at most one bias (a vector
/// of n elements along the result's last dim, cuBLASLt's bias epilogue) and
/// one residual (a tensor of the result's dims, added through cuBLASLt's C
/// with beta = 1: a transformer block's `x + proj(y)`), in either order;
/// then an optional ReLU or tanh GELU, which cuBLASLt applies after both.
Status readEpilogue(const LibraryCall& call, const std::vector<int64_t>& resultDims, int64_t n,
                    CublasLtMatmulShape& shape) {
  size_t next = 0;
  bool bias = false;
  for (; next < call.postOps.size() && call.postOps[next].kind == PostOp::Kind::Add; ++next) {
    const PostOp& p = call.postOps[next];
    // With a 1-D b, n is 1 and the result's last dim is m: one value for all.
    std::vector<int64_t> dims = p.dims;
    if (dims.size() > resultDims.size()) return Error("the add's operand has a higher rank than the result");
    dims.insert(dims.begin(), resultDims.size() - dims.size(), 1);
    const bool leadingOnes = dims.empty() || std::all_of(dims.begin(), dims.end() - 1, [](int64_t d) { return d == 1; });
    const int64_t last = dims.empty() ? 1 : dims.back();
    if (p.operand < 0) return Error("the add has no operand buffer");
    if (leadingOnes && last == n && !bias) {
      shape.biasBuffer = p.operand;
      bias = true;
    } else if (dims == resultDims && shape.residualBuffer < 0) {
      shape.residualBuffer = p.operand;
    } else {
      return Error("the add's operand " + dimsText(p.dims) + " is not a bias along the result's last dim (" +
                   std::to_string(n) + " elements) of " + dimsText(resultDims) + ", nor a residual of its dims");
    }
  }
  bool relu = false, gelu = false;
  if (next < call.postOps.size()) {
    const PostOp::Kind k = call.postOps[next].kind;
    if (k == PostOp::Kind::Relu) {
      relu = true;
      ++next;
    } else if (k == PostOp::Kind::GeluTanh) {
      gelu = true;
      ++next;
    }
  }
  if (next < call.postOps.size()) {
    const PostOp& p = call.postOps[next];
    const std::string what = p.kind == PostOp::Kind::GeluErf ? "GELU in its erf form (cuBLASLt's GELU is the tanh form)"
                                                              : "'" + (p.name.empty() ? "a post-op" : p.name) + "'";
    return Error(what + " is not a cuBLASLt epilogue here (it has a bias add and a residual add first, then one ReLU "
                        "or tanh GELU)");
  }
  using E = CublasLtMatmulShape::Epilogue;
  shape.epilogue = bias ? (relu ? E::BiasRelu : gelu ? E::BiasGeluTanh : E::Bias)
                        : (relu ? E::Relu : gelu ? E::GeluTanh : E::None);
  return Status::success();
}

const char* computeTypeText(cublasComputeType_t t) {
  return t == CUBLAS_COMPUTE_32F_FAST_TF32 ? "32F_FAST_TF32" : "32F";
}

/// CUBLAS_STATUS_* names, for a cuBLASLt without cublasLtGetStatusName.
std::string statusName(cublasStatus_t status) {
  if (const char* name = cublasStatusName(status)) return name;
  return "cuBLAS status " + std::to_string(status);
}

/// Resolves `name` from `library` into `fn`.
template <typename Fn>
Status resolve(const CudaLibrary& library, const char* name, Fn*& fn) {
  auto symbol = library.symbol(name);
  if (!symbol) return symbol.takeError();
  fn = reinterpret_cast<Fn*>(*symbol);
  return Status::success();
}

/// The largest workspace an algorithm may ask for (NVIDIA's advice for
/// Hopper); the runtime allocates what workspaceBytes() says, once.
constexpr uint64_t kMaxWorkspaceBytes = 32ull << 20;

}  // namespace

Expected<CublasLtMatmulShape> cublasLtMatmulShape(const LibraryCall& call) {
  if (call.kind != LibraryCall::Kind::MatMul) return Error("cuBLASLt computes matmuls only, not convolutions");
  if (call.operands.size() != 2 || call.operandDims.size() != 2)
    return Error("a matmul library call has two operands, this one " + std::to_string(call.operands.size()));
  const std::vector<int64_t>& a = call.operandDims[0];
  const std::vector<int64_t>& b = call.operandDims[1];
  if (a.empty() || b.empty()) return Error("matmul operands have at least one dim");
  CublasLtMatmulShape shape;
  shape.aBuffer = call.operands[0];
  shape.bBuffer = call.operands[1];
  shape.resultBuffer = call.resultBuffer;
  // A 1-D a is one row, a 1-D b one column; both dims are dropped from the result.
  shape.m = a.size() == 1 ? 1 : a[a.size() - 2];
  shape.k = a.back();
  const int64_t bk = b.size() == 1 ? b[0] : b[b.size() - 2];
  shape.n = b.size() == 1 ? 1 : b.back();
  if (bk != shape.k)
    return Error("the operands " + dimsText(a) + " and " + dimsText(b) + " do not agree on the contracted dim");
  const std::vector<int64_t> aBatch(a.begin(), a.size() > 2 ? a.end() - 2 : a.begin());
  const std::vector<int64_t> bBatch(b.begin(), b.size() > 2 ? b.end() - 2 : b.begin());
  const size_t matrixDims = (a.size() >= 2 ? 1 : 0) + (b.size() >= 2 ? 1 : 0);
  const std::vector<int64_t>& r = call.resultDims;
  if (r.size() < matrixDims) return Error("the result " + dimsText(r) + " is not the matmul's");
  const std::vector<int64_t> batch(r.begin(), r.end() - static_cast<std::ptrdiff_t>(matrixDims));
  std::vector<int64_t> expected = batch;
  if (a.size() >= 2) expected.push_back(shape.m);
  if (b.size() >= 2) expected.push_back(shape.n);
  if (expected != r) return Error("the result " + dimsText(r) + " is not the matmul's " + dimsText(expected));
  for (int64_t d : {shape.m, shape.n, shape.k})
    if (d < 1 || d > kMaxDim)
      return Error("cuBLASLt takes dims from 1 to 2^31-1; " + dimsText(a) + "x" + dimsText(b) + " has " +
                   std::to_string(d));
  shape.batch = boundedProduct(batch);
  if (shape.batch < 1 || shape.batch > kMaxDim)
    return Error("cuBLASLt takes a batch of 1 to 2^31-1 matrices, not " + std::to_string(shape.batch));
  auto aStride = batchStride(aBatch, batch, shape.m * shape.k, "a");
  if (!aStride) return aStride.takeError();
  auto bStride = batchStride(bBatch, batch, shape.k * shape.n, "b");
  if (!bStride) return bStride.takeError();
  shape.aBatchStride = *aStride;
  shape.bBatchStride = *bStride;
  if (call.transposedB && b.size() < 2) return Error("a 1-D b cannot be stored transposed");
  if (call.transposedA && a.size() < 2) return Error("a 1-D a cannot be stored transposed");
  shape.transposedA = call.transposedA;
  shape.transposedB = call.transposedB;
  KILN_TRY(readEpilogue(call, r, shape.n, shape));
  return shape;
}

std::string describeCublasLtMatmul(const LibraryCall& call) {
  auto shape = cublasLtMatmulShape(call);
  if (!shape) return "a call cuBLASLt refuses: " + shape.error().message();
  return "cublasLt matmul " + dimsText(call.operandDims[0]) + "x" + dimsText(call.operandDims[1]) +
         epilogueText(shape->epilogue) + (shape->residualBuffer >= 0 ? " + residual" : "") +
         (shape->transposedA && shape->transposedB ? " (a and b stored transposed)"
          : shape->transposedA                     ? " (a stored transposed)"
          : shape->transposedB                     ? " (b stored transposed)"
                                                   : "");
}

struct CublasLtMatmul::Impl {
  // Entry points, resolved from the library create() was given.
  CublasLtCreateFn* create = nullptr;
  CublasLtDestroyFn* destroy = nullptr;
  CublasLtMatmulDescCreateFn* descCreate = nullptr;
  CublasLtMatmulDescDestroyFn* descDestroy = nullptr;
  CublasLtMatmulDescSetAttributeFn* descSet = nullptr;
  CublasLtMatrixLayoutCreateFn* layoutCreate = nullptr;
  CublasLtMatrixLayoutDestroyFn* layoutDestroy = nullptr;
  CublasLtMatrixLayoutSetAttributeFn* layoutSet = nullptr;
  CublasLtMatmulPreferenceCreateFn* preferenceCreate = nullptr;
  CublasLtMatmulPreferenceDestroyFn* preferenceDestroy = nullptr;
  CublasLtMatmulPreferenceSetAttributeFn* preferenceSet = nullptr;
  CublasLtMatmulAlgoGetHeuristicFn* heuristic = nullptr;
  CublasLtMatmulFn* matmul = nullptr;
  CublasLtGetStatusNameFn* getStatusName = nullptr;  // optional

  CublasLtMatmulShape shape;
  DType dtype = DType::F32;
  /// A and B's type: dtype's, or a mixed-precision call's bf16 or f16
  /// (LibraryCall::srcType) into an f32 dtype.
  DType inputType = DType::F32;
  cublasComputeType_t computeType = CUBLAS_COMPUTE_32F;
  std::string description;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  // cuBLASLt's A is Kiln's b, its B Kiln's a; C and D share the result's layout.
  cublasLtMatrixLayout_t ltA = nullptr, ltB = nullptr, ltD = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspaceBytes = 0;

  ~Impl() {
    if (ltA) layoutDestroy(ltA);
    if (ltB) layoutDestroy(ltB);
    if (ltD) layoutDestroy(ltD);
    if (desc) descDestroy(desc);
    if (handle) destroy(handle);
  }

  std::string statusText(cublasStatus_t status) const {
    const char* name = getStatusName ? getStatusName(status) : nullptr;
    return name ? name : statusName(status);
  }

  /// An error naming the entry point, this call and the status; success
  /// for CUBLAS_STATUS_SUCCESS.
  Status check(cublasStatus_t status, const char* entry) const {
    if (status == CUBLAS_STATUS_SUCCESS) return Status::success();
    return Error(std::string(entry) + " failed for " + description + ": " + statusText(status));
  }

  Status resolveAll(const CudaLibrary& l) {
    KILN_TRY(resolve(l, "cublasLtCreate", create));
    KILN_TRY(resolve(l, "cublasLtDestroy", destroy));
    KILN_TRY(resolve(l, "cublasLtMatmulDescCreate", descCreate));
    KILN_TRY(resolve(l, "cublasLtMatmulDescDestroy", descDestroy));
    KILN_TRY(resolve(l, "cublasLtMatmulDescSetAttribute", descSet));
    KILN_TRY(resolve(l, "cublasLtMatrixLayoutCreate", layoutCreate));
    KILN_TRY(resolve(l, "cublasLtMatrixLayoutDestroy", layoutDestroy));
    KILN_TRY(resolve(l, "cublasLtMatrixLayoutSetAttribute", layoutSet));
    KILN_TRY(resolve(l, "cublasLtMatmulPreferenceCreate", preferenceCreate));
    KILN_TRY(resolve(l, "cublasLtMatmulPreferenceDestroy", preferenceDestroy));
    KILN_TRY(resolve(l, "cublasLtMatmulPreferenceSetAttribute", preferenceSet));
    KILN_TRY(resolve(l, "cublasLtMatmulAlgoGetHeuristic", heuristic));
    KILN_TRY(resolve(l, "cublasLtMatmul", matmul));
    if (auto name = l.symbol("cublasLtGetStatusName")) getStatusName = reinterpret_cast<CublasLtGetStatusNameFn*>(*name);
    return Status::success();
  }

  /// A column-major layout of `batch` matrices `rows` x `cols` (ld = rows),
  /// `stride` elements apart.
  Expected<cublasLtMatrixLayout_t> layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t stride) {
    cublasLtMatrixLayout_t l = nullptr;
    KILN_TRY(check(layoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows),
                   "cublasLtMatrixLayoutCreate"));
    if (shape.batch > 1) {
      const int32_t count = static_cast<int32_t>(shape.batch);
      const int64_t offset = stride;
      Status s = check(layoutSet(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                       "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
      if (s) s = check(layoutSet(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof(offset)),
                       "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
      if (!s) {
        layoutDestroy(l);
        return s.error();
      }
    }
    return l;
  }

  Status setDesc(cublasLtMatmulDescAttributes_t attr, const void* value, size_t bytes, const char* what) {
    return check(descSet(desc, attr, value, bytes), what);
  }

  /// Descriptors, layouts, then the heuristic's first algorithm for buffers
  /// aligned to kMinAlignment.
  Status plan() {
    KILN_TRY(check(create(&handle), "cublasLtCreate"));
    KILN_TRY(check(descCreate(&desc, computeType, CUDA_R_32F), "cublasLtMatmulDescCreate"));
    // Row-major C = a b is column-major C^T = b^T a^T: cuBLASLt's A is
    // Kiln's b, its B Kiln's a. Kiln's b stored [N, K] row-major is
    // cuBLASLt's A column-major K x N, which op(A) = A^T makes the N x K it
    // multiplies; Kiln's a stored [K, M] is its B column-major M x K, which
    // op(B) = B^T makes K x M.
    const int32_t transA = shape.transposedB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t transB = shape.transposedA ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_TRY(setDesc(CUBLASLT_MATMUL_DESC_TRANSA, &transA, sizeof(transA), "cublasLtMatmulDescSetAttribute(TRANSA)"));
    KILN_TRY(setDesc(CUBLASLT_MATMUL_DESC_TRANSB, &transB, sizeof(transB), "cublasLtMatmulDescSetAttribute(TRANSB)"));
    const uint32_t epilogue = epilogueCode(shape.epilogue);
    KILN_TRY(setDesc(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue),
                     "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
    if (shape.biasBuffer >= 0) {
      // The heuristic reads the bias pointer's alignment without
      // dereferencing it: an address aligned to kMinAlignment only.
      const void* placeholder = reinterpret_cast<const void*>(static_cast<uintptr_t>(kMinAlignment));
      KILN_TRY(setDesc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placeholder, sizeof(placeholder),
                       "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
    }
    auto cudaType = [](DType t) {
      return t == DType::F16 ? CUDA_R_16F : t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    };
    const cudaDataType_t type = cudaType(dtype), input = cudaType(inputType);
    auto a = shape.transposedB ? layout(input, shape.k, shape.n, shape.bBatchStride)
                               : layout(input, shape.n, shape.k, shape.bBatchStride);
    if (!a) return a.takeError();
    ltA = *a;
    auto b = shape.transposedA ? layout(input, shape.m, shape.k, shape.aBatchStride)
                               : layout(input, shape.k, shape.m, shape.aBatchStride);
    if (!b) return b.takeError();
    ltB = *b;
    auto d = layout(type, shape.n, shape.m, shape.n * shape.m);
    if (!d) return d.takeError();
    ltD = *d;

    cublasLtMatmulPreference_t preference = nullptr;
    KILN_TRY(check(preferenceCreate(&preference), "cublasLtMatmulPreferenceCreate"));
    const uint64_t maxWorkspace = kMaxWorkspaceBytes;
    const uint32_t alignment = static_cast<uint32_t>(kMinAlignment);
    Status s = check(preferenceSet(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &maxWorkspace,
                                   sizeof(maxWorkspace)),
                     "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (s) s = check(preferenceSet(preference, attr, &alignment, sizeof(alignment)),
                       "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s) s = check(heuristic(handle, desc, ltA, ltB, ltD, ltD, preference, 1, &result, &found),
                     "cublasLtMatmulAlgoGetHeuristic");
    preferenceDestroy(preference);
    KILN_TRY(std::move(s));
    if (found < 1) return Error("cublasLtMatmulAlgoGetHeuristic found no algorithm for " + description);
    KILN_TRY(check(result.state, "cublasLtMatmulAlgoGetHeuristic (its algorithm's state)"));
    algo = result.algo;
    workspaceBytes = result.workspaceSize;
    return Status::success();
  }
};

CublasLtMatmul::CublasLtMatmul(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasLtMatmul::~CublasLtMatmul() = default;

Expected<std::unique_ptr<CublasLtMatmul>> CublasLtMatmul::create(const CudaMathLibrary& cublasLt,
                                                                 const LibraryCall& call, DType dtype,
                                                                 bool allowTf32) {
  auto shape = cublasLtMatmulShape(call);
  if (!shape) return Error("cuBLASLt cannot compute this library call: " + shape.error().message());
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
    return Error("cuBLASLt matmuls take f32, f16 or bf16, not " + std::string(dtypeName(dtype)));
  auto impl = std::make_unique<Impl>();
  impl->shape = *shape;
  impl->dtype = dtype;
  impl->inputType = call.mixedPrecision() ? call.srcType : dtype;
  if (call.mixedPrecision() && dtype != DType::F32)
    return Error("a mixed-precision matmul writes f32, not " + std::string(dtypeName(dtype)));
  const bool tf32 = impl->inputType == DType::F32 && allowTf32;
  impl->computeType = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const std::string types = impl->inputType == dtype ? std::string(dtypeName(dtype))
                                                      : std::string(dtypeName(impl->inputType)) + " into " +
                                                            std::string(dtypeName(dtype));
  impl->description = describeCublasLtMatmul(call) + " (" + types + ", compute " +
                      computeTypeText(impl->computeType) + ")";
  KILN_TRY(impl->resolveAll(cublasLt.library));
  KILN_TRY(impl->plan());
  return std::unique_ptr<CublasLtMatmul>(new CublasLtMatmul(std::move(impl)));
}

size_t CublasLtMatmul::workspaceBytes() const { return impl_->workspaceBytes; }

std::string CublasLtMatmul::describe() const { return impl_->description; }

Status CublasLtMatmul::run(CUstream stream, const std::vector<CUdeviceptr>& buffers, CUdeviceptr workspace,
                           size_t workspaceBytes) const {
  const CublasLtMatmulShape& s = impl_->shape;
  const int needed = std::max({s.aBuffer, s.bBuffer, s.biasBuffer, s.residualBuffer, s.resultBuffer}) + 1;
  if (static_cast<int>(buffers.size()) < needed)
    return Error(impl_->description + " takes " + std::to_string(needed) + " buffers, got " +
                 std::to_string(buffers.size()));
  if (workspaceBytes < impl_->workspaceBytes || (impl_->workspaceBytes > 0 && workspace == 0))
    return Error(impl_->description + " needs a workspace of " + std::to_string(impl_->workspaceBytes) +
                 " bytes, got " + std::to_string(workspace ? workspaceBytes : 0));
  for (int index : {s.aBuffer, s.bBuffer, s.biasBuffer, s.residualBuffer, s.resultBuffer}) {
    if (index < 0) continue;
    if (buffers[static_cast<size_t>(index)] % kMinAlignment != 0)
      return Error(impl_->description + ": buffer " + std::to_string(index) + " is not aligned to " +
                   std::to_string(kMinAlignment) + " bytes");
  }
  // The residual is cuBLASLt's C, added with beta = 1 (C may be D).
  const float alpha = 1.0f, beta = s.residualBuffer >= 0 ? 1.0f : 0.0f;
  auto pointer = [&](int index) {
    return reinterpret_cast<void*>(static_cast<uintptr_t>(buffers[static_cast<size_t>(index)]));
  };
  std::lock_guard<std::mutex> lock(runMutex_);
  if (s.biasBuffer >= 0) {
    const void* bias = pointer(s.biasBuffer);
    KILN_TRY(impl_->setDesc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias),
                            "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
  }
  void* d = pointer(s.resultBuffer);
  const void* c = s.residualBuffer >= 0 ? pointer(s.residualBuffer) : d;
  return impl_->check(impl_->matmul(impl_->handle, impl_->desc, &alpha, pointer(s.bBuffer), impl_->ltA,
                                    pointer(s.aBuffer), impl_->ltB, &beta, c, impl_->ltD, d, impl_->ltD,
                                    &impl_->algo, reinterpret_cast<void*>(static_cast<uintptr_t>(workspace)),
                                    workspaceBytes, stream),
                      "cublasLtMatmul");
}

}  // namespace kiln::cuda
