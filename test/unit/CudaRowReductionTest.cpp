// CUDA row schedules (codegen/Schedule.h: a warp or a block per row, whose
// threads reduce strided slices and combine them with __shfl_xor_sync and
// shared memory) run on Kiln's emulated GPU (test/devices/emulator: warps
// in lockstep, shuffles, barriers, strict bounds checks). CudaEmitterTest's
// host build runs one thread after another, so nothing there can exchange
// values between threads; here the PTX NVRTC makes runs for real. Each case
// is lowered for CUDA at -O3 (the kernels `kiln run --device cuda` runs),
// checked to take the row schedule meant for it, and run kernel by kernel
// on three grids (one block, three blocks, a block per 256 work items: any
// grid is correct) against the interpreter: max, min, argmax, argmin and
// integer sums bit for bit (NaN rows, -0 and +0 in either order, ties),
// float sums and composites within the end-to-end tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaBackend.h"
#include "codegen/cuda/CudaEmitter.h"
#include "codegen/cuda/NvrtcCompiler.h"
#include "ir/IR.h"
#include "runtime/Interpreter.h"
#include "runtime/cuda/CudaLibraries.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"


namespace kiln {
namespace {

using cuda::CUDA_SUCCESS;
using cuda::CUdeviceptr;
using cuda::CUfunction;
using cuda::CUmodule;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct RowCase {
  std::string text;
  /// The threads per row the case's reduction kernels take (32 or 256).
  int threadsPerRow;
  /// Bit for bit (the sign of zero included; any NaN matches NaN).
  bool exact;
  std::vector<Tensor> inputs = {};  // random when empty
};

std::string reduceText(const std::string& op, const std::string& from, const std::string& to,
                       const std::string& attributes) {
  return "func @f(%x: " + from + ") -> " + to + " {\n  %y = " + op + "(%x) {" + attributes + "} : " + to +
         "\n  return %y\n}\n";
}

/// f32[rows, n] of numbers of sign -`sign` (below zero for a max, above for
/// a min) but that each (row, a, b) of `zeros` puts -0 at a and +0 at b of
/// its row, and each (row, a) of `nans` NaN at a: the cases where the order
/// in which a max or min is combined shows (of equal elements the
/// sequential loop keeps the first; NaN wins).
Tensor signedZeroRows(int64_t rows, int64_t n, std::mt19937& rng, double sign,
                      const std::vector<std::tuple<int64_t, int64_t, int64_t>>& zeros,
                      const std::vector<std::pair<int64_t, int64_t>>& nans) {
  std::uniform_real_distribution<double> magnitude(0.25, 4.0);
  Tensor t(DType::F32, {rows, n});
  for (int64_t i = 0; i < rows * n; ++i) t.setDouble(i, -sign * magnitude(rng));
  for (const auto& [row, first, second] : zeros) {
    t.setDouble(row * n + first, -0.0);
    t.setDouble(row * n + second, 0.0);
  }
  for (const auto& [row, at] : nans) t.setDouble(row * n + at, kNan);
  return t;
}

std::vector<RowCase> rowCases() {
  std::mt19937 rng(2024);
  std::vector<RowCase> all;
  // Max over rows of 40 (a warp each): -0 before +0, +0 before -0, the
  // later zero in a lower lane (33 is lane 1, 2 is lane 2), NaN first, last
  // and in the middle, and a row of -inf.
  Tensor maxRows = signedZeroRows(8, 40, rng, 1.0, {{1, 3, 20}, {2, 38, 7}, {3, 33, 2}}, {{4, 0}, {5, 39}, {6, 17}});
  for (int64_t k = 0; k < 40; ++k) maxRows.setDouble(7 * 40 + k, -kInf);
  all.push_back({reduceText("reduce_max", "f32[8,40]", "f32[8]", "axes = [1]"), 32, true, {maxRows}});
  Tensor minRows = signedZeroRows(8, 40, rng, -1.0, {{0, 5, 6}, {2, 31, 0}, {3, 33, 2}}, {{4, 35}, {6, 1}});
  all.push_back({reduceText("reduce_min", "f32[8,40]", "f32[8]", "axes = [1]"), 32, true, {minRows}});
  // Rows of 1500: a block each, zeros in different warps (700 is thread
  // 188, in warp 5; 1300 thread 20, in warp 0), NaN.
  Tensor longRows = signedZeroRows(4, 1500, rng, 1.0, {{0, 700, 1300}, {1, 1300, 700}}, {{2, 1000}});
  all.push_back({reduceText("reduce_max", "f32[4,1500]", "f32[4]", "axes = [1]"), 256, true, {longRows}});
  // argmax/argmin: ties between lanes (10 is lane 10, 40 lane 8), -0 and +0
  // as equals, two NaNs; first or last by select_last_index.
  Tensor argRows = signedZeroRows(5, 50, rng, 1.0, {{2, 17, 33}}, {{3, 12}, {3, 45}});
  argRows.setDouble(0 * 50 + 10, 3.0);
  argRows.setDouble(0 * 50 + 40, 3.0);
  argRows.setDouble(1 * 50 + 49, 3.0);
  for (const char* op : {"argmax", "argmin"})
    for (const char* last : {"false", "true"})
      all.push_back({reduceText(op, "f32[5,50]", "i64[5]", std::string("axis = 1, select_last_index = ") + last),
                     32,
                     true,
                     {argRows}});
  // Integers: sums that wrap (exact in any order), i8 through the int
  // shuffle, i64 through the 64-bit one, argmin among many equal ones.
  Tensor big(DType::I32, {6, 77});
  std::uniform_int_distribution<int64_t> wide(-(int64_t{1} << 30), int64_t{1} << 30);
  for (int64_t i = 0; i < big.numElements(); ++i) big.setInt(i, wide(rng));
  all.push_back({reduceText("reduce_sum", "i32[6,77]", "i32[6]", "axes = [1]"), 32, true, {big}});
  all.push_back({reduceText("reduce_sum", "i8[3,40]", "i8[3]", "axes = [1]"), 32, true});
  all.push_back({reduceText("reduce_max", "i64[4,33]", "i64[4]", "axes = [1]"), 32, true});
  all.push_back({reduceText("argmin", "i32[4,64]", "i64[4]", "axis = 1"), 32, true});
  // Float sums: rows, a block-long row, one row for the whole tensor (a
  // scalar result), f64.
  all.push_back({reduceText("reduce_sum", "f32[5,100]", "f32[5]", "axes = [1]"), 32, false});
  all.push_back({reduceText("reduce_sum", "f32[2,5000]", "f32[2]", "axes = [1]"), 256, false});
  all.push_back({reduceText("reduce_sum", "f32[40,30]", "f32[]", "axes = []"), 256, false});
  all.push_back({reduceText("reduce_max", "f32[50]", "f32[]", "axes = []"), 32, true});
  all.push_back({reduceText("reduce_mean", "f64[5,48]", "f64[5]", "axes = [1]"), 32, false});
  // Composites: softmax writes its row strided over the warp (or block)
  // after the row's max and sum; a NaN row stays NaN.
  Tensor soft(DType::F32, {6, 100});
  std::uniform_real_distribution<double> real(-3.0, 3.0);
  for (int64_t i = 0; i < soft.numElements(); ++i) soft.setDouble(i, real(rng));
  soft.setDouble(2 * 100 + 70, kNan);
  all.push_back({reduceText("softmax", "f32[6,100]", "f32[6,100]", "axis = -1"), 32, false, {soft}});
  // Rows of 16 fuse into one kernel (passes/Fuse.cpp), whose every element
  // would recompute the row's max and sum: the warp computes them once and
  // writes the row strided (the Lanes loop). Rows with NaN and with -inf.
  Tensor fused(DType::F32, {9, 16});
  for (int64_t i = 0; i < fused.numElements(); ++i) fused.setDouble(i, real(rng));
  fused.setDouble(1 * 16 + 9, kNan);
  for (int64_t k = 0; k < 16; k += 3) fused.setDouble(4 * 16 + k, -kInf);
  all.push_back({reduceText("softmax", "f32[9,16]", "f32[9,16]", "axis = -1"), 32, false, {fused}});
  all.push_back({reduceText("softmax", "f32[3,2000]", "f32[3,2000]", "axis = -1"), 256, false});
  all.push_back({reduceText("log_softmax", "f32[4,300]", "f32[4,300]", "axis = -1"), 32, false});
  all.push_back(
      {"func @f(%x: f32[5,64], %g: f32[64], %b: f32[64]) -> f32[5,64] {\n"
       "  %y = layer_norm(%x, %g, %b) {axis = -1} : f32[5,64]\n  return %y\n}\n",
       32, false});
  return all;
}

/// Whether `got` is `want` bit for bit, but that any NaN matches NaN.
void expectSameBits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    if (!isFloat(want.dtype())) {
      EXPECT_EQ(got.getInt(i), want.getInt(i)) << what << " element " << i;
      continue;
    }
    const double g = got.getDouble(i), w = want.getDouble(i);
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << what << " element " << i << ": " << g << ", not NaN";
    } else {
      EXPECT_TRUE(g == w && std::signbit(g) == std::signbit(w)) << what << " element " << i << ": " << g << " vs " << w;
    }
  }
}

class CudaRowReductionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_EMULATOR();
    const cuda::LibrarySearchOptions options = test::emulatorOptions();
    auto driver = cuda::loadCudaDriver(options);
    ASSERT_TRUE(driver) << driver.error().message();
    auto exec = cuda::loadCudaExec(options);
    ASSERT_TRUE(exec) << exec.error().message();
    d_ = *driver;
    x_ = *exec;
    if (auto fault = d_->library.symbol("kilnEmulatorLastFault"))
      lastFault_ = reinterpret_cast<const char* (*)()>(*fault);
    ASSERT_EQ(d_->cuInit(0), CUDA_SUCCESS);
    cuda::CUcontext context = nullptr;
    ASSERT_EQ(d_->cuDevicePrimaryCtxRetain(&context, 0), CUDA_SUCCESS);
    ASSERT_EQ(d_->cuCtxSetCurrent(context), CUDA_SUCCESS);
    retained_ = true;
  }
  void TearDown() override {
    for (CUdeviceptr p : buffers_) x_->cuMemFree(p);
    if (module_) x_->cuModuleUnload(module_);
    if (retained_) d_->cuDevicePrimaryCtxRelease(0);
  }

  std::string fault() const { return lastFault_ ? std::string(" (") + lastFault_() + ")" : ""; }

  CUdeviceptr upload(const Tensor& t) {
    CUdeviceptr p = 0;
    EXPECT_EQ(x_->cuMemAlloc(&p, std::max<size_t>(t.numBytes(), 1)), CUDA_SUCCESS);
    buffers_.push_back(p);
    EXPECT_EQ(x_->cuMemcpyHtoDAsync(p, t.raw(), t.numBytes(), nullptr), CUDA_SUCCESS);
    EXPECT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS) << fault();
    return p;
  }

  /// Runs `optimized` (lowerToKernels' function) from `module_`: each op in
  /// order, a constant uploaded, any other op the next of `kernels`
  /// (launched as `launches` says, on at most `maxGrid` blocks) on the
  /// device buffers of its operands and a fresh one for its result. Returns
  /// the function's first result.
  Tensor run(const Function& optimized, const std::vector<Tensor>& inputs, const std::vector<kir::Kernel>& kernels,
             const std::vector<codegen::CudaLaunch>& launches, int64_t maxGrid) {
    std::map<const Value*, CUdeviceptr> values;
    for (size_t i = 0; i < optimized.numArguments(); ++i) values[optimized.argument(i)] = upload(inputs[i]);
    size_t next = 0;
    for (const auto& op : optimized.ops()) {
      if (op->kind() == OpKind::Constant) {
        values[op->result()] = upload(Tensor::fromDense(op->getTensor("value")));
        continue;
      }
      if (op->kind() == OpKind::Return) {
        const Value* result = op->operand(0);
        Tensor out(result->type().dtype, staticDims(result->type().shape));
        EXPECT_EQ(x_->cuMemcpyDtoHAsync(out.raw(), values.at(result), out.numBytes(), nullptr), CUDA_SUCCESS);
        EXPECT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS) << fault();
        EXPECT_EQ(next, kernels.size());
        return out;
      }
      EXPECT_NE(op->kind(), OpKind::Check) << "a host check; these cases have none";
      EXPECT_LT(next, kernels.size());
      if (next >= kernels.size()) return {};
      const codegen::CudaLaunch& launch = launches[next++];
      std::vector<CUdeviceptr> args;
      for (const Value* v : op->operands()) args.push_back(values.at(v));
      const TensorType& type = op->result()->type();
      args.push_back(values[op->result()] = upload(Tensor(type.dtype, staticDims(type.shape))));
      args.push_back(0);  // sizes, unused
      std::vector<void*> params;
      for (CUdeviceptr& a : args) params.push_back(&a);
      CUfunction f = nullptr;
      EXPECT_EQ(x_->cuModuleGetFunction(&f, module_, launch.name.c_str()), CUDA_SUCCESS) << launch.name;
      const int64_t blocks = std::min<int64_t>((launch.workItems + launch.blockSize - 1) / launch.blockSize, maxGrid);
      EXPECT_EQ(x_->cuLaunchKernel(f, static_cast<unsigned>(blocks), 1, 1, static_cast<unsigned>(launch.blockSize), 1,
                                   1, 0, nullptr, params.data(), nullptr),
                CUDA_SUCCESS)
          << launch.name;
      EXPECT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS) << launch.name << fault();
    }
    ADD_FAILURE() << "no return";
    return {};
  }

  const cuda::CudaDriverApi* d_ = nullptr;
  const cuda::CudaExecApi* x_ = nullptr;
  const char* (*lastFault_)() = nullptr;
  bool retained_ = false;
  CUmodule module_ = nullptr;
  std::vector<CUdeviceptr> buffers_;
};

TEST_F(CudaRowReductionTest, RowSchedulesOnTheEmulatedGpuMatchTheInterpreter) {
  auto nvrtc = cuda::loadNvrtc();
  ASSERT_TRUE(nvrtc.ok()) << "NVRTC is required (CI machines have the CUDA toolkit): " << nvrtc.error().str();
  std::mt19937 rng(7);
  for (RowCase& c : rowCases()) {
    SCOPED_TRACE(c.text);
    auto m = test::parseVerified(c.text, "rows.kir");
    ASSERT_NE(m, nullptr);
    const Function& f = *m->functions().front();
    std::vector<TensorType> types;
    for (size_t i = 0; i < f.numArguments(); ++i) {
      if (c.inputs.size() <= i) c.inputs.push_back(test::randomTensor(f.argument(i)->type(), rng));
      types.push_back(f.argument(i)->type());
    }
    auto want = interpret(f, c.inputs);
    ASSERT_TRUE(want.ok()) << want.error().str();
    std::unique_ptr<Module> optimized;
    auto kernels = codegen::lowerToKernels(f, types, codegen::cudaBackend(), 3, &optimized);
    ASSERT_TRUE(kernels.ok()) << kernels.error().str();
    bool rowScheduled = false;
    std::string printed;
    for (const kir::Kernel& k : *kernels) {
      rowScheduled = rowScheduled || k.schedule.threadsPerRow == c.threadsPerRow;
      printed += kir::printKernel(k);
    }
    ASSERT_TRUE(rowScheduled) << "no kernel takes " << c.threadsPerRow << " threads per row:\n" << printed;
    auto source = codegen::emitCudaSource(*kernels);
    ASSERT_TRUE(source.ok()) << source.error().str();
    EXPECT_NE(source->code.find("__shfl_xor_sync(0xffffffffu, "), std::string::npos);
    EXPECT_EQ(source->code.find("__syncthreads()") != std::string::npos, c.threadsPerRow > 32);
    auto binary = codegen::compileCudaSource(**nvrtc, source->code, "rows.cu", 75, /*ptxOnly=*/true);
    ASSERT_TRUE(binary.ok()) << binary.error().str();
    if (module_) x_->cuModuleUnload(module_);
    module_ = nullptr;
    ASSERT_EQ(x_->cuModuleLoadData(&module_, binary->ptx.c_str()), CUDA_SUCCESS) << fault();

    for (const int64_t maxGrid : {int64_t{1}, int64_t{3}, std::numeric_limits<int64_t>::max()}) {
      SCOPED_TRACE("at most " + std::to_string(maxGrid) + " blocks");
      const Tensor got = run(*optimized->functions().front(), c.inputs, *kernels, source->launches, maxGrid);
      if (c.exact)
        expectSameBits(got, want->front(), "the emulated GPU's result");
      else
        test::expectClose(got, want->front(), "the emulated GPU's result");
    }
    for (CUdeviceptr p : buffers_) x_->cuMemFree(p);
    buffers_.clear();
  }
}


/// Long float sums (docs/codegen.md, "Long sums") on the emulated GPU: a
/// block-wide row whose threads each sum blocks of their iterations and
/// combine them pairwise, and columns (a thread per result element, summing
/// blocks in order and combining them pairwise), within 2e-7 relative of
/// the float64 sums of the same f32 data. One f32 accumulator per thread
/// drifted to about 5e-7 at these lengths.
TEST_F(CudaRowReductionTest, LongSumsAreWithin2e7OfTheFloat64Sums) {
  auto nvrtc = cuda::loadNvrtc();
  ASSERT_TRUE(nvrtc.ok()) << "NVRTC is required (CI machines have the CUDA toolkit): " << nvrtc.error().str();
  struct LongCase {
    std::vector<int64_t> shape;
    int64_t axis;  // -1: every axis
  };
  for (const LongCase& c : {LongCase{{int64_t{1} << 22}, -1}, LongCase{{2, int64_t{1} << 21}, 1},
                            LongCase{{int64_t{1} << 19, 4}, 0}}) {
    const int64_t rows = c.axis == 0 ? c.shape[1] : (c.axis == 1 ? c.shape[0] : 1);
    const int64_t n = c.axis == 0 ? c.shape[0] : c.shape.back();
    std::string from = "f32[", to = c.axis < 0 ? "f32[]" : "f32[" + std::to_string(rows) + "]";
    for (size_t d = 0; d < c.shape.size(); ++d) from += (d ? "," : "") + std::to_string(c.shape[d]);
    from += "]";
    const std::string text =
        reduceText("reduce_sum", from, to, c.axis < 0 ? "axes = []" : "axes = [" + std::to_string(c.axis) + "]");
    SCOPED_TRACE(text);
    auto m = test::parseVerified(text, "sums.kir");
    ASSERT_NE(m, nullptr);
    const Function& f = *m->functions().front();
    Tensor x(DType::F32, c.shape);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = uniform(rng);
    std::unique_ptr<Module> optimized;
    auto kernels = codegen::lowerToKernels(f, {f.argument(0)->type()}, codegen::cudaBackend(), 3, &optimized);
    ASSERT_TRUE(kernels.ok()) << kernels.error().str();
    auto source = codegen::emitCudaSource(*kernels);
    ASSERT_TRUE(source.ok()) << source.error().str();
    EXPECT_NE(source->code.find("_partials["), std::string::npos) << "no blocked sum:\n" << source->code;
    auto binary = codegen::compileCudaSource(**nvrtc, source->code, "sums.cu", 75, /*ptxOnly=*/true);
    ASSERT_TRUE(binary.ok()) << binary.error().str();
    if (module_) x_->cuModuleUnload(module_);
    module_ = nullptr;
    ASSERT_EQ(x_->cuModuleLoadData(&module_, binary->ptx.c_str()), CUDA_SUCCESS) << fault();
    const Tensor got = run(*optimized->functions().front(), {x}, *kernels, source->launches, 3);
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0;
      for (int64_t k = 0; k < n; ++k) want += x.data<float>()[c.axis == 0 ? k * rows + r : r * n + k];
      EXPECT_LE(std::fabs(got.getDouble(r) - want) / want, 2e-7) << "sum " << r << ": " << got.getDouble(r) << " vs "
                                                                   << want;
    }
    for (CUdeviceptr p : buffers_) x_->cuMemFree(p);
    buffers_.clear();
  }
}

}  // namespace
}  // namespace kiln
