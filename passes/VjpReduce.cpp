// VJP rules of the Reduce family: the reductions over axes.
// The Grad builder and the entry types are in passes/VjpSupport.h; the
// table at the end declares how each op of this family is differentiated.
#include "passes/VjpSupport.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <set>

namespace kiln::vjp {
namespace {

// --- Reductions -------------------------------------------------------------------------

/// The reduced axes of `op` (normalized; empty means all) and dy reshaped to
/// keep them as 1s, ready to broadcast against the operand.
std::pair<std::vector<int64_t>, Value*> keptGrad(Grad& g, const Op& op, Value* dy) {
  int64_t rank = x0(op)->type().rank();
  std::vector<int64_t> axes;
  for (int64_t a : op.getInts("axes")) axes.push_back(*normalizeAxis(a, rank));
  if (axes.empty())
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  if (op.getBool("keepdims")) return {axes, dy};
  Shape kept = x0(op)->type().shape;
  for (int64_t a : axes) kept[a] = Dim::fixed(1);
  return {axes, g.reshape(dy, kept)};
}

Grads vjpReduceSum(Grad& g, const Op& op, Value* dy) {
  return {g.broadcastTo(keptGrad(g, op, dy).second, x0(op)->type())};
}

Grads vjpReduceMean(Grad& g, const Op& op, Value* dy) {
  auto [axes, kept] = keptGrad(g, op, dy);
  auto dims = g.dims(x0(op), "reduce_mean");
  if (!dims) return {nullptr};
  double count = 1;
  for (int64_t a : axes) count *= static_cast<double>((*dims)[a]);
  return {g.broadcastTo(g.mul(kept, 1.0 / count), x0(op)->type())};
}

/// The gradient is shared evenly by the elements equal to the extreme.
Grads vjpReduceExtreme(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  auto [axes, kept] = keptGrad(g, op, dy);
  Value* y = op.getBool("keepdims") ? y0(op) : g.reshape(y0(op), kept ? kept->type().shape : Shape{});
  Value* hit = g.cast(g.cmp(OpKind::Eq, x, y), x->type().dtype);
  Value* share = g.div(kept, g.reduce(OpKind::ReduceSum, hit, axes, true));
  return {g.mul(hit, share)};
}

/// d prod = prod / x (operands containing 0 get NaN or inf there).
Grads vjpReduceProd(Grad& g, const Op& op, Value* dy) {
  auto [axes, kept] = keptGrad(g, op, dy);
  Value* y = op.getBool("keepdims") ? y0(op) : g.reshape(y0(op), kept ? kept->type().shape : Shape{});
  return {g.div(g.mul(kept, y), x0(op))};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace entries {
const VjpEntry ReduceSum = rule(vjpReduceSum);
const VjpEntry ReduceMean = rule(vjpReduceMean);
const VjpEntry ReduceMax = rule(vjpReduceExtreme);
const VjpEntry ReduceMin = rule(vjpReduceExtreme);
const VjpEntry ReduceProd = rule(vjpReduceProd);
const VjpEntry ArgMax = kNone;
const VjpEntry ArgMin = kNone;
}  // namespace entries

}  // namespace kiln::vjp
