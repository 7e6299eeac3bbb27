// --precision (ir/Precision.h, docs/precision.md): the names, and a model
// compiled in bf16 by a session on the CPU JIT and on the emulated GPU
// against the same model on the interpreter in bf16 (the reference: the
// same casts, so only the order of the f32 sums differs) and in f32 (bf16's
// rounding, and not f32's result).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "driver/Session.h"
#include "ir/Builder.h"
#include "ir/Precision.h"
#include "ir/Printer.h"
#include "runtime/HostCpu.h"
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
  const std::set<std::string> cpu = hostCpuFeatures();
  if (!cpu.count("avx512bf16") && !cpu.count("amx-bf16")) {
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
  ASSERT_EQ(setenv("KILN_CUDA_DRIVER", test::emulatorDriverPath(), 1), 0);
  auto got = sessionResults(f, inputs, {.device = "cuda", .allowFallback = false, .precision = Precision::BF16});
  unsetenv("KILN_CUDA_DRIVER");
  ASSERT_TRUE(got);
  expectBf16(*got, *want, "emulated GPU");
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

}  // namespace
}  // namespace kiln
