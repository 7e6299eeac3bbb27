// Converters for ONNX's ops whose output sizes depend on the input values:
// NonZero, Unique and NonMaxSuppression, each one Kiln op of the same
// meaning (ir/Ops.def, "Data-dependent shapes"). Their outputs have an
// unknown dim (`?`) that the interpreter sizes at run time and the CPU
// executor specializes the rest of the function to (docs/codegen.md
// section 6). On constant inputs the importer folds them like any op.
#include "frontend/onnx/ConverterSupport.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {
namespace {

constexpr int64_t kNewest = kNewestOnnxOpset;

Status convertNonZero(NodeContext& ctx) {
  auto x = ctx.input(0);
  if (!x) return x.takeError();
  return setOutput0(ctx, ctx.emit(OpKind::NonZero, {*x}));
}

/// Unique: its four outputs (Y, indices, inverse_indices, counts), each
/// bound where the node asks for it.
Status convertUnique(NodeContext& ctx) {
  auto x = ctx.input(0);
  if (!x) return x.takeError();
  auto sorted = ctx.intAttr("sorted", 1);
  if (!sorted) return sorted.takeError();
  if (*sorted != 0 && *sorted != 1)
    return ctx.error("attribute 'sorted' is " + std::to_string(*sorted) + ", expected 0 or 1");
  std::vector<int64_t> axis;
  if (ctx.attribute("axis")) {
    auto a = ctx.intAttr("axis", 0);
    if (!a) return a.takeError();
    auto normalized = normalizeAxis(ctx, *a, (*x)->type().rank());
    if (!normalized) return normalized.takeError();
    axis.push_back(*normalized);
  }
  auto results =
      ctx.emitMulti(OpKind::Unique, {*x}, {{"axis", Attribute(std::move(axis))}, {"sorted", Attribute(*sorted == 1)}});
  if (!results) return results.takeError();
  for (size_t i = 0; i < results->size() && i < ctx.numOutputs(); ++i)
    if (ctx.hasOutput(i)) ctx.setOutput(i, (*results)[i]);
  return {};
}

/// NonMaxSuppression: optional inputs stay operands (graph inputs at run
/// time, or constants); an absent max_output_boxes_per_class or
/// iou_threshold before a present one becomes ONNX's default, 0.
Status convertNonMaxSuppression(NodeContext& ctx) {
  auto centerPointBox = ctx.intAttr("center_point_box", 0);
  if (!centerPointBox) return centerPointBox.takeError();
  if (*centerPointBox != 0 && *centerPointBox != 1)
    return ctx.error("attribute 'center_point_box' is " + std::to_string(*centerPointBox) + ", expected 0 or 1");
  size_t last = 1;  // the last input given
  for (size_t i = 2; i < ctx.numInputs() && i < 5; ++i)
    if (ctx.hasInput(i)) last = i;
  if (ctx.numInputs() > 5) return ctx.error("has " + std::to_string(ctx.numInputs()) + " inputs, expected at most 5");
  std::vector<Value*> operands;
  for (size_t i = 0; i <= last; ++i) {
    if (!ctx.hasInput(i) && i >= 2) {
      operands.push_back(ctx.scalar(i == 2 ? DType::I64 : DType::F32, 0.0));
      continue;
    }
    auto v = ctx.input(i);
    if (!v) return v.takeError();
    operands.push_back(*v);
  }
  return setOutput0(ctx, ctx.emit(OpKind::NonMaxSuppression, std::move(operands),
                                  {{"center_point_box", Attribute(*centerPointBox == 1)}}));
}

constexpr OpConverter kConverters[] = {
    {"", "NonZero", 9, kNewest, &convertNonZero},
    {"", "Unique", 11, kNewest, &convertUnique},
    {"", "NonMaxSuppression", 10, kNewest, &convertNonMaxSuppression},
};

}  // namespace

std::span<const OpConverter> dataDependentConverters() { return kConverters; }

}  // namespace kiln::onnx_import
