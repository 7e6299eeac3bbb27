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
  for (const auto& op : f.ops()) {
    bool any = false;
    for (Value* v : op->operands()) any |= active.count(v) > 0;
    if (!any) continue;
    for (Value* r : op->results())
      if (isFloat(r->type().dtype)) active.insert(r);
  }
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
  std::map<const Value*, Value*> grads;
  auto accumulate = [&](const Value* v, Value* g) -> Status {
    Value*& slot = grads[v];
    if (!slot) {
      slot = g;
      return Status::success();
    }
    auto sum = b.value(OpKind::Add, {slot, g});
    if (!sum) return sum.takeError();
    slot = *sum;
    return Status::success();
  };
  if (active.count(loss)) grads[loss] = b.scalar(loss->type().dtype, 1.0);

  std::vector<Op*> forward;
  for (const auto& op : f.ops())
    if (op->kind() != OpKind::Return) forward.push_back(op.get());
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    Op& op = **it;
    auto found = grads.find(op.result(0));
    if (op.numResults() != 1 || found == grads.end()) {
      bool reached = false;
      for (Value* r : op.results()) reached |= grads.count(r) > 0;
      if (reached) return op.emitError("has several results; autodiff handles single-result ops only");
      continue;
    }
    std::vector<bool> needs;
    for (Value* v : op.operands()) needs.push_back(active.count(v) > 0);
    b.setLocation(op.loc());
    auto operandGrads = applyVjp(b, op, found->second, needs);
    if (!operandGrads) return operandGrads.takeError();
    for (size_t i = 0; i < op.numOperands(); ++i)
      if (Value* g = (*operandGrads)[i]) KILN_TRY(accumulate(op.operand(i), g));
  }

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

std::unique_ptr<Pass> createAutodiffPass() { return std::make_unique<AutodiffPass>(); }

}  // namespace kiln
