// The `insert-host-checks` pass: the interpreter fails on a gather or
// scatter index out of range, an integer division or remainder by zero and
// an integer pow with a negative exponent, but a compiled kernel cannot
// report an error: it clamps the index or gives 0. So before each op that
// reads such an operand from a buffer, a `check` op makes the host look at
// it first, and the run fails with the interpreter's message, at the op's
// location. Inside a `fused` group the operand is checked when it is one of
// the group's operands; a value computed inside the group has no buffer to
// check (the kernel then clamps or gives 0; docs/codegen.md).
#include <functional>
#include <vector>

#include "passes/Pass.h"

namespace kiln {

namespace {

/// A check to insert: the value, and the `check` op's attributes.
struct PendingCheck {
  Value* value;
  AttrMap attrs;
  Location loc;
};

/// The check `op` needs on its operand (or none), with `operand(i)` giving
/// the value to check for operand i, or null when it has no buffer.
void checksOf(const Op& op, const std::function<Value*(size_t)>& operand, std::vector<PendingCheck>& out) {
  if (op.kind() == OpKind::Fused) {
    if (!op.region()) return;
    for (const auto& inner : op.region()->ops())
      checksOf(
          *inner,
          [&](size_t i) -> Value* {
            const Value* v = inner->operand(i);
            return v->isArgument() ? operand(static_cast<size_t>(v->index())) : nullptr;
          },
          out);
    return;
  }
  const std::string of(op.name());
  switch (op.kind()) {
    case OpKind::Gather:
    case OpKind::GatherElements:
    case OpKind::ScatterElements: {
      Value* indices = operand(1);
      const TensorType& data = op.operand(0)->type();
      if (!indices || !data.isStatic()) return;
      int64_t axis = op.getInt("axis");
      if (axis < 0) axis += data.rank();
      if (axis < 0 || axis >= data.rank()) return;  // the verifier reports it
      out.push_back({indices,
                     {{"condition", Attribute("in_range")},
                      {"of", Attribute(of)},
                      {"axis", Attribute(axis)},
                      {"size", Attribute(data.shape[static_cast<size_t>(axis)].size)}},
                     op.loc()});
      return;
    }
    case OpKind::Div:
    case OpKind::Rem:
    case OpKind::Mod:
    case OpKind::Pow: {
      Value* divisor = operand(1);
      if (!divisor || isFloat(op.operand(1)->type().dtype)) return;
      const char* condition = op.kind() == OpKind::Pow ? "nonnegative" : "nonzero";
      out.push_back({divisor, {{"condition", Attribute(condition)}, {"of", Attribute(of)}}, op.loc()});
      return;
    }
    default: return;
  }
}

/// True when `op` is a check of `pending` already (the pass ran before).
bool isSameCheck(const Op* op, const PendingCheck& pending) {
  return op && op->kind() == OpKind::Check && op->operand(0) == pending.value && op->attrs() == pending.attrs &&
         op->loc() == pending.loc;
}

}  // namespace

/// Inserts a `check` before each op that reads gather or scatter indices,
/// integer divisors or pow exponents from a buffer:
///
///   %y = gather(%table, %ids) {axis = 0} : f32[8,16]
/// becomes
///   check(%ids) {axis = 0, condition = "in_range", of = "gather", size = 64}
///   %y = gather(%table, %ids) {axis = 0} : f32[8,16]
class InsertHostChecksPass : public Pass {
 public:
  std::string_view name() const override { return "insert-host-checks"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) {
      std::vector<Op*> ops;
      for (const auto& op : f->ops()) ops.push_back(op.get());
      std::vector<const Op*> precedingChecks;
      for (Op* op : ops) {
        if (op->kind() == OpKind::Check) {
          precedingChecks.push_back(op);
          continue;
        }
        std::vector<PendingCheck> pending;
        checksOf(*op, [&](size_t i) { return op->operand(i); }, pending);
        for (PendingCheck& check : pending) {
          // A check already in front of the op (a second run) is not repeated.
          bool present = false;
          for (const Op* b : precedingChecks) present = present || isSameCheck(b, check);
          if (present) continue;
          f->insert(op, Op::create(OpKind::Check, {check.value}, {}, std::move(check.attrs), std::move(check.loc)));
          changed = true;
        }
        precedingChecks.clear();
      }
    }
    return changed;
  }
};

std::unique_ptr<Pass> createInsertHostChecksPass() { return std::make_unique<InsertHostChecksPass>(); }

}  // namespace kiln
