// The `cse` pass: common subexpression elimination. Two ops that compute the
// same thing from the same values are merged into the first, so the value is
// computed (and stored) once. Equivalence is decided in expected O(1) per op
// with a hash set of the ops seen so far in the function.
#include <algorithm>
#include <functional>
#include <unordered_set>
#include <vector>

#include "passes/Pass.h"

namespace kiln {

namespace {

void hashCombine(size_t& seed, size_t h) { seed ^= h + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2); }

/// The operands in the order that identifies the computation: as written,
/// or sorted for commutative ops so that add(%a, %b) and add(%b, %a) match.
std::vector<const Value*> canonicalOperands(const Op& op) {
  std::vector<const Value*> operands(op.operands().begin(), op.operands().end());
  if (op.info().isCommutative()) std::sort(operands.begin(), operands.end(), std::less<const Value*>());
  return operands;
}

size_t hashType(const TensorType& type) {
  size_t h = std::hash<int>()(static_cast<int>(type.dtype));
  for (const Dim& d : type.shape) {
    hashCombine(h, std::hash<int64_t>()(d.size));
    hashCombine(h, std::hash<std::string>()(d.symbol));
  }
  return h;
}

size_t hashAttribute(const Attribute& a) {
  switch (a.kind()) {
    case AttrKind::Int: return std::hash<int64_t>()(a.getInt());
    case AttrKind::Float: return std::hash<double>()(a.getFloat());
    case AttrKind::Bool: return std::hash<bool>()(a.getBool());
    case AttrKind::String: return std::hash<std::string>()(a.getString());
    case AttrKind::Ints: {
      size_t h = 0;
      for (int64_t v : a.getInts()) hashCombine(h, std::hash<int64_t>()(v));
      return h;
    }
    case AttrKind::Floats: {
      size_t h = 0;
      for (double v : a.getFloats()) hashCombine(h, std::hash<double>()(v));
      return h;
    }
    case AttrKind::Tensor: {
      const DenseTensor& t = a.getTensor();
      size_t h = hashType(t.type);
      std::string_view bytes(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
      hashCombine(h, std::hash<std::string_view>()(bytes));
      return h;
    }
  }
  return 0;
}

/// Hash of everything OpsEquivalent compares, so equivalent ops collide.
struct OpHash {
  size_t operator()(const Op* op) const {
    size_t h = std::hash<int>()(static_cast<int>(op->kind()));
    for (const Value* v : canonicalOperands(*op)) hashCombine(h, std::hash<const Value*>()(v));
    for (const AttrSpec& spec : op->info().attrs)
      if (const Attribute* a = op->attr(spec.name)) hashCombine(h, hashAttribute(*a));
    for (size_t i = 0; i < op->numResults(); ++i) hashCombine(h, hashType(op->result(i)->type()));
    return h;
  }
};

/// Same kind, same operands (in any order for commutative ops), the same
/// value of every declared attribute (an absent optional attribute equals
/// its default written out) and the same result types. Locations and name
/// hints are not compared: they do not change what is computed.
struct OpsEquivalent {
  bool operator()(const Op* a, const Op* b) const {
    if (a->kind() != b->kind() || a->numOperands() != b->numOperands() || a->numResults() != b->numResults())
      return false;
    if (canonicalOperands(*a) != canonicalOperands(*b)) return false;
    for (const AttrSpec& spec : a->info().attrs) {
      const Attribute* x = a->attr(spec.name);
      const Attribute* y = b->attr(spec.name);
      if ((x == nullptr) != (y == nullptr) || (x && !(*x == *y))) return false;
    }
    for (size_t i = 0; i < a->numResults(); ++i)
      if (a->result(i)->type() != b->result(i)->type()) return false;
    return true;
  }
};

/// Ops that CSE may merge: those whose results depend only on their operands
/// and attributes. Random ops draw fresh samples each time, and `return` is
/// the function's end. Ops with a region are not merged either: what they
/// compute is in their region, which the hash and equivalence above do not
/// look at, so two fused ops (or two loops) with the same operands may
/// differ. Regions are scopes of their own: an `if` or `loop` body's ops
/// are merged among themselves, never with the ops outside.
bool isMergeable(const Op& op) {
  return op.kind() != OpKind::Return && !op.info().hasSideEffects() && !op.region();
}

/// Merges the equivalent ops of `f` into their first occurrence.
bool eliminateCommonSubexpressions(Function& f) {
  std::unordered_set<const Op*, OpHash, OpsEquivalent> seen;
  seen.reserve(f.ops().size());
  std::vector<Op*> duplicates;
  // The body is walked in order, and a duplicate's uses are redirected at
  // once, so later ops see the merged operands: a duplicated chain
  // (exp(%x) then neg of it, twice) collapses in one walk.
  for (const auto& op : f.ops()) {
    if (!isMergeable(*op)) continue;
    auto [it, inserted] = seen.insert(op.get());
    if (inserted) continue;
    const Op* first = *it;
    for (size_t i = 0; i < op->numResults(); ++i) op->result(i)->replaceAllUsesWith(first->result(i));
    duplicates.push_back(op.get());
  }
  // Erased after the walk so the list being iterated stays intact.
  for (Op* op : duplicates) f.erase(op);
  // A region is a scope of its own: its ops are merged among themselves.
  bool changed = !duplicates.empty();
  for (const auto& op : f.ops())
    for (size_t r = 0; r < op->numRegions(); ++r) changed |= eliminateCommonSubexpressions(*op->region(r));
  return changed;
}

}  // namespace

/// Merges ops that are sure to compute the same values: the same kind,
/// operands (order ignored for commutative ops, per OpInfo::isCommutative),
/// attributes and result types. The first op is kept (with its location);
/// uses of each later one are redirected to it and the later op is erased.
/// Ops with side effects (random sampling) are never merged: two draws are
/// two different tensors. Only ops of the same function are compared; the
/// ops inside each region are merged among themselves, and ops that own a
/// region are never merged.
///
///   %a = add(%x, %y) : f32[4]
///   %b = add(%y, %x) : f32[4]
///   %c = mul(%a, %b) : f32[4]
/// becomes
///   %a = add(%x, %y) : f32[4]
///   %c = mul(%a, %a) : f32[4]
class CSEPass : public Pass {
 public:
  std::string_view name() const override { return "cse"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) changed |= eliminateCommonSubexpressions(*f);
    return changed;
  }
};

std::unique_ptr<Pass> createCSEPass() { return std::make_unique<CSEPass>(); }

}  // namespace kiln
