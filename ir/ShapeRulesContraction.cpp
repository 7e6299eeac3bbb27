// Shape rules of the Contraction family: matmul, convolution (forward, transposed, weight gradient),
// pooling and the quantized contractions.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

/// The result dtype of a float contraction: its operands', or f32 where
/// the operands are f16 or bf16 and the op declares an f32 result (a
/// mixed-precision contraction, as the autocast pass makes: products of
/// the half-precision operands accumulated and stored in f32, not rounded
/// to the operands' type; docs/precision.md).
DType contractionDType(const ShapeQuery& q) {
  const DType operands = operand(q, 0).dtype;
  if ((operands == DType::F16 || operands == DType::BF16) && !q.declared.empty() &&
      q.declared[0].dtype == DType::F32)
    return DType::F32;
  return operands;
}

Result inferMatMul(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 1, "matmul needs at least a vector"));
  KILN_TRY(expectMinRank(q, 1, 1, "matmul needs at least a vector"));
  const Shape& a = shapeOf(q, 0);
  const Shape& b = shapeOf(q, 1);
  // Contraction dims: a's last, b's second-to-last (its only dim for a vector).
  size_t aK = a.size() - 1;
  size_t bK = b.size() == 1 ? 0 : b.size() - 2;
  KILN_TRY(expectDim(q, 1, bK, a[aK], "operand 0's dim " + std::to_string(aK)));
  Shape aBatch(a.begin(), a.size() > 2 ? a.end() - 2 : a.begin());
  Shape bBatch(b.begin(), b.size() > 2 ? b.end() - 2 : b.begin());
  auto batch = broadcastShapes(aBatch, bBatch);
  if (!batch) return fail(q, "batch dims: " + batch.error().message());
  Shape shape = std::move(*batch);
  if (a.size() >= 2) shape.push_back(a[a.size() - 2]);
  if (b.size() >= 2) shape.push_back(b.back());
  return Types{{contractionDType(q), std::move(shape)}};
}

/// One spatial output dim of a sliding window: conv and pooling.
struct Window {
  int64_t stride = 1;
  int64_t dilation = 1;
  int64_t padBegin = 0;
  int64_t padEnd = 0;
  bool ceilMode = false;
};

Expected<Dim> windowOutput(const ShapeQuery& q, size_t spatial, const Dim& in, const Dim& kernel, const Window& w) {
  if (!in.isStatic() || !kernel.isStatic()) return Dim::unknown();
  if (kernel.size < 1) return fail(q, "spatial dim " + std::to_string(spatial) + ": the kernel is empty");
  Wide padded = Wide(in.size) + w.padBegin + w.padEnd;
  Wide extent = Wide(w.dilation) * (kernel.size - 1) + 1;
  if (padded < extent) {
    std::string kernelSpan = extent > kInt64Max ? "over 2^63" : std::to_string(static_cast<int64_t>(extent));
    return fail(q, "spatial dim " + std::to_string(spatial) + ": the padded input (" + in.str() + " + " +
                       std::to_string(w.padBegin) + " + " + std::to_string(w.padEnd) +
                       ") is smaller than the dilated kernel (" + kernelSpan + "), so the output would be empty");
  }
  Wide span = padded - extent;
  Wide out = (w.ceilMode ? (span + w.stride - 1) / w.stride : span / w.stride) + 1;
  // With ceil_mode, a last window that would start in the end padding is dropped.
  if (w.ceilMode && (out - 1) * w.stride >= Wide(in.size) + w.padBegin) --out;
  if (out > kInt64Max) return fail(q, "spatial dim " + std::to_string(spatial) + " of the output overflows int64");
  return Dim::fixed(static_cast<int64_t>(out));
}

/// The strides, pads and dilations of a `count`-d window, with defaults.
Expected<std::vector<Window>> windowAttrs(const ShapeQuery& q, size_t count) {
  auto strides = spatialAttr(q, "strides", count, 1, 1);
  if (!strides) return strides.takeError();
  auto pads = spatialAttr(q, "pads", 2 * count, 0, 0);
  if (!pads) return pads.takeError();
  std::vector<int64_t> dilations(count, 1);
  if (opInfo(q.kind).findAttr("dilations")) {
    auto d = spatialAttr(q, "dilations", count, 1, 1);
    if (!d) return d.takeError();
    dilations = std::move(*d);
  }
  bool ceilMode = false;
  if (opInfo(q.kind).findAttr("ceil_mode")) {
    auto c = boolAttr(q, "ceil_mode");
    if (!c) return c.takeError();
    ceilMode = *c;
  }
  std::vector<Window> windows(count);
  for (size_t i = 0; i < count; ++i)
    windows[i] = {(*strides)[i], dilations[i], (*pads)[i], (*pads)[count + i], ceilMode};
  return windows;
}

/// Checks conv's optional bias (operand 2) against the output channels.
Status checkBias(const ShapeQuery& q, const Dim& channels) {
  if (q.operands.size() < 3) return Status::success();
  KILN_TRY(expectSameDType(q, 0, 2));
  KILN_TRY(expectRank(q, 2, 1, "one bias per output channel"));
  return expectDim(q, 2, 0, channels, "the output channels");
}

Result inferConv(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  int64_t rank = rankOf(q, 0);
  KILN_TRY(expectRank(q, 1, rank, "w[M, C/groups, K...] has x's rank"));
  auto groups = intAttr(q, "groups");
  if (!groups) return groups.takeError();
  if (*groups < 1) return fail(q, "attribute 'groups' = " + std::to_string(*groups) + ", expected at least 1");
  auto channelsLast = boolAttr(q, "channels_last");
  if (!channelsLast) return channelsLast.takeError();
  // channels_last: x[N, D..., C] read as x[N, C, D...]; the result likewise.
  Shape x = shapeOf(q, 0);
  if (*channelsLast) std::rotate(x.begin() + 1, x.end() - 1, x.end());
  const Shape& w = shapeOf(q, 1);
  if (x[1].isStatic() && x[1].size % *groups != 0)
    return fail(q, "operand 0 has " + x[1].str() + " channels, not divisible by groups = " + std::to_string(*groups));
  if (w[0].isStatic() && w[0].size % *groups != 0)
    return fail(
        q, "operand 1 has " + w[0].str() + " output channels, not divisible by groups = " + std::to_string(*groups));
  Dim perGroup = x[1].isStatic() ? Dim::fixed(x[1].size / *groups) : Dim::unknown();
  if (*groups == 1) perGroup = x[1];
  KILN_TRY(expectDim(q, 1, 1, perGroup, "operand 0's channels / groups"));
  KILN_TRY(checkBias(q, w[0]));
  size_t spatial = static_cast<size_t>(rank - 2);
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  Shape shape{x[0], w[0]};
  for (size_t i = 0; i < spatial; ++i) {
    auto out = windowOutput(q, i, x[i + 2], w[i + 2], (*windows)[i]);
    if (!out) return out.takeError();
    shape.push_back(*out);
  }
  if (*channelsLast) std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
  return Types{{contractionDType(q), std::move(shape)}};
}

/// conv_weight_grad(x[N, C, D...], dy[N, M, O...]) -> [M, C/groups, kernel...],
/// with dy's spatial dims those of conv(x, w) for a w of that shape.
Result inferConvWeightGrad(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Float));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  const int64_t rank = rankOf(q, 0);
  KILN_TRY(expectRank(q, 1, rank, "dy[N, M, O...] has x's rank"));
  auto groups = intAttr(q, "groups");
  if (!groups) return groups.takeError();
  if (*groups < 1) return fail(q, "attribute 'groups' = " + std::to_string(*groups) + ", expected at least 1");
  const size_t spatial = static_cast<size_t>(rank - 2);
  auto kernel = intsAttr(q, "kernel");
  if (!kernel) return kernel.takeError();
  if (kernel->size() != spatial)
    return fail(q, "attribute 'kernel' has " + std::to_string(kernel->size()) + " entries, expected " +
                       std::to_string(spatial) + " (one per spatial dim)");
  const Shape& x = shapeOf(q, 0);
  const Shape& dy = shapeOf(q, 1);
  KILN_TRY(expectDim(q, 1, 0, x[0], "operand 0's batch"));
  if (x[1].isStatic() && x[1].size % *groups != 0)
    return fail(q, "operand 0 has " + x[1].str() + " channels, not divisible by groups = " + std::to_string(*groups));
  if (dy[1].isStatic() && dy[1].size % *groups != 0)
    return fail(q, "operand 1 has " + dy[1].str() + " channels, not divisible by groups = " + std::to_string(*groups));
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  Shape shape{dy[1], x[1].isStatic() ? Dim::fixed(x[1].size / *groups) : Dim::unknown()};
  for (size_t i = 0; i < spatial; ++i) {
    if ((*kernel)[i] < 1)
      return fail(q, "attribute 'kernel' entry " + std::to_string(i) + " = " + std::to_string((*kernel)[i]) +
                         ", expected at least 1");
    auto out = windowOutput(q, i, x[i + 2], Dim::fixed((*kernel)[i]), (*windows)[i]);
    if (!out) return out.takeError();
    KILN_TRY(expectDim(q, 1, i + 2, *out, "the convolution's output size"));
    shape.push_back(Dim::fixed((*kernel)[i]));
  }
  return Types{{contractionDType(q), std::move(shape)}};
}

Result inferConvTranspose(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, DTypes::Numeric));
  KILN_TRY(expectSameDType(q, 0, 1));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  int64_t rank = rankOf(q, 0);
  KILN_TRY(expectRank(q, 1, rank, "w[C, M/groups, K...] has x's rank"));
  auto groups = intAttr(q, "groups");
  if (!groups) return groups.takeError();
  if (*groups < 1) return fail(q, "attribute 'groups' = " + std::to_string(*groups) + ", expected at least 1");
  const Shape& x = shapeOf(q, 0);
  const Shape& w = shapeOf(q, 1);
  KILN_TRY(expectDim(q, 1, 0, x[1], "operand 0's channels"));
  Dim channels = Dim::unknown();
  if (w[1].isStatic()) {
    Wide m = Wide(w[1].size) * *groups;
    if (m > kInt64Max) return fail(q, "output channels overflow int64");
    channels = Dim::fixed(static_cast<int64_t>(m));
  } else if (*groups == 1) {
    channels = w[1];
  }
  KILN_TRY(checkBias(q, channels));
  size_t spatial = static_cast<size_t>(rank - 2);
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  auto outputPadding = spatialAttr(q, "output_padding", spatial, 0, 0);
  if (!outputPadding) return outputPadding.takeError();
  Shape shape{x[0], channels};
  for (size_t i = 0; i < spatial; ++i) {
    const Window& win = (*windows)[i];
    int64_t extra = (*outputPadding)[i];
    if (extra >= std::max(win.stride, win.dilation))
      return fail(q, "attribute 'output_padding' entry " + std::to_string(i) + " = " + std::to_string(extra) +
                         ", expected less than the stride or the dilation");
    const Dim& in = x[i + 2];
    const Dim& k = w[i + 2];
    if (!in.isStatic() || !k.isStatic()) {
      shape.push_back(Dim::unknown());
      continue;
    }
    Wide out =
        Wide(win.stride) * (in.size - 1) + extra + Wide(win.dilation) * (k.size - 1) + 1 - win.padBegin - win.padEnd;
    if (in.size < 1 || k.size < 1 || out < 1)
      return fail(q, "spatial dim " + std::to_string(i) + ": input " + in.str() + " and kernel " + k.str() +
                         " give an empty output after removing pads " + std::to_string(win.padBegin) + " and " +
                         std::to_string(win.padEnd));
    if (out > kInt64Max) return fail(q, "spatial dim " + std::to_string(i) + " of the output overflows int64");
    shape.push_back(Dim::fixed(static_cast<int64_t>(out)));
  }
  return Types{{contractionDType(q), std::move(shape)}};
}

Result inferPool(const ShapeQuery& q) {
  KILN_TRY(expectDType(q, 0, q.kind == OpKind::AvgPool ? DTypes::Float : DTypes::Numeric));
  KILN_TRY(expectMinRank(q, 0, 3, "x[N, C, D...] with at least one spatial dim"));
  if (opInfo(q.kind).findAttr("count_include_pad")) KILN_TRY(boolAttr(q, "count_include_pad"));
  size_t spatial = static_cast<size_t>(rankOf(q, 0) - 2);
  auto kernel = intsAttr(q, "kernel");
  if (!kernel) return kernel.takeError();
  if (kernel->size() != spatial)
    return fail(q, "attribute 'kernel' has " + std::to_string(kernel->size()) + " entries, expected " +
                       std::to_string(spatial) + " (one per spatial dim)");
  for (size_t i = 0; i < spatial; ++i)
    if ((*kernel)[i] < 1)
      return fail(q, "attribute 'kernel' entry " + std::to_string(i) + " = " + std::to_string((*kernel)[i]) +
                         ", expected at least 1");
  auto windows = windowAttrs(q, spatial);
  if (!windows) return windows.takeError();
  auto channelsLast = boolAttr(q, "channels_last");
  if (!channelsLast) return channelsLast.takeError();
  Shape x = shapeOf(q, 0);
  if (*channelsLast) std::rotate(x.begin() + 1, x.end() - 1, x.end());
  Shape shape{x[0], x[1]};
  for (size_t i = 0; i < spatial; ++i) {
    auto out = windowOutput(q, i, x[i + 2], Dim::fixed((*kernel)[i]), (*windows)[i]);
    if (!out) return out.takeError();
    shape.push_back(*out);
  }
  if (*channelsLast) std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
  return Types{{operand(q, 0).dtype, std::move(shape)}};
}

/// qconv and qmatmul: the shape of the float conv or matmul of x and w (a
/// query of that op on the same attributes), in the declared dtype (u8 or
/// i8); scale f32[M] and bias i32[M] per output channel.
Result inferQuantizedContraction(const ShapeQuery& q) {
  const bool conv = q.kind == OpKind::QConv;
  if (!isInt8(operand(q, 0).dtype))
    return fail(q, "operand 0 has dtype " + std::string(dtypeName(operand(q, 0).dtype)) + ", expected u8 or i8");
  if (operand(q, 1).dtype != DType::I8)
    return fail(q,
                "operand 1 (the weights) has dtype " + std::string(dtypeName(operand(q, 1).dtype)) + ", expected i8");
  if (!conv) KILN_TRY(expectRank(q, 1, 2, "w[K, N]"));
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  if (!isInt8(declared->dtype)) return fail(q, "declared result type " + declared->str() + " must be u8 or i8");
  const std::vector<TensorType> floats = {{DType::F32, shapeOf(q, 0)}, {DType::F32, shapeOf(q, 1)}};
  auto shape = inferResultTypes(ShapeQuery{conv ? OpKind::Conv : OpKind::MatMul, floats, q.attrs, {}, q.loc});
  if (!shape) return fail(q, std::string(conv ? "as a convolution: " : "as a matmul: ") + shape.error().message());
  const Shape& result = (*shape)[0].shape;
  const Dim& channels = conv ? result[1] : result.back();
  const char* why = conv ? "one per output channel" : "one per output column";
  if (operand(q, 2).dtype != DType::F32)
    return fail(q,
                "operand 2 (the scales) has dtype " + std::string(dtypeName(operand(q, 2).dtype)) + ", expected f32");
  KILN_TRY(expectRank(q, 2, 1, why));
  KILN_TRY(expectDim(q, 2, 0, channels, why));
  if (q.operands.size() == 4) {
    if (operand(q, 3).dtype != DType::I32)
      return fail(q,
                  "operand 3 (the bias) has dtype " + std::string(dtypeName(operand(q, 3).dtype)) + ", expected i32");
    KILN_TRY(expectRank(q, 3, 1, why));
    KILN_TRY(expectDim(q, 3, 0, channels, why));
  }
  for (const char* name : {"x_zero_point", "y_zero_point"}) {
    auto zp = intAttr(q, name);
    if (!zp) return zp.takeError();
    const int64_t lo = operand(q, 0).dtype == DType::U8 ? 0 : -128, hi = lo + 255;
    const int64_t ylo = declared->dtype == DType::U8 ? 0 : -128, yhi = ylo + 255;
    const bool isX = std::string_view(name) == "x_zero_point";
    if (*zp < (isX ? lo : ylo) || *zp > (isX ? hi : yhi))
      return fail(q, "attribute '" + std::string(name) + "' = " + std::to_string(*zp) + " is out of range for " +
                         std::string(dtypeName(isX ? operand(q, 0).dtype : declared->dtype)));
  }
  return Types{{declared->dtype, result}};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule MatMul = &inferMatMul;
const Rule Conv = &inferConv;
const Rule ConvTranspose = &inferConvTranspose;
const Rule ConvWeightGrad = &inferConvWeightGrad;
const Rule MaxPool = &inferPool;
const Rule AvgPool = &inferPool;
const Rule QConv = &inferQuantizedContraction;
const Rule QMatMul = &inferQuantizedContraction;
}  // namespace rules

}  // namespace kiln::shape_rules
