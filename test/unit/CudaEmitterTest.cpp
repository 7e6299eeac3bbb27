// The CUDA emitter without a GPU. Two checks on the same cases (ops of
// every kind and dtype, reductions with NaN, matmul, conv, pooling, fused
// softmax and layer norm):
//  - NVRTC compiles the emitted translation unit for sm_90, and the CUBIN
//    defines every kernel;
//  - the same CUDA C++ compiled as host C++ (a small shim defines
//    __global__, blockIdx, ... and CUDA's few non-standard functions;
//    buildCudaHostLibrary in TestSupport.h) and run with an emulated grid of 3 blocks of 4 threads, one thread after
//    another, matches the interpreter. This checks the emitter's indexing,
//    grid-stride mapping, reductions and scalar rules; it does not check
//    CUDA's own math functions or the device's execution, which need a GPU.
// The end-to-end models' kernels run the same way, step by step, against
// PyTorch's outputs.
// Plus NVRTC's log in compile errors, the architecture checks and the CUBIN
// symbol reader on bad input.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaBackend.h"
#include "codegen/Schedule.h"
#include "codegen/cuda/CudaEmitter.h"
#include "codegen/cuda/NvrtcCompiler.h"
#include "frontend/Model.h"
#include "ir/Parser.h"
#include "runtime/Interpreter.h"
#include "runtime/Npy.h"
#include "runtime/cuda/CudaLibraries.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::buildCudaHostLibrary;
using test::expectClose;
using test::parseVerified;
using test::randomTensor;
using test::runCudaKernelOnHost;
using test::runKernelsOnHost;

struct Case {
  std::string text;
  std::vector<Tensor> inputs = {};  // random ones when empty
  bool positive = false;
};

std::string unary(const std::string& op, const std::string& type, const std::string& result = "") {
  const std::string r = result.empty() ? type : result;
  return "func @f(%x: " + type + ") -> " + r + " {\n  %y = " + op + "(%x) : " + r + "\n  return %y\n}\n";
}
std::string binary(const std::string& op, const std::string& a, const std::string& b, const std::string& r) {
  return "func @f(%a: " + a + ", %b: " + b + ") -> " + r + " {\n  %y = " + op + "(%a, %b) : " + r +
         "\n  return %y\n}\n";
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const char* op : {"neg", "abs", "sign", "exp", "tanh", "sigmoid", "relu", "erf", "sin", "cos", "tan", "atan",
                         "sinh", "cosh", "asinh", "floor", "ceil", "round"})
    for (const char* type : {"f32[3,17]", "f32[]", "f64[5]"}) all.push_back({unary(op, type)});
  for (const char* op : {"log", "sqrt", "rsqrt", "reciprocal", "acosh"}) all.push_back({unary(op, "f32[4,9]"), {}, true});
  for (const char* op : {"neg", "abs", "sign", "relu"})
    for (const char* type : {"i64[6]", "i32[2,3]", "i8[4]"}) all.push_back({unary(op, type)});
  all.push_back({unary("not", "bool[2,5]")});
  Tensor special(DType::F32, {6});
  const double specials[] = {NAN, INFINITY, -INFINITY, 1.5, -0.0, -2.0};
  for (int64_t i = 0; i < 6; ++i) special.setDouble(i, specials[i]);
  for (const char* op : {"isnan", "isinf"}) all.push_back({unary(op, "f32[6]", "bool[6]"), {special}});
  all.push_back({unary("relu", "f32[6]"), {special}});
  for (const char* type : {"f32[3,17]", "f32[]", "f64[5]"}) all.push_back({unary("hard_swish", type)});
  all.push_back({unary("hard_swish", "f32[6]"), {special}});
  for (const char* op : {"add", "sub", "mul", "div", "max", "min", "mod", "rem", "pow"}) {
    all.push_back({binary(op, "f32[3,4]", "f32[4]", "f32[3,4]"), {}, std::string(op) == "pow"});
    all.push_back({binary(op, "f64[2,1,5]", "f64[3,1]", "f64[2,3,5]"), {}, std::string(op) == "pow"});
  }
  Tensor other(DType::F32, {6});
  const double others[] = {1.0, NAN, 0.0, NAN, 2.0, -INFINITY};
  for (int64_t i = 0; i < 6; ++i) other.setDouble(i, others[i]);
  for (const char* op : {"max", "min"}) all.push_back({binary(op, "f32[6]", "f32[6]", "f32[6]"), {special, other}});
  for (const char* op : {"add", "sub", "mul", "div", "max", "min", "mod", "rem"})
    for (const char* t : {"i64", "i32", "i8", "u8"}) {
      const std::string a = std::string(t) + "[3,4]", b = std::string(t) + "[4]";
      const bool divides = std::string(op) == "div" || std::string(op) == "mod" || std::string(op) == "rem";
      auto m = parseModule(binary(op, a, b, a), "case.kir");
      std::mt19937 rng(7);
      all.push_back({binary(op, a, b, a),
                     {randomTensor((*m)->functions().front()->argument(0)->type(), rng, false),
                      randomTensor((*m)->functions().front()->argument(1)->type(), rng, divides)}});
    }
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    all.push_back({binary(op, "f32[3,4]", "f32[4]", "bool[3,4]")});
    all.push_back({binary(op, "i32[5]", "i32[]", "bool[5]")});
  }
  for (const char* op : {"and", "or", "xor"}) all.push_back({binary(op, "bool[2,3]", "bool[3]", "bool[2,3]")});
  all.push_back({"func @f(%c: bool[2,1], %a: f32[3], %b: f32[]) -> f32[2,3] {\n  %y = select(%c, %a, %b) : f32[2,3]\n"
                 "  return %y\n}\n"});
  const char* types[] = {"f32", "f64", "i64", "i32", "i16", "i8", "u8", "bool"};
  for (const char* from : types)
    for (const char* to : types)
      if (std::string(from) != to)
        all.push_back({unary("cast", std::string(from) + "[2,5]", std::string(to) + "[2,5]")});
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"}) {
    const std::string o = op;
    all.push_back({"func @f(%x: f32[3,4,5]) -> f32[3,5] {\n  %y = " + o + "(%x) {axes = [1]} : f32[3,5]\n  return %y\n}\n"});
    all.push_back({"func @f(%x: f32[3,4]) -> f32[] {\n  %y = " + o + "(%x) {axes = []} : f32[]\n  return %y\n}\n"});
    all.push_back({"func @f(%x: i32[3,4]) -> i32[4] {\n  %y = " + o + "(%x) {axes = [0]} : i32[4]\n  return %y\n}\n"});
  }
  Tensor nans(DType::F32, {2, 4});
  const double values[] = {1, 3, 3, 0, NAN, 2, NAN, -1};
  for (int64_t i = 0; i < 8; ++i) nans.setDouble(i, values[i]);
  for (const char* op : {"reduce_max", "reduce_min"})
    all.push_back({"func @f(%x: f32[2,4]) -> f32[2] {\n  %y = " + std::string(op) +
                       "(%x) {axes = [1]} : f32[2]\n  return %y\n}\n",
                   {nans}});
  for (const char* op : {"argmax", "argmin"})
    for (const char* last : {"false", "true"})
      all.push_back({"func @f(%x: f32[2,4]) -> i64[2] {\n  %y = " + std::string(op) +
                         "(%x) {axis = 1, select_last_index = " + last + "} : i64[2]\n  return %y\n}\n",
                     {nans}});
  all.push_back({"func @f(%x: i32[3,4]) -> i64[1,4] {\n  %y = argmax(%x) {axis = 0, keepdims = true} : i64[1,4]\n"
                 "  return %y\n}\n"});
  all.push_back({binary("matmul", "f32[2,1,3,4]", "f32[3,4,2]", "f32[2,3,3,2]")});
  all.push_back({binary("matmul", "f64[5,33]", "f64[33,7]", "f64[5,7]")});
  all.push_back({"func @f(%x: f32[1,4,8,8], %w: f32[6,2,3,3]) -> f32[1,6,4,4] {\n"
                 "  %y = conv(%x, %w) {strides = [2, 2], pads = [1, 1, 1, 1], groups = 2} : f32[1,6,4,4]\n"
                 "  return %y\n}\n"});
  all.push_back({"func @f(%x: f32[2,3,7,7]) -> f32[2,3,4,4] {\n"
                 "  %y = max_pool(%x) {kernel = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} : f32[2,3,4,4]\n"
                 "  return %y\n}\n"});
  all.push_back({"func @f(%x: f32[1,2,6,6]) -> f32[1,2,4,4] {\n  %y = avg_pool(%x) {kernel = [3, 3], strides = [2, 2], "
                 "pads = [1, 1, 2, 2], count_include_pad = false} : f32[1,2,4,4]\n  return %y\n}\n"});
  all.push_back({"func @f(%d: f32[4,3], %i: i64[2,2]) -> f32[2,2,3] {\n  %y = gather(%d, %i) {axis = 0} : f32[2,2,3]\n"
                 "  return %y\n}\n",
                 {[] {
                    Tensor d(DType::F32, {4, 3});
                    for (int64_t k = 0; k < 12; ++k) d.setDouble(k, 0.5 * k - 2);
                    return d;
                  }(),
                  [] {
                    Tensor i(DType::I64, {2, 2});
                    for (int64_t k = 0; k < 4; ++k) i.setInt(k, (k * 3) % 4 - 1);  // -1 wraps to the last row
                    return i;
                  }()}});
  all.push_back({"func @f(%x: f32[2,3]) -> f32[3,2] {\n  %y = transpose(%x) {perm = [1, 0]} : f32[3,2]\n"
                 "  return %y\n}\n"});
  // f16 and bf16: computed in f32, rounded to nearest even when stored.
  for (const char* t : {"f16", "bf16"}) {
    const std::string h = std::string(t) + "[3,5]";
    all.push_back({binary("add", h, h, h)});
    all.push_back({unary("exp", h)});
    all.push_back({unary("cast", h, "f32[3,5]")});
    all.push_back({unary("cast", "f32[3,5]", h)});
    all.push_back({unary("cast", "i32[3,5]", h)});
    all.push_back({"func @f(%x: " + h + ") -> " + t + "[3] {\n  %y = reduce_sum(%x) {axes = [1]} : " + t +
                   "[3]\n  return %y\n}\n"});
  }
  Tensor halfSpecials(DType::F32, {8});
  const double halfValues[] = {NAN, INFINITY, 65519.0, 65520.0, 1e-8, 3e-5, -0.0, 1.0 / 3};
  for (int64_t i = 0; i < 8; ++i) halfSpecials.setDouble(i, halfValues[i]);
  for (const char* t : {"f16", "bf16"}) all.push_back({unary("cast", "f32[8]", std::string(t) + "[8]"), {halfSpecials}});
  // Integer pow by squaring, wrapping.
  for (const char* t : {"i64[6]", "i32[6]", "i8[6]"}) all.push_back({binary("pow", t, t, t), {}, true});
  // Composites fused into reduction groups at -O3: a kernel per group.
  all.push_back({"func @f(%x: f32[3,7]) -> f32[3,7] {\n  %y = softmax(%x) {axis = -1} : f32[3,7]\n  return %y\n}\n"});
  all.push_back({"func @f(%x: f32[2,6], %g: f32[6], %b: f32[6]) -> f32[2,6] {\n"
                 "  %y = layer_norm(%x, %g, %b) {axis = -1} : f32[2,6]\n  return %y\n}\n"});
  all.push_back({"func @f(%x: f32[4,5]) -> f32[4,5] {\n  %y = gelu(%x) : f32[4,5]\n  return %y\n}\n"});
  return all;
}

/// A case lowered for CUDA: its kernels (by the CUDA path's pipeline, -O3,
/// with unique names), its inputs and the interpreter's result.
struct LoweredCase {
  std::string text;
  std::vector<std::string> argumentNames;
  std::vector<Tensor> inputs;
  Tensor expected;
  std::vector<kir::Kernel> kernels;
};

std::vector<LoweredCase> lowerCases() {
  std::vector<LoweredCase> lowered;
  std::mt19937 rng(42);
  int next = 0;
  for (Case& c : cases()) {
    auto m = parseVerified(c.text, "case.kir");
    if (!m) continue;
    const Function& f = *m->functions().front();
    LoweredCase l;
    l.text = c.text;
    l.inputs = c.inputs;
    std::vector<TensorType> types;
    for (size_t i = 0; i < f.numArguments(); ++i) {
      if (c.inputs.empty()) l.inputs.push_back(randomTensor(f.argument(i)->type(), rng, c.positive));
      l.argumentNames.push_back(f.argument(i)->name());
      types.push_back(f.argument(i)->type());
    }
    auto want = interpret(f, l.inputs);
    EXPECT_TRUE(want.ok()) << c.text << (want.ok() ? "" : want.error().str());
    if (!want) continue;
    l.expected = want->front();
    // The convolution cases test generated kernels: cuDNN, where it is
    // present, would take them (codegen/cuda/CudaTarget.h).
    const char* hidden = std::getenv("KILN_NO_CUDNN");
    const std::string saved = hidden ? hidden : "";
    setenv("KILN_NO_CUDNN", "1", 1);
    auto kernels = codegen::lowerToKernels(f, types, codegen::cudaBackend(), 3);
    if (hidden)
      setenv("KILN_NO_CUDNN", saved.c_str(), 1);
    else
      unsetenv("KILN_NO_CUDNN");
    EXPECT_TRUE(kernels.ok()) << c.text << (kernels.ok() ? "" : kernels.error().str());
    if (!kernels) continue;
    EXPECT_FALSE(kernels->empty()) << c.text;
    for (kir::Kernel& k : *kernels) k.name = "case" + std::to_string(next++) + "_" + k.name;
    l.kernels = std::move(*kernels);
    lowered.push_back(std::move(l));
  }
  return lowered;
}

std::vector<kir::Kernel> allKernels(const std::vector<LoweredCase>& lowered) {
  std::vector<kir::Kernel> kernels;
  for (const LoweredCase& l : lowered) kernels.insert(kernels.end(), l.kernels.begin(), l.kernels.end());
  return kernels;
}

/// `kernels` with one thread per result element: the host build runs one
/// thread after another, which cannot run a row schedule's shuffles
/// (CudaRowReductionTest runs those on the emulated GPU).
std::vector<kir::Kernel> perThread(std::vector<kir::Kernel> kernels) {
  for (kir::Kernel& k : kernels) codegen::scheduleForCuda(k, {.cooperativeRows = false});
  return kernels;
}

TEST(CudaEmitterTest, NvrtcCompilesEveryCase) {
  const std::vector<LoweredCase> lowered = lowerCases();
  auto source = codegen::emitCudaSource(allKernels(lowered));
  ASSERT_TRUE(source.ok()) << source.error().str();
  auto nvrtc = cuda::loadNvrtc();
  ASSERT_TRUE(nvrtc.ok()) << "NVRTC is required (CI machines have the CUDA toolkit): " << nvrtc.error().str();
  auto binary = codegen::compileCudaSource(**nvrtc, source->code, "cases.cu", 90);
  ASSERT_TRUE(binary.ok()) << binary.error().str();
  EXPECT_EQ(binary->arch, 90);
  EXPECT_NE(binary->ptx.find(".target sm_90"), std::string::npos);
  std::vector<std::string> names;
  for (const codegen::CudaLaunch& launch : source->launches) names.push_back(launch.name);
  EXPECT_GT(names.size(), 200u);
  EXPECT_EQ(codegen::countKernelsInCubin(binary->cubin, names), names.size());
  EXPECT_EQ(codegen::countKernelsInCubin(binary->cubin, {"no_such_kernel"}), 0u);
}

TEST(CudaEmitterTest, EmittedCudaRunAsHostCodeMatchesInterpreter) {
  const std::vector<LoweredCase> lowered = lowerCases();
  auto source = codegen::emitCudaSource(perThread(allKernels(lowered)));
  ASSERT_TRUE(source.ok()) << source.error().str();
  void* library = buildCudaHostLibrary(source->code);
  ASSERT_NE(library, nullptr);

  for (const LoweredCase& l : lowered) {
    SCOPED_TRACE(l.text);
    // Values by name: the arguments, then each kernel's result.
    std::map<std::string, Tensor> values;
    for (size_t i = 0; i < l.inputs.size(); ++i) values[l.argumentNames[i]] = l.inputs[i];
    const Tensor last = runKernelsOnHost(library, l.kernels, values);
    expectClose(last, l.expected, "the last kernel's result");
  }
  dlclose(library);
}

/// Every end-to-end model's CUDA kernels (the kernel list `kiln compile
/// --device cuda` compiles, at -O3: fused groups, conv as loop nests), run
/// as host code on the emulated grid in step order, give PyTorch's outputs
/// (rtol 1e-4, atol 1e-5, as the e2e tests). The matmuls cuBLASLt takes are
/// computed by the interpreter here (CublasLtMatmulTest checks cuBLASLt's
/// results on the emulated GPU).
TEST(CudaEmitterTest, EndToEndModelsRunAsHostCodeMatchPyTorch) {
  static const InterpreterEvaluator evaluator;
  struct Model {
    std::string name;
    std::unique_ptr<Module> optimized;
    std::vector<kir::Kernel> kernels;
    std::map<std::string, Tensor> inputs;
    std::map<std::string, Tensor> expected;
  };
  std::vector<Model> models;
  std::vector<kir::Kernel> all;
  for (const char* name : {"mlp", "cnn", "rnn", "lstm", "gru", "transformer", "gpt"}) {
    SCOPED_TRACE(name);
    Model m;
    m.name = name;
    const std::filesystem::path dir = std::filesystem::path(KILN_SOURCE_DIR) / "test" / "e2e" / name;
    LoadOptions options;
    options.evaluator = &evaluator;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string file = entry.path().filename().string();
      for (const char* prefix : {"input_", "expected_"}) {
        if (file.rfind(prefix, 0) != 0 || entry.path().extension() != ".npy") continue;
        auto t = readNpy(entry.path().string());
        ASSERT_TRUE(t.ok()) << t.error().str();
        const std::string value = file.substr(std::string(prefix).size(), file.size() - std::string(prefix).size() - 4);
        (std::string(prefix) == "input_" ? m.inputs : m.expected)[value] = *t;
        if (std::string(prefix) == "input_") options.inputShapes[value] = t->shape();
      }
    }
    auto module = loadModel((dir / "model.onnx").string(), options);
    ASSERT_TRUE(module.ok()) << module.error().str();
    const Function& f = *(*module)->functions().front();
    std::vector<TensorType> types;
    for (size_t i = 0; i < f.numArguments(); ++i) {
      ASSERT_TRUE(m.inputs.count(f.argument(i)->name())) << f.argument(i)->name();
      types.push_back(m.inputs.at(f.argument(i)->name()).type());
    }
    auto kernels = codegen::lowerToKernels(f, types, codegen::cudaBackend(), 3, &m.optimized);
    ASSERT_TRUE(kernels.ok()) << kernels.error().str();
    for (kir::Kernel& k : *kernels) k.name = m.name + "_" + k.name;
    m.kernels = std::move(*kernels);
    all.insert(all.end(), m.kernels.begin(), m.kernels.end());
    models.push_back(std::move(m));
  }
  auto source = codegen::emitCudaSource(perThread(all));
  ASSERT_TRUE(source.ok()) << source.error().str();
  void* library = buildCudaHostLibrary(source->code);
  ASSERT_NE(library, nullptr);

  for (Model& m : models) {
    SCOPED_TRACE(m.name);
    const Function& g = *m.optimized->functions().front();
    std::map<const Value*, Tensor> values;
    for (size_t i = 0; i < g.numArguments(); ++i) values[g.argument(i)] = m.inputs.at(g.argument(i)->name());
    size_t next = 0;
    for (const auto& op : g.ops()) {
      if (op->kind() == OpKind::Check) continue;  // a host check, not a kernel
      if (op->kind() == OpKind::Constant) {
        values[op->result()] = Tensor::fromDense(op->getTensor("value"));
        continue;
      }
      if (op->kind() == OpKind::Fused && op->getString("kind") == "library") {
        std::vector<Tensor> operands;
        for (const Value* v : op->operands()) operands.push_back(values.at(v));
        auto out = interpret(*op->region(), operands);
        ASSERT_TRUE(out.ok()) << out.error().str();
        values[op->result()] = out->front();
        continue;
      }
      if (op->kind() == OpKind::Return) {
        ASSERT_EQ(op->numOperands(), m.expected.size());
        for (size_t i = 0; i < op->numOperands(); ++i) {
          const std::string name = g.resultName(i);
          ASSERT_TRUE(m.expected.count(name)) << "no expected_" << name << ".npy";
          const Tensor& want = m.expected.at(name);
          const Tensor& got = values.at(op->operand(i));
          ASSERT_EQ(got.shape(), want.shape());
          for (int64_t e = 0; e < want.numElements(); ++e)
            ASSERT_NEAR(got.getDouble(e), want.getDouble(e), 1e-5 + 1e-4 * std::fabs(want.getDouble(e)))
                << name << " element " << e;
        }
        continue;
      }
      ASSERT_LT(next, m.kernels.size());
      const kir::Kernel& k = m.kernels[next++];
      void* fn = dlsym(library, k.name.c_str());
      ASSERT_NE(fn, nullptr) << k.name;
      std::vector<void*> args;
      for (const Value* v : op->operands()) args.push_back(const_cast<uint8_t*>(values.at(v).raw()));
      Tensor out(op->result()->type().dtype, staticDims(op->result()->type().shape));
      args.push_back(out.raw());
      args.push_back(nullptr);  // sizes
      runCudaKernelOnHost(library, fn, args);
      values[op->result()] = out;
    }
    EXPECT_EQ(next, m.kernels.size());
  }
  dlclose(library);
}

TEST(CudaEmitterTest, GridMappingAndLaunchSizes) {
  auto m = parseModule(
      "func @f(%x: f32[5,7,3]) -> (f32[5,7,3], f32[]) {\n  %e = exp(%x) : f32[5,7,3]\n"
      "  %s = reduce_sum(%x) {axes = []} : f32[]\n  return %e, %s\n}\n",
      "grid.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  const Function& f = *(*m)->functions().front();
  auto kernels = codegen::lowerToKernels(f, {f.argument(0)->type()}, codegen::cudaBackend(), 3);
  ASSERT_TRUE(kernels.ok()) << kernels.error().str();
  auto source = codegen::emitCudaSource(*kernels);
  ASSERT_TRUE(source.ok()) << source.error().str();
  ASSERT_EQ(source->launches.size(), 2u);
  // exp: the 35 outer rows and the 3 inner elements, one index space of
  // 105, which an f32 map takes 4 elements per thread step (26 steps and
  // a scalar tail of 1: 27 work items).
  EXPECT_EQ(source->launches[0].workItems, 27);
  EXPECT_NE(source->code.find("t < 105LL; t += (long long)gridDim.x * blockDim.x"), std::string::npos);
  EXPECT_NE(source->code.find("const long long i1 = t % 3LL;"), std::string::npos);
  EXPECT_NE(source->code.find("const long long i0 = t / 3LL;"), std::string::npos);
  // The scalar sum of 105 elements is one row, which a warp reduces.
  EXPECT_EQ(source->launches[1].workItems, 32);
  EXPECT_EQ(source->code.find("if (blockIdx.x != 0 || threadIdx.x != 0) return;"), std::string::npos);
  // With one thread per element, it runs on one thread.
  source = codegen::emitCudaSource(perThread(*kernels));
  ASSERT_TRUE(source.ok()) << source.error().str();
  EXPECT_EQ(source->launches[0].workItems, 27);
  EXPECT_EQ(source->launches[1].workItems, 1);
  EXPECT_NE(source->code.find("if (blockIdx.x != 0 || threadIdx.x != 0) return;"), std::string::npos);
}

/// The kernels of `text` (one function of static shapes) for CUDA at -O3.
std::vector<kir::Kernel> kernelsOf(const std::string& text) {
  auto m = parseVerified(text, "rows.kir");
  if (!m) return {};
  const Function& f = *m->functions().front();
  std::vector<TensorType> types;
  for (size_t i = 0; i < f.numArguments(); ++i) types.push_back(f.argument(i)->type());
  auto kernels = codegen::lowerToKernels(f, types, codegen::cudaBackend(), 3);
  EXPECT_TRUE(kernels.ok()) << (kernels.ok() ? "" : kernels.error().str());
  return kernels.ok() ? *kernels : std::vector<kir::Kernel>{};
}

/// Row reductions of 32 iterations or more get a warp per row, of 1024 or
/// more a block; the schedule says so (`--emit=kernel`), the launch covers
/// rows times threads per row, and the code combines the row's lanes with
/// __shfl_xor_sync (and a block's warps through shared memory).
TEST(CudaEmitterTest, RowReductionsGetAWarpOrABlockPerRow) {
  // A softmax over rows of 16 is one fused kernel whose every element
  // would recompute the row's max and sum: the warp computes the max (once:
  // the group repeats it inside the sum) and the sum, then writes the row
  // strided.
  std::vector<kir::Kernel> softmax = kernelsOf(
      "func @f(%x: f32[6,16]) -> f32[6,16] {\n  %y = softmax(%x) {axis = -1} : f32[6,16]\n"
      "  return %y\n}\n");
  ASSERT_EQ(softmax.size(), 1u);
  EXPECT_EQ(softmax[0].schedule.threadsPerRow, 32);
  const std::string printed = kir::printKernel(softmax[0]);
  EXPECT_NE(printed.find("} schedule cuda: %i0 grid, %i1 lanes (256 threads per block, 32 per row)"), std::string::npos)
      << printed;
  auto source = codegen::emitCudaSource(softmax);
  ASSERT_TRUE(source.ok()) << source.error().str();
  EXPECT_EQ(source->launches[0].workItems, 6 * 32);
  const std::string& code = source->code;
  EXPECT_NE(code.find("const long long lane = threadIdx.x % 32LL;"), std::string::npos) << code;
  EXPECT_NE(code.find("for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32LL; row < 6LL; "
                      "row += ((long long)gridDim.x * blockDim.x) / 32LL) {"),
            std::string::npos)
      << code;
  EXPECT_NE(code.find("__shfl_xor_sync(0xffffffffu, "), std::string::npos) << code;
  EXPECT_NE(code.find("for (long long i1 = lane; i1 < 16LL; i1 += 32LL) {"), std::string::npos) << code;
  size_t rowLoops = 0;
  for (size_t at = code.find("_k = lane;"); at != std::string::npos; at = code.find("_k = lane;", at + 1)) ++rowLoops;
  EXPECT_EQ(rowLoops, 3u) << "the max, its search for the first zero, the sum:\n" << code;
  size_t maxima = 0;
  for (size_t at = code.find(" = (-__int_as_float(0x7f800000));"); at != std::string::npos;
       at = code.find(" = (-__int_as_float(0x7f800000));", at + 1))
    ++maxima;
  EXPECT_EQ(maxima, 1u) << "one max, though the group has two copies of it:\n" << code;
  EXPECT_EQ(code.find("__syncthreads"), std::string::npos);

  // Over rows of 100 the softmax is one kernel still (the fuser takes a
  // reduction over the last axis at any width: passes/Fuse.cpp
  // reducesRows): a warp per row computes the max and the sum once each,
  // then all its lanes write the row.
  std::vector<kir::Kernel> wide = kernelsOf(
      "func @f(%x: f32[6,100]) -> f32[6,100] {\n  %y = softmax(%x) {axis = -1} : f32[6,100]\n"
      "  return %y\n}\n");
  ASSERT_EQ(wide.size(), 1u);
  EXPECT_EQ(wide[0].schedule.threadsPerRow, 32);
  source = codegen::emitCudaSource(wide);
  ASSERT_TRUE(source.ok()) << source.error().str();
  EXPECT_NE(source->code.find("for (long long i1 = lane; i1 < 100LL; i1 += 32LL) {"), std::string::npos)
      << source->code;
  maxima = 0;
  for (size_t at = source->code.find(" = (-__int_as_float(0x7f800000));"); at != std::string::npos;
       at = source->code.find(" = (-__int_as_float(0x7f800000));", at + 1))
    ++maxima;
  EXPECT_EQ(maxima, 1u) << source->code;

  // Rows of 2000: a block each, its warps combined through shared memory.
  std::vector<kir::Kernel> sum =
      kernelsOf("func @f(%x: f32[3,2000]) -> f32[3] {\n  %y = reduce_sum(%x) {axes = [1]} : f32[3]\n  return %y\n}\n");
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].schedule.threadsPerRow, 256);
  source = codegen::emitCudaSource(sum);
  ASSERT_TRUE(source.ok()) << source.error().str();
  EXPECT_EQ(source->launches[0].workItems, 3 * 256);
  EXPECT_NE(source->code.find("const long long lane = threadIdx.x;"), std::string::npos);
  EXPECT_NE(source->code.find("__shared__ float r0_warps[8];"), std::string::npos) << source->code;
  EXPECT_NE(source->code.find("__syncthreads();"), std::string::npos);
  EXPECT_NE(source->code.find("if (lane == 0) {"), std::string::npos);

  // A whole tensor to a scalar: one row, one block.
  std::vector<kir::Kernel> all =
      kernelsOf("func @f(%x: f32[40,30]) -> f32[] {\n  %y = reduce_max(%x) {axes = []} : f32[]\n  return %y\n}\n");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_NE(kir::printKernel(all[0]).find("} schedule cuda: one row (256 threads per block, 256 per row)"),
            std::string::npos)
      << kir::printKernel(all[0]);
  source = codegen::emitCudaSource(all);
  ASSERT_TRUE(source.ok()) << source.error().str();
  EXPECT_EQ(source->launches[0].workItems, 256);
  // A float max of zero searches the row's first zero, whose sign the
  // sequential loop keeps (of -0 and +0 the first wins).
  EXPECT_NE(source->code.find("if (r0 == 0.0f) {"), std::string::npos) << source->code;
}

/// Short rows, columns and strided operands keep one thread per element:
/// a row schedule pays only when a warp's lanes read consecutive elements
/// of a long enough row.
TEST(CudaEmitterTest, OtherReductionsKeepOneThreadPerElement) {
  for (const char* text : {
           // 7 iterations: a warp would idle.
           "func @f(%x: f32[5,7]) -> f32[5] {\n  %y = reduce_sum(%x) {axes = [1]} : f32[5]\n  return %y\n}\n",
           // A column: consecutive iterations are 64 elements apart.
           "func @f(%x: f32[100,64]) -> f32[64] {\n  %y = reduce_sum(%x) {axes = [0]} : f32[64]\n  return %y\n}\n",
           // A matmul's right operand is read down its columns (f64: not
           // cuBLASLt's).
           "func @f(%x: f64[4,64], %w: f64[64,5]) -> f64[4,5] {\n  %y = matmul(%x, %w) : f64[4,5]\n  return %y\n}\n",
       }) {
    SCOPED_TRACE(text);
    std::vector<kir::Kernel> kernels = kernelsOf(text);
    ASSERT_FALSE(kernels.empty());
    for (const kir::Kernel& k : kernels) {
      EXPECT_EQ(k.schedule.threadsPerRow, 0) << kir::printKernel(k);
      EXPECT_EQ(kir::printKernel(k).find("per row"), std::string::npos);
    }
    auto source = codegen::emitCudaSource(kernels);
    ASSERT_TRUE(source.ok()) << source.error().str();
    EXPECT_EQ(source->code.find("__shfl_xor_sync"), std::string::npos);
  }
}

/// The code of kernel `name` in translation unit `code`.
std::string kernelCode(const std::string& code, const std::string& name) {
  const size_t begin = code.find(" " + name + "(");
  if (begin == std::string::npos) return "";
  return code.substr(begin, code.find("\n}\n", begin) - begin);
}

/// A plain elementwise map over f32 or i32 (store and loads at the flat
/// element index) takes 4 elements per thread step with float4/int4 loads
/// and stores, and a scalar tail; the schedule says `vector 4`, the launch
/// covers ceil(n / 4) steps, and each component is the scalar path's
/// expression. A broadcast operand or an i64 buffer keeps one element per
/// thread step.
TEST(CudaEmitterTest, PlainElementwiseMapsUseVectorLoadsAndStores) {
  std::vector<kir::Kernel> kernels = kernelsOf(
      "func @f(%x: f32[5,7,3], %y: f32[5,7,3], %b: f32[3], %k: i32[8], %l: i64[6]) -> (f32[5,7,3], f32[5,7,3], "
      "i32[8], i64[6]) {\n"
      "  %s = add(%x, %y) : f32[5,7,3]\n  %e = exp(%s) : f32[5,7,3]\n"
      "  %c = add(%x, %b) : f32[5,7,3]\n  %j = mul(%k, %k) : i32[8]\n  %m = neg(%l) : i64[6]\n"
      "  return %e, %c, %j, %m\n}\n");
  ASSERT_EQ(kernels.size(), 4u);
  for (kir::Kernel& k : kernels) codegen::scheduleForCuda(k);
  const std::vector<int> widths = {4, 0, 4, 0};
  for (size_t i = 0; i < kernels.size(); ++i) {
    EXPECT_EQ(kernels[i].schedule.vectorWidth, widths[i]) << kir::printKernel(kernels[i]);
    EXPECT_EQ(kir::printKernel(kernels[i]).find("(256 threads per block, vector 4)") != std::string::npos,
              widths[i] == 4)
        << kir::printKernel(kernels[i]);
  }
  auto source = codegen::emitCudaSource(kernels);
  ASSERT_TRUE(source.ok()) << source.error().str();
  ASSERT_EQ(source->launches.size(), 4u);

  // exp(x + y) over 105 elements: 26 vector steps, then element 104 alone.
  const std::string map = kernelCode(source->code, source->launches[0].name);
  EXPECT_EQ(source->launches[0].workItems, 27);
  EXPECT_NE(map.find("for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < 26LL; "
                     "q += (long long)gridDim.x * blockDim.x) {\n"
                     "    const float4 b0_v = reinterpret_cast<const float4*>(b0)[q];\n"
                     "    const float4 b1_v = reinterpret_cast<const float4*>(b1)[q];\n"
                     "    float4 stored;\n"
                     "    stored.x = expf((b0_v.x + b1_v.x));\n"
                     "    stored.y = expf((b0_v.y + b1_v.y));\n"
                     "    stored.z = expf((b0_v.z + b1_v.z));\n"
                     "    stored.w = expf((b0_v.w + b1_v.w));\n"
                     "    reinterpret_cast<float4*>(b2)[q] = stored;\n  }\n"),
            std::string::npos)
      << map;
  EXPECT_NE(map.find("for (long long t = 104LL + (long long)blockIdx.x * blockDim.x + threadIdx.x; t < 105LL; "),
            std::string::npos)
      << map;
  EXPECT_NE(map.find("b2[((i0 * 3LL) + i1)] = expf((b0[((i0 * 3LL) + i1)] + b1[((i0 * 3LL) + i1)]));"),
            std::string::npos)
      << map;

  // The broadcast add reads %b at another index: one element per step.
  const std::string broadcast = kernelCode(source->code, source->launches[1].name);
  EXPECT_EQ(source->launches[1].workItems, 105);
  EXPECT_EQ(broadcast.find("float4"), std::string::npos) << broadcast;
  EXPECT_NE(broadcast.find("t < 105LL;"), std::string::npos) << broadcast;

  // i32 * i32 over 8 elements: int4, no tail.
  const std::string ints = kernelCode(source->code, source->launches[2].name);
  EXPECT_EQ(source->launches[2].workItems, 2);
  EXPECT_NE(ints.find("const int4 b0_v = reinterpret_cast<const int4*>(b0)[q];"), std::string::npos) << ints;
  EXPECT_NE(ints.find("stored.w = kiln_imul(b0_v.w, b1_v.w);"), std::string::npos) << ints;
  EXPECT_EQ(ints.find("long long t ="), std::string::npos) << ints;

  // i64 elements are 8 bytes: one element per step.
  const std::string wide = kernelCode(source->code, source->launches[3].name);
  EXPECT_EQ(source->launches[3].workItems, 6);
  EXPECT_EQ(wide.find("long long q"), std::string::npos) << wide;

  // Row reductions are never vectorized.
  std::vector<kir::Kernel> sum =
      kernelsOf("func @f(%x: f32[3,64]) -> f32[3] {\n  %y = reduce_sum(%x) {axes = [1]} : f32[3]\n  return %y\n}\n");
  ASSERT_EQ(sum.size(), 1u);
  codegen::scheduleForCuda(sum[0]);
  EXPECT_EQ(sum[0].schedule.vectorWidth, 0);
}

TEST(CudaEmitterTest, CompileErrorCarriesNvrtcLogAndKernel) {
  auto nvrtc = cuda::loadNvrtc();
  ASSERT_TRUE(nvrtc.ok()) << nvrtc.error().str();
  const std::string source =
      "extern \"C\" __global__ void good(float* b0) { b0[0] = 1.0f; }\n"
      "extern \"C\" __global__ void broken(\n    float* b0) {\n  b0[0] = undeclared_name;\n}\n";
  auto binary = codegen::compileCudaSource(**nvrtc, source, "model.cu", 90);
  ASSERT_FALSE(binary.ok());
  const std::string message = binary.error().message();
  EXPECT_NE(message.find("NVRTC"), std::string::npos) << message;
  EXPECT_NE(message.find("failed to compile model.cu for sm_90 (NVRTC_ERROR_COMPILATION)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("model.cu(4): error: identifier \"undeclared_name\" is undefined (in kernel broken)"),
            std::string::npos)
      << message;
}

TEST(CudaEmitterTest, Architectures) {
  EXPECT_EQ(*codegen::parseCudaArch("sm_90"), 90);
  EXPECT_EQ(*codegen::parseCudaArch("sm_80"), 80);
  EXPECT_EQ(*codegen::parseCudaArch("sm_100"), 100);
  for (const char* bad : {"90", "sm90", "sm_", "sm_9", "compute_90", "sm_090", "sm_9x", "sm_1000", ""}) {
    auto arch = codegen::parseCudaArch(bad);
    ASSERT_FALSE(arch.ok()) << bad;
    EXPECT_NE(arch.error().message().find("expects a real GPU architecture such as sm_80 or sm_90, got '" +
                                          std::string(bad) + "'"),
              std::string::npos);
  }
  auto nvrtc = cuda::loadNvrtc();
  ASSERT_TRUE(nvrtc.ok()) << nvrtc.error().str();
  auto old = codegen::compileCudaSource(**nvrtc, "extern \"C\" __global__ void k() {}\n", "k.cu", 35);
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.error().message().find("cannot compile for sm_35; it supports "), std::string::npos)
      << old.error().str();
  EXPECT_NE(old.error().message().find("sm_90"), std::string::npos) << old.error().str();
}

TEST(CudaEmitterTest, CubinReaderRejectsGarbage) {
  EXPECT_EQ(codegen::countKernelsInCubin("", {"k"}), 0u);
  EXPECT_EQ(codegen::countKernelsInCubin("\x7f" "ELF not really an elf file at all, just text", {"k"}), 0u);
  std::string truncated = "\x7f" "ELF";
  truncated += std::string(60, '\xff');
  truncated[4] = 2;
  EXPECT_EQ(codegen::countKernelsInCubin(truncated, {"k"}), 0u);
}

}  // namespace
}  // namespace kiln
