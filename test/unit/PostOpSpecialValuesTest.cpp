// NaN, +-Inf, signed zeros, denormals and large values through every op
// that can follow a matmul or convolution, on the CPU JIT at -O3 (where
// select-library gives oneDNN the post-ops DnnlKernel::exactPostOp accepts),
// compared with the interpreter: NaN where the interpreter has NaN, the
// same infinities and signed zeros, finite values close. The products are
// built so that the value reaching the epilogue is exactly the special
// value fed in: a's first column holds the values and every other element
// is 0, b's (or w's) first row is 1 and the rest 0, so each result element
// is value * 1 plus zeros. The kernel text then says which ops oneDNN
// applied, so a post-op accepted as exact is checked as a post-op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "codegen/cpu/CpuExecutable.h"
#include "runtime/DnnlKernels.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

/// The values fed through each epilogue: one per row of the product.
const std::vector<float>& specialValues() {
  static const std::vector<float> values = {
      std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      0.0f,
      1.5f,
      -1.5f,
      1e-40f,   // denormal
      -1e-40f,
      100.0f,
      -100.0f,
      3e38f,  // near the largest float
      -3e38f,
      6.0f,
      -7.25f,
  };
  return values;
}

constexpr int64_t kK = 64;   // long enough for oneDNN (CpuTarget's kLibraryMinK)
constexpr int64_t kN = 16;   // result columns (matmul) or channels (conv)

/// Whether `got` is what the interpreter's `want` allows: NaN for NaN, the
/// same infinity, the same zero (its sign too), and for other numbers
/// 1e-5 relative plus 1e-6 absolute (a generated f32 erf GELU of -7 is -0
/// where the interpreter's, in double, is -1.5e-12).
bool sameSpecialValue(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isnan(got)) return false;
  if (std::isinf(want) || std::isinf(got)) return got == want;
  if (want == 0) return got == 0 && std::signbit(got) == std::signbit(want);
  return std::fabs(got - want) <= 1e-5f * std::fabs(want) + 1e-6f;
}

std::string show(float v) {
  if (v == 0) return std::signbit(v) ? "-0" : "+0";
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(v));
  return text;
}

/// Runs `f` (arguments: the special-valued a or x, then b or w, then any
/// operands filled by `fillOperand`) on the interpreter and the JIT at -O3
/// and compares every result element; returns the JIT's kernel text.
std::string expectSpecialMatches(const std::string& text, bool conv) {
  SCOPED_TRACE(text);
  auto m = test::parseVerified(text);
  if (!m) return {};
  const Function& f = *m->functions().front();
  const std::vector<float>& values = specialValues();
  const int64_t rows = static_cast<int64_t>(values.size());
  std::vector<Tensor> inputs;
  // a [rows, K] (matmul) or x [1, K, 1, rows] (conv): the values in the
  // first column or channel.
  Tensor a(DType::F32, conv ? std::vector<int64_t>{1, kK, 1, rows} : std::vector<int64_t>{rows, kK});
  for (int64_t i = 0; i < a.numElements(); ++i) a.setDouble(i, 0.0);
  for (int64_t r = 0; r < rows; ++r) a.setDouble(conv ? r : r * kK, values[static_cast<size_t>(r)]);
  // b [K, N] (matmul) or w [N, K, 1, 1] (conv): 1 from the first row or
  // input channel.
  Tensor b(DType::F32, conv ? std::vector<int64_t>{kN, kK, 1, 1} : std::vector<int64_t>{kK, kN});
  for (int64_t i = 0; i < b.numElements(); ++i) b.setDouble(i, 0.0);
  for (int64_t j = 0; j < kN; ++j) b.setDouble(conv ? j * kK : j, 1.0);
  inputs.push_back(std::move(a));
  inputs.push_back(std::move(b));
  // A tensor operand of a binary op: special values too, along the columns.
  for (size_t i = 2; i < f.numArguments(); ++i) {
    Tensor t(DType::F32, staticDims(f.argument(i)->type().shape));
    const std::vector<float> operand = {2.0f, std::numeric_limits<float>::quiet_NaN(), -0.0f, 0.0f,
                                        std::numeric_limits<float>::infinity(), -3.0f, 1e-40f, -5.0f};
    for (int64_t j = 0; j < t.numElements(); ++j) t.setDouble(j, operand[static_cast<size_t>(j) % operand.size()]);
    inputs.push_back(std::move(t));
  }
  auto want = interpret(f, inputs);
  EXPECT_TRUE(want.ok()) << want.error().str();
  auto executor = CpuExecutor::create(f, {.threads = 2, .optLevel = 3});
  EXPECT_TRUE(executor.ok()) << executor.error().str();
  if (!want || !executor) return {};
  auto got = (*executor)->run(inputs);
  EXPECT_TRUE(got.ok()) << got.error().str();
  if (!got) return {};
  const Tensor &g = got->front(), &w = want->front();
  EXPECT_EQ(g.shape(), w.shape());
  if (g.shape() != w.shape()) return {};
  const int64_t columns = conv ? kN : kN;
  int failures = 0;
  for (int64_t i = 0; i < w.numElements() && failures < 8; ++i) {
    const float gv = static_cast<float>(g.getDouble(i)), wv = static_cast<float>(w.getDouble(i));
    if (sameSpecialValue(gv, wv)) continue;
    ++failures;
    // Matmul results are [rows, N]; conv results [1, N, 1, rows].
    const int64_t row = conv ? i % rows : i / columns;
    ADD_FAILURE() << "element " << i << " (from " << show(values[static_cast<size_t>(row)]) << "): JIT " << show(gv)
                  << ", interpreter " << show(wv);
  }
  auto ir = (*executor)->kernelIR(inputs);
  EXPECT_TRUE(ir.ok());
  return ir ? *ir : std::string();
}

/// matmul(a, b) then `epilogue`, which reads %m and defines %y; `operand`
/// adds an argument %t of that type.
std::string matmulWith(const std::string& epilogue, const std::string& operand = "") {
  const std::string rows = std::to_string(specialValues().size());
  const std::string type = "f32[" + rows + "," + std::to_string(kN) + "]";
  return "func @f(%a: f32[" + rows + "," + std::to_string(kK) + "], %b: f32[" + std::to_string(kK) + "," +
         std::to_string(kN) + "]" + (operand.empty() ? "" : ", %t: " + operand) + ") -> " + type + " {\n" +
         "  %zero = constant() {value = dense<f32[]>[0.0]} : f32[]\n" +
         "  %six = constant() {value = dense<f32[]>[6.0]} : f32[]\n" +
         "  %c = constant() {value = dense<f32[]>[-2.5]} : f32[]\n" +
         "  %four = constant() {value = dense<f32[]>[4.0]} : f32[]\n" + "  %m = matmul(%a, %b) : " + type + "\n" +
         epilogue + "  return %y\n}\n";
}

std::string convWith(const std::string& epilogue, const std::string& operand = "") {
  const std::string rows = std::to_string(specialValues().size());
  const std::string type = "f32[1," + std::to_string(kN) + ",1," + rows + "]";
  return "func @f(%a: f32[1," + std::to_string(kK) + ",1," + rows + "], %b: f32[" + std::to_string(kN) + "," +
         std::to_string(kK) + ",1,1]" + (operand.empty() ? "" : ", %t: " + operand) + ") -> " + type + " {\n" +
         "  %zero = constant() {value = dense<f32[]>[0.0]} : f32[]\n" +
         "  %six = constant() {value = dense<f32[]>[6.0]} : f32[]\n" +
         "  %c = constant() {value = dense<f32[]>[-2.5]} : f32[]\n" +
         "  %four = constant() {value = dense<f32[]>[4.0]} : f32[]\n" + "  %m = conv(%a, %b) : " + type + "\n" +
         epilogue + "  return %y\n}\n";
}

struct Case {
  const char* epilogue;  // ops on %m ending in %y; T is the result type
  const char* postOps;   // what the kernel text shows oneDNN applying, or "" for no post-op
};

/// `text` with every "T" replaced by `type`.
std::string withType(std::string text, const std::string& type) {
  for (size_t at = text.find('T'); at != std::string::npos; at = text.find('T', at + type.size()))
    text.replace(at, 1, type);
  return text;
}

/// Each op after a product, alone and in the chains models have, matches
/// the interpreter on special values, whether oneDNN applies it (the
/// post-ops named) or a generated kernel does (ops refused as post-ops:
/// exp, log, erf GELU, binary max and min, a division that is no exact
/// product, a max or min of a zero and the chain). The relu of conv + relu
/// (the CNN's NaN became 0) and ReLU6's min are oneDNN's post-ops still,
/// guarded: these inputs hold NaN and infinities, so the exact variant runs
/// (relu as elu and an add, clips on the host). Where a refused op follows
/// (a second linear after a first, which oneDNN 2.6 would give the first's
/// parameters), select-library leaves the scalar ops before it to the same
/// generated kernel.
TEST(PostOpSpecialValuesTest, EveryEpilogueMatchesTheInterpreter) {
  const std::vector<Case> cases = {
      {"  %y = relu(%m) : T\n", "+ relu ("},
      {"  %y = max(%m, %zero) : T\n", "+ max ("},
      {"  %y = max(%zero, %m) : T\n", ""},
      {"  %r = max(%m, %zero) : T\n  %y = min(%r, %six) : T\n", "+ max, min ("},
      {"  %y = min(%m, %six) : T\n", "+ min ("},
      {"  %y = min(%six, %m) : T\n", "+ min ("},
      {"  %y = min(%zero, %m) : T\n", ""},
      {"  %y = max(%m, %c) : T\n", "+ max ("},
      {"  %r = relu(%m) : T\n  %s = min(%r, %six) : T\n  %y = relu(%s) : T\n", "+ relu, min, relu ("},
      {"  %y = tanh(%m) : T\n", "+ tanh ("},
      {"  %y = sigmoid(%m) : T\n", "+ sigmoid ("},
      {"  %y = exp(%m) : T\n", ""},
      {"  %y = log(%m) : T\n", ""},
      {"  %y = abs(%m) : T\n", "+ abs ("},
      {"  %y = sqrt(%m) : T\n", "+ sqrt ("},
      {"  %y = neg(%m) : T\n", "+ neg ("},
      {"  %n = neg(%m) : T\n  %y = relu(%n) : T\n", ""},
      {"  %y = gelu(%m) : T\n", ""},
      {"  %y = gelu(%m) {approximate = \"tanh\"} : T\n", "+ gelu_tanh ("},
      {"  %y = silu(%m) : T\n", "+ swish ("},
      {"  %y = add(%m, %c) : T\n", "+ add ("},
      {"  %y = sub(%m, %c) : T\n", "+ sub ("},
      {"  %y = sub(%c, %m) : T\n", "+ sub ("},
      {"  %y = mul(%m, %c) : T\n", "+ mul ("},
      {"  %y = div(%m, %four) : T\n", "+ div ("},
      {"  %y = div(%m, %c) : T\n", ""},
      {"  %s = mul(%m, %c) : T\n  %y = add(%s, %six) : T\n", ""},
      {"  %r = relu(%m) : T\n  %y = mul(%r, %c) : T\n", ""},
  };
  for (bool conv : {false, true}) {
    const std::string rows = std::to_string(specialValues().size());
    const std::string type = conv ? "f32[1," + std::to_string(kN) + ",1," + rows + "]"
                                  : "f32[" + rows + "," + std::to_string(kN) + "]";
    for (const Case& c : cases) {
      const std::string epilogue = withType(c.epilogue, type);
      const std::string ir = expectSpecialMatches(conv ? convWith(epilogue) : matmulWith(epilogue), conv);
      SCOPED_TRACE(epilogue);
      EXPECT_NE(ir.find("onednn"), std::string::npos) << ir;
      if (*c.postOps)
        EXPECT_NE(ir.find(c.postOps), std::string::npos) << ir;
      else
        EXPECT_EQ(ir.find("] + "), std::string::npos) << ir;
    }
  }
}

/// Tensor operands of binary post-ops hold special values too: add, sub,
/// mul and div are IEEE's on oneDNN; max and min (NaN in the product gives
/// the operand) stay generated.
TEST(PostOpSpecialValuesTest, BinaryOperandsMatchTheInterpreter) {
  const std::vector<Case> cases = {
      {"  %y = add(%m, %t) : T\n", "+ add ("},  {"  %y = sub(%m, %t) : T\n", "+ sub ("},
      {"  %y = mul(%m, %t) : T\n", "+ mul ("},  {"  %y = div(%m, %t) : T\n", "+ div ("},
      {"  %y = max(%m, %t) : T\n", ""},         {"  %y = min(%m, %t) : T\n", ""},
      {"  %s = add(%m, %t) : T\n  %y = relu(%s) : T\n", "+ add, relu ("},
  };
  const std::string rows = std::to_string(specialValues().size());
  const std::string type = "f32[" + rows + "," + std::to_string(kN) + "]";
  for (const Case& c : cases) {
    const std::string epilogue = withType(c.epilogue, type);
    const std::string ir = expectSpecialMatches(matmulWith(epilogue, "f32[" + std::to_string(kN) + "]"), false);
    SCOPED_TRACE(epilogue);
    if (*c.postOps)
      EXPECT_NE(ir.find(c.postOps), std::string::npos) << ir;
    else
      EXPECT_EQ(ir.find("] + "), std::string::npos) << ir;
  }
}

/// A matmul of at most PackedMatmul::kMaxRows rows by constant weights runs
/// on Kiln's own packed kernel (runtime/PackedMatmul.h), which applies relu,
/// tanh, sigmoid and scalar ops itself: they keep special values too (its
/// sigmoid of -inf was 4.5e-39, not 0). The kernel text names the oneDNN
/// call the step stands for either way.
TEST(PostOpSpecialValuesTest, PackedMatmulEpiloguesMatchTheInterpreter) {
  const std::vector<float>& all = specialValues();
  const std::vector<float> values(all.begin(), all.begin() + 8);
  std::string weights;
  for (int64_t i = 0; i < kK * kN; ++i) weights += std::string(i ? ", " : "") + (i < kN ? "1.0" : "0.0");
  const std::string type = "f32[8," + std::to_string(kN) + "]";
  const char* epilogues[] = {"  %y = relu(%m) : T\n", "  %y = tanh(%m) : T\n", "  %y = sigmoid(%m) : T\n",
                             "  %y = neg(%m) : T\n", "  %y = mul(%m, %c) : T\n", "  %y = add(%m, %c) : T\n"};
  for (const char* e : epilogues) {
    const std::string epilogue = withType(e, type);
    const std::string text = "func @f(%a: f32[8," + std::to_string(kK) + "]) -> " + type + " {\n" +
                             "  %b = constant() {value = dense<f32[" + std::to_string(kK) + "," + std::to_string(kN) +
                             "]>[" + weights + "]} : f32[" + std::to_string(kK) + "," + std::to_string(kN) + "]\n" +
                             "  %c = constant() {value = dense<f32[]>[-2.5]} : f32[]\n" + "  %m = matmul(%a, %b) : " +
                             type + "\n" + epilogue + "  return %y\n}\n";
    SCOPED_TRACE(text);
    auto m = test::parseVerified(text);
    ASSERT_NE(m, nullptr);
    const Function& f = *m->functions().front();
    Tensor a(DType::F32, {8, kK});
    for (int64_t i = 0; i < a.numElements(); ++i) a.setDouble(i, 0.0);
    for (int64_t r = 0; r < 8; ++r) a.setDouble(r * kK, values[static_cast<size_t>(r)]);
    const std::vector<Tensor> inputs = {a};
    auto want = interpret(f, inputs);
    ASSERT_TRUE(want.ok()) << want.error().str();
    auto executor = CpuExecutor::create(f, {.threads = 2, .optLevel = 3});
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    auto got = (*executor)->run(inputs);
    ASSERT_TRUE(got.ok()) << got.error().str();
    const Tensor &g = got->front(), &w = want->front();
    for (int64_t i = 0; i < w.numElements(); ++i) {
      const float gv = static_cast<float>(g.getDouble(i)), wv = static_cast<float>(w.getDouble(i));
      EXPECT_TRUE(sameSpecialValue(gv, wv)) << "element " << i << " (from " << show(values[static_cast<size_t>(i / kN)])
                                            << "): JIT " << show(gv) << ", interpreter " << show(wv);
    }
  }
}

/// A guarded call (relu or clip post-ops) runs oneDNN's max and min when its
/// operands bound the result below overflow, and the exact variant when a
/// NaN or infinity is among them or the bound is too large; both give the
/// IR's values. [4, 64] x [64, 16] + t, relu, min 6 and a 1x1 conv + relu.
TEST(PostOpSpecialValuesTest, GuardedPostOpsRunOneDnnsMaxOnlyOnBoundedValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (bool conv : {false, true}) {
    SCOPED_TRACE(conv ? "conv" : "matmul");
    constexpr int64_t rows = 4;
    LibraryCall call;
    PostOp add, relu, six;
    add.kind = PostOp::Kind::Add;
    add.name = "add";
    relu.name = "relu";
    six.kind = PostOp::Kind::Clip;
    six.alpha = -std::numeric_limits<float>::infinity();
    six.beta = 6.0f;
    six.name = "min";
    if (conv) {
      // x [1, K, 1, rows], w [N, K, 1, 1]: result [1, N, 1, rows].
      call.kind = LibraryCall::Kind::Conv;
      call.operands = {0, 1};
      call.operandDims = {{1, kK, 1, rows}, {kN, kK, 1, 1}};
      call.resultDims = {1, kN, 1, rows};
      call.resultBuffer = 2;
      call.strides = {1, 1};
      call.pads = {0, 0, 0, 0};
      call.dilations = {1, 1};
      call.postOps = {relu};
    } else {
      add.operand = 2;
      add.dims = {1, kN};
      call.kind = LibraryCall::Kind::MatMul;
      call.operands = {0, 1};
      call.operandDims = {{rows, kK}, {kK, kN}};
      call.resultDims = {rows, kN};
      call.resultBuffer = 3;
      call.postOps = {add, relu, six};
    }
    ASSERT_TRUE(DnnlKernel::exactCall(call).ok());
    auto kernel = DnnlKernel::create(call);
    ASSERT_TRUE(kernel.ok()) << kernel.error().str();
    EXPECT_NE((*kernel)->description().find(" guarded"), std::string::npos) << (*kernel)->description();
    std::vector<float> a(rows * kK), b(kK * kN), t(kN), y(rows * kN);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 37) % 19) * 0.25f - 2.0f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 11) % 7) * 0.125f - 0.375f;
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i % 5) - 2.0f;
    // The IR's values, in double: x at (r, k) and w at (k, n), wherever
    // the call keeps them.
    auto reference = [&](int64_t r, int64_t n) {
      double sum = 0;
      for (int64_t k = 0; k < kK; ++k)
        sum += static_cast<double>(conv ? a[k * rows + r] : a[r * kK + k]) *
               static_cast<double>(conv ? b[n * kK + k] : b[k * kN + n]);
      float v = static_cast<float>(sum);
      if (conv) return v > 0 || std::isnan(v) ? v : 0.0f;
      v += t[n];
      v = v > 0 || std::isnan(v) ? v : 0.0f;
      return std::isnan(v) ? v : std::min(v, 6.0f);
    };
    auto check = [&](const char* what, int64_t guarded, int64_t exact) {
      SCOPED_TRACE(what);
      void* buffers[] = {a.data(), b.data(), conv ? y.data() : t.data(), y.data()};
      std::fill(y.begin(), y.end(), 7.0f);
      ASSERT_TRUE((*kernel)->run(buffers).ok());
      EXPECT_EQ((*kernel)->guardedRuns(), guarded);
      EXPECT_EQ((*kernel)->exactRuns(), exact);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < kN; ++n) {
          const float got = y[static_cast<size_t>(conv ? n * rows + r : r * kN + n)], want = reference(r, n);
          EXPECT_TRUE(sameSpecialValue(got, want)) << "row " << r << " column " << n << ": " << show(got) << ", want "
                                                   << show(want);
        }
    };
    check("finite", 1, 0);
    // A NaN in x's row 1: that row is NaN, through the relu and the min.
    a[conv ? 1 : kK] = nan;
    check("a NaN", 1, 1);
    // Finite again, but 1e37 times weights summing to several: the bound
    // passes FLT_MAX / 16, so the exact variant runs (and the values,
    // which may overflow, are still the IR's).
    a[conv ? 1 : kK] = 1e37f;
    check("a large value", 1, 2);
    a[conv ? 1 : kK] = 1.0f;
    check("finite again", 2, 2);

    // Known bounds (the CPU runner passes on the result bound of the call
    // that computed x): the result's bound comes back, at least max|y|; a
    // known bound too large for the guard makes the call scan instead.
    void* buffers[] = {a.data(), b.data(), conv ? y.data() : t.data(), y.data()};
    const size_t result = static_cast<size_t>(call.resultBuffer);
    std::vector<double> bounds(result + 1, -1.0);
    ASSERT_TRUE((*kernel)->run(buffers, bounds).ok());
    EXPECT_EQ((*kernel)->guardedRuns(), 3);
    float largest = 0;
    for (float v : y) largest = std::max(largest, std::fabs(v));
    EXPECT_GE(bounds[result], largest);
    EXPECT_LE(bounds[result], conv ? 1e4 : 6.0 * (1 + 1e-5));  // a clip to 6 bounds the matmul's
    std::fill(bounds.begin(), bounds.end(), -1.0);
    bounds[0] = 1e37;  // x "at most 1e37": too large, so x is scanned
    ASSERT_TRUE((*kernel)->run(buffers, bounds).ok());
    EXPECT_EQ((*kernel)->guardedRuns(), 4);
    EXPECT_EQ((*kernel)->exactRuns(), 2);
    EXPECT_GE(bounds[result], largest);
  }
}

/// The post-ops refused as inexact are inexact on this oneDNN: fed to it
/// directly, each gives something other than the IR op on a special value.
/// (If a newer oneDNN fixes one, this test says so, and exactPostOp can
/// accept it.) A clip is refused alone too (oneDNN's turns NaN into its
/// lower bound), but a call with one is guarded (the test above), so no
/// kernel shows oneDNN's clip a NaN.
TEST(PostOpSpecialValuesTest, RefusedPostOpsDifferOnOneDnn) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Refused {
    PostOp::Kind kind;
    float alpha, beta;
    float input;
    bool (*differs)(float);
  };
  const std::vector<Refused> refused = {
      {PostOp::Kind::Exp, 0, 0, nan, [](float y) { return !std::isnan(y); }},
      {PostOp::Kind::Log, 0, 0, 1e-40f, [](float y) { return std::fabs(y - std::log(1e-40f)) > 1.0f; }},
      // (oneDNN 2.6 gave +0 for -100, where the IR has -0; 3.2 gives -0.)
      {PostOp::Kind::GeluErf, 0, 0, std::numeric_limits<float>::infinity(),
       [](float y) { return !(std::isinf(y) && y > 0); }},
  };
  for (const Refused& r : refused) {
    PostOp p;
    p.kind = r.kind;
    p.alpha = r.alpha;
    p.beta = r.beta;
    p.name = "refused";
    EXPECT_FALSE(DnnlKernel::exactPostOp(p).ok());
    // [1, K] x [K, N] with the input in a's first element and 1 in b's first row.
    LibraryCall call;
    call.kind = LibraryCall::Kind::MatMul;
    call.operands = {0, 1};
    call.operandDims = {{1, kK}, {kK, kN}};
    call.resultDims = {1, kN};
    call.resultBuffer = 2;
    call.postOps = {p};
    auto kernel = DnnlKernel::create(call);
    ASSERT_TRUE(kernel.ok()) << kernel.error().str();
    std::vector<float> a(kK, 0.0f), b(kK * kN, 0.0f), y(kN, 7.0f);
    a[0] = r.input;
    for (int64_t j = 0; j < kN; ++j) b[static_cast<size_t>(j)] = 1.0f;
    void* buffers[] = {a.data(), b.data(), y.data()};
    ASSERT_TRUE((*kernel)->run(buffers).ok());
    EXPECT_TRUE(r.differs(y[0])) << static_cast<int>(r.kind) << " of " << r.input << " gave " << show(y[0])
                                 << ": oneDNN computes it as the IR does now";
  }
  PostOp clip;
  clip.kind = PostOp::Kind::Clip;
  clip.beta = 6.0f;
  clip.name = "clip";
  EXPECT_FALSE(DnnlKernel::exactPostOp(clip).ok());
  // And the relu Kiln gives oneDNN (elu and an add) keeps NaN where
  // oneDNN's own relu (max(x, 0)) does not.
  PostOp relu;
  relu.name = "relu";
  EXPECT_TRUE(DnnlKernel::exactPostOp(relu).ok());
}

}  // namespace
}  // namespace kiln
