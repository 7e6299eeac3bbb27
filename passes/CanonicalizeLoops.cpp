// The `canonicalize-loops` pass: a loop that a counter stops, as PyTorch
// exports `while i < n` (an ONNX Loop without a trip count, whose body
// returns `lt(i, n)`), becomes a counted loop: its trip bound the constant
// count and its body's condition true. Its results do not change. The VJP of
// `loop` needs a static trip count and a body that never stops early, so
// autodiff counts each loop it differentiates the same way (countLoop); the
// pass does it for a whole module, so that the counted form can be seen and
// tested on its own.
#include "passes/CanonicalizeLoops.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "ir/Builder.h"
#include "ir/ConstantValue.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

/// `v`, a value of a loop body, as a_k + k*d at iteration k (k = 0, 1, ...)
/// with integer a_k and d: the iteration number (0 + k*1), an i64 carried
/// argument that the body returns plus a constant step (init + k*step),
/// either of those plus a constant, or none of these.
std::optional<std::pair<int64_t, int64_t>> affineInIteration(const Op& loop, const Value* v) {
  const Function& body = *loop.region(0);
  const size_t K = static_cast<size_t>(loop.getInt("num_carried"));
  const Op* ret = body.returnOp();
  if (!isInteger(v->type().dtype) || !v->type().shape.empty()) return std::nullopt;
  if (v == body.argument(0)) return std::pair<int64_t, int64_t>{0, 1};
  for (size_t k = 0; k < K; ++k) {
    if (v != body.argument(2 + k)) continue;
    const std::optional<int64_t> init = constantIntegerScalar(loop.operand(2 + k));
    const Op* next = ret->operand(1 + k)->definingOp();
    if (!init || !next || next->kind() != OpKind::Add) return std::nullopt;
    for (size_t i = 0; i < 2; ++i) {
      const std::optional<int64_t> step = constantIntegerScalar(next->operand(1 - i));
      if (next->operand(i) == v && step) return std::pair{*init, *step};
    }
    return std::nullopt;
  }
  const Op* def = v->definingOp();
  if (!def || def->kind() != OpKind::Add) return std::nullopt;
  for (size_t i = 0; i < 2; ++i) {
    const std::optional<int64_t> offset = constantIntegerScalar(def->operand(1 - i));
    int64_t first = 0;
    if (!offset) continue;
    if (auto x = affineInIteration(loop, def->operand(i)); x && !__builtin_add_overflow(x->first, *offset, &first))
      return std::pair{first, x->second};
  }
  return std::nullopt;
}

/// Makes `loop` (of `trips` iterations, counterTripCount) a counted loop in
/// place: its trip bound the constant `trips` and the condition its body
/// returns true. Its results do not change: the condition was true in every
/// iteration but the last, after which the bound stops it too.
void makeCounted(Op& loop, int64_t trips) {
  Builder outer(*loop.parent());
  outer.setInsertionPoint(&loop);
  loop.setOperand(0, outer.scalar(DType::I64, static_cast<double>(trips)));
  Function& body = *loop.region(0);
  Op* ret = body.returnOp();
  Builder inner(body);
  inner.setInsertionPoint(ret);
  ret->setOperand(0, inner.scalar(DType::Bool, 1.0));
}

/// Counts the loops of `f` and of the regions of its ops, inner ones first.
bool countLoops(Function& f) {
  bool changed = false;
  for (const auto& op : f.ops()) {
    for (size_t r = 0; r < op->numRegions(); ++r) changed |= countLoops(*op->region(r));
    if (op->kind() == OpKind::Loop) changed |= countLoop(*op);
  }
  return changed;
}

/// Makes every loop that a counter stops a counted loop (countLoop).
///
///   %r = loop(%max, %true, %i0) {num_carried = 1} {
///     ^(%t: i64[], %go: bool[], %i: i64[]):
///       %n = add(%i, %one) : i64[]
///       %c = lt(%n, %three) : bool[]
///       return %c, %n
///   }
/// with %i0 = 0 and %max the largest i64 becomes the same loop with the
/// trip bound 3 and the body returning `true` as its condition.
class CanonicalizeLoopsPass : public Pass {
 public:
  std::string_view name() const override { return "canonicalize-loops"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) changed |= countLoops(*f);
    return changed;
  }
};

}  // namespace

// v_k is affineInIteration's a + k*d.
std::optional<int64_t> counterTripCount(const Op& loop) {
  const std::optional<int64_t> bound = constantIntegerScalar(loop.operand(0));
  const std::optional<double> go = constantScalar(loop.operand(1));
  const Op* ret = loop.region(0)->returnOp();
  if (!bound || !go || *go == 0 || !ret) return std::nullopt;
  const Op* cmp = ret->operand(0)->definingOp();
  if (!cmp || (cmp->kind() != OpKind::Lt && cmp->kind() != OpKind::Le)) return std::nullopt;
  const std::optional<int64_t> limit = constantIntegerScalar(cmp->operand(1));
  const auto v = affineInIteration(loop, cmp->operand(0));
  if (!limit || !v || v->second <= 0) return std::nullopt;
  // v_k < b, with b one more for `le`: k < (b - a) / d, rounded up.
  if (cmp->kind() == OpKind::Le && *limit == std::numeric_limits<int64_t>::max()) return std::nullopt;
  const int64_t b = *limit + (cmp->kind() == OpKind::Le ? 1 : 0);
  const int64_t a = v->first, d = v->second;
  int64_t span = 0;
  if (a < b && __builtin_sub_overflow(b, a, &span)) return std::nullopt;
  const int64_t whileTrue = a < b ? (span - 1) / d + 1 : 0;
  return std::min<int64_t>(*bound, whileTrue + 1);
}

bool countLoop(Op& loop) {
  if (loop.kind() != OpKind::Loop) return false;
  const std::optional<int64_t> trips = counterTripCount(loop);
  if (!trips) return false;
  makeCounted(loop, *trips);
  return true;
}

std::unique_ptr<Pass> createCanonicalizeLoopsPass() { return std::make_unique<CanonicalizeLoopsPass>(); }

}  // namespace kiln
