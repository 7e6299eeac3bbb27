// The CPU runtime's matmul of a few rows by a packed constant
// (runtime/PackedMatmul.h): every row count up to kMaxRows, k and n that are
// and are not multiples of the panel width, each post-op, any split of the
// panels among threads, panels swept either way, against a sum in double; which calls it takes; and
// through the CPU executor, where a constant b of a matmul with few rows
// (an LSTM's R^T at each time step) takes it instead of oneDNN.
#include "runtime/PackedMatmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "codegen/cpu/CpuExecutable.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

std::vector<float> randomFloats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

LibraryCall matmulCall(std::vector<int64_t> a, std::vector<int64_t> b, std::vector<int64_t> c) {
  LibraryCall call;
  call.kind = LibraryCall::Kind::MatMul;
  call.operands = {0, 1};
  call.operandDims = {std::move(a), std::move(b)};
  call.resultDims = std::move(c);
  call.resultBuffer = 2;
  return call;
}

PostOp eltwise(PostOp::Kind kind, const char* name, float alpha = 0, float beta = 0) {
  PostOp p;
  p.kind = kind;
  p.name = name;
  p.alpha = alpha;
  p.beta = beta;
  return p;
}

double apply(const PostOp& p, double x, double y) {
  switch (p.kind) {
    case PostOp::Kind::Relu: return x > 0 ? x : 0;
    case PostOp::Kind::Tanh: return std::tanh(x);
    case PostOp::Kind::Sigmoid: return 1 / (1 + std::exp(-x));
    case PostOp::Kind::Linear: return p.alpha * x + p.beta;
    case PostOp::Kind::Add: return x + y;
    case PostOp::Kind::Sub: return x - y;
    case PostOp::Kind::Mul: return x * y;
    case PostOp::Kind::Div: return x / y;
    default: ADD_FAILURE() << "no reference for post-op " << p.name; return x;
  }
}

/// a [m, k] x b [k, n] with `postOps` (binary ones read buffers from 2 on,
/// of the dims they give), computed by PackedMatmul split among `threads`
/// and compared with the same in double.
void expectMatches(int64_t m, int64_t k, int64_t n, std::vector<PostOp> postOps, int threads) {
  SCOPED_TRACE("m " + std::to_string(m) + " k " + std::to_string(k) + " n " + std::to_string(n) + ", " +
               std::to_string(postOps.size()) + " post-ops, " + std::to_string(threads) + " threads");
  std::mt19937 rng(static_cast<unsigned>(m * 1000003 + k * 1009 + n));
  std::vector<std::vector<float>> buffers = {randomFloats(static_cast<size_t>(m * k), rng),
                                             randomFloats(static_cast<size_t>(k * n), rng)};
  LibraryCall call = matmulCall({m, k}, {k, n}, {m, n});
  for (PostOp& p : postOps) {
    if (!p.isBinary()) continue;
    p.operand = static_cast<int>(buffers.size());
    int64_t size = 1;
    for (int64_t d : p.dims) size *= d;
    std::vector<float> data = randomFloats(static_cast<size_t>(size), rng);
    // Divisors away from 0.
    if (p.kind == PostOp::Kind::Div)
      for (float& x : data) x = x < 0 ? x - 0.5f : x + 0.5f;
    buffers.push_back(std::move(data));
  }
  call.postOps = postOps;
  call.resultBuffer = static_cast<int>(buffers.size());
  buffers.emplace_back(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(PackedMatmul::accepts(call));
  auto packed = PackedMatmul::create(call, PackedMatmul::pack(buffers[1].data(), k, n));
  ASSERT_TRUE(packed.ok()) << packed.error().str();
  std::vector<void*> pointers;
  for (std::vector<float>& b : buffers) pointers.push_back(b.data());
  // Twice: a thread sweeps its panels the other way at every call.
  for (int call = 0; call < 2; ++call) {
    std::vector<float>& c = buffers.back();
    std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
    for (int t = 0; t < threads; ++t) (*packed)->run(pointers.data(), t, threads);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double x = 0;
        for (int64_t l = 0; l < k; ++l) x += double(buffers[0][i * k + l]) * buffers[1][l * n + j];
        for (const PostOp& p : postOps) {
          double y = 0;
          if (p.isBinary()) {
            const int64_t rows = p.dims[0], cols = p.dims[1];
            y = buffers[static_cast<size_t>(p.operand)][(rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j)];
          }
          x = apply(p, x, y);
        }
        ASSERT_NEAR(c[i * n + j], x, 2e-5 + 2e-5 * std::fabs(x)) << "element [" << i << "," << j << "], call " << call;
      }
  }
}

PostOp binary(PostOp::Kind kind, const char* name, std::vector<int64_t> dims) {
  PostOp p = eltwise(kind, name);
  p.dims = std::move(dims);
  return p;
}

TEST(PackedMatmulTest, EveryRowCountAndPanelEdgeMatchesDouble) {
  for (int64_t m = 1; m <= PackedMatmul::kMaxRows; ++m)
    for (int64_t k : {1, 7, 64, 256})
      for (int64_t n : {1, 5, 64, 100, 129, 1024}) expectMatches(m, k, n, {}, 1);
}

TEST(PackedMatmulTest, AnySplitAmongThreadsComputesEveryPanel) {
  for (int threads : {2, 3, 5, 40}) {
    expectMatches(1, 256, 1024, {}, threads);
    expectMatches(3, 33, 200, {}, threads);
  }
}

TEST(PackedMatmulTest, PostOpsMatchDouble) {
  using K = PostOp::Kind;
  const int64_t m = 3, k = 40, n = 70;
  expectMatches(m, k, n, {binary(K::Add, "add", {1, n})}, 2);
  expectMatches(m, k, n, {binary(K::Add, "add", {m, n})}, 2);
  expectMatches(m, k, n, {binary(K::Sub, "sub", {m, 1}), binary(K::Mul, "mul", {1, 1})}, 2);
  expectMatches(m, k, n, {binary(K::Div, "div", {1, n})}, 2);
  expectMatches(m, k, n, {eltwise(K::Linear, "mul", 0.5f, -0.25f), eltwise(K::Relu, "relu")}, 2);
  expectMatches(m, k, n, {binary(K::Add, "add", {1, n}), eltwise(K::Tanh, "tanh")}, 2);
  expectMatches(m, k, n, {binary(K::Add, "add", {m, n}), eltwise(K::Sigmoid, "sigmoid")}, 2);
  // An LSTM step: h R^T + the input projection of this step.
  expectMatches(1, 256, 1024, {binary(K::Add, "add", {1, 1024})}, 2);
  expectMatches(2, 256, 768, {binary(K::Add, "add", {2, 768}), eltwise(K::Tanh, "tanh")}, 2);
}

TEST(PackedMatmulTest, ActivationsKeepNaNAndSaturate) {
  // [1,1] x a row of 16 ones: every result element is a's value.
  const int64_t n = 16;
  const std::vector<float> ones(n, 1.0f);
  auto weights = PackedMatmul::pack(ones.data(), 1, n);
  const float inf = std::numeric_limits<float>::infinity();
  for (PostOp p : {eltwise(PostOp::Kind::Relu, "relu"), eltwise(PostOp::Kind::Tanh, "tanh"),
                   eltwise(PostOp::Kind::Sigmoid, "sigmoid")}) {
    SCOPED_TRACE(p.name);
    LibraryCall call = matmulCall({1, 1}, {1, n}, {1, n});
    call.postOps = {p};
    auto packed = PackedMatmul::create(call, weights);
    ASSERT_TRUE(packed.ok());
    for (float x : {std::numeric_limits<float>::quiet_NaN(), -0.0f, 0.0f, 1e-30f, 1e-3f, -0.6f, 0.7f, 3.0f, -5.0f,
                    20.0f, -90.0f, 89.0f, 100.0f, -100.0f, inf, -inf}) {
      std::vector<float> a = {x}, c(n);
      void* buffers[] = {a.data(), const_cast<float*>(ones.data()), c.data()};
      (*packed)->run(buffers, 0, 1);
      const double want = p.kind == PostOp::Kind::Relu   ? (std::isnan(x) || x > 0 ? x : 0.0)
                          : p.kind == PostOp::Kind::Tanh ? std::tanh(double(x))
                                                         : 1 / (1 + std::exp(-double(x)));
      for (int64_t j = 0; j < n; ++j) {
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(c[j])) << "a = " << x;
        } else if (std::isinf(want)) {
          EXPECT_EQ(c[j], want) << "a = " << x;
        } else {
          EXPECT_NEAR(c[j], want, 1e-6 + 2e-6 * std::fabs(want)) << "a = " << x;
          if (want == 0 && p.kind == PostOp::Kind::Relu) {
            EXPECT_FALSE(std::signbit(c[j])) << "a = " << x;
          }
        }
      }
    }
  }
}

TEST(PackedMatmulTest, TakesFewRowsByAnUnbatchedB) {
  EXPECT_TRUE(PackedMatmul::accepts(matmulCall({1, 256}, {256, 1024}, {1, 1024})));
  EXPECT_TRUE(PackedMatmul::accepts(matmulCall({2, 4, 64}, {64, 10}, {2, 4, 10})));  // 8 rows
  EXPECT_TRUE(PackedMatmul::accepts(matmulCall({64}, {64, 10}, {10})));
  EXPECT_TRUE(PackedMatmul::accepts(matmulCall({1, 3, 64}, {1, 64, 10}, {1, 3, 10})));
  EXPECT_FALSE(PackedMatmul::accepts(matmulCall({9, 64}, {64, 10}, {9, 10})));
  EXPECT_FALSE(PackedMatmul::accepts(matmulCall({2, 3, 64}, {2, 64, 10}, {2, 3, 10})));  // b has a batch
  EXPECT_FALSE(PackedMatmul::accepts(matmulCall({3, 64}, {64}, {3})));                    // b is a column
  LibraryCall exp = matmulCall({1, 64}, {64, 10}, {1, 10});
  exp.postOps = {eltwise(PostOp::Kind::Exp, "exp")};
  EXPECT_FALSE(PackedMatmul::accepts(exp));
  LibraryCall max = matmulCall({1, 64}, {64, 10}, {1, 10});
  max.postOps = {binary(PostOp::Kind::Max, "max", {1, 10})};
  max.postOps[0].operand = 2;
  max.resultBuffer = 3;
  EXPECT_FALSE(PackedMatmul::accepts(max));
  LibraryCall column = matmulCall({2, 64}, {64, 10}, {2, 10});
  column.postOps = {binary(PostOp::Kind::Add, "add", {2, 3, 10})};  // not the result's rank
  EXPECT_FALSE(PackedMatmul::accepts(column));
}

/// An LSTM with hidden 64 (its step's h R^T is [1,64]x[64,256], a library
/// call with a constant b) on the CPU executor at batch 1 and 3, against the
/// interpreter; the profile names the packed matmul.
TEST(PackedMatmulTest, LstmStepsTakeItOnTheCpuExecutor) {
  for (int batch : {1, 3}) {
    const std::string b = std::to_string(batch);
    std::mt19937 rng(5);
    auto constant = [&](const std::string& name, std::vector<int64_t> dims) {
      std::uniform_real_distribution<float> u(-0.3f, 0.3f);
      std::string text = "  %" + name + " = constant() {value = dense<f32[";
      int64_t size = 1;
      for (size_t i = 0; i < dims.size(); ++i) {
        text += (i ? "," : "") + std::to_string(dims[i]);
        size *= dims[i];
      }
      text += "]>[";
      for (int64_t i = 0; i < size; ++i) text += (i ? ", " : "") + std::to_string(u(rng));
      std::string type = "f32[";
      for (size_t i = 0; i < dims.size(); ++i) type += (i ? "," : "") + std::to_string(dims[i]);
      return text + "]} : " + type + "]\n";
    };
    const std::string text =
        "func @f(%x: f32[6," + b + ",16], %h: f32[2," + b + ",64], %c: f32[2," + b + ",64]) -> (f32[6,2," + b +
        ",64], f32[2," + b + ",64], f32[2," + b + ",64]) {\n" + constant("w", {2, 256, 16}) +
        constant("r", {2, 256, 64}) + constant("bias", {2, 512}) + "  %y, %yh, %yc = lstm(%x, %w, %r, %bias, %h, %c) " +
        "{direction = \"bidirectional\", hidden_size = 64} : f32[6,2," + b + ",64], f32[2," + b + ",64], f32[2," + b +
        ",64]\n  return %y, %yh, %yc\n}\n";
    SCOPED_TRACE("batch " + b);
    auto module = test::parseVerified(text);
    ASSERT_TRUE(module);
    const Function& f = *module->functions().front();
    std::vector<Tensor> inputs = {test::randomF32({6, batch, 16}, 1), test::randomF32({2, batch, 64}, 2),
                                  test::randomF32({2, batch, 64}, 3)};
    auto want = interpret(f, inputs);
    ASSERT_TRUE(want.ok()) << want.error().str();
    StepProfile profile;
    auto executor = codegen::CpuExecutor::create(f, {.threads = 2, .profile = &profile});
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    auto got = (*executor)->run(inputs);
    ASSERT_TRUE(got.ok()) << got.error().str();
    ASSERT_EQ(got->size(), want->size());
    for (size_t r = 0; r < want->size(); ++r) test::expectClose((*got)[r], (*want)[r], "result " + std::to_string(r));
    int packed = 0;
    for (const StepProfile::Entry& e : profile.entries) packed += e.what.rfind("packed matmul [" + b + ",64]x[64,256]", 0) == 0;
    // h R^T at each of the 6 steps of both directions.
    EXPECT_EQ(packed, 12) << "packed matmul steps";
  }
}

}  // namespace
}  // namespace kiln
