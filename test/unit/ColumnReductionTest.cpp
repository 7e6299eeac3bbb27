// Reductions over outer or strided axes on the CPU JIT, against the
// interpreter: a bias gradient's column sums ([R, C] -> [C]), a batch
// norm's per-channel statistics over N, H, W of NCHW, and SGD with
// momentum's update fused with its bias-gradient sum. The lowering cuts a
// result of one row into runs the threads share (rowRun), merges adjacent
// reduced axes into one reduction level, and the emitter sums columns with
// vectors of lanes (one accumulator pass per distinct reduction in a
// store); these check the values on the shapes at the edges of those
// schedules: one row, rows and columns not a multiple of the vector width
// or of the runs, very long columns (blocked sums), NaN and infinities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codegen/Lowering.h"
#include "codegen/cpu/CpuExecutable.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

std::string dims(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s;
}

std::string axesText(const std::vector<int64_t>& axes) { return "[" + dims(axes) + "]"; }

/// The function `op` of `x: f32[in]` over `axes` into f32[out].
std::string reduceFunction(const std::string& op, const std::vector<int64_t>& in, const std::vector<int64_t>& axes,
                           bool keepdims, const std::vector<int64_t>& out) {
  const std::string outType = "f32[" + dims(out) + "]";
  return "func @f(%x: f32[" + dims(in) + "]) -> " + outType + " {\n  %y = " + op + "(%x) {axes = " +
         axesText(axes) + ", keepdims = " + (keepdims ? "true" : "false") + "} : " + outType +
         "\n  return %y\n}\n";
}

/// Runs `text` on the JIT at -O3 with 2 threads and on the interpreter, and
/// compares every result (NaN where the interpreter has NaN, equal
/// infinities, else within atol + rtol * |value|; a sum of n values of
/// either sign in [-1, 1) cancels, so its error is bounded by n, not by the
/// sum: `atol` is about 4e-8 n).
void expectMatchesInterpreter(const std::string& text, const std::vector<Tensor>& inputs, double rtol = 1e-5,
                              double atol = 1e-5) {
  SCOPED_TRACE(text);
  auto m = test::parseVerified(text);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto want = test::interpretedResults(f, inputs);
  ASSERT_TRUE(want);
  auto got = test::cpuJitResults(f, inputs, 3);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < want->size(); ++i)
    test::expectClose((*got)[i], (*want)[i], "result " + std::to_string(i), rtol, atol);
}

/// Values in [-1, 1) (products: [0.9, 1.1), so that long columns stay finite).
Tensor values(const std::vector<int64_t>& shape, unsigned seed, bool nearOne = false) {
  Tensor t(DType::F32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(nearOne ? 0.9f : -1.0f, nearOne ? 1.1f : 1.0f);
  for (int64_t i = 0; i < t.numElements(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

/// The absolute tolerance of a sum of n values of either sign in [-1, 1).
double cancellation(int64_t n) { return std::max(1e-5, 4e-8 * static_cast<double>(n)); }

TEST(ColumnReductionTest, RowRunCutsOneLongRowOnly) {
  EXPECT_EQ(codegen::rowRun(1, 1024), 128);   // 8 runs of 8 vectors
  EXPECT_EQ(codegen::rowRun(1, 256), 64);     // at least 4 vectors a run
  EXPECT_EQ(codegen::rowRun(1, 768), 96);
  EXPECT_EQ(codegen::rowRun(1, 1000), 125);   // no multiple of 16 divides it: 8 runs of 125
  EXPECT_EQ(codegen::rowRun(1, 127), 127);    // shorter than two runs
  EXPECT_EQ(codegen::rowRun(1, 4099), 4099);  // prime: no cut
  EXPECT_EQ(codegen::rowRun(2, 1024), 1024);  // two rows: the threads have rows
  EXPECT_EQ(codegen::rowRun(1, 1 << 20), 131072);
}

/// A bias gradient's kernel, [1024 rows, 1024] -> [1024], was one iteration
/// of the parallel loop (one thread summed everything); now 8.
TEST(ColumnReductionTest, ColumnSumOfOneResultRowIsSplitAcrossThreads) {
  auto m = test::parseVerified(reduceFunction("reduce_sum", {1024, 1024}, {0}, false, {1024}));
  ASSERT_TRUE(m);
  const Op* op = nullptr;
  for (const auto& o : m->functions().front()->ops())
    if (o->kind() == OpKind::ReduceSum) op = o.get();
  ASSERT_NE(op, nullptr);
  auto kernel = codegen::lowerOpToKernel(*op, "k");
  ASSERT_TRUE(kernel.ok()) << kernel.error().str();
  EXPECT_EQ(kernel->parallelExtent(), 8);
}

TEST(ColumnReductionTest, ColumnReductionsMatchTheInterpreter) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 1024}, {7, 1024}, {256, 1024}, {33, 1000}, {300, 17},
                                                    {5, 130},  {2, 4099}, {4099, 48}, {64, 768}};
  unsigned seed = 1;
  for (const auto& shape : shapes)
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"}) {
      const bool prod = std::string(op) == "reduce_prod";
      expectMatchesInterpreter(reduceFunction(op, shape, {0}, false, {shape[1]}), {values(shape, seed++, prod)},
                               prod ? 1e-4 : 1e-5, cancellation(shape[0]));
    }
}

/// A one-row result with leading dims of size 1 (a global average pool
/// channels last, [1, 7, 7, 512] -> [1, 512]; [1, 49, 512] -> [1, 1, 512]):
/// its row is cut into runs, and the leading dims' index stays 0. Before
/// the fix it was the run's number, and ResNet-18's logits read past the
/// input (NaN or garbage).
TEST(ColumnReductionTest, OneRowResultsWithLeadingUnitDimsMatchTheInterpreter) {
  unsigned seed = 100;
  for (const char* op : {"reduce_mean", "reduce_sum", "reduce_max"}) {
    expectMatchesInterpreter(reduceFunction(op, {1, 7, 7, 512}, {1, 2}, false, {1, 512}),
                             {values({1, 7, 7, 512}, seed++, false)}, 1e-5, cancellation(49));
    expectMatchesInterpreter(reduceFunction(op, {1, 49, 512}, {1}, true, {1, 1, 512}),
                             {values({1, 49, 512}, seed++, false)}, 1e-5, cancellation(49));
  }
}

/// Columns longer than a block of a long sum (kSumBlock = 2048 rows), each
/// lane summing blocks combined pairwise: within 2e-7 of the float64 sum,
/// as LongSumTest's long columns.
TEST(ColumnReductionTest, VeryLongColumnsKeepTheBlockedSumsAccuracy) {
  const int64_t rows = (int64_t{1} << 17) + 5, cols = 1024;
  auto m = test::parseVerified(reduceFunction("reduce_sum", {rows, cols}, {0}, false, {cols}));
  ASSERT_TRUE(m);
  auto executor = CpuExecutor::create(*m->functions().front(), {.threads = 2, .optLevel = 3});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  Tensor x(DType::F32, {rows, cols});
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = dist(rng);
  auto out = (*executor)->run({x});
  ASSERT_TRUE(out.ok()) << out.error().str();
  for (int64_t c = 0; c < cols; c += 37) {
    double want = 0;
    for (int64_t r = 0; r < rows; ++r) want += x.data<float>()[r * cols + c];
    EXPECT_LE(std::fabs(out->front().getDouble(c) - want) / want, 2e-7) << "column " << c;
  }
}

/// NaN in a column makes its sum, mean, max and min NaN; +inf and -inf in
/// one column sum to NaN; a column of +inf sums to +inf; the columns next
/// to them (the same vectors of lanes) stay finite.
TEST(ColumnReductionTest, NanAndInfinityPropagateThroughTheirColumnOnly) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const int64_t rows : {1, 9, 3000}) {
    const int64_t cols = 1024;
    Tensor x = values({rows, cols}, 11);
    auto* d = x.data<float>();
    d[(rows / 2) * cols + 3] = nan;  // column 3: NaN
    d[0 * cols + 600] = inf;         // column 600: +inf and -inf (NaN when both)
    d[(rows - 1) * cols + 600] = -inf;
    for (int64_t r = 0; r < rows; ++r) d[r * cols + 1023] = inf;  // column 1023: all +inf
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"})
      expectMatchesInterpreter(reduceFunction(op, {rows, cols}, {0}, false, {cols}), {x}, 1e-5, cancellation(rows));
  }
}

/// A batch norm's statistics over N, H, W of NCHW tensors, keepdims or
/// not, spatial sizes that are and are not multiples of 16 (56x56: 3136
/// contiguous elements per image and channel, 7x7: 49), and a fused mean of
/// squares.
TEST(ColumnReductionTest, PerChannelReductionsOverNhwMatchTheInterpreter) {
  unsigned seed = 20;
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {4, 8, 56, 56}, {32, 16, 7, 7}, {3, 5, 7, 9}, {1, 64, 14, 14}, {2, 3, 1, 1}}) {
    const std::vector<int64_t> kept = {1, shape[1], 1, 1}, flat = {shape[1]};
    const double atol = cancellation(shape[0] * shape[2] * shape[3]);
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max"}) {
      expectMatchesInterpreter(reduceFunction(op, shape, {0, 2, 3}, true, kept), {values(shape, seed++)}, 1e-5, atol);
      expectMatchesInterpreter(reduceFunction(op, shape, {0, 2, 3}, false, flat), {values(shape, seed++)}, 1e-5, atol);
    }
    const std::string t = "f32[" + dims(shape) + "]";
    expectMatchesInterpreter("func @f(%x: " + t + ") -> f32[" + dims(kept) + "] {\n  %q = mul(%x, %x) : " + t +
                                 "\n  %m = reduce_mean(%q) {axes = [0, 2, 3], keepdims = true} : f32[" + dims(kept) +
                                 "]\n  return %m\n}\n",
                             {values(shape, seed++)});
  }
  // Adjacent reduced axes in other places: the last two, the first two, all.
  const std::vector<int64_t> shape = {6, 10, 12, 20};
  expectMatchesInterpreter(reduceFunction("reduce_sum", shape, {2, 3}, false, {6, 10}), {values(shape, 30)});
  expectMatchesInterpreter(reduceFunction("reduce_sum", shape, {0, 1}, false, {12, 20}), {values(shape, 31)});
  expectMatchesInterpreter(reduceFunction("reduce_max", shape, {0, 1, 3}, true, {1, 1, 12, 1}), {values(shape, 32)});
  expectMatchesInterpreter(reduceFunction("reduce_sum", shape, {}, false, {}), {values(shape, 33)});
  // A fused operand read at the run's offset (one level) and one that is
  // not (a broadcast bias indexed by the last axis: one level per axis).
  expectMatchesInterpreter("func @f(%x: f32[6,10,12,20], %b: f32[20]) -> (f32[6,10], f32[6,10]) {\n"
                           "  %q = mul(%x, %x) : f32[6,10,12,20]\n"
                           "  %s = reduce_sum(%q) {axes = [2, 3], keepdims = false} : f32[6,10]\n"
                           "  %y = mul(%x, %b) : f32[6,10,12,20]\n"
                           "  %t = reduce_sum(%y) {axes = [2, 3], keepdims = false} : f32[6,10]\n"
                           "  return %s, %t\n}\n",
                           {values(shape, 34), values({20}, 35)});
}

/// SGD with momentum on a bias: the new momentum and the new parameter both
/// read the column sum of the gradient (split-fused-results computes it
/// once), the update is elementwise over one row (cut into runs), and the
/// sum appears twice in the new momentum's expression (`select(first, g,
/// m * 0.9 + g)`).
TEST(ColumnReductionTest, FusedMomentumUpdateOfABiasGradientMatchesTheInterpreter) {
  for (const std::vector<int64_t>& grad : std::vector<std::vector<int64_t>>{{256, 1024}, {8, 128, 768}, {3, 10}}) {
    const int64_t c = grad.back();
    const std::string g = "f32[" + dims(grad) + "]", v = "f32[" + std::to_string(c) + "]";
    std::string axes = grad.size() == 3 ? "[0, 1]" : "[0]";
    const std::string text = "func @f(%d: " + g + ", %m: " + v + ", %w: " + v + ", %first: bool[], %lr: f32[]) -> (" +
                             v + ", " + v + ") {\n" +
                             "  %s = reduce_sum(%d) {axes = " + axes + ", keepdims = false} : " + v + "\n" +
                             "  %k = constant() {value = dense<f32[]>[0.9]} : f32[]\n" +
                             "  %a = mul(%m, %k) : " + v + "\n" +
                             "  %b = add(%a, %s) : " + v + "\n" +
                             "  %n = select(%first, %s, %b) : " + v + "\n" +
                             "  %u = mul(%n, %lr) : " + v + "\n" +
                             "  %p = sub(%w, %u) : " + v + "\n" +
                             "  return %p, %n\n}\n";
    for (const bool first : {false, true})
      expectMatchesInterpreter(text, {values(grad, 40), values({c}, 41), values({c}, 42),
                                      test::tensorOf(DType::Bool, {}, {first ? 1.0 : 0.0}),
                                      test::tensorOf(DType::F32, {}, {0.01})},
                               1e-5, cancellation(grad.size() == 3 ? grad[0] * grad[1] : grad[0]));
  }
}

}  // namespace
}  // namespace kiln
