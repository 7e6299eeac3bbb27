// CudnnConvolution (runtime/cuda/CudnnConvolution.h) on the emulated GPU: the
// emulator's driver (EmulatedGpu.h) and its own cuDNN, found beside it by
// mathLibraryOptions. Each case is IR whose conv or
// conv_transpose the CUDA target puts in a library group; the group's call
// runs through cuDNN and must give what the interpreter computes: strides,
// pads (also unequal ones cuDNN can express), dilations, groups, depthwise,
// 1x1, 1-D and 3-D, a bias, transposed convolutions with output padding, in
// f32 and f16. Also: what cuDNN cannot express is an error the target never
// accepts (an epilogue, pads cuDNN cannot mirror), TF32 only when asked, the
// target without cuDNN (KILN_NO_CUDNN=1) leaves convolutions to generated
// kernels, and a tensor outside device memory fails the stream.
#include "runtime/cuda/CudnnConvolution.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "codegen/cpu/CpuTarget.h"
#include "codegen/cuda/CudaTarget.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln::cuda {
namespace {

struct EmulatedGpu {
  const CudaDriverApi* driver = nullptr;
  const CudaExecApi* exec = nullptr;
  const CudaMathLibrary* cudnn = nullptr;
  CUstream stream = nullptr;
};

/// The emulated GPU's driver, and nothing of the toolkit.
LibrarySearchOptions emulatorOptions() {
  LibrarySearchOptions options = test::emulatorOptions();
  options.searchDefaultToolkit = false;
  return options;
}

/// The driver initialized, device 0's primary context current, a stream,
/// and the emulator's cuDNN; once per process.
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
  auto cudnn = loadCudnn(mathLibraryOptions(options));
  if (!cudnn) return cudnn.takeError();
  EmulatedGpu gpu{*driver, *exec, *cudnn, nullptr};
  if (CUresult r = gpu.exec->cuStreamCreate(&gpu.stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS)
    return Error("cuStreamCreate: " + d.errorString(r));
  return gpu;
}

const EmulatedGpu* emulatedGpu() {
  static Expected<EmulatedGpu> gpu = openEmulatedGpu();
  EXPECT_TRUE(gpu.ok()) << (gpu.ok() ? "" : gpu.error().str());
  return gpu.ok() ? &*gpu : nullptr;
}

/// Declares `gpu`, or skips the test, saying so, in a build without the emulator.
#define REQUIRE_EMULATED_GPU(gpu)                                                    \
  KILN_REQUIRE_EMULATOR();                                                           \
  const EmulatedGpu* gpu = emulatedGpu();                                            \
  ASSERT_NE(gpu, nullptr)

#define EXPECT_CU(gpu, call)                                                       \
  do {                                                                             \
    const CUresult r_ = (call);                                                    \
    EXPECT_EQ(r_, CUDA_SUCCESS) << #call << ": " << (gpu).driver->errorString(r_); \
  } while (0)

/// Device buffers freed (after the stream is drained) at the end of a scope.
struct DeviceBuffers {
  explicit DeviceBuffers(const EmulatedGpu& gpu) : gpu(gpu) {}
  ~DeviceBuffers() {
    (void)gpu.exec->cuStreamSynchronize(gpu.stream);
    for (CUdeviceptr p : pointers) (void)gpu.exec->cuMemFree(p);
  }
  CUdeviceptr add(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_CU(gpu, gpu.exec->cuMemAlloc(&p, std::max<size_t>(bytes, 1)));
    pointers.push_back(p);
    return p;
  }
  void upload(const Tensor& t) {
    const CUdeviceptr p = add(t.numBytes());
    EXPECT_CU(gpu, gpu.exec->cuMemcpyHtoDAsync(p, t.raw(), t.numBytes(), gpu.stream));
  }
  const EmulatedGpu& gpu;
  std::vector<CUdeviceptr> pointers;
};

/// The one conv or conv_transpose of `text`'s function in a library group, as
/// the CUDA target with cuDNN takes it, and that group's call.
struct Selected {
  std::unique_ptr<Module> module;
  const Op* group = nullptr;
  LibraryCall call;
};

Selected selectWithCudnn(const std::string& text) {
  Selected s;
  s.module = test::parseVerified(text);
  EXPECT_NE(s.module, nullptr);
  if (!s.module) return s;
  const codegen::CudaTarget target(true);
  PassContext ctx;
  ctx.target = &target;
  PassManager pm(PassManagerOptions{}, ctx);
  EXPECT_TRUE(pm.addPipeline("select-library").ok());
  std::ostringstream log;
  Status ran = pm.run(*s.module, log);
  EXPECT_TRUE(ran.ok()) << ran.error().str();
  for (const auto& op : s.module->functions().front()->ops())
    if (op->kind() == OpKind::Fused) s.group = op.get();
  if (!s.group) return s;
  auto call = codegen::describeLibraryCall(*s.group);
  EXPECT_TRUE(call.ok()) << call.error().str();
  if (call) s.call = *call;
  return s;
}

/// Runs `text`'s convolution through cuDNN and compares it with the interpreter.
void expectMatchesInterpreter(const EmulatedGpu& gpu, const std::string& text, DType dtype, bool allowTf32,
                              double tolerance, const std::string& description) {
  SCOPED_TRACE(text);
  Selected s = selectWithCudnn(text);
  ASSERT_NE(s.group, nullptr) << "the CUDA target with cuDNN took no library group";
  EXPECT_EQ(describeCudnnConvolution(s.call), description);
  const Function& f = *s.module->functions().front();
  std::mt19937 rng(5);
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) inputs.push_back(test::randomTensor(f.argument(i)->type(), rng));
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();

  auto conv = CudnnConvolution::create(*gpu.cudnn, s.call, dtype, allowTf32);
  ASSERT_TRUE(conv.ok()) << conv.error().str();
  EXPECT_EQ((*conv)->workspaceBytes(), 0u);  // the emulator's algorithms need none
  DeviceBuffers buffers(gpu);
  for (const Value* v : s.group->operands()) buffers.upload(inputs[static_cast<size_t>(v->index())]);
  Tensor got(dtype, s.call.resultDims);
  const CUdeviceptr result = buffers.add(got.numBytes());
  Status run = (*conv)->run(gpu.stream, buffers.pointers, 0, 0);
  ASSERT_TRUE(run.ok()) << run.error().str();
  EXPECT_CU(gpu, gpu.exec->cuMemcpyDtoHAsync(got.raw(), result, got.numBytes(), gpu.stream));
  EXPECT_CU(gpu, gpu.exec->cuStreamSynchronize(gpu.stream));
  test::expectClose(got, want->front(), "cuDNN's result", tolerance, tolerance);
}

std::string convFunction(const std::string& x, const std::string& w, const std::string& attrs, const std::string& y,
                         const std::string& op = "conv") {
  return "func @f(%x: " + x + ", %w: " + w + ") -> " + y + " {\n  %y = " + op + "(%x, %w)" +
         (attrs.empty() ? "" : " {" + attrs + "}") + " : " + y + "\n  return %y\n}\n";
}

/// Forward convolutions of several shapes give the interpreter's values.
TEST(CudnnConvolutionTest, ConvolutionsMatchTheInterpreter) {
  REQUIRE_EMULATED_GPU(gpu);
  struct Case {
    std::string text, description;
  };
  const Case cases[] = {
      {convFunction("f32[2,3,9,9]", "f32[4,3,3,3]", "strides = [2, 2]", "f32[2,4,4,4]"),
       "cudnn conv [2,3,9,9]*[4,3,3,3] stride [2,2]"},
      {convFunction("f32[1,3,8,8]", "f32[5,3,3,3]", "pads = [1, 1, 1, 1]", "f32[1,5,8,8]"),
       "cudnn conv [1,3,8,8]*[5,3,3,3] pad [1,1]"},
      {convFunction("f32[1,2,10,10]", "f32[3,2,3,3]", "dilations = [2, 2]", "f32[1,3,6,6]"),
       "cudnn conv [1,2,10,10]*[3,2,3,3] dilation [2,2]"},
      {convFunction("f32[2,4,7,7]", "f32[6,2,3,3]", "groups = 2, pads = [1, 1, 1, 1]", "f32[2,6,7,7]"),
       "cudnn conv [2,4,7,7]*[6,2,3,3] pad [1,1] groups 2"},
      {convFunction("f32[1,4,6,6]", "f32[4,1,3,3]", "groups = 4, strides = [2, 2], pads = [1, 1, 1, 1]",
                    "f32[1,4,3,3]"),
       "cudnn conv [1,4,6,6]*[4,1,3,3] stride [2,2] pad [1,1] groups 4"},
      {convFunction("f32[3,8,5,5]", "f32[2,8,1,1]", "", "f32[3,2,5,5]"), "cudnn conv [3,8,5,5]*[2,8,1,1]"},
      // Pads 1 and 0 with stride 2 over 8: cuDNN's end pad of 1 reaches no output.
      {convFunction("f32[1,1,8,8]", "f32[2,1,3,3]", "strides = [2, 2], pads = [1, 1, 0, 0]", "f32[1,2,4,4]"),
       "cudnn conv [1,1,8,8]*[2,1,3,3] stride [2,2] pad [1,1]"},
      // Pads 0 and 1: 4 outputs, where cuDNN's pad 0 on both ends gives 3.
      {convFunction("f32[1,1,8,8]", "f32[2,1,3,3]", "strides = [2, 2], pads = [0, 0, 1, 1]", "f32[1,2,4,4]"), ""},
      {convFunction("f32[2,3,12]", "f32[4,3,3]", "strides = [2], pads = [1, 1]", "f32[2,4,6]"),
       "cudnn conv [2,3,12]*[4,3,3] stride [2,1] pad [1,0]"},
      {convFunction("f32[1,2,4,5,5]", "f32[3,2,2,3,3]", "pads = [0, 1, 1, 0, 1, 1]", "f32[1,3,3,5,5]"),
       "cudnn conv [1,2,4,5,5]*[3,2,2,3,3] pad [0,1,1]"},
      {"func @f(%x: f32[2,3,6,6], %w: f32[4,3,3,3], %b: f32[4]) -> f32[2,4,6,6] {\n"
       "  %y = conv(%x, %w, %b) {pads = [1, 1, 1, 1]} : f32[2,4,6,6]\n  return %y\n}\n",
       "cudnn conv [2,3,6,6]*[4,3,3,3] pad [1,1] + bias"},
  };
  for (const Case& c : cases) {
    if (c.description.empty()) {
      Selected s = selectWithCudnn(c.text);
      EXPECT_EQ(s.group, nullptr);
      continue;
    }
    expectMatchesInterpreter(*gpu, c.text, DType::F32, false, 1e-5, c.description);
  }
}

/// Transposed convolutions (cudnnConvolutionBackwardData) give the
/// interpreter's values.
TEST(CudnnConvolutionTest, TransposedConvolutionsMatchTheInterpreter) {
  REQUIRE_EMULATED_GPU(gpu);
  expectMatchesInterpreter(*gpu,
                           convFunction("f32[2,4,5,5]", "f32[4,3,3,3]", "strides = [2, 2]", "f32[2,3,11,11]",
                                        "conv_transpose"),
                           DType::F32, false, 1e-5, "cudnn conv_transpose [2,4,5,5]*[4,3,3,3] stride [2,2]");
  expectMatchesInterpreter(*gpu,
                           convFunction("f32[1,4,4,4]", "f32[4,2,3,3]",
                                        "strides = [2, 2], pads = [1, 1, 1, 1], output_padding = [1, 1]",
                                        "f32[1,2,8,8]", "conv_transpose"),
                           DType::F32, false, 1e-5, "cudnn conv_transpose [1,4,4,4]*[4,2,3,3] stride [2,2] pad [1,1]");
  expectMatchesInterpreter(*gpu,
                           convFunction("f32[1,4,5,5]", "f32[4,3,3,3]", "groups = 2, dilations = [2, 2]",
                                        "f32[1,6,9,9]", "conv_transpose"),
                           DType::F32, false, 1e-5,
                           "cudnn conv_transpose [1,4,5,5]*[4,3,3,3] dilation [2,2] groups 2");
}

/// f16 data with f32 accumulation: the result is the f32 one rounded once.
TEST(CudnnConvolutionTest, HalfPrecision) {
  REQUIRE_EMULATED_GPU(gpu);
  expectMatchesInterpreter(*gpu, convFunction("f16[1,3,8,8]", "f16[4,3,3,3]", "pads = [1, 1, 1, 1]", "f16[1,4,8,8]"),
                           DType::F16, false, 2e-3, "cudnn conv [1,3,8,8]*[4,3,3,3] pad [1,1]");
}

/// What cuDNN cannot express is an error naming why, and the target never
/// takes it: an epilogue (a conv with a relu is taken alone), unequal pads
/// that change the output, and no cuDNN at all.
TEST(CudnnConvolutionTest, TargetTakesConvolutionsWithoutEpilogueOnly) {
  auto m = test::parseVerified(
      "func @f(%x: f32[1,3,8,8], %w: f32[4,3,3,3]) -> f32[1,4,6,6] {\n"
      "  %c = conv(%x, %w) : f32[1,4,6,6]\n  %r = relu(%c) : f32[1,4,6,6]\n  return %r\n}\n");
  ASSERT_NE(m, nullptr);
  std::vector<const Op*> op;
  for (const auto& o : m->functions().front()->ops()) op.push_back(o.get());
  const std::vector<const Op*> relu = {op[1]};
  const codegen::CudaTarget withCudnn(true), withoutCudnn(false);
  EXPECT_FALSE(withCudnn.acceptsLibraryCall(*op[0], relu));
  EXPECT_TRUE(withCudnn.acceptsLibraryCall(*op[0], {}));
  EXPECT_FALSE(withoutCudnn.acceptsLibraryCall(*op[0], {}));

  auto withRelu = codegen::describeLibraryCall(*op[0], relu);
  ASSERT_TRUE(withRelu.ok());
  auto refused = cudnnConvolutionShape(*withRelu);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message(), "cuDNN's convolution here has no post-ops ('relu' stays for a generated kernel)");
  auto alone = codegen::describeLibraryCall(*op[0], {});
  ASSERT_TRUE(alone.ok());
  LibraryCall uneven = *alone;
  uneven.pads = {0, 0, 2, 2};  // output 8x8 with pads 0 and 2; cuDNN's pad 0 gives 6x6
  uneven.resultDims = {1, 4, 8, 8};
  auto unevenShape = cudnnConvolutionShape(uneven);
  ASSERT_FALSE(unevenShape.ok());
  EXPECT_NE(unevenShape.error().message().find("cuDNN pads both ends of a dim alike"), std::string::npos)
      << unevenShape.error().message();
  EXPECT_EQ(codegen::describeCudaLibraryCallText(*alone), "cudnn conv [1,3,8,8]*[4,3,3,3]");

  REQUIRE_EMULATED_GPU(gpu);
  auto created = CudnnConvolution::create(*gpu->cudnn, *withRelu, DType::F32, false);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.error().message(),
            "cuDNN cannot compute this library call: cuDNN's convolution here has no post-ops ('relu' stays for a "
            "generated kernel)");
  auto f64 = CudnnConvolution::create(*gpu->cudnn, *alone, DType::F64, false);
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.error().message(), "cuDNN convolutions take f32, f16 or bf16, not f64");
}

/// f32 uses FMA math unless TF32 is allowed; the emulator then rounds the
/// inputs to TF32, measurably off the f32 result.
TEST(CudnnConvolutionTest, Tf32OnlyWhenAllowed) {
  REQUIRE_EMULATED_GPU(gpu);
  const std::string text = convFunction("f32[1,16,6,6]", "f32[8,16,3,3]", "", "f32[1,8,4,4]");
  Selected s = selectWithCudnn(text);
  ASSERT_NE(s.group, nullptr);
  auto fma = CudnnConvolution::create(*gpu->cudnn, s.call, DType::F32, false);
  auto tf32 = CudnnConvolution::create(*gpu->cudnn, s.call, DType::F32, true);
  ASSERT_TRUE(fma.ok() && tf32.ok());
  EXPECT_EQ((*fma)->describe(), "cudnn conv [1,16,6,6]*[8,16,3,3] (f32, FMA math, algo 0)");
  EXPECT_EQ((*tf32)->describe(), "cudnn conv [1,16,6,6]*[8,16,3,3] (f32, default math, algo 0)");
  const Tensor x = test::randomF32({1, 16, 6, 6}, 7);
  const Tensor w = test::randomF32({8, 16, 3, 3}, 8);
  auto want = interpret(*s.module->functions().front(), {x, w});
  ASSERT_TRUE(want.ok());
  double errors[2] = {};
  int i = 0;
  for (const auto* conv : {fma->get(), tf32->get()}) {
    DeviceBuffers buffers(*gpu);
    buffers.upload(x);
    buffers.upload(w);
    Tensor got(DType::F32, {1, 8, 4, 4});
    const CUdeviceptr result = buffers.add(got.numBytes());
    ASSERT_TRUE(conv->run(gpu->stream, buffers.pointers, 0, 0).ok());
    EXPECT_CU(*gpu, gpu->exec->cuMemcpyDtoHAsync(got.raw(), result, got.numBytes(), gpu->stream));
    EXPECT_CU(*gpu, gpu->exec->cuStreamSynchronize(gpu->stream));
    const std::vector<double> g = test::elementsOf(got), r = test::elementsOf(want->front());
    for (size_t e = 0; e < g.size(); ++e) errors[i] = std::max(errors[i], std::fabs(g[e] - r[e]));
    ++i;
  }
  EXPECT_LT(errors[0], 1e-5);
  EXPECT_GT(errors[1], 1e-4);
}

/// KILN_NO_CUDNN=1 hides cuDNN from the compiler: the CNN's convolutions
/// are then generated kernels, with cuDNN they are library groups.
TEST(CudnnConvolutionTest, HiddenCudnnLeavesConvolutionsToGeneratedKernels) {
  const char* cnn =
      "func @cnn(%x: f32[2,3,12,12], %w1: f32[8,3,3,3], %b1: f32[8], %w2: f32[4,8,3,3]) -> f32[2,4,6,6] {\n"
      "  %c1 = conv(%x, %w1, %b1) {pads = [1, 1, 1, 1]} : f32[2,8,12,12]\n  %r1 = relu(%c1) : f32[2,8,12,12]\n"
      "  %c2 = conv(%r1, %w2) {strides = [2, 2], pads = [1, 1, 1, 1]} : f32[2,4,6,6]\n  return %c2\n}\n";
  auto countGroups = [&](const codegen::CudaTarget& target) {
    auto m = test::parseVerified(cnn);
    EXPECT_NE(m, nullptr);
    PassContext ctx;
    ctx.target = &target;
    PassManager pm(PassManagerOptions{}, ctx);
    EXPECT_TRUE(pm.addPipeline("select-library").ok());
    std::ostringstream log;
    EXPECT_TRUE(pm.run(*m, log).ok());
    int groups = 0;
    for (const auto& op : m->functions().front()->ops()) groups += op->kind() == OpKind::Fused;
    return groups;
  };
  EXPECT_EQ(countGroups(codegen::CudaTarget(true)), 2);
  EXPECT_EQ(countGroups(codegen::CudaTarget(false)), 0);
  const char* previous = std::getenv("KILN_NO_CUDNN");
  const std::string saved = previous ? previous : "";
  setenv("KILN_NO_CUDNN", "1", 1);
  EXPECT_FALSE(codegen::cudnnPresentForCompilation());
  EXPECT_EQ(countGroups(codegen::CudaTarget()), 0);
  if (previous)
    setenv("KILN_NO_CUDNN", saved.c_str(), 1);
  else
    unsetenv("KILN_NO_CUDNN");
}

/// A tensor that is not inside device memory fails the stream with an
/// illegal address, as a stray read on a GPU would, and the fault names the
/// tensor. In a child process, since the fault breaks the context for good.
TEST(CudnnConvolutionTest, OutOfRangeTensorFaults) {
  KILN_REQUIRE_EMULATOR();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const EmulatedGpu* gpu = emulatedGpu();
        if (!gpu) std::exit(2);
        Selected s = selectWithCudnn(convFunction("f32[1,2,4,4]", "f32[2,2,3,3]", "", "f32[1,2,2,2]"));
        if (!s.group) std::exit(3);
        auto conv = CudnnConvolution::create(*gpu->cudnn, s.call, DType::F32, false);
        if (!conv) std::exit(4);
        DeviceBuffers buffers(*gpu);
        buffers.add(16);  // 4 of the 32 floats x has
        buffers.add(2 * 2 * 9 * 4);
        buffers.add(8 * 4);
        if (!(*conv)->run(gpu->stream, buffers.pointers, 0, 0).ok()) std::exit(5);
        const CUresult r = gpu->exec->cuStreamSynchronize(gpu->stream);
        auto lastFault =
            reinterpret_cast<const char* (*)()>(dlsym(gpu->driver->library.handle, "kilnEmulatorLastFault"));
        std::fprintf(stderr, "%s; %s\n", gpu->driver->errorString(r).c_str(), lastFault ? lastFault() : "");
        std::exit(r == CUDA_ERROR_ILLEGAL_ADDRESS ? 0 : 6);
      },
      testing::ExitedWithCode(0), "CUDA_ERROR_ILLEGAL_ADDRESS.*cudnnConvolutionForward: tensor x .*not inside one live");
}

}  // namespace
}  // namespace kiln::cuda
