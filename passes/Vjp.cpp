// Differentiation of the ops of ir/Ops.def: the dispatch from an op to its
// VJP entry, the backward sweep, and unbroadcast. For y = op(x...), given
// dy = dL/dy, each rule builds dL/dx for every operand that needs it, as new
// ops, reusing the forward operands and result rather than recomputing them.
// The rules live with their op family in passes/Vjp<Family>.cpp
// (Elementwise, Layout, Reduce, Contraction, Collective, ControlFlow; the
// families of runtime/*Kernels.cpp), each declaring the VjpKind of its ops in
// `vjp::entries::<Enum>`; the families without rules (random, composite,
// recurrent, data-dependent) declare theirs below. Every op kind needs an
// entry: the table below refers to all of them, so a missing one fails to
// link. Broadcasting operands get their gradient summed back to their own
// shape (unbroadcast).
#include "passes/Vjp.h"

#include "passes/VjpSupport.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <set>

namespace kiln {

using namespace vjp;

void markActive(std::span<Op* const> ops, std::set<const Value*>& active, const std::set<const Value*>& held) {
  for (Op* op : ops) {
    bool any = false;
    for (Value* v : op->operands()) any |= active.count(v) > 0;
    if (!any) continue;
    for (Value* r : op->results())
      if (isFloat(r->type().dtype) && !held.count(r)) active.insert(r);
  }
}

Status accumulateGradient(Builder& b, GradientMap& grads, const Value* v, Value* g) {
  Value*& slot = grads[v];
  if (!slot) {
    slot = g;
    return Status::success();
  }
  auto sum = b.value(OpKind::Add, {slot, g});
  if (!sum) return sum.takeError();
  slot = *sum;
  return Status::success();
}

Status sweepBackward(Builder& b, std::span<Op* const> ops, const std::set<const Value*>& active, GradientMap& grads,
                     const std::function<Status(Op&)>& composite) {
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    Op& op = **it;
    std::vector<Value*> dys;
    bool reached = false;
    for (Value* r : op.results()) {
      auto found = grads.find(r);
      dys.push_back(found == grads.end() ? nullptr : found->second);
      reached |= found != grads.end();
    }
    if (!reached) continue;
    b.setLocation(op.loc());
    if (composite && op.info().isComposite()) {
      KILN_TRY(composite(op));
      continue;
    }
    std::vector<bool> needs;
    for (Value* v : op.operands()) needs.push_back(active.count(v) > 0);
    auto operandGrads = applyVjpResults(b, op, dys, needs);
    if (!operandGrads) return operandGrads.takeError();
    for (size_t i = 0; i < op.numOperands(); ++i)
      if (Value* g = (*operandGrads)[i]) KILN_TRY(accumulateGradient(b, grads, op.operand(i), g));
  }
  return Status::success();
}

namespace vjp::entries {
// The families whose ops have no rule of their own: random samplers give
// no gradient, composites and the recurrent layers are differentiated
// through their decomposition, and of the data-dependent ops only unique
// is differentiable (without a rule yet).
const VjpEntry RandomUniform = kNone;
const VjpEntry RandomNormal = kNone;
const VjpEntry Softmax = kDecompose;
const VjpEntry LogSoftmax = kDecompose;
const VjpEntry LayerNorm = kDecompose;
const VjpEntry BatchNorm = kDecompose;
const VjpEntry Gelu = kDecompose;
const VjpEntry Silu = kDecompose;
const VjpEntry LeakyRelu = kDecompose;
const VjpEntry Elu = kDecompose;
const VjpEntry Softplus = kDecompose;
const VjpEntry Attention = kDecompose;
const VjpEntry CrossEntropy = kDecompose;
const VjpEntry NllLoss = kDecompose;
const VjpEntry MseLoss = kDecompose;
const VjpEntry Quantize = kDecompose;
const VjpEntry Dequantize = kDecompose;
const VjpEntry Rnn = kDecompose;
const VjpEntry Lstm = kDecompose;
const VjpEntry Gru = kDecompose;
const VjpEntry NonZero = kNone;
const VjpEntry Unique = kMissing;
const VjpEntry NonMaxSuppression = kNone;
}  // namespace vjp::entries

namespace {

// One entry per op kind, in Ops.def order (an op without one fails to link).
constexpr const VjpEntry* kVjps[] = {
#define KILN_OP(Enum, ...) &entries::Enum,
#include "ir/Ops.def"
#undef KILN_OP
};
static_assert(std::size(kVjps) == kNumOpKinds);

}  // namespace


VjpKind vjpKind(OpKind kind) { return kVjps[static_cast<size_t>(kind)]->kind; }

std::string_view vjpKindName(VjpKind kind) {
  switch (kind) {
    case VjpKind::Rule: return "rule";
    case VjpKind::NotDifferentiable: return "not differentiable";
    case VjpKind::Decompose: return "decompose";
    case VjpKind::Unsupported: return "unsupported";
  }
  return "?";
}

Expected<Value*> unbroadcast(Builder& b, Value* g, const TensorType& target) {
  const Shape& from = g->type().shape;
  const Shape& to = target.shape;
  if (from.size() < to.size())
    return Error("gradient of type " + g->type().str() + " cannot be summed to " + target.str());
  size_t lead = from.size() - to.size();
  std::vector<int64_t> dropped, ones;
  for (size_t d = 0; d < lead; ++d) dropped.push_back(static_cast<int64_t>(d));
  for (size_t d = 0; d < to.size(); ++d)
    if (to[d].isStatic() && to[d].size == 1 && !(from[lead + d].isStatic() && from[lead + d].size == 1))
      ones.push_back(static_cast<int64_t>(lead + d));
  Value* v = g;
  if (!ones.empty()) {
    auto r = b.value(OpKind::ReduceSum, {v}, {{"axes", Attribute(ones)}, {"keepdims", Attribute(true)}});
    if (!r) return r.takeError();
    v = *r;
  }
  if (!dropped.empty()) {
    auto r = b.value(OpKind::ReduceSum, {v}, {{"axes", Attribute(dropped)}, {"keepdims", Attribute(false)}});
    if (!r) return r.takeError();
    v = *r;
  }
  return v;
}

Expected<std::vector<Value*>> applyVjpResults(Builder& b, Op& op, std::span<Value* const> dys,
                                              const std::vector<bool>& needs) {
  const VjpEntry& entry = *kVjps[static_cast<size_t>(op.kind())];
  if (entry.kind == VjpKind::NotDifferentiable) return std::vector<Value*>(op.numOperands(), nullptr);
  if (!entry.resultsRule) {
    if (op.numResults() != 1) return op.emitError("has several results; autodiff handles single-result ops and loop only");
    if (!dys[0]) return std::vector<Value*>(op.numOperands(), nullptr);
    return applyVjp(b, op, dys[0], needs);
  }
  Grad g(b, op);
  std::vector<Value*> grads = entry.resultsRule(g, op, dys, needs);
  KILN_TRY(g.status());
  grads.resize(op.numOperands(), nullptr);
  for (size_t i = 0; i < grads.size(); ++i)
    if (!needs[i] || !isFloat(op.operand(i)->type().dtype)) grads[i] = nullptr;
  return grads;
}

Expected<std::vector<Value*>> applyVjp(Builder& b, const Op& op, Value* dy, const std::vector<bool>& needs) {
  const VjpEntry& entry = *kVjps[static_cast<size_t>(op.kind())];
  if (entry.resultsRule) return op.emitError("has a rule for several results: differentiate it with applyVjpResults");
  if (entry.kind == VjpKind::NotDifferentiable) return std::vector<Value*>(op.numOperands(), nullptr);
  if (entry.kind == VjpKind::Decompose) return op.emitError("is a composite op; decompose it before autodiff");
  if (entry.kind != VjpKind::Rule)
    return op.emitError("has no gradient rule yet (see docs/autodiff.md for the ops that have one)");
  Grad g(b, op);
  std::vector<Value*> grads = entry.rule(g, op, dy);
  KILN_TRY(g.status());
  grads.resize(op.numOperands(), nullptr);
  for (size_t i = 0; i < grads.size(); ++i)
    if (!needs[i] || !isFloat(op.operand(i)->type().dtype)) grads[i] = nullptr;
  return grads;
}

}  // namespace kiln
