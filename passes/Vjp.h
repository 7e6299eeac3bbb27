// Vector-Jacobian products (VJP rules) of the ops of ir/Ops.def, one rule
// function per op kind in passes/Vjp.cpp, registered in an array indexed by
// OpKind and filled from the op table: an op added to Ops.def without a
// declared VJP kind does not compile. The `autodiff` pass (passes/Autodiff.h)
// walks a function backwards and asks each op for the gradients of its
// operands given the gradient of its result.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "ir/Builder.h"
#include "ir/IR.h"

namespace kiln {

/// How an op takes part in differentiation.
enum class VjpKind : uint8_t {
  /// A rule gives the gradient of each float operand.
  Rule,
  /// No gradient flows through it: its result is integer or bool, or it is
  /// piecewise constant (sign, floor, ceil, round), or it has no operands
  /// (constant, iota, random). Float operands of such ops get no gradient.
  NotDifferentiable,
  /// A composite op: autodiff decomposes it first and differentiates the
  /// primitives (softmax, layer_norm, the losses, the recurrent ops...).
  Decompose,
  /// Differentiable in principle but without a rule yet: differentiating
  /// through it is an error naming the op.
  Unsupported,
};

VjpKind vjpKind(OpKind kind);
std::string_view vjpKindName(VjpKind kind);

/// The gradients of `op`'s operands given `dy`, the gradient of its (single)
/// result, built with `b` (insertion point and location already set). One
/// entry per operand; null where no gradient flows (integer operands, the
/// condition of a select, or an operand whose `needs` entry is false).
/// Each gradient has its operand's dtype and shape (broadcasting undone).
/// An error names the op when the rule does not apply (an unsupported op,
/// attributes or shapes the rule does not handle).
Expected<std::vector<Value*>> applyVjp(Builder& b, const Op& op, Value* dy, const std::vector<bool>& needs);

/// applyVjp for an op of any number of results: `dys` holds the gradient of
/// each result, null where none reached it. `loop` is the op of several
/// results with a rule; another is an error naming it unless it carries no
/// gradient. The rule of `loop` widens the forward op in place: it also
/// stacks, as scan results, the carried values entering each iteration.
Expected<std::vector<Value*>> applyVjpResults(Builder& b, Op& op, std::span<Value* const> dys,
                                              const std::vector<bool>& needs);

/// The gradient built so far of each value a backward sweep reached.
using GradientMap = std::map<const Value*, Value*>;

/// Marks active the float results of `ops` (forward order) that depend on
/// an active value; those in `held` stay inactive.
void markActive(std::span<Op* const> ops, std::set<const Value*>& active, const std::set<const Value*>& held = {});

/// Adds `g` to the gradient of `v` in `grads` (with an `add` when `v` has
/// one already).
Status accumulateGradient(Builder& b, GradientMap& grads, const Value* v, Value* g);

/// The backward sweep shared by the `autodiff` pass, buildGradients and the
/// rules of control flow (the backward of a branch or loop body): visits
/// `ops` last to first and, for each op whose results a gradient in `grads`
/// reached, sets `b`'s location to the op's and adds to `grads` the
/// gradients (applyVjpResults) of its operands in `active`. `composite`,
/// when given, differentiates a composite op instead (buildGradients: a
/// decomposed copy); without it a composite is applyVjpResults' error.
Status sweepBackward(Builder& b, std::span<Op* const> ops, const std::set<const Value*>& active, GradientMap& grads,
                     const std::function<Status(Op&)>& composite = nullptr);

/// Sums `g` over the dims that broadcasting added or stretched so that it
/// has the shape of `target` (the operand that was broadcast).
Expected<Value*> unbroadcast(Builder& b, Value* g, const TensorType& target);

}  // namespace kiln
