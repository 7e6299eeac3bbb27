// CublasLtMatmul (runtime/cuda/CublasLtMatmul.h) on the emulated GPU: the
// emulator's driver (EmulatedGpu.h) and its own cuBLASLt, found beside it
// by mathLibraryOptions. Each case allocates device memory, copies
// the operands in, runs the planned matmul and copies the result back, all
// on one stream, and compares with a plain host reference computed in
// double from the same (rounded) inputs: 2-D, batched, a batch broadcast
// from either operand, 1-D operands, K = 1 and odd sizes, in f32, f16 and
// bf16, with every epilogue. Also: the plan's rule (what cuBLASLt cannot
// express is an error, and the CUDA target never accepts it: erf GELU), TF32
// as the compute type asks, a matmul captured into a CUDA graph reading its
// inputs when the graph runs, the emulator refusing what it does not
// implement, and an out-of-range buffer failing the stream. A build without
// the emulator skips the tests that need it, saying so.
#include "runtime/cuda/CublasLtMatmul.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>

#include "codegen/cpu/CpuTarget.h"
#include "codegen/cuda/CudaBackend.h"
#include "codegen/cuda/CudaTarget.h"
#include "ir/ConstantValue.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln::cuda {
namespace {

// --- The emulated GPU ----------------------------------------------------------

struct EmulatedGpu {
  const CudaDriverApi* driver = nullptr;
  const CudaExecApi* exec = nullptr;
  const CudaMathLibrary* cublasLt = nullptr;
  CUstream stream = nullptr;
};

/// The emulated GPU's driver, and nothing of the toolkit.
LibrarySearchOptions emulatorOptions() {
  LibrarySearchOptions options = test::emulatorOptions();
  options.searchDefaultToolkit = false;
  return options;
}

/// The driver initialized, the primary context of device 0 current on this
/// thread, a stream, and the emulator's cuBLASLt; once per process.
Expected<EmulatedGpu> openEmulatedGpu() {
  const LibrarySearchOptions options = emulatorOptions();
  auto driver = loadCudaDriver(options);
  if (!driver) return driver.takeError();
  const CudaDriverApi& d = **driver;
  if (emulatorDescription(d).empty()) return Error(options.driverPath + " is not Kiln's emulator");
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) return Error("cuInit: " + d.errorString(r));
  if (CUresult r = d.cuDeviceGet(&device, 0); r != CUDA_SUCCESS) return Error("cuDeviceGet: " + d.errorString(r));
  if (CUresult r = d.cuDevicePrimaryCtxRetain(&context, device); r != CUDA_SUCCESS)
    return Error("cuDevicePrimaryCtxRetain: " + d.errorString(r));
  if (CUresult r = d.cuCtxSetCurrent(context); r != CUDA_SUCCESS) return Error("cuCtxSetCurrent: " + d.errorString(r));
  auto exec = loadCudaExec(options);
  if (!exec) return exec.takeError();
  auto cublasLt = loadCublasLt(mathLibraryOptions(options));
  if (!cublasLt) return cublasLt.takeError();
  EmulatedGpu gpu{*driver, *exec, *cublasLt, nullptr};
  if (CUresult r = gpu.exec->cuStreamCreate(&gpu.stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS)
    return Error("cuStreamCreate: " + d.errorString(r));
  return gpu;
}

const EmulatedGpu* emulatedGpu() {
  static Expected<EmulatedGpu> gpu = openEmulatedGpu();
  EXPECT_TRUE(gpu.ok()) << (gpu.ok() ? "" : gpu.error().str());
  return gpu.ok() ? &*gpu : nullptr;
}

/// Declares `gpu`, the emulated GPU, or skips the rest of the test, saying
/// so, in a build without the emulator (the unit tests depend on it
/// wherever test/devices/emulator is built); an emulator that is there but
/// does not open fails the test.
#define REQUIRE_EMULATED_GPU(gpu)                                                               \
  KILN_REQUIRE_EMULATOR();                                                                      \
  const EmulatedGpu* gpu = emulatedGpu();                                                       \
  ASSERT_NE(gpu, nullptr)

/// Fails the test with the driver's name of `r` unless it is success.
#define EXPECT_CU(gpu, call)                                                          \
  do {                                                                                \
    const CUresult r_ = (call);                                                       \
    EXPECT_EQ(r_, CUDA_SUCCESS) << #call << ": " << (gpu).driver->errorString(r_);    \
  } while (0)

// --- Host data ---------------------------------------------------------------------

/// Elements in `dtype`'s bytes, and the floats they hold exactly.
struct HostTensor {
  std::vector<int64_t> dims;
  std::vector<float> values;
  std::vector<uint8_t> bytes;
};

int64_t product(const std::vector<int64_t>& dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

/// Rounds `v` to `dtype` as the GPU stores it.
float roundTo(DType dtype, float v) {
  if (dtype == DType::F16) return halfToFloat(floatToHalf(v));
  if (dtype == DType::BF16) return bfloat16ToFloat(floatToBFloat16(v));
  return v;
}

HostTensor randomHost(DType dtype, const std::vector<int64_t>& dims, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  HostTensor t;
  t.dims = dims;
  const int64_t n = product(dims);
  t.bytes.resize(static_cast<size_t>(n) * dtypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float v = roundTo(dtype, uniform(rng));
    t.values.push_back(v);
    if (dtype == DType::F32) {
      std::memcpy(&t.bytes[static_cast<size_t>(i) * 4], &v, 4);
    } else {
      const uint16_t h = dtype == DType::F16 ? floatToHalf(v) : floatToBFloat16(v);
      std::memcpy(&t.bytes[static_cast<size_t>(i) * 2], &h, 2);
    }
  }
  return t;
}

std::vector<float> floatsOf(DType dtype, const std::vector<uint8_t>& bytes) {
  std::vector<float> out;
  for (size_t i = 0; i < bytes.size(); i += dtypeSize(dtype)) {
    if (dtype == DType::F32) {
      float f;
      std::memcpy(&f, &bytes[i], 4);
      out.push_back(f);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[i], 2);
      out.push_back(dtype == DType::F16 ? halfToFloat(h) : bfloat16ToFloat(h));
    }
  }
  return out;
}

// --- The matmul as Kiln defines it, in double ------------------------------------

enum class Activation { None, Relu, GeluTanh };

struct Expectation {
  std::vector<double> values;
  /// Per element: sum |a b| over k plus |bias|, the scale of its rounding.
  std::vector<double> scale;
};

/// Kiln's matmul of `a` and `b` (1-D operands, batch dims broadcast by
/// NumPy's rules), plus `bias` along the last dim, then the activation.
/// `tf32` rounds the inputs as CUBLAS_COMPUTE_32F_FAST_TF32 does.
Expectation reference(const HostTensor& a, const HostTensor& b, const std::vector<int64_t>& resultDims,
                      const HostTensor* bias, Activation act, bool tf32 = false) {
  const std::vector<int64_t>& ad = a.dims;
  const std::vector<int64_t>& bd = b.dims;
  const int64_t m = ad.size() == 1 ? 1 : ad[ad.size() - 2], k = ad.back();
  const int64_t n = bd.size() == 1 ? 1 : bd.back();
  const std::vector<int64_t> aBatch(ad.begin(), ad.size() > 2 ? ad.end() - 2 : ad.begin());
  const std::vector<int64_t> bBatch(bd.begin(), bd.size() > 2 ? bd.end() - 2 : bd.begin());
  const size_t matrixDims = (ad.size() >= 2) + (bd.size() >= 2);
  const std::vector<int64_t> batch(resultDims.begin(), resultDims.end() - static_cast<std::ptrdiff_t>(matrixDims));
  auto operandBatch = [&](const std::vector<int64_t>& dims, int64_t flat) {
    // The operand's batch index of result batch `flat`: its dims
    // right-aligned, a dim of 1 broadcast.
    int64_t index = 0, stride = 1, rest = flat;
    std::vector<int64_t> multi(batch.size());
    for (size_t d = batch.size(); d-- > 0;) {
      multi[d] = rest % batch[d];
      rest /= batch[d];
    }
    for (size_t d = dims.size(); d-- > 0;) {
      const int64_t i = dims[d] == 1 ? 0 : multi[batch.size() - dims.size() + d];
      index += i * stride;
      stride *= dims[d];
    }
    return index;
  };
  auto input = [&](float v) -> double {
    if (!tf32) return v;
    uint32_t x;
    std::memcpy(&x, &v, 4);
    x = (x + 0x1000) & ~0x1fffu;  // 10 mantissa bits, ties away from zero
    float r;
    std::memcpy(&r, &x, 4);
    return r;
  };
  Expectation e;
  for (int64_t bt = 0; bt < product(batch); ++bt) {
    const int64_t ai = operandBatch(aBatch, bt), bi = operandBatch(bBatch, bt);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, scale = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = input(a.values[static_cast<size_t>((ai * m + i) * k + p)]);
          const double y = input(b.values[static_cast<size_t>((bi * k + p) * n + j)]);
          sum += x * y;
          scale += std::fabs(x * y);
        }
        if (bias) {
          const double v = bias->values[static_cast<size_t>(j)];
          sum += v;
          scale += std::fabs(v);
        }
        if (act == Activation::Relu) sum = std::max(sum, 0.0);
        if (act == Activation::GeluTanh)
          sum = 0.5 * sum * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (sum + 0.044715 * sum * sum * sum)));
        e.values.push_back(sum);
        e.scale.push_back(scale);
      }
  }
  return e;
}

/// NumPy's matmul shape of `a` and `b` (their batch dims broadcast).
std::vector<int64_t> matmulDims(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> aBatch(a.begin(), a.size() > 2 ? a.end() - 2 : a.begin());
  std::vector<int64_t> bBatch(b.begin(), b.size() > 2 ? b.end() - 2 : b.begin());
  std::vector<int64_t> out(std::max(aBatch.size(), bBatch.size()), 1);
  for (size_t i = 0; i < aBatch.size(); ++i) out[out.size() - aBatch.size() + i] = aBatch[i];
  for (size_t i = 0; i < bBatch.size(); ++i) {
    int64_t& o = out[out.size() - bBatch.size() + i];
    o = std::max(o, bBatch[i]);
  }
  if (a.size() >= 2) out.push_back(a[a.size() - 2]);
  if (b.size() >= 2) out.push_back(b.back());
  return out;
}

/// The LibraryCall of a matmul [+ bias] [+ activation] on buffers a = 0,
/// b = 1, bias = 2 (when present), result last.
LibraryCall matmulCall(const std::vector<int64_t>& a, const std::vector<int64_t>& b, bool bias, Activation act) {
  LibraryCall call;
  call.kind = LibraryCall::Kind::MatMul;
  call.operands = {0, 1};
  call.operandDims = {a, b};
  call.resultDims = matmulDims(a, b);
  if (bias) {
    PostOp p;
    p.kind = PostOp::Kind::Add;
    p.name = "add";
    p.operand = 2;
    p.dims.assign(call.resultDims.size(), 1);
    if (!p.dims.empty()) p.dims.back() = b.size() == 1 ? 1 : b.back();
    call.postOps.push_back(p);
  }
  if (act != Activation::None) {
    PostOp p;
    p.kind = act == Activation::Relu ? PostOp::Kind::Relu : PostOp::Kind::GeluTanh;
    p.name = act == Activation::Relu ? "relu" : "gelu_tanh";
    call.postOps.push_back(p);
  }
  call.resultBuffer = bias ? 3 : 2;
  return call;
}

/// Device copies of `inputs` and a result buffer of `resultBytes`, freed on
/// destruction.
struct DeviceBuffers {
  const EmulatedGpu& gpu;
  std::vector<CUdeviceptr> pointers;
  explicit DeviceBuffers(const EmulatedGpu& g) : gpu(g) {}
  ~DeviceBuffers() {
    gpu.exec->cuStreamSynchronize(gpu.stream);
    for (CUdeviceptr p : pointers) gpu.exec->cuMemFree(p);
  }
  CUdeviceptr add(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_CU(gpu, gpu.exec->cuMemAlloc(&p, bytes));
    pointers.push_back(p);
    return p;
  }
  CUdeviceptr upload(const std::vector<uint8_t>& bytes) {
    CUdeviceptr p = add(bytes.size());
    EXPECT_CU(gpu, gpu.exec->cuMemcpyHtoDAsync(p, bytes.data(), bytes.size(), gpu.stream));
    return p;
  }
};

/// `bytes` of a row-major tensor of `dims` with its last two dims swapped
/// (how a LibraryCall::transposedA or transposedB stores a or b), elements
/// of `size` bytes.
std::vector<uint8_t> swapLastTwoDims(const std::vector<uint8_t>& bytes, const std::vector<int64_t>& dims, size_t size) {
  const int64_t rows = dims[dims.size() - 2], cols = dims.back(), batch = product(dims) / (rows * cols);
  std::vector<uint8_t> out(bytes.size());
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        std::memcpy(&out[static_cast<size_t>((t * cols + j) * rows + i) * size],
                    &bytes[static_cast<size_t>((t * rows + i) * cols + j) * size], size);
  return out;
}

/// Runs `call` on `dtype` with random inputs and checks every element
/// against the reference: within `rtol` of (|want| + its scale).
void checkMatmul(const EmulatedGpu& gpu, const LibraryCall& call, DType dtype, bool allowTf32, double rtol,
                 std::mt19937& rng) {
  const HostTensor a = randomHost(dtype, call.operandDims[0], rng);
  const HostTensor b = randomHost(dtype, call.operandDims[1], rng);
  const bool hasBias = !call.postOps.empty() && call.postOps[0].kind == PostOp::Kind::Add;
  const int64_t n = call.operandDims[1].size() == 1 ? 1 : call.operandDims[1].back();
  const HostTensor bias = randomHost(dtype, {n}, rng);
  Activation act = Activation::None;
  if (!call.postOps.empty() && call.postOps.back().kind == PostOp::Kind::Relu) act = Activation::Relu;
  if (!call.postOps.empty() && call.postOps.back().kind == PostOp::Kind::GeluTanh) act = Activation::GeluTanh;

  auto matmul = CublasLtMatmul::create(*gpu.cublasLt, call, dtype, allowTf32);
  ASSERT_TRUE(matmul.ok()) << matmul.error().str();
  // a and b as the call stores them; the copies are asynchronous, so they outlive them.
  const std::vector<uint8_t> aStored = call.transposedA ? swapLastTwoDims(a.bytes, a.dims, dtypeSize(dtype)) : a.bytes;
  const std::vector<uint8_t> bStored = call.transposedB ? swapLastTwoDims(b.bytes, b.dims, dtypeSize(dtype)) : b.bytes;
  DeviceBuffers buffers(gpu);
  buffers.upload(aStored);
  buffers.upload(bStored);
  if (hasBias) buffers.upload(bias.bytes);
  const size_t resultBytes = static_cast<size_t>(product(call.resultDims)) * dtypeSize(dtype);
  const CUdeviceptr result = buffers.add(resultBytes);
  CUdeviceptr workspace = (*matmul)->workspaceBytes() ? buffers.add((*matmul)->workspaceBytes()) : 0;
  Status run = (*matmul)->run(gpu.stream, buffers.pointers, workspace, (*matmul)->workspaceBytes());
  ASSERT_TRUE(run.ok()) << run.error().str();
  std::vector<uint8_t> out(resultBytes);
  EXPECT_CU(gpu, gpu.exec->cuMemcpyDtoHAsync(out.data(), result, resultBytes, gpu.stream));
  EXPECT_CU(gpu, gpu.exec->cuStreamSynchronize(gpu.stream));

  const Expectation want =
      reference(a, b, call.resultDims, hasBias ? &bias : nullptr, act, allowTf32 && dtype == DType::F32);
  const std::vector<float> got = floatsOf(dtype, out);
  ASSERT_EQ(got.size(), want.values.size());
  int wrong = 0;
  for (size_t i = 0; i < got.size() && wrong < 5; ++i) {
    const double tolerance = rtol * (std::fabs(want.values[i]) + want.scale[i]) + 1e-30;
    if (std::fabs(got[i] - want.values[i]) > tolerance) {
      ++wrong;
      ADD_FAILURE() << (*matmul)->describe() << ": element " << i << " is " << got[i] << ", want "
                    << want.values[i] << " (tolerance " << tolerance << ")";
    }
  }
}

double toleranceOf(DType dtype) { return dtype == DType::F32 ? 1e-5 : dtype == DType::F16 ? 1e-2 : 2e-2; }

// --- Tests --------------------------------------------------------------------------

/// Every shape class, dtype and epilogue matches the host reference.
TEST(CublasLtMatmulTest, ShapesDtypesAndEpiloguesMatchTheReference) {
  REQUIRE_EMULATED_GPU(gpu);
  struct Shape {
    std::vector<int64_t> a, b;
  };
  const std::vector<Shape> shapes = {
      {{8, 64}, {64, 12}},          // 2-D
      {{3, 5, 7}, {3, 7, 4}},       // batched
      {{2, 8, 128}, {1, 128, 32}},  // b broadcast over the batch (the GPT's linears)
      {{5, 6}, {2, 3, 6, 4}},       // a broadcast over two batch dims
      {{9, 1}, {1, 13}},            // K = 1
      {{2, 3, 17, 33}, {33, 19}},   // odd sizes, 4-D
      {{33}, {33, 7}},              // 1-D a
      {{4, 5, 6}, {6}},             // 1-D b: the bias is one value
  };
  std::mt19937 rng(7);
  int cases = 0;
  for (const Shape& s : shapes)
    for (DType dtype : {DType::F32, DType::F16, DType::BF16})
      for (bool bias : {false, true})
        for (Activation act : {Activation::None, Activation::Relu, Activation::GeluTanh}) {
          const LibraryCall call = matmulCall(s.a, s.b, bias, act);
          SCOPED_TRACE(describeCublasLtMatmul(call) + " " + std::string(dtypeName(dtype)));
          checkMatmul(*gpu, call, dtype, false, toleranceOf(dtype), rng);
          ++cases;
        }
  EXPECT_EQ(cases, 144);
}

/// A b stored transposed (a Linear's weight as exporters store it, read in
/// place: LibraryCall::transposedB) is cuBLASLt's A read with CUBLAS_OP_T;
/// an a stored transposed (dy^T of a weight's gradient: transposedA) its B
/// read with CUBLAS_OP_T; and both at once: 2-D, batched and broadcast,
/// with a bias, in each dtype.
TEST(CublasLtMatmulTest, TransposedOperandsMatchTheReference) {
  REQUIRE_EMULATED_GPU(gpu);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{8, 64}, {64, 12}}, {{3, 5, 7}, {3, 7, 4}}, {{2, 8, 128}, {1, 128, 32}}, {{1, 33}, {33, 19}}};
  std::mt19937 rng(13);
  for (const auto& [transposedA, transposedB] : {std::pair{false, true}, {true, false}, {true, true}})
    for (const auto& [a, b] : shapes)
      for (DType dtype : {DType::F32, DType::F16, DType::BF16})
        for (bool bias : {false, true}) {
          LibraryCall call = matmulCall(a, b, bias, Activation::None);
          call.transposedA = transposedA;
          call.transposedB = transposedB;
          auto shape = cublasLtMatmulShape(call);
          ASSERT_TRUE(shape.ok()) << shape.error().str();
          EXPECT_EQ(shape->transposedA, transposedA);
          EXPECT_EQ(shape->transposedB, transposedB);
          SCOPED_TRACE(describeCublasLtMatmul(call) + " " + std::string(dtypeName(dtype)));
          EXPECT_NE(describeCublasLtMatmul(call).find("stored transposed)"), std::string::npos);
          checkMatmul(*gpu, call, dtype, false, toleranceOf(dtype), rng);
        }
  LibraryCall column = matmulCall({4, 6}, {6}, false, Activation::None);
  column.transposedB = true;
  EXPECT_FALSE(cublasLtMatmulShape(column).ok()) << "a 1-D b has no transpose";
  LibraryCall row = matmulCall({6}, {6, 4}, false, Activation::None);
  row.transposedA = true;
  EXPECT_FALSE(cublasLtMatmulShape(row).ok()) << "a 1-D a has no transpose";
}

/// `text`'s function (one matmul and its epilogue) through the CUDA
/// target's select-library: one library group and nothing else but
/// constants, whose call cuBLASLt runs on random inputs (the group's
/// operands as they are stored) to the interpreter's result of the whole
/// function. Returns the call, or none after a test failure.
std::optional<LibraryCall> expectLibraryGroupMatches(const EmulatedGpu& gpu, const std::string& text,
                                                     std::mt19937& rng) {
  SCOPED_TRACE(text);
  auto m = test::parseVerified(text);
  if (!m) return std::nullopt;
  const Function& f = *m->functions().front();
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) inputs.push_back(test::randomTensor(f.argument(i)->type(), rng));
  auto want = interpret(f, inputs);
  EXPECT_TRUE(want.ok()) << want.error().str();
  if (!want) return std::nullopt;

  PassContext ctx;
  ctx.target = &codegen::cudaBackend().target();
  PassManager pm(PassManagerOptions{}, ctx);
  EXPECT_TRUE(pm.addPipeline("select-library").ok());
  std::ostringstream log;
  Status ran = pm.run(*m, log);
  EXPECT_TRUE(ran.ok()) << ran.error().str();
  const Op* group = nullptr;
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Fused) group = op.get();
    else if (op->kind() != OpKind::Constant && op->kind() != OpKind::Return)
      ADD_FAILURE() << "'" << op->name() << "' outside the library group";
  }
  EXPECT_NE(group, nullptr) << "the CUDA target took no library group";
  if (!group) return std::nullopt;
  auto call = codegen::describeLibraryCall(*group);
  EXPECT_TRUE(call.ok()) << call.error().str();
  if (!call) return std::nullopt;

  auto matmul = CublasLtMatmul::create(*gpu.cublasLt, *call, DType::F32, false);
  EXPECT_TRUE(matmul.ok()) << matmul.error().str();
  if (!matmul) return std::nullopt;
  std::vector<std::vector<uint8_t>> staged;  // outlives the copies (the buffers' end synchronizes)
  staged.reserve(group->numOperands());
  DeviceBuffers buffers(gpu);
  for (const Value* v : group->operands()) {
    if (const DenseTensor* constant = constantTensor(v)) {
      staged.push_back(constant->bytes);  // a weight as stored
    } else {
      const Tensor& t = inputs[static_cast<size_t>(v->index())];
      staged.emplace_back(t.raw(), t.raw() + t.numBytes());
    }
    buffers.upload(staged.back());
  }
  Tensor got(DType::F32, call->resultDims);
  const CUdeviceptr result = buffers.add(got.numBytes());
  Status run = (*matmul)->run(gpu.stream, buffers.pointers, 0, 0);
  EXPECT_TRUE(run.ok()) << run.error().str();
  EXPECT_CU(gpu, gpu.exec->cuMemcpyDtoHAsync(got.raw(), result, got.numBytes(), gpu.stream));
  EXPECT_CU(gpu, gpu.exec->cuStreamSynchronize(gpu.stream));
  test::expectClose(got, want->front(), "the library group's result", 1e-5, 1e-5);
  return std::move(*call);
}

/// The CUDA target reads a transposed constant weight in place too: the
/// library group holds the transpose, its operand is the constant, and
/// cuBLASLt computes what the interpreter does.
TEST(CublasLtMatmulTest, TransposedConstantWeightIsReadInPlace) {
  REQUIRE_EMULATED_GPU(gpu);
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> real(-0.5, 0.5);
  std::string w = "dense<f32[24,64]>[";
  for (int i = 0; i < 24 * 64; ++i) w += (i ? ", " : "") + std::to_string(real(rng));
  const std::string text = "func @f(%x: f32[2,8,64], %b: f32[24]) -> f32[2,8,24] {\n"
                           "  %w = constant() {value = " + w + "]} : f32[24,64]\n"
                           "  %wt = transpose(%w) {perm = [1, 0]} : f32[64,24]\n"
                           "  %m = matmul(%x, %wt) : f32[2,8,24]\n  %s = add(%m, %b) : f32[2,8,24]\n"
                           "  return %s\n}\n";
  auto call = expectLibraryGroupMatches(*gpu, text, rng);
  ASSERT_TRUE(call);
  EXPECT_TRUE(call->transposedB);
  EXPECT_FALSE(call->transposedA);
}

/// A transformer block's `x + (y w + b)`: the CUDA target keeps the
/// residual add in the library group, and cuBLASLt adds it through C with
/// beta = 1, the bias through its epilogue, in either order; a GELU after
/// both is its epilogue too.
TEST(CublasLtMatmulTest, ResidualAddIsCublasLtsC) {
  REQUIRE_EMULATED_GPU(gpu);
  std::mt19937 rng(23);
  const char* texts[] = {
      "func @f(%y: f32[2,8,64], %w: f32[64,24], %b: f32[24], %x: f32[2,8,24]) -> f32[2,8,24] {\n"
      "  %m = matmul(%y, %w) : f32[2,8,24]\n  %s = add(%m, %b) : f32[2,8,24]\n"
      "  %r = add(%x, %s) : f32[2,8,24]\n  return %r\n}\n",
      "func @f(%y: f32[16,32], %w: f32[32,8], %b: f32[8], %x: f32[16,8]) -> f32[16,8] {\n"
      "  %m = matmul(%y, %w) : f32[16,8]\n  %r = add(%m, %x) : f32[16,8]\n  %s = add(%r, %b) : f32[16,8]\n"
      "  %g = gelu(%s) {approximate = \"tanh\"} : f32[16,8]\n  return %g\n}\n",
  };
  for (const char* text : texts) {
    auto call = expectLibraryGroupMatches(*gpu, text, rng);
    ASSERT_TRUE(call);
    auto shape = cublasLtMatmulShape(*call);
    ASSERT_TRUE(shape.ok()) << shape.error().str();
    EXPECT_GE(shape->residualBuffer, 0);
    EXPECT_GE(shape->biasBuffer, 0);
    EXPECT_NE(describeCublasLtMatmul(*call).find(" + residual"), std::string::npos) << describeCublasLtMatmul(*call);
  }
}

/// (transposed a, transposed b, batched): every combination.
class CublasLtTransposedOperandsTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

/// A transposed a or b of any value (a training step's weight, dy^T of a
/// weight's gradient, attention's k^T), batched or not, is read in place:
/// cuBLASLt's B (Kiln's a) and A (Kiln's b) with CUBLAS_OP_T, matching the
/// interpreter.
TEST_P(CublasLtTransposedOperandsTest, ReadInPlaceMatchesTheInterpreter) {
  REQUIRE_EMULATED_GPU(gpu);
  const auto [transposedA, transposedB, batched] = GetParam();
  std::mt19937 rng(19);
  auto call = expectLibraryGroupMatches(*gpu, test::transposedMatmulFunction(transposedA, transposedB, batched), rng);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->transposedA, transposedA);
  EXPECT_EQ(call->transposedB, transposedB);
  const std::string text = describeCublasLtMatmul(*call);
  EXPECT_EQ(text.find("a and b stored transposed") != std::string::npos, transposedA && transposedB) << text;
  EXPECT_EQ(text.find("(a stored transposed)") != std::string::npos, transposedA && !transposedB) << text;
  EXPECT_EQ(text.find("(b stored transposed)") != std::string::npos, !transposedA && transposedB) << text;
}

INSTANTIATE_TEST_SUITE_P(CublasLtMatmulTest, CublasLtTransposedOperandsTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()));

/// The plan in row-major terms: strides of 0 for a broadcast operand, the
/// bias buffer, the epilogue; and the descriptions.
TEST(CublasLtMatmulTest, PlanOfACall) {
  auto shape = cublasLtMatmulShape(matmulCall({2, 8, 128}, {1, 128, 32}, true, Activation::Relu));
  ASSERT_TRUE(shape.ok()) << shape.error().str();
  EXPECT_EQ(shape->m, 8);
  EXPECT_EQ(shape->n, 32);
  EXPECT_EQ(shape->k, 128);
  EXPECT_EQ(shape->batch, 2);
  EXPECT_EQ(shape->aBatchStride, 8 * 128);
  EXPECT_EQ(shape->bBatchStride, 0);
  EXPECT_EQ(shape->epilogue, CublasLtMatmulShape::Epilogue::BiasRelu);
  EXPECT_EQ(shape->biasBuffer, 2);
  EXPECT_EQ(shape->resultBuffer, 3);
  EXPECT_EQ(describeCublasLtMatmul(matmulCall({2, 8, 128}, {1, 128, 32}, true, Activation::Relu)),
            "cublasLt matmul [2,8,128]x[1,128,32] + bias, relu");
  EXPECT_EQ(describeCublasLtMatmul(matmulCall({8, 64}, {64, 12}, false, Activation::GeluTanh)),
            "cublasLt matmul [8,64]x[64,12] + gelu_tanh");

  REQUIRE_EMULATED_GPU(gpu);
  auto matmul = CublasLtMatmul::create(*gpu->cublasLt, matmulCall({8, 64}, {64, 12}, true, Activation::None),
                                       DType::BF16, false);
  ASSERT_TRUE(matmul.ok()) << matmul.error().str();
  EXPECT_EQ((*matmul)->describe(), "cublasLt matmul [8,64]x[64,12] + bias (bf16, compute 32F)");
  EXPECT_EQ((*matmul)->workspaceBytes(), 0u);  // the emulator's one algorithm needs none
}

/// What one cublasLtMatmul cannot express is an error from the plan and
/// from create, never a different product.
TEST(CublasLtMatmulTest, CallsCublasLtCannotExpressAreErrors) {
  auto expectRefused = [](const LibraryCall& call, const std::string& why) {
    auto shape = cublasLtMatmulShape(call);
    ASSERT_FALSE(shape.ok()) << describeCublasLtMatmul(call);
    EXPECT_NE(shape.error().message().find(why), std::string::npos) << shape.error().message();
    EXPECT_EQ(describeCublasLtMatmul(call).rfind("a call cuBLASLt refuses: ", 0), 0u);
  };
  LibraryCall erf = matmulCall({8, 64}, {64, 12}, true, Activation::None);
  erf.postOps.push_back(PostOp{PostOp::Kind::GeluErf, 0, 0, -1, {}, "gelu_erf"});
  expectRefused(erf, "GELU in its erf form");
  LibraryCall reluFirst = matmulCall({8, 64}, {64, 12}, false, Activation::Relu);
  reluFirst.postOps.push_back(PostOp{PostOp::Kind::Add, 0, 0, 2, {1, 12}, "add"});
  expectRefused(reluFirst, "'add' is not a cuBLASLt epilogue");
  LibraryCall rowBias = matmulCall({8, 64}, {64, 12}, true, Activation::None);
  rowBias.postOps[0].dims = {8, 1};
  expectRefused(rowBias, "is not a bias along the result's last dim");
  expectRefused(matmulCall({2, 1, 4, 8}, {3, 8, 5}, false, Activation::None), "broadcast over only some");
  expectRefused(matmulCall({4, 0}, {0, 5}, false, Activation::None), "dims from 1 to 2^31-1");
  LibraryCall conv;
  conv.kind = LibraryCall::Kind::Conv;
  expectRefused(conv, "matmuls only");

  REQUIRE_EMULATED_GPU(gpu);
  auto matmul = CublasLtMatmul::create(*gpu->cublasLt, erf, DType::F32, false);
  ASSERT_FALSE(matmul.ok());
  EXPECT_NE(matmul.error().message().find("cuBLASLt cannot compute this library call: GELU in its erf form"),
            std::string::npos)
      << matmul.error().message();
  auto f64 = CublasLtMatmul::create(*gpu->cublasLt, matmulCall({8, 64}, {64, 12}, false, Activation::None),
                                    DType::F64, false);
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.error().message(), "cuBLASLt matmuls take f32, f16 or bf16, not f64");
}

/// The CUDA target takes a matmul with a bias and tanh GELU, but an erf
/// GELU is no cuBLASLt epilogue: offered with it, the target refuses, and
/// takes the matmul and bias alone.
TEST(CublasLtMatmulTest, TargetRefusesErfGelu) {
  auto m = test::parseVerified(
      "func @f(%x: f32[8,64], %w: f32[64,12], %b: f32[12]) -> (f32[8,12], f32[8,12]) {\n"
      "  %m = matmul(%x, %w) : f32[8,12]\n  %s = add(%m, %b) : f32[8,12]\n  %e = gelu(%s) : f32[8,12]\n"
      "  %n = matmul(%x, %w) : f32[8,12]\n  %t = add(%n, %b) : f32[8,12]\n"
      "  %g = gelu(%t) {approximate = \"tanh\"} : f32[8,12]\n  return %e, %g\n}\n");
  ASSERT_NE(m, nullptr);
  const auto& ops = m->functions().front()->ops();
  std::vector<const Op*> op;
  for (const auto& o : ops) op.push_back(o.get());
  const codegen::CudaTarget target;
  const std::vector<const Op*> erfChain = {op[1], op[2]}, tanhChain = {op[4], op[5]};
  EXPECT_FALSE(target.acceptsLibraryCall(*op[0], erfChain));
  EXPECT_TRUE(target.acceptsLibraryCall(*op[0], std::span(erfChain.data(), 1)));
  EXPECT_TRUE(target.acceptsLibraryCall(*op[3], tanhChain));
  // The names `--target` uses find this target.
  EXPECT_EQ(codegen::cudaBackend().target().name(), "cuda");
  EXPECT_TRUE(codegen::cudaBackend().target().acceptsLibraryCall(*op[3], tanhChain));
}

/// What the CUDA target puts in a library group, read back as a call and
/// run by cuBLASLt, is what the interpreter computes for the ops: the
/// target and the runtime agree on the layout (bias along the last dim,
/// the weight broadcast over the batch) and on the types (a mixed-precision
/// call's low-precision a and b).
TEST(CublasLtMatmulTest, LibraryGroupsRunAsTheInterpreterComputes) {
  REQUIRE_EMULATED_GPU(gpu);
  const char* texts[] = {
      "func @f(%x: f32[2,8,64], %w: f32[64,12], %b: f32[12]) -> f32[2,8,12] {\n"
      "  %m = matmul(%x, %w) : f32[2,8,12]\n  %s = add(%b, %m) : f32[2,8,12]\n"
      "  %g = gelu(%s) {approximate = \"tanh\"} : f32[2,8,12]\n  return %g\n}\n",
      "func @f(%x: f32[3,5,16], %w: f32[3,16,9], %b: f32[1,9]) -> f32[3,5,9] {\n"
      "  %m = matmul(%x, %w) : f32[3,5,9]\n  %s = add(%m, %b) : f32[3,5,9]\n"
      "  %r = gelu(%s) {approximate = \"tanh\"} : f32[3,5,9]\n  return %r\n}\n",
      // Mixed precision (autocast's): bf16 or f16 a and b into the f32 result
      // the bias and activation apply to: cuBLASLt's A and B in the low
      // precision, C and D f32.
      "func @f(%x: bf16[2,8,64], %w: bf16[64,12], %b: f32[12]) -> f32[2,8,12] {\n"
      "  %m = matmul(%x, %w) : f32[2,8,12]\n  %s = add(%b, %m) : f32[2,8,12]\n"
      "  %g = gelu(%s) {approximate = \"tanh\"} : f32[2,8,12]\n  return %g\n}\n",
      "func @f(%x: f16[3,5,16], %w: f16[3,16,9], %b: f32[1,9]) -> f32[3,5,9] {\n"
      "  %m = matmul(%x, %w) : f32[3,5,9]\n  %s = add(%m, %b) : f32[3,5,9]\n"
      "  %r = gelu(%s) {approximate = \"tanh\"} : f32[3,5,9]\n  return %r\n}\n",
  };
  std::mt19937 rng(11);
  for (const char* text : texts) {
    SCOPED_TRACE(text);
    auto m = test::parseVerified(text);
    ASSERT_NE(m, nullptr);
    const Function& f = *m->functions().front();
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < f.numArguments(); ++i) inputs.push_back(test::randomTensor(f.argument(i)->type(), rng));
    auto want = interpret(f, inputs);
    ASSERT_TRUE(want.ok()) << want.error().str();

    PassContext ctx;
    ctx.target = &codegen::cudaBackend().target();
    PassManager pm(PassManagerOptions{}, ctx);
    ASSERT_TRUE(pm.addPipeline("select-library").ok());
    std::ostringstream log;
    Status ran = pm.run(*m, log);
    ASSERT_TRUE(ran.ok()) << ran.error().str();
    const Op* group = nullptr;
    for (const auto& op : f.ops())
      if (op->kind() == OpKind::Fused) group = op.get();
    ASSERT_NE(group, nullptr) << "the CUDA target took no library group";
    ASSERT_EQ(group->region()->ops().size(), 4u);  // matmul, add, activation, return
    auto call = codegen::describeLibraryCall(*group);
    ASSERT_TRUE(call.ok()) << call.error().str();

    auto matmul = CublasLtMatmul::create(*gpu->cublasLt, *call, DType::F32, false);
    ASSERT_TRUE(matmul.ok()) << matmul.error().str();
    std::vector<std::vector<uint8_t>> staged;  // outlives the copies (the buffers' end synchronizes)
    staged.reserve(group->numOperands());
    DeviceBuffers buffers(*gpu);
    for (const Value* v : group->operands()) {
      const Tensor& t = inputs[static_cast<size_t>(v->index())];
      staged.emplace_back(t.raw(), t.raw() + t.numBytes());
      buffers.upload(staged.back());
    }
    Tensor got(DType::F32, call->resultDims);
    const CUdeviceptr result = buffers.add(got.numBytes());
    Status run = (*matmul)->run(gpu->stream, buffers.pointers, 0, 0);
    ASSERT_TRUE(run.ok()) << run.error().str();
    EXPECT_CU(*gpu, gpu->exec->cuMemcpyDtoHAsync(got.raw(), result, got.numBytes(), gpu->stream));
    EXPECT_CU(*gpu, gpu->exec->cuStreamSynchronize(gpu->stream));
    test::expectClose(got, want->front(), "the library group's result", 1e-5, 1e-5);
  }
}

/// With allowTf32 an f32 product computes in CUBLAS_COMPUTE_32F_FAST_TF32:
/// the emulator rounds the inputs to TF32, so the result is the TF32
/// reference's and measurably not the f32 one's.
TEST(CublasLtMatmulTest, Tf32IsTheComputeTypeAsked) {
  REQUIRE_EMULATED_GPU(gpu);
  std::mt19937 rng(3);
  const LibraryCall call = matmulCall({16, 96}, {96, 24}, true, Activation::None);
  checkMatmul(*gpu, call, DType::F32, true, 1e-5, rng);
  auto tf32 = CublasLtMatmul::create(*gpu->cublasLt, call, DType::F32, true);
  ASSERT_TRUE(tf32.ok()) << tf32.error().str();
  EXPECT_EQ((*tf32)->describe(), "cublasLt matmul [16,96]x[96,24] + bias (f32, compute 32F_FAST_TF32)");

  // The same inputs through both compute types.
  const HostTensor a = randomHost(DType::F32, {16, 96}, rng), b = randomHost(DType::F32, {96, 24}, rng),
                   bias = randomHost(DType::F32, {24}, rng);
  auto f32 = CublasLtMatmul::create(*gpu->cublasLt, call, DType::F32, false);
  ASSERT_TRUE(f32.ok()) << f32.error().str();
  std::vector<std::vector<float>> results;
  for (const auto* matmul : {f32->get(), tf32->get()}) {
    DeviceBuffers buffers(*gpu);
    buffers.upload(a.bytes);
    buffers.upload(b.bytes);
    buffers.upload(bias.bytes);
    const CUdeviceptr result = buffers.add(16 * 24 * 4);
    ASSERT_TRUE(matmul->run(gpu->stream, buffers.pointers, 0, 0).ok());
    std::vector<uint8_t> out(16 * 24 * 4);
    EXPECT_CU(*gpu, gpu->exec->cuMemcpyDtoHAsync(out.data(), result, out.size(), gpu->stream));
    EXPECT_CU(*gpu, gpu->exec->cuStreamSynchronize(gpu->stream));
    results.push_back(floatsOf(DType::F32, out));
  }
  const Expectation exact = reference(a, b, {16, 24}, &bias, Activation::None);
  double f32Error = 0, tf32Error = 0;
  for (size_t i = 0; i < exact.values.size(); ++i) {
    f32Error = std::max(f32Error, std::fabs(results[0][i] - exact.values[i]) / exact.scale[i]);
    tf32Error = std::max(tf32Error, std::fabs(results[1][i] - exact.values[i]) / exact.scale[i]);
  }
  // Relative to the sum of |products|: f32's rounding stays near 2^-24, TF32
  // keeps 10 mantissa bits (up to 2^-11 per input, partly cancelling over k).
  EXPECT_LT(f32Error, 1e-6);
  EXPECT_GT(tf32Error, 1e-5);
  EXPECT_LT(tf32Error, 1e-3);
}

/// A matmul captured into a CUDA graph is recorded, not run: each launch of
/// the graph reads the inputs as they are then.
TEST(CublasLtMatmulTest, CapturedIntoAGraphRunsAtEachLaunch) {
  REQUIRE_EMULATED_GPU(gpu);
  const LibraryCall call = matmulCall({4, 8}, {8, 3}, false, Activation::Relu);
  auto matmul = CublasLtMatmul::create(*gpu->cublasLt, call, DType::F32, false);
  ASSERT_TRUE(matmul.ok()) << matmul.error().str();
  std::mt19937 rng(5);
  const HostTensor a = randomHost(DType::F32, {4, 8}, rng), b1 = randomHost(DType::F32, {8, 3}, rng),
                   b2 = randomHost(DType::F32, {8, 3}, rng);
  DeviceBuffers buffers(*gpu);
  buffers.upload(a.bytes);
  const CUdeviceptr b = buffers.upload(b1.bytes);
  const CUdeviceptr result = buffers.add(4 * 3 * 4);
  EXPECT_CU(*gpu, gpu->exec->cuStreamSynchronize(gpu->stream));

  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  EXPECT_CU(*gpu, gpu->exec->cuStreamBeginCapture(gpu->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  Status run = (*matmul)->run(gpu->stream, buffers.pointers, 0, 0);
  EXPECT_CU(*gpu, gpu->exec->cuStreamEndCapture(gpu->stream, &graph));
  ASSERT_TRUE(run.ok()) << run.error().str();
  EXPECT_CU(*gpu, gpu->exec->cuGraphInstantiateWithFlags(&exec, graph, 0));
  for (const HostTensor* weights : {&b1, &b2}) {
    EXPECT_CU(*gpu, gpu->exec->cuMemcpyHtoDAsync(b, weights->bytes.data(), weights->bytes.size(), gpu->stream));
    EXPECT_CU(*gpu, gpu->exec->cuGraphLaunch(exec, gpu->stream));
    std::vector<uint8_t> out(4 * 3 * 4);
    EXPECT_CU(*gpu, gpu->exec->cuMemcpyDtoHAsync(out.data(), result, out.size(), gpu->stream));
    EXPECT_CU(*gpu, gpu->exec->cuStreamSynchronize(gpu->stream));
    const std::vector<float> got = floatsOf(DType::F32, out);
    const Expectation want = reference(a, *weights, {4, 3}, nullptr, Activation::Relu);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want.values[i], 1e-5 * (std::fabs(want.values[i]) + want.scale[i])) << "element " << i;
  }
  EXPECT_CU(*gpu, gpu->exec->cuGraphExecDestroy(exec));
  EXPECT_CU(*gpu, gpu->exec->cuGraphDestroy(graph));
}

/// The emulator's cuBLASLt says CUBLAS_STATUS_NOT_SUPPORTED for what it does
/// not implement (an unknown attribute, a tiled order, a compute type or a
/// mix of types it lacks), and its status names are cuBLAS's.
TEST(CublasLtMatmulTest, EmulatorRefusesWhatItDoesNotImplement) {
  using namespace cublaslt;
  REQUIRE_EMULATED_GPU(gpu);
  const CudaLibrary& lib = gpu->cublasLt->library;
  auto fn = [&](const char* name) {
    auto symbol = lib.symbol(name);
    EXPECT_TRUE(symbol.ok()) << name;
    return symbol.ok() ? *symbol : nullptr;
  };
  auto create = reinterpret_cast<CublasLtCreateFn*>(fn("cublasLtCreate"));
  auto destroy = reinterpret_cast<CublasLtDestroyFn*>(fn("cublasLtDestroy"));
  auto descCreate = reinterpret_cast<CublasLtMatmulDescCreateFn*>(fn("cublasLtMatmulDescCreate"));
  auto descDestroy = reinterpret_cast<CublasLtMatmulDescDestroyFn*>(fn("cublasLtMatmulDescDestroy"));
  auto descSet = reinterpret_cast<CublasLtMatmulDescSetAttributeFn*>(fn("cublasLtMatmulDescSetAttribute"));
  auto layoutCreate = reinterpret_cast<CublasLtMatrixLayoutCreateFn*>(fn("cublasLtMatrixLayoutCreate"));
  auto layoutDestroy = reinterpret_cast<CublasLtMatrixLayoutDestroyFn*>(fn("cublasLtMatrixLayoutDestroy"));
  auto layoutSet = reinterpret_cast<CublasLtMatrixLayoutSetAttributeFn*>(fn("cublasLtMatrixLayoutSetAttribute"));
  auto prefCreate = reinterpret_cast<CublasLtMatmulPreferenceCreateFn*>(fn("cublasLtMatmulPreferenceCreate"));
  auto prefDestroy = reinterpret_cast<CublasLtMatmulPreferenceDestroyFn*>(fn("cublasLtMatmulPreferenceDestroy"));
  auto heuristic = reinterpret_cast<CublasLtMatmulAlgoGetHeuristicFn*>(fn("cublasLtMatmulAlgoGetHeuristic"));
  auto statusName = reinterpret_cast<CublasLtGetStatusNameFn*>(fn("cublasLtGetStatusName"));
  auto version = reinterpret_cast<CublasLtGetVersionFn*>(fn("cublasLtGetVersion"));
  ASSERT_TRUE(create && destroy && descCreate && descDestroy && descSet && layoutCreate && layoutDestroy &&
              layoutSet && prefCreate && prefDestroy && heuristic && statusName && version);
  EXPECT_EQ(version() / 10000, 13u);
  EXPECT_EQ(gpu->cublasLt->version, "13.0.0");
  EXPECT_EQ(std::filesystem::path(lib.path).parent_path(), std::filesystem::path(test::emulatorDriverPath()).parent_path())
      << "the emulated GPU uses its own cuBLASLt, not " << lib.path;
  EXPECT_STREQ(statusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(statusName(2), "CUBLAS_STATUS_UNKNOWN");

  cublasLtHandle_t handle = nullptr;
  ASSERT_EQ(create(&handle), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(descCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const int64_t anything = 0;
  EXPECT_EQ(descSet(desc, static_cast<cublasLtMatmulDescAttributes_t>(38), &anything, sizeof(anything)),
            CUBLAS_STATUS_NOT_SUPPORTED);  // CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR
  const uint32_t dgelu = 64 | 128;        // CUBLASLT_EPILOGUE_DGELU
  EXPECT_EQ(descSet(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &dgelu, sizeof(dgelu)), CUBLAS_STATUS_NOT_SUPPORTED);
  const int32_t deviceMode = 1;  // CUBLASLT_POINTER_MODE_DEVICE
  EXPECT_EQ(descSet(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &deviceMode, sizeof(deviceMode)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const int32_t transpose = CUBLAS_OP_T;
  EXPECT_EQ(descSet(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(int16_t)), CUBLAS_STATUS_INVALID_VALUE);

  cublasLtMatrixLayout_t f32 = nullptr, f16 = nullptr;
  ASSERT_EQ(layoutCreate(&f32, CUDA_R_32F, 4, 4, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(layoutCreate(&f16, CUDA_R_16F, 4, 4, 4), CUBLAS_STATUS_SUCCESS);
  const int32_t col32 = 2;  // CUBLASLT_ORDER_COL32
  EXPECT_EQ(layoutSet(f32, CUBLASLT_MATRIX_LAYOUT_ORDER, &col32, sizeof(col32)), CUBLAS_STATUS_NOT_SUPPORTED);
  const uint32_t pointerArray = 1;  // CUBLASLT_BATCH_MODE_POINTER_ARRAY
  EXPECT_EQ(layoutSet(f32, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &pointerArray, sizeof(pointerArray)),
            CUBLAS_STATUS_NOT_SUPPORTED);

  cublasLtMatmulPreference_t preference = nullptr;
  ASSERT_EQ(prefCreate(&preference), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result{};
  int found = -1;
  EXPECT_EQ(heuristic(handle, desc, f32, f32, f32, f32, preference, 1, &result, &found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 1);
  EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  // f16 inputs into an f32 C and D (mixed precision) are implemented; an
  // f16 A with an f32 B, f32 inputs into an f16 D, and a 64-bit compute
  // type are not.
  EXPECT_EQ(heuristic(handle, desc, f16, f16, f32, f32, preference, 1, &result, &found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 1);
  EXPECT_EQ(heuristic(handle, desc, f16, f32, f32, f32, preference, 1, &result, &found), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(heuristic(handle, desc, f32, f32, f16, f16, preference, 1, &result, &found), CUBLAS_STATUS_NOT_SUPPORTED);
  const int32_t compute64 = 70;  // CUBLAS_COMPUTE_64F
  ASSERT_EQ(descSet(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute64, sizeof(compute64)), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(heuristic(handle, desc, f32, f32, f32, f32, preference, 1, &result, &found), CUBLAS_STATUS_NOT_SUPPORTED);
  // TF32 is for f32 data only.
  const int32_t tf32 = CUBLAS_COMPUTE_32F_FAST_TF32;
  ASSERT_EQ(descSet(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &tf32, sizeof(tf32)), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(heuristic(handle, desc, f16, f16, f16, f16, preference, 1, &result, &found), CUBLAS_STATUS_NOT_SUPPORTED);
  // Shapes that do not agree are invalid.
  cublasLtMatrixLayout_t wide = nullptr;
  ASSERT_EQ(layoutCreate(&wide, CUDA_R_32F, 4, 5, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(heuristic(handle, desc, f32, wide, f32, f32, preference, 1, &result, &found),
            CUBLAS_STATUS_INVALID_VALUE);

  EXPECT_EQ(prefDestroy(preference), CUBLAS_STATUS_SUCCESS);
  for (cublasLtMatrixLayout_t l : {f32, f16, wide}) EXPECT_EQ(layoutDestroy(l), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(descDestroy(desc), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(destroy(handle), CUBLAS_STATUS_SUCCESS);
}

/// A buffer too small for its matrix fails the stream with an illegal
/// address when the matmul runs, as on a GPU, and the emulator's fault
/// names the matrix (cuBLASLt's A: Kiln's b). In a child process, since the
/// fault breaks the context for good.
TEST(CublasLtMatmulTest, OutOfRangeBufferFaults) {
  KILN_REQUIRE_EMULATOR();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const EmulatedGpu* gpu = emulatedGpu();
        if (!gpu) std::exit(2);
        const LibraryCall call = matmulCall({8, 16}, {16, 12}, true, Activation::None);
        auto matmul = CublasLtMatmul::create(*gpu->cublasLt, call, DType::F32, false);
        if (!matmul) std::exit(3);
        DeviceBuffers buffers(*gpu);
        buffers.add(8 * 16 * 4);
        buffers.add(16 * 12 * 4 / 2);  // b: half of what it needs
        buffers.add(12 * 4);
        buffers.add(8 * 12 * 4);
        if (!(*matmul)->run(gpu->stream, buffers.pointers, 0, 0).ok()) std::exit(4);
        const CUresult r = gpu->exec->cuStreamSynchronize(gpu->stream);
        auto lastFault =
            reinterpret_cast<const char* (*)()>(dlsym(gpu->driver->library.handle, "kilnEmulatorLastFault"));
        std::fprintf(stderr, "%s; %s\n", gpu->driver->errorString(r).c_str(), lastFault ? lastFault() : "");
        std::exit(r == CUDA_ERROR_ILLEGAL_ADDRESS ? 0 : 5);
      },
      testing::ExitedWithCode(0), "CUDA_ERROR_ILLEGAL_ADDRESS.*cublasLtMatmul: matrix A .*not inside one live allocation");
}

}  // namespace
}  // namespace kiln::cuda
