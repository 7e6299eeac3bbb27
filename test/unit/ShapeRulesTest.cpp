// Tests of the shape rules (ir/ShapeRules*.cpp): NumPy broadcasting over
// static, symbolic, unknown and zero-size dims; the arithmetic of matmul,
// conv, conv_transpose, pooling, slice, pad, concat, gather and reductions;
// declared-type ops; composites; and the error messages for mismatches.
// Rules are called directly through ShapeQuery on types written as text.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "ir/ShapeRules.h"

namespace kiln {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

/// A type written as in text IR: `f32[2,?,N]`.
TensorType ty(std::string_view text) {
  size_t open = text.find('[');
  TensorType t;
  auto dtype = parseDType(text.substr(0, open));
  EXPECT_TRUE(dtype.has_value()) << text;
  t.dtype = dtype.value_or(DType::F32);
  std::string_view dims = text.substr(open + 1, text.size() - open - 2);
  while (!dims.empty()) {
    size_t comma = dims.find(',');
    std::string_view d = dims.substr(0, comma);
    if (d == "?")
      t.shape.push_back(Dim::unknown());
    else if (d[0] >= '0' && d[0] <= '9')
      t.shape.push_back(Dim::fixed(std::stoll(std::string(d))));
    else
      t.shape.push_back(Dim::symbolic(std::string(d)));
    dims = comma == std::string_view::npos ? std::string_view() : dims.substr(comma + 1);
  }
  return t;
}

Shape shape(std::string_view dims) { return ty("f32[" + std::string(dims) + "]").shape; }

/// The rule's result types joined by ", ", or "error: <message>".
std::string infer(OpKind kind, std::vector<std::string> operands, AttrMap attrs = {},
                  std::vector<std::string> declared = {}) {
  std::vector<TensorType> operandTypes, declaredTypes;
  for (const auto& s : operands) operandTypes.push_back(ty(s));
  for (const auto& s : declared) declaredTypes.push_back(ty(s));
  auto result = inferResultTypes(ShapeQuery{kind, operandTypes, &attrs, declaredTypes, {}});
  if (!result) return "error: " + result.error().message();
  std::string out;
  for (const auto& t : *result) out += (out.empty() ? "" : ", ") + t.str();
  return out;
}

std::string broadcast(std::string_view a, std::string_view b) {
  auto s = broadcastShapes(shape(a), shape(b));
  return s ? shapeStr(*s) : "error: " + s.error().message();
}

using Ints = std::vector<int64_t>;

// --- Broadcasting ----------------------------------------------------------------

TEST(ShapeRulesTest, BroadcastsStaticDims) {
  EXPECT_EQ(broadcast("2,3", "2,3"), "[2,3]");
  EXPECT_EQ(broadcast("2,1", "1,3"), "[2,3]");
  EXPECT_EQ(broadcast("4,2,3", "3"), "[4,2,3]");
  EXPECT_EQ(broadcast("", "5,1"), "[5,1]");
  EXPECT_EQ(broadcast("", ""), "[]");
  EXPECT_EQ(broadcast("2,3", "4,3"), "error: shapes [2,3] and [4,3] do not broadcast: dim -2 is 2 vs 4");
}

TEST(ShapeRulesTest, BroadcastsZeroSizeDims) {
  EXPECT_EQ(broadcast("0,3", "1,3"), "[0,3]");
  EXPECT_EQ(broadcast("0", "0"), "[0]");
  EXPECT_EQ(broadcast("1", "0"), "[0]");
  EXPECT_EQ(broadcast("0", "3"), "error: shapes [0] and [3] do not broadcast: dim -1 is 0 vs 3");
}

TEST(ShapeRulesTest, BroadcastsSymbolicAndUnknownDims) {
  EXPECT_EQ(broadcast("N", "N"), "[N]");
  EXPECT_EQ(broadcast("N", "1"), "[N]");
  EXPECT_EQ(broadcast("N", "3"), "[3]");  // N is 1 or 3; either way 3
  EXPECT_EQ(broadcast("3", "N"), "[3]");
  EXPECT_EQ(broadcast("N", "M"), "[?]");  // either may be 1
  EXPECT_EQ(broadcast("?", "1"), "[?]");
  EXPECT_EQ(broadcast("?", "5"), "[5]");
  EXPECT_EQ(broadcast("?", "N"), "[?]");  // N may be 1 while ? is not
  EXPECT_EQ(broadcast("N", "?"), "[?]");
  EXPECT_EQ(broadcast("?", "?"), "[?]");
  EXPECT_EQ(broadcast("N,1", "?,4"), "[?,4]");
  EXPECT_EQ(broadcast("N,1", "N,4"), "[N,4]");
}

TEST(ShapeRulesTest, NormalizesAxes) {
  EXPECT_EQ(normalizeAxis(0, 3), 0);
  EXPECT_EQ(normalizeAxis(-1, 3), 2);
  EXPECT_EQ(normalizeAxis(-3, 3), 0);
  EXPECT_EQ(normalizeAxis(3, 3), std::nullopt);
  EXPECT_EQ(normalizeAxis(-4, 3), std::nullopt);
  EXPECT_EQ(normalizeAxis(0, 0), std::nullopt);
}

TEST(ShapeRulesTest, AttrFallsBackToTableDefault) {
  AttrMap attrs{{"keepdims", Attribute(true)}};
  std::vector<TensorType> operands{ty("f32[2]")};
  ShapeQuery q{OpKind::ReduceSum, operands, &attrs, {}, {}};
  ASSERT_NE(q.attr("keepdims"), nullptr);
  EXPECT_TRUE(q.attr("keepdims")->getBool());
  ShapeQuery defaults{OpKind::ArgMax, operands, nullptr, {}, {}};
  ASSERT_NE(defaults.attr("keepdims"), nullptr);
  EXPECT_FALSE(defaults.attr("keepdims")->getBool());
  EXPECT_EQ(defaults.attr("axis"), nullptr);  // required: no default
  EXPECT_EQ(defaults.attr("nonsense"), nullptr);
}

// --- Elementwise -----------------------------------------------------------------

TEST(ShapeRulesTest, UnaryOpsCheckTheirDTypes) {
  EXPECT_EQ(infer(OpKind::Exp, {"f16[2,N]"}), "f16[2,N]");
  EXPECT_EQ(infer(OpKind::Exp, {"i32[2]"}), "error: 'exp' operand 0 has dtype i32, expected a float dtype");
  EXPECT_EQ(infer(OpKind::Neg, {"i64[]"}), "i64[]");
  EXPECT_EQ(infer(OpKind::Relu, {"bool[2]"}),
            "error: 'relu' operand 0 has dtype bool, expected a numeric dtype (not bool)");
  EXPECT_EQ(infer(OpKind::Not, {"bool[3]"}), "bool[3]");
  EXPECT_EQ(infer(OpKind::Not, {"f32[3]"}), "error: 'not' operand 0 has dtype f32, expected bool");
  EXPECT_EQ(infer(OpKind::IsNan, {"f64[?,4]"}), "bool[?,4]");
  EXPECT_EQ(infer(OpKind::Silu, {"bf16[8]"}), "bf16[8]");
}

TEST(ShapeRulesTest, BinaryOpsBroadcastAndRequireOneDType) {
  EXPECT_EQ(infer(OpKind::Add, {"f32[N,3]", "f32[3]"}), "f32[N,3]");
  EXPECT_EQ(infer(OpKind::Mul, {"f32[]", "f32[2,3]"}), "f32[2,3]");
  EXPECT_EQ(infer(OpKind::Sub, {"i32[0,1]", "i32[5]"}), "i32[0,5]");
  EXPECT_EQ(infer(OpKind::Add, {"f32[2]", "f64[2]"}),
            "error: 'add' operand 1 has dtype f64, expected f32 (operand 0's dtype)");
  EXPECT_EQ(infer(OpKind::Add, {"f32[2,3]", "f32[4,3]"}),
            "error: 'add' operand 1: shapes [2,3] and [4,3] do not broadcast: dim -2 is 2 vs 4");
  EXPECT_EQ(infer(OpKind::Pow, {"bool[2]", "bool[2]"}),
            "error: 'pow' operand 0 has dtype bool, expected a numeric dtype (not bool)");
  EXPECT_EQ(infer(OpKind::Lt, {"i8[4,1]", "i8[3]"}), "bool[4,3]");
  EXPECT_EQ(infer(OpKind::Eq, {"bool[2]", "bool[]"}), "bool[2]");
  EXPECT_EQ(infer(OpKind::And, {"bool[2]", "bool[2]"}), "bool[2]");
  EXPECT_EQ(infer(OpKind::Or, {"u8[2]", "u8[2]"}), "error: 'or' operand 0 has dtype u8, expected bool");
}

TEST(ShapeRulesTest, SelectBroadcastsAllThree) {
  EXPECT_EQ(infer(OpKind::Select, {"bool[2,1,1]", "f32[3,1]", "f32[4]"}), "f32[2,3,4]");
  EXPECT_EQ(infer(OpKind::Select, {"f32[2]", "f32[2]", "f32[2]"}),
            "error: 'select' operand 0 has dtype f32, expected bool");
  EXPECT_EQ(infer(OpKind::Select, {"bool[2]", "f32[2]", "i32[2]"}),
            "error: 'select' operand 2 has dtype i32, expected f32 (operand 1's dtype)");
}

// --- Declared-type ops and constants -------------------------------------------------

TEST(ShapeRulesTest, CastTakesDTypeFromDeclarationAndShapeFromOperand) {
  EXPECT_EQ(infer(OpKind::Cast, {"f32[2,N]"}, {}, {"i32[?,?]"}), "i32[2,N]");
  EXPECT_EQ(infer(OpKind::Cast, {"f32[?]"}, {}, {"bool[4]"}), "bool[4]");
  EXPECT_EQ(infer(OpKind::Cast, {"f32[2]"}, {}, {"i32[2,1]"}),
            "error: 'cast' declared result type i32[2,1] must have the operand's rank 1");
  EXPECT_EQ(infer(OpKind::Cast, {"f32[2]"}),
            "error: 'cast' takes its result type from the declaration, but no result type was declared");
}

TEST(ShapeRulesTest, ReshapeChecksStaticElementCounts) {
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[2,3]"}, {}, {"f32[3,2]"}), "f32[3,2]");
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[2,3]"}, {}, {"f32[3,?]"}), "f32[3,2]");  // the one open dim is the quotient
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[2,3,4]"}, {}, {"f32[?,?]"}), "f32[?,?]");
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[N,3]"}, {}, {"f32[M,7]"}), "f32[M,7]");  // nothing to check
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[0,3]"}, {}, {"f32[0,?]"}), "f32[0,?]");
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[2,5]"}, {}, {"f32[3,4]"}),
            "error: 'reshape' result f32[3,4] has 12 elements, but operand 0 f32[2,5] has 10");
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[2,5]"}, {}, {"f32[3,?]"}),
            "error: 'reshape' result f32[3,?] cannot hold the 10 elements of operand 0 f32[2,5]: its static dims "
            "multiply to 3");
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[2]"}, {}, {"i32[2]"}),
            "error: 'reshape' declared result type i32[2] must have the operand's dtype f32");
  EXPECT_EQ(infer(OpKind::Reshape, {"f32[2]"}),
            "error: 'reshape' takes its result type from the declaration, but no result type was declared");
}

TEST(ShapeRulesTest, BroadcastOpChecksTheOperandFits) {
  EXPECT_EQ(infer(OpKind::Broadcast, {"f32[3]"}, {}, {"f32[2,3]"}), "f32[2,3]");
  EXPECT_EQ(infer(OpKind::Broadcast, {"f32[1,3]"}, {}, {"f32[N,?]"}), "f32[N,3]");
  EXPECT_EQ(infer(OpKind::Broadcast, {"f32[4]"}, {}, {"f32[2,3]"}),
            "error: 'broadcast' operand 0 of type f32[4] does not broadcast to f32[2,3]: dim 0 = 4 is neither 1 nor 3");
  EXPECT_EQ(infer(OpKind::Broadcast, {"f32[2,3]"}, {}, {"f32[3]"}),
            "error: 'broadcast' operand 0 of type f32[2,3] does not broadcast to f32[3]: rank 2 exceeds the target "
            "rank 1");
}

TEST(ShapeRulesTest, ConstantTypeIsItsValueType) {
  DenseTensor value = DenseTensor::zeros(ty("i64[2,2]"));
  EXPECT_EQ(infer(OpKind::Constant, {}, {{"value", Attribute(value)}}), "i64[2,2]");
  DenseTensor bad = value;
  bad.bytes.pop_back();
  EXPECT_EQ(infer(OpKind::Constant, {}, {{"value", Attribute(bad)}}),
            "error: 'constant' attribute 'value' of type i64[2,2] holds 31 bytes, which does not match its type");
  EXPECT_EQ(infer(OpKind::Constant, {}, {{"value", Attribute(int64_t{3})}}),
            "error: 'constant' attribute 'value' must be tensor, got int");
  EXPECT_EQ(infer(OpKind::Iota, {}, {{"axis", Attribute(1)}}, {"i64[3,N]"}), "i64[3,N]");
  EXPECT_EQ(infer(OpKind::Iota, {}, {{"axis", Attribute(2)}}, {"i64[3,N]"}),
            "error: 'iota' attribute 'axis' = 2 is out of range for rank 2 (expected -2 to 1)");
  EXPECT_EQ(infer(OpKind::RandomNormal, {}, {}, {"f32[4]"}), "f32[4]");
  EXPECT_EQ(infer(OpKind::RandomUniform, {}, {}, {"i32[4]"}),
            "error: 'random_uniform' declared result type i32[4] must have a float dtype");
}

// --- Layout ------------------------------------------------------------------------

TEST(ShapeRulesTest, TransposePermutesDims) {
  EXPECT_EQ(infer(OpKind::Transpose, {"f32[2,N,4]"}, {{"perm", Attribute(Ints{2, 0, 1})}}), "f32[4,2,N]");
  EXPECT_EQ(infer(OpKind::Transpose, {"f32[2,3]"}, {{"perm", Attribute(Ints{0, 0})}}),
            "error: 'transpose' attribute 'perm' is not a permutation of 0..1: entry 1 = 0 is repeated");
  EXPECT_EQ(infer(OpKind::Transpose, {"f32[2,3]"}, {{"perm", Attribute(Ints{0})}}),
            "error: 'transpose' attribute 'perm' has 1 entries, expected 2 (the operand's rank)");
  EXPECT_EQ(infer(OpKind::Transpose, {"f32[2,3]"}), "error: 'transpose' requires attribute 'perm'");
}

std::string slice(std::string_view type, Ints starts, Ints ends, Ints steps) {
  return infer(OpKind::Slice, {std::string(type)},
               {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
}

TEST(ShapeRulesTest, SliceFollowsPythonSemantics) {
  EXPECT_EQ(slice("f32[10]", {2}, {8}, {2}), "f32[3]");
  EXPECT_EQ(slice("f32[10]", {-3}, {kMax}, {1}), "f32[3]");
  EXPECT_EQ(slice("f32[10]", {0}, {100}, {1}), "f32[10]");      // end clamps to the dim
  EXPECT_EQ(slice("f32[10]", {5}, {2}, {1}), "f32[0]");         // empty, never negative
  EXPECT_EQ(slice("f32[10]", {8}, {2}, {-3}), "f32[2]");        // 8, 5
  EXPECT_EQ(slice("f32[10]", {-1}, {kMin}, {-1}), "f32[10]");   // the whole dim reversed
  EXPECT_EQ(slice("f32[10]", {kMax}, {kMin}, {-4}), "f32[3]");  // 9, 5, 1
  EXPECT_EQ(slice("f32[10]", {0}, {10}, {kMax}), "f32[1]");
  EXPECT_EQ(slice("f32[10]", {9}, {-11}, {kMin}), "f32[1]");
  EXPECT_EQ(slice("f32[0]", {0}, {kMax}, {1}), "f32[0]");
  EXPECT_EQ(slice("f32[2,7]", {0, 1}, {kMax, -1}, {1, 2}), "f32[2,3]");
}

TEST(ShapeRulesTest, SliceKeepsNonStaticDimsOnlyWhenTakenWhole) {
  EXPECT_EQ(slice("f32[N,4]", {0, 1}, {kMax, 3}, {1, 1}), "f32[N,2]");
  EXPECT_EQ(slice("f32[N]", {kMax}, {kMin}, {-1}), "f32[N]");
  EXPECT_EQ(slice("f32[N]", {1}, {kMax}, {1}), "f32[?]");
  EXPECT_EQ(slice("f32[?]", {0}, {4}, {1}), "f32[?]");
  EXPECT_EQ(slice("f32[4]", {0}, {4}, {0}), "error: 'slice' attribute 'steps' entry 0 is 0, expected non-zero");
  EXPECT_EQ(slice("f32[4,4]", {0}, {4}, {1}),
            "error: 'slice' attribute 'starts' has 1 entries, expected 2 (one per dim of operand 0)");
}

TEST(ShapeRulesTest, ConcatSumsTheAxis) {
  AttrMap axis1{{"axis", Attribute(1)}};
  EXPECT_EQ(infer(OpKind::Concat, {"f32[2,3]", "f32[2,5]", "f32[?,0]"}, axis1), "f32[2,8]");
  EXPECT_EQ(infer(OpKind::Concat, {"f32[2,3]"}, {{"axis", Attribute(-1)}}), "f32[2,3]");
  EXPECT_EQ(infer(OpKind::Concat, {"f32[2,N]", "f32[2,0]"}, axis1), "f32[2,N]");
  EXPECT_EQ(infer(OpKind::Concat, {"f32[2,N]", "f32[2,3]"}, axis1), "f32[2,?]");
  EXPECT_EQ(infer(OpKind::Concat, {"f32[2,3]", "f32[4,3]"}, axis1),
            "error: 'concat' operand 1 has dim 0 = 4, expected 2 (the dim of the operands before it)");
  EXPECT_EQ(infer(OpKind::Concat, {"f32[2,3]", "f32[2]"}, axis1),
            "error: 'concat' operand 1 has type f32[2], expected rank 2 (operand 0's rank)");
  EXPECT_EQ(infer(OpKind::Concat, {"f32[]"}, {{"axis", Attribute(0)}}),
            "error: 'concat' attribute 'axis' = 0 is out of range: the operand is a scalar and has no axes");
}

TEST(ShapeRulesTest, PadAddsAndCrops) {
  EXPECT_EQ(infer(OpKind::Pad, {"f32[2,3]"}, {{"pads", Attribute(Ints{1, 0, 1, 2})}}), "f32[4,5]");
  EXPECT_EQ(infer(OpKind::Pad, {"f32[2,3]"}, {{"pads", Attribute(Ints{0, -1, 0, -1})}}), "f32[2,1]");
  EXPECT_EQ(infer(OpKind::Pad, {"f32[N,?]"}, {{"pads", Attribute(Ints{0, 1, 0, 0})}}), "f32[N,?]");
  EXPECT_EQ(infer(OpKind::Pad, {"f32[2]"}, {{"pads", Attribute(Ints{-2, -1})}}),
            "error: 'pad' attribute 'pads' gives dim 0 of size 2 a size out of range (pads -2 and -1)");
  EXPECT_EQ(infer(OpKind::Pad, {"f32[3]"}, {{"pads", Attribute(Ints{3, 0})}, {"mode", Attribute("reflect")}}),
            "error: 'pad' attribute 'pads' reflects dim 0 of size 3 by 3, expected less than the dim");
  EXPECT_EQ(infer(OpKind::Pad, {"f32[3]"}, {{"pads", Attribute(Ints{2, 2})}, {"mode", Attribute("reflect")}}),
            "f32[7]");
  EXPECT_EQ(infer(OpKind::Pad, {"f32[3]"}, {{"pads", Attribute(Ints{1, 1})}, {"mode", Attribute("wrap")}}),
            "error: 'pad' attribute 'mode' is \"wrap\", expected one of \"constant\", \"reflect\", \"edge\"");
  EXPECT_EQ(infer(OpKind::Pad, {"f32[3]"}, {{"pads", Attribute(Ints{1})}}),
            "error: 'pad' attribute 'pads' has 1 entries, expected 2 (begins then ends for rank 1)");
}

// --- Indexing ----------------------------------------------------------------------

TEST(ShapeRulesTest, GatherReplacesTheAxisByTheIndicesShape) {
  EXPECT_EQ(infer(OpKind::Gather, {"f32[5,4,3]", "i64[2,7]"}, {{"axis", Attribute(1)}}), "f32[5,2,7,3]");
  EXPECT_EQ(infer(OpKind::Gather, {"f32[5,4,3]", "i32[]"}, {{"axis", Attribute(-1)}}), "f32[5,4]");
  EXPECT_EQ(infer(OpKind::Gather, {"f32[V,D]", "i64[B,S]"}), "f32[B,S,D]");  // an embedding lookup
  EXPECT_EQ(infer(OpKind::Gather, {"f32[5]", "f32[2]"}),
            "error: 'gather' operand 1 has dtype f32, expected i32 or i64");
  EXPECT_EQ(infer(OpKind::GatherElements, {"f32[5,4]", "i64[2,4]"}), "f32[2,4]");
  EXPECT_EQ(infer(OpKind::GatherElements, {"f32[5,4]", "i64[2,6]"}),
            "error: 'gather_elements' operand 1 has dim 1 = 6, expected at most 4 (operand 0's dim 1)");
  EXPECT_EQ(infer(OpKind::ScatterElements, {"f32[5,4]", "i64[2,4]", "f32[2,4]"}, {{"reduction", Attribute("add")}}),
            "f32[5,4]");
  EXPECT_EQ(infer(OpKind::ScatterElements, {"f32[5,4]", "i64[2,4]", "f32[2,3]"}),
            "error: 'scatter_elements' operand 2 has dim 1 = 3, expected 4 (operand 1's dim 1)");
}

// --- Reductions --------------------------------------------------------------------

TEST(ShapeRulesTest, ReductionsDropOrKeepAxes) {
  EXPECT_EQ(infer(OpKind::ReduceSum, {"f32[2,3,4]"}, {{"axes", Attribute(Ints{1})}}), "f32[2,4]");
  EXPECT_EQ(infer(OpKind::ReduceMax, {"f32[2,N,4]"}, {{"axes", Attribute(Ints{-1, 0})}, {"keepdims", Attribute(true)}}),
            "f32[1,N,1]");
  EXPECT_EQ(infer(OpKind::ReduceMean, {"f32[2,3]"}, {{"axes", Attribute(Ints{})}}), "f32[]");
  EXPECT_EQ(infer(OpKind::ReduceProd, {"i32[2,3]"}, {{"axes", Attribute(Ints{})}, {"keepdims", Attribute(true)}}),
            "i32[1,1]");
  EXPECT_EQ(infer(OpKind::ReduceSum, {"f32[]"}, {{"axes", Attribute(Ints{})}}), "f32[]");
  EXPECT_EQ(infer(OpKind::ReduceSum, {"f32[0,3]"}, {{"axes", Attribute(Ints{0})}}), "f32[3]");
  EXPECT_EQ(infer(OpKind::ReduceSum, {"f32[2,3]"}, {{"axes", Attribute(Ints{1, -1})}}),
            "error: 'reduce_sum' attribute 'axes' names axis 1 more than once");
  EXPECT_EQ(infer(OpKind::ReduceMin, {"f32[2,3]"}, {{"axes", Attribute(Ints{2})}}),
            "error: 'reduce_min' attribute 'axes' entry 0 = 2 is out of range for rank 2");
  EXPECT_EQ(infer(OpKind::ReduceSum, {"bool[2]"}, {{"axes", Attribute(Ints{})}}),
            "error: 'reduce_sum' operand 0 has dtype bool, expected a numeric dtype (not bool)");
}

TEST(ShapeRulesTest, ArgReductionsGiveI64) {
  EXPECT_EQ(infer(OpKind::ArgMax, {"f32[2,3,4]"}, {{"axis", Attribute(1)}}), "i64[2,4]");
  EXPECT_EQ(infer(OpKind::ArgMin, {"f16[N,3]"}, {{"axis", Attribute(-1)}, {"keepdims", Attribute(true)}}), "i64[N,1]");
  EXPECT_EQ(infer(OpKind::ArgMax, {"f32[2]"}, {{"axis", Attribute(1.5)}}),
            "error: 'argmax' attribute 'axis' must be int, got float");
}

// --- Matmul --------------------------------------------------------------------------

TEST(ShapeRulesTest, MatmulFollowsNumpy) {
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[2,3]", "f32[3,4]"}), "f32[2,4]");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[3]", "f32[3,4]"}), "f32[4]");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[2,3]", "f32[3]"}), "f32[2]");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[3]", "f32[3]"}), "f32[]");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[2,1,3,4]", "f32[5,4,6]"}), "f32[2,5,3,6]");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[B,S,K]", "f32[K,D]"}), "f32[B,S,D]");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[?,784]", "f32[784,512]"}), "f32[?,512]");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[2,4]", "f32[5,3]"}),
            "error: 'matmul' operand 1 has dim 0 = 5, expected 4 (operand 0's dim 1)");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[2,2,4]", "f32[3,4,1]"}),
            "error: 'matmul' batch dims: shapes [2] and [3] do not broadcast: dim -1 is 2 vs 3");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[]", "f32[3]"}),
            "error: 'matmul' operand 0 has type f32[], expected rank at least 1 (matmul needs at least a vector)");
  EXPECT_EQ(infer(OpKind::MatMul, {"f32[3]"}), "error: 'matmul' has 1 operand, expected 2");
}

// --- Convolution and pooling -----------------------------------------------------------

TEST(ShapeRulesTest, ConvOutputSizes) {
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,32,32]", "f32[8,3,3,3]"}), "f32[1,8,30,30]");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[N,3,32,32]", "f32[8,3,3,3]", "f32[8]"},
                  {{"strides", Attribute(Ints{2, 2})}, {"pads", Attribute(Ints{1, 1, 1, 1})}}),
            "f32[N,8,16,16]");
  // Dilation 2 makes a 3-tap kernel span 5: (10 - 5) / 1 + 1.
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,1,10]", "f32[1,1,3]"}, {{"dilations", Attribute(Ints{2})}}), "f32[1,1,6]");
  // Asymmetric pads and a stride that does not divide: floor((7 + 0 + 1 - 3) / 2) + 1 = 3.
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,1,7]", "f32[1,1,3]"},
                  {{"strides", Attribute(Ints{2})}, {"pads", Attribute(Ints{0, 1})}}),
            "f32[1,1,3]");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,4,5,5]", "f32[6,2,1,1]"}, {{"groups", Attribute(2)}}), "f32[1,6,5,5]");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,?,H]", "f32[8,3,3,3]"}), "f32[1,8,?,?]");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,8,8]", "f32[8,3,?,3]"}), "f32[1,8,?,6]");
}

TEST(ShapeRulesTest, ConvReportsMismatches) {
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,8,8]", "f32[8,4,3,3]"}),
            "error: 'conv' operand 1 has dim 1 = 4, expected 3 (operand 0's channels / groups)");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,2,2]", "f32[8,3,3,3]"}),
            "error: 'conv' spatial dim 0: the padded input (2 + 0 + 0) is smaller than the dilated kernel (3), so "
            "the output would be empty");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,8,8]", "f32[8,3,3,3]", "f32[4]"}),
            "error: 'conv' operand 2 has dim 0 = 4, expected 8 (the output channels)");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,8,8]", "f32[8,3,3,3]"}, {{"strides", Attribute(Ints{1})}}),
            "error: 'conv' attribute 'strides' has 1 entries, expected 2");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,8,8]", "f32[8,3,3,3]"}, {{"strides", Attribute(Ints{1, 0})}}),
            "error: 'conv' attribute 'strides' entry 1 = 0, expected at least 1");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,8,8]", "f32[8,1,3,3]"}, {{"groups", Attribute(2)}}),
            "error: 'conv' operand 0 has 3 channels, not divisible by groups = 2");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,3,8]", "f32[8,3,3,3]"}),
            "error: 'conv' operand 1 has type f32[8,3,3,3], expected rank 3 (w[M, C/groups, K...] has x's rank)");
}

TEST(ShapeRulesTest, ConvTransposeOutputSizes) {
  // stride * (D - 1) + output_padding + dilation * (K - 1) + 1 - pads = 2*4 + 1 + 2 + 1 - 2 = 10.
  EXPECT_EQ(infer(OpKind::ConvTranspose, {"f32[1,4,5,5]", "f32[4,2,3,3]"},
                  {{"strides", Attribute(Ints{2, 2})},
                   {"pads", Attribute(Ints{1, 1, 1, 1})},
                   {"output_padding", Attribute(Ints{1, 1})}}),
            "f32[1,2,10,10]");
  EXPECT_EQ(infer(OpKind::ConvTranspose, {"f32[N,4,5]", "f32[4,3,2]", "f32[6]"}, {{"groups", Attribute(2)}}),
            "f32[N,6,6]");
  EXPECT_EQ(infer(OpKind::ConvTranspose, {"f32[1,4,5]", "f32[3,3,2]"}),
            "error: 'conv_transpose' operand 1 has dim 0 = 3, expected 4 (operand 0's channels)");
  EXPECT_EQ(infer(OpKind::ConvTranspose, {"f32[1,4,5]", "f32[4,3,2]"}, {{"output_padding", Attribute(Ints{1})}}),
            "error: 'conv_transpose' attribute 'output_padding' entry 0 = 1, expected less than the stride or the "
            "dilation");
}

std::string pool(OpKind kind, std::string_view type, AttrMap attrs) {
  return infer(kind, {std::string(type)}, std::move(attrs));
}

/// channels_last: x[N, D..., C] in, [N, D..., M] out; w stays [M, C/g, K...].
TEST(ShapeRulesTest, ChannelsLastConvAndPool) {
  AttrMap last{{"channels_last", Attribute(true)}};
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,32,30,3]", "f32[8,3,3,3]"}, last), "f32[1,30,28,8]");
  AttrMap grouped = last;
  grouped["groups"] = Attribute(4);
  grouped["strides"] = Attribute(Ints{2, 1});
  EXPECT_EQ(infer(OpKind::Conv, {"f32[N,9,9,8]", "f32[8,2,3,3]", "f32[8]"}, grouped), "f32[N,4,7,8]");
  EXPECT_EQ(infer(OpKind::Conv, {"f32[1,32,30,3]", "f32[8,4,3,3]"}, last),
            "error: 'conv' operand 1 has dim 1 = 4, expected 3 (operand 0's channels / groups)");
  AttrMap k2s2{{"kernel", Attribute(Ints{2, 2})}, {"strides", Attribute(Ints{2, 2})}, {"channels_last", Attribute(true)}};
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[1,6,4,3]", k2s2), "f32[1,3,2,3]");
  EXPECT_EQ(pool(OpKind::AvgPool, "f32[2,6,4,16]", k2s2), "f32[2,3,2,16]");
}

TEST(ShapeRulesTest, PoolOutputSizesWithCeilMode) {
  AttrMap k2s2{{"kernel", Attribute(Ints{2, 2})}, {"strides", Attribute(Ints{2, 2})}};
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[1,3,5,5]", k2s2), "f32[1,3,2,2]");
  AttrMap ceil = k2s2;
  ceil["ceil_mode"] = Attribute(true);
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[1,3,5,5]", ceil), "f32[1,3,3,3]");
  EXPECT_EQ(pool(OpKind::AvgPool, "f32[1,3,6,6]", ceil), "f32[1,3,3,3]");  // exact: ceil changes nothing
  // With pads 1, ceil mode would start a 4th window at 6, inside the end
  // padding (input ends at 5 + 1), so it is dropped: 3, as in PyTorch.
  AttrMap padded = ceil;
  padded["pads"] = Attribute(Ints{1, 1, 1, 1});
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[1,3,5,5]", padded), "f32[1,3,3,3]");
  padded["ceil_mode"] = Attribute(false);
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[1,3,5,5]", padded), "f32[1,3,3,3]");
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[1,1,9]", {{"kernel", Attribute(Ints{3})}, {"dilations", Attribute(Ints{3})}}),
            "f32[1,1,3]");
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[N,C,?]", {{"kernel", Attribute(Ints{3})}}), "f32[N,C,?]");
  EXPECT_EQ(pool(OpKind::AvgPool, "i32[1,1,4]", {{"kernel", Attribute(Ints{2})}}),
            "error: 'avg_pool' operand 0 has dtype i32, expected a float dtype");
  EXPECT_EQ(pool(OpKind::MaxPool, "f32[1,1,4,4]", {{"kernel", Attribute(Ints{2})}}),
            "error: 'max_pool' attribute 'kernel' has 1 entries, expected 2 (one per spatial dim)");
}

// --- Composites -------------------------------------------------------------------------

TEST(ShapeRulesTest, NormalizationsCheckTheirParameters) {
  EXPECT_EQ(infer(OpKind::Softmax, {"f32[2,N]"}), "f32[2,N]");
  EXPECT_EQ(infer(OpKind::LogSoftmax, {"f32[]"}),
            "error: 'log_softmax' attribute 'axis' = -1 is out of range: the operand is a scalar and has no axes");
  EXPECT_EQ(infer(OpKind::LayerNorm, {"f32[B,S,64]", "f32[64]", "f32[64]"}), "f32[B,S,64]");
  EXPECT_EQ(infer(OpKind::LayerNorm, {"f32[B,S,64]", "f32[32]"}),
            "error: 'layer_norm' operand 1 of type f32[32] does not broadcast to the normalized dims [64]: dim 0 = "
            "32 is neither 1 nor 64");
  EXPECT_EQ(infer(OpKind::BatchNorm, {"f32[N,3,8,8]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"}), "f32[N,3,8,8]");
  EXPECT_EQ(infer(OpKind::BatchNorm, {"f32[N,3,8,8]", "f32[3]", "f32[3]", "f32[4]", "f32[3]"}),
            "error: 'batch_norm' operand 3 has dim 0 = 4, expected 3 (operand 0's channels)");
  EXPECT_EQ(infer(OpKind::Gelu, {"f32[2]"}, {{"approximate", Attribute("tanh")}}), "f32[2]");
  EXPECT_EQ(infer(OpKind::Gelu, {"f32[2]"}, {{"approximate", Attribute("erf")}}),
            "error: 'gelu' attribute 'approximate' is \"erf\", expected one of \"none\", \"tanh\"");
}

TEST(ShapeRulesTest, RecurrentLayersFollowOnnxLayout) {
  AttrMap h4{{"hidden_size", Attribute(4)}};
  EXPECT_EQ(infer(OpKind::Rnn, {"f32[T,B,3]", "f32[1,4,3]", "f32[1,4,4]", "f32[1,8]", "f32[1,B,4]"}, h4),
            "f32[T,1,B,4], f32[1,B,4]");
  EXPECT_EQ(infer(OpKind::Lstm, {"f32[5,2,3]", "f32[2,16,3]", "f32[2,16,4]", "f32[2,32]", "f32[2,2,4]", "f32[2,2,4]"},
                  {{"hidden_size", Attribute(4)}, {"direction", Attribute("bidirectional")}}),
            "f32[5,2,2,4], f32[2,2,4], f32[2,2,4]");
  EXPECT_EQ(infer(OpKind::Gru, {"f32[5,2,3]", "f32[1,12,3]", "f32[1,12,4]", "f32[1,24]", "f32[1,2,4]"}, h4),
            "f32[5,1,2,4], f32[1,2,4]");
  EXPECT_EQ(infer(OpKind::Gru, {"f32[5,2,3]", "f32[1,16,3]", "f32[1,12,4]", "f32[1,24]", "f32[1,2,4]"}, h4),
            "error: 'gru' operand 1 has dim 1 = 16, expected 12 (3 gates * hidden_size)");
  EXPECT_EQ(infer(OpKind::Rnn, {"f32[5,2,3]", "f32[1,4,3]", "f32[1,4,4]", "f32[1,8]", "f32[1,2,4]"},
                  {{"hidden_size", Attribute(4)}, {"direction", Attribute("sideways")}}),
            "error: 'rnn' attribute 'direction' is \"sideways\", expected one of \"forward\", \"reverse\", "
            "\"bidirectional\"");
}

TEST(ShapeRulesTest, AttentionShapes) {
  EXPECT_EQ(infer(OpKind::Attention, {"f32[B,H,L,64]", "f32[B,H,S,64]", "f32[B,H,S,32]"}), "f32[B,H,L,32]");
  EXPECT_EQ(infer(OpKind::Attention, {"f32[2,4,8]", "f32[2,6,8]", "f32[2,6,8]", "bool[4,6]"}), "f32[2,4,8]");
  EXPECT_EQ(infer(OpKind::Attention, {"f32[2,4,8]", "f32[2,6,8]", "f32[2,6,8]", "f32[4,5]"}),
            "error: 'attention' operand 3 (mask) of type f32[4,5] does not broadcast to the scores [2,4,6]: dim 1 = "
            "5 is neither 1 nor 6");
  EXPECT_EQ(infer(OpKind::Attention, {"f32[2,4,8]", "f32[2,6,7]", "f32[2,6,8]"}),
            "error: 'attention' operand 1 has dim 2 = 7, expected 8 (operand 0's feature size D)");
}

TEST(ShapeRulesTest, LossesReduceToScalarsOrKeepTheLabelsShape) {
  EXPECT_EQ(infer(OpKind::CrossEntropy, {"f32[N,10]", "i64[N]"}), "f32[]");
  EXPECT_EQ(infer(OpKind::CrossEntropy, {"f32[4,10,7]", "i32[4,7]"}, {{"reduction", Attribute("none")}}), "f32[4,7]");
  EXPECT_EQ(infer(OpKind::NllLoss, {"f32[4,10]", "i64[?]"}, {{"reduction", Attribute("none")}}), "f32[4]");
  EXPECT_EQ(infer(OpKind::CrossEntropy, {"f32[4,10]", "f32[4]"}),
            "error: 'cross_entropy' operand 1 has dtype f32, expected i32 or i64");
  EXPECT_EQ(infer(OpKind::CrossEntropy, {"f32[4,10]", "i64[5]"}),
            "error: 'cross_entropy' operand 1 has dim 0 = 5, expected 4 (operand 0's batch dim 0)");
  EXPECT_EQ(infer(OpKind::MseLoss, {"f32[N,3]", "f32[?,3]"}, {{"reduction", Attribute("none")}}), "f32[N,3]");
  EXPECT_EQ(infer(OpKind::MseLoss, {"f32[2,3]", "f32[2,3]"}, {{"reduction", Attribute("avg")}}),
            "error: 'mse_loss' attribute 'reduction' is \"avg\", expected one of \"mean\", \"sum\", \"none\"");
}

TEST(ShapeRulesTest, ReturnHasNoResults) { EXPECT_EQ(infer(OpKind::Return, {"f32[2]", "i64[]"}), ""); }

}  // namespace
}  // namespace kiln
