// The ONNX converters for neural-network ops: convolution, pooling,
// normalization, softmax-like ops, activations, dropout and losses (the
// recurrent ops are in NNRecurrent.cpp, Resize/Upsample in NNResize.cpp).
// Each converter follows the op's semantics at the model's opset, maps onto
// Kiln's conv/pool ops and composites where their semantics are the same,
// and builds the rest from primitives. Every attribute a converter does not
// read is an error (NNEmitter::expectOnlyAttributes), and so is every mode
// it does not implement. docs/onnx.md lists the ops, opsets and limits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx/ConverterSupport.h"
#include "frontend/onnx/NNEmitter.h"
#include "frontend/onnx/NNOpsInternal.h"

namespace kiln::onnx_import {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string listStr(const std::vector<int64_t> &v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + str(v[i]);
  return s + "]";
}

/// The spatial dims of x[N, C, D...] (static sizes, -1 where not static).
std::vector<int64_t> spatialDims(const TensorType &x) {
  std::vector<int64_t> dims;
  for (size_t i = 2; i < x.shape.size(); ++i) dims.push_back(x.shape[i].size);
  return dims;
}

/// Fails unless `x` has rank at least `minRank`.
bool expectMinRank(NNEmitter &e, Value *x, int64_t minRank, std::string_view what) {
  if (!x) return false;
  if (x->type().rank() >= minRank) return true;
  e.fail("input " + std::string(what) + " has type " + x->type().str() + "; expected rank " + str(minRank) +
         " or more");
  return false;
}

/// Axes [from, rank).
std::vector<int64_t> axesFrom(int64_t from, int64_t rank) {
  std::vector<int64_t> axes;
  for (int64_t a = from; a < rank; ++a) axes.push_back(a);
  return axes;
}

/// A per-channel [C] value reshaped to [C, 1, ...] so it broadcasts against
/// dim 1 of a rank-`rank` x[N, C, ...].
Value *perChannel(NNEmitter &e, Value *v, int64_t rank) {
  if (!v || rank <= 2) return v;
  Shape shape(static_cast<size_t>(rank - 1), Dim::fixed(1));
  shape[0] = v->type().shape.empty() ? Dim::fixed(1) : v->type().shape[0];
  return e.reshape(v, shape);
}

// --- Sliding windows: conv and pooling
// ----------------------------------------------

/// An int list attribute with `count` entries of at least `min`, `dflt` for
/// each when absent.
std::vector<int64_t> spatialInts(NNEmitter &e, std::string_view name, size_t count, int64_t dflt, int64_t min) {
  std::vector<int64_t> v = e.intsAttr(name, std::vector<int64_t>(count, dflt));
  if (v.size() != count) {
    e.fail("attribute '" + std::string(name) + "' has " + str(static_cast<int64_t>(v.size())) + " entries; expected " +
           str(static_cast<int64_t>(count)));
    return std::vector<int64_t>(count, dflt);
  }
  for (int64_t x : v)
    if (x < min) {
      e.fail("attribute '" + std::string(name) + "' = " + listStr(v) + " has an entry below " + str(min));
      return std::vector<int64_t>(count, dflt);
    }
  return v;
}

struct WindowAttrs {
  std::vector<int64_t> strides, pads, dilations;
  bool samePadding = false;  // auto_pad SAME_*: the output size is fixed,
                             // ceil_mode has no effect
};

/// strides, dilations and pads (explicit or from auto_pad) of a window op
/// over x[N, C, D...] with `kernel` (one size per spatial dim). SAME_UPPER
/// puts the larger half of an odd total padding at the end, SAME_LOWER at
/// the start; both need static input dims.
WindowAttrs readWindow(NNEmitter &e, const TensorType &x, const std::vector<int64_t> &kernel, bool hasDilations) {
  size_t count = kernel.size();
  WindowAttrs w;
  w.strides = spatialInts(e, "strides", count, 1, 1);
  w.dilations = hasDilations ? spatialInts(e, "dilations", count, 1, 1) : std::vector<int64_t>(count, 1);
  std::string autoPad = e.stringAttr("auto_pad", "NOTSET");
  if (autoPad == "NOTSET") {
    w.pads = spatialInts(e, "pads", 2 * count, 0, 0);
    return w;
  }
  if (e.hasAttr("pads")) e.fail("has both 'pads' and auto_pad = \"" + autoPad + "\"; expected one of them");
  w.pads.assign(2 * count, 0);
  if (autoPad == "VALID") return w;
  if (autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER") {
    e.fail("attribute 'auto_pad' = \"" + autoPad + "\"; expected NOTSET, VALID, SAME_UPPER or SAME_LOWER");
    return w;
  }
  w.samePadding = true;
  for (size_t i = 0; i < count; ++i) {
    const Dim &in = x.shape[i + 2];
    if (!in.isStatic() || kernel[i] < 1) {
      e.fail("auto_pad = \"" + autoPad +
             "\" needs static spatial input dims and kernel sizes, but the "
             "input has type " +
             x.str());
      return w;
    }
    int64_t stride = w.strides[i];
    int64_t out = (in.size + stride - 1) / stride;
    int64_t extent = (kernel[i] - 1) * w.dilations[i] + 1;
    int64_t total = std::max<int64_t>(0, (out - 1) * stride + extent - in.size);
    int64_t small = total / 2, big = total - small;
    w.pads[i] = autoPad == "SAME_UPPER" ? small : big;
    w.pads[i + count] = autoPad == "SAME_UPPER" ? big : small;
  }
  return w;
}

/// The kernel's spatial sizes: the `kernel_shape` attribute, checked against
/// the weights' dims where they are static, else the weights' dims.
std::vector<int64_t> convKernel(NNEmitter &e, const TensorType &w) {
  std::vector<int64_t> fromWeights = spatialDims(w);
  if (!e.hasAttr("kernel_shape")) return fromWeights;
  std::vector<int64_t> kernel = e.intsAttr("kernel_shape", {});
  if (kernel.size() != fromWeights.size()) {
    e.fail("attribute 'kernel_shape' = " + listStr(kernel) + " does not match the weights of type " + w.str());
    return fromWeights;
  }
  for (size_t i = 0; i < kernel.size(); ++i)
    if (fromWeights[i] >= 0 && fromWeights[i] != kernel[i])
      e.fail("attribute 'kernel_shape' = " + listStr(kernel) + " does not match the weights of type " + w.str());
  return kernel;
}

Status convertConv(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  Value *x = e.input(0);
  Value *w = e.input(1);
  Value *b = e.optionalInput(2);
  if (!expectMinRank(e, x, 3, "X") || !expectMinRank(e, w, 3, "W")) return e.status();
  std::vector<int64_t> kernel = convKernel(e, w->type());
  WindowAttrs win = readWindow(e, x->type(), kernel, true);
  int64_t groups = e.intAttr("group", 1);
  if (e.failed()) return e.status();
  std::vector<Value *> operands{x, w};
  if (b) operands.push_back(b);
  e.setOutput(0, e.emit(OpKind::Conv, operands,
                        {{"strides", Attribute(win.strides)},
                         {"pads", Attribute(win.pads)},
                         {"dilations", Attribute(win.dilations)},
                         {"groups", Attribute(groups)}}));
  return e.status();
}

/// The attributes of Kiln's conv for an ONNX Conv-like node on x and w.
AttrMap convAttributes(NNEmitter &e, Value *x, Value *w) {
  std::vector<int64_t> kernel = convKernel(e, w->type());
  WindowAttrs win = readWindow(e, x->type(), kernel, true);
  int64_t groups = e.intAttr("group", 1);
  return {{"strides", Attribute(win.strides)},
          {"pads", Attribute(win.pads)},
          {"dilations", Attribute(win.dilations)},
          {"groups", Attribute(groups)}};
}

/// `zeroPoint` (a scalar, or a vector along dim `axis` of a rank-`rank`
/// tensor) shaped to broadcast against that tensor.
Value *alongAxis(NNEmitter &e, Value *zeroPoint, int64_t axis, int64_t rank) {
  const TensorType &t = zeroPoint->type();
  if (t.rank() == 0 || (t.rank() == 1 && t.shape[0].isStatic() && t.shape[0].size == 1))
    return e.reshape(zeroPoint, {});
  Shape shape(static_cast<size_t>(rank), Dim::fixed(1));
  shape[static_cast<size_t>(axis)] = t.shape[0];
  return e.reshape(zeroPoint, std::move(shape));
}

/// ConvInteger: the exact int32 convolution of (x - x_zero_point) by
/// (w - w_zero_point), w's zero point per output channel.
Status convertConvInteger(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  Value *x = e.input(0);
  Value *w = e.input(1);
  if (!expectMinRank(e, x, 3, "X") || !expectMinRank(e, w, 3, "W")) return e.status();
  AttrMap attrs = convAttributes(e, x, w);
  Value *xi = e.cast(x, DType::I32);
  Value *wi = e.cast(w, DType::I32);
  if (Value *zp = e.optionalInput(2)) xi = e.sub(xi, e.cast(alongAxis(e, zp, 1, x->type().rank()), DType::I32));
  if (Value *zp = e.optionalInput(3)) wi = e.sub(wi, e.cast(alongAxis(e, zp, 0, w->type().rank()), DType::I32));
  e.setOutput(0, e.emit(OpKind::Conv, {xi, wi}, std::move(attrs)));
  return e.status();
}

/// QLinearConv: quantize(conv(dequantize(x), dequantize(w), dequantize(bias)))
/// with w's scale and zero point per output channel and the int32 bias at
/// scale x_scale * w_scale; `fold-qdq` makes one int8 `qconv` of it where
/// the weights are constant and symmetric.
Status convertQLinearConv(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  Value *x = e.input(0);
  Value *xScale = e.input(1);
  Value *xZero = e.input(2);
  Value *w = e.input(3);
  Value *wScale = e.input(4);
  Value *wZero = e.input(5);
  Value *yScale = e.input(6);
  Value *yZero = e.input(7);
  Value *bias = e.optionalInput(8);
  if (e.failed()) return e.status();
  if (!expectMinRank(e, x, 3, "x") || !expectMinRank(e, w, 3, "w")) return e.status();
  for (Value *zp : {xZero, wZero, yZero})
    if (zp->type().dtype != DType::U8 && zp->type().dtype != DType::I8)
      return ctx.error("zero points must be uint8 or int8, got " + zp->type().str());
  AttrMap attrs = convAttributes(e, x, w);
  const AttrMap channels{{"axis", Attribute(int64_t{1})}}, filters{{"axis", Attribute(int64_t{0})}};
  std::vector<Value *> operands{e.emit(OpKind::Dequantize, {x, xScale, xZero}, channels),
                                e.emit(OpKind::Dequantize, {w, wScale, wZero}, filters)};
  if (bias) {
    if (bias->type().dtype != DType::I32) return ctx.error("B must be int32, got " + bias->type().str());
    Value *biasScale = e.mul(xScale, wScale);
    operands.push_back(e.emit(OpKind::Dequantize, {bias, biasScale, e.scalar(DType::I32, 0)}, filters));
  }
  Value *y = e.emit(OpKind::Conv, std::move(operands), std::move(attrs));
  e.setOutput(0, e.emit(OpKind::Quantize, {y, yScale, yZero}, channels));
  return e.status();
}

/// ConvTranspose. With output_shape (or auto_pad SAME_*, whose output shape
/// is input * stride) the pads come from the total padding
/// stride*(in-1) + output_padding + (K-1)*dilation + 1 - out: SAME_UPPER puts
/// the smaller half at the start, otherwise the larger; a negative total
/// (an output larger than the full transposed convolution) grows the output
/// at the end, like output_padding.
Status convertConvTranspose(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes(
      {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"});
  Value *x = e.input(0);
  Value *w = e.input(1);
  Value *b = e.optionalInput(2);
  if (!expectMinRank(e, x, 3, "X") || !expectMinRank(e, w, 3, "W")) return e.status();
  std::vector<int64_t> kernel = convKernel(e, w->type());
  size_t count = kernel.size();
  int64_t groups = e.intAttr("group", 1);
  std::vector<int64_t> strides = spatialInts(e, "strides", count, 1, 1);
  std::vector<int64_t> dilations = spatialInts(e, "dilations", count, 1, 1);
  std::vector<int64_t> outputPadding = spatialInts(e, "output_padding", count, 0, 0);
  std::string autoPad = e.stringAttr("auto_pad", "NOTSET");
  std::vector<int64_t> outputShape = e.intsAttr("output_shape", {});
  if (e.failed()) return e.status();
  if (autoPad != "NOTSET" && autoPad != "VALID" && autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER")
    return ctx.error("attribute 'auto_pad' = \"" + autoPad + "\"; expected NOTSET, VALID, SAME_UPPER or SAME_LOWER");

  std::vector<int64_t> pads(2 * count, 0);
  std::vector<int64_t> in = spatialDims(x->type());
  bool same = autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER";
  if (!outputShape.empty() || same) {
    if (outputShape.size() == count + 2) outputShape.erase(outputShape.begin(), outputShape.begin() + 2);
    if (!outputShape.empty() && outputShape.size() != count)
      return ctx.error("attribute 'output_shape' = " + listStr(outputShape) + " has the wrong length; expected " +
                       str(static_cast<int64_t>(count)) + " spatial sizes");
    for (size_t i = 0; i < count; ++i) {
      if (in[i] < 0 || kernel[i] < 0)
        return ctx.error(
            "output_shape and auto_pad need static spatial input "
            "and kernel dims; the input has type " +
            x->type().str());
      int64_t out = outputShape.empty() ? in[i] * strides[i] : outputShape[i];
      int64_t total = strides[i] * (in[i] - 1) + outputPadding[i] + (kernel[i] - 1) * dilations[i] + 1 - out;
      if (total < 0) {
        outputPadding[i] -= total;
        continue;
      }
      int64_t small = total / 2, big = total - small;
      pads[i] = autoPad == "SAME_UPPER" ? small : big;
      pads[i + count] = autoPad == "SAME_UPPER" ? big : small;
    }
  } else if (autoPad == "NOTSET") {
    pads = spatialInts(e, "pads", 2 * count, 0, 0);
  }
  if (e.failed()) return e.status();

  // Kiln's conv_transpose takes output_padding below the stride or the
  // dilation; more (from a large output_shape) is zero padding that only
  // the bias reaches, so it is padded on after the op and the bias added then.
  bool padAfter = false;
  for (size_t i = 0; i < count; ++i) padAfter |= outputPadding[i] >= std::max(strides[i], dilations[i]);
  std::vector<Value *> operands{x, w};
  if (b && !padAfter) operands.push_back(b);
  AttrMap attrs{{"strides", Attribute(strides)},
                {"pads", Attribute(pads)},
                {"dilations", Attribute(dilations)},
                {"groups", Attribute(groups)}};
  if (!padAfter) attrs["output_padding"] = Attribute(outputPadding);
  Value *y = e.emit(OpKind::ConvTranspose, operands, attrs);
  if (padAfter) {
    std::vector<int64_t> extra(2 * (count + 2), 0);
    for (size_t i = 0; i < count; ++i) extra[count + 2 + 2 + i] = outputPadding[i];
    y = e.emit(OpKind::Pad, {y}, {{"pads", Attribute(extra)}});
    if (b) y = e.add(y, perChannel(e, b, x->type().rank()));
  }
  e.setOutput(0, y);
  return e.status();
}

/// The lowest value of `dtype`, which never wins a max.
double lowestOf(DType dtype) {
  switch (dtype) {
    case DType::U8:
    case DType::U16:
    case DType::U32:
    case DType::U64:
      return 0;
    case DType::I8:
      return -128;
    case DType::I16:
      return -32768;
    case DType::I32:
      return -2147483648.0;
    case DType::I64:
      return -9223372036854775808.0;
    default:
      return -std::numeric_limits<double>::infinity();
  }
}

/// MaxPool's Indices: the flat index into x (row-major, or with the spatial
/// dims column-major for storage_order 1) of each window's maximum, the
/// first one on ties. Each window tap is a strided slice of x padded with the
/// lowest value; argmax over the stacked taps picks the tap, and a constant
/// table maps (tap, output position) to the input position.
Value *maxPoolIndices(NNEmitter &e, Value *x, const std::vector<int64_t> &kernel, const WindowAttrs &win, Value *y,
                      int64_t storageOrder) {
  if (!x || !y) return nullptr;
  if (!x->type().isStatic() || !y->type().isStatic())
    return e.fail(
        "the Indices output of MaxPool needs a static input shape; "
        "the input has type " +
        x->type().str());
  std::vector<int64_t> xDims = staticDims(x->type().shape);
  std::vector<int64_t> yDims = staticDims(y->type().shape);
  size_t count = kernel.size();
  int64_t rank = static_cast<int64_t>(xDims.size());

  std::vector<int64_t> pads(2 * xDims.size(), 0);
  for (size_t i = 0; i < count; ++i) {
    int64_t extent = (kernel[i] - 1) * win.dilations[i] + 1;
    pads[i + 2] = win.pads[i];
    pads[xDims.size() + i + 2] = (yDims[i + 2] - 1) * win.strides[i] + extent - xDims[i + 2] - win.pads[i];
  }
  Value *padded =
      e.emit(OpKind::Pad, {x}, {{"pads", Attribute(pads)}, {"value", Attribute(lowestOf(x->type().dtype))}});

  // The table below maps every (tap, output position) pair.
  Shape tableShape = staticShape(kernel);
  for (size_t i = 0; i < count; ++i) tableShape.push_back(Dim::fixed(yDims[i + 2]));
  if (Status s = checkGeneratedSize(e.ctx(), tableShape, "the table of window positions"); !s) return e.fail(s.takeError());
  int64_t taps = std::accumulate(kernel.begin(), kernel.end(), int64_t{1}, std::multiplies<>());
  int64_t positions = 1;
  for (size_t i = 0; i < count; ++i) positions *= yDims[i + 2];
  std::vector<Value *> slices;
  std::vector<int64_t> table(static_cast<size_t>(taps * positions), -1);
  std::vector<int64_t> offset(count,
                              0);  // the tap, as a multi-index into the kernel
  for (int64_t t = 0; t < taps; ++t) {
    std::vector<int64_t> starts(xDims.size(), 0), ends(xDims.size(), kSliceToEnd), steps(xDims.size(), 1);
    for (size_t i = 0; i < count; ++i) {
      starts[i + 2] = offset[i] * win.dilations[i];
      ends[i + 2] = starts[i + 2] + (yDims[i + 2] - 1) * win.strides[i] + 1;
      steps[i + 2] = win.strides[i];
    }
    Value *slice = e.emit(OpKind::Slice, {padded},
                          {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
    slices.push_back(e.unsqueeze(slice, 2));
    // The input position this tap reads at each output position.
    std::vector<int64_t> out(count, 0);
    for (int64_t p = 0; p < positions; ++p) {
      int64_t flat = 0, scale = 1;
      bool inside = true;
      for (size_t k = 0; k < count; ++k) {
        size_t i = storageOrder == 0 ? count - 1 - k : k;  // the fastest-varying spatial dim first
        int64_t h = out[i] * win.strides[i] + offset[i] * win.dilations[i] - win.pads[i];
        inside &= h >= 0 && h < xDims[i + 2];
        flat += h * scale;
        scale *= xDims[i + 2];
      }
      if (inside) table[static_cast<size_t>(t * positions + p)] = flat;
      for (size_t i = count; i-- > 0;) {
        if (++out[i] < yDims[i + 2]) break;
        out[i] = 0;
      }
    }
    for (size_t i = count; i-- > 0;) {
      if (++offset[i] < kernel[i]) break;
      offset[i] = 0;
    }
  }
  Value *stacked = e.concat(slices, 2);
  Value *tap = e.emit(OpKind::ArgMax, {stacked}, {{"axis", Attribute(int64_t{2})}});
  std::vector<int64_t> positionDims(yDims.begin() + 2, yDims.end());
  std::vector<int64_t> positionIds(static_cast<size_t>(positions));
  std::iota(positionIds.begin(), positionIds.end(), 0);
  Value *tapBase = e.mul(tap, e.scalar(DType::I64, static_cast<double>(positions)));
  Value *flatTap = e.add(tapBase, e.tensorI64(positionDims, positionIds));
  Value *spatialIndex = e.gather(e.tensorI64({taps * positions}, table), flatTap, 0);
  // Plus (n * C + c) * (the spatial size) for each image and channel.
  int64_t spatialSize = 1;
  for (size_t i = 2; i < xDims.size(); ++i) spatialSize *= xDims[i];
  std::vector<int64_t> planeDims(static_cast<size_t>(rank), 1), planeIds;
  planeDims[0] = xDims[0];
  planeDims[1] = xDims[1];
  for (int64_t i = 0; i < xDims[0] * xDims[1]; ++i) planeIds.push_back(i * spatialSize);
  return e.add(spatialIndex, e.tensorI64(planeDims, planeIds));
}

Status convertMaxPool(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"});
  Value *x = e.input(0);
  if (!expectMinRank(e, x, 3, "X")) return e.status();
  if (!e.hasAttr("kernel_shape")) return ctx.error("attribute 'kernel_shape' is required");
  std::vector<int64_t> kernel = spatialInts(e, "kernel_shape", static_cast<size_t>(x->type().rank() - 2), 1, 1);
  WindowAttrs win = readWindow(e, x->type(), kernel, true);
  bool ceilMode = e.intAttr("ceil_mode", 0) != 0 && !win.samePadding;
  int64_t storageOrder = e.intAttr("storage_order", 0);
  if (e.failed()) return e.status();
  if (storageOrder != 0 && storageOrder != 1)
    return ctx.error("attribute 'storage_order' = " + str(storageOrder) +
                     "; expected 0 (row major) or 1 (column major)");
  Value *y = e.emit(OpKind::MaxPool, {x},
                    {{"kernel", Attribute(kernel)},
                     {"strides", Attribute(win.strides)},
                     {"pads", Attribute(win.pads)},
                     {"dilations", Attribute(win.dilations)},
                     {"ceil_mode", Attribute(ceilMode)}});
  e.setOutput(0, y);
  if (e.hasOutput(1)) e.setOutput(1, maxPoolIndices(e, x, kernel, win, y, storageOrder));
  return e.status();
}

Status convertAveragePool(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes(
      {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"});
  Value *x = e.input(0);
  if (!expectMinRank(e, x, 3, "X")) return e.status();
  if (!e.hasAttr("kernel_shape")) return ctx.error("attribute 'kernel_shape' is required");
  std::vector<int64_t> kernel = spatialInts(e, "kernel_shape", static_cast<size_t>(x->type().rank() - 2), 1, 1);
  WindowAttrs win = readWindow(e, x->type(), kernel, true);
  bool ceilMode = e.intAttr("ceil_mode", 0) != 0 && !win.samePadding;
  bool countIncludePad = e.intAttr("count_include_pad", 0) != 0;
  if (e.failed()) return e.status();
  for (int64_t d : win.dilations)
    if (d != 1) return ctx.error("attribute 'dilations' = " + listStr(win.dilations) + " is not supported (only 1s)");
  e.setOutput(0, e.emit(OpKind::AvgPool, {x},
                        {{"kernel", Attribute(kernel)},
                         {"strides", Attribute(win.strides)},
                         {"pads", Attribute(win.pads)},
                         {"ceil_mode", Attribute(ceilMode)},
                         {"count_include_pad", Attribute(countIncludePad)}}));
  return e.status();
}

template <OpKind Reduce>
Status convertGlobalPool(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({});
  Value *x = e.input(0);
  if (!expectMinRank(e, x, 3, "X")) return e.status();
  e.setOutput(0, e.reduce(Reduce, x, axesFrom(2, x->type().rank()), true));
  return e.status();
}

/// GlobalLpPool: (sum over the spatial dims of |x|^p)^(1/p).
Status convertGlobalLpPool(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"p"});
  Value *x = e.input(0);
  double p = static_cast<double>(e.intAttr("p", 2));
  if (!expectMinRank(e, x, 3, "X")) return e.status();
  if (p <= 0) return ctx.error("attribute 'p' = " + std::to_string(p) + "; expected a positive integer");
  Value *exponent = e.scalarLike(x, p);
  Value *powered = e.binary(OpKind::Pow, e.unary(OpKind::Abs, x), exponent);
  Value *sum = e.reduce(OpKind::ReduceSum, powered, axesFrom(2, x->type().rank()), true);
  e.setOutput(0, e.binary(OpKind::Pow, sum, e.scalarLike(x, 1.0 / p)));
  return e.status();
}

// --- Normalization
// ----------------------------------------------------------------------

/// BatchNormalization. Inference (the running statistics) maps onto
/// batch_norm. Training mode (opset 14+ `training_mode`) normalizes with the
/// batch's mean and biased variance over every dim but 1 and returns the
/// updated running statistics: running * momentum + batch * (1 - momentum).
/// Before opset 9, `spatial = 0` keeps statistics per element of [C, D...].
Status convertBatchNormalization(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"epsilon", "momentum", "spatial", "is_test", "consumed_inputs", "training_mode"});
  Value *x = e.input(0);
  Value *scale = e.input(1);
  Value *bias = e.input(2);
  Value *mean = e.input(3);
  Value *var = e.input(4);
  double epsilon = e.floatAttr("epsilon", 1e-5);
  double momentum = e.floatAttr("momentum", 0.9);
  bool spatial = e.intAttr("spatial", 1) != 0;
  bool training = e.intAttr("training_mode", 0) != 0;
  if (!expectMinRank(e, x, 2, "X")) return e.status();
  // Opset 15 lets scale/bias and mean/var have their own float types.
  DType dtype = x->type().dtype;
  scale = e.cast(scale, dtype);
  bias = e.cast(bias, dtype);
  mean = e.cast(mean, dtype);
  var = e.cast(var, dtype);
  if (e.failed()) return e.status();
  if (ctx.opset() < 14) {
    for (size_t i = 1; i < 5; ++i)
      if (e.hasOutput(i))
        return ctx.error("output " + str(static_cast<int64_t>(i)) +
                         " (a training statistic) is not supported; Kiln "
                         "imports BatchNormalization before opset 14 "
                         "for inference, with output Y only");
  }
  int64_t rank = x->type().rank();
  if (!spatial) {
    // Statistics of shape [C, D...] broadcast against x[N, C, D...] as they
    // are.
    Value *gain = e.mul(scale, e.unary(OpKind::Rsqrt, e.add(var, epsilon)));
    Value *centered = e.sub(x, mean);
    e.setOutput(0, e.add(e.mul(centered, gain), bias));
    return e.status();
  }
  if (!training) {
    for (size_t i = 1; i < 3; ++i)
      if (e.hasOutput(i))
        return ctx.error(
            "outputs running_mean and running_var exist only with "
            "training_mode = 1");
    // The momentum matters only to training (passes/TrainingStep.h), which
    // takes torch's convention: kept as 1 - momentum, recovered to the 7
    // decimals a float32 near 1 holds (PyTorch's 0.9 is 1 - 0.1 exactly),
    // and set only when it is not the op's default 0.1.
    AttrMap attrs = {{"epsilon", Attribute(epsilon)}};
    const double torchMomentum = std::round((1.0 - momentum) * 1e7) / 1e7;
    if (torchMomentum != 0.1) attrs.emplace("momentum", Attribute(torchMomentum));
    e.setOutput(0, e.emit(OpKind::BatchNorm, {x, scale, bias, mean, var}, attrs));
    return e.status();
  }
  std::vector<int64_t> axes{0};
  for (int64_t a = 2; a < rank; ++a) axes.push_back(a);
  Value *batchMean = e.reduce(OpKind::ReduceMean, x, axes, false);
  Value *centered = e.sub(x, perChannel(e, batchMean, rank));
  Value *batchVar = e.reduce(OpKind::ReduceMean, e.mul(centered, centered), axes, false);
  e.setOutput(0, e.emit(OpKind::BatchNorm, {x, scale, bias, batchMean, batchVar}, {{"epsilon", Attribute(epsilon)}}));
  if (e.hasOutput(1)) {
    Value *keptMean = e.mul(mean, momentum);
    e.setOutput(1, e.add(keptMean, e.mul(batchMean, 1.0 - momentum)));
  }
  if (e.hasOutput(2)) {
    Value *keptVar = e.mul(var, momentum);
    e.setOutput(2, e.add(keptVar, e.mul(batchVar, 1.0 - momentum)));
  }
  return e.status();
}

/// InstanceNormalization: layer_norm over the spatial dims of each image and
/// channel, then the per-channel scale and bias.
Status convertInstanceNormalization(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"epsilon", "consumed_inputs"});
  Value *x = e.input(0);
  Value *scale = e.input(1);
  Value *bias = e.input(2);
  double epsilon = e.floatAttr("epsilon", 1e-5);
  if (!expectMinRank(e, x, 3, "input")) return e.status();
  int64_t rank = x->type().rank();
  Value *normalized =
      e.emit(OpKind::LayerNorm, {x}, {{"axis", Attribute(int64_t{2})}, {"epsilon", Attribute(epsilon)}});
  Value *scaled = e.mul(normalized, perChannel(e, scale, rank));
  e.setOutput(0, e.add(scaled, perChannel(e, bias, rank)));
  return e.status();
}

/// LayerNormalization (opset 17). Y alone in the input's precision is
/// layer_norm; the Mean and InvStdDev outputs, or a stash_type other than the
/// input's, are computed from primitives in the stash type as the ONNX
/// function body does.
Status convertLayerNormalization(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"axis", "epsilon", "stash_type"});
  Value *x = e.input(0);
  Value *scale = e.input(1);
  Value *bias = e.optionalInput(2);
  int64_t axisAttr = e.intAttr("axis", -1);
  double epsilon = e.floatAttr("epsilon", 1e-5);
  int64_t stashType = e.intAttr("stash_type", 1);
  if (e.failed()) return e.status();
  int64_t rank = x->type().rank();
  std::optional<int64_t> axis = kiln::normalizeAxis(axisAttr, rank);
  if (!axis)
    return ctx.error("attribute 'axis' = " + str(axisAttr) + " is out of range for an input of rank " + str(rank));
  std::optional<DType> stash = dtypeOfOnnx(stashType);
  if (!stash || !isFloat(*stash))
    return ctx.error("attribute 'stash_type' = " + str(stashType) + " is not a floating-point type");
  DType dtype = x->type().dtype;
  if (*stash == dtype && !e.hasOutput(1) && !e.hasOutput(2)) {
    std::vector<Value *> operands{x, scale};
    if (bias) operands.push_back(bias);
    e.setOutput(0, e.emit(OpKind::LayerNorm, operands, {{"axis", Attribute(*axis)}, {"epsilon", Attribute(epsilon)}}));
    return e.status();
  }
  std::vector<int64_t> axes = axesFrom(*axis, rank);
  Value *xs = e.cast(x, *stash);
  Value *mean = e.reduce(OpKind::ReduceMean, xs, axes, true);
  Value *centered = e.sub(xs, mean);
  Value *var = e.reduce(OpKind::ReduceMean, e.mul(centered, centered), axes, true);
  Value *invStdDev = e.unary(OpKind::Rsqrt, e.add(var, epsilon));
  Value *normalized = e.cast(e.mul(centered, invStdDev), dtype);
  Value *y = e.mul(normalized, scale);
  if (bias) y = e.add(y, bias);
  e.setOutput(0, y);
  e.setOutput(1, mean);
  e.setOutput(2, invStdDev);
  return e.status();
}

/// GroupNormalization: x[N, C, D...] viewed as [N, G, C/G * D...] and
/// normalized over its last dim; scale and bias are per group (opset 18) or
/// per channel (opset 21).
Status convertGroupNormalization(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"epsilon", "num_groups", "stash_type"});
  Value *x = e.input(0);
  Value *scale = e.input(1);
  Value *bias = e.input(2);
  double epsilon = e.floatAttr("epsilon", 1e-5);
  int64_t groups = e.intAttr("num_groups", 0);
  int64_t stashType = e.intAttr("stash_type", 1);
  if (!expectMinRank(e, x, 3, "X")) return e.status();
  if (!e.hasAttr("num_groups")) return ctx.error("attribute 'num_groups' is required");
  if (e.hasAttr("stash_type") && dtypeOfOnnx(stashType) != x->type().dtype)
    return ctx.error("attribute 'stash_type' = " + str(stashType) + " differs from the input's type " +
                     x->type().str() + "; only stashing in the input's type is supported");
  const Shape &shape = x->type().shape;
  if (!shape[1].isStatic() || groups < 1 || shape[1].size % groups != 0)
    return ctx.error("needs static channels divisible by num_groups = " + str(groups) + "; the input has type " +
                     x->type().str());
  int64_t unknown = std::count_if(shape.begin(), shape.end(), [](const Dim &d) { return d.isUnknown(); });
  if (unknown > 1)
    return ctx.error(
        "needs at most one unknown dim to regroup the channels; "
        "the input has type " +
        x->type().str());
  Dim perGroup = Dim::fixed(shape[1].size / groups);
  for (size_t i = 2; i < shape.size(); ++i)
    perGroup = perGroup.isStatic() && shape[i].isStatic() ? Dim::fixed(perGroup.size * shape[i].size) : Dim::unknown();
  Value *grouped = e.reshape(x, {shape[0], Dim::fixed(groups), perGroup});
  Value *normalized =
      e.emit(OpKind::LayerNorm, {grouped}, {{"axis", Attribute(int64_t{2})}, {"epsilon", Attribute(epsilon)}});
  if (ctx.opset() < 21) {
    // Per-group scale and bias [G] apply to the [N, G, rest] view.
    Value *scaled = e.mul(normalized, e.reshape(scale, {Dim::fixed(groups), Dim::fixed(1)}));
    Value *shifted = e.add(scaled, e.reshape(bias, {Dim::fixed(groups), Dim::fixed(1)}));
    e.setOutput(0, e.reshape(shifted, shape));
    return e.status();
  }
  Value *perChannelScale = perChannel(e, scale, x->type().rank());
  Value *y = e.mul(e.reshape(normalized, shape), perChannelScale);
  e.setOutput(0, e.add(y, perChannel(e, bias, x->type().rank())));
  return e.status();
}

/// LpNormalization: x / ||x||_p along `axis` (p is 1 or 2).
Status convertLpNormalization(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"axis", "p"});
  Value *x = e.input(0);
  int64_t axisAttr = e.intAttr("axis", -1);
  int64_t p = e.intAttr("p", 2);
  if (e.failed()) return e.status();
  std::optional<int64_t> axis = kiln::normalizeAxis(axisAttr, x->type().rank());
  if (!axis)
    return ctx.error("attribute 'axis' = " + str(axisAttr) + " is out of range for an input of type " +
                     x->type().str());
  Value *norm;
  if (p == 1) {
    norm = e.reduce(OpKind::ReduceSum, e.unary(OpKind::Abs, x), {*axis}, true);
  } else if (p == 2) {
    norm = e.unary(OpKind::Sqrt, e.reduce(OpKind::ReduceSum, e.mul(x, x), {*axis}, true));
  } else {
    return ctx.error("attribute 'p' = " + str(p) + "; expected 1 or 2");
  }
  e.setOutput(0, e.div(x, norm));
  return e.status();
}

/// MeanVarianceNormalization, as its ONNX function body:
/// (x - mean(x)) / (sqrt(mean(x^2) - mean(x)^2) + 1e-9) over `axes`.
Status convertMeanVarianceNormalization(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"axes"});
  Value *x = e.input(0);
  std::vector<int64_t> axes = e.intsAttr("axes", {0, 2, 3});
  if (e.failed()) return e.status();
  Value *mean = e.reduce(OpKind::ReduceMean, x, axes, true);
  Value *meanOfSquares = e.reduce(OpKind::ReduceMean, e.mul(x, x), axes, true);
  Value *variance = e.sub(meanOfSquares, e.mul(mean, mean));
  Value *std = e.add(e.unary(OpKind::Sqrt, variance), 1e-9);
  e.setOutput(0, e.div(e.sub(x, mean), std));
  return e.status();
}

/// LRN across channels: x / (bias + alpha / size * sum of x^2 over the
/// channels c - floor((size-1)/2) .. c + ceil((size-1)/2))^beta.
/// The widest LRN window imported (one slice and add per channel of it).
constexpr int64_t kMaxLrnWindow = 4096;

Status convertLRN(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"alpha", "beta", "bias", "size"});
  Value *x = e.input(0);
  double alpha = e.floatAttr("alpha", 1e-4);
  double beta = e.floatAttr("beta", 0.75);
  double bias = e.floatAttr("bias", 1.0);
  int64_t size = e.intAttr("size", 0);
  if (!expectMinRank(e, x, 3, "X")) return e.status();
  if (size < 1) return ctx.error("attribute 'size' = " + str(size) + "; expected a positive window size");
  int64_t rank = x->type().rank();
  // The window reaches `before` channels back and `after` forward. Past C - 1
  // either way it reads only padding, so a window wider than the channels is
  // cut to them (alpha is still divided by the size asked for).
  int64_t before = (size - 1) / 2, after = size - 1 - (size - 1) / 2;
  if (const Dim &channels = x->type().shape[1]; channels.isStatic()) {
    before = std::min(before, std::max<int64_t>(channels.size - 1, 0));
    after = std::min(after, std::max<int64_t>(channels.size - 1, 0));
  }
  const int64_t window = before + after + 1;
  if (window > kMaxLrnWindow)
    return ctx.error("attribute 'size' = " + str(size) + " sums windows of " + str(window) +
                     " channels; Kiln imports LRN windows of at most " + str(kMaxLrnWindow));
  std::vector<int64_t> pads(static_cast<size_t>(2 * rank), 0);
  pads[1] = before;
  pads[static_cast<size_t>(rank + 1)] = after;
  Value *squares = e.emit(OpKind::Pad, {e.mul(x, x)}, {{"pads", Attribute(pads)}});
  Value *sum = nullptr;
  for (int64_t k = 0; k < window; ++k) {
    // Channels [k, k + C) of the padded squares, whose length is C + window - 1.
    int64_t end = k == window - 1 ? kSliceToEnd : k - (window - 1);
    Value *window = e.sliceAxis(squares, 1, k, end);
    sum = sum ? e.add(sum, window) : window;
  }
  Value *base = e.add(e.mul(sum, alpha / static_cast<double>(size)), bias);
  e.setOutput(0, e.div(x, e.binary(OpKind::Pow, base, e.scalarLike(x, beta))));
  return e.status();
}

// --- Softmax, LogSoftmax, Hardmax
// ------------------------------------------------------------

enum class SoftmaxKind { Softmax, LogSoftmax, Hardmax };

/// Hardmax along `axis`: 1 where the first maximum is, 0 elsewhere.
Value *hardmaxAlong(NNEmitter &e, Value *x, int64_t axis) {
  if (!x) return nullptr;
  const Dim &d = x->type().shape[static_cast<size_t>(axis)];
  if (!d.isStatic()) return e.fail("Hardmax needs a static size along the axis; the input has type " + x->type().str());
  Value *best = e.emit(OpKind::ArgMax, {x}, {{"axis", Attribute(axis)}, {"keepdims", Attribute(true)}});
  std::vector<int64_t> dims(static_cast<size_t>(x->type().rank()), 1);
  dims[static_cast<size_t>(axis)] = d.size;
  std::vector<int64_t> ids(static_cast<size_t>(d.size));
  std::iota(ids.begin(), ids.end(), 0);
  return e.cast(e.binary(OpKind::Eq, best, e.tensorI64(dims, ids)), x->type().dtype);
}

/// Softmax, LogSoftmax and Hardmax. From opset 13 they work along one axis
/// (default -1); before, the input is seen as a 2-D [prod(dims[:axis]),
/// prod(dims[axis:])] matrix (default axis 1), i.e. along all of dims axis..
template <SoftmaxKind Kind>
Status convertSoftmax(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"axis"});
  Value *x = e.input(0);
  bool perAxis = ctx.opset() >= 13;
  int64_t axisAttr = e.intAttr("axis", perAxis ? -1 : 1);
  if (e.failed()) return e.status();
  int64_t rank = x->type().rank();
  std::optional<int64_t> axis = kiln::normalizeAxis(axisAttr, rank);
  if (!axis || rank == 0)
    return ctx.error("attribute 'axis' = " + str(axisAttr) + " is out of range for an input of type " +
                     x->type().str());
  if (perAxis || *axis == rank - 1) {
    if constexpr (Kind == SoftmaxKind::Hardmax)
      e.setOutput(0, hardmaxAlong(e, x, *axis));
    else
      e.setOutput(0, e.emit(Kind == SoftmaxKind::Softmax ? OpKind::Softmax : OpKind::LogSoftmax, {x},
                            {{"axis", Attribute(*axis)}}));
    return e.status();
  }
  std::vector<int64_t> axes = axesFrom(*axis, rank);
  if constexpr (Kind == SoftmaxKind::Hardmax) {
    // Flatten to the 2-D view, take the hardmax of each row, and restore the
    // shape.
    if (!x->type().isStatic())
      return ctx.error("Hardmax before opset 13 with axis " + str(*axis) + " needs a static input shape; got " +
                       x->type().str());
    std::vector<int64_t> dims = staticDims(x->type().shape);
    int64_t rows = 1, cols = 1;
    for (int64_t a = 0; a < rank; ++a) (a < *axis ? rows : cols) *= dims[static_cast<size_t>(a)];
    Value *matrix = e.reshape(x, staticShape({rows, cols}));
    e.setOutput(0, e.reshape(hardmaxAlong(e, matrix, 1), x->type().shape));
    return e.status();
  }
  Value *shifted = e.sub(x, e.reduce(OpKind::ReduceMax, x, axes, true));
  Value *exp = e.unary(OpKind::Exp, shifted);
  Value *sum = e.reduce(OpKind::ReduceSum, exp, axes, true);
  if constexpr (Kind == SoftmaxKind::Softmax)
    e.setOutput(0, e.div(exp, sum));
  else
    e.setOutput(0, e.sub(shifted, e.unary(OpKind::Log, sum)));
  return e.status();
}

// --- Activations
// ----------------------------------------------------------------------------

// (Relu, Selu, Celu, PRelu, HardSigmoid, HardSwish, ThresholdedRelu, Softsign
// and Shrink are elementwise formulas converted in MathOps.cpp.)

/// Softplus, an activation without attributes.
Status convertSoftplus(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({});
  e.setOutput(0, e.unary(OpKind::Softplus, e.input(0)));
  return e.status();
}

Status convertLeakyRelu(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"alpha", "consumed_inputs"});
  double alpha = e.floatAttr("alpha", 0.01);
  e.setOutput(0, e.emit(OpKind::LeakyRelu, {e.input(0)}, {{"alpha", Attribute(alpha)}}));
  return e.status();
}

Status convertElu(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"alpha", "consumed_inputs"});
  double alpha = e.floatAttr("alpha", 1.0);
  e.setOutput(0, e.emit(OpKind::Elu, {e.input(0)}, {{"alpha", Attribute(alpha)}}));
  return e.status();
}

Status convertGelu(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"approximate"});
  std::string approximate = e.stringAttr("approximate", "none");
  if (e.failed()) return e.status();
  if (approximate != "none" && approximate != "tanh")
    return ctx.error("attribute 'approximate' = \"" + approximate + "\"; expected \"none\" or \"tanh\"");
  e.setOutput(0, e.emit(OpKind::Gelu, {e.input(0)}, {{"approximate", Attribute(approximate)}}));
  return e.status();
}

/// Mish = x * tanh(softplus(x)).
Status convertMish(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({});
  Value *x = e.input(0);
  e.setOutput(0, e.mul(x, e.unary(OpKind::Tanh, e.unary(OpKind::Softplus, x))));
  return e.status();
}

// --- Dropout
// ---------------------------------------------------------------------------------

/// Dropout. In inference (the default, and opsets before 12) it is the
/// identity and its mask all true (bool from opset 10; ones of the input's
/// type before). A constant training_mode = true (opset 12+) with ratio r > 0
/// drops at random as the ONNX reference does: mask = U >= r for uniform
/// samples U (random_uniform in double, seeded by randomSeed), output
/// x / (1 - r) where kept and 0 elsewhere. Kiln's samples are a function of
/// the seed alone, so every run of the compiled model draws the same mask.
Status convertDropout(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"ratio", "is_test", "seed", "consumed_inputs"});
  Value *x = e.input(0);
  if (e.failed()) return e.status();
  if (ctx.opset() >= 12 && e.hasInput(2)) {
    const DenseTensor *training = ctx.constantInput(2);
    if (!training || training->numElements() != 1)
      return ctx.error(
          "input 2 (training_mode) must be a constant scalar (inference or training is decided at import "
          "time)");
    double ratio = 0.5;
    if (e.hasInput(1)) {
      const DenseTensor *r = ctx.constantInput(1);
      if (!r || r->numElements() != 1) return ctx.error("input 1 (ratio) must be a constant scalar in training mode");
      ratio = r->getDouble(0);
    }
    if (training->getDouble(0) != 0.0 && ratio != 0.0) {
      if (!(ratio > 0.0 && ratio < 1.0))
        return ctx.error("ratio " + std::to_string(ratio) + " must lie in [0, 1) in training mode");
      for (const Dim &d : x->type().shape)
        if (d.isUnknown()) return ctx.error("random dropout needs a known input shape, got " + x->type().str());
      auto seed = randomSeed(ctx);
      if (!seed) return seed.takeError();
      Value *u = e.emit(OpKind::RandomUniform, {},
                        {{"low", Attribute(0.0)}, {"high", Attribute(1.0)}, {"seed", Attribute(*seed)}},
                        {TensorType{DType::F64, x->type().shape}});
      Value *keep = e.binary(OpKind::Ge, u, e.scalar(DType::F64, ratio));
      Value *scaled = e.mul(x, 1.0 / (1.0 - ratio));
      Value *zero = e.scalarLike(x, 0.0);
      e.setOutput(0, e.select(keep, scaled, zero));
      e.setOutput(1, keep);
      return e.status();
    }
  }
  e.setOutput(0, x);
  if (e.hasOutput(1)) e.setOutput(1, e.filledLike(x, ctx.opset() >= 10 ? DType::Bool : x->type().dtype, 1.0));
  return e.status();
}

// --- Losses
// ----------------------------------------------------------------------------------

/// The loss of log-probabilities logp[N, C, d...] at target[N, d...] with
/// optional class weights[C] (NegativeLogLikelihoodLoss; also the second half
/// of SoftmaxCrossEntropyLoss): -logp[n, target, d...] * weight[target],
/// 0 where target == ignore_index, then none, sum, or mean (the sum divided
/// by the sum of the weights of the counted elements). Without weights this
/// is Kiln's nll_loss.
Value *weightedNll(NNEmitter &e, Value *logp, Value *target, Value *weight, std::optional<int64_t> ignoreIndex,
                   const std::string &reduction) {
  if (!logp || !target) return nullptr;
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return e.fail("attribute 'reduction' = \"" + reduction + "\"; expected \"none\", \"sum\" or \"mean\"");
  if (logp->type().rank() < 2 || target->type().rank() + 1 != logp->type().rank())
    return e.fail("needs input [N, C, d...] and target [N, d...]; got " + logp->type().str() + " and " +
                  target->type().str());
  if (!isInteger(target->type().dtype)) return e.fail("target must be integer; got " + target->type().str());
  if (!weight) {
    // Kiln's nll_loss always has an ignore_index; a negative one never
    // matches a valid target (ONNX leaves targets outside [0, C) undefined).
    return e.emit(OpKind::NllLoss, {logp, target},
                  {{"reduction", Attribute(reduction)}, {"ignore_index", Attribute(ignoreIndex.value_or(-100))}});
  }
  DType dtype = logp->type().dtype;
  Value *counted = nullptr;
  Value *safeTarget = target;
  if (ignoreIndex) {
    Value *ignored = e.scalar(target->type().dtype, static_cast<double>(*ignoreIndex));
    counted = e.binary(OpKind::Ne, target, ignored);
    // Ignored targets may be out of range; gather at class 0 instead and zero
    // the result.
    safeTarget = e.select(counted, target, e.scalar(target->type().dtype, 0.0));
  }
  Value *picked = e.emit(OpKind::GatherElements, {logp, e.unsqueeze(safeTarget, 1)}, {{"axis", Attribute(int64_t{1})}});
  picked = e.reduce(OpKind::ReduceSum, picked, {1}, false);
  Value *w = e.gather(e.cast(weight, dtype), safeTarget, 0);
  if (counted) w = e.select(counted, w, e.scalar(dtype, 0.0));
  Value *loss = e.unary(OpKind::Neg, e.mul(picked, w));
  if (reduction == "none") return loss;
  Value *sum = e.reduce(OpKind::ReduceSum, loss, {}, false);
  if (reduction == "sum") return sum;
  return e.div(sum, e.reduce(OpKind::ReduceSum, w, {}, false));
}

Status convertNegativeLogLikelihoodLoss(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"ignore_index", "reduction"});
  Value *logp = e.input(0);
  Value *target = e.input(1);
  Value *weight = e.optionalInput(2);
  std::string reduction = e.stringAttr("reduction", "mean");
  std::optional<int64_t> ignoreIndex;
  if (e.hasAttr("ignore_index")) ignoreIndex = e.intAttr("ignore_index", 0);
  e.setOutput(0, weightedNll(e, logp, target, weight, ignoreIndex, reduction));
  return e.status();
}

/// SoftmaxCrossEntropyLoss: log_softmax over dim 1, then the NLL loss; the
/// optional second output is the log-probabilities. Without weights and
/// log-probabilities it is Kiln's cross_entropy.
Status convertSoftmaxCrossEntropyLoss(NodeContext &ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"ignore_index", "reduction"});
  Value *scores = e.input(0);
  Value *labels = e.input(1);
  Value *weight = e.optionalInput(2);
  std::string reduction = e.stringAttr("reduction", "mean");
  std::optional<int64_t> ignoreIndex;
  if (e.hasAttr("ignore_index")) ignoreIndex = e.intAttr("ignore_index", 0);
  if (!expectMinRank(e, scores, 2, "scores")) return e.status();
  if (!weight && !e.hasOutput(1) && (reduction == "none" || reduction == "sum" || reduction == "mean")) {
    e.setOutput(0,
                e.emit(OpKind::CrossEntropy, {scores, labels},
                       {{"reduction", Attribute(reduction)}, {"ignore_index", Attribute(ignoreIndex.value_or(-100))}}));
    return e.status();
  }
  Value *logp = e.emit(OpKind::LogSoftmax, {scores}, {{"axis", Attribute(int64_t{1})}});
  e.setOutput(0, weightedNll(e, logp, labels, weight, ignoreIndex, reduction));
  e.setOutput(1, logp);
  return e.status();
}

// --- The table
// -------------------------------------------------------------------------------

constexpr int64_t kLast = kNewestNNOpset;

const OpConverter kNNConverters[] = {
    {"", "Conv", 1, kLast, &convertConv},
    {"", "ConvTranspose", 1, kLast, &convertConvTranspose},
    {"", "ConvInteger", 10, kLast, &convertConvInteger},
    {"", "QLinearConv", 10, kLast, &convertQLinearConv},
    {"", "MaxPool", 1, kLast, &convertMaxPool},
    {"", "AveragePool", 1, kLast, &convertAveragePool},
    {"", "GlobalAveragePool", 1, kLast, &convertGlobalPool<OpKind::ReduceMean>},
    {"", "GlobalMaxPool", 1, kLast, &convertGlobalPool<OpKind::ReduceMax>},
    {"", "GlobalLpPool", 2, kLast, &convertGlobalLpPool},
    {"", "BatchNormalization", 1, kLast, &convertBatchNormalization},
    {"", "InstanceNormalization", 1, kLast, &convertInstanceNormalization},
    {"", "LayerNormalization", 17, kLast, &convertLayerNormalization},
    {"", "GroupNormalization", 18, kLast, &convertGroupNormalization},
    {"", "LpNormalization", 1, kLast, &convertLpNormalization},
    {"", "MeanVarianceNormalization", 9, kLast, &convertMeanVarianceNormalization},
    {"", "LRN", 1, kLast, &convertLRN},
    {"", "Softmax", 1, kLast, &convertSoftmax<SoftmaxKind::Softmax>},
    {"", "LogSoftmax", 1, kLast, &convertSoftmax<SoftmaxKind::LogSoftmax>},
    {"", "Hardmax", 1, kLast, &convertSoftmax<SoftmaxKind::Hardmax>},
    {"", "Softplus", 1, kLast, &convertSoftplus},
    {"", "LeakyRelu", 1, kLast, &convertLeakyRelu},
    {"", "Elu", 1, kLast, &convertElu},
    {"", "Gelu", 20, kLast, &convertGelu},
    {"", "Mish", 18, kLast, &convertMish},
    {"", "Dropout", 1, kLast, &convertDropout},
    {"", "NegativeLogLikelihoodLoss", 12, kLast, &convertNegativeLogLikelihoodLoss},
    {"", "SoftmaxCrossEntropyLoss", 12, kLast, &convertSoftmaxCrossEntropyLoss},
    {"", "LSTM", 1, kLast, &convertLSTM},
    {"", "GRU", 1, kLast, &convertGRU},
    {"", "RNN", 1, kLast, &convertRNN},
    {"", "Resize", 10, kLast, &convertResize},
    {"", "Upsample", 7, 9, &convertUpsample},
};

}  // namespace

std::span<const OpConverter> nnConverters() { return kNNConverters; }

}  // namespace kiln::onnx_import
