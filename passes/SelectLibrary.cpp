// The `select-library` pass: decides, before fusion, which matmuls and
// convolutions a library computes (oneDNN on the CPU) and which of the ops
// after them the library applies as post-ops in the same call. It runs on
// composite ops that are still whole (`gelu`, `silu`; raise-activations
// restores them from exported subgraphs), so a library's activation is
// matched as the op it is, and `fuse` never builds a group that a later step
// must take apart: it leaves a `library` group alone.
#include <algorithm>
#include <vector>

#include "passes/Pass.h"
#include "passes/Target.h"

namespace kiln {

namespace {

/// Longer epilogues than this are not offered; no model has one, and each
/// offer may cost the target a library query.
constexpr size_t kMaxEpilogue = 8;

bool isContraction(const Op& op) {
  return op.kind() == OpKind::MatMul || op.kind() == OpKind::Conv || op.kind() == OpKind::ConvTranspose ||
         op.kind() == OpKind::ConvWeightGrad || op.kind() == OpKind::QConv || op.kind() == OpKind::QMatMul;
}

/// A single-element constant: copied into the group's region, where the
/// target reads it as a post-op's scale or shift.
bool isScalarConstant(const Value* v) {
  const Op* def = v->definingOp();
  return def && def->kind() == OpKind::Constant && v->type().isStatic() && numElements(v->type().shape) == 1;
}

/// An op of one element of the running value alone: one operand, or a
/// second that is a scalar constant (relu, tanh, mul by 0.5, max with 0).
bool isScalarFunction(const Op& op) {
  if (op.numOperands() == 1) return true;
  return op.numOperands() == 2 && (isScalarConstant(op.operand(0)) || isScalarConstant(op.operand(1)));
}

/// Whether `fuse` makes `op` an elementwise kernel with the elementwise ops
/// before it: an elementwise op, or an activation that decomposes into
/// elementwise ops (not softmax, whose kernel is a reduction's).
bool isElementwiseKernel(const Op& op) {
  switch (op.kind()) {
    case OpKind::Gelu:
    case OpKind::Silu:
    case OpKind::LeakyRelu:
    case OpKind::Elu:
    case OpKind::Softplus: return true;
    default: return op.info().isElementwise();
  }
}

/// Whether `op` casts an f32 `value` to bf16 or f16 of its shape: the
/// cast before the next contraction of a mixed-precision model (the
/// autocast pass's), which a library call makes by storing its result in
/// the low precision.
bool isNarrowingCast(const Op& op, const Value* value) {
  const TensorType& to = op.result()->type();
  return op.kind() == OpKind::Cast && value->type().dtype == DType::F32 &&
         (to.dtype == DType::BF16 || to.dtype == DType::F16) && to.shape == value->type().shape;
}

/// The ops after `anchor` that could be its epilogue: each the only user of
/// the previous value, reading it once, with the anchor's result type; the
/// last may be a cast of it to bf16 or f16 (isNarrowingCast).
std::vector<const Op*> candidateEpilogue(const Op& anchor) {
  std::vector<const Op*> chain;
  const Value* current = anchor.result();
  while (chain.size() < kMaxEpilogue && current->users().size() == 1) {
    const Op* user = current->users().front();
    if (user->kind() == OpKind::Return || user->region() || user->numResults() != 1 || user->info().hasSideEffects())
      break;
    const bool narrowing = isNarrowingCast(*user, anchor.result());
    if (user->result()->type() != anchor.result()->type() && !narrowing) break;
    chain.push_back(user);
    current = user->result();
    if (narrowing) break;
  }
  return chain;
}

/// Replaces `anchor` and `epilogue` by one `fused` op of kind "library"
/// where the last of them was: operands are the values they read from
/// outside (the anchor's first), scalar constants are copied in.
/// The `prologue` (the transposes the call reads in place, of a and then
/// of b, transposeReadInPlace) goes into the region before the anchor; each
/// one's operand becomes the group's operand where the transposed value
/// would have been.
void wrapInLibraryGroup(Function& f, Op* anchor, const std::vector<const Op*>& epilogue,
                        const std::vector<Op*>& prologue) {
  std::vector<Op*> members = {anchor};
  for (const Op* op : epilogue) members.push_back(const_cast<Op*>(op));
  Op* last = members.back();

  auto region = std::make_unique<Function>("");
  std::vector<Value*> inputs;
  std::vector<std::pair<Value*, Value*>> inner;  // outside value -> region value
  auto innerValue = [&](Value* v) -> Value* {
    for (const auto& [outer, in] : inner)
      if (outer == v) return in;
    Value* in;
    if (isScalarConstant(v)) {
      const Op* def = v->definingOp();
      Op* copy = region->insert(nullptr, Op::create(OpKind::Constant, {}, {v->type()}, def->attrs(), def->loc()));
      copy->result()->setName(v->name());
      in = copy->result();
    } else {
      inputs.push_back(v);
      in = region->addArgument(v->type(), v->name());
    }
    inner.emplace_back(v, in);
    return in;
  };
  // Arguments in order of first use (a prologue's operand where the
  // anchor reads its result), then the members moved into the region.
  for (Op* m : members)
    for (Value* v : m->operands()) {
      for (Op* p : prologue)
        if (v == p->result()) v = p->operand(0);
      if (!v->definingOp() || std::find(members.begin(), members.end(), v->definingOp()) == members.end())
        innerValue(v);
    }
  members.insert(members.begin(), prologue.begin(), prologue.end());

  Op* group = f.insert(last, Op::create(OpKind::Fused, inputs, {last->result()->type()},
                                        {{"kind", Attribute("library")}}, anchor->loc()));
  group->result()->setName(last->result()->name());
  last->result()->replaceAllUsesWith(group->result());
  for (Op* m : members) {
    std::unique_ptr<Op> owned = f.take(m);
    for (size_t k = 0; k < m->numOperands(); ++k)
      for (const auto& [outer, in] : inner)
        if (m->operand(k) == outer) m->setOperand(k, in);
    region->insert(nullptr, std::move(owned));
  }
  region->insert(nullptr, Op::create(OpKind::Return, {last->result()}, {}, {}, last->loc()));
  region->setResultTypes({last->result()->type()});
  region->setLoc(anchor->loc());
  group->setRegion(std::move(region));
  // A constant now read only through its copy in the region goes.
  for (const auto& [outer, in] : inner)
    if (Op* def = outer->definingOp(); def && def->kind() == OpKind::Constant && !outer->hasUses()) f.erase(def);
}

}  // namespace

/// For each matmul, conv and conv_transpose in program order, offers the
/// target the op with the longest run of single-use ops after it (see
/// candidateEpilogue), then shorter runs down to the op alone, and wraps the
/// first the target accepts into a `library` group:
///
///   %m = matmul(%x, %w) : f32[8,12]
///   %s = add(%m, %b) : f32[8,12]
///   %g = gelu(%s) {approximate = "tanh"} : f32[8,12]
/// becomes, on the CPU (oneDNN: bias add and GELU as post-ops)
///   %g = fused(%x, %w, %b) {kind = "library"} : f32[8,12] {
///   ^(%x: f32[8,64], %w: f32[64,12], %b: f32[12]):
///     %m = matmul(%x, %w) : f32[8,12]
///     %s = add(%m, %b) : f32[8,12]
///     %g = gelu(%s) {approximate = "tanh"} : f32[8,12]
///     return %g
///   }
///
/// When the run taken stops before an elementwise op (which `fuse` then
/// generates as a kernel reading the call's result), the scalar functions
/// at the run's end (relu, a scale) are left out of the group too, to be
/// computed in that kernel: no more memory traffic, and less arithmetic than
/// some post-ops (an exact relu on oneDNN is an exp polynomial). So ReLU6,
/// max(x, 0) then min(x, 6), is a convolution alone and one kernel for both.
///
/// A matmul whose a or b is a transpose of its last two dims read by the
/// matmul alone (transposeReadInPlace in passes/Target.h: a Linear's weight,
/// a constant too large for canonicalize to fold the transpose or a
/// training step's parameter; dy^T of a weight's gradient; attention's k^T)
/// takes the transpose into its group, the transposed value as the group's
/// operand, and the call reads it in place instead of a kernel copying it:
///
///   %wt = transpose(%w) {perm = [1, 0]} : f32[25088,4096]
///   %m = matmul(%x, %wt) : f32[1,4096]
/// becomes
///   %m = fused(%x, %w) {kind = "library"} : f32[1,4096] {
///   ^(%x: f32[1,25088], %w: f32[4096,25088]):
///     %wt = transpose(%w) {perm = [1, 0]} : f32[25088,4096]
///     %m = matmul(%x, %wt) : f32[1,4096]
///     return %m
///   }
///
/// An op the target refuses even alone (too small, not f32) stays as it is,
/// for `fuse` and a generated kernel. A target refuses an epilogue op its
/// library computes otherwise than the op is defined on NaN, infinities or
/// signed zeros (docs/ops.md, "Special values": oneDNN's clip, the min(x, 6)
/// of ReLU6, turns NaN into 6), so the run offered stops before it and the
/// op is generated with those after it. Without a target the pass is an error.
class SelectLibraryPass : public Pass {
 public:
  std::string_view name() const override { return "select-library"; }

  Expected<bool> run(Module& m, const PassContext& ctx) override {
    if (!ctx.target) return Error("select-library needs a target (kiln-opt --target cpu|cuda)");
    bool changed = false;
    for (const auto& f : m.functions()) {
      std::vector<Op*> anchors;
      for (const auto& op : f->ops())
        if (isContraction(*op) && op->result()->type().isStatic()) anchors.push_back(op.get());
      for (Op* anchor : anchors) {
        std::vector<const Op*> epilogue = candidateEpilogue(*anchor);
        for (size_t n = epilogue.size() + 1; n-- > 0;) {
          if (!ctx.target->acceptsLibraryCall(*anchor, std::span(epilogue.data(), n))) continue;
          // The op after the run taken is a generated kernel (fuse makes it
          // one with the ops before it that are outside the group), which
          // reads the call's result and writes its own either way: scalar
          // ops at the run's end cost no memory traffic there, and less
          // arithmetic than as post-ops (ReLU6's relu is one max there, an
          // exp polynomial in oneDNN), so they go with it.
          if (n < epilogue.size() && isElementwiseKernel(*epilogue[n]))
            while (n > 0 && isScalarFunction(*epilogue[n - 1]) &&
                   ctx.target->acceptsLibraryCall(*anchor, std::span(epilogue.data(), n - 1)))
              --n;
          epilogue.resize(n);
          std::vector<Op*> prologue;
          for (size_t i = 0; i < 2; ++i)
            if (const Op* t = transposeReadInPlace(*anchor, i)) prologue.push_back(const_cast<Op*>(t));
          wrapInLibraryGroup(*f, anchor, epilogue, prologue);
          changed = true;
          break;
        }
      }
    }
    return changed;
  }
};

std::unique_ptr<Pass> createSelectLibraryPass() { return std::make_unique<SelectLibraryPass>(); }

}  // namespace kiln
