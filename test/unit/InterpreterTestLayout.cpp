// Tests of the interpreter's data-movement, index and reduction kernels:
// constant, iota, broadcast, reshape, transpose, slice (negative steps and
// ONNX sentinels), concat, pad (all modes, cropping), gather (negative
// indices, out of range), gather_elements, scatter_elements (reductions),
// reduce_* (keepdims, empty axes, zero elements, NaN, integer means) and
// argmax/argmin (ties, NaN). Expected values are worked by hand.
#include <limits>

#include "test/unit/InterpreterTestSupport.h"

namespace kiln::test {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TensorType type(DType dtype, std::vector<int64_t> dims) { return TensorType{dtype, staticShape(dims)}; }

std::vector<double> range(int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

TEST(InterpreterLayoutTest, ConstantAndIota) {
  Function f("c");
  Builder b(f);
  DenseTensor value = f32({2}, {1.5, -2}).toDense();
  b.ret({b.constant(value)});
  auto results = interpret(f, {});
  ASSERT_TRUE(results) << results.error().str();
  expectTensor((*results)[0], {2}, {1.5, -2});

  expectTensor(run(OpKind::Iota, {}, {{"axis", 1}}, {type(DType::F32, {2, 3})}), {2, 3}, {0, 1, 2, 0, 1, 2});
  expectInts(run(OpKind::Iota, {}, {{"axis", 0}}, {type(DType::I64, {2, 3})}), {2, 3}, {0, 0, 0, 1, 1, 1});
  expectInts(run(OpKind::Iota, {}, {{"axis", -1}}, {type(DType::I32, {0, 4})}), {0, 4}, {});
}

TEST(InterpreterLayoutTest, Broadcast) {
  expectTensor(run(OpKind::Broadcast, {f32({3}, {1, 2, 3})}, {}, {type(DType::F32, {2, 3})}), {2, 3},
               {1, 2, 3, 1, 2, 3});
  expectTensor(run(OpKind::Broadcast, {f32({2, 1}, {1, 2})}, {}, {type(DType::F32, {2, 3})}), {2, 3},
               {1, 1, 1, 2, 2, 2});
  expectTensor(run(OpKind::Broadcast, {f32({}, {7})}, {}, {type(DType::F32, {2})}), {2}, {7, 7});
  expectInts(run(OpKind::Broadcast, {bools({1}, {1})}, {}, {type(DType::Bool, {0, 1})}), {0, 1}, {});
}

TEST(InterpreterLayoutTest, ReshapeKeepsRowMajorOrder) {
  expectTensor(run(OpKind::Reshape, {f32({2, 3}, range(6))}, {}, {type(DType::F32, {3, 2})}), {3, 2}, range(6));
  expectTensor(run(OpKind::Reshape, {f32({2, 2}, range(4))}, {}, {type(DType::F32, {4})}), {4}, range(4));
  // One unknown dim is inferred from the element count.
  TensorType unknown{DType::F32, {Dim::unknown(), Dim::fixed(2)}};
  expectTensor(run(OpKind::Reshape, {f32({3, 2, 2}, range(12))}, {}, {unknown}), {6, 2}, range(12));
  expectTensor(run(OpKind::Reshape, {f32({1}, {5})}, {}, {type(DType::F32, {})}), {}, {5});
}

TEST(InterpreterLayoutTest, Transpose) {
  expectTensor(run(OpKind::Transpose, {f32({2, 3}, range(6))}, {{"perm", std::vector<int64_t>{1, 0}}}), {3, 2},
               {0, 3, 1, 4, 2, 5});
  // Result dim i is input dim perm[i]: [2,3,4] with perm [2,0,1] is [4,2,3],
  // and out[k,i,j] = in[i,j,k] = 12i + 4j + k.
  Tensor out = run(OpKind::Transpose, {f32({2, 3, 4}, range(24))}, {{"perm", std::vector<int64_t>{2, 0, 1}}});
  ASSERT_EQ(out.shape(), (std::vector<int64_t>{4, 2, 3}));
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(out.getDouble((k * 2 + i) * 3 + j), 12 * i + 4 * j + k);
  expectTensor(run(OpKind::Transpose, {f32({}, {3})}, {{"perm", std::vector<int64_t>{}}}), {}, {3});
}

AttrMap sliceAttrs(std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> steps) {
  return {{"starts", std::move(starts)}, {"ends", std::move(ends)}, {"steps", std::move(steps)}};
}

TEST(InterpreterLayoutTest, SliceWithStepsAndSentinels) {
  Tensor x = f32({10}, range(10));
  expectTensor(run(OpKind::Slice, {x}, sliceAttrs({1}, {7}, {2})), {3}, {1, 3, 5});
  expectTensor(run(OpKind::Slice, {x}, sliceAttrs({8}, {1}, {-3})), {3}, {8, 5, 2});
  expectTensor(run(OpKind::Slice, {x}, sliceAttrs({-3}, {kMax}, {1})), {3}, {7, 8, 9});
  // The ONNX idiom for reversing a dim.
  expectTensor(run(OpKind::Slice, {x}, sliceAttrs({kMax}, {kMin}, {-1})), {10}, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  expectTensor(run(OpKind::Slice, {x}, sliceAttrs({-1}, {-11}, {-4})), {3}, {9, 5, 1});
  expectTensor(run(OpKind::Slice, {x}, sliceAttrs({5}, {2}, {1})), {0}, {});
  expectTensor(run(OpKind::Slice, {x}, sliceAttrs({20}, {30}, {1})), {0}, {});
  // 2-D: rows reversed, every other column.
  expectTensor(run(OpKind::Slice, {f32({2, 4}, range(8))}, sliceAttrs({-1, 0}, {kMin, 4}, {-1, 2})), {2, 2},
               {4, 6, 0, 2});
  expectTensor(run(OpKind::Slice, {f32({0, 3}, {})}, sliceAttrs({0, 1}, {0, 3}, {1, 1})), {0, 2}, {});
}

TEST(InterpreterLayoutTest, Concat) {
  Tensor a = f32({2, 1}, {1, 2});
  Tensor b = f32({2, 2}, {3, 4, 5, 6});
  Tensor empty = f32({2, 0}, {});
  expectTensor(run(OpKind::Concat, {a, empty, b}, {{"axis", 1}}), {2, 3}, {1, 3, 4, 2, 5, 6});
  expectTensor(run(OpKind::Concat, {b, b}, {{"axis", -2}}), {4, 2}, {3, 4, 5, 6, 3, 4, 5, 6});
  expectInts(run(OpKind::Concat, {ints(DType::I8, {1}, {1})}, {{"axis", 0}}), {1}, {1});
}

AttrMap padAttrs(std::vector<int64_t> pads, std::string mode, double value = 0) {
  return {{"pads", std::move(pads)}, {"mode", std::move(mode)}, {"value", value}};
}

TEST(InterpreterLayoutTest, PadModes) {
  // pads are all begins, then all ends: dim 0 gets 1 row before, dim 1 one column after.
  expectTensor(run(OpKind::Pad, {f32({2, 2}, {1, 2, 3, 4})}, padAttrs({1, 0, 0, 1}, "constant", 9)), {3, 3},
               {9, 9, 9, 1, 2, 9, 3, 4, 9});
  expectTensor(run(OpKind::Pad, {f32({3}, {1, 2, 3})}, padAttrs({2, 2}, "reflect")), {7}, {3, 2, 1, 2, 3, 2, 1});
  expectTensor(run(OpKind::Pad, {f32({3}, {1, 2, 3})}, padAttrs({2, 1}, "edge")), {6}, {1, 1, 1, 2, 3, 3});
  // Negative pads crop.
  expectTensor(run(OpKind::Pad, {f32({4}, {1, 2, 3, 4})}, padAttrs({-1, 1}, "constant")), {4}, {2, 3, 4, 0});
  expectInts(run(OpKind::Pad, {ints(DType::I32, {1}, {5})}, padAttrs({1, 1}, "constant", -2.7)), {3}, {-2, 5, -2});
  expectTensor(run(OpKind::Pad, {f32({0}, {})}, padAttrs({1, 1}, "constant", 4)), {2}, {4, 4});
  std::string error = runError(OpKind::Pad, {f32({0}, {})}, padAttrs({1, 0}, "edge"));
  EXPECT_NE(error.find("'pad'"), std::string::npos) << error;
}

TEST(InterpreterLayoutTest, GatherWithNegativeIndices) {
  Tensor data = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  expectTensor(run(OpKind::Gather, {data, ints(DType::I64, {2}, {2, -3})}, {{"axis", 0}}), {2, 2}, {5, 6, 1, 2});
  // Result shape data[:axis] + indices.shape + data[axis+1:] = [3, 2, 1].
  expectTensor(run(OpKind::Gather, {data, ints(DType::I32, {2, 1}, {1, 0})}, {{"axis", 1}}), {3, 2, 1},
               {2, 1, 4, 3, 6, 5});
  // A scalar index drops the axis.
  expectTensor(run(OpKind::Gather, {data, ints(DType::I64, {}, {-1})}, {{"axis", 0}}), {2}, {5, 6});
  expectTensor(run(OpKind::Gather, {data, ints(DType::I64, {0}, {})}, {{"axis", 0}}), {0, 2}, {});
}

TEST(InterpreterLayoutTest, GatherIndexOutOfRangeIsAnError) {
  Tensor data = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  std::string error = runError(OpKind::Gather, {data, ints(DType::I64, {2}, {0, 3})}, {{"axis", 0}});
  EXPECT_NE(error.find("'gather'"), std::string::npos) << error;
  EXPECT_NE(error.find("index 3 is out of range"), std::string::npos) << error;
  EXPECT_NE(runError(OpKind::Gather, {data, ints(DType::I64, {1}, {-4})}, {{"axis", 0}}).find("-4"), std::string::npos);
}

TEST(InterpreterLayoutTest, GatherElements) {
  // The ONNX examples.
  expectTensor(
      run(OpKind::GatherElements, {f32({2, 2}, {1, 2, 3, 4}), ints(DType::I64, {2, 2}, {0, 0, 1, 0})}, {{"axis", 1}}),
      {2, 2}, {1, 1, 4, 3});
  expectTensor(
      run(OpKind::GatherElements,
          {f32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}), ints(DType::I32, {2, 3}, {1, 2, 0, 2, 0, 0})}, {{"axis", 0}}),
      {2, 3}, {4, 8, 3, 7, 2, 3});
  expectTensor(run(OpKind::GatherElements, {f32({3}, {1, 2, 3}), ints(DType::I64, {2}, {-1, 0})}, {{"axis", 0}}), {2},
               {3, 1});
  EXPECT_NE(runError(OpKind::GatherElements, {f32({3}, {1, 2, 3}), ints(DType::I64, {1}, {3})}, {{"axis", 0}})
                .find("out of range"),
            std::string::npos);
}

TEST(InterpreterLayoutTest, ScatterElements) {
  // The ONNX example: axis 0, no reduction.
  expectTensor(run(OpKind::ScatterElements,
                   {f32({3, 3}, std::vector<double>(9, 0)), ints(DType::I64, {2, 3}, {1, 0, 2, 0, 2, 1}),
                    f32({2, 3}, {1.0, 1.1, 1.2, 2.0, 2.1, 2.2})},
                   {{"axis", 0}}),
               {3, 3}, {2.0, 1.1, 0.0, 1.0, 0.0, 2.2, 0.0, 2.1, 1.2});
  // Duplicate indices with add accumulate; a negative index counts from the back.
  expectTensor(run(OpKind::ScatterElements,
                   {f32({1, 5}, {1, 2, 3, 4, 5}), ints(DType::I64, {1, 3}, {1, 1, -1}), f32({1, 3}, {1.1, 2.1, 10})},
                   {{"axis", 1}, {"reduction", "add"}}),
               {1, 5}, {1, 5.2, 3, 4, 15});
  expectInts(run(OpKind::ScatterElements,
                 {ints(DType::I32, {3}, {2, 2, 2}), ints(DType::I64, {3}, {0, 0, 2}), ints(DType::I32, {3}, {3, 4, 5})},
                 {{"axis", 0}, {"reduction", "mul"}}),
             {3}, {24, 2, 10});
  expectTensor(run(OpKind::ScatterElements, {f32({2}, {5, 5}), ints(DType::I64, {2}, {0, 1}), f32({2}, {7, 1})},
                   {{"axis", 0}, {"reduction", "max"}}),
               {2}, {7, 5});
  expectTensor(run(OpKind::ScatterElements, {f32({2}, {5, 5}), ints(DType::I64, {2}, {0, 1}), f32({2}, {7, 1})},
                   {{"axis", 0}, {"reduction", "min"}}),
               {2}, {5, 1});
}

// --- Reductions -------------------------------------------------------------------------

AttrMap reduceAttrs(std::vector<int64_t> axes, bool keepdims = false) {
  return {{"axes", std::move(axes)}, {"keepdims", keepdims}};
}

TEST(InterpreterReduceTest, AxesAndKeepdims) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expectTensor(run(OpKind::ReduceSum, {x}, reduceAttrs({1})), {2}, {6, 15});
  expectTensor(run(OpKind::ReduceSum, {x}, reduceAttrs({0}, true)), {1, 3}, {5, 7, 9});
  expectTensor(run(OpKind::ReduceSum, {x}, reduceAttrs({-1}, true)), {2, 1}, {6, 15});
  expectTensor(run(OpKind::ReduceSum, {x}, reduceAttrs({})), {}, {21});
  expectTensor(run(OpKind::ReduceMean, {x}, reduceAttrs({0, 1})), {}, {3.5});
  expectTensor(run(OpKind::ReduceMax, {x}, reduceAttrs({1})), {2}, {3, 6});
  expectTensor(run(OpKind::ReduceMin, {x}, reduceAttrs({0})), {3}, {1, 2, 3});
  expectTensor(run(OpKind::ReduceProd, {x}, reduceAttrs({1})), {2}, {6, 120});
  // A middle axis of a rank-3 tensor.
  expectTensor(run(OpKind::ReduceSum, {f32({2, 2, 2}, range(8))}, reduceAttrs({1})), {2, 2}, {2, 4, 10, 12});
}

TEST(InterpreterReduceTest, RankZeroOperand) {
  expectTensor(run(OpKind::ReduceSum, {f32({}, {4})}, reduceAttrs({})), {}, {4});
  expectTensor(run(OpKind::ReduceMax, {f32({}, {4})}, reduceAttrs({}, true)), {}, {4});
}

TEST(InterpreterReduceTest, ReductionsOverZeroElements) {
  Tensor empty = f32({0, 3}, {});
  expectTensor(run(OpKind::ReduceSum, {empty}, reduceAttrs({0})), {3}, {0, 0, 0});
  expectTensor(run(OpKind::ReduceProd, {empty}, reduceAttrs({0})), {3}, {1, 1, 1});
  expectTensor(run(OpKind::ReduceMean, {empty}, reduceAttrs({0})), {3}, {kNaN, kNaN, kNaN});
  expectTensor(run(OpKind::ReduceMax, {empty}, reduceAttrs({0})), {3}, {-kInf, -kInf, -kInf});
  expectTensor(run(OpKind::ReduceMin, {empty}, reduceAttrs({0})), {3}, {kInf, kInf, kInf});
  expectInts(run(OpKind::ReduceMax, {ints(DType::I8, {0}, {})}, reduceAttrs({0})), {}, {-128});
  expectInts(run(OpKind::ReduceMin, {ints(DType::U8, {0}, {})}, reduceAttrs({0})), {}, {255});
  expectInts(run(OpKind::ReduceMin, {ints(DType::I32, {2, 0}, {})}, reduceAttrs({1})), {2},
             {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::max()});
  // Reducing the non-empty dim of an empty tensor gives an empty result.
  expectTensor(run(OpKind::ReduceSum, {empty}, reduceAttrs({1})), {0}, {});
}

TEST(InterpreterReduceTest, NaNPropagatesThroughMaxAndMin) {
  Tensor x = f32({2, 2}, {1, kNaN, 3, 4});
  expectTensor(run(OpKind::ReduceMax, {x}, reduceAttrs({1})), {2}, {kNaN, 4});
  expectTensor(run(OpKind::ReduceMin, {x}, reduceAttrs({1})), {2}, {kNaN, 3});
}

TEST(InterpreterReduceTest, IntegerSumsWrapAndMeansTruncate) {
  expectInts(run(OpKind::ReduceMean, {ints(DType::I32, {2, 2}, {1, 2, -1, -2})}, reduceAttrs({1})), {2}, {1, -1});
  // The mean of i8 values uses their exact sum, not a wrapped one.
  expectInts(run(OpKind::ReduceMean, {ints(DType::I8, {2}, {100, 100})}, reduceAttrs({0})), {}, {100});
  expectInts(run(OpKind::ReduceSum, {ints(DType::I8, {2}, {100, 100})}, reduceAttrs({0})), {}, {-56});
  expectInts(run(OpKind::ReduceProd, {ints(DType::I64, {3}, {-2, 3, 4})}, reduceAttrs({})), {}, {-24});
}

AttrMap argAttrs(int64_t axis, bool keepdims = false, bool last = false) {
  return {{"axis", axis}, {"keepdims", keepdims}, {"select_last_index", last}};
}

TEST(InterpreterReduceTest, ArgMaxTiesAndNaN) {
  Tensor x = f32({4}, {1, 3, 3, 2});
  Tensor first = run(OpKind::ArgMax, {x}, argAttrs(0));
  EXPECT_EQ(first.dtype(), DType::I64);
  expectInts(first, {}, {1});
  expectInts(run(OpKind::ArgMax, {x}, argAttrs(0, false, true)), {}, {2});
  expectInts(run(OpKind::ArgMin, {f32({4}, {2, 1, 5, 1})}, argAttrs(0)), {}, {1});
  expectInts(run(OpKind::ArgMin, {f32({4}, {2, 1, 5, 1})}, argAttrs(0, false, true)), {}, {3});
  expectInts(run(OpKind::ArgMax, {f32({3}, {1, kNaN, 5})}, argAttrs(0)), {}, {1});
  expectInts(run(OpKind::ArgMin, {f32({3}, {1, kNaN, -5})}, argAttrs(0)), {}, {1});
  Tensor m = ints(DType::I32, {2, 2}, {3, 1, 0, 2});
  expectInts(run(OpKind::ArgMin, {m}, argAttrs(0, true)), {1, 2}, {1, 0});
  expectInts(run(OpKind::ArgMax, {m}, argAttrs(-1)), {2}, {0, 1});
  EXPECT_NE(runError(OpKind::ArgMax, {f32({2, 0}, {})}, argAttrs(1)).find("empty"), std::string::npos);
  expectInts(run(OpKind::ArgMax, {f32({0, 2}, {})}, argAttrs(1)), {0}, {});
}

}  // namespace
}  // namespace kiln::test
