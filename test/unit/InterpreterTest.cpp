// Tests of runtime/Tensor and of the interpreter's elementwise kernels:
// unary math, broadcasting binary ops, integer semantics (truncating
// division, mod vs rem signs, wrap-around, division by zero), comparisons,
// logical ops, select, cast, and 16-bit float round-off. Expected values are
// worked by hand.
#include <cmath>
#include <limits>

#include "test/unit/InterpreterTestSupport.h"

namespace kiln::test {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// --- Tensor --------------------------------------------------------------------------

TEST(TensorTest, ConstructionIsZeroFilledWithRowMajorStrides) {
  Tensor t(DType::I16, {2, 3, 4});
  EXPECT_EQ(t.numElements(), 24);
  EXPECT_EQ(t.numBytes(), 48u);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{12, 4, 1}));
  for (int64_t i = 0; i < t.numElements(); ++i) EXPECT_EQ(t.getInt(i), 0);
  EXPECT_EQ(t.type().str(), "i16[2,3,4]");

  Tensor scalar(DType::F64, {});
  EXPECT_EQ(scalar.numElements(), 1);
  EXPECT_TRUE(scalar.strides().empty());
  Tensor empty(DType::F32, {3, 0});
  EXPECT_EQ(empty.numElements(), 0);
  EXPECT_EQ(empty.numBytes(), 0u);
}

TEST(TensorTest, ElementConversions) {
  Tensor u8(DType::U8, {3});
  u8.setInt(0, 300);     // wraps
  u8.setInt(1, -1);      // wraps
  u8.setDouble(2, 7.9);  // truncates
  EXPECT_EQ(int64s(u8), (std::vector<int64_t>{44, 255, 7}));

  Tensor i32(DType::I32, {3});
  i32.setDouble(0, kNaN);  // saturating conversion: no undefined behaviour
  i32.setDouble(1, -2.5);
  i32.setDouble(2, 1e30);
  EXPECT_EQ(i32.getInt(0), 0);
  EXPECT_EQ(i32.getInt(1), -2);

  Tensor b(DType::Bool, {2});
  b.setDouble(0, 0.5);
  b.setInt(1, 0);
  EXPECT_EQ(int64s(b), (std::vector<int64_t>{1, 0}));

  Tensor f(DType::F32, {1});
  f.setInt(0, 16777217);  // 2^24 + 1 rounds to 2^24 in f32
  EXPECT_EQ(f.getDouble(0), 16777216.0);
  EXPECT_EQ(f.getInt(0), 16777216);
}

TEST(TensorTest, DenseRoundTrip) {
  Tensor t = ints(DType::I64, {2, 2}, {1, -2, 3, std::numeric_limits<int64_t>::max()});
  DenseTensor d = t.toDense();
  EXPECT_EQ(d.type.str(), "i64[2,2]");
  EXPECT_EQ(d.getInt(3), std::numeric_limits<int64_t>::max());
  Tensor back = Tensor::fromDense(d);
  EXPECT_EQ(int64s(back), int64s(t));
  EXPECT_EQ(back.shape(), t.shape());
}

// --- Unary ---------------------------------------------------------------------------

TEST(InterpreterElementwiseTest, FloatUnaryOps) {
  expectTensor(run(OpKind::Sqrt, {f32({3}, {4, 0, -1})}), {3}, {2, 0, kNaN});
  expectTensor(run(OpKind::Rsqrt, {f32({2}, {4, 0})}), {2}, {0.5, kInf});
  expectTensor(run(OpKind::Reciprocal, {f32({2}, {4, -0.5})}), {2}, {0.25, -2});
  expectTensor(run(OpKind::Exp, {f32({2}, {0, 1})}), {2}, {1, 2.718281828459045});
  expectTensor(run(OpKind::Log, {f32({3}, {1, 0, -1})}), {3}, {0, -kInf, kNaN});
  expectTensor(run(OpKind::Sigmoid, {f32({3}, {0, 1000, -1000})}), {3}, {0.5, 1, 0});
  expectTensor(run(OpKind::Tanh, {f32({2}, {0, 1})}), {2}, {0, 0.7615941559557649});
  expectTensor(run(OpKind::Erf, {f32({2}, {0, 1})}), {2}, {0, 0.8427007929497149});
  expectTensor(run(OpKind::Sin, {f32({1}, {M_PI / 2})}), {1}, {1});
  expectTensor(run(OpKind::Cos, {f32({1}, {0})}), {1}, {1});
  expectTensor(run(OpKind::Tan, {f32({1}, {M_PI / 4})}), {1}, {1});
  expectTensor(run(OpKind::Asin, {f32({2}, {1, 2})}), {2}, {M_PI / 2, kNaN});
  expectTensor(run(OpKind::Acos, {f32({1}, {1})}), {1}, {0});
  expectTensor(run(OpKind::Atan, {f32({1}, {1})}), {1}, {M_PI / 4});
  expectTensor(run(OpKind::Sinh, {f32({1}, {1})}), {1}, {1.1752011936438014});
  expectTensor(run(OpKind::Cosh, {f32({1}, {1})}), {1}, {1.5430806348152437});
  expectTensor(run(OpKind::Asinh, {f32({1}, {1})}), {1}, {0.881373587019543});
  expectTensor(run(OpKind::Acosh, {f32({2}, {1, 0})}), {2}, {0, kNaN});
  expectTensor(run(OpKind::Atanh, {f32({2}, {0.5, 1})}), {2}, {0.5493061443340549, kInf});
  // torch.nn.functional.hardswish of the same values in float64: 0 at and
  // below -3, x from 3 up, +inf for +inf and NaN for -inf (-inf * 0).
  expectTensor(run(OpKind::HardSwish, {f32({11}, {-4, -3, -2.5, -1, 0, 0.5, 2.5, 3, 4, kInf, -kInf})}), {11},
               {-0.0, -0.0, -0.20833333333333334, -0.3333333333333333, 0.0, 0.2916666666666667, 2.2916666666666665, 3,
                4, kInf, kNaN});
  expectTensor(run(OpKind::Floor, {f32({3}, {-1.5, 1.5, 2})}), {3}, {-2, 1, 2});
  expectTensor(run(OpKind::Ceil, {f32({3}, {-1.5, 1.5, 2})}), {3}, {-1, 2, 2});
  // Half to even.
  expectTensor(run(OpKind::Round, {f32({6}, {0.5, 1.5, 2.5, -0.5, -1.5, 2.4})}), {6}, {0, 2, 2, -0, -2, 2});
}

TEST(InterpreterElementwiseTest, SignedUnaryOpsOnFloatsAndIntegers) {
  expectTensor(run(OpKind::Neg, {f32({2}, {1.5, -0})}), {2}, {-1.5, 0});
  expectTensor(run(OpKind::Abs, {f32({2}, {-1.5, 2})}), {2}, {1.5, 2});
  expectTensor(run(OpKind::Sign, {f32({4}, {-3, 0, 2, kNaN})}), {4}, {-1, 0, 1, kNaN});
  expectTensor(run(OpKind::Relu, {f32({3}, {-1, 0, 2})}), {3}, {0, 0, 2});
  expectInts(run(OpKind::Neg, {ints(DType::I8, {2}, {5, -128})}), {2}, {-5, -128});  // -(-128) wraps
  expectInts(run(OpKind::Abs, {ints(DType::I32, {2}, {-7, 7})}), {2}, {7, 7});
  expectInts(run(OpKind::Sign, {ints(DType::I64, {3}, {-9, 0, 9})}), {3}, {-1, 0, 1});
  expectInts(run(OpKind::Relu, {ints(DType::I16, {2}, {-9, 9})}), {2}, {0, 9});
  // Unsigned: abs is the identity, sign is 0 or 1, neg wraps.
  expectInts(run(OpKind::Abs, {ints(DType::U8, {2}, {0, 200})}), {2}, {0, 200});
  expectInts(run(OpKind::Sign, {ints(DType::U8, {2}, {0, 200})}), {2}, {0, 1});
  expectInts(run(OpKind::Neg, {ints(DType::U8, {2}, {0, 5})}), {2}, {0, 251});
}

TEST(InterpreterElementwiseTest, BoolAndClassificationUnaryOps) {
  expectInts(run(OpKind::Not, {bools({3}, {1, 0, 1})}), {3}, {0, 1, 0});
  Tensor nan = run(OpKind::IsNan, {f32({4}, {kNaN, 1, kInf, -kInf})});
  EXPECT_EQ(nan.dtype(), DType::Bool);
  expectInts(nan, {4}, {1, 0, 0, 0});
  expectInts(run(OpKind::IsInf, {f32({4}, {kNaN, 1, kInf, -kInf})}), {4}, {0, 0, 1, 1});
}

TEST(InterpreterElementwiseTest, UnaryOnScalarsAndEmptyTensors) {
  expectTensor(run(OpKind::Exp, {f32({}, {0})}), {}, {1});
  expectTensor(run(OpKind::Exp, {f32({0, 3}, {})}), {0, 3}, {});
}

// --- Binary --------------------------------------------------------------------------

TEST(InterpreterElementwiseTest, BroadcastingColumnByRow) {
  Tensor a = f32({3, 1}, {1, 2, 3});
  Tensor b = f32({1, 4}, {10, 20, 30, 40});
  expectTensor(run(OpKind::Add, {a, b}), {3, 4}, {11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43});
  expectTensor(run(OpKind::Sub, {b, a}), {3, 4}, {9, 19, 29, 39, 8, 18, 28, 38, 7, 17, 27, 37});
}

TEST(InterpreterElementwiseTest, BroadcastingScalarsAndLowerRanks) {
  expectTensor(run(OpKind::Mul, {f32({2, 2}, {1, 2, 3, 4}), f32({}, {10})}), {2, 2}, {10, 20, 30, 40});
  expectTensor(run(OpKind::Div, {f32({}, {1}), f32({2}, {2, 4})}), {2}, {0.5, 0.25});
  expectTensor(run(OpKind::Add, {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3}, {10, 20, 30})}), {2, 3},
               {11, 22, 33, 14, 25, 36});
  expectTensor(run(OpKind::Add, {f32({}, {1}), f32({}, {2})}), {}, {3});
  // A zero-size dim broadcasts against 1 and stays zero.
  expectTensor(run(OpKind::Add, {f32({0, 1}, {}), f32({1, 3}, {1, 2, 3})}), {0, 3}, {});
}

TEST(InterpreterElementwiseTest, FloatPowMaxMinAndNaNPropagation) {
  expectTensor(run(OpKind::Pow, {f32({3}, {2, 4, -8}), f32({3}, {3, 0.5, 1.0 / 3})}), {3}, {8, 2, kNaN});
  expectTensor(run(OpKind::Max, {f32({4}, {1, kNaN, 3, -0.5}), f32({4}, {kNaN, 1, 2, -1})}), {4},
               {kNaN, kNaN, 3, -0.5});
  expectTensor(run(OpKind::Min, {f32({4}, {1, kNaN, 3, -0.5}), f32({4}, {kNaN, 1, 2, -1})}), {4}, {kNaN, kNaN, 2, -1});
  expectTensor(run(OpKind::Add, {f32({2}, {kNaN, kInf}), f32({2}, {1, -kInf})}), {2}, {kNaN, kNaN});
  expectTensor(run(OpKind::Div, {f32({3}, {1, -1, 0}), f32({3}, {0, 0, 0})}), {3}, {kInf, -kInf, kNaN});
}

TEST(InterpreterElementwiseTest, ModTakesTheDivisorsSignAndRemTheDividends) {
  Tensor x = f32({4}, {7.5, -7.5, 7.5, -7.5});
  Tensor y = f32({4}, {2, 2, -2, -2});
  expectTensor(run(OpKind::Mod, {x, y}), {4}, {1.5, 0.5, -0.5, -1.5});
  expectTensor(run(OpKind::Rem, {x, y}), {4}, {1.5, -1.5, 1.5, -1.5});
  Tensor xi = ints(DType::I32, {5}, {7, -7, 7, -7, 6});
  Tensor yi = ints(DType::I32, {5}, {2, 2, -2, -2, 3});
  expectInts(run(OpKind::Mod, {xi, yi}), {5}, {1, 1, -1, -1, 0});
  expectInts(run(OpKind::Rem, {xi, yi}), {5}, {1, -1, 1, -1, 0});
}

TEST(InterpreterElementwiseTest, IntegerDivisionTruncatesTowardZero) {
  expectInts(run(OpKind::Div, {ints(DType::I32, {4}, {7, -7, 7, -7}), ints(DType::I32, {4}, {2, 2, -2, -2})}), {4},
             {3, -3, -3, 3});
  // INT_MIN / -1 wraps to INT_MIN instead of trapping.
  expectInts(
      run(OpKind::Div, {ints(DType::I32, {1}, {std::numeric_limits<int32_t>::min()}), ints(DType::I32, {1}, {-1})}),
      {1}, {std::numeric_limits<int32_t>::min()});
  expectInts(run(OpKind::Div, {ints(DType::U8, {1}, {250}), ints(DType::U8, {1}, {7})}), {1}, {35});
}

TEST(InterpreterElementwiseTest, IntegerDivisionByZeroIsAnErrorNamingTheOp) {
  std::string error = runError(OpKind::Div, {ints(DType::I64, {2}, {1, 2}), ints(DType::I64, {2}, {1, 0})});
  EXPECT_NE(error.find("'div'"), std::string::npos) << error;
  EXPECT_NE(error.find("division by zero"), std::string::npos) << error;
  EXPECT_NE(runError(OpKind::Mod, {ints(DType::I32, {1}, {1}), ints(DType::I32, {1}, {0})}).find("by zero"),
            std::string::npos);
  EXPECT_NE(runError(OpKind::Rem, {ints(DType::I8, {1}, {1}), ints(DType::I8, {1}, {0})}).find("by zero"),
            std::string::npos);
}

TEST(InterpreterElementwiseTest, IntegerArithmeticWraps) {
  expectInts(run(OpKind::Add, {ints(DType::I8, {2}, {127, -128}), ints(DType::I8, {2}, {1, -1})}), {2}, {-128, 127});
  expectInts(run(OpKind::Mul, {ints(DType::U8, {2}, {16, 3}), ints(DType::U8, {2}, {16, 5})}), {2}, {0, 15});
  expectInts(run(OpKind::Sub, {ints(DType::U8, {1}, {0}), ints(DType::U8, {1}, {1})}), {1}, {255});
  const int64_t big = std::numeric_limits<int64_t>::max();
  expectInts(run(OpKind::Add, {ints(DType::I64, {1}, {big}), ints(DType::I64, {1}, {1})}), {1},
             {std::numeric_limits<int64_t>::min()});
  expectInts(run(OpKind::Max, {ints(DType::I16, {2}, {-5, 9}), ints(DType::I16, {2}, {3, -9})}), {2}, {3, 9});
  expectInts(run(OpKind::Min, {ints(DType::I16, {2}, {-5, 9}), ints(DType::I16, {2}, {3, -9})}), {2}, {-5, -9});
}

TEST(InterpreterElementwiseTest, IntegerPow) {
  expectInts(run(OpKind::Pow, {ints(DType::I32, {4}, {2, 3, -2, 0}), ints(DType::I32, {4}, {10, 0, 3, 0})}), {4},
             {1024, 1, -8, 1});
  expectInts(run(OpKind::Pow, {ints(DType::I8, {1}, {2}), ints(DType::I8, {1}, {7})}), {1}, {-128});  // wraps
  EXPECT_NE(runError(OpKind::Pow, {ints(DType::I32, {1}, {2}), ints(DType::I32, {1}, {-1})}).find("negative exponent"),
            std::string::npos);
}

// --- Logical, comparison, select ----------------------------------------------------------

TEST(InterpreterElementwiseTest, LogicalOpsBroadcast) {
  Tensor a = bools({2, 2}, {0, 0, 1, 1});
  Tensor b = bools({2}, {0, 1});
  expectInts(run(OpKind::And, {a, b}), {2, 2}, {0, 0, 0, 1});
  expectInts(run(OpKind::Or, {a, b}), {2, 2}, {0, 1, 1, 1});
  expectInts(run(OpKind::Xor, {a, b}), {2, 2}, {0, 1, 1, 0});
}

TEST(InterpreterElementwiseTest, ComparisonsGiveBool) {
  Tensor x = f32({4}, {1, 2, 3, kNaN});
  Tensor y = f32({}, {2});
  Tensor lt = run(OpKind::Lt, {x, y});
  EXPECT_EQ(lt.dtype(), DType::Bool);
  expectInts(lt, {4}, {1, 0, 0, 0});
  expectInts(run(OpKind::Le, {x, y}), {4}, {1, 1, 0, 0});
  expectInts(run(OpKind::Gt, {x, y}), {4}, {0, 0, 1, 0});
  expectInts(run(OpKind::Ge, {x, y}), {4}, {0, 1, 1, 0});
  expectInts(run(OpKind::Eq, {x, y}), {4}, {0, 1, 0, 0});
  expectInts(run(OpKind::Ne, {x, y}), {4}, {1, 0, 1, 1});  // NaN != anything
  // 64-bit integers compare exactly (not through double).
  const int64_t big = (int64_t{1} << 53) + 1;
  expectInts(run(OpKind::Eq, {ints(DType::I64, {1}, {big}), ints(DType::I64, {1}, {big - 1})}), {1}, {0});
  expectInts(run(OpKind::Lt, {ints(DType::U8, {2}, {200, 1}), ints(DType::U8, {2}, {100, 2})}), {2}, {0, 1});
  expectInts(run(OpKind::Eq, {bools({2}, {1, 0}), bools({2}, {1, 1})}), {2}, {1, 0});
}

TEST(InterpreterElementwiseTest, SelectBroadcastsAllThree) {
  Tensor cond = bools({2, 1}, {1, 0});
  Tensor x = f32({1, 3}, {1, 2, 3});
  Tensor y = f32({}, {-1});
  expectTensor(run(OpKind::Select, {cond, x, y}), {2, 3}, {1, 2, 3, -1, -1, -1});
  expectInts(run(OpKind::Select, {bools({2}, {0, 1}), ints(DType::I64, {2}, {5, 6}), ints(DType::I64, {2}, {7, 8})}),
             {2}, {7, 6});
}

// --- Cast and 16-bit floats -----------------------------------------------------------------

TEST(InterpreterElementwiseTest, CastRules) {
  auto cast = [](Tensor x, DType to) {
    TensorType type{to, x.type().shape};
    return run(OpKind::Cast, {std::move(x)}, {}, {type});
  };
  expectInts(cast(f32({4}, {2.7, -2.7, 0.5, -0.5}), DType::I32), {4}, {2, -2, 0, 0});
  expectInts(cast(ints(DType::I32, {3}, {300, -1, 255}), DType::U8), {3}, {44, 255, 255});
  expectInts(cast(ints(DType::I64, {2}, {200, -129}), DType::I8), {2}, {-56, 127});
  expectInts(cast(f32({4}, {0, 0.5, -0.0, kNaN}), DType::Bool), {4}, {0, 1, 0, 1});
  expectInts(cast(ints(DType::I32, {3}, {0, 7, -1}), DType::Bool), {3}, {0, 1, 1});
  expectTensor(cast(bools({2}, {1, 0}), DType::F32), {2}, {1, 0});
  expectTensor(cast(ints(DType::I16, {2}, {-3, 1000}), DType::F64), {2}, {-3, 1000});
  Tensor half = cast(f32({2}, {0.1, 65504}), DType::F16);
  EXPECT_EQ(half.dtype(), DType::F16);
  expectTensor(half, {2}, {0.0999755859375, 65504}, 0);
  expectTensor(cast(f32({}, {1.5}), DType::F64), {}, {1.5});
}

TEST(InterpreterElementwiseTest, HalfAndBFloat16RoundOnStore) {
  // f16 has 11 significant bits: spacing 2 at 2048, so 2048 + 1 ties to even.
  Tensor a = makeTensor(DType::F16, {2}, {2048, 2048});
  Tensor b = makeTensor(DType::F16, {2}, {1, 3});
  expectTensor(run(OpKind::Add, {a, b}), {2}, {2048, 2052}, 0);
  // bf16 has 8: spacing 2^-7 at 1, so 1 + 2^-8 ties to even, 1 + 3*2^-8 up.
  Tensor c = makeTensor(DType::BF16, {2}, {1, 1});
  Tensor d = makeTensor(DType::BF16, {2}, {1.0 / 256, 3.0 / 256});
  expectTensor(run(OpKind::Add, {c, d}), {2}, {1, 1 + 4.0 / 256}, 0);
  // Math is done in double and rounded once: 1/3 in f16.
  expectTensor(run(OpKind::Div, {makeTensor(DType::F16, {1}, {1}), makeTensor(DType::F16, {1}, {3})}), {1},
               {0.333251953125}, 0);
  expectTensor(run(OpKind::Exp, {makeTensor(DType::BF16, {1}, {1})}), {1}, {2.71875}, 0);
}

TEST(InterpreterElementwiseTest, OperandDTypesAreChecked) {
  EXPECT_NE(runError(OpKind::Exp, {ints(DType::I32, {1}, {1})}).find("'exp'"), std::string::npos);
}

}  // namespace
}  // namespace kiln::test
