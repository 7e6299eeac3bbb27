// The `split-fused-results` pass: a kernel computes one result, so each
// `fused` op with several results becomes one single-result `fused` op per
// result, each holding the part of the region its result needs. The
// lowering composes one result per kernel, so ops shared by two results (a
// residual add feeding a layer norm) are computed by both kernels, which is
// cheap next to writing and reading an extra buffer. A result that another
// result is computed from is in a buffer anyway, so the later part reads it
// instead of computing it again (a training step's bias gradient reduces the
// activation gradient the group also returns, and a new parameter reads its
// new momentum: recomputed, each part repeated the whole chain over the
// batch). Each part keeps only the operands its region reads: a kernel's
// operands are what it reads, which the in-place update of donated
// arguments relies on (passes/MemoryPlan.h).
#include <set>
#include <vector>

#include "passes/Pass.h"

namespace kiln {

namespace {

/// Erases the ops of `region` whose results are unused, last first.
void eraseDeadOps(Function& region) {
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = region.ops().rbegin(); it != region.ops().rend(); ++it) {
      Op* op = it->get();
      if (op->kind() == OpKind::Return || op->hasUses()) continue;
      region.erase(op);
      changed = true;
      break;
    }
  }
}

/// Replaces `group` by one single-result group per result, in result order,
/// where `group` was.
void splitGroup(Function& f, Op* group) {
  std::vector<Value*> parts;
  for (size_t i = 0; i < group->numResults(); ++i) {
    std::unique_ptr<Function> region = group->region()->clone();
    Op* ret = region->returnOp();
    std::vector<Value*> resultValues(ret->operands().begin(), ret->operands().end());
    ret->setOperands({resultValues[i]});
    region->setResultTypes({group->result(i)->type()});
    eraseDeadOps(*region);
    std::vector<Value*> operands(group->operands().begin(), group->operands().end());
    std::set<const Value*> live;
    for (const auto& op : region->ops())
      for (Value* r : op->results()) live.insert(r);
    // An earlier part's result that this part computes from is read from
    // that part's buffer. `live` is asked first: eraseDeadOps freed the
    // values this part does not compute, which must not be read (ASan
    // caught `isArgument` on one); an op result in `live` is no argument.
    for (size_t j = 0; j < i; ++j) {
      Value* earlier = resultValues[j];
      if (earlier == resultValues[i] || !live.count(earlier)) continue;
      earlier->replaceAllUsesWith(region->addArgument(earlier->type(), earlier->name()));
      operands.push_back(parts[j]);
    }
    eraseDeadOps(*region);
    for (size_t a = region->numArguments(); a-- > 0;) {
      if (region->argument(a)->hasUses()) continue;
      region->eraseArgument(a);
      operands.erase(operands.begin() + static_cast<std::ptrdiff_t>(a));
    }
    Op* part = f.insert(group, Op::create(OpKind::Fused, std::move(operands), {group->result(i)->type()},
                                          group->attrs(), group->loc()));
    part->setRegion(std::move(region));
    part->result()->setName(group->result(i)->name());
    group->result(i)->replaceAllUsesWith(part->result());
    parts.push_back(part->result());
  }
  f.erase(group);
}

}  // namespace

/// Splits every `fused` op with several results into single-result ones:
///
///   %a, %b = fused(%x) {kind = "elementwise"} : f32[4], f32[4] {
///   ^(%x: f32[4]):
///     %a = exp(%x) : f32[4]
///     %b = mul(%a, %x) : f32[4]
///     return %a, %b
///   }
/// becomes
///   %a = fused(%x) {kind = "elementwise"} : f32[4] { ... return %a }
///   %b = fused(%x, %a) {kind = "elementwise"} : f32[4] {
///   ^(%x: f32[4], %a: f32[4]):
///     %b = mul(%a, %x) : f32[4]
///     return %b
///   }
class SplitFusedResultsPass : public Pass {
 public:
  std::string_view name() const override { return "split-fused-results"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) {
      std::vector<Op*> groups;
      for (const auto& op : f->ops())
        if (op->kind() == OpKind::Fused && op->region() && op->numResults() > 1) groups.push_back(op.get());
      for (Op* group : groups) splitGroup(*f, group);
      changed |= !groups.empty();
    }
    return changed;
  }
};

std::unique_ptr<Pass> createSplitFusedResultsPass() { return std::make_unique<SplitFusedResultsPass>(); }

}  // namespace kiln
