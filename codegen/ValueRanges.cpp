// Interval bounds of kernel IR integer expressions (ValueRanges.h). Each
// expression's bound comes from its operands' (memoized by node, as
// expressions are shared trees) by interval arithmetic in 128 bits, where
// no operation on two 64-bit bounds overflows.
#include "codegen/ValueRanges.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_set>

namespace kiln::kir {
namespace {

using Wide = __int128;

/// The values of dtype `t` (floats: int64's, never consulted).
std::pair<Wide, Wide> dtypeBounds(DType t) {
  switch (t) {
    case DType::I32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    case DType::I16: return {std::numeric_limits<int16_t>::min(), std::numeric_limits<int16_t>::max()};
    case DType::I8: return {std::numeric_limits<int8_t>::min(), std::numeric_limits<int8_t>::max()};
    case DType::U8: return {0, 255};
    case DType::U16: return {0, std::numeric_limits<uint16_t>::max()};
    case DType::U32: return {0, std::numeric_limits<uint32_t>::max()};
    case DType::U64: return {0, std::numeric_limits<uint64_t>::max()};
    case DType::Bool: return {0, 1};
    default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

Wide magnitude(Wide v) { return v < 0 ? -v : v; }

/// Records the extents of the reduction variables in `e`, visiting each
/// shared node once.
void collectReductions(const Expr& e, std::unordered_map<int, int64_t>& extents,
                       std::unordered_set<const Expr*>& seen) {
  if (!seen.insert(&e).second) return;
  if (e.kind == ExprKind::Reduce)
    for (size_t k = 0; k < e.extents.size(); ++k) extents[e.id + static_cast<int>(k)] = e.extents[k];
  for (const ExprPtr& arg : e.args) collectReductions(*arg, extents, seen);
}

void collectLoops(const Stmt& s, std::unordered_map<int, int64_t>& extents, std::unordered_set<const Expr*>& seen) {
  if (s.kind == Stmt::Kind::Store) {
    collectReductions(*s.index, extents, seen);
    collectReductions(*s.value, extents, seen);
    return;
  }
  extents[s.var] = s.extent;
  for (const StmtPtr& inner : s.body) collectLoops(*inner, extents, seen);
}

}  // namespace

ValueRanges::ValueRanges(const Kernel& kernel) {
  std::unordered_set<const Expr*> seen;
  for (const StmtPtr& s : kernel.body) collectLoops(*s, extents_, seen);
}

bool ValueRanges::cannotOverflow(const Expr& e) {
  const Range r = exact(e);
  const auto [lo, hi] = dtypeBounds(e.type);
  return r.lo >= lo && r.hi <= hi;
}

bool ValueRanges::atLeast(const Expr& e, int64_t bound) { return range(e).lo >= bound; }

bool ValueRanges::plainOperatorSuffices(const Expr& e) {
  if (e.kind != ExprKind::Binary || isFloat(e.args[0]->type)) return false;
  switch (e.binary) {
    case BinaryFn::Add:
    case BinaryFn::Sub:
    case BinaryFn::Mul: return cannotOverflow(e);
    case BinaryFn::Div:
    case BinaryFn::Rem: return atLeast(*e.args[1], 1);
    case BinaryFn::Mod: return atLeast(*e.args[1], 1) && atLeast(*e.args[0], 0);
    default: return false;
  }
}

ValueRanges::Range ValueRanges::range(const Expr& e) {
  if (auto it = ranges_.find(&e); it != ranges_.end()) return it->second;
  Range r = exact(e);
  const auto [lo, hi] = dtypeBounds(e.type);
  // A result outside the dtype wrapped: it may be anything in between.
  if (r.lo < lo || r.hi > hi) r = {lo, hi};
  ranges_[&e] = r;
  return r;
}

ValueRanges::Range ValueRanges::exact(const Expr& e) {
  const auto [typeLo, typeHi] = dtypeBounds(e.type);
  const Range full{typeLo, typeHi};
  if (isFloat(e.type)) return full;
  switch (e.kind) {
    case ExprKind::Const: {
      // A u64 constant's bits are its value.
      const Wide v = e.type == DType::U64 ? Wide(static_cast<uint64_t>(e.intValue)) : Wide(e.intValue);
      return {v, v};
    }
    case ExprKind::Var: {
      auto it = extents_.find(e.id);
      if (it == extents_.end()) return full;
      return {0, std::max<Wide>(it->second - 1, 0)};
    }
    case ExprKind::Load: return full;
    case ExprKind::Unary: {
      if (isFloat(e.args[0]->type)) return full;
      const Range x = range(*e.args[0]);
      switch (e.unary) {
        case UnaryFn::Neg: return {-x.hi, -x.lo};
        case UnaryFn::Abs:
          if (x.lo >= 0) return x;
          if (x.hi <= 0) return {-x.hi, -x.lo};
          return {0, std::max(-x.lo, x.hi)};
        case UnaryFn::Sign: return {x.lo > 0 ? 1 : (x.lo < 0 ? -1 : 0), x.hi > 0 ? 1 : (x.hi < 0 ? -1 : 0)};
        case UnaryFn::Relu: return {std::max<Wide>(x.lo, 0), std::max<Wide>(x.hi, 0)};
        default: return full;
      }
    }
    case ExprKind::Binary: {
      if (isFloat(e.args[0]->type)) return full;
      const Range a = range(*e.args[0]), b = range(*e.args[1]);
      switch (e.binary) {
        case BinaryFn::Add: return {a.lo + b.lo, a.hi + b.hi};
        case BinaryFn::Sub: return {a.lo - b.hi, a.hi - b.lo};
        case BinaryFn::Mul: {
          const Wide p[] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
          return {*std::min_element(p, p + 4), *std::max_element(p, p + 4)};
        }
        case BinaryFn::Div: {
          // A positive divisor: truncation is monotonic in both operands,
          // so the corners bound it. Otherwise |x / y| <= |x| (a zero
          // divisor gives 0, INT_MIN / -1 wraps to INT_MIN).
          if (b.lo >= 1) return {std::min(a.lo / b.lo, a.lo / b.hi), std::max(a.hi / b.lo, a.hi / b.hi)};
          const Wide m = std::max(magnitude(a.lo), magnitude(a.hi));
          return {-m, m};
        }
        case BinaryFn::Rem: {
          // The dividend's sign, smaller than both |x| and |y|.
          const Wide m = std::min(std::max(magnitude(a.lo), magnitude(a.hi)),
                                  std::max<Wide>(std::max(magnitude(b.lo), magnitude(b.hi)) - 1, 0));
          return {a.lo < 0 ? -m : 0, a.hi > 0 ? m : 0};
        }
        case BinaryFn::Mod: {
          // The divisor's sign, smaller than |y|.
          const Wide m = std::max<Wide>(std::max(magnitude(b.lo), magnitude(b.hi)) - 1, 0);
          return {b.lo < 0 ? -m : 0, b.hi > 0 ? m : 0};
        }
        case BinaryFn::Max: return {std::max(a.lo, b.lo), std::max(a.hi, b.hi)};
        case BinaryFn::Min: return {std::min(a.lo, b.lo), std::min(a.hi, b.hi)};
        default: return full;  // pow, bitwise, comparisons (bool)
      }
    }
    case ExprKind::Select: {
      const Range a = range(*e.args[1]), b = range(*e.args[2]);
      return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
    }
    case ExprKind::Cast:
      // An integer keeps its value where it fits (range() widens to the
      // whole dtype where it does not); a float may be anything.
      return isFloat(e.args[0]->type) ? full : range(*e.args[0]);
    case ExprKind::Reduce:
      switch (e.reduce) {
        case ReduceKind::Max:
        case ReduceKind::Min:
          // Over no elements a reduction is its identity, the dtype's end.
          for (int64_t extent : e.extents)
            if (extent <= 0) return full;
          return range(*e.args[0]);
        case ReduceKind::ArgMax:
        case ReduceKind::ArgMin: return {0, std::max<Wide>(e.extents.empty() ? 0 : e.extents[0] - 1, 0)};
        default: return full;
      }
  }
  return full;
}

}  // namespace kiln::kir
