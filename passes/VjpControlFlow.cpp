// VJP rules of the ControlFlow family: `if` (the backward of the branch taken) and `loop` (true
// reverse mode over a static trip count, the carried values stacked by the
// forward loop).
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

#include "ir/ConstantValue.h"
#include "ir/Limits.h"
#include "passes/CanonicalizeLoops.h"

namespace kiln::vjp {
namespace {

// --- Control flow ---------------------------------------------------------------------------

/// Zeros of `like`'s type, built with `b`.
Expected<Value*> zerosOf(Builder& b, Value* like) {
  const TensorType& t = like->type();
  if (t.isStatic()) return b.constant(DenseTensor::zeros(t));
  return b.value(OpKind::Mul, {like, b.scalar(t.dtype, 0.0)});
}

/// The gradient of `x` in `grads`, or zeros of its type where none reached
/// it.
Expected<Value*> gradientOrZeros(Builder& b, const GradientMap& grads, Value* x) {
  if (auto g = grads.find(x); g != grads.end() && g->second) return g->second;
  return zerosOf(b, x);
}

/// The backward of one branch of an `if`: a copy of `body` that also takes
/// dy (the gradient of the op's result) and returns the gradient of each
/// argument listed in `floatArgs` (zeros where none flows), computed by
/// sweeping the branch's ops backwards from its `return`. The forward ops
/// stay in the copy: the branch is recomputed rather than its values kept.
Expected<std::unique_ptr<Function>> backwardBranch(const Function& body, const TensorType& dyType,
                                                   const std::vector<size_t>& floatArgs) {
  std::unique_ptr<Function> back = body.clone();
  Function& f = *back;
  Value* dy = f.addArgument(dyType, "dy");
  Op* ret = f.returnOp();
  if (!ret || ret->numOperands() != 1) return Error("a branch of 'if' must return one value to be differentiated");
  std::set<const Value*> active;
  for (size_t i : floatArgs) active.insert(f.argument(i));
  std::vector<Op*> forward;
  for (const auto& op : f.ops())
    if (op->kind() != OpKind::Return) forward.push_back(op.get());
  markActive(forward, active);
  Builder b(f);
  b.setLocation(body.loc());
  GradientMap grads;
  if (active.count(ret->operand(0))) grads[ret->operand(0)] = dy;
  // Regions hold no composites (autodiff decomposes only at the top
  // level): applyVjpResults' error names one.
  KILN_TRY(sweepBackward(b, forward, active, grads));
  std::vector<Value*> results;
  std::vector<TensorType> types;
  for (size_t i : floatArgs) {
    Value* arg = f.argument(i);
    auto g = gradientOrZeros(b, grads, arg);
    if (!g) return g.takeError();
    results.push_back(*g);
    types.push_back(arg->type());
  }
  ret->setOperands(results);
  f.setResultTypes(std::move(types));
  return back;
}

/// y = if(c, captures...) (one result): the gradients of the float captures
/// come from an `if` on the same condition whose branches are the backward
/// of the forward ones (backwardBranch), so only the branch taken is
/// differentiated at run time. A branch with a composite op or an op of
/// several results is an error naming it.
Grads vjpIf(Grad& g, const Op& op, Value* dy) {
  if (op.numResults() != 1) {
    g.fail("an 'if' of several results is not differentiated yet");
    return {};
  }
  std::vector<size_t> floatArgs;
  for (size_t i = 1; i < op.numOperands(); ++i)
    if (isFloat(op.operand(i)->type().dtype)) floatArgs.push_back(i - 1);
  if (floatArgs.empty()) return {};
  std::vector<std::unique_ptr<Function>> branches;
  for (size_t k = 0; k < 2; ++k) {
    auto back = backwardBranch(*op.region(k), dy->type(), floatArgs);
    if (!back) {
      g.fail(back.error().message());
      return {};
    }
    branches.push_back(std::move(*back));
  }
  std::vector<Value*> operands(op.operands().begin(), op.operands().end());
  operands.push_back(dy);
  std::vector<TensorType> types;
  for (size_t i : floatArgs) types.push_back(op.operand(1 + i)->type());
  Op* backward = g.builder().create(OpKind::If, std::move(operands), std::move(types));
  for (auto& branch : branches) backward->addRegion(std::move(branch));
  Grads grads(op.numOperands(), nullptr);
  for (size_t r = 0; r < floatArgs.size(); ++r) grads[1 + floatArgs[r]] = backward->result(r);
  return grads;
}

/// Clones `op` (a forward op of a loop body) with `b`, its operands read
/// through `map`, and maps its results to the copy's.
void cloneInto(Builder& b, const Op& op, std::map<const Value*, Value*>& map) {
  std::vector<Value*> operands;
  for (Value* v : op.operands()) operands.push_back(map.count(v) ? map.at(v) : v);
  std::vector<TensorType> types;
  for (Value* r : op.results()) types.push_back(r->type());
  Op* copy = b.create(op.kind(), std::move(operands), std::move(types), op.attrs());
  copy->setLoc(op.loc());
  for (size_t k = 0; k < op.numRegions(); ++k) copy->addRegion(op.region(k)->clone());
  for (size_t i = 0; i < op.numResults(); ++i) map[op.result(i)] = copy->result(i);
}

/// What the backward loop of vjpLoop threads and reads.
struct LoopGradients {
  size_t numCarried = 0;               // K
  int64_t trips = 0;                   // N
  std::vector<size_t> floatCarried;    // carried values k with a gradient
  std::vector<size_t> floatCaptures;   // captures j whose gradient is needed
  std::vector<size_t> seededScans;     // scans s whose result has a gradient
};

/// The body of the backward loop. Iteration t visits the forward iteration
/// i = N-1-t: it reads the carried values that entered it from their stacks
/// (gather at i), recomputes the forward body from them, and sweeps it
/// backwards from the gradients of what it returned (the carried gradients
/// threaded from iteration i+1, the scan gradients' row i). It returns the
/// gradients of the carried values entering iteration i and the captures'
/// gradients summed over the iterations so far. Arguments: (t, cond,
/// d_carried..., d_captures..., stacks..., d_scans..., captures...).
Expected<std::unique_ptr<Function>> backwardLoopBody(const Function& body, const Op& op,
                                                     const std::vector<Value*>& stackResults, const LoopGradients& lg,
                                                     std::span<Value* const> dys) {
  const size_t K = lg.numCarried;
  auto back = std::make_unique<Function>(body.name());
  back->setLoc(body.loc());
  Value* t = back->addArgument(TensorType{DType::I64, {}}, "t");
  Value* cond = back->addArgument(TensorType{DType::Bool, {}}, "cond");
  std::vector<Value*> dCarried, dCaptures, stacks, dScans, captures;
  for (size_t k : lg.floatCarried) dCarried.push_back(back->addArgument(op.result(k)->type()));
  for (size_t j : lg.floatCaptures) dCaptures.push_back(back->addArgument(op.operand(2 + K + j)->type()));
  for (Value* stack : stackResults) stacks.push_back(back->addArgument(stack->type()));
  for (size_t s : lg.seededScans) dScans.push_back(back->addArgument(dys[K + s]->type()));
  for (size_t j = 0; 2 + K + j < op.numOperands(); ++j)
    captures.push_back(back->addArgument(body.argument(2 + K + j)->type()));

  Builder b(*back);
  b.setLocation(op.loc());
  KILN_TRY_VALUE(i, b.value(OpKind::Sub, {b.scalar(DType::I64, static_cast<double>(lg.trips - 1)), t}));
  const AttrMap rows{{"axis", Attribute(int64_t{0})}};
  std::map<const Value*, Value*> map;
  map[body.argument(0)] = i;
  map[body.argument(1)] = cond;
  for (size_t k = 0; k < K; ++k) {
    KILN_TRY_VALUE(x, b.value(OpKind::Gather, {stacks[k], i}, rows));
    map[body.argument(2 + k)] = x;
  }
  for (size_t j = 0; j < captures.size(); ++j) map[body.argument(2 + K + j)] = captures[j];
  const Op* ret = body.returnOp();
  if (!ret) return Error("the body of 'loop' has no return", body.loc());
  // The sweep visits the recomputed body only: it stops at the rows read
  // from the stacks, which are saved values, not differentiated (a gather's
  // VJP would also need static shapes).
  std::set<const Op*> reads;
  for (const auto& o : back->ops()) reads.insert(o.get());
  for (const auto& o : body.ops()) {
    if (o.get() == ret) break;
    cloneInto(b, *o, map);
  }
  std::vector<Op*> recomputed;
  for (const auto& o : back->ops())
    if (!reads.count(o.get())) recomputed.push_back(o.get());

  std::set<const Value*> active;
  for (size_t k : lg.floatCarried) active.insert(map.at(body.argument(2 + k)));
  for (size_t j : lg.floatCaptures) active.insert(captures[j]);
  markActive(recomputed, active);
  GradientMap grads;
  auto returned = [&](size_t r) {
    Value* v = ret->operand(r);
    return map.count(v) ? map.at(v) : v;
  };
  for (size_t n = 0; n < lg.floatCarried.size(); ++n)
    if (Value* v = returned(1 + lg.floatCarried[n]); active.count(v))
      KILN_TRY(accumulateGradient(b, grads, v, dCarried[n]));
  for (size_t n = 0; n < lg.seededScans.size(); ++n) {
    Value* v = returned(1 + K + lg.seededScans[n]);
    if (!active.count(v)) continue;
    KILN_TRY_VALUE(row, b.value(OpKind::Gather, {dScans[n], i}, rows));
    KILN_TRY(accumulateGradient(b, grads, v, row));
  }
  KILN_TRY(sweepBackward(b, recomputed, active, grads));

  b.setLocation(op.loc());
  std::vector<Value*> results{cond};
  std::vector<TensorType> types{TensorType{DType::Bool, {}}};
  for (size_t n = 0; n < lg.floatCarried.size(); ++n) {
    auto g = gradientOrZeros(b, grads, map.at(body.argument(2 + lg.floatCarried[n])));
    if (!g) return g.takeError();
    results.push_back(*g);
    types.push_back(dCarried[n]->type());
  }
  for (size_t n = 0; n < lg.floatCaptures.size(); ++n) {
    Value* acc = dCaptures[n];
    if (auto g = grads.find(captures[lg.floatCaptures[n]]); g != grads.end()) {
      KILN_TRY_VALUE(sum, b.value(OpKind::Add, {acc, g->second}));
      acc = sum;
    }
    results.push_back(acc);
    types.push_back(dCaptures[n]->type());
  }
  b.ret(results);
  back->setResultTypes(std::move(types));
  // Rules build the gradient of every float operand (the stacks' among
  // them); drop what the results do not use.
  std::vector<Op*> ops;
  for (const auto& o : back->ops()) ops.push_back(o.get());
  for (auto it = ops.rbegin(); it != ops.rend(); ++it)
    if ((*it)->kind() != OpKind::Return && !(*it)->hasUses()) back->erase(*it);
  return back;
}

/// The results of `op` (a loop of `trips` iterations) that stack the
/// carried values entering each iteration, one per carried value: the
/// loop's last scan results when its body already returns its carried
/// arguments there (an earlier VJP of it added them), else new ones, added
/// to the op in place (its other results and their uses stay).
std::vector<Value*> stackCarriedValues(Op& op, int64_t trips) {
  const size_t K = static_cast<size_t>(op.getInt("num_carried"));
  Function& body = *op.region(0);
  Op* ret = body.returnOp();
  const size_t scans = op.numResults() - K;
  bool stacked = scans >= K && K > 0;
  for (size_t k = 0; stacked && k < K; ++k) stacked = ret->operand(1 + K + scans - K + k) == body.argument(2 + k);
  std::vector<Value*> stacks;
  if (stacked) {
    for (size_t k = 0; k < K; ++k) stacks.push_back(op.result(op.numResults() - K + k));
    return stacks;
  }
  std::vector<Value*> returned(ret->operands().begin(), ret->operands().end());
  std::vector<TensorType> types = body.resultTypes();
  for (size_t k = 0; k < K; ++k) {
    Value* x = body.argument(2 + k);
    returned.push_back(x);
    types.push_back(x->type());
    TensorType rows = x->type();
    rows.shape.insert(rows.shape.begin(), Dim::fixed(trips));
    stacks.push_back(op.addResult(rows));
  }
  ret->setOperands(returned);
  body.setResultTypes(std::move(types));
  return stacks;
}

/// results = loop(N, true, carried..., captures...) with a static trip
/// count N and a body that never stops early: true reverse mode. The
/// forward loop also stacks, as scan results added to it in place
/// (stackCarriedValues), the carried values entering each iteration. A
/// backward loop of
/// N iterations then runs the body's VJP in reverse iteration order
/// (backwardLoopBody), threading the carried values' gradients from the
/// final ones (dys) to the initial ones and summing the captures'. A loop
/// of no iteration passes its carried values' gradients through.
Grads vjpLoop(Grad& g, Op& op, std::span<Value* const> dys, const std::vector<bool>& needs) {
  const Function& body = *op.region(0);
  LoopGradients lg;
  lg.numCarried = static_cast<size_t>(op.getInt("num_carried"));
  const size_t K = lg.numCarried;
  const size_t S = op.numResults() - K;
  // A loop that a counter stops (PyTorch's `while i < n`) is counted first.
  countLoop(op);
  const std::optional<int64_t> bound = constantIntegerScalar(op.operand(0));
  const std::optional<double> go = constantScalar(op.operand(1));
  if (!bound || !go) {
    g.fail(std::string("the VJP of 'loop' needs a static trip count: its ") +
           (!bound ? "trip bound (operand 0)" : "initial condition (operand 1)") + " is not a constant");
    return {};
  }
  // The stacks hold one row per iteration; a bound past this is a loop that
  // only its condition ends (ONNX's Loop without M), which must be true here.
  if (*go != 0 && *bound > kMaxLoopIterations) {
    g.fail("the VJP of 'loop' needs a static trip count: its trip bound " + std::to_string(*bound) + " is more than " +
           std::to_string(kMaxLoopIterations) + " iterations to stack");
    return {};
  }
  lg.trips = *go != 0 ? std::max<int64_t>(0, *bound) : 0;
  Grads grads(op.numOperands(), nullptr);
  if (lg.trips == 0) {
    for (size_t k = 0; k < K; ++k) grads[2 + k] = dys[k];
    return grads;
  }
  const Op* ret = body.returnOp();
  const std::optional<double> again = ret ? constantScalar(ret->operand(0)) : std::nullopt;
  if (!ret || (ret->operand(0) != body.argument(1) && !(again && *again != 0))) {
    g.fail(
        "the VJP of 'loop' needs a static trip count: the condition its body returns is not provably true (its "
        "condition argument or a true constant), so the loop may stop early");
    return {};
  }
  for (size_t k = 0; k < K; ++k)
    if (isFloat(op.result(k)->type().dtype)) lg.floatCarried.push_back(k);
  for (size_t j = 0; 2 + K + j < op.numOperands(); ++j)
    if (isFloat(op.operand(2 + K + j)->type().dtype) && needs[2 + K + j]) lg.floatCaptures.push_back(j);
  for (size_t s = 0; s < S; ++s)
    if (dys[K + s] && isFloat(op.result(K + s)->type().dtype)) lg.seededScans.push_back(s);
  if (lg.floatCarried.empty() && lg.floatCaptures.empty()) return grads;

  std::vector<Value*> stacks = stackCarriedValues(op, lg.trips);
  auto back = backwardLoopBody(body, op, stacks, lg, dys);
  if (!back) {
    g.fail(back.error().message());
    return {};
  }
  Builder& b = g.builder();
  std::vector<Value*> operands{g.scalar(DType::I64, static_cast<double>(lg.trips)), g.scalar(DType::Bool, 1.0)};
  std::vector<TensorType> backTypes;
  for (size_t k : lg.floatCarried) {
    Value* d = dys[k];
    if (!d) {
      auto zeros = zerosOf(b, op.result(k));
      if (!zeros) {
        g.fail(zeros.error().message());
        return {};
      }
      d = *zeros;
    }
    operands.push_back(d);
    backTypes.push_back(op.result(k)->type());
  }
  for (size_t j : lg.floatCaptures) {
    Value* capture = op.operand(2 + K + j);
    auto zeros = zerosOf(b, capture);
    if (!zeros) {
      g.fail(zeros.error().message());
      return {};
    }
    operands.push_back(*zeros);
    backTypes.push_back(capture->type());
  }
  operands.insert(operands.end(), stacks.begin(), stacks.end());
  for (size_t s : lg.seededScans) operands.push_back(dys[K + s]);
  for (size_t j = 0; 2 + K + j < op.numOperands(); ++j) operands.push_back(op.operand(2 + K + j));
  const int64_t threaded = static_cast<int64_t>(lg.floatCarried.size() + lg.floatCaptures.size());
  Op* backward = b.create(OpKind::Loop, std::move(operands), std::move(backTypes),
                          {{"num_carried", Attribute(threaded)}});
  backward->addRegion(std::move(*back));
  for (size_t n = 0; n < lg.floatCarried.size(); ++n) grads[2 + lg.floatCarried[n]] = backward->result(n);
  for (size_t n = 0; n < lg.floatCaptures.size(); ++n)
    grads[2 + K + lg.floatCaptures[n]] = backward->result(lg.floatCarried.size() + n);
  return grads;
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace entries {
const VjpEntry If = rule(vjpIf);
const VjpEntry Loop = resultsRule(vjpLoop);
const VjpEntry Check = kNone;
const VjpEntry Fused = kMissing;
const VjpEntry Return = kNone;
}  // namespace entries

}  // namespace kiln::vjp
