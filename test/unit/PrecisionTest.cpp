// --precision (ir/Precision.h, docs/precision.md): the names, and a model
// compiled in bf16 by a session on the CPU JIT and on the emulated GPU
// against the same model on the interpreter in bf16 (the reference: the
// same casts, so only the order of the f32 sums differs) and in f32 (bf16's
// rounding, and not f32's result).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "driver/Session.h"
#include "ir/Builder.h"
#include "ir/Precision.h"
#include "ir/Printer.h"
#include "passes/TrainingStep.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

TEST(PrecisionTest, NamesParseAndPrint) {
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16, Precision::FP16}) {
    auto parsed = parsePrecision(precisionName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(*parsePrecision("bfloat16"), Precision::BF16);
  EXPECT_EQ(*parsePrecision("half"), Precision::FP16);
  auto bad = parsePrecision("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("expected fp32, tf32, bf16 or fp16"), std::string::npos);
  EXPECT_EQ(autocastDType(Precision::BF16), DType::BF16);
  EXPECT_EQ(autocastDType(Precision::FP16), DType::F16);
  EXPECT_FALSE(autocastDType(Precision::TF32));
}

/// A Linear with bias and GELU, then a padded convolution with bias and
/// relu: large enough for oneDNN to take both on the CPU.
constexpr const char* kModel = R"(
func @model(%x: f32[32,96], %w: f32[128,96], %b: f32[128], %c: f32[2,16,12,12], %k: f32[24,16,3,3], %kb: f32[24]) -> (f32[32,128], f32[2,24,12,12]) {
  %wt = transpose(%w) {perm = [1, 0]} : f32[96,128]
  %y = matmul(%x, %wt) : f32[32,128]
  %z = add(%y, %b) : f32[32,128]
  %g = gelu(%z) : f32[32,128]
  %v = conv(%c, %k, %kb) {pads = [1, 1, 1, 1]} : f32[2,24,12,12]
  %r = relu(%v) : f32[2,24,12,12]
  return %g, %r
}
)";

std::vector<Tensor> modelInputs() {
  return {test::randomF32({32, 96}, 1), test::randomF32({128, 96}, 2), test::randomF32({128}, 3),
          test::randomF32({2, 16, 12, 12}, 4), test::randomF32({24, 16, 3, 3}, 5), test::randomF32({24}, 6)};
}

/// `f` run by a session with `options` on `inputs`; the session's notices
/// go to `notices` when given.
std::optional<std::vector<Tensor>> sessionResults(const Function& f, const std::vector<Tensor>& inputs,
                                                  SessionOptions options, std::vector<std::string>* notices = nullptr) {
  auto created = Session::create(options);
  if (!std::holds_alternative<std::unique_ptr<Session>>(created)) {
    ADD_FAILURE() << std::get<DeviceError>(created).error.str();
    return std::nullopt;
  }
  auto& session = std::get<std::unique_ptr<Session>>(created);
  auto model = session->compile(f);
  if (!model.ok()) {
    ADD_FAILURE() << model.error().str();
    return std::nullopt;
  }
  auto results = (*model)->run(inputs);
  if (notices) *notices = session->takeNotices();
  if (!results.ok()) {
    ADD_FAILURE() << results.error().str();
    return std::nullopt;
  }
  return std::move(*results);
}

/// `f` run on `inputs` by a session on the emulated GPU in `precision`.
std::optional<std::vector<Tensor>> emulatedGpuResults(const Function& f, const std::vector<Tensor>& inputs,
                                                      Precision precision) {
  if (setenv("KILN_CUDA_DRIVER", test::emulatorDriverPath(), 1) != 0) {
    ADD_FAILURE() << "cannot set KILN_CUDA_DRIVER";
    return std::nullopt;
  }
  auto results = sessionResults(f, inputs, {.device = "cuda", .allowFallback = false, .precision = precision});
  unsetenv("KILN_CUDA_DRIVER");
  return results;
}

/// Whether this CPU computes bf16 (else the session computes in f32, with
/// the notice cpuPrecisionNotice gives).
bool cpuHasBf16() { return cpuPrecisionNotice(Precision::BF16).empty(); }

/// The largest |a - b| / max|b| over the elements.
double relativeError(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = test::elementsOf(a), y = test::elementsOf(b);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / scale;
}

/// The interpreter in bf16 and in f32: the reference of the tests below.
struct References {
  std::vector<Tensor> bf16, f32;
};

std::optional<References> references(const Function& f, const std::vector<Tensor>& inputs) {
  auto bf16 = sessionResults(f, inputs, {.interpret = true, .precision = Precision::BF16});
  auto f32 = sessionResults(f, inputs, {.interpret = true});
  if (!bf16 || !f32) return std::nullopt;
  return References{std::move(*bf16), std::move(*f32)};
}

/// `got` (bf16 on a backend) is the interpreter's bf16 result but for the
/// order of the f32 sums, and differs from f32 by bf16's rounding: more
/// than f32's, at most a few of bf16's 2^-8 relative steps.
void expectBf16(const std::vector<Tensor>& got, const References& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.bf16.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string what = where + " result " + std::to_string(i);
    test::expectClose(got[i], want.bf16[i], what + " against the interpreter's bf16", 1e-4, 1e-4);
    const double fromF32 = relativeError(got[i], want.f32[i]);
    EXPECT_GT(fromF32, 1e-5) << what << ": no bf16 rounding";
    EXPECT_LT(fromF32, 3e-2) << what << ": more than bf16's rounding from f32";
  }
}

TEST(PrecisionTest, Bf16OnTheCpuJitMatchesTheInterpreter) {
  auto m = test::parseVerified(kModel);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const std::vector<Tensor> inputs = modelInputs();
  auto want = references(f, inputs);
  ASSERT_TRUE(want);
  StepProfile profile;
  SessionOptions options{.allowFallback = false, .precision = Precision::BF16};
  options.cpu.profile = &profile;
  std::vector<std::string> notices;
  auto got = sessionResults(f, inputs, options, &notices);
  ASSERT_TRUE(got);
  if (!cpuHasBf16()) {
    // f32 compute, said once.
    ASSERT_EQ(notices.size(), 1u);
    EXPECT_NE(notices[0].find("computes in f32"), std::string::npos) << notices[0];
    for (size_t i = 0; i < got->size(); ++i) test::expectClose((*got)[i], want->f32[i], "f32 without BF16 instructions");
    return;
  }
  EXPECT_TRUE(notices.empty());
  expectBf16(*got, *want, "CPU JIT");
  // oneDNN computes both contractions with bf16 inputs.
  int bf16Calls = 0;
  for (const StepProfile::Entry& e : profile.entries)
    bf16Calls += e.what.find("onednn") != std::string::npos && e.what.find("bf16") != std::string::npos;
  EXPECT_EQ(bf16Calls, 2) << profile.format();
}

TEST(PrecisionTest, Bf16OnTheEmulatedGpuMatchesTheInterpreter) {
  KILN_REQUIRE_EMULATOR();
  auto m = test::parseVerified(kModel);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const std::vector<Tensor> inputs = modelInputs();
  auto want = references(f, inputs);
  ASSERT_TRUE(want);
  auto got = emulatedGpuResults(f, inputs, Precision::BF16);
  ASSERT_TRUE(got);
  expectBf16(*got, *want, "emulated GPU");
}

/// Two convolutions in a row: the cast of the first one's relu'd result to
/// bf16 (for the second) is the first library call's own store of its
/// result in bf16, not a kernel of its own, and rounds as the cast does. A
/// weight of infinity on a tap in the padding gives NaN there (0 * inf), in
/// the bf16 result too.
TEST(PrecisionTest, ALibraryCallStoresItsResultInBf16) {
  if (!cpuHasBf16())
    GTEST_SKIP() << "this CPU computes bf16 in f32 (no AVX-512 BF16 or AMX-BF16)";
  constexpr const char* kStack = R"(
func @stack(%c: f32[2,16,12,12], %k1: f32[16,16,3,3], %k2: f32[8,16,3,3]) -> f32[2,8,12,12] {
  %a = conv(%c, %k1) {pads = [1, 1, 1, 1]} : f32[2,16,12,12]
  %r = relu(%a) : f32[2,16,12,12]
  %b = conv(%r, %k2) {pads = [1, 1, 1, 1]} : f32[2,8,12,12]
  return %b
}
)";
  auto m = test::parseVerified(kStack);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  for (bool infiniteTap : {false, true}) {
    SCOPED_TRACE(infiniteTap ? "an infinite weight" : "finite weights");
    std::vector<Tensor> inputs = {test::randomF32({2, 16, 12, 12}, 1), test::randomF32({16, 16, 3, 3}, 2),
                                  test::randomF32({8, 16, 3, 3}, 3)};
    if (infiniteTap) inputs[1].setDouble(0, std::numeric_limits<double>::infinity());  // k1[0,0,0,0]
    auto want = sessionResults(f, inputs, {.interpret = true, .precision = Precision::BF16});
    StepProfile profile;
    SessionOptions options{.allowFallback = false, .precision = Precision::BF16};
    options.cpu.profile = &profile;
    auto got = sessionResults(f, inputs, options);
    ASSERT_TRUE(want && got);
    test::expectClose((*got)[0], (*want)[0], "the second convolution's result", 1e-4, 1e-4);
    for (const StepProfile::Entry& e : profile.entries)
      EXPECT_EQ(e.what.find("cast -> bf16[2,16,12,12]"), std::string::npos) << profile.format();
  }
}

/// An inference model's weights are cast once, at compile time, however
/// large (canonicalize's bound for casts): ViT-B/16's 51 weight casts took
/// 19 ms of each 150 ms bf16 run before. The folded constant is bf16,
/// rounded to nearest even.
TEST(PrecisionTest, AutocastFoldsTheCastOfALargeWeight) {
  Module m;
  Function& f = *m.addFunction("main");
  Value* x = f.addArgument(TensorType{DType::F32, staticShape({4, 2048})}, "x");
  DenseTensor w = DenseTensor::zeros(TensorType{DType::F32, staticShape({2048, 1024})});
  for (int64_t i = 0; i < w.numElements(); ++i) w.setDouble(i, 1.0 + static_cast<double>(i % 7) * 0x1p-9);
  Builder b(f);
  Value* weight = b.constant(std::move(w));
  auto y = b.value(OpKind::MatMul, {x, weight});
  ASSERT_TRUE(y.ok());
  b.ret({*y});
  ASSERT_TRUE(autocastModule(m, Precision::BF16).ok());
  int casts = 0;
  const DenseTensor* folded = nullptr;
  for (const auto& op : f.ops()) {
    casts += op->kind() == OpKind::Cast && op->operand(0) != x;
    if (op->kind() == OpKind::Constant) folded = &op->getTensor("value");
  }
  EXPECT_EQ(casts, 0) << print(m);
  ASSERT_NE(folded, nullptr);
  EXPECT_EQ(folded->type.dtype, DType::BF16);
  // bf16 steps by 2^-7 above 1: 1 + k 2^-9 rounds to the nearest step,
  // the ties (k = 2 and 6) to the even one.
  const double want[] = {1.0, 1.0, 1.0, 1.0 + 0x1p-7, 1.0 + 0x1p-7, 1.0 + 0x1p-7, 1.0 + 0x1p-6};
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(folded->getDouble(i), want[i]) << i;
}

/// tf32 is CUDA's: the CPU computes in f32, and says so once.
TEST(PrecisionTest, Tf32OnTheCpuIsF32WithANotice) {
  auto m = test::parseVerified(kModel);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const std::vector<Tensor> inputs = modelInputs();
  std::vector<std::string> notices;
  auto got = sessionResults(f, inputs, {.precision = Precision::TF32}, &notices);
  auto want = sessionResults(f, inputs, {.interpret = true});
  ASSERT_TRUE(got && want);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("no TF32"), std::string::npos) << notices[0];
  for (size_t i = 0; i < got->size(); ++i) test::expectClose((*got)[i], (*want)[i], "tf32 on the CPU");
}

// --- fp16 training: dynamic loss scaling -------------------------------------

constexpr const char* kMlp = R"(
func @mlp(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,4]) -> f32[8,4] {
  %h = matmul(%x, %w1) : f32[8,32]
  %r = relu(%h) : f32[8,32]
  %y = matmul(%r, %w2) : f32[8,4]
  return %y
}
)";

/// The MLP's SGD-with-momentum step with loss scaling, and its inputs: the
/// parameters random, the state at its defaults (the scale `initScale`).
struct ScaledStep {
  std::unique_ptr<Module> module;
  std::vector<Tensor> inputs;
  const Function& f() const { return *module->functions().front(); }
  /// Argument (and, shifted by the loss, result) index of `name`.
  size_t index(const std::string& name) const {
    for (size_t i = 0; i < f().numArguments(); ++i)
      if (f().argument(i)->name() == name) return i;
    ADD_FAILURE() << "no argument " << name;
    return 0;
  }
};

std::optional<ScaledStep> scaledStep(LossScaleConfig lossScale) {
  ScaledStep step{test::parseVerified(kMlp), {}};
  if (!step.module) return std::nullopt;
  Function& f = *step.module->functions().front();
  TrainingStepOptions options{LossConfig{LossKind::CrossEntropy}, OptimizerConfig{.momentum = 0.9}, std::nullopt};
  options.parameters = std::vector<std::string>{"w1", "w2"};
  options.lossScale = lossScale;
  if (Status built = buildTrainingStep(f, options); !built) {
    ADD_FAILURE() << built.error().str();
    return std::nullopt;
  }
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const std::string& name = f.argument(i)->name();
    if (name == "w1" || name == "w2" || name == "x") {
      step.inputs.push_back(test::randomF32(staticDims(f.argument(i)->type().shape), 10 + static_cast<int>(i)));
    } else if (name == "labels") {
      step.inputs.push_back(test::tensorOf(DType::I64, {8}, {0, 1, 2, 3, 3, 2, 1, 0}));
    } else if (name == "lr") {
      step.inputs.push_back(test::tensorOf(DType::F32, {}, {0.1}));
    } else {
      const DenseTensor* d = f.argumentDefault(i);
      if (!d) {
        ADD_FAILURE() << "argument " << name << " has no default";
        return std::nullopt;
      }
      step.inputs.push_back(Tensor::fromDense(*d));
    }
  }
  return step;
}

/// The step's arguments, results and their order: the scale and its count
/// of finite steps are state after the optimizer's, donated like it.
TEST(PrecisionTest, LossScaleIsStateOfTheStep) {
  auto step = scaledStep({});
  ASSERT_TRUE(step);
  const Function& f = step->f();
  const size_t scale = step->index("loss_scale"), growth = step->index("loss_scale_growth");
  EXPECT_EQ(growth, scale + 1);
  EXPECT_EQ(f.argumentDefault(scale)->getDouble(0), 65536.0);
  EXPECT_EQ(f.resultName(scale + 1), "loss_scale");
  EXPECT_EQ(f.resultName(growth + 1), "loss_scale_growth");
  EXPECT_EQ(trainingStepAliases(f).size(), f.resultTypes().size() - 1) << "every state result is donated";
}

/// A scale so large that the backward pass's f16 casts overflow: the step
/// is skipped (parameters and momentum kept bit for bit, the step counter
/// not advanced), the loss reported is the unscaled finite one, the scale
/// halves and the count of finite steps restarts. Then, at PyTorch's
/// initial scale, the emulated GPU's fp16 step matches the interpreter's
/// within 1e-2 on the loss and the weights, and the scale grows after
/// growthInterval finite steps.
TEST(PrecisionTest, Fp16LossScalingSkipsOverflowsAndMatchesTheInterpreter) {
  auto overflowing = scaledStep({.initScale = 0x1p60, .growthInterval = 2});
  ASSERT_TRUE(overflowing);
  const ScaledStep& o = *overflowing;
  auto skipped = sessionResults(o.f(), o.inputs, {.interpret = true, .precision = Precision::FP16});
  ASSERT_TRUE(skipped);
  const double loss = (*skipped)[0].getDouble(0);
  EXPECT_TRUE(std::isfinite(loss)) << loss;
  EXPECT_GT(loss, 0.1);
  for (const char* name : {"w1", "w2", "w1.momentum_buffer", "step"}) {
    const size_t i = o.index(name);
    test::expectClose((*skipped)[i + 1], o.inputs[i], std::string(name) + " after a skipped step", 0, 0);
  }
  EXPECT_EQ((*skipped)[o.index("loss_scale") + 1].getDouble(0), 0x1p59);
  EXPECT_EQ((*skipped)[o.index("loss_scale_growth") + 1].getDouble(0), 0.0);

  auto normal = scaledStep({.growthInterval = 2});
  ASSERT_TRUE(normal);
  ScaledStep& n = *normal;
  auto want = sessionResults(n.f(), n.inputs, {.interpret = true, .precision = Precision::FP16});
  ASSERT_TRUE(want);
  std::optional<std::vector<Tensor>> got;
  if (test::emulatorBuilt()) {
    got = emulatedGpuResults(n.f(), n.inputs, Precision::FP16);
    ASSERT_TRUE(got);
    EXPECT_NEAR((*got)[0].getDouble(0), (*want)[0].getDouble(0), 1e-2 * std::abs((*want)[0].getDouble(0)));
    for (const char* name : {"w1", "w2"})
      test::expectClose((*got)[n.index(name) + 1], (*want)[n.index(name) + 1], std::string(name) + " on the GPU",
                        1e-2, 1e-4);
  }
  // The step moved the weights, by about what f32 moves them.
  auto f32 = sessionResults(n.f(), n.inputs, {.interpret = true});
  ASSERT_TRUE(f32);
  const size_t w2 = n.index("w2");
  EXPECT_GT(relativeError((*want)[w2 + 1], n.inputs[w2]), 1e-4);
  test::expectClose((*want)[w2 + 1], (*f32)[w2 + 1], "w2 against f32", 1e-2, 1e-3);
  EXPECT_EQ((*want)[n.index("loss_scale") + 1].getDouble(0), 65536.0);
  EXPECT_EQ((*want)[n.index("loss_scale_growth") + 1].getDouble(0), 1.0);
  // A second finite step in a row: the scale doubles, the count restarts.
  std::vector<Tensor> next = n.inputs;
  for (size_t i = 0; i + 1 < want->size() && i < n.index("x"); ++i) next[i] = (*want)[i + 1];
  auto second = sessionResults(n.f(), next, {.interpret = true, .precision = Precision::FP16});
  ASSERT_TRUE(second);
  EXPECT_EQ((*second)[n.index("loss_scale") + 1].getDouble(0), 131072.0);
  EXPECT_EQ((*second)[n.index("loss_scale_growth") + 1].getDouble(0), 0.0);
}

}  // namespace
}  // namespace kiln
