// The unsigned integer dtypes u16, u32 and u64 (u8 is older): wrapping
// arithmetic at each width; u64 values from 2^63 up, which an int64 holds
// as negative bits, compared, divided, reduced and converted as the
// unsigned values they are; casts to and from floats and the other
// integers; the text format; and the CPU JIT and the CUDA path (on the
// emulated GPU) agreeing with the interpreter and with the values worked
// by hand below.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaExecutor.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaDevices.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/InterpreterTestSupport.h"
#include "test/unit/TestSupport.h"

namespace kiln::test {
namespace {

/// The int64 bits of a u64 value, as Tensor::setInt takes it.
int64_t bits(uint64_t v) { return static_cast<int64_t>(v); }

constexpr uint64_t kTop = uint64_t{1} << 63;                       // 2^63
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();  // 2^64 - 1

std::vector<uint64_t> uint64s(const Tensor& t) {
  std::vector<uint64_t> v;
  for (int64_t i = 0; i < t.numElements(); ++i) v.push_back(static_cast<uint64_t>(t.getInt(i)));
  return v;
}

Tensor u64(std::vector<int64_t> dims, const std::vector<uint64_t>& values) {
  std::vector<int64_t> b;
  for (uint64_t v : values) b.push_back(bits(v));
  return ints(DType::U64, std::move(dims), b);
}

Tensor castTo(Tensor x, DType to) {
  TensorType type{to, x.type().shape};
  return run(OpKind::Cast, {std::move(x)}, {}, {type});
}

TEST(UnsignedTest, NamesAndSizes) {
  for (auto [dtype, name, size] : {std::tuple{DType::U16, "u16", 2}, {DType::U32, "u32", 4}, {DType::U64, "u64", 8}}) {
    EXPECT_EQ(dtypeName(dtype), name);
    EXPECT_EQ(parseDType(name), dtype);
    EXPECT_EQ(dtypeSize(dtype), static_cast<size_t>(size));
    EXPECT_TRUE(isInteger(dtype));
    EXPECT_FALSE(isSigned(dtype));
  }
}

TEST(UnsignedTest, ArithmeticWrapsAtEachWidth) {
  expectInts(run(OpKind::Add, {ints(DType::U32, {2}, {4294967295, 7}), ints(DType::U32, {2}, {1, 4294967295})}), {2},
             {0, 6});
  expectInts(run(OpKind::Sub, {ints(DType::U32, {1}, {0}), ints(DType::U32, {1}, {1})}), {1}, {4294967295});
  expectInts(run(OpKind::Mul, {ints(DType::U16, {2}, {300, 256}), ints(DType::U16, {2}, {300, 256})}), {2},
             {24464, 0});  // 90000 and 65536 wrap
  expectInts(run(OpKind::Neg, {ints(DType::U16, {2}, {0, 1})}), {2}, {0, 65535});
  EXPECT_EQ(uint64s(run(OpKind::Add, {u64({1}, {kMax}), u64({1}, {2})})), (std::vector<uint64_t>{1}));
  EXPECT_EQ(uint64s(run(OpKind::Mul, {u64({1}, {kTop + 1}), u64({1}, {2})})), (std::vector<uint64_t>{2}));
}

TEST(UnsignedTest, U64AboveTwoToThe63IsNotNegative) {
  const Tensor a = u64({4}, {kTop, kMax, 5, kTop + 5});
  const Tensor b = u64({4}, {1, 10, kTop, 3});
  // A signed comparison would put 2^63 below 1.
  expectInts(run(OpKind::Lt, {a, b}), {4}, {0, 0, 1, 0});
  expectInts(run(OpKind::Ge, {a, b}), {4}, {1, 1, 0, 1});
  EXPECT_EQ(uint64s(run(OpKind::Max, {a, b})), (std::vector<uint64_t>{kTop, kMax, kTop, kTop + 5}));
  EXPECT_EQ(uint64s(run(OpKind::Min, {a, b})), (std::vector<uint64_t>{1, 10, 5, 3}));
  EXPECT_EQ(uint64s(run(OpKind::Div, {a, b})), (std::vector<uint64_t>{kTop, 1844674407370955161u, 0, 3074457345618258604u}));
  // 2^64 - 1 = 10 * 1844674407370955161 + 5; 2^63 + 5 = 3 * 3074457345618258604 + 1.
  EXPECT_EQ(uint64s(run(OpKind::Mod, {a, b})), (std::vector<uint64_t>{0, 5, 5, 1}));
  EXPECT_EQ(uint64s(run(OpKind::Rem, {a, b})), (std::vector<uint64_t>{0, 5, 5, 1}));
  EXPECT_EQ(uint64s(run(OpKind::Abs, {a})), uint64s(a));
  EXPECT_EQ(uint64s(run(OpKind::Relu, {a})), uint64s(a));
  EXPECT_EQ(uint64s(run(OpKind::Sign, {a})), (std::vector<uint64_t>{1, 1, 1, 1}));
  EXPECT_EQ(uint64s(run(OpKind::Pow, {u64({1}, {2}), u64({1}, {63})})), (std::vector<uint64_t>{kTop}));
}

TEST(UnsignedTest, ReductionsSeeUnsignedValues) {
  const Tensor a = u64({3}, {1, kTop + 1, 5});
  AttrMap all = {{"axes", Attribute(std::vector<int64_t>{0})}};
  EXPECT_EQ(uint64s(run(OpKind::ReduceMax, {a}, all)), (std::vector<uint64_t>{kTop + 1}));
  EXPECT_EQ(uint64s(run(OpKind::ReduceMin, {a}, all)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(uint64s(run(OpKind::ReduceSum, {a}, all)), (std::vector<uint64_t>{kTop + 7}));
  // The identity of an empty min is the dtype's largest value.
  expectInts(run(OpKind::ReduceMin, {ints(DType::U32, {0}, {})}, all), {}, {4294967295});
  EXPECT_EQ(uint64s(run(OpKind::ReduceMin, {u64({0}, {})}, all)), (std::vector<uint64_t>{kMax}));
  expectInts(run(OpKind::ArgMax, {a}, {{"axis", Attribute(int64_t{0})}}), {}, {1});
}

TEST(UnsignedTest, CastsToAndFromFloats) {
  expectTensor(castTo(u64({3}, {kTop, kMax, 3}), DType::F64), {3}, {9223372036854775808.0, 18446744073709551615.0, 3},
               0);
  expectTensor(castTo(ints(DType::U32, {1}, {4294967295}), DType::F64), {1}, {4294967295.0}, 0);
  // Exact truncation above 2^63, saturation from 2^64, NaN to 0; a negative
  // float wraps as it does for u8.
  EXPECT_EQ(uint64s(castTo(makeTensor(DType::F64, {5}, {1e19, 3.9, 4e19, std::nan(""), -1}), DType::U64)),
            (std::vector<uint64_t>{10000000000000000000u, 3, kMax, 0, kMax}));
  expectInts(castTo(f32({3}, {65535.9, 65536, -1}), DType::U16), {3}, {65535, 0, 65535});
  expectInts(castTo(f32({2}, {4294967040.0, -2}), DType::U32), {2}, {4294967040, 4294967294});
}

TEST(UnsignedTest, CastsBetweenIntegersWrapAndZeroExtend) {
  EXPECT_EQ(uint64s(castTo(ints(DType::I64, {2}, {-1, 5}), DType::U64)), (std::vector<uint64_t>{kMax, 5}));
  expectInts(castTo(u64({2}, {kMax, kTop}), DType::I64), {2}, {-1, std::numeric_limits<int64_t>::min()});
  expectInts(castTo(ints(DType::U32, {1}, {4294967295}), DType::I64), {1}, {4294967295});  // zero-extended
  expectInts(castTo(ints(DType::U16, {2}, {65535, 32768}), DType::I16), {2}, {-1, -32768});
  expectInts(castTo(ints(DType::I8, {1}, {-1}), DType::U32), {1}, {4294967295});
  expectInts(castTo(u64({1}, {kMax}), DType::U16), {1}, {65535});
  expectInts(castTo(u64({2}, {0, kTop}), DType::Bool), {2}, {0, 1});
}

TEST(UnsignedTest, TextFormatRoundTripsTheWholeRange) {
  const std::string text =
      "func @f() -> (u64[3], u32[1], u16[1]) {\n"
      "  %a = constant() {value = dense<u64[3]>[0, 9223372036854775808, 18446744073709551615]} : u64[3]\n"
      "  %b = constant() {value = dense<u32[1]>[4294967295]} : u32[1]\n"
      "  %c = constant() {value = dense<u16[1]>[65535]} : u16[1]\n"
      "  return %a, %b, %c\n"
      "}\n";
  auto m = parseVerified(text);
  ASSERT_TRUE(m);
  const std::string printed = print(*m);
  EXPECT_NE(printed.find("18446744073709551615"), std::string::npos) << printed;
  EXPECT_NE(printed.find("9223372036854775808"), std::string::npos) << printed;
  auto again = parseVerified(printed);
  ASSERT_TRUE(again);
  EXPECT_EQ(print(*again), printed);
  auto results = interpret(*again->functions().front(), {});
  ASSERT_TRUE(results.ok()) << results.error().str();
  EXPECT_EQ(uint64s((*results)[0]), (std::vector<uint64_t>{0, kTop, kMax}));

  for (auto [type, element] : {std::pair{"u64[1]", "18446744073709551616"}, {"u64[1]", "-1"},
                                {"u32[1]", "4294967296"}, {"u16[1]", "65536"}}) {
    const std::string t = type;
    auto parsed = parseModule("func @f() -> " + t + " {\n  %a = constant() {value = dense<" + t + ">[" + element +
                                  "]} : " + t + "\n  return %a\n}\n",
                              "bad.kir");
    ASSERT_FALSE(parsed.ok()) << element;
    EXPECT_NE(parsed.error().message().find("out of the range"), std::string::npos) << parsed.error().message();
  }
}

/// Runs `text` on the JIT and the interpreter; both must give `want`.
void expectJitAndInterpreter(const std::string& text, const std::vector<Tensor>& inputs,
                             const std::vector<std::vector<uint64_t>>& want) {
  SCOPED_TRACE(text);
  auto m = parseVerified(text);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto interpreted = interpret(f, inputs);
  ASSERT_TRUE(interpreted.ok()) << interpreted.error().str();
  auto executor = codegen::CpuExecutor::create(f, {.threads = 1});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  Status prepared = (*executor)->prepare(inputs);
  ASSERT_TRUE(prepared.ok()) << prepared.error().str();
  auto compiled = (*executor)->run(inputs);
  ASSERT_TRUE(compiled.ok()) << compiled.error().str();
  ASSERT_EQ(compiled->size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    const Tensor& got = (*compiled)[r];
    ASSERT_EQ(got.numElements(), static_cast<int64_t>(want[r].size())) << "compiled result " << r;
    for (int64_t i = 0; i < got.numElements(); ++i) {
      // A float result is compared with the wanted value rounded to double.
      if (isFloat(got.dtype()))
        EXPECT_EQ(got.getDouble(i), static_cast<double>(want[r][i])) << "compiled result " << r << " element " << i;
      else
        EXPECT_EQ(static_cast<uint64_t>(got.getInt(i)), want[r][i]) << "compiled result " << r << " element " << i;
    }
    EXPECT_EQ(std::memcmp(got.raw(), (*interpreted)[r].raw(), got.numBytes()), 0) << "interpreted result " << r;
  }
}

// udiv, urem, icmp ult, uitofp, kiln_ftou and unsigned max: with signed
// ones each of these results would differ.
const char* const kU64Function =
      "func @f(%a: u64[4], %b: u64[4]) -> (u64[4], u64[4], bool[4], u64[4], f64[4], u64[4], u64[]) {\n"
      "  %q = div(%a, %b) : u64[4]\n"
      "  %m = mod(%a, %b) : u64[4]\n"
      "  %lt = lt(%a, %b) : bool[4]\n"
      "  %mx = max(%a, %b) : u64[4]\n"
      "  %f = cast(%a) : f64[4]\n"
      "  %back = cast(%f) : u64[4]\n"
      "  %r = reduce_max(%a) {axes = [0]} : u64[]\n"
      "  return %q, %m, %lt, %mx, %f, %back, %r\n"
      "}\n";

std::vector<Tensor> u64Inputs() { return {u64({4}, {kTop, kMax, 5, kTop + 4096}), u64({4}, {1, 10, kTop, 3})}; }

const std::vector<std::vector<uint64_t>> kU64Results = {{kTop, 1844674407370955161u, 0, 3074457345618259968u},
                                                         {0, 5, 5, 0},
                                                         {0, 0, 1, 0},
                                                         {kTop, kMax, kTop, kTop + 4096},
                                                         {kTop, kMax /* 2^64 as a double */, 5, kTop + 4096},
                                                         {kTop, kMax, 5, kTop + 4096},
                                                         {kMax}};

TEST(UnsignedTest, JitUsesUnsignedInstructions) { expectJitAndInterpreter(kU64Function, u64Inputs(), kU64Results); }

TEST(UnsignedTest, CudaUsesUnsignedTypes) {
  // The CUDA emitter's unsigned long long, kiln_ftou and unsigned
  // reduction identity, compiled by NVRTC and run on the emulated GPU.
  KILN_REQUIRE_EMULATOR();
  auto context = test::emulatorContext();
  ASSERT_TRUE(context);
  auto m = parseVerified(kU64Function);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, context);
  ASSERT_TRUE(executor) << executor.error().message();
  auto got = (*executor)->run(u64Inputs());
  ASSERT_TRUE(got) << got.error().message();
  ASSERT_EQ(got->size(), kU64Results.size());
  for (size_t r = 0; r < kU64Results.size(); ++r)
    for (int64_t i = 0; i < (*got)[r].numElements(); ++i) {
      const Tensor& t = (*got)[r];
      if (isFloat(t.dtype()))
        EXPECT_EQ(t.getDouble(i), static_cast<double>(kU64Results[r][i])) << "result " << r << " element " << i;
      else
        EXPECT_EQ(static_cast<uint64_t>(t.getInt(i)), kU64Results[r][i]) << "result " << r << " element " << i;
    }
}

TEST(UnsignedTest, JitWrapsNarrowUnsignedTypes) {
  const std::string text =
      "func @f(%a: u32[3], %b: u32[3], %c: u16[3], %d: u16[3]) -> (u32[3], u32[3], bool[3], u16[3], i64[3], f32[3]) "
      "{\n"
      "  %s = sub(%a, %b) : u32[3]\n"
      "  %q = div(%a, %b) : u32[3]\n"
      "  %gt = gt(%a, %b) : bool[3]\n"
      "  %p = mul(%c, %d) : u16[3]\n"
      "  %w = cast(%a) : i64[3]\n"
      "  %f = cast(%c) : f32[3]\n"
      "  return %s, %q, %gt, %p, %w, %f\n"
      "}\n";
  const Tensor a = ints(DType::U32, {3}, {0, 4294967295, 2147483648});
  const Tensor b = ints(DType::U32, {3}, {1, 2, 3});
  const Tensor c = ints(DType::U16, {3}, {300, 65535, 2});
  const Tensor d = ints(DType::U16, {3}, {300, 65535, 3});
  expectJitAndInterpreter(text, {a, b, c, d},
                          {{4294967295, 4294967293, 2147483645},
                           {0, 2147483647, 715827882},
                           {0, 1, 1},
                           {24464, 1, 6},
                           {0, 4294967295, 2147483648},
                           {300, 65535, 2}});
}

}  // namespace
}  // namespace kiln::test
