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
// batch). A reduction over more than 3 elements that two parts need and
// that is no result is not cheap to repeat: it becomes a part of its own,
// before the first part that needs it, whose buffer the others read (SGD with momentum's new momentum and
// new parameter both add the bias gradient, a column sum over the batch:
// each of the two kernels summed it, and a GPT-shaped step spent 15 ms of
// its 280 in the second sums). Each part keeps only the operands its region
// reads: a kernel's operands are what it reads, which the in-place update
// of donated arguments relies on (passes/MemoryPlan.h).
#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>
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

/// A reduction over at most this many elements per result element is
/// computed again by each part that needs it, as elementwise ops are. Above
/// it, reading its k inputs in each of two parts (2k per result element)
/// costs more than writing its result once and reading it twice (k + 3): a
/// weight gradient summed over a batch of 8 matmuls, which both momentum
/// update kernels summed again, read 12 MB instead of 6.
constexpr int64_t kMaxRepeatedReduction = 3;

bool isReduce(OpKind k) {
  return k == OpKind::ReduceSum || k == OpKind::ReduceMean || k == OpKind::ReduceMax || k == OpKind::ReduceMin ||
         k == OpKind::ReduceProd || k == OpKind::ArgMax || k == OpKind::ArgMin;
}

/// Whether `op` is a reduction too long to compute twice: more than
/// kMaxRepeatedReduction input elements per result element, or shapes not
/// known.
bool isLongReduction(const Op& op) {
  if (!isReduce(op.kind())) return false;
  const TensorType &in = op.operand(0)->type(), &out = op.result()->type();
  if (!in.isStatic() || !out.isStatic()) return true;
  const int64_t outElements = std::max<int64_t>(numElements(out.shape), 1);
  return numElements(in.shape) > kMaxRepeatedReduction * outElements;
}

/// What one part computes: result `result` of the group, or (result -1)
/// the first result of the region's op at position `op`, a value no one
/// outside the group reads.
struct Part {
  int result = -1;
  size_t op = 0;
};

/// The value `part` names in `region` (the group's region or a copy of it).
Value* partValue(const Function& region, const Part& part) {
  if (part.result >= 0) return region.returnOp()->operand(static_cast<size_t>(part.result));
  auto it = region.ops().begin();
  std::advance(it, static_cast<std::ptrdiff_t>(part.op));
  return (*it)->result();
}

/// The ops `value` is computed from in its region, itself included,
/// stopping at the values in `stops` other than `value` (read from buffers).
std::set<const Op*> coneOf(const Value* value, const std::set<const Value*>& stops) {
  std::set<const Op*> cone;
  std::vector<const Value*> work = {value};
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    const Op* def = v->definingOp();
    if (!def || (v != value && stops.count(v)) || !cone.insert(def).second) continue;
    for (const Value* operand : def->operands()) work.push_back(operand);
  }
  return cone;
}

/// The order of the parts of a group with `region`. First its results, in
/// order except that a result another is computed from comes before it (a
/// ReLU's gradient that the group returns for the next matmul, and the
/// bias update computed from it), so each part reads the results before it
/// that it needs from their buffers. Then, before the first result that
/// needs it, each long reduction (isLongReduction) that is no result and
/// that the cones of two or more results hold, a cone stopping at the
/// results before it: computed once, by a part of its own, which reads the
/// results it is computed from (all before it) from their buffers too.
std::vector<Part> partOrder(const Function& region) {
  const Op* ret = region.returnOp();
  const size_t n = ret->numOperands();
  std::set<const Value*> results(ret->operands().begin(), ret->operands().end());
  std::vector<std::set<const Op*>> cones;
  for (size_t i = 0; i < n; ++i) cones.push_back(coneOf(ret->operand(i), {}));
  // Results in order, each after the results its cone holds (a stable
  // topological order: the values form no cycle).
  std::vector<size_t> resultOrder;
  std::vector<bool> placed(n, false);
  while (resultOrder.size() < n) {
    size_t next = n;
    for (size_t i = 0; i < n && next == n; ++i) {
      if (placed[i]) continue;
      bool ready = true;
      for (size_t k = 0; k < n && ready; ++k) {
        const Value* other = ret->operand(k);
        ready = placed[k] || other == ret->operand(i) || !other->definingOp() ||
                !cones[i].count(other->definingOp());
      }
      if (ready) next = i;
    }
    // (A cycle cannot happen in SSA; the first unplaced result if it did.)
    for (size_t i = 0; i < n && next == n; ++i)
      if (!placed[i]) next = i;
    placed[next] = true;
    resultOrder.push_back(next);
  }
  std::map<const Op*, int> needs;
  std::map<const Op*, size_t> firstNeed;
  std::set<const Value*> earlier;
  for (size_t p = 0; p < n; ++p) {
    const Value* r = ret->operand(resultOrder[p]);
    for (const Op* op : coneOf(r, earlier))
      if (needs[op]++ == 0) firstNeed[op] = p;
    earlier.insert(r);
  }
  std::vector<Part> order;
  for (size_t p = 0; p < n; ++p) {
    size_t position = 0;
    for (const auto& op : region.ops()) {
      if (op->numResults() == 1 && !results.count(op->result()) && needs[op.get()] >= 2 && firstNeed[op.get()] == p &&
          isLongReduction(*op))
        order.push_back({-1, position});
      ++position;
    }
    order.push_back({static_cast<int>(resultOrder[p]), 0});
  }
  return order;
}

/// Replaces `group` by one single-result group per part (partOrder: its
/// results and its shared long reductions), in that order, where `group`
/// was; a part reads the values of the parts before it from their buffers.
void splitGroup(Function& f, Op* group) {
  const std::vector<Part> order = partOrder(*group->region());
  std::vector<Value*> parts;
  for (size_t i = 0; i < order.size(); ++i) {
    std::unique_ptr<Function> region = group->region()->clone();
    Op* ret = region->returnOp();
    std::vector<Value*> partValues;
    for (const Part& p : order) partValues.push_back(partValue(*region, p));
    const TensorType type = partValues[i]->type();
    const std::string name = partValues[i]->name();
    ret->setOperands({partValues[i]});
    region->setResultTypes({type});
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
      Value* earlier = partValues[j];
      if (earlier == partValues[i] || !live.count(earlier)) continue;
      earlier->replaceAllUsesWith(region->addArgument(earlier->type(), earlier->name()));
      operands.push_back(parts[j]);
    }
    eraseDeadOps(*region);
    for (size_t a = region->numArguments(); a-- > 0;) {
      if (region->argument(a)->hasUses()) continue;
      region->eraseArgument(a);
      operands.erase(operands.begin() + static_cast<std::ptrdiff_t>(a));
    }
    Op* part = f.insert(group, Op::create(OpKind::Fused, std::move(operands), {type}, group->attrs(), group->loc()));
    part->setRegion(std::move(region));
    if (order[i].result >= 0) {
      Value* result = group->result(static_cast<size_t>(order[i].result));
      part->result()->setName(result->name());
      result->replaceAllUsesWith(part->result());
    } else {
      part->result()->setName(name);
    }
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
