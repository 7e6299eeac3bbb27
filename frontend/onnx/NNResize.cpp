// ONNX Resize and Upsample. Kiln has no resize op: interpolation is
// separable, so each resized axis becomes `gather`s along that axis with
// constant index tensors, combined with constant per-position weights
// (nearest: one tap; linear: two; cubic: four), and, for
// tf_crop_and_resize, a constant mask selecting extrapolation_value. The
// sizes, scales and roi inputs must be known at import time and the resized
// axes static. Coordinates follow the ONNX reference implementation
// (onnx/backend/test/case/node/resize.py): x_original from the coordinate
// transformation mode, neighbours clamped to the edge, nearest rounding by
// nearest_mode. Opset 10 Resize and Upsample use the asymmetric transform
// and, for nearest, floor when upsampling and ceil when downsampling, as
// onnxruntime does for them.
#include <algorithm>
#include <cmath>

#include "frontend/onnx/ConverterSupport.h"
#include "frontend/onnx/NNEmitter.h"
#include "frontend/onnx/NNOpsInternal.h"

namespace kiln::onnx_import {

namespace {

enum class Interpolation { Nearest, Linear, Cubic };

struct ResizeAttrs {
  Interpolation mode = Interpolation::Nearest;
  std::string transform = "half_pixel";
  std::string nearestMode = "round_prefer_floor";  // or "simple" (opset 10, Upsample)
  double cubicA = -0.75;
  bool excludeOutside = false;
  double extrapolation = 0.0;
};

/// The taps of one output position along one axis.
struct Taps {
  std::vector<int64_t> index;
  std::vector<double> weight;
  bool outside = false;  // tf_crop_and_resize: extrapolation_value instead
};

/// x_original of output position `x` along an axis of `in` elements
/// resized by `scale` to `outLength` (= scale * in, unrounded, as in the
/// reference); roi is [start, end] of the axis.
double originalCoordinate(const ResizeAttrs &a, double x, int64_t in, double scale, double outLength, double roiStart,
                          double roiEnd, int64_t outSize) {
  const std::string &t = a.transform;
  if (t == "align_corners") return outLength == 1 ? 0.0 : x * static_cast<double>(in - 1) / (outLength - 1);
  if (t == "asymmetric") return x / scale;
  if (t == "tf_crop_and_resize") {
    double span = (roiEnd - roiStart) * static_cast<double>(in - 1);
    double xo = outLength == 1 ? span / 2 : x * span / (outLength - 1);
    return xo + roiStart * static_cast<double>(in - 1);
  }
  if (t == "pytorch_half_pixel") return outLength == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (t == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (t == "half_pixel_symmetric") {
    double adjustment = static_cast<double>(outSize) / outLength;
    double center = static_cast<double>(in) / 2;
    double offset = center * (1 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

std::vector<double> cubicCoefficients(double r, double A) {
  return {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
          ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
          ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) - 4 * A};
}

/// The taps of output position `x`.
Taps tapsAt(const ResizeAttrs &a, int64_t x, int64_t in, double scale, double outLength, double roiStart, double roiEnd,
            int64_t outSize) {
  double xo = originalCoordinate(a, static_cast<double>(x), in, scale, outLength, roiStart, roiEnd, outSize);
  Taps taps;
  auto clamp = [&](int64_t i) { return std::clamp<int64_t>(i, 0, in - 1); };
  if (a.transform == "tf_crop_and_resize" && (xo < 0 || xo > static_cast<double>(in - 1))) taps.outside = true;
  double floorX = std::floor(xo);
  double ratio = xo - floorX;
  auto base = static_cast<int64_t>(floorX);
  switch (a.mode) {
    case Interpolation::Nearest: {
      int64_t i = base;
      const std::string &m = a.nearestMode;
      if (ratio != 0) {
        bool up = m == "round_prefer_floor"  ? ratio > 0.5
                  : m == "round_prefer_ceil" ? ratio >= 0.5
                  : m == "ceil"              ? true
                  : m == "simple"            ? scale < 1
                                             : false;  // floor
        if (up) ++i;
      }
      taps.index = {clamp(i)};
      taps.weight = {1.0};
      break;
    }
    case Interpolation::Linear:
      taps.index = {clamp(base), clamp(base + 1)};
      taps.weight = {1 - ratio, ratio};
      break;
    case Interpolation::Cubic: {
      taps.weight = cubicCoefficients(ratio, a.cubicA);
      double sum = 0;
      for (int64_t k = 0; k < 4; ++k) {
        int64_t i = base - 1 + k;
        if (a.excludeOutside && (i < 0 || i >= in)) taps.weight[static_cast<size_t>(k)] = 0;
        sum += taps.weight[static_cast<size_t>(k)];
        taps.index.push_back(clamp(i));
      }
      if (a.excludeOutside && sum != 0)
        for (double &w : taps.weight) w /= sum;
      break;
    }
  }
  return taps;
}

/// Resizes `x` along `axis` from `in` to `outSize` elements.
Value *resizeAxis(NNEmitter &e, const ResizeAttrs &a, Value *x, int64_t axis, int64_t in, int64_t outSize, double scale,
                  double roiStart, double roiEnd) {
  double outLength = scale * static_cast<double>(in);
  std::vector<Taps> taps;
  bool identity = outSize == in;
  for (int64_t j = 0; j < outSize; ++j) {
    taps.push_back(tapsAt(a, j, in, scale, outLength, roiStart, roiEnd, outSize));
    const Taps &t = taps.back();
    for (size_t k = 0; k < t.index.size(); ++k)
      identity &= !t.outside && (t.weight[k] == 0 || (t.index[k] == j && t.weight[k] == 1));
  }
  if (identity) return x;
  int64_t rank = x->type().rank();
  std::vector<int64_t> weightDims(static_cast<size_t>(rank), 1);
  weightDims[static_cast<size_t>(axis)] = outSize;
  DType dtype = x->type().dtype;
  Value *result = nullptr;
  for (size_t k = 0; k < taps[0].index.size(); ++k) {
    std::vector<int64_t> indices;
    std::vector<double> weights;
    bool used = false, unit = true;
    for (const Taps &t : taps) {
      indices.push_back(t.index[k]);
      weights.push_back(t.weight[k]);
      used |= t.weight[k] != 0;
      unit &= t.weight[k] == 1;
    }
    if (!used) continue;
    Value *picked = e.gather(x, e.tensorI64({outSize}, indices), axis);
    if (!unit) {
      if (!isFloat(dtype)) return e.fail("linear and cubic modes need a floating-point input; got " + x->type().str());
      picked = e.mul(picked, e.tensor(dtype, weightDims, weights));
    }
    result = result ? e.add(result, picked) : picked;
  }
  if (!result)
    result = e.gather(x, e.tensorI64({outSize}, std::vector<int64_t>(static_cast<size_t>(outSize), 0)), axis);
  bool anyOutside = std::any_of(taps.begin(), taps.end(), [](const Taps &t) { return t.outside; });
  if (anyOutside) {
    std::vector<double> outside;
    for (const Taps &t : taps) outside.push_back(t.outside ? 1 : 0);
    Value *extrapolation = e.scalarLike(result, a.extrapolation);
    result = e.select(e.tensor(DType::Bool, weightDims, outside), extrapolation, result);
  }
  return result;
}

/// Resizes every axis of `x` whose output size or scale asks for it.
/// `scales` or `sizes` has one entry per axis of `axes`; `roi` has 2 *
/// axes.size() (or is empty).
Status resize(NNEmitter &e, const ResizeAttrs &a, Value *x, std::vector<int64_t> axes, std::vector<double> scales,
              std::vector<int64_t> sizes, std::vector<double> roi, const std::string &keepAspectRatio) {
  NodeContext &ctx = e.ctx();
  int64_t rank = x->type().rank();
  size_t count = axes.size();
  if (!scales.empty() && scales.size() != count)
    return ctx.error("scales has " + std::to_string(scales.size()) + " entries; expected " + std::to_string(count));
  if (!sizes.empty() && sizes.size() != count)
    return ctx.error("sizes has " + std::to_string(sizes.size()) + " entries; expected " + std::to_string(count));
  if (scales.empty() == sizes.empty()) return ctx.error("needs exactly one of scales and sizes");
  if (!roi.empty() && roi.size() != 2 * count)
    return ctx.error("roi has " + std::to_string(roi.size()) + " entries; expected " + std::to_string(2 * count));
  std::vector<int64_t> in(count);
  for (size_t i = 0; i < count; ++i) {
    auto axis = kiln::normalizeAxis(axes[i], rank);
    if (!axis) return ctx.error("axis " + std::to_string(axes[i]) + " is out of range for input " + x->type().str());
    axes[i] = *axis;
    const Dim &d = x->type().shape[static_cast<size_t>(*axis)];
    in[i] = d.isStatic() ? d.size : -1;
  }
  if (!sizes.empty() && keepAspectRatio != "stretch") {
    if (keepAspectRatio != "not_larger" && keepAspectRatio != "not_smaller")
      return ctx.error("attribute 'keep_aspect_ratio_policy' = \"" + keepAspectRatio +
                       "\"; expected stretch, not_larger or not_smaller");
    double s = keepAspectRatio == "not_larger" ? INFINITY : 0;
    for (size_t i = 0; i < count; ++i) {
      if (in[i] <= 0) return ctx.error("keep_aspect_ratio_policy needs static, non-empty input dims");
      double r = static_cast<double>(sizes[i]) / static_cast<double>(in[i]);
      s = keepAspectRatio == "not_larger" ? std::min(s, r) : std::max(s, r);
    }
    for (size_t i = 0; i < count; ++i) sizes[i] = static_cast<int64_t>(std::round(s * static_cast<double>(in[i])));
    scales.assign(count, s);
  }
  Value *y = x;
  for (size_t i = 0; i < count; ++i) {
    double roiStart = roi.empty() ? 0.0 : roi[i], roiEnd = roi.empty() ? 1.0 : roi[i + count];
    bool unchanged = sizes.empty() ? scales[i] == 1.0 : in[i] == sizes[i];
    if (unchanged && a.transform != "tf_crop_and_resize" && a.transform != "tf_half_pixel_for_nn") continue;
    if (in[i] < 1)
      return ctx.error("axis " + std::to_string(axes[i]) +
                       " is resized, so it must be static and non-empty; the "
                       "input has type " +
                       x->type().str());
    int64_t out;
    double scale;
    if (!sizes.empty()) {
      out = sizes[i];
      scale = scales.empty() ? static_cast<double>(out) / static_cast<double>(in[i]) : scales[i];
    } else {
      scale = scales[i];
      if (!(scale > 0) || !std::isfinite(scale))
        return ctx.error("scale " + std::to_string(scale) + " is not positive");
      double span = a.transform == "tf_crop_and_resize" ? roiEnd - roiStart : 1.0;
      out = static_cast<int64_t>(std::floor(static_cast<double>(in[i]) * span * scale));
    }
    // Each output element gets its taps in an index table built here.
    if (out < 1 || out > kMaxGeneratedElements)
      return ctx.error("axis " + std::to_string(axes[i]) + " would be resized to " + std::to_string(out) +
                       " elements; expected between 1 and " + std::to_string(kMaxGeneratedElements));
    y = resizeAxis(e, a, y, axes[i], in[i], out, scale, roiStart, roiEnd);
  }
  e.setOutput(0, y);
  return e.status();
}

Interpolation interpolationOf(NNEmitter &e, const std::string &mode, bool allowCubic) {
  if (mode == "nearest") return Interpolation::Nearest;
  if (mode == "linear" || mode == "bilinear" || mode == "trilinear") return Interpolation::Linear;
  if (mode == "cubic" && allowCubic) return Interpolation::Cubic;
  e.fail("attribute 'mode' = \"" + mode + "\"; expected nearest, linear" + (allowCubic ? " or cubic" : ""));
  return Interpolation::Nearest;
}

/// Constant input `i` as doubles (empty when absent or empty); an error when
/// not constant.
std::vector<double> constantDoubles(NNEmitter &e, size_t i, std::string_view what) {
  if (!e.hasInput(i)) return {};
  const DenseTensor *t = e.ctx().constantInput(i);
  if (!t) {
    e.fail("input " + std::to_string(i) + " (" + std::string(what) + ") must be known at import time");
    return {};
  }
  std::vector<double> v;
  for (int64_t k = 0; k < t->numElements(); ++k) v.push_back(t->getDouble(k));
  return v;
}

std::vector<int64_t> allAxes(int64_t rank) {
  std::vector<int64_t> axes;
  for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  return axes;
}

}  // namespace

Status convertResize(NodeContext &ctx) {
  NNEmitter e(ctx);
  ResizeAttrs a;
  Value *x = e.input(0);
  std::vector<double> roi, scales;
  std::vector<int64_t> sizes, axes;
  std::string keepAspectRatio = "stretch";
  if (ctx.opset() < 11) {
    e.expectOnlyAttributes({"mode"});
    a.mode = interpolationOf(e, e.stringAttr("mode", "nearest"), false);
    a.transform = "asymmetric";
    a.nearestMode = "simple";
    scales = constantDoubles(e, 1, "scales");
  } else {
    e.expectOnlyAttributes({"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                            "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"});
    a.mode = interpolationOf(e, e.stringAttr("mode", "nearest"), true);
    a.transform = e.stringAttr("coordinate_transformation_mode", "half_pixel");
    a.nearestMode = e.stringAttr("nearest_mode", "round_prefer_floor");
    a.cubicA = e.floatAttr("cubic_coeff_a", -0.75);
    a.excludeOutside = e.intAttr("exclude_outside", 0) != 0;
    a.extrapolation = e.floatAttr("extrapolation_value", 0.0);
    keepAspectRatio = e.stringAttr("keep_aspect_ratio_policy", "stretch");
    if (e.intAttr("antialias", 0) != 0) return ctx.error("attribute 'antialias' = 1 is not supported");
    axes = e.intsAttr("axes", {});
    roi = constantDoubles(e, 1, "roi");
    scales = constantDoubles(e, 2, "scales");
    if (e.hasInput(3)) {
      for (double s : constantDoubles(e, 3, "sizes")) sizes.push_back(static_cast<int64_t>(s));
    }
    if (e.failed()) return e.status();
    static constexpr std::string_view kTransforms[] = {
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
    if (std::find(std::begin(kTransforms), std::end(kTransforms), a.transform) == std::end(kTransforms) ||
        (a.transform == "half_pixel_symmetric" && ctx.opset() < 19))
      return ctx.error("attribute 'coordinate_transformation_mode' = \"" + a.transform + "\" is not known at opset " +
                       std::to_string(ctx.opset()));
    static constexpr std::string_view kNearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    if (std::find(std::begin(kNearest), std::end(kNearest), a.nearestMode) == std::end(kNearest))
      return ctx.error("attribute 'nearest_mode' = \"" + a.nearestMode +
                       "\"; expected round_prefer_floor, round_prefer_ceil, floor or ceil");
    if (a.transform != "tf_crop_and_resize") roi.clear();  // the reference ignores it then
  }
  if (e.failed()) return e.status();
  if (axes.empty()) axes = allAxes(x->type().rank());
  return resize(e, a, x, axes, scales, sizes, roi, keepAspectRatio);
}

Status convertUpsample(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"mode", "scales"});
  Value *x = e.input(0);
  ResizeAttrs a;
  a.mode = interpolationOf(e, e.stringAttr("mode", "nearest"), false);
  a.transform = "asymmetric";
  a.nearestMode = "simple";
  std::vector<double> scales = ctx.opset() < 9 ? e.floatsAttr("scales", {}) : constantDoubles(e, 1, "scales");
  if (e.failed()) return e.status();
  return resize(e, a, x, allAxes(x->type().rank()), scales, {}, {}, "stretch");
}

}  // namespace kiln::onnx_import
