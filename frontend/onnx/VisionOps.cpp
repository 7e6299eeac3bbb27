// ONNX's sampling vision ops: GridSample, RoiAlign and MaxUnpool. Each is a
// decomposition at import into Kiln primitives, not an op of its own: the
// interpreter, the CPU JIT and the CUDA path run them with no kernel of
// their own, and every step is exact (the same float operations as the
// reference implementations, in another order only where a sum of taps is
// formed).
//
// - GridSample and RoiAlign read X at coordinates computed from a run-time
//   input (the grid, the boxes), so they cannot use Resize's constant index
//   tables. X[N,C,H,W] becomes a table of pixel rows [N*H*W, C]; each
//   interpolation tap is one `gather` of rows at an index computed by
//   elementwise ops (`floor`, clamps, `cast` to i64), times its weight, with
//   taps outside the image given weight 0 (and a safe index). A tap costs
//   one gathered row per output position: bilinear 4, bicubic 16, nearest
//   1, RoiAlign 4 per sample point.
// - MaxUnpool writes X's values at the indices MaxPool returned: one
//   `scatter_elements` per (n, c) plane into zeros, then a `pad` to
//   output_shape.
//
// Coordinates follow the reference implementations: GridSample PyTorch's
// grid_sampler_2d (opset 16 is its definition: unnormalize, then border
// clamping or reflection of the coordinate for bilinear and nearest, of
// each tap for bicubic; nearest rounds half to even), RoiAlign
// onnxruntime's RoiAlign (which the ONNX reference copies; `max` takes the
// largest weighted corner of each sample point, as onnxruntime does).
#include <algorithm>
#include <cmath>
#include <limits>

#include "frontend/onnx/ConverterSupport.h"
#include "frontend/onnx/NNEmitter.h"

namespace kiln::onnx_import {

namespace {

/// The dims of `v` when it has rank `rank` and static dims, else a recorded
/// error naming `what`.
std::optional<std::vector<int64_t>> staticDimsOf(NNEmitter &e, Value *v, const std::string &what, int64_t rank) {
  if (!v) return std::nullopt;
  const TensorType &t = v->type();
  if (t.rank() != rank || !t.isStatic()) {
    e.fail(what + " must have " + std::to_string(rank) + " static dims; got " + t.str());
    return std::nullopt;
  }
  return staticDims(t.shape);
}

/// X[N,C,H,W] as rows of channels, [N*H*W, C]: a `gather` of rows at
/// n*H*W + y*W + x reads the channels of pixel (y, x) of image n.
struct PixelRows {
  Value *rows = nullptr;
  int64_t height = 0, width = 0;
};

PixelRows pixelRows(NNEmitter &e, Value *x, const std::vector<int64_t> &dims) {
  Value *nhwc = e.transpose(x, {0, 2, 3, 1});
  return {e.reshape(nhwc, staticShape({dims[0] * dims[2] * dims[3], dims[1]})), dims[2], dims[3]};
}

/// The channels at whole-number float coordinates (y, x) of the image whose
/// first row is `base` (i64), times `weight` when given: [S..., C] for
/// coordinates of shape S. With `bounded`, positions outside the image read
/// 0 (their index is replaced by 0 first, so that nothing reads outside X).
Value *readTap(NNEmitter &e, const PixelRows &p, Value *base, Value *y, Value *x, Value *weight, bool bounded) {
  Value *inside = nullptr;
  if (bounded) {
    Value *xLow = e.binary(OpKind::Ge, x, e.scalarLike(x, 0));
    Value *xHigh = e.binary(OpKind::Le, x, e.scalarLike(x, static_cast<double>(p.width - 1)));
    Value *yLow = e.binary(OpKind::Ge, y, e.scalarLike(y, 0));
    Value *yHigh = e.binary(OpKind::Le, y, e.scalarLike(y, static_cast<double>(p.height - 1)));
    Value *xIn = e.binary(OpKind::And, xLow, xHigh);
    Value *yIn = e.binary(OpKind::And, yLow, yHigh);
    inside = e.binary(OpKind::And, xIn, yIn);
    Value *zero = e.scalarLike(x, 0);
    x = e.select(inside, x, zero);
    y = e.select(inside, y, zero);
  }
  Value *yi = e.cast(y, DType::I64);
  Value *xi = e.cast(x, DType::I64);
  Value *row = e.mul(yi, e.scalar(DType::I64, static_cast<double>(p.width)));
  Value *pixel = e.add(row, xi);
  Value *index = e.add(pixel, base);
  Value *v = e.gather(p.rows, index, 0);
  if (!v) return nullptr;
  const DType t = v->type().dtype;
  const int64_t last = v->type().rank() - 1;
  if (weight) {
    if (inside) weight = e.select(inside, weight, e.scalarLike(weight, 0));
    Value *w = e.cast(weight, t);
    return e.mul(v, e.unsqueeze(w, last));
  }
  if (inside) {
    Value *keep = e.unsqueeze(inside, last);
    return e.select(keep, v, e.scalar(t, 0));
  }
  return v;
}

/// The sum of `a` and `b`, where a null `a` is nothing yet.
Value *accumulate(NNEmitter &e, Value *a, Value *b) { return a ? e.add(a, b) : b; }

// --- GridSample ------------------------------------------------------------------

/// PyTorch's reflect_coordinates: `c` reflected into [twiceLow/2, twiceHigh/2].
Value *reflectCoordinate(NNEmitter &e, Value *c, double twiceLow, double twiceHigh) {
  if (twiceLow == twiceHigh) return e.filledLike(c, c->type().dtype, 0);
  const double low = twiceLow / 2, span = (twiceHigh - twiceLow) / 2;
  Value *shifted = e.sub(c, e.scalarLike(c, low));
  Value *d = e.unary(OpKind::Abs, shifted);
  Value *extra = e.binary(OpKind::Rem, d, e.scalarLike(d, span));
  Value *flips = e.unary(OpKind::Floor, e.div(d, e.scalarLike(d, span)));
  Value *parity = e.binary(OpKind::Mod, flips, e.scalarLike(flips, 2));
  Value *even = e.binary(OpKind::Eq, parity, e.scalarLike(parity, 0));
  Value *forward = e.add(extra, low);
  Value *backward = e.add(e.sub(span, extra), low);
  return e.select(even, forward, backward);
}

/// PyTorch's compute_coordinates: `c` clamped into [0, size - 1] (border)
/// or reflected and then clamped (reflection); unchanged for zeros.
Value *padCoordinate(NNEmitter &e, Value *c, const std::string &padding, int64_t size, bool alignCorners) {
  if (padding == "zeros") return c;
  if (padding == "reflection") {
    const double n = static_cast<double>(size);
    c = alignCorners ? reflectCoordinate(e, c, 0, 2 * (n - 1)) : reflectCoordinate(e, c, -1, 2 * n - 1);
  }
  Value *low = e.max(c, 0.0);
  return e.min(low, static_cast<double>(size - 1));
}

/// A grid coordinate in [-1, 1] as a pixel coordinate along an axis of `size`.
Value *unnormalize(NNEmitter &e, Value *c, int64_t size, bool alignCorners) {
  const double n = static_cast<double>(size);
  Value *shifted = e.add(c, 1.0);
  if (alignCorners) return e.mul(e.mul(shifted, 0.5), n - 1);
  Value *scaled = e.add(e.mul(shifted, n), -1.0);
  return e.mul(scaled, 0.5);
}

/// The cubic convolution weights (A = -0.75) of the four taps around a
/// position `t` past the second.
std::vector<Value *> cubicWeights(NNEmitter &e, Value *t) {
  constexpr double A = -0.75;
  auto near = [&](Value *x) {  // ((A + 2) x - (A + 3)) x^2 + 1
    Value *a = e.add(e.mul(x, A + 2), -(A + 3));
    Value *b = e.mul(e.mul(a, x), x);
    return e.add(b, 1.0);
  };
  auto far = [&](Value *x) {  // ((A x - 5A) x + 8A) x - 4A
    Value *a = e.add(e.mul(x, A), -5 * A);
    Value *b = e.add(e.mul(a, x), 8 * A);
    return e.add(e.mul(b, x), -4 * A);
  };
  Value *oneMinus = e.sub(1.0, t);
  Value *w0 = far(e.add(t, 1.0));
  Value *w1 = near(t);
  Value *w2 = near(oneMinus);
  Value *w3 = far(e.add(oneMinus, 1.0));
  return {w0, w1, w2, w3};
}

Status convertGridSample(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"align_corners", "mode", "padding_mode"});
  const bool alignCorners = e.intAttr("align_corners", 0) != 0;
  const std::string mode = e.stringAttr("mode", "bilinear");
  const std::string padding = e.stringAttr("padding_mode", "zeros");
  Value *x = e.input(0);
  Value *grid = e.input(1);
  auto xDims = staticDimsOf(e, x, "X", 4);
  auto gridDims = staticDimsOf(e, grid, "Grid", 4);
  if (e.failed()) return e.status();
  if (mode != "bilinear" && mode != "nearest" && mode != "bicubic")
    return ctx.error("attribute 'mode' = \"" + mode + "\"; expected bilinear, nearest or bicubic");
  if (padding != "zeros" && padding != "border" && padding != "reflection")
    return ctx.error("attribute 'padding_mode' = \"" + padding + "\"; expected zeros, border or reflection");
  const std::vector<int64_t> &xd = *xDims, &gd = *gridDims;
  if (gd[0] != xd[0] || gd[3] != 2)
    return ctx.error("Grid " + grid->type().str() +
                     " must be [N, H_out, W_out, 2] with X's N = " + std::to_string(xd[0]));
  if (!isFloat(grid->type().dtype)) return ctx.error("Grid must be a floating-point tensor; got " + grid->type().str());
  if (!isFloat(x->type().dtype) && mode != "nearest")
    return ctx.error("mode " + mode + " needs a floating-point X; got " + x->type().str());
  if (xd[2] < 1 || xd[3] < 1) return ctx.error("X " + x->type().str() + " has an empty image");

  const PixelRows p = pixelRows(e, x, xd);
  std::vector<int64_t> bases;
  for (int64_t n = 0; n < xd[0]; ++n) bases.push_back(n * xd[2] * xd[3]);
  Value *base = e.tensorI64({xd[0], 1, 1}, bases);
  const Shape coordShape = staticShape({gd[0], gd[1], gd[2]});
  Value *gx = e.reshape(e.sliceAxis(grid, 3, 0, 1), coordShape);
  Value *gy = e.reshape(e.sliceAxis(grid, 3, 1, 2), coordShape);
  Value *ix = unnormalize(e, gx, xd[3], alignCorners);
  Value *iy = unnormalize(e, gy, xd[2], alignCorners);

  Value *sum = nullptr;
  if (mode == "bicubic") {
    // The taps are padded one by one; the coordinate itself is not.
    Value *fx = e.unary(OpKind::Floor, ix);
    Value *fy = e.unary(OpKind::Floor, iy);
    std::vector<Value *> wx = cubicWeights(e, e.sub(ix, fx));
    std::vector<Value *> wy = cubicWeights(e, e.sub(iy, fy));
    for (int j = 0; j < 4; ++j) {
      Value *ty = padCoordinate(e, e.add(fy, j - 1.0), padding, xd[2], alignCorners);
      for (int i = 0; i < 4; ++i) {
        Value *tx = padCoordinate(e, e.add(fx, i - 1.0), padding, xd[3], alignCorners);
        Value *w = e.mul(wy[static_cast<size_t>(j)], wx[static_cast<size_t>(i)]);
        sum = accumulate(e, sum, readTap(e, p, base, ty, tx, w, true));
      }
    }
  } else {
    ix = padCoordinate(e, ix, padding, xd[3], alignCorners);
    iy = padCoordinate(e, iy, padding, xd[2], alignCorners);
    if (mode == "nearest") {
      // Round half to even, as nearbyint in PyTorch's kernel.
      Value *rx = e.unary(OpKind::Round, ix);
      Value *ry = e.unary(OpKind::Round, iy);
      sum = readTap(e, p, base, ry, rx, nullptr, true);
    } else {
      Value *x0 = e.unary(OpKind::Floor, ix);
      Value *y0 = e.unary(OpKind::Floor, iy);
      Value *x1 = e.add(x0, 1.0);
      Value *y1 = e.add(y0, 1.0);
      Value *wx0 = e.sub(x1, ix);
      Value *wx1 = e.sub(ix, x0);
      Value *wy0 = e.sub(y1, iy);
      Value *wy1 = e.sub(iy, y0);
      const std::pair<Value *, Value *> rows[] = {{y0, wy0}, {y1, wy1}};
      const std::pair<Value *, Value *> cols[] = {{x0, wx0}, {x1, wx1}};
      for (const auto &[ty, wy] : rows)
        for (const auto &[tx, wx] : cols) sum = accumulate(e, sum, readTap(e, p, base, ty, tx, e.mul(wy, wx), true));
    }
  }
  e.setOutput(0, e.transpose(sum, {0, 3, 1, 2}));
  return e.status();
}

// --- RoiAlign --------------------------------------------------------------------

/// The sample points of each box along one axis: `start`, `bin` [R,1,1]
/// (the box's first coordinate and bin size), `grid` the points per bin
/// ([R,1,1] or a scalar), `bins` the output size and `points` the most
/// points per bin. Returns the low and high pixel, the weight of the high
/// one and whether the point lies in [-1, size] ([R, bins, points] each).
struct AxisSamples {
  Value *low, *high, *highWeight, *valid;
};

AxisSamples axisSamples(NNEmitter &e, Value *start, Value *bin, Value *grid, int64_t bins, int64_t points,
                        int64_t size) {
  const DType f = start->type().dtype;
  std::vector<double> binIndex, pointOffset;
  for (int64_t i = 0; i < bins; ++i) binIndex.push_back(static_cast<double>(i));
  for (int64_t i = 0; i < points; ++i) pointOffset.push_back(static_cast<double>(i) + 0.5);
  Value *binPos = e.mul(e.tensor(f, {1, bins, 1}, binIndex), bin);
  Value *binStart = e.add(start, binPos);
  Value *offset = e.mul(e.tensor(f, {1, 1, points}, pointOffset), bin);
  Value *c = e.add(binStart, e.div(offset, grid));
  const double last = static_cast<double>(size - 1);
  Value *aboveMin = e.binary(OpKind::Ge, c, e.scalar(f, -1));
  Value *belowMax = e.binary(OpKind::Le, c, e.scalar(f, static_cast<double>(size)));
  Value *valid = e.binary(OpKind::And, aboveMin, belowMax);
  // Points outside [-1, size] get weight 0; their coordinate becomes 0 so
  // that no index is computed from NaN.
  Value *clamped = e.min(e.max(c, 0.0), last);
  Value *inside = e.select(valid, clamped, e.scalar(f, 0));
  Value *low = e.unary(OpKind::Floor, inside);
  Value *high = e.min(e.add(low, 1.0), last);
  return {low, high, e.sub(inside, low), valid};
}

Status convertRoiAlign(NodeContext &ctx) {
  NNEmitter e(ctx);
  if (ctx.opset() >= 16)
    e.expectOnlyAttributes(
        {"coordinate_transformation_mode", "mode", "output_height", "output_width", "sampling_ratio", "spatial_scale"});
  else
    e.expectOnlyAttributes({"mode", "output_height", "output_width", "sampling_ratio", "spatial_scale"});
  const std::string transform =
      ctx.opset() >= 16 ? e.stringAttr("coordinate_transformation_mode", "half_pixel") : "output_half_pixel";
  const std::string mode = e.stringAttr("mode", "avg");
  const int64_t outH = e.intAttr("output_height", 1), outW = e.intAttr("output_width", 1);
  const int64_t samplingRatio = e.intAttr("sampling_ratio", 0);
  const double spatialScale = e.floatAttr("spatial_scale", 1.0);
  Value *x = e.input(0);
  Value *rois = e.input(1);
  Value *batchIndices = e.input(2);
  auto xDims = staticDimsOf(e, x, "X", 4);
  auto roiDims = staticDimsOf(e, rois, "rois", 2);
  auto indexDims = staticDimsOf(e, batchIndices, "batch_indices", 1);
  if (e.failed()) return e.status();
  if (transform != "half_pixel" && transform != "output_half_pixel")
    return ctx.error("attribute 'coordinate_transformation_mode' = \"" + transform +
                     "\"; expected half_pixel or output_half_pixel");
  if (mode != "avg" && mode != "max") return ctx.error("attribute 'mode' = \"" + mode + "\"; expected avg or max");
  if (outH < 1 || outW < 1) return ctx.error("output_height and output_width must be at least 1");
  if (samplingRatio < 0) return ctx.error("sampling_ratio must be 0 (adaptive) or more");
  const std::vector<int64_t> &xd = *xDims;
  const int64_t numRois = (*roiDims)[0];
  const DType f = x->type().dtype;
  if (!isFloat(f)) return ctx.error("X must be a floating-point tensor; got " + x->type().str());
  if ((*roiDims)[1] != 4 || rois->type().dtype != f)
    return ctx.error("rois " + rois->type().str() + " must be [num_rois, 4] of X's dtype");
  if ((*indexDims)[0] != numRois || isFloat(batchIndices->type().dtype) || batchIndices->type().dtype == DType::Bool)
    return ctx.error("batch_indices " + batchIndices->type().str() + " must be [num_rois] integers");
  if (xd[2] < 1 || xd[3] < 1) return ctx.error("X " + x->type().str() + " has an empty image");
  const bool halfPixel = transform == "half_pixel";
  const double offset = halfPixel ? 0.5 : 0.0;

  // Box corners and bin sizes, [R,1,1] each, as onnxruntime computes them.
  Value *corner[4];
  for (int64_t k = 0; k < 4; ++k) {
    Value *column = e.reshape(e.sliceAxis(rois, 1, k, k + 1), staticShape({numRois, 1, 1}));
    corner[k] = e.mul(column, spatialScale);
    if (halfPixel) corner[k] = e.add(corner[k], -offset);
  }
  Value *roiW = e.sub(corner[2], corner[0]);
  Value *roiH = e.sub(corner[3], corner[1]);
  if (!halfPixel) {
    roiW = e.max(roiW, 1.0);
    roiH = e.max(roiH, 1.0);
  }
  Value *binW = e.div(roiW, e.scalar(f, static_cast<double>(outW)));
  Value *binH = e.div(roiH, e.scalar(f, static_cast<double>(outH)));

  // Points per bin: sampling_ratio, or ceil(box size / output size) per box,
  // which is a fixed number of points only when the boxes are known here.
  Value *gridW = nullptr, *gridH = nullptr;
  int64_t pointsW = samplingRatio, pointsH = samplingRatio;
  std::vector<double> perBoxW, perBoxH;
  if (samplingRatio > 0) {
    gridW = gridH = e.scalar(f, static_cast<double>(samplingRatio));
  } else {
    const DenseTensor *boxes = ctx.constantInput(1);
    // TODO(kiln): adaptive sampling of run-time boxes needs a roi_align op
    // whose kernel loops ceil(box / output) times per bin; kernel IR loops
    // have static trip counts, and a static bound (H + 3 points per bin)
    // would sample a 50x50 map's 1000 boxes some 100x more than needed.
    if (!boxes)
      return ctx.error(
          "sampling_ratio = 0 (adaptive) needs the rois known at import time: the number of sample "
          "points per bin is then ceil(box size / output size), which Kiln's static shapes cannot "
          "follow at run time; give sampling_ratio > 0");
    // The float arithmetic of the graph above, repeated here to size the grid.
    auto round = [&](double v) { return f == DType::F64 ? v : static_cast<double>(static_cast<float>(v)); };
    auto scaled = [&](int64_t r, int64_t k) {
      return round(round(round(boxes->getDouble(r * 4 + k)) * round(spatialScale)) - offset);
    };
    pointsW = pointsH = 1;
    for (int64_t r = 0; r < numRois; ++r) {
      double w = round(scaled(r, 2) - scaled(r, 0)), h = round(scaled(r, 3) - scaled(r, 1));
      if (!halfPixel) {
        w = std::max(w, 1.0);
        h = std::max(h, 1.0);
      }
      const double gw = std::ceil(round(w / static_cast<double>(outW)));
      const double gh = std::ceil(round(h / static_cast<double>(outH)));
      if (!(gw < 1e6 && gh < 1e6)) return ctx.error("roi " + std::to_string(r) + " needs too many sample points");
      perBoxW.push_back(gw);
      perBoxH.push_back(gh);
      pointsW = std::max(pointsW, static_cast<int64_t>(gw));
      pointsH = std::max(pointsH, static_cast<int64_t>(gh));
    }
    gridW = e.tensor(f, {numRois, 1, 1}, perBoxW);
    gridH = e.tensor(f, {numRois, 1, 1}, perBoxH);
  }
  if (Status s =
          checkGeneratedSize(ctx, staticShape({numRois, outH, pointsH, outW, pointsW, xd[1]}), "the sampled values");
      !s)
    return s;

  const AxisSamples ys = axisSamples(e, corner[1], binH, gridH, outH, pointsH, xd[2]);
  const AxisSamples xs = axisSamples(e, corner[0], binW, gridW, outW, pointsW, xd[3]);
  // [R, outH, pointsH, 1, 1] against [R, 1, 1, outW, pointsW].
  const Shape yShape = staticShape({numRois, outH, pointsH, 1, 1});
  const Shape xShape = staticShape({numRois, 1, 1, outW, pointsW});
  Value *yLow = e.reshape(ys.low, yShape), *yHigh = e.reshape(ys.high, yShape);
  Value *xLow = e.reshape(xs.low, xShape), *xHigh = e.reshape(xs.high, xShape);
  Value *ly = e.reshape(ys.highWeight, yShape), *lx = e.reshape(xs.highWeight, xShape);
  Value *hy = e.sub(1.0, ly), *hx = e.sub(1.0, lx);
  Value *validY = e.reshape(ys.valid, yShape);
  Value *valid = e.binary(OpKind::And, validY, e.reshape(xs.valid, xShape));
  // With per-box grids, the points past a box's grid are not samples.
  Value *used = nullptr;
  if (samplingRatio == 0) {
    auto pointIndex = [&](int64_t points, std::vector<int64_t> dims) {
      std::vector<double> v;
      for (int64_t i = 0; i < points; ++i) v.push_back(static_cast<double>(i));
      return e.tensor(f, dims, v);
    };
    const Shape perBox = staticShape({numRois, 1, 1, 1, 1});
    Value *indexH = pointIndex(pointsH, {1, 1, pointsH, 1, 1});
    Value *usedH = e.binary(OpKind::Lt, indexH, e.reshape(gridH, perBox));
    Value *indexW = pointIndex(pointsW, {1, 1, 1, 1, pointsW});
    Value *usedW = e.binary(OpKind::Lt, indexW, e.reshape(gridW, perBox));
    used = e.binary(OpKind::And, usedH, usedW);
    valid = e.binary(OpKind::And, valid, used);
  }

  const PixelRows p = pixelRows(e, x, xd);
  Value *image = e.cast(batchIndices, DType::I64);
  Value *imageOfBox = e.reshape(image, staticShape({numRois, 1, 1, 1, 1}));
  Value *base = e.mul(imageOfBox, e.scalar(DType::I64, static_cast<double>(xd[2] * xd[3])));
  const std::pair<Value *, Value *> rowTaps[] = {{yLow, hy}, {yHigh, ly}};
  const std::pair<Value *, Value *> colTaps[] = {{xLow, hx}, {xHigh, lx}};
  Value *combined = nullptr;  // [R, outH, pointsH, outW, pointsW, C]
  for (const auto &[ty, wy] : rowTaps)
    for (const auto &[tx, wx] : colTaps) {
      Value *w = e.mul(wy, wx);
      Value *weight = e.select(valid, w, e.scalar(f, 0));
      Value *tap = readTap(e, p, base, ty, tx, weight, false);
      combined = combined ? (mode == "avg" ? e.add(combined, tap) : e.max(combined, tap)) : tap;
    }
  Value *pooled = nullptr;  // [R, outH, outW, C]
  if (mode == "avg") {
    Value *sum = e.reduce(OpKind::ReduceSum, combined, {2, 4}, false);
    Value *count = e.max(e.mul(gridH, gridW), 1.0);
    if (samplingRatio == 0) count = e.reshape(count, staticShape({numRois, 1, 1, 1}));
    pooled = e.div(sum, count);
  } else {
    if (used) {
      Value *lowest = e.scalar(f, -std::numeric_limits<double>::infinity());
      combined = e.select(e.unsqueeze(used, 5), combined, lowest);
    }
    pooled = e.reduce(OpKind::ReduceMax, combined, {2, 4}, false);
    if (used) {  // a box without sample points pools to 0
      Value *noneH = e.binary(OpKind::Lt, gridH, e.scalar(f, 1));
      Value *noneW = e.binary(OpKind::Lt, gridW, e.scalar(f, 1));
      Value *none = e.reshape(e.binary(OpKind::Or, noneH, noneW), staticShape({numRois, 1, 1, 1}));
      pooled = e.select(none, e.scalar(f, 0), pooled);
    }
  }
  e.setOutput(0, e.transpose(pooled, {0, 3, 1, 2}));
  return e.status();
}

// --- MaxUnpool -------------------------------------------------------------------

Status convertMaxUnpool(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"kernel_shape", "pads", "strides"});
  const std::vector<int64_t> kernel = e.intsAttr("kernel_shape", {});
  if (e.failed()) return e.status();
  const size_t spatial = kernel.size();
  if (spatial == 0) return ctx.error("attribute 'kernel_shape' is required");
  const std::vector<int64_t> strides = e.intsAttr("strides", std::vector<int64_t>(spatial, 1));
  const std::vector<int64_t> pads = e.intsAttr("pads", std::vector<int64_t>(2 * spatial, 0));
  Value *x = e.input(0);
  Value *indices = e.input(1);
  const auto rank = static_cast<int64_t>(spatial + 2);
  auto xDims = staticDimsOf(e, x, "X", rank);
  auto iDims = staticDimsOf(e, indices, "I", rank);
  if (e.failed()) return e.status();
  if (strides.size() != spatial || pads.size() != 2 * spatial)
    return ctx.error("strides and pads must have " + std::to_string(spatial) + " and " + std::to_string(2 * spatial) +
                     " entries, one per spatial dim of kernel_shape");
  if (*iDims != *xDims || isFloat(indices->type().dtype) || indices->type().dtype == DType::Bool)
    return ctx.error("I " + indices->type().str() + " must be integers of X's shape " + x->type().str());
  const std::vector<int64_t> &xd = *xDims;
  std::vector<int64_t> out = {xd[0], xd[1]};
  for (size_t i = 0; i < spatial; ++i) {
    if (kernel[i] < 1 || strides[i] < 1) return ctx.error("kernel_shape and strides must be positive");
    out.push_back((xd[i + 2] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + spatial]);
  }
  // output_shape only pads the unpooled result at the end of each spatial
  // dim, as the ONNX reference implementation does: the indices still
  // address the inferred shape (onnxruntime and PyTorch index the given
  // shape instead, onnx/onnx#2398; the backend test follows the reference).
  std::vector<int64_t> padded = out;
  if (ctx.hasInput(2)) {
    auto shape = constantInts(ctx, 2, "output_shape");
    if (!shape) return shape.takeError();
    if (shape->size() != static_cast<size_t>(rank) || (*shape)[0] != xd[0] || (*shape)[1] != xd[1])
      return ctx.error("output_shape must have " + std::to_string(rank) + " dims starting with X's N and C");
    for (size_t i = 0; i < spatial; ++i)
      if ((*shape)[i + 2] < out[i + 2])
        return ctx.error("output_shape dim " + std::to_string(i + 2) + " = " + std::to_string((*shape)[i + 2]) +
                         " is smaller than the unpooled size " + std::to_string(out[i + 2]));
    padded = *shape;
  }
  int64_t inPlane = 1, outPlane = 1;
  for (size_t i = 2; i < out.size(); ++i) {
    inPlane *= xd[i];
    outPlane *= out[i];
  }
  for (int64_t d : out)
    if (d < 1)
      return ctx.error("the unpooled shape has a dim of " + std::to_string(d) + "; check kernel_shape and pads");
  if (Status s = checkGeneratedSize(ctx, staticShape(padded), "the output"); !s) return s;
  // I holds indices into the whole flattened output, as MaxPool returns
  // them; each (n, c) plane scatters into its own row, so an index is made
  // relative to its plane, and one outside it becomes out of range (a
  // run-time error) instead of wrapping as a negative index would.
  const int64_t planes = xd[0] * xd[1];
  std::vector<int64_t> planeStart;
  for (int64_t k = 0; k < planes; ++k) planeStart.push_back(k * outPlane);
  Value *flatIndex = e.reshape(e.cast(indices, DType::I64), staticShape({planes, inPlane}));
  Value *relative = e.sub(flatIndex, e.tensorI64({planes, 1}, planeStart));
  Value *negative = e.binary(OpKind::Lt, relative, e.scalar(DType::I64, 0));
  Value *checked = e.select(negative, e.scalar(DType::I64, static_cast<double>(outPlane)), relative);
  Value *values = e.reshape(x, staticShape({planes, inPlane}));
  Value *zeros = e.emit(OpKind::Broadcast, {e.scalar(x->type().dtype, 0)}, {},
                        {TensorType{x->type().dtype, staticShape({planes, outPlane})}});
  Value *scattered = e.emit(OpKind::ScatterElements, {zeros, checked, values}, {{"axis", Attribute(int64_t{1})}});
  Value *y = e.reshape(scattered, staticShape(out));
  if (padded != out) {
    std::vector<int64_t> ends(2 * out.size(), 0);
    for (size_t i = 0; i < out.size(); ++i) ends[out.size() + i] = padded[i] - out[i];
    y = e.emit(OpKind::Pad, {y}, {{"pads", Attribute(ends)}});
  }
  e.setOutput(0, y);
  return e.status();
}

constexpr OpConverter kVisionConverters[] = {
    {"", "GridSample", 16, kNewestOnnxOpset, &convertGridSample},
    {"", "RoiAlign", 10, kNewestOnnxOpset, &convertRoiAlign},
    {"", "MaxUnpool", 9, kNewestOnnxOpset, &convertMaxUnpool},
};

}  // namespace

std::span<const OpConverter> visionConverters() { return kVisionConverters; }

}  // namespace kiln::onnx_import
