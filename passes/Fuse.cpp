// The `fuse` pass (docs/codegen.md section 1): groups primitive ops into
// kernels and replaces each group of two or more ops by one `fused` op whose
// region holds them. Groups grow from producers to consumers in program
// order; two groups merge when their iteration spaces agree (the table
// below) and merging creates no cycle through an op outside them. Values a
// group defines and something outside it uses become the fused op's
// results, so they are still materialized.
#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "passes/Pass.h"

namespace kiln {

namespace {

/// The kernel shape of a group; each has one iteration space.
enum class GroupKind {
  None,         // an op that never fuses (data movement, gathers, pooling, random, constants)
  Elementwise,  // elementwise ops and broadcasts over `space`
  Reduction,    // reductions from `space` to `reduced` with their elementwise producers and consumers
  Epilogue,     // a matmul or conv (the anchor) and elementwise consumers over its result shape
};

struct Group {
  GroupKind kind = GroupKind::None;
  Shape space;                 // the iteration space: result shape, reduce input shape or anchor result shape
  Shape reduced;               // Reduction: the reduce result shape (keepdims or not)
  std::vector<int64_t> axes;   // Reduction: the reduced axes, normalized and sorted
  int reductions = 0;          // Reduction: how many reduce ops (softmax's max and sum: 2)
  const Op* anchor = nullptr;  // Epilogue: the matmul or conv
  std::vector<int> members;    // op indices, unsorted
  int last = 0;                // the highest member index
};

/// At most this many reductions share a kernel: a second reduction over the
/// same axes (softmax's max then sum, layer norm's mean then variance) runs
/// in the same row loop; a third would rarely pay for its register pressure.
constexpr int kMaxReductionsPerGroup = 2;

/// A reduction whose result is read back over its input space (softmax's
/// `x - max`, a second reduction of `exp(x - max)`) is recomputed for each
/// element that reads it, since a fused group lowers by composition
/// (docs/codegen.md section 2): a row of extent E costs E^2, and E^3 where
/// a second reduction reads the first. Up to this extent that beats
/// materializing the reduced values between kernels; above it the
/// reduction ends its group and the readers that broadcast it come in the
/// next kernel, unless the group reduces rows (reducesRows), whose
/// reductions the emitters compute once per row.
constexpr int64_t kMaxRecomputedExtent = 16;

/// The number of elements one reduced value of a Reduction group combines;
/// symbolic dims count as large.
int64_t reducedExtent(const Group& g) {
  int64_t extent = 1;
  for (int64_t a : g.axes) {
    const Dim& d = g.space[a];
    if (!d.isStatic()) return std::numeric_limits<int64_t>::max();
    extent *= d.size;
  }
  return extent;
}

/// Whether each reduced value of a Reduction group is one row's: the group
/// reduces its static last axis alone (a softmax, a layer norm or an RMS
/// norm over the features). Its kernel loops over the rows with the last
/// axis innermost, and both emitters compute a row's reductions once before
/// its elements (the CPU before its vector loop, CUDA by the row's warp or
/// block together: rowInvariantReductions, codegen/Schedule.h), so readers
/// that broadcast them back over the row, and a second reduction reading
/// the first, recompute nothing: such a group takes them at any extent.
bool reducesRows(const Group& g) {
  return g.axes.size() == 1 && g.axes[0] + 1 == static_cast<int64_t>(g.space.size()) && g.space.back().isStatic();
}

/// Whether a group may recompute its reduced values where they are read
/// back over its input space.
bool recomputesCheaply(const Group& g) { return reducesRows(g) || reducedExtent(g) <= kMaxRecomputedExtent; }

/// True when every dim is known, so that two spaces can be compared.
bool isComparable(const Shape& s) {
  return std::none_of(s.begin(), s.end(), [](const Dim& d) { return d.isUnknown(); });
}

bool isReduce(OpKind k) {
  return k == OpKind::ReduceSum || k == OpKind::ReduceMean || k == OpKind::ReduceMax || k == OpKind::ReduceMin ||
         k == OpKind::ReduceProd;
}

/// An integer div, rem, mod or pow: ops whose second operand the CPU
/// executor checks on the host (division by zero, negative exponent).
bool isHostCheckedArithmetic(const Op& op) {
  const OpKind k = op.kind();
  if (k != OpKind::Div && k != OpKind::Rem && k != OpKind::Mod && k != OpKind::Pow) return false;
  return !isFloat(op.operand(1)->type().dtype);
}

/// The group an op starts in, alone.
Group initialGroup(const Op& op, int index) {
  Group g;
  g.members = {index};
  g.last = index;
  if (op.numResults() != 1 || op.region()) return g;
  const Shape& out = op.result()->type().shape;
  if (!isComparable(out)) return g;
  // An integer division, remainder or power fails on a zero divisor or a
  // negative exponent. The executor checks that operand on the host before
  // the kernel runs, which needs it in a buffer; inside a group it would be
  // computed in registers and the kernel would give 0 instead of the error.
  // So these ops stay kernels of their own, and their operands are always
  // materialized (a group result when computed by a group).
  if (isHostCheckedArithmetic(op)) return g;
  // A reshape reads its input at the flat index it writes, so it is an
  // elementwise op over its result shape: it heads a group that reads a
  // tensor in another shape. So is a slice, reading its input at a shifted
  // (or strided) index: it heads the group of its readers, which then read
  // the sliced tensor where it is instead of a copy (an LSTM step's four
  // gates out of one [batch, 4H] product). So is a transpose, reading its
  // input at a permuted index: attention's heads, sliced out of one QKV
  // product, reshaped and transposed, are one kernel instead of two copies.
  // The memory plan writes a kernel in place only over inputs it reads at
  // the written index, which a slice's or a transpose's input is not
  // (docs/codegen.md section 4). So is a pad, reading its input at a
  // shifted index where it is inside (a pooling gradient's windows shifted
  // over the output grid).
  if (op.info().isElementwise() || op.kind() == OpKind::Broadcast || op.kind() == OpKind::Reshape ||
      op.kind() == OpKind::Slice || op.kind() == OpKind::Transpose || op.kind() == OpKind::Pad) {
    g.kind = GroupKind::Elementwise;
    g.space = out;
  } else if (isReduce(op.kind())) {
    const Shape& in = op.operand(0)->type().shape;
    if (!isComparable(in)) return g;
    g.kind = GroupKind::Reduction;
    g.space = in;
    g.reduced = out;
    int64_t rank = static_cast<int64_t>(in.size());
    for (int64_t a : op.getInts("axes")) g.axes.push_back(a < 0 ? a + rank : a);
    std::sort(g.axes.begin(), g.axes.end());
    g.reductions = 1;
  } else if (op.kind() == OpKind::MatMul || op.kind() == OpKind::Conv) {
    g.kind = GroupKind::Epilogue;
    g.space = out;
    g.anchor = &op;
  }
  return g;
}

/// The merged group's description when a producer group and a consumer
/// group can share one iteration space, or None when they cannot.
/// `crossing` are the consumer's ops that read the producer's values.
Group mergedShape(const Group& producer, const Group& consumer, const std::vector<const Op*>& crossing) {
  Group none;
  using K = GroupKind;
  K p = producer.kind, c = consumer.kind;
  if (p == K::None || c == K::None) return none;
  if (p == K::Elementwise && c == K::Elementwise) return producer.space == consumer.space ? producer : none;
  if (p == K::Elementwise && c == K::Reduction)
    return producer.space == consumer.space || producer.space == consumer.reduced ? consumer : none;
  if (p == K::Reduction && c == K::Elementwise) {
    if (consumer.space == producer.reduced) return producer;
    return consumer.space == producer.space && recomputesCheaply(producer) ? producer : none;
  }
  if (p == K::Reduction && c == K::Reduction) {
    if (producer.space != consumer.space || producer.reduced != consumer.reduced || producer.axes != consumer.axes ||
        producer.reductions + consumer.reductions > kMaxReductionsPerGroup || !recomputesCheaply(producer))
      return none;
    Group g = producer;
    g.reductions += consumer.reductions;
    return g;
  }
  if (p == K::Epilogue && c == K::Elementwise) return consumer.space == producer.space ? producer : none;
  if (p == K::Elementwise && c == K::Epilogue) {
    // The anchor reads its inputs through the library or its own loops; only
    // the epilogue (after the anchor) can take elementwise ops.
    if (producer.space != consumer.space) return none;
    for (const Op* op : crossing)
      if (op == consumer.anchor) return none;
    return consumer;
  }
  return none;  // two anchors, or an anchor with a reduction
}

/// Forms the groups of one function and rewrites each into a `fused` op.
class FunctionFuser {
 public:
  explicit FunctionFuser(Function& f) : f_(f) {
    for (const auto& op : f.ops())
      if (op->kind() != OpKind::Return) body_.push_back(op.get());
    for (size_t i = 0; i < body_.size(); ++i) index_[body_[i]] = static_cast<int>(i);
    parent_.resize(body_.size());
    std::iota(parent_.begin(), parent_.end(), 0);
    for (size_t i = 0; i < body_.size(); ++i) groups_.push_back(initialGroup(*body_[i], static_cast<int>(i)));
  }

  bool run() {
    formGroups();
    bool changed = false;
    std::map<int, std::vector<int>> byRoot;  // ordered, so fused ops are created in program order
    for (size_t i = 0; i < body_.size(); ++i) byRoot[find(static_cast<int>(i))].push_back(static_cast<int>(i));
    for (auto& [root, members] : byRoot) {
      if (members.size() < 2) continue;  // an op that fused with nothing stays as it is
      rewriteGroup(groups_[root], members);
      changed = true;
    }
    if (changed) {
      sortTopologically();
      eraseUnusedConstants();
    }
    return changed;
  }

 private:
  int find(int i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }

  /// Program order: each op offers to join the groups of its producers.
  void formGroups() {
    for (size_t i = 0; i < body_.size(); ++i) {
      Op* consumer = body_[i];
      for (Value* v : consumer->operands()) {
        Op* def = v->definingOp();
        if (!def || !index_.count(def)) continue;
        int p = find(index_[def]), c = find(static_cast<int>(i));
        if (p != c) tryMerge(p, c);
      }
    }
  }

  void tryMerge(int p, int c) {
    std::vector<const Op*> crossing;
    for (int m : groups_[c].members)
      for (Value* v : body_[m]->operands())
        if (Op* def = v->definingOp(); def && index_.count(def) && find(index_[def]) == p) crossing.push_back(body_[m]);
    // A pad reads its input at shifted indices: a group that computes
    // (not only loads) stays a kernel of its own, whatever the shapes, so
    // that several pads of it (a pooling gradient's shifted windows) read
    // its buffer instead of each recomputing it; readThroughLayout says
    // when a group of loads may join.
    auto readsComputed = [&](const Op* op) {
      return std::any_of(op->operands().begin(), op->operands().end(),
                         [&](const Value* v) { return !loadedOnly(v, p); });
    };
    const bool padsComputed = std::any_of(crossing.begin(), crossing.end(), [&](const Op* op) {
      return op->kind() == OpKind::Pad && readsComputed(op);
    });
    // Likewise a reshape that a broadcast reads (a value repeated over
    // pooling windows) stays out of a group that computes: inside it, the
    // broadcast could not join (readThroughLayout), and the reshaped copy
    // would be a buffer and a kernel of its own; outside it, the reshape
    // and the broadcast are loads in their reader's kernel.
    const bool reshapeForBroadcast = groups_[c].members.size() == 1 && body_[c]->kind() == OpKind::Reshape &&
                                     readsComputed(body_[c]) &&
                                     std::any_of(body_[c]->result()->users().begin(),
                                                 body_[c]->result()->users().end(),
                                                 [](const Op* user) { return user->kind() == OpKind::Broadcast; });
    if (padsComputed || reshapeForBroadcast) return;
    Group merged = mergedShape(groups_[p], groups_[c], crossing);
    if (merged.kind == GroupKind::None && readThroughLayout(p, c, crossing)) merged = groups_[c];
    if (merged.kind == GroupKind::None || createsCycle(p, c)) return;
    merged.members = groups_[p].members;
    merged.members.insert(merged.members.end(), groups_[c].members.begin(), groups_[c].members.end());
    merged.last = std::max(groups_[p].last, groups_[c].last);
    parent_[c] = p;
    groups_[p] = std::move(merged);
    groups_[c] = Group{};
  }

  /// True when value `v` is computed in group `p` by loads alone (or
  /// outside it): a reader that joins `p` recomputes no arithmetic for it,
  /// whatever else `p` holds.
  bool loadedOnly(const Value* v, int p) {
    std::vector<const Value*> work = {v};
    std::unordered_set<const Value*> seen = {v};
    while (!work.empty()) {
      const Op* def = work.back()->definingOp();
      work.pop_back();
      if (!def) continue;
      auto it = index_.find(def);
      if (it == index_.end() || find(it->second) != p) continue;
      const OpKind k = def->kind();
      if (k != OpKind::Reshape && k != OpKind::Broadcast && k != OpKind::Slice && k != OpKind::Pad) return false;
      for (const Value* operand : def->operands())
        if (seen.insert(operand).second) work.push_back(operand);
    }
    return true;
  }

  /// True when elementwise group `c` reads elementwise group `p`, of
  /// another space, only through reshapes, broadcasts, transposes, slices
  /// and pads, which compose as index maps: `p` then runs inside `c` at
  /// `c`'s index, once per element of `c` when `p` has as many elements
  /// and is read through reshapes, transposes and broadcasts, or more often
  /// when a broadcast repeats it or several pads read it, which only values
  /// that `p` computes by loads alone (loadedOnly: reshapes, broadcasts,
  /// slices and pads, no arithmetic) may be. A pooling gradient's windows,
  /// pad -> reshape -> broadcast -> reshape -> slice of the output grid,
  /// then cost no buffers of their own.
  bool readThroughLayout(int p, int c, const std::vector<const Op*>& crossing) {
    const Group &producer = groups_[p], &consumer = groups_[c];
    if (producer.kind != GroupKind::Elementwise || consumer.kind != GroupKind::Elementwise) return false;
    // Whether every value read across is computed in `p` by loads alone:
    // then no arithmetic is recomputed, however often a reader repeats it.
    bool loads = true;
    for (const Op* op : crossing)
      for (const Value* v : op->operands()) loads = loads && loadedOnly(v, p);
    for (const Op* op : crossing) {
      // A slice or pad of values computed by arithmetic would recompute
      // them at each reader, several times where several pads read them.
      if (op->kind() == OpKind::Slice || op->kind() == OpKind::Pad) {
        if (!loads) return false;
        continue;
      }
      if (op->kind() != OpKind::Reshape && op->kind() != OpKind::Broadcast && op->kind() != OpKind::Transpose)
        return false;
    }
    // A transposed value read through a reshape costs a division and a
    // remainder per dim for each element: a CNN's flatten, [64,32,7,7]
    // transposed from channels last and reshaped to [64,1568], took 0.084 ms
    // as one kernel against 0.030 ms as a transpose and a view.
    const bool producerTransposes = std::any_of(producer.members.begin(), producer.members.end(),
                                                [&](int m) { return body_[m]->kind() == OpKind::Transpose; });
    const bool readThroughReshape =
        std::any_of(crossing.begin(), crossing.end(), [](const Op* op) { return op->kind() == OpKind::Reshape; });
    if (producerTransposes && readThroughReshape) return false;
    auto elements = [](const Shape& s) {
      int64_t n = 1;
      for (const Dim& d : s) {
        if (!d.isStatic()) return int64_t{-1};
        n *= d.size;
      }
      return n;
    };
    const int64_t produced = elements(producer.space);
    if (produced < 0 || produced == elements(consumer.space)) return produced >= 0;
    return loads;
  }

  /// True when some path leaves groups `a` or `b` and comes back into
  /// them through an op outside both, or through any member of another
  /// group that such a path reaches: the merged group would then have to
  /// run both before and after that op or group. Paths run forward in program order,
  /// so the search stops at the last member.
  bool createsCycle(int a, int b) {
    auto inside = [&](const Op* op) {
      auto it = index_.find(op);
      if (it == index_.end()) return false;
      int r = find(it->second);
      return r == a || r == b;
    };
    int last = std::max(groups_[a].last, groups_[b].last);
    std::vector<const Op*> work;
    std::unordered_set<const Op*> seen;
    auto pushUsersOutside = [&](const Op* op, bool& reentered) {
      for (Value* r : op->results())
        for (const Op* user : r->users()) {
          auto it = index_.find(user);
          if (it == index_.end() || it->second > last) continue;  // `return`, or past every member
          if (inside(user)) {
            if (!inside(op)) reentered = true;
            continue;
          }
          if (!seen.insert(user).second) continue;
          work.push_back(user);
          // Another group runs as one kernel: once a path reaches one of its
          // members, the results of all of them come after it. (Checking
          // single ops only lets two groups that are each free of outside
          // paths need each other's results.)
          for (int m : groups_[find(it->second)].members)
            if (seen.insert(body_[m]).second) work.push_back(body_[m]);
        }
    };
    bool reentered = false;
    for (int g : {a, b})
      for (int m : groups_[g].members) pushUsersOutside(body_[m], reentered);
    while (!work.empty() && !reentered) {
      const Op* op = work.back();
      work.pop_back();
      pushUsersOutside(op, reentered);
    }
    return reentered;
  }

  static std::string kindName(const Group& g) {
    switch (g.kind) {
      case GroupKind::Elementwise:
        return "elementwise";
      case GroupKind::Reduction:
        return "reduction";
      case GroupKind::Epilogue:
        return g.anchor->kind() == OpKind::Conv ? "conv_epilogue" : "matmul_epilogue";
      case GroupKind::None:
        break;
    }
    return "library";
  }

  /// A constant small enough to copy into each region that reads it (a
  /// scalar such as an epsilon), instead of passing it in as a buffer.
  static bool isInlinedConstant(const Value* v) {
    const Op* def = v->definingOp();
    return def && def->kind() == OpKind::Constant && v->type().isStatic() && numElements(v->type().shape) == 1;
  }

  /// Replaces the ops `members` (program order) by one fused op, placed
  /// where the last of them was.
  void rewriteGroup(const Group& g, std::vector<int> members) {
    std::sort(members.begin(), members.end());
    std::unordered_set<const Op*> inGroup;
    for (int m : members) inGroup.insert(body_[m]);

    // Inputs: values from outside, in order of first use; results: values
    // read outside (or returned), in order of definition.
    std::vector<Value*> inputs, outputs;
    std::unordered_map<const Value*, size_t> inputIndex;
    std::unordered_map<const Value*, Op*> constantCopy;
    auto region = std::make_unique<Function>("");
    for (int m : members) {
      for (Value* v : body_[m]->operands()) {
        Op* def = v->definingOp();
        if ((def && inGroup.count(def)) || inputIndex.count(v) || constantCopy.count(v)) continue;
        if (isInlinedConstant(v)) {
          constantCopy[v] = nullptr;
          continue;
        }
        inputIndex[v] = inputs.size();
        inputs.push_back(v);
        region->addArgument(v->type(), v->name());
      }
      for (Value* r : body_[m]->results())
        for (const Op* user : r->users())
          if (!inGroup.count(user)) {
            outputs.push_back(r);
            break;
          }
    }

    Op* lastOp = body_[members.back()];
    std::vector<TensorType> types;
    for (Value* r : outputs) types.push_back(r->type());
    AttrMap attrs{{"kind", Attribute(kindName(g))}};
    Op* fused = f_.insert(lastOp, Op::create(OpKind::Fused, inputs, types, std::move(attrs), lastOp->loc()));
    for (size_t i = 0; i < outputs.size(); ++i) {
      Value* inner = outputs[i];
      Value* outer = fused->result(i);
      outer->setName(inner->name());
      // Only uses outside the group move to the fused op's result.
      std::vector<Op*> users = inner->users();
      for (Op* user : users) {
        if (inGroup.count(user)) continue;
        for (size_t k = 0; k < user->numOperands(); ++k)
          if (user->operand(k) == inner) user->setOperand(k, outer);
      }
    }

    // Scalar constants first, so that every member finds its copy defined.
    for (auto& [v, copy] : constantCopy) {
      const Op* def = v->definingOp();
      copy = region->insert(nullptr, Op::create(OpKind::Constant, {}, {v->type()}, def->attrs(), def->loc()));
      copy->result()->setName(v->name());
    }
    for (int m : members) {
      Op* op = body_[m];
      std::unique_ptr<Op> owned = f_.take(op);
      for (size_t k = 0; k < op->numOperands(); ++k) {
        Value* v = op->operand(k);
        if (auto it = inputIndex.find(v); it != inputIndex.end())
          op->setOperand(k, region->argument(it->second));
        else if (auto c = constantCopy.find(v); c != constantCopy.end())
          op->setOperand(k, c->second->result());
      }
      region->insert(nullptr, std::move(owned));
    }
    region->insert(nullptr, Op::create(OpKind::Return, outputs, {}, {}, lastOp->loc()));
    region->setResultTypes(types);
    region->setLoc(fused->loc());
    fused->setRegion(std::move(region));
  }

  /// Restores a topological order, as close to the original as possible: a
  /// fused op sits where its last member was, but an outside op between its
  /// members that reads one of its results must now come after it. Kahn's
  /// algorithm, always taking the earliest ready op.
  void sortTopologically() {
    std::vector<Op*> order;
    for (const auto& op : f_.ops())
      if (op->kind() != OpKind::Return) order.push_back(op.get());
    std::unordered_map<const Op*, size_t> position;
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
    std::vector<int> pending(order.size(), 0);
    for (size_t i = 0; i < order.size(); ++i)
      for (Value* v : order[i]->operands())
        if (Op* def = v->definingOp(); def && position.count(def)) ++pending[i];
    std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
    for (size_t i = 0; i < order.size(); ++i)
      if (pending[i] == 0) ready.push(i);
    std::vector<Op*> sorted;
    while (!ready.empty()) {
      size_t i = ready.top();
      ready.pop();
      sorted.push_back(order[i]);
      for (Value* r : order[i]->results())
        for (const Op* user : r->users())
          if (auto it = position.find(user); it != position.end() && --pending[it->second] == 0) ready.push(it->second);
    }
    // The groups were formed without cycles, so every op is placed; the
    // `return` stays last.
    for (Op* op : sorted) f_.moveBefore(op, f_.returnOp());
  }

  /// Constants whose every reader now has its own copy in a region.
  void eraseUnusedConstants() {
    std::vector<Op*> dead;
    for (const auto& op : f_.ops())
      if (op->kind() == OpKind::Constant && !op->hasUses()) dead.push_back(op.get());
    for (Op* op : dead) f_.erase(op);
  }

  Function& f_;
  std::vector<Op*> body_;
  std::unordered_map<const Op*, int> index_;
  std::vector<int> parent_;
  std::vector<Group> groups_;
};

}  // namespace

/// Groups primitives into kernels (docs/codegen.md section 1) and replaces
/// each group of two or more ops by a `fused` op whose region holds them:
///
///  - elementwise: elementwise ops, casts, selects, broadcasts, reshapes and
///    slices over one result shape;
///  - reduction: up to two reduces with the same input shape and axes, and
///    elementwise ops over that input shape or the reduced shape;
///  - matmul_epilogue / conv_epilogue: a matmul or conv, then elementwise
///    ops over its result shape.
///
/// Walking in program order, each op joins the group of an operand's
/// producer when the two groups' spaces agree (as above) and no path leaves
/// the group and re-enters it through an outside op. A value used outside
/// its group becomes a result of the fused op; scalar constants are copied
/// into the regions that read them (and erased when nothing else does). An
/// op that joins nothing stays unwrapped, and so does everything else
/// (transposes, concats, pads, gathers, pooling, random, composites).
/// Ops are reordered only where a fused op must move before an outside op
/// that reads its results.
///
///   %mm = matmul(%x, %w) : f32[8,128]
///   %s = add(%mm, %b) : f32[8,128]
///   %r = relu(%s) : f32[8,128]
/// becomes
///   %r = fused(%x, %w, %b) {kind = "matmul_epilogue"} : f32[8,128] {
///   ^(%x: f32[8,784], %w: f32[784,128], %b: f32[128]):
///     %mm = matmul(%x, %w) : f32[8,128]
///     ...
///     return %r
///   }
class FusePass : public Pass {
 public:
  std::string_view name() const override { return "fuse"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    // A fused op joins no group, so running the pass again fuses only what
    // is left (regions never nest).
    for (const auto& f : m.functions()) changed |= FunctionFuser(*f).run();
    return changed;
  }
};

std::unique_ptr<Pass> createFusePass() { return std::make_unique<FusePass>(); }

}  // namespace kiln
