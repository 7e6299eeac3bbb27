// Unit tests of the vision converters (frontend/onnx/VisionOps.cpp) and of
// Einsum's diagonals, on ModelProtos built in C++, against values worked out
// by hand in the comments: the modes the ONNX backend test data does not
// reach (GridSample reflection with align_corners, nearest's rounding of
// halves, a bicubic tap off the middle; RoiAlign's adaptive sampling_ratio =
// 0 with boxes reaching past the image, in both modes; MaxUnpool over
// several planes) and the errors that name what is wrong.
#include <gtest/gtest.h>

#include "frontend/onnx/OnnxImporter.h"
#include "onnx.pb.h"
#include "runtime/Interpreter.h"
#include "test/unit/OnnxTestSupport.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::addInitializer;
using test::addInput;
using test::addNode;
using test::addOutput;
using test::expectNear;
using test::importModel;
using test::makeModel;
using test::runModel;
using test::setInt;
using test::setInts;
using test::setString;

/// The elements of the first of `results` (none when there are none).
std::vector<double> firstOf(const std::vector<Tensor>& results) {
  return results.empty() ? std::vector<double>{} : test::elementsOf(results[0]);
}

/// GridSample of X[1,1,1,W] at grid points (gx, 0).
onnx::ModelProto gridSampleRow(int64_t width, int64_t points, const std::string& mode, const std::string& padding,
                               int64_t alignCorners) {
  onnx::ModelProto m = makeModel(16);
  addInput(m, "X", {1, 1, 1, width});
  addInput(m, "Grid", {1, 1, points, 2});
  addOutput(m, "Y");
  auto* n = addNode(m, "GridSample", {"X", "Grid"}, {"Y"});
  setString(n, "mode", mode);
  setString(n, "padding_mode", padding);
  setInt(n, "align_corners", alignCorners);
  return m;
}

Tensor gridAt(const std::vector<double>& xs) {
  std::vector<double> values;
  for (double x : xs) values.insert(values.end(), {x, 0.0});
  return test::tensorOf(DType::F32, {1, 1, static_cast<int64_t>(xs.size()), 2}, values);
}

TEST(OnnxVisionOps, GridSampleReflectionFoldsCoordinatesBackIntoTheImage) {
  const Tensor x = test::tensorOf(DType::F32, {1, 1, 1, 3}, {10, 20, 30});
  const Tensor grid = gridAt({1.5, -2.0, 4.0});
  // align_corners = 0: x = ((gx + 1) * 3 - 1) / 2 is 3.25, -2 and 7, reflected
  // about -0.5 and 2.5 (span 3): |3.25 + 0.5| = 3.75 is one flip past, so
  // 3 - 0.75 - 0.5 = 1.75, between 20 and 30: 27.5; |-2 + 0.5| = 1.5 gives
  // 1; |7 + 0.5| = 7.5 is two flips past, 1.5 - 0.5 = 1. The single row
  // (H = 1) reflects y = 0 onto itself.
  expectNear(firstOf(runModel(gridSampleRow(3, 3, "bilinear", "reflection", 0), {x, grid})), {27.5, 20, 20});
  // align_corners = 1: x = gx + 1 is 2.5, -1 and 5, reflected about 0 and 2
  // (span 2): 2 - 0.5 = 1.5, 1 and 1 (5 is two flips past, remainder 1).
  expectNear(firstOf(runModel(gridSampleRow(3, 3, "bilinear", "reflection", 1), {x, grid})), {25, 20, 20});
  // The same points with border padding clamp to 2, 0 and 2; with zeros,
  // only what falls inside the image counts (none of them here).
  expectNear(firstOf(runModel(gridSampleRow(3, 3, "bilinear", "border", 0), {x, grid})), {30, 10, 30});
  expectNear(firstOf(runModel(gridSampleRow(3, 3, "bilinear", "zeros", 0), {x, grid})), {0, 0, 0});
}

TEST(OnnxVisionOps, GridSampleNearestRoundsHalvesToEven) {
  // align_corners = 1 over 5 pixels: x = (gx + 1) * 2 = 0.5, 1.5, 2.5, which
  // round to 0, 2 and 2.
  const Tensor x = test::tensorOf(DType::F32, {1, 1, 1, 5}, {1, 2, 3, 4, 5});
  expectNear(firstOf(runModel(gridSampleRow(5, 3, "nearest", "zeros", 1), {x, gridAt({-0.75, -0.25, 0.25})})),
             {1, 3, 3});
}

TEST(OnnxVisionOps, GridSampleBicubicWeighsFourTaps) {
  // align_corners = 1 over 5 pixels: gx = -0.375 is x = 1.25, taps 0..3 at
  // t = 0.25 with A = -0.75: -0.10546875, 0.87890625, 0.26171875,
  // -0.03515625, over 0, 1, 4, 9: 0.87890625 + 1.046875 - 0.31640625.
  const Tensor x = test::tensorOf(DType::F32, {1, 1, 1, 5}, {0, 1, 4, 9, 16});
  expectNear(firstOf(runModel(gridSampleRow(5, 1, "bicubic", "zeros", 1), {x, gridAt({-0.375})})), {1.609375});
}

TEST(OnnxVisionOps, GridSampleErrorsNameTheAttribute) {
  auto module = importModel(gridSampleRow(3, 1, "area", "zeros", 0));
  ASSERT_FALSE(module.ok());
  EXPECT_NE(module.error().str().find("attribute 'mode' = \"area\""), std::string::npos) << module.error().str();
}

/// RoiAlign over X[1,1,4,4] = 4y + x with two constant boxes and
/// sampling_ratio = 0: each box gets ceil(size / output size) points a bin.
onnx::ModelProto adaptiveRoiAlign(const std::string& mode) {
  onnx::ModelProto m = makeModel(16);
  addInput(m, "X", {1, 1, 4, 4});
  addInitializer(m, "rois", {2, 4}, {0, 0, 9, 9, 0, 0, 1, 1});
  auto* b = m.mutable_graph()->add_initializer();
  b->set_name("batch_indices");
  b->set_data_type(onnx::TensorProto::INT64);
  b->add_dims(2);
  b->add_int64_data(0);
  b->add_int64_data(0);
  addOutput(m, "Y");
  auto* n = addNode(m, "RoiAlign", {"X", "rois", "batch_indices"}, {"Y"});
  setString(n, "coordinate_transformation_mode", "output_half_pixel");
  setString(n, "mode", mode);
  setInt(n, "sampling_ratio", 0);
  return m;
}

Tensor rampImage() {
  std::vector<double> v;
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) v.push_back(4 * y + x);
  return test::tensorOf(DType::F32, {1, 1, 4, 4}, v);
}

TEST(OnnxVisionOps, RoiAlignAdaptiveSamplingCountsPointsOutsideTheImage) {
  // Box 0, [0, 9]^2 in one bin: 9 x 9 points at 0.5, 1.5, ..., 8.5. Those
  // past 4 on either axis weigh 0 but still count; 3.5 clamps to 3. Over
  // the 4 x 4 that remain (coordinates 0.5, 1.5, 2.5, 3; sum 7.5 per axis)
  // 4y + x sums to 4 * 4 * 7.5 + 4 * 7.5 = 150, over 81 points. Box 1,
  // [0, 1]^2: one point at (0.5, 0.5), 4 * 0.5 + 0.5 = 2.5.
  expectNear(firstOf(runModel(adaptiveRoiAlign("avg"), {rampImage()})), {150.0 / 81, 2.5});
  // max: the largest weighted corner of any point: box 0's point clamped to
  // (3, 3) has all weight on 15; box 1's point weighs its corners 0, 1, 4, 5
  // by 1/4 each.
  expectNear(firstOf(runModel(adaptiveRoiAlign("max"), {rampImage()})), {15, 1.25});
}

TEST(OnnxVisionOps, RoiAlignAdaptiveSamplingNeedsBoxesKnownAtImport) {
  onnx::ModelProto m = makeModel(16);
  addInput(m, "X", {1, 1, 4, 4});
  addInput(m, "rois", {1, 4});
  addInput(m, "batch_indices", {1}, onnx::TensorProto::INT64);
  addOutput(m, "Y");
  addNode(m, "RoiAlign", {"X", "rois", "batch_indices"}, {"Y"});
  auto module = importModel(m);
  ASSERT_FALSE(module.ok());
  EXPECT_NE(module.error().str().find("sampling_ratio = 0 (adaptive) needs the rois known at import time"),
            std::string::npos)
      << module.error().str();
}

onnx::ModelProto maxUnpool() {
  onnx::ModelProto m = makeModel(11);
  addInput(m, "X", {1, 2, 1, 1});
  addInput(m, "I", {1, 2, 1, 1}, onnx::TensorProto::INT64);
  addOutput(m, "Y");
  auto* n = addNode(m, "MaxUnpool", {"X", "I"}, {"Y"});
  setInts(n, "kernel_shape", {2, 2});
  setInts(n, "strides", {2, 2});
  return m;
}

TEST(OnnxVisionOps, MaxUnpoolWritesEachPlaneAtItsFlatIndices) {
  // Output [1, 2, 2, 2]: index 3 is plane 0's last element, 5 plane 1's second.
  const Tensor x = test::tensorOf(DType::F32, {1, 2, 1, 1}, {7, 8});
  const Tensor i = test::tensorOf(DType::I64, {1, 2, 1, 1}, {3, 5});
  expectNear(firstOf(runModel(maxUnpool(), {x, i})), {0, 0, 0, 7, 0, 8, 0, 0});
}

TEST(OnnxVisionOps, MaxUnpoolIndexOutsideItsPlaneIsARunTimeError) {
  // Plane 1's index 2 lies in plane 0: an error, never a wrapped write.
  auto module = importModel(maxUnpool());
  ASSERT_TRUE(module.ok()) << module.error().str();
  auto results = interpret(*(*module)->functions().front(), {test::tensorOf(DType::F32, {1, 2, 1, 1}, {7, 8}),
                                                             test::tensorOf(DType::I64, {1, 2, 1, 1}, {3, 2})});
  EXPECT_FALSE(results.ok());
}

onnx::ModelProto einsum(const std::string& equation, std::vector<int64_t> dims) {
  onnx::ModelProto m = makeModel(12);
  addInput(m, "x", dims);
  addOutput(m, "y");
  auto* n = addNode(m, "Einsum", {"x"}, {"y"});
  setString(n, "equation", equation);
  return m;
}

TEST(OnnxVisionOps, EinsumRepeatedLabelsTakeTheDiagonal) {
  const Tensor x = test::tensorOf(DType::F32, {3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  // Implicit output: "ii" names i twice, so it is summed: the trace.
  expectNear(firstOf(runModel(einsum("ii", {3, 3}), {x})), {15});
  expectNear(firstOf(runModel(einsum("ii->i", {3, 3}), {x})), {1, 5, 9});
  // Three repeats of one label, under an ellipsis of one dim.
  std::vector<double> cube;
  for (int k = 0; k < 2 * 8; ++k) cube.push_back(k);
  expectNear(firstOf(runModel(einsum("...iii->...i", {2, 2, 2, 2}), {test::tensorOf(DType::F32, {2, 2, 2, 2}, cube)})),
             {0, 7, 8, 15});
}

TEST(OnnxVisionOps, EinsumErrorsNameTheLabel) {
  auto diagonalOfRectangle = importModel(einsum("ii->i", {2, 3}));
  ASSERT_FALSE(diagonalOfRectangle.ok());
  EXPECT_NE(diagonalOfRectangle.error().str().find("label 'i' is repeated over dims of sizes 2 and 3"),
            std::string::npos)
      << diagonalOfRectangle.error().str();
  auto digit = importModel(einsum("ij->i0", {2, 3}));
  ASSERT_FALSE(digit.ok());
  EXPECT_NE(digit.error().str().find("invalid output label '0'"), std::string::npos) << digit.error().str();
}

}  // namespace
}  // namespace kiln
