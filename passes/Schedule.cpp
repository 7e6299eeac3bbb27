// The `schedule` pass: orders the kernels of a function whose results are
// written into donated arguments (`-> (f32[4] aliases %w)`, a training
// step's parameters and optimizer state), so that each such result can be
// written in place. A kernel may write a donated argument's buffer only
// after the last kernel that reads the argument's old value
// (passes/MemoryPlan.h); split-fused-results gives an optimizer update one
// kernel per result (new momentum, new parameter), each reading the old
// state, and the one writing the new state must come after the one reading
// it. Everything else keeps its order.
#include <set>

#include "passes/Pass.h"

namespace kiln {

namespace {

/// Moves the op computing the result that aliases argument `argument`
/// (returned as `result`) after the last op that reads the argument, when
/// no op in between needs that result. Returns whether it moved.
bool sinkWriter(Function& f, const Value* result, const Value* arg) {
  if (result->isArgument() || result->definingOp()->kind() == OpKind::Constant) return false;
  Op* writer = result->definingOp();
  // The last reader of the argument after the writer; blocked when an op
  // that (transitively) uses the result comes before it.
  std::set<const Value*> dependent = {result};
  Op* lastReader = nullptr;
  Op* afterLastReader = nullptr;
  bool after = false, dependentSeen = false, blocked = false;
  for (const auto& op : f.ops()) {
    if (op.get() == writer) {
      after = true;
      continue;
    }
    if (!after) continue;
    if (lastReader && !afterLastReader) afterLastReader = op.get();
    if (op->kind() == OpKind::Return) break;
    bool readsArg = false, readsDependent = false;
    for (const Value* x : op->operands()) {
      readsArg = readsArg || x == arg;
      readsDependent = readsDependent || dependent.count(x) > 0;
    }
    if (readsDependent) {
      dependentSeen = true;
      for (const Value* r : op->results()) dependent.insert(r);
    }
    if (readsArg) {
      blocked = blocked || dependentSeen;
      lastReader = op.get();
      afterLastReader = nullptr;
    }
  }
  if (!lastReader || blocked) return false;
  f.moveBefore(writer, afterLastReader);
  return true;
}

}  // namespace

/// For each result aliasing an argument, moves the op that computes it after
/// the last reader of the argument's old value, unless something between
/// needs the new value:
///
///   func @step(%w: f32[4], %m: f32[4]) -> (f32[4] aliases %w, f32[4] aliases %m) {
///     %m2 = fused(%m, ...)          // new momentum: reads the old %m
///     %w2 = fused(%w, %m, ...)      // new parameter: reads the old %m too
///     return %w2, %m2
///   }
/// becomes, so that %m2 can overwrite %m's buffer,
///     %w2 = fused(%w, %m, ...)
///     %m2 = fused(%m, ...)
class SchedulePass : public Pass {
 public:
  std::string_view name() const override { return "schedule"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) {
      const Op* ret = f->returnOp();
      if (!ret) continue;
      for (size_t r = 0; r < f->resultTypes().size() && r < ret->numOperands(); ++r) {
        const int a = f->resultAlias(r);
        if (a < 0 || static_cast<size_t>(a) >= f->numArguments()) continue;  // the verifier reports it
        changed |= sinkWriter(*f, ret->operand(r), f->argument(static_cast<size_t>(a)));
      }
    }
    return changed;
  }
};

std::unique_ptr<Pass> createSchedulePass() { return std::make_unique<SchedulePass>(); }

}  // namespace kiln
