// codegen/ValueRanges.h: which integer operations of a kernel provably stay
// inside their dtype. Index arithmetic over loop variables does; arithmetic
// on loaded data, or index arithmetic with a huge constant, may not; a
// positive constant or a clamped expression is a divisor of at least 1; so
// the emitters write index arithmetic with plain operators and call
// ir/ScalarSemantics.h for the rest.
#include <gtest/gtest.h>

#include "codegen/KernelIR.h"
#include "codegen/ValueRanges.h"

namespace kiln {
namespace {

using kir::BinaryFn;

/// A kernel whose loops give var 0 the extent 64 and var 1 the extent 256,
/// storing `value`.
kir::Kernel kernelStoring(const kir::ExprPtr& value) {
  kir::Kernel k;
  k.buffers.resize(2);
  k.buffers[0].dtype = DType::I32;
  k.buffers[0].shape = {64, 256};
  k.buffers[0].role = kir::Buffer::Role::Input;
  k.buffers[1].dtype = value->type;
  k.buffers[1].shape = {64, 256};
  k.buffers[1].role = kir::Buffer::Role::Output;
  const kir::ExprPtr flat = kir::add(kir::mul(kir::var(0), kir::index(256)), kir::var(1));
  k.body = {kir::forLoop(0, 64, true, false, {kir::forLoop(1, 256, false, true, {kir::store(1, flat, value)})})};
  k.numVars = 2;
  return k;
}

TEST(ValueRangesTest, IndexArithmeticCannotOverflowDataArithmeticMay) {
  const kir::ExprPtr flat = kir::add(kir::mul(kir::var(0), kir::index(256)), kir::var(1));
  const kir::ExprPtr load = kir::load(0, DType::I32, flat);
  const kir::ExprPtr sum = kir::binary(BinaryFn::Add, load, load);
  const kir::ExprPtr seeded = kir::binary(BinaryFn::Add, kir::index(9223372036854775000), flat);
  const kir::ExprPtr scaled = kir::binary(BinaryFn::Mul, flat, kir::index(int64_t{1} << 50));
  const kir::Kernel k = kernelStoring(sum);
  kir::ValueRanges ranges(k);
  // 0 <= i0 * 256 + i1 <= 16383.
  EXPECT_TRUE(ranges.cannotOverflow(*flat));
  EXPECT_TRUE(ranges.cannotOverflow(*flat->args[0]));
  // Two i32 loads may sum past INT32_MAX.
  EXPECT_FALSE(ranges.cannotOverflow(*sum));
  // 9223372036854775000 + 16383 passes INT64_MAX; 16383 * 2^50 does too.
  EXPECT_FALSE(ranges.cannotOverflow(*seeded));
  EXPECT_FALSE(ranges.cannotOverflow(*scaled));
  const kir::ExprPtr nearEnd = kir::binary(BinaryFn::Add, kir::index(9223372036854750000), flat);
  EXPECT_TRUE(ranges.cannotOverflow(*nearEnd));
  // A u8 value plus 1 may pass 255; widened to i32 first, it cannot.
  const kir::ExprPtr byte = kir::cast(load, DType::U8);
  const kir::ExprPtr bytePlusOne = kir::binary(BinaryFn::Add, byte, kir::constantInt(DType::U8, 1));
  const kir::ExprPtr widePlusOne =
      kir::binary(BinaryFn::Add, kir::cast(byte, DType::I32), kir::constantInt(DType::I32, 1));
  EXPECT_FALSE(ranges.cannotOverflow(*bytePlusOne));
  EXPECT_TRUE(ranges.cannotOverflow(*widePlusOne));
}

TEST(ValueRangesTest, DivisorsOfAtLeastOne) {
  const kir::ExprPtr flat = kir::add(kir::mul(kir::var(0), kir::index(256)), kir::var(1));
  const kir::ExprPtr load = kir::load(0, DType::I32, flat);
  const kir::Kernel k = kernelStoring(load);
  // Held here: ValueRanges remembers expressions by address.
  const kir::ExprPtr eight = kir::index(8), zero = kir::index(0), i1 = kir::var(1);
  const kir::ExprPtr i1PlusOne = kir::binary(BinaryFn::Add, i1, kir::index(1));
  const kir::ExprPtr clamped = kir::binary(BinaryFn::Max, load, kir::constantInt(DType::I32, 1));
  const kir::ExprPtr five = kir::constantInt(DType::I32, 5);
  const kir::ExprPtr mod = kir::binary(BinaryFn::Mod, load, five), rem = kir::binary(BinaryFn::Rem, load, five);
  kir::ValueRanges ranges(k);
  EXPECT_TRUE(ranges.atLeast(*eight, 1));
  EXPECT_FALSE(ranges.atLeast(*zero, 1));
  EXPECT_FALSE(ranges.atLeast(*load, 1));
  // A loop variable starts at 0; plus one, at 1; a load clamped from below
  // by 1, at 1.
  EXPECT_FALSE(ranges.atLeast(*i1, 1));
  EXPECT_TRUE(ranges.atLeast(*i1PlusOne, 1));
  EXPECT_TRUE(ranges.atLeast(*clamped, 1));
  // x mod 5 of any x is in [0, 4]; x rem 5 in [-4, 4].
  EXPECT_TRUE(ranges.atLeast(*mod, 0));
  EXPECT_FALSE(ranges.atLeast(*rem, 0));
  EXPECT_TRUE(ranges.atLeast(*rem, -4));
}

TEST(ValueRangesTest, PlainOperatorSufficesForIndexArithmeticOnly) {
  const kir::ExprPtr flat = kir::add(kir::mul(kir::var(0), kir::index(256)), kir::var(1));
  const kir::ExprPtr load = kir::load(0, DType::I32, flat);
  const kir::Kernel k = kernelStoring(load);
  const kir::ExprPtr row = kir::binary(BinaryFn::Div, flat, kir::index(256));
  const kir::ExprPtr column = kir::binary(BinaryFn::Mod, flat, kir::index(256));
  const kir::ExprPtr byData = kir::binary(BinaryFn::Div, flat, kir::cast(load, DType::I64));
  const kir::ExprPtr dataMod = kir::binary(BinaryFn::Mod, load, kir::constantInt(DType::I32, 256));
  const kir::ExprPtr dataSum = kir::binary(BinaryFn::Add, load, kir::constantInt(DType::I32, 1));
  const kir::ExprPtr dataMax = kir::binary(BinaryFn::Max, load, kir::constantInt(DType::I32, 1));
  kir::ValueRanges ranges(k);
  EXPECT_TRUE(ranges.plainOperatorSuffices(*flat));
  EXPECT_TRUE(ranges.plainOperatorSuffices(*row));
  // Mod of a non-negative index by a positive divisor is its remainder.
  EXPECT_TRUE(ranges.plainOperatorSuffices(*column));
  // A divisor that may be 0 or -1, a dividend that may be negative, a sum
  // that may overflow, and functions with no plain operator.
  EXPECT_FALSE(ranges.plainOperatorSuffices(*byData));
  EXPECT_FALSE(ranges.plainOperatorSuffices(*dataMod));
  EXPECT_FALSE(ranges.plainOperatorSuffices(*dataSum));
  EXPECT_FALSE(ranges.plainOperatorSuffices(*dataMax));
}

}  // namespace
}  // namespace kiln
