// The `plan-memory` pass and planMemory: live ranges of the intermediates
// over the kernel sequence, in-place reuse by elementwise kernels, and
// largest-first packing into one arena (docs/codegen.md §4).
//
// The plan is an artifact beside the IR, not in it: the pass attaches
// nothing (an `arena_offset` attribute would have to be declared for every
// op in the op table), it only checks that every function can be planned and
// fails with the located error when one cannot. `kiln-opt
// --print-memory-plan` prints the plan; the runtime calls planMemory on the
// function it compiles.
#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "passes/MemoryPlan.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

int64_t alignUp(int64_t n, int64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

/// Bytes of a static tensor type, or nullopt above 2^40 (1 TiB): no device
/// has that much memory, and the bound keeps every sum of sizes and offsets
/// far from int64 overflow.
std::optional<int64_t> byteSize(const TensorType& type) {
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  int64_t bytes = static_cast<int64_t>(dtypeSize(type.dtype));
  for (const Dim& d : type.shape)
    if (__builtin_mul_overflow(bytes, d.size, &bytes) || bytes > kMaxBytes) return std::nullopt;
  return bytes;
}

/// Constants (and iota, which depends on nothing either) are stored with the
/// weights; `return` computes nothing. Every other top-level op is a kernel.
bool isKernel(const Op& op) { return op.info().opClass != OpClass::Constant && op.kind() != OpKind::Return; }

/// Kernels that read each input element only at the index they write: a
/// single-result primitive elementwise op, or a fused group of kind
/// "elementwise". Such a kernel may write its result over an input of the
/// same element count and element size (an input that is not broadcast).
/// That holds for fused groups only while `fuse` puts nothing but
/// elementwise ops in them (docs/codegen.md §1); once transposes or slices
/// of inputs join, this must check the input's index map in the region.
/// The fused op is recognized by name, so this file does not depend on when
/// the op table gains it.
bool mayRunInPlace(const Op& op) {
  if (op.numResults() != 1) return false;
  if (op.info().isElementwise()) return true;
  if (op.name() != "fused") return false;
  const Attribute* kind = op.attr("kind");
  return kind && kind->kind() == AttrKind::String && kind->getString() == "elementwise";
}

/// A set of values sharing one place in the arena: a value and those
/// written in place over it, one after another.
struct Group {
  int64_t size = 0;
  int first = 0;
  int last = 0;
  int64_t offset = 0;
};

/// The lowest offset, a multiple of the alignment, where `g` overlaps no
/// placed group whose live range intersects its own.
int64_t lowestFreeOffset(const Group& g, const std::vector<const Group*>& placed) {
  std::vector<const Group*> conflicts;
  for (const Group* p : placed)
    if (p->first <= g.last && g.first <= p->last) conflicts.push_back(p);
  std::sort(conflicts.begin(), conflicts.end(), [](const Group* a, const Group* b) { return a->offset < b->offset; });
  int64_t candidate = 0;
  for (const Group* p : conflicts) {
    if (candidate + g.size <= p->offset) break;  // fits in the gap below p
    candidate = std::max(candidate, alignUp(p->offset + p->size, MemoryPlan::kAlignment));
  }
  return candidate;
}

}  // namespace

Expected<MemoryPlan> planMemory(const Function& f) {
  MemoryPlan plan;
  plan.function = f.name();

  // Values returned are the caller's output buffers, even when later
  // kernels also read them.
  std::unordered_set<const Value*> returned;
  if (const Op* ret = f.returnOp())
    for (const Value* v : ret->operands()) returned.insert(v);

  // Live ranges: a buffer is born at the kernel that defines it and dies at
  // the last kernel that reads it; one nobody reads still takes memory while
  // its kernel writes it. Arguments and constants are never buffers.
  std::unordered_map<const Value*, int> bufferOf;
  std::vector<const Op*> kernels;
  for (const auto& op : f.ops()) {
    if (!isKernel(*op)) continue;
    int k = static_cast<int>(kernels.size());
    kernels.push_back(op.get());
    for (const Value* v : op->operands()) {
      auto it = bufferOf.find(v);
      if (it != bufferOf.end()) plan.buffers[it->second].last = k;
    }
    for (const Value* v : op->results()) {
      if (returned.count(v)) continue;
      MemoryPlan::Buffer b;
      b.value = v;
      b.name = v->name().empty() ? std::string(op->name()) + "#" + std::to_string(v->index()) : v->name();
      // The JIT specializes symbolic dims to the bound inputs before it
      // plans, so a size expression is never needed at run time.
      if (!v->type().isStatic())
        return op->emitError("cannot plan memory for %" + b.name + " of type " + v->type().str() +
                             ": the memory plan needs static shapes (specialize the inputs' shapes first)");
      std::optional<int64_t> size = byteSize(v->type());
      if (!size)
        return op->emitError("cannot plan memory for %" + b.name + " of type " + v->type().str() +
                             ": larger than the arena's limit of 2^40 bytes");
      b.size = *size;
      b.first = b.last = k;
      bufferOf[v] = static_cast<int>(plan.buffers.size());
      plan.buffers.push_back(std::move(b));
    }
  }
  plan.numKernels = static_cast<int>(kernels.size());

  // In place: an elementwise kernel writes its result over an input that
  // dies there, when the two have the same element count and size. The
  // result joins the input's group, so a chain of such kernels shares one
  // buffer; the group lives from its first value's birth to its last
  // value's death.
  std::vector<int> groupOf(plan.buffers.size());
  std::vector<Group> groups;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    MemoryPlan::Buffer& b = plan.buffers[i];
    const Op* def = b.value->definingOp();
    if (mayRunInPlace(*def)) {
      const TensorType& out = b.value->type();
      for (const Value* in : def->operands()) {
        auto it = bufferOf.find(in);
        if (it == bufferOf.end()) continue;
        const MemoryPlan::Buffer& input = plan.buffers[it->second];
        if (input.last != b.first || numElements(in->type().shape) != numElements(out.shape) ||
            dtypeSize(in->type().dtype) != dtypeSize(out.dtype))
          continue;
        b.inPlaceOf = it->second;
        break;
      }
    }
    if (b.inPlaceOf >= 0) {
      groupOf[i] = groupOf[b.inPlaceOf];
      groups[groupOf[i]].last = b.last;
    } else {
      groupOf[i] = static_cast<int>(groups.size());
      groups.push_back({b.size, b.first, b.last, 0});
    }
  }

  // Largest first, each at the lowest offset free for its whole lifetime
  // (XLA's global decreasing-size heap simulator). Ties go to the earlier
  // group, so the plan is deterministic.
  std::vector<int> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return groups[a].size > groups[b].size; });
  std::vector<const Group*> placed;
  for (int g : order) {
    groups[g].offset = lowestFreeOffset(groups[g], placed);
    placed.push_back(&groups[g]);
    plan.peak = std::max(plan.peak, alignUp(groups[g].offset + groups[g].size, MemoryPlan::kAlignment));
  }

  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    plan.buffers[i].offset = groups[groupOf[i]].offset;
    plan.noReuseTotal += alignUp(plan.buffers[i].size, MemoryPlan::kAlignment);
  }
  return plan;
}

/// Checks that every function has a memory plan: each intermediate value
/// has a static shape. Changes nothing; the plan itself is printed by
/// `kiln-opt --print-memory-plan` and computed again by the runtime (at most
/// quadratic in the number of buffers, which is cheap next to codegen).
///
///   %a = exp(%x) : f32[N]
/// fails with
///   error: 'exp' cannot plan memory for %a of type f32[N]: the memory plan
///   needs static shapes (specialize the inputs' shapes first)
class PlanMemoryPass : public Pass {
 public:
  std::string_view name() const override { return "plan-memory"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    for (const auto& f : m.functions()) {
      Expected<MemoryPlan> plan = planMemory(*f);
      if (!plan) return plan.takeError();
    }
    return false;
  }
};

std::unique_ptr<Pass> createPlanMemoryPass() { return std::make_unique<PlanMemoryPass>(); }

}  // namespace kiln
