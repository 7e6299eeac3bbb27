// The `autodiff` pass: reverse-mode differentiation of each function's loss
// (its first result, a scalar float) with respect to its parameters (every
// float argument with a default value), built as graph ops after the forward
// ops so that forward and backward are later fused, planned and compiled
// together. The backward walk visits the forward ops last to first; an op
// gets a VJP only when it lies on a path from a parameter to the loss, and
// gradients reaching a value from several users are added.
#include "passes/Autodiff.h"

#include <map>
#include <set>

#include "ir/Builder.h"
#include "passes/Decompose.h"
#include "passes/Pass.h"
#include "passes/Vjp.h"

namespace kiln {

namespace {

/// The arguments to differentiate, by index, or an error naming the problem.
Expected<std::vector<size_t>> chooseParameters(const Function& f, const AutodiffOptions& options) {
  std::vector<size_t> params;
  if (!options.parameters) {
    for (size_t i = 0; i < f.numArguments(); ++i)
      if (f.argumentDefault(i) && isFloat(f.argument(i)->type().dtype)) params.push_back(i);
    if (params.empty())
      return Error(
          "function @" + f.name() + " has no parameters to differentiate: expected float arguments with default values",
          f.loc());
    return params;
  }
  for (const std::string& name : *options.parameters) {
    size_t i = 0;
    while (i < f.numArguments() && f.argument(i)->name() != name) ++i;
    if (i == f.numArguments())
      return Error("function @" + f.name() + " has no argument %" + name + " to differentiate", f.loc());
    if (!isFloat(f.argument(i)->type().dtype))
      return Error("argument %" + name + " of @" + f.name() + " is " + f.argument(i)->type().str() +
                       ", expected a float tensor to differentiate",
                   f.loc());
    params.push_back(i);
  }
  return params;
}

/// Values that depend on some parameter through float data.
std::set<const Value*> activeValues(const Function& f, const std::vector<size_t>& params) {
  std::set<const Value*> active;
  for (size_t i : params) active.insert(f.argument(i));
  std::vector<Op*> ops;
  for (const auto& op : f.ops()) ops.push_back(op.get());
  markActive(ops, active);
  return active;
}

/// Zeros of a parameter's type (static: a constant; otherwise x * 0).
Value* zerosLike(Builder& b, Value* x) {
  if (x->type().isStatic()) return b.constant(DenseTensor::zeros(x->type()));
  auto r = b.value(OpKind::Mul, {x, b.scalar(x->type().dtype, 0.0)});
  return r ? *r : nullptr;
}

/// Erases backward ops whose results no one uses (rules build the gradient
/// of every float operand; those of inactive operands are dropped here).
void eraseUnusedFrom(Function& f, Op* first) {
  std::vector<Op*> created;
  bool seen = false;
  for (const auto& op : f.ops()) {
    seen |= op.get() == first;
    if (seen && op->kind() != OpKind::Return) created.push_back(op.get());
  }
  for (auto it = created.rbegin(); it != created.rend(); ++it)
    if (!(*it)->hasUses()) f.erase(*it);
}

/// Builds the backward ops; `b` inserts before the return.
Status buildBackward(Function& f, Builder& b, const std::vector<size_t>& params, Value* loss) {
  std::set<const Value*> active = activeValues(f, params);
  GradientMap grads;
  if (active.count(loss)) grads[loss] = b.scalar(loss->type().dtype, 1.0);
  // decomposeFunction left no composites.
  std::vector<Op*> forward;
  for (const auto& op : f.ops())
    if (op->kind() != OpKind::Return) forward.push_back(op.get());
  KILN_TRY(sweepBackward(b, forward, active, grads));

  b.setLocation(f.loc());
  Op* ret = f.returnOp();
  std::vector<Value*> results(ret->operands().begin(), ret->operands().end());
  std::vector<TensorType> types = f.resultTypes();
  std::vector<std::string> names;
  for (size_t i = 0; i < types.size(); ++i) names.push_back(f.resultName(i));
  for (size_t i : params) {
    Value* p = f.argument(i);
    auto g = grads.find(p);
    Value* grad = g != grads.end() ? g->second : zerosLike(b, p);
    if (!grad) return Error("cannot build zeros of type " + p->type().str() + " for %" + p->name(), f.loc());
    results.push_back(grad);
    types.push_back(p->type());
    names.push_back("grad." + p->name());
  }
  ret->setOperands(results);
  f.setResultTypes(types);
  for (size_t i = 0; i < names.size(); ++i) f.setResultName(i, names[i]);
  return Status::success();
}

/// The backward sweep of buildGradients over a function's ops as they
/// stand, which it leaves in place: a composite op is differentiated through
/// a decomposed copy of it built at the insertion point.
class GradientSweep {
 public:
  GradientSweep(Builder& b, std::set<const Value*> held) : b_(b), held_(std::move(held)) {}

  std::set<const Value*>& active() { return active_; }
  GradientMap& grads() { return grads_; }

  /// Marks active the float results of `ops` (forward order) that depend on
  /// an active value; held values stay inactive.
  void propagate(const std::vector<Op*>& ops) { markActive(ops, active_, held_); }

  /// Visits `ops` last to first, adding to grads() the gradients of the
  /// active operands of each op that a gradient reached.
  Status sweep(const std::vector<Op*>& ops) {
    return sweepBackward(b_, ops, active_, grads_, [this](Op& op) { return sweepDecomposedCopy(op); });
  }

 private:
  /// Decomposes a copy of composite `op` at the insertion point and sweeps
  /// its primitives, their results standing for op's.
  Status sweepDecomposedCopy(const Op& op) {
    Function& f = b_.function();
    std::set<const Op*> before;
    for (const auto& o : f.ops()) before.insert(o.get());
    std::vector<TensorType> types;
    for (Value* r : op.results()) types.push_back(r->type());
    Op* copy = b_.create(op.kind(), std::vector<Value*>(op.operands().begin(), op.operands().end()), types, op.attrs());
    // Each result gets a placeholder user, through which decomposition
    // tells what replaced it; the placeholders are erased after.
    std::vector<Op*> holders;
    for (Value* r : copy->results()) holders.push_back(b_.create(OpKind::Reshape, {r}, {r->type()}));
    Status decomposed = decomposeOp(*copy);
    std::vector<Value*> replaced;
    for (Op* h : holders) replaced.push_back(h->operand(0));
    for (Op* h : holders) f.erase(h);
    if (!decomposed.ok()) {
      f.erase(copy);
      return decomposed;
    }
    std::set<const Op*> holderSet(holders.begin(), holders.end());
    std::vector<Op*> primitives;
    for (const auto& o : f.ops())
      if (!before.count(o.get()) && !holderSet.count(o.get())) primitives.push_back(o.get());
    propagate(primitives);
    for (size_t i = 0; i < op.numResults(); ++i)
      if (auto g = grads_.find(op.result(i)); g != grads_.end())
        KILN_TRY(accumulateGradient(b_, grads_, replaced[i], g->second));
    return sweep(primitives);
  }

  Builder& b_;
  std::set<const Value*> held_;
  std::set<const Value*> active_;
  GradientMap grads_;
};

class AutodiffPass : public Pass {
 public:
  std::string_view name() const override { return "autodiff"; }
  Expected<bool> run(Module& m, const PassContext&) override {
    for (const auto& f : m.functions()) KILN_TRY(differentiateFunction(*f));
    return !m.functions().empty();
  }
};

}  // namespace

Status differentiateFunction(Function& f, const AutodiffOptions& options) {
  Op* ret = f.returnOp();
  if (!ret) return Error("function @" + f.name() + " has no return", f.loc());
  if (options.lossIndex >= ret->numOperands())
    return Error("function @" + f.name() + " has " + std::to_string(ret->numOperands()) +
                     " results, so there is no loss result " + std::to_string(options.lossIndex),
                 f.loc());
  Value* loss = ret->operand(options.lossIndex);
  const TensorType& lossType = loss->type();
  if (lossType.rank() != 0 || (lossType.dtype != DType::F32 && lossType.dtype != DType::F64))
    return Error("the loss of @" + f.name() + " (result " + std::to_string(options.lossIndex) + ") is " +
                     lossType.str() + ", expected a scalar f32[] or f64[]",
                 f.loc());
  auto params = chooseParameters(f, options);
  if (!params) return params.takeError();
  for (size_t i : *params)
    for (size_t r = 0; r < f.resultTypes().size(); ++r)
      if (f.resultName(r) == "grad." + f.argument(i)->name())
        return Error("function @" + f.name() + " already has a result named grad." + f.argument(i)->name(), f.loc());

  auto decomposed = decomposeFunction(f);
  if (!decomposed) return decomposed.takeError();
  Builder b(f);
  Op* last = nullptr;
  for (const auto& op : f.ops())
    if (op->kind() != OpKind::Return) last = op.get();
  // Decomposition replaced a composite loss: read it from the return again.
  Status status = buildBackward(f, b, *params, f.returnOp()->operand(options.lossIndex));
  // The first backward op follows the last forward one.
  Op* first = nullptr;
  bool after = last == nullptr;
  for (const auto& op : f.ops()) {
    if (after && op->kind() != OpKind::Return) {
      first = op.get();
      break;
    }
    after |= op.get() == last;
  }
  if (!status.ok()) {
    // Drop the partial backward graph so the function is left as it was.
    if (first) {
      std::vector<Op*> created;
      bool seen = false;
      for (const auto& op : f.ops()) {
        seen |= op.get() == first;
        if (seen && op->kind() != OpKind::Return) created.push_back(op.get());
      }
      for (auto it = created.rbegin(); it != created.rend(); ++it) f.erase(*it);
    }
    return status;
  }
  if (first) eraseUnusedFrom(f, first);
  return Status::success();
}

Expected<std::vector<Value*>> buildGradients(Builder& b, Value* y, std::span<Value* const> xs,
                                             std::span<Value* const> zs) {
  Function& f = b.function();
  if (!isFloat(y->type().dtype)) return Error("cannot differentiate %" + y->name() + " of type " + y->type().str() +
                                              ": expected a float tensor", b.location());
  for (Value* x : xs)
    if (!isFloat(x->type().dtype))
      return Error("cannot differentiate with respect to %" + x->name() + " of type " + x->type().str() +
                       ": expected a float tensor",
                   b.location());
  std::vector<Op*> forward;
  std::set<const Op*> existing;
  for (const auto& op : f.ops()) {
    existing.insert(op.get());
    if (op->kind() != OpKind::Return) forward.push_back(op.get());
  }
  GradientSweep sweep(b, std::set<const Value*>(zs.begin(), zs.end()));
  for (Value* x : xs) sweep.active().insert(x);
  for (Value* z : zs) sweep.active().erase(z);
  sweep.propagate(forward);
  const Location loc = b.location();
  if (sweep.active().count(y)) {
    Value* one = b.scalar(y->type().dtype, 1.0);
    Value* zeros = y->type().isStatic() ? nullptr : zerosLike(b, y);
    if (!y->type().isStatic() && !zeros) return Error("cannot build ones of type " + y->type().str(), loc);
    auto seed = y->type().isStatic() ? b.value(OpKind::Broadcast, {one}, {}, {y->type()})
                                     : b.value(OpKind::Add, {zeros, one});
    if (!seed) return seed.takeError();
    sweep.grads()[y] = *seed;
    KILN_TRY(sweep.sweep(forward));
  }
  b.setLocation(loc);
  std::vector<Value*> results;
  for (Value* x : xs) {
    auto g = sweep.grads().find(x);
    Value* grad = g != sweep.grads().end() ? g->second : zerosLike(b, x);
    if (!grad) return Error("cannot build zeros of type " + x->type().str() + " for %" + x->name(), loc);
    results.push_back(grad);
  }
  // Rules build the gradient of every float operand; drop the unused ones.
  std::set<const Value*> keep(results.begin(), results.end());
  std::vector<Op*> created;
  for (const auto& op : f.ops())
    if (!existing.count(op.get())) created.push_back(op.get());
  for (auto it = created.rbegin(); it != created.rend(); ++it) {
    bool kept = false;
    for (Value* r : (*it)->results()) kept |= keep.count(r) > 0;
    if (!kept && !(*it)->hasUses()) f.erase(*it);
  }
  return results;
}

std::unique_ptr<Pass> createAutodiffPass() { return std::make_unique<AutodiffPass>(); }

}  // namespace kiln
