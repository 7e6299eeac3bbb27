// The `dce` pass: dead code elimination. Erases every op whose results are
// all unused, so that later passes (fusion, memory planning, codegen) never
// spend work or memory on values nobody reads.
#include <vector>

#include "passes/Pass.h"

namespace kiln {

namespace {

/// True when `op` may be erased: it is not the function's `return` nor a
/// `check` (which matters without results), and no result has a user.
/// Random ops qualify too: their only effect is the value they produce (the
/// generator state is not observable elsewhere).
bool isDead(const Op& op);

/// True when a region of `op` holds a `check`, which must still run.
bool holdsCheck(const Op& op) {
  for (size_t r = 0; r < op.numRegions(); ++r)
    for (const auto& inner : op.region(r)->ops())
      if (inner->kind() == OpKind::Check || holdsCheck(*inner)) return true;
  return false;
}

bool isDead(const Op& op) {
  return op.kind() != OpKind::Return && op.kind() != OpKind::Check && !op.hasUses() &&
         !(op.info().isControlFlow() && holdsCheck(op));
}

/// Erases the dead ops of `f`, last to first, and returns whether any went.
bool eraseDeadOps(Function& f) {
  // A snapshot of the body: erasing the op at hand never invalidates the
  // pointers to the ops before it.
  std::vector<Op*> body;
  body.reserve(f.ops().size());
  for (const auto& op : f.ops()) body.push_back(op.get());

  bool changed = false;
  for (auto it = body.rbegin(); it != body.rend(); ++it) {
    if (!isDead(**it)) {
      // A live op's regions keep what their `return`s need and lose the rest.
      for (size_t r = 0; r < (*it)->numRegions(); ++r) changed |= eraseDeadOps(*(*it)->region(r));
      continue;
    }
    f.erase(*it);
    changed = true;
  }
  return changed;
}

}  // namespace

/// Erases ops whose results are all unused. The body is walked from the
/// `return` backwards, so an op whose only users were erased earlier in the
/// same walk is itself dead by the time it is reached: a whole dead chain
/// goes in one run. `return` is never erased, and unused function arguments
/// stay, since they are the function's signature. A `fused` op is dead like
/// any other when no result is used; inside a live one's region the same
/// rule erases ops its `return` does not need. So are `if` and `loop`,
/// unless a body holds a `check`; their bodies read outer values only
/// through the op's operands, so nothing a body uses is erased outside it.
///
///   %a = exp(%x) : f32[4]          (only used by %b)
///   %b = neg(%a) : f32[4]          (unused)
///   %c = relu(%x) : f32[4]
///   return %c
/// becomes
///   %c = relu(%x) : f32[4]
///   return %c
class DCEPass : public Pass {
 public:
  std::string_view name() const override { return "dce"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) changed |= eraseDeadOps(*f);
    return changed;
  }
};

std::unique_ptr<Pass> createDCEPass() { return std::make_unique<DCEPass>(); }

}  // namespace kiln
