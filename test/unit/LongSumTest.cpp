// Long float sums on the CPU JIT (docs/codegen.md, "Long sums"): blocks of
// at most kSumBlock elements combined pairwise keep the error of a sum of
// 2^24 uniform floats near PyTorch's (5e-8 relative), where one f32
// accumulator per SIMD lane drifted to 1.2e-6; counts and indices are
// 64-bit, so 2^32 ones broadcast from a scalar sum exactly. Each case runs
// through CpuExecutor at -O3 and is compared with the float64 sum of the
// same f32 data. The sizes and seeds of the full sweep (2^20..2^28, five
// seeds) are in test/scripts/long-sums.py; these are the ones that keep
// ctest fast. The interpreter's reference is checked here too.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/KernelIR.h"
#include "codegen/Schedule.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

/// f32 uniform in [0, 1) from `seed`, and its exact-enough float64 sum
/// (compensated, so the reference's own error is ~1e-16).
struct Uniform {
  Tensor tensor;
  double sum = 0;
};

Uniform uniform(std::vector<int64_t> shape, unsigned seed) {
  Uniform u{Tensor(DType::F32, std::move(shape)), 0};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  auto* data = u.tensor.data<float>();
  double lost = 0;
  for (int64_t i = 0; i < u.tensor.numElements(); ++i) {
    data[i] = dist(rng);
    const double v = data[i], next = u.sum + v;
    lost += std::fabs(u.sum) >= std::fabs(v) ? (u.sum - next) + v : (v - next) + u.sum;
    u.sum = next;
  }
  u.sum += lost;
  return u;
}

std::unique_ptr<CpuExecutor> executorFor(const std::string& text, std::unique_ptr<Module>& module) {
  module = test::parseVerified(text, "sums.kir");
  if (!module) return nullptr;
  auto executor = CpuExecutor::create(*module->functions().front(), {.threads = 2, .optLevel = 3});
  EXPECT_TRUE(executor.ok()) << executor.error().str();
  return executor.ok() ? std::move(*executor) : nullptr;
}

double runScalar(CpuExecutor& executor, const std::vector<Tensor>& inputs, int64_t at = 0) {
  auto out = executor.run(inputs);
  EXPECT_TRUE(out.ok()) << out.error().str();
  if (!out.ok()) return std::nan("");
  return out->front().getDouble(at);
}

constexpr double kRelativeBound = 2e-7;

TEST(LongSumTest, SumOf2To24UniformFloatsIsWithin2e7OfTheFloat64Sum) {
  const int64_t n = int64_t{1} << 24;
  std::unique_ptr<Module> m;
  auto executor = executorFor("func @f(%x: f32[16777216]) -> f32[] {\n"
                              "  %s = reduce_sum(%x) {axes = []} : f32[]\n  return %s\n}\n",
                              m);
  ASSERT_NE(executor, nullptr);
  for (unsigned seed : {1u, 2u}) {
    const Uniform u = uniform({n}, seed);
    const double got = runScalar(*executor, {u.tensor});
    EXPECT_LE(std::fabs(got - u.sum) / u.sum, kRelativeBound) << "seed " << seed << ": " << got << " vs " << u.sum;
  }
}

TEST(LongSumTest, MeanOf2To24UniformFloatsIsWithin2e7OfTheFloat64Mean) {
  const int64_t n = int64_t{1} << 24;
  std::unique_ptr<Module> m;
  auto executor = executorFor("func @f(%x: f32[4096,4096]) -> f32[] {\n"
                              "  %s = reduce_mean(%x) {axes = []} : f32[]\n  return %s\n}\n",
                              m);
  ASSERT_NE(executor, nullptr);
  const Uniform u = uniform({4096, 4096}, 3);
  const double want = u.sum / static_cast<double>(n);
  const double got = runScalar(*executor, {u.tensor});
  EXPECT_LE(std::fabs(got - want) / want, kRelativeBound) << got << " vs " << want;
}

/// A mean divides by the count itself: 2^24 + 1 elements, one 0 and the
/// rest 1 (a sum of 2^24, exact), have the mean 2^24 / (2^24 + 1), whose
/// nearest f32 is 1 - 2^-24; a count rounded to f32 first (2^24) gave 1.
TEST(LongSumTest, MeanDividesByTheCountUnrounded) {
  std::unique_ptr<Module> m;
  auto executor = executorFor("func @f(%x: f32[16777217]) -> f32[] {\n"
                              "  %s = reduce_mean(%x) {axes = []} : f32[]\n  return %s\n}\n",
                              m);
  ASSERT_NE(executor, nullptr);
  Tensor x(DType::F32, {(int64_t{1} << 24) + 1});
  for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = i == 0 ? 0.0f : 1.0f;
  EXPECT_EQ(runScalar(*executor, {x}), 1.0 - std::ldexp(1.0, -24));
}

/// Rows (a reduction per result element, the threads splitting the rows)
/// and columns (the lanes along the kept axis, each summing a long column:
/// the column-wise emitter) of 2^22 elements each.
TEST(LongSumTest, LongRowsAndColumnsAreWithin2e7OfTheFloat64Sums) {
  {
    std::unique_ptr<Module> m;
    auto executor = executorFor("func @f(%x: f32[3,4194304]) -> f32[3] {\n"
                                "  %s = reduce_sum(%x) {axes = [1]} : f32[3]\n  return %s\n}\n",
                                m);
    ASSERT_NE(executor, nullptr);
    const Uniform u = uniform({3, int64_t{1} << 22}, 4);
    auto out = executor->run({u.tensor});
    ASSERT_TRUE(out.ok()) << out.error().str();
    const auto* x = u.tensor.data<float>();
    for (int64_t r = 0; r < 3; ++r) {
      double want = 0;
      for (int64_t k = 0; k < (int64_t{1} << 22); ++k) want += x[r * (int64_t{1} << 22) + k];
      const double got = out->front().getDouble(r);
      EXPECT_LE(std::fabs(got - want) / want, kRelativeBound) << "row " << r << ": " << got << " vs " << want;
    }
  }
  {
    std::unique_ptr<Module> m;
    auto executor = executorFor("func @f(%x: f32[1048576,16]) -> f32[16] {\n"
                                "  %s = reduce_sum(%x) {axes = [0]} : f32[16]\n  return %s\n}\n",
                                m);
    ASSERT_NE(executor, nullptr);
    const Uniform u = uniform({int64_t{1} << 20, 16}, 5);
    auto out = executor->run({u.tensor});
    ASSERT_TRUE(out.ok()) << out.error().str();
    const auto* x = u.tensor.data<float>();
    for (int64_t c = 0; c < 16; ++c) {
      double want = 0;
      for (int64_t k = 0; k < (int64_t{1} << 20); ++k) want += x[k * 16 + c];
      const double got = out->front().getDouble(c);
      EXPECT_LE(std::fabs(got - want) / want, kRelativeBound) << "column " << c << ": " << got << " vs " << want;
    }
  }
}

/// A sum of squares and the norm over it (ONNX ReduceSumSquare and
/// ReduceL2 become these), the square fused into the sum's kernel.
TEST(LongSumTest, FusedSumOfSquaresAndL2NormAreWithin2e7) {
  std::unique_ptr<Module> m;
  auto executor = executorFor("func @f(%x: f32[4194304]) -> (f32[], f32[]) {\n"
                              "  %q = mul(%x, %x) : f32[4194304]\n"
                              "  %s = reduce_sum(%q) {axes = []} : f32[]\n"
                              "  %n = sqrt(%s) : f32[]\n"
                              "  return %s, %n\n}\n",
                              m);
  ASSERT_NE(executor, nullptr);
  const Uniform u = uniform({int64_t{1} << 22}, 6);
  double want = 0;
  for (int64_t k = 0; k < u.tensor.numElements(); ++k) {
    const double v = u.tensor.data<float>()[k];
    want += v * v;
  }
  auto out = executor->run({u.tensor});
  ASSERT_TRUE(out.ok()) << out.error().str();
  EXPECT_LE(std::fabs(out->at(0).getDouble(0) - want) / want, kRelativeBound) << out->at(0).getDouble(0);
  EXPECT_LE(std::fabs(out->at(1).getDouble(0) - std::sqrt(want)) / std::sqrt(want), kRelativeBound);
}

/// 2^32 ones, broadcast from a scalar input inside the reduction's fused
/// kernel (never materialized: 16 GiB), sum to 2^32 exactly: every block
/// and every partial is an integer below 2^24 or a power of two. Before,
/// each lane's accumulator stopped growing at 2^24 (4228120600). The mean
/// divides by the count 2^32, exactly.
TEST(LongSumTest, TwoTo32OnesBroadcastFromAScalarSumExactly) {
  std::unique_ptr<Module> m;
  auto executor = executorFor("func @f(%x: f32[]) -> (f32[], f32[]) {\n"
                              "  %b = broadcast(%x) : f32[65536,65536]\n"
                              "  %s = reduce_sum(%b) {axes = []} : f32[]\n"
                              "  %m = reduce_mean(%b) {axes = []} : f32[]\n"
                              "  return %s, %m\n}\n",
                              m);
  ASSERT_NE(executor, nullptr);
  auto out = executor->run({test::tensorOf(DType::F32, {}, {1.0})});
  ASSERT_TRUE(out.ok()) << out.error().str();
  EXPECT_EQ(out->at(0).getDouble(0), 4294967296.0);
  EXPECT_EQ(out->at(1).getDouble(0), 1.0);
}

/// The blocking every emitter follows: short sums keep one accumulator; a
/// long innermost level is cut into blocks of kSumBlock; short inner levels
/// are kept whole and an outer one is cut.
TEST(LongSumTest, SumBlockingCutsTheOutermostLevelThatOverflowsABlock) {
  auto sum = [](std::vector<int64_t> extents, DType t = DType::F32) {
    return kir::reduce(kir::ReduceKind::Sum, 0, std::move(extents), kir::constant(t, 1.0));
  };
  EXPECT_FALSE(codegen::sumBlocking(*sum({codegen::kSumBlock})));
  EXPECT_FALSE(codegen::sumBlocking(*sum({1 << 20}, DType::I32)));
  EXPECT_FALSE(codegen::sumBlocking(*kir::reduce(kir::ReduceKind::Max, 0, {1 << 20}, kir::constant(DType::F32, 1))));
  auto longRow = codegen::sumBlocking(*sum({3, 1 << 20}));
  ASSERT_TRUE(longRow);
  EXPECT_EQ(longRow->level, 1u);
  EXPECT_EQ(longRow->chunk, codegen::kSumBlock);
  EXPECT_EQ(longRow->blocks, 3 * ((1 << 20) / codegen::kSumBlock));
  auto shortInner = codegen::sumBlocking(*sum({100000, 3, 5}));
  ASSERT_TRUE(shortInner);
  EXPECT_EQ(shortInner->level, 0u);
  EXPECT_EQ(shortInner->chunk, codegen::kSumBlock / 15);
  EXPECT_EQ(shortInner->chunks, (100000 + shortInner->chunk - 1) / shortInner->chunk);
  EXPECT_EQ(shortInner->levels, static_cast<int>(std::bit_width(static_cast<uint64_t>(shortInner->blocks))));
  auto twoTo32 = codegen::sumBlocking(*sum({65536, 65536}));
  ASSERT_TRUE(twoTo32);
  EXPECT_EQ(twoTo32->level, 1u);
  EXPECT_EQ(twoTo32->blocks, (int64_t{1} << 32) / codegen::kSumBlock);
}

/// The interpreter's reference sums f64 with compensation: 2^20 values
/// whose plain double sum drifts (1 and many tiny ones) come out exact.
TEST(LongSumTest, InterpreterSumsAreCompensated) {
  auto m = test::parseVerified("func @f(%x: f64[1048577]) -> f64[] {\n"
                               "  %s = reduce_sum(%x) {axes = []} : f64[]\n  return %s\n}\n",
                               "sums.kir");
  ASSERT_NE(m, nullptr);
  Tensor x(DType::F64, {(int64_t{1} << 20) + 1});
  x.setDouble(0, 1.0);
  // 2^-60 each: a plain double loop loses every one (1 + 2^-60 == 1).
  for (int64_t i = 1; i < x.numElements(); ++i) x.setDouble(i, std::ldexp(1.0, -60));
  auto out = interpret(*m->functions().front(), {x});
  ASSERT_TRUE(out.ok()) << out.error().str();
  EXPECT_EQ(out->front().getDouble(0), 1.0 + std::ldexp(1.0, -40));
}

}  // namespace
}  // namespace kiln
