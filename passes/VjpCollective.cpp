// VJP rules of the Collective family: the collectives of a data-parallel job, whose VJPs are
// collectives too (all_reduce is its own transpose, all_gather and
// reduce_scatter are each other's).
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

// Collectives, for the loss of the whole job (the sum of every rank's
// loss): each rule is the collective that carries the gradients back.
/// y = reduce(x over ranks) on every rank: dx = the same reduction of dy.
Grads vjpAllReduce(Grad& g, const Op& op, Value* dy) {
  return {g.emit(OpKind::AllReduce, {dy}, {{"reduction", Attribute(op.getString("reduction"))}})};
}

/// y = x of rank `root` on every rank: root's dx sums every rank's dy, the
/// others' dx is 0.
Grads vjpBroadcastFrom(Grad& g, const Op& op, Value* dy) {
  return {g.emit(OpKind::ReduceTo, {dy}, {{"root", Attribute(op.getInt("root"))}})};
}

/// y = the sum of x over ranks on `root` (0 elsewhere): every rank's dx is
/// root's dy (divided by the world size for a mean, through the same mean
/// on a broadcast dy).
Grads vjpReduceTo(Grad& g, const Op& op, Value* dy) {
  Value* dx = g.emit(OpKind::BroadcastFrom, {dy}, {{"root", Attribute(op.getInt("root"))}});
  if (op.getString("reduction") == "mean") {
    // d(mean)/dx_r = 1/world: the world size is the sum of ones over ranks.
    Value* one = g.like(dx, 1.0);
    Value* world = g.emit(OpKind::AllReduce, {one}, {{"reduction", Attribute(std::string("sum"))}});
    dx = g.div(dx, world);
  }
  return {dx};
}

/// y = every rank's x along `axis`: dx = rank r's block of dy summed over ranks.
Grads vjpAllGather(Grad& g, const Op& op, Value* dy) {
  return {g.emit(OpKind::ReduceScatter, {dy},
                 {{"axis", Attribute(op.getInt("axis"))}, {"world_size", Attribute(op.getInt("world_size"))}})};
}

/// y = block r of the reduction of x: dx = every rank's dy along `axis`
/// (divided by the world size for a mean).
Grads vjpReduceScatter(Grad& g, const Op& op, Value* dy) {
  const int64_t world = op.getInt("world_size");
  Value* dx = g.emit(OpKind::AllGather, {dy}, {{"axis", Attribute(op.getInt("axis"))}, {"world_size", Attribute(world)}});
  if (op.getString("reduction") == "mean") dx = g.mul(dx, 1.0 / static_cast<double>(world));
  return {dx};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace entries {
const VjpEntry AllReduce = rule(vjpAllReduce);
const VjpEntry BroadcastFrom = rule(vjpBroadcastFrom);
const VjpEntry ReduceTo = rule(vjpReduceTo);
const VjpEntry AllGather = rule(vjpAllGather);
const VjpEntry ReduceScatter = rule(vjpReduceScatter);
}  // namespace entries

}  // namespace kiln::vjp
