// Tiled transposes (codegen/Lowering.h transposeTiling): a kernel that reads
// an operand across the rows of its result runs in tiles of the dim that
// operand is contiguous in and the last dim. Checked here: which kernels are
// tiled and with which tiles (transposeTile: divisors, so no element is
// written twice), and that the tiled kernels compute exactly what the
// interpreter does, byte for byte, on the CPU JIT (at -O2, a kernel per op,
// and -O3, transposes inside elementwise groups) and on the emulated GPU,
// which shares the lowering: sizes that are not multiples of the tile, dims
// of 1, permutations of rank 2 to 5, NaN payloads, integer and bool dtypes,
// an elementwise group that writes over its operand in place, an operand
// read both along and across the rows; and that the CPU transposes tiles of
// 8 x 8 (16 x 16 for 4-byte and narrower dtypes) in registers
// (codegen/Schedule.h, LoopMapping::Tile).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "codegen/Lowering.h"
#include "codegen/LowerToKernels.h"
#include "codegen/Schedule.h"
#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaExecutor.h"
#include "runtime/Interpreter.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;
using test::parseVerified;

std::string dims(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? "," : "") + std::to_string(shape[d]);
  return s;
}

std::string typeOf(const std::string& dtype, const std::vector<int64_t>& shape) {
  return dtype + "[" + dims(shape) + "]";
}

std::vector<int64_t> permuted(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm) {
  std::vector<int64_t> out;
  for (int64_t p : perm) out.push_back(shape[static_cast<size_t>(p)]);
  return out;
}

/// `func @t(%x) { return transpose(%x) }`.
std::string transposeFunction(const std::string& dtype, const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& perm) {
  const std::string out = typeOf(dtype, permuted(shape, perm));
  return "func @t(%x: " + typeOf(dtype, shape) + ") -> " + out + " {\n  %y = transpose(%x) {perm = [" + dims(perm) +
         "]} : " + out + "\n  return %y\n}\n";
}

/// A tensor of `dtype` whose elements all differ (up to the dtype's range),
/// with some NaNs of distinct payloads among the floats.
Tensor distinctTensor(DType dtype, const std::vector<int64_t>& shape, int seed) {
  Tensor t(dtype, shape);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_int_distribution<int64_t> bits(0, 1 << 20);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    if (dtype == DType::F32 && i % 7 == 3) {
      const uint32_t nan = 0x7fc00000u | static_cast<uint32_t>(i & 0x3fffff) | (i % 2 ? 0x80000000u : 0u);
      std::memcpy(t.raw() + i * 4, &nan, 4);
    } else if (isFloat(dtype)) {
      t.setDouble(i, static_cast<double>(i) + 0.25 * static_cast<double>(bits(rng) % 4));
    } else {
      t.setInt(i, dtype == DType::Bool ? (i * 7 + bits(rng)) % 3 == 0 : i * 3 + 1);
    }
  }
  return t;
}

void expectSameBytes(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].shape(), want[r].shape()) << what;
    ASSERT_EQ(got[r].numBytes(), want[r].numBytes()) << what;
    const size_t width = dtypeSize(want[r].dtype());
    for (size_t b = 0; b < want[r].numBytes(); b += width)
      ASSERT_EQ(std::memcmp(got[r].raw() + b, want[r].raw() + b, width), 0)
          << what << ": result " << r << " element " << b / width << " differs from the interpreter's";
  }
}

/// Runs `text` on the CPU JIT at -O2 and -O3 (two runs each, the arena
/// reused) and compares each result with the interpreter's byte for byte.
void expectCpuMatchesInterpreter(const std::string& text, const std::vector<Tensor>& in) {
  SCOPED_TRACE(text);
  auto m = parseVerified(text);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto want = interpret(f, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  for (int optLevel : {2, 3}) {
    auto executor = CpuExecutor::create(f, {.threads = 2, .optLevel = optLevel});
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    for (int run = 0; run < 2; ++run) {
      auto got = (*executor)->run(in);
      ASSERT_TRUE(got.ok()) << got.error().str();
      expectSameBytes(*got, *want, "-O" + std::to_string(optLevel) + " run " + std::to_string(run));
    }
  }
}

/// The kernels `text`'s function lowers to (-O2: one per op), as kernel IR.
std::vector<kir::Kernel> kernelsOf(const std::string& text) {
  auto m = parseVerified(text);
  EXPECT_TRUE(m);
  if (!m) return {};
  auto steps = codegen::lowerToSteps(*m->functions().front(), "k_");
  EXPECT_TRUE(steps.ok()) << steps.error().str();
  std::vector<kir::Kernel> kernels;
  if (steps.ok())
    for (const auto& step : *steps)
      if (step.kind == codegen::LoweredStep::Kind::Kernel) kernels.push_back(step.kernel);
  return kernels;
}

/// The loop extents of a kernel's nest, outermost first (first statements).
std::vector<int64_t> loopExtents(const kir::Kernel& kernel) {
  std::vector<int64_t> extents;
  const std::vector<kir::StmtPtr>* body = &kernel.body;
  while (!body->empty() && (*body)[0]->kind == kir::Stmt::Kind::For) {
    extents.push_back((*body)[0]->extent);
    body = &(*body)[0]->body;
  }
  return extents;
}

TEST(TransposeTilingTest, TileDividesItsDim) {
  EXPECT_EQ(codegen::transposeTile(1), 1);
  EXPECT_EQ(codegen::transposeTile(5), 5);
  EXPECT_EQ(codegen::transposeTile(8), 8);
  EXPECT_EQ(codegen::transposeTile(1024), 8);
  EXPECT_EQ(codegen::transposeTile(784), 8);
  EXPECT_EQ(codegen::transposeTile(10), 10);  // the tile up to 32 that divides it: itself
  EXPECT_EQ(codegen::transposeTile(49), 7);  // none from 8 to 32: the largest from 4
  EXPECT_EQ(codegen::transposeTile(197), 197);  // a prime that fits in L1
  EXPECT_EQ(codegen::transposeTile(1001), 11);
  EXPECT_EQ(codegen::transposeTile(1009), 1);   // a large prime: untiled
  EXPECT_EQ(codegen::transposeTile(2 * 1009), 2);
  for (int64_t extent = 1; extent < 3000; ++extent)
    ASSERT_EQ(extent % codegen::transposeTile(extent), 0) << extent;
}

TEST(TransposeTilingTest, TransposesAreTiledAndRowCopiesAreNot) {
  // [1024,1024]^T f32: 64 x 64 tiles of 16 x 16 (whole lines) ...
  auto kernels = kernelsOf(transposeFunction("f32", {1024, 1024}, {1, 0}));
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(loopExtents(kernels[0]), (std::vector<int64_t>{64 * 64, 16, 16})) << kir::printKernel(kernels[0]);
  // ... f64: 128 x 128 tiles of 8 x 8.
  kernels = kernelsOf(transposeFunction("f64", {1024, 1024}, {1, 0}));
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(loopExtents(kernels[0]), (std::vector<int64_t>{128 * 128, 8, 8})) << kir::printKernel(kernels[0]);
  // A dim that divides by 8 but not 16 takes 8 x 8 tiles.
  kernels = kernelsOf(transposeFunction("f32", {1024, 56}, {1, 0}));
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(loopExtents(kernels[0]), (std::vector<int64_t>{7 * 128, 8, 8})) << kir::printKernel(kernels[0]);
  // Attention's heads [8,128,4,64] -> [8,4,128,64]: rows of 64 are read
  // contiguously, so the kernel keeps its row loop.
  kernels = kernelsOf(transposeFunction("f32", {8, 128, 4, 64}, {0, 2, 1, 3}));
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(loopExtents(kernels[0]), (std::vector<int64_t>{8 * 4 * 128, 64})) << kir::printKernel(kernels[0]);
  // NCHW -> NHWC at 7 x 7: tiles of 7 (W) x 8 (C).
  kernels = kernelsOf(transposeFunction("f32", {2, 64, 7, 7}, {0, 2, 3, 1}));
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(loopExtents(kernels[0]), (std::vector<int64_t>{2 * 7 * 1 * 8, 7, 8})) << kir::printKernel(kernels[0]);
  // A last dim of 1 is not a row to tile.
  kernels = kernelsOf(transposeFunction("f32", {1, 32}, {1, 0}));
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(loopExtents(kernels[0]), (std::vector<int64_t>{32, 1})) << kir::printKernel(kernels[0]);
}

TEST(TransposeTilingTest, TilesOf8x8And16x16AreTransposedInRegistersOnTheCpu) {
  for (const char* dtype : {"f32", "f64"}) {
    auto kernels = kernelsOf(transposeFunction(dtype, {1024, 1024}, {1, 0}));
    ASSERT_EQ(kernels.size(), 1u);
    kir::Kernel kernel = kernels[0];
    codegen::scheduleForCpu(kernel);
    EXPECT_EQ(kernel.schedule.of(0), kir::LoopMapping::Threads) << kir::printKernel(kernel);
    EXPECT_EQ(kernel.schedule.of(2), kir::LoopMapping::Tile) << kir::printKernel(kernel);
    EXPECT_EQ(kernel.schedule.of(1), kir::LoopMapping::Vector) << kir::printKernel(kernel);
  }
  kir::Kernel kernel;
  // Tiles of another size keep the vectorized row loop (gathers).
  auto kernels = kernelsOf(transposeFunction("f32", {20, 12}, {1, 0}));
  ASSERT_EQ(kernels.size(), 1u);
  kernel = kernels[0];
  codegen::scheduleForCpu(kernel);
  EXPECT_EQ(kernel.schedule.of(2), kir::LoopMapping::Serial) << kir::printKernel(kernel);
  // One load is transposed per distinct index, the one along the rows is not.
  const kir::Stmt* loop = kernels[0].body[0].get();
  while (loop->body[0]->kind == kir::Stmt::Kind::For) loop = loop->body[0].get();
  EXPECT_TRUE(codegen::tileTransposedLoads(*loop->body[0], 1, 2).empty());
  EXPECT_EQ(codegen::tileTransposedLoads(*loop->body[0], 2, 1).size(), 1u);
}

TEST(TransposeTilingTest, AnOperandReadBothWaysInOneGroup) {
  // x + x^T at -O3 is one kernel reading %x along its rows and across them.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{24, 24}, std::vector<int64_t>{2, 16, 16}, std::vector<int64_t>{2, 8, 8}}) {
    const std::string t = typeOf("f32", shape);
    const std::string perm = shape.size() == 2 ? "1, 0" : "0, 2, 1";
    expectCpuMatchesInterpreter("func @t(%x: " + t + ") -> " + t + " {\n  %y = transpose(%x) {perm = [" + perm +
                                    "]} : " + t + "\n  %z = add(%x, %y) : " + t + "\n  %w = mul(%z, %y) : " + t +
                                    "\n  return %w\n}\n",
                                {test::randomF32(shape, 7)});
  }
}

TEST(TransposeTilingTest, TilingFromTheProbe) {
  // The element expression at (%i0, %i1, %i2) of [4,6,10] reading x[4,10,6]
  // transposed: the load steps by 6 along the last dim and by 1 along dim 1.
  const kir::ExprPtr i0 = kir::var(0), i1 = kir::var(1), i2 = kir::var(2);
  const kir::ExprPtr across =
      kir::load(0, DType::F32, kir::add(kir::mul(kir::add(kir::mul(i0, kir::index(10)), i2), kir::index(6)), i1));
  auto tiling = codegen::transposeTiling(across, {4, 6, 10});
  ASSERT_TRUE(tiling);
  EXPECT_EQ(tiling->dim, 1u);
  EXPECT_EQ(tiling->tileA, 6);
  EXPECT_EQ(tiling->tileB, 10);
  // Read along the rows (the flat index): not tiled.
  const kir::ExprPtr along =
      kir::load(1, DType::F32, kir::add(kir::mul(kir::add(kir::mul(i0, kir::index(6)), i1), kir::index(10)), i2));
  EXPECT_FALSE(codegen::transposeTiling(along, {4, 6, 10}));
  // Both: the transposed operand decides.
  EXPECT_TRUE(codegen::transposeTiling(kir::binary(kir::BinaryFn::Add, along, across), {4, 6, 10}));
  // A reduction keeps the row loop (and its vectorized sums).
  EXPECT_FALSE(codegen::transposeTiling(
      kir::binary(kir::BinaryFn::Add, across, kir::reduce(kir::ReduceKind::Sum, 3, {4}, along)), {4, 6, 10}));
  // A result written across its rows (a strided slice whose last dim is not
  // contiguous) is not tiled.
  EXPECT_FALSE(codegen::transposeTiling(across, {4, 6, 10}, {60, 1, 6}));
}

TEST(TransposeTilingTest, EdgeShapesMatchTheInterpreter) {
  struct Case {
    std::vector<int64_t> shape, perm;
  };
  const std::vector<Case> cases = {
      {{3, 5}, {1, 0}},                    // smaller than a tile
      {{17, 33}, {1, 0}},                  // primes above the tile: one tile each way
      {{24, 40}, {1, 0}},                  // whole tiles of 8
      {{32, 48}, {1, 0}},                  // whole tiles of 16
      {{2, 3, 32, 16}, {0, 1, 3, 2}},      // ... batched
      {{1009, 9}, {1, 0}},                 // a large prime along the tiled dim: untiled (tile 1)
      {{9, 1009}, {1, 0}},                 // ... along the last dim
      {{1, 37, 1, 12}, {0, 3, 2, 1}},      // dims of 1 between the swapped ones
      {{2, 3, 20, 12}, {0, 1, 3, 2}},      // batched last-two-dims
      {{4, 6, 10}, {2, 0, 1}},             // rank 3, the last dim moved first
      {{2, 10, 3, 9}, {0, 2, 3, 1}},       // NCHW -> NHWC
      {{2, 3, 5, 16}, {0, 3, 1, 2}},       // NHWC -> NCHW
      {{2, 3, 4, 5, 6}, {4, 2, 0, 3, 1}},  // rank 5
      {{1, 4, 4, 2, 12}, {0, 1, 2, 4, 3}}, // a channel shuffle, channels last
  };
  int seed = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(dims(c.shape) + " perm " + dims(c.perm));
    expectCpuMatchesInterpreter(transposeFunction("f32", c.shape, c.perm), {distinctTensor(DType::F32, c.shape, ++seed)});
  }
}

TEST(TransposeTilingTest, EveryDtypeMovesItsBytes) {
  for (const char* dtype : {"f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool"}) {
    SCOPED_TRACE(dtype);
    const DType t = *parseDType(dtype);
    for (const auto& [shape, perm] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{19, 26}, {1, 0}}, {{16, 24}, {1, 0}}, {{32, 48}, {1, 0}}, {{2, 16, 3, 24}, {0, 3, 2, 1}}})
      expectCpuMatchesInterpreter(transposeFunction(dtype, shape, perm), {distinctTensor(t, shape, 5)});
  }
}

/// An optimizer update reading a transposed gradient (the MLP's backward):
/// at -O3 the transpose is inside the elementwise group, whose result may
/// be written over %w in place (the planner lets an elementwise kernel
/// overwrite an operand it reads only at the element it writes).
std::string sgdFunction(const std::vector<int64_t>& shape) {
  const std::vector<int64_t> t = {shape[1], shape[0]};
  const std::string w = typeOf("f32", shape);
  return "func @sgd(%w: " + w + ", %g: " + typeOf("f32", t) + ") -> " + w + " {\n" +
         "  %gt = transpose(%g) {perm = [1, 0]} : " + w + "\n" +
         "  %lr = constant() {value = dense<f32[]>[0.5]} : f32[]\n" +
         "  %s = mul(%gt, %lr) : " + w + "\n" +
         "  %y = sub(%w, %s) : " + w + "\n" +
         "  %e = exp(%y) : " + w + "\n" +
         "  %z = add(%e, %w) : " + w + "\n" +
         "  return %z\n}\n";
}

TEST(TransposeTilingTest, ElementwiseGroupsWithATransposedOperand) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{64, 96}, {24, 40}, {37, 20}, {8, 1009}}) {
    SCOPED_TRACE(dims(shape));
    const std::string text = sgdFunction(shape);
    auto m = parseVerified(text);
    ASSERT_TRUE(m);
    const Function& f = *m->functions().front();
    const std::vector<Tensor> in = {test::randomF32(shape, 3), test::randomF32({shape[1], shape[0]}, 4)};
    auto want = test::interpretedResults(f, in);
    ASSERT_TRUE(want);
    for (int optLevel : {2, 3}) {
      auto got = test::cpuJitResults(f, in, optLevel);
      ASSERT_TRUE(got);
      test::expectClose((*got)[0], (*want)[0], "-O" + std::to_string(optLevel));
    }
  }
}

TEST(TransposeTilingTest, EmulatedGpuMatchesTheInterpreter) {
  KILN_REQUIRE_EMULATOR();
  struct Case {
    std::vector<int64_t> shape, perm;
  };
  for (const Case& c : std::vector<Case>{{{17, 40}, {1, 0}}, {{2, 3, 20, 12}, {0, 1, 3, 2}}, {{2, 10, 3, 9}, {0, 2, 3, 1}}}) {
    SCOPED_TRACE(dims(c.shape) + " perm " + dims(c.perm));
    auto m = parseVerified(transposeFunction("f32", c.shape, c.perm));
    ASSERT_TRUE(m);
    const Function& f = *m->functions().front();
    const std::vector<Tensor> in = {distinctTensor(DType::F32, c.shape, 9)};
    auto want = test::interpretedResults(f, in);
    ASSERT_TRUE(want);
    auto got = test::emulatedGpuResults(f, in);
    ASSERT_TRUE(got);
    expectSameBytes(*got, *want, "emulated GPU");
  }
  auto m = parseVerified(sgdFunction({24, 40}));
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const std::vector<Tensor> in = {test::randomF32({24, 40}, 1), test::randomF32({40, 24}, 2)};
  auto want = test::interpretedResults(f, in);
  ASSERT_TRUE(want);
  auto got = test::emulatedGpuResults(f, in);
  ASSERT_TRUE(got);
  test::expectClose((*got)[0], (*want)[0], "emulated GPU sgd");
}

}  // namespace
}  // namespace kiln
