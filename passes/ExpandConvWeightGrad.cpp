// The `expand-conv-weight-grad` pass: for a target whose library computes no
// convolution weight gradient (Target::takesConvWeightGrad; CUDA, whose cuDNN
// calls are forward and transposed convolutions), rewrites each
// conv_weight_grad as the forward convolution that gives the same values, so
// that the library computes it instead of a generated reduction over the
// whole batch for each weight:
//
//   %dw = conv_weight_grad(%x, %dy) {kernel = [3, 3], strides = [2, 2]} : f32[8,4,3,3]
// becomes, per group,
//   %xt = transpose(%x) {perm = [1, 0, 2, 3]}            // [C, N, H, W]
//   %dyt = transpose(%dy) {perm = [1, 0, 2, 3]}          // [M, N, h, w]
//   %f = conv(%xt, %dyt) {dilations = [2, 2]}            // strides and dilations exchanged
//   %c = slice(%f) ... to the kernel's size              // [C, M, 3, 3]
//   %dw = transpose(%c) {perm = [1, 0, 2, 3]}            // [M, C, 3, 3]
// with the groups' results concatenated along dim 0. The CPU (oneDNN's
// backward-weights convolution) keeps conv_weight_grad.
#include <string>
#include <vector>

#include "ir/Builder.h"
#include "passes/Pass.h"
#include "passes/Target.h"

namespace kiln {

namespace {

std::vector<int64_t> intsOr(const Op& op, std::string_view name, int64_t fill, size_t n) {
  std::vector<int64_t> v = op.getInts(name);
  if (v.empty()) v.assign(n, fill);
  return v;
}

/// `v` sliced along every dim: [starts, ends) with step 1.
Expected<Value*> slice(Builder& b, Value* v, std::vector<int64_t> starts, std::vector<int64_t> ends) {
  std::vector<int64_t> steps(starts.size(), 1);
  return b.value(OpKind::Slice, {v},
                 {{"starts", Attribute(std::move(starts))},
                  {"ends", Attribute(std::move(ends))},
                  {"steps", Attribute(std::move(steps))}});
}

Expected<Value*> expand(Builder& b, Op& op) {
  Value* x = op.operand(0);
  Value* dy = op.operand(1);
  const std::vector<int64_t> xd = staticDims(x->type().shape), dyd = staticDims(dy->type().shape);
  const size_t rank = xd.size(), spatial = rank - 2;
  const std::vector<int64_t> kernel = op.getInts("kernel");
  const std::vector<int64_t> strides = intsOr(op, "strides", 1, spatial);
  const std::vector<int64_t> dilations = intsOr(op, "dilations", 1, spatial);
  const std::vector<int64_t> pads = intsOr(op, "pads", 0, 2 * spatial);
  const int64_t groups = op.getInt("groups");
  const int64_t cg = xd[1] / groups, mg = dyd[1] / groups;
  std::vector<int64_t> perm = {1, 0};
  for (size_t i = 2; i < rank; ++i) perm.push_back(static_cast<int64_t>(i));
  std::vector<Value*> parts;
  for (int64_t g = 0; g < groups; ++g) {
    Value* xg = x;
    Value* dyg = dy;
    if (groups > 1) {
      std::vector<int64_t> starts(rank, 0), xEnds = xd, dyEnds = dyd;
      starts[1] = g * cg;
      xEnds[1] = (g + 1) * cg;
      auto xs = slice(b, x, starts, xEnds);
      if (!xs) return xs.takeError();
      starts[1] = g * mg;
      dyEnds[1] = (g + 1) * mg;
      auto dys = slice(b, dy, starts, dyEnds);
      if (!dys) return dys.takeError();
      xg = *xs;
      dyg = *dys;
    }
    auto xt = b.value(OpKind::Transpose, {xg}, {{"perm", Attribute(perm)}});
    if (!xt) return xt.takeError();
    auto dyt = b.value(OpKind::Transpose, {dyg}, {{"perm", Attribute(perm)}});
    if (!dyt) return dyt.takeError();
    // The declared dtype keeps a mixed-precision gradient's f32 result
    // (bf16 or f16 x and dy; ir/ShapeRulesContraction.cpp).
    auto full = b.value(OpKind::Conv, {*xt, *dyt},
                        {{"strides", Attribute(dilations)}, {"pads", Attribute(pads)}, {"dilations", Attribute(strides)}},
                        {TensorType{op.result()->type().dtype, {}}});
    if (!full) return full.takeError();
    // [C/g, M/g, K'...] cropped to the kernel, then [M/g, C/g, K...].
    std::vector<int64_t> ends = staticDims((*full)->type().shape);
    for (size_t i = 0; i < spatial; ++i) ends[2 + i] = kernel[i];
    auto cropped = slice(b, *full, std::vector<int64_t>(rank, 0), ends);
    if (!cropped) return cropped.takeError();
    auto part = b.value(OpKind::Transpose, {*cropped}, {{"perm", Attribute(perm)}});
    if (!part) return part.takeError();
    parts.push_back(*part);
  }
  if (parts.size() == 1) return parts[0];
  return b.value(OpKind::Concat, parts, {{"axis", Attribute(int64_t{0})}});
}

}  // namespace

class ExpandConvWeightGradPass : public Pass {
 public:
  std::string_view name() const override { return "expand-conv-weight-grad"; }

  Expected<bool> run(Module& m, const PassContext& ctx) override {
    if (!ctx.target) return Error("expand-conv-weight-grad needs a target (kiln-opt --target cpu|cuda)");
    if (ctx.target->takesConvWeightGrad()) return false;
    bool changed = false;
    for (const auto& f : m.functions()) {
      std::vector<Op*> found;
      for (const auto& op : f->ops())
        if (op->kind() == OpKind::ConvWeightGrad && op->operand(0)->type().isStatic() &&
            op->operand(1)->type().isStatic())
          found.push_back(op.get());
      for (Op* op : found) {
        Builder b(*f);
        b.setInsertionPoint(op);
        b.setLocation(op->loc());
        auto dw = expand(b, *op);
        if (!dw) return dw.takeError();
        (*dw)->setName(op->result()->name());
        op->result()->replaceAllUsesWith(*dw);
        f->erase(op);
        changed = true;
      }
    }
    return changed;
  }
};

std::unique_ptr<Pass> createExpandConvWeightGradPass() { return std::make_unique<ExpandConvWeightGradPass>(); }

}  // namespace kiln
