// ONNX control flow: If, Loop and Scan as Kiln's `if` and `loop` (ir/Ops.def,
// docs/ir.md). Each subgraph becomes a region through NodeContext::importBody,
// which turns the outer values it reads into captured operands. Scan is a
// `loop` whose body takes row i of each scan input (gather) before running
// the scan body inlined, and whose stacked scan values are then reversed and
// moved to their output axes; opset 8's batched Scan is a loop over the batch
// around that loop. What is known at import is resolved there instead: an If
// whose condition is known inlines the branch it takes, and a Loop that
// carries a sequence or an optional (Kiln has no such type at run time) is
// unrolled, which needs its trip count known at import.
#include <limits>
#include <optional>
#include <unordered_map>

#include "frontend/onnx/ConverterSupport.h"
#include "ir/ConstantValue.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {
namespace {

constexpr int64_t kNewest = kNewestOnnxOpset;

/// Input `i`'s ONNX name in quotes.
std::string inQuotesName(NodeContext& ctx, size_t i) { return "'" + ctx.node().input(static_cast<int>(i)) + "'"; }

const TensorType kI64Scalar{DType::I64, {}};
const TensorType kBoolScalar{DType::Bool, {}};

/// `v` as a rank-0 tensor of `dtype` (ONNX allows a one-element tensor).
Expected<Value*> scalarInput(NodeContext& ctx, Value* v, DType dtype, const std::string& what) {
  const TensorType& t = v->type();
  if (t.dtype != dtype)
    return ctx.error(what + " is " + t.str() + ", expected " + std::string(dtypeName(dtype)) + " (a scalar)");
  if (t.rank() == 0) return v;
  if (!t.isStatic() || numElements(t.shape) != 1)
    return ctx.error(what + " is " + t.str() + ", expected a scalar (one element)");
  return reshapeTo(ctx, v, {});
}

/// A type that admits both `a` and `b`: the same dtype and rank, dims kept
/// where they agree and unknown where they differ; nullopt when the dtype or
/// rank differ.
std::optional<TensorType> widen(const TensorType& a, const TensorType& b) {
  if (a.dtype != b.dtype || a.rank() != b.rank()) return std::nullopt;
  TensorType out = a;
  for (size_t d = 0; d < out.shape.size(); ++d)
    if (a.shape[d] != b.shape[d]) out.shape[d] = Dim::unknown();
  return out;
}

/// Inserts `v` (a one-element bool tensor) made a scalar before the return of
/// `body`.
Expected<Value*> bodyScalar(Builder& b, Value* v, DType dtype, const std::string& what, NodeContext& ctx) {
  const TensorType& t = v->type();
  if (t.dtype == dtype && t.rank() == 0) return v;
  if (t.dtype != dtype || !t.isStatic() || numElements(t.shape) != 1)
    return ctx.error(what + " is " + t.str() + ", expected " + std::string(dtypeName(dtype)) + "[]");
  return b.value(OpKind::Reshape, {v}, {}, {TensorType{dtype, {}}});
}

/// An op with regions at the end of the graph being imported (never folded:
/// the bodies decide what it computes).
Expected<std::vector<Value*>> emitRegionOp(NodeContext& ctx, OpKind kind, std::vector<Value*> operands, AttrMap attrs,
                                           std::vector<TensorType> resultTypes,
                                           std::vector<std::unique_ptr<Function>> regions) {
  Op* op = ctx.builder().create(kind, std::move(operands), std::move(resultTypes), std::move(attrs));
  for (auto& region : regions) {
    region->setLoc(op->loc());
    op->addRegion(std::move(region));
  }
  return op->results();
}

/// Copies the ops of `body` to `b`'s insertion point with its arguments
/// replaced by `args`, and returns the values its `return` gives.
Expected<std::vector<Value*>> inlineBody(Builder& b, const Function& body, std::span<Value* const> args) {
  std::unordered_map<const Value*, Value*> map;
  for (size_t i = 0; i < body.numArguments() && i < args.size(); ++i) map[body.argument(i)] = args[i];
  for (const auto& op : body.ops()) {
    std::vector<Value*> operands;
    for (Value* v : op->operands()) {
      auto it = map.find(v);
      if (it == map.end()) return op->emitError("uses a value the inlined body does not define");
      operands.push_back(it->second);
    }
    if (op->kind() == OpKind::Return) return operands;
    std::vector<TensorType> types;
    for (Value* r : op->results()) types.push_back(r->type());
    Op* copy = b.create(op->kind(), std::move(operands), std::move(types), op->attrs());
    copy->setLoc(op->loc());
    for (size_t r = 0; r < op->numRegions(); ++r) copy->addRegion(op->region(r)->clone());
    for (size_t r = 0; r < op->numResults(); ++r) {
      copy->result(r)->setName(op->result(r)->name());
      map[op->result(r)] = copy->result(r);
    }
  }
  return Error("the inlined body has no return");
}

Status convertIf(NodeContext& ctx) {
  KILN_TRY_VALUE(rawCond, ctx.input(0));
  KILN_TRY_VALUE(cond, scalarInput(ctx, rawCond, DType::Bool, "the condition"));
  if (auto known = constantIntegerScalar(cond)) {
    // The condition is known at import: the branch it takes, inlined. This
    // is also how a branch may give a sequence or an optional, which a
    // region cannot return.
    auto outputs = ctx.inlineBody(*known ? "then_branch" : "else_branch", {}, *known ? "_then" : "_else");
    if (!outputs) return outputs.takeError();
    if (outputs->size() != ctx.numOutputs())
      return ctx.error(std::string("the ") + (*known ? "then" : "else") + " branch gives " +
                       std::to_string(outputs->size()) + " outputs, for " + std::to_string(ctx.numOutputs()) +
                       " node outputs");
    for (size_t i = 0; i < outputs->size(); ++i) ctx.setAnyOutput(i, std::move((*outputs)[i]));
    return {};
  }
  auto thenBody = ctx.importBody("then_branch", {});
  if (!thenBody) return thenBody.takeError();
  auto elseBody = ctx.importBody("else_branch", {}, thenBody->captures);
  if (!elseBody) return elseBody.takeError();
  // The else branch took the then branch's captures first and may have added
  // its own: the then branch takes those too (unused), so both match the op.
  for (size_t i = thenBody->captures.size(); i < elseBody->captures.size(); ++i)
    thenBody->body->addArgument(elseBody->captures[i]->type());
  const std::vector<TensorType>& thenTypes = thenBody->body->resultTypes();
  const std::vector<TensorType>& elseTypes = elseBody->body->resultTypes();
  if (thenTypes.size() != elseTypes.size() || thenTypes.size() != ctx.numOutputs())
    return ctx.error("the then branch gives " + std::to_string(thenTypes.size()) + " outputs and the else branch " +
                     std::to_string(elseTypes.size()) + ", for " + std::to_string(ctx.numOutputs()) + " node outputs");
  std::vector<TensorType> resultTypes;
  for (size_t i = 0; i < thenTypes.size(); ++i) {
    auto type = widen(thenTypes[i], elseTypes[i]);
    if (!type)
      return ctx.error("output " + std::to_string(i) + " is " + thenTypes[i].str() + " in the then branch but " +
                       elseTypes[i].str() + " in the else branch (Kiln needs one dtype and rank)");
    resultTypes.push_back(std::move(*type));
  }
  std::vector<Value*> operands = {cond};
  operands.insert(operands.end(), elseBody->captures.begin(), elseBody->captures.end());
  std::vector<std::unique_ptr<Function>> regions;
  regions.push_back(std::move(thenBody->body));
  regions.push_back(std::move(elseBody->body));
  auto results = emitRegionOp(ctx, OpKind::If, std::move(operands), {}, std::move(resultTypes), std::move(regions));
  if (!results) return results.takeError();
  for (size_t i = 0; i < results->size(); ++i) ctx.setOutput(i, (*results)[i]);
  return {};
}

/// The body of a loop imported with carried types that admit every
/// iteration's: started at the initial values' types and widened (dims made
/// unknown) until the body returns what it takes.
Expected<ImportedBody> importLoopBody(NodeContext& ctx, std::vector<TensorType> formal, size_t numCarried) {
  for (int attempt = 0;; ++attempt) {
    auto body = ctx.importBody("body", formal);
    if (!body) return body.takeError();
    const std::vector<TensorType>& returned = body->body->resultTypes();
    if (returned.size() < 1 + numCarried)
      return ctx.error("the body gives " + std::to_string(returned.size()) + " outputs, expected at least " +
                       std::to_string(1 + numCarried) + " (the condition and the loop-carried values)");
    bool stable = true;
    for (size_t c = 0; c < numCarried; ++c) {
      auto wide = widen(formal[2 + c], returned[1 + c]);
      if (!wide)
        return ctx.error("loop-carried value " + std::to_string(c) + " enters the body as " + formal[2 + c].str() +
                         " but leaves it as " + returned[1 + c].str() + " (Kiln needs one dtype and rank)");
      if (*wide != formal[2 + c]) {
        formal[2 + c] = std::move(*wide);
        stable = false;
      }
    }
    if (stable || attempt == 2) return body;
  }
}

/// The most iterations a Loop is unrolled over at import.
constexpr int64_t kMaxUnrolledIterations = 1024;

/// The Loop converted one iteration after another into the graph (its body
/// inlined with the iteration number a constant), which needs the trip count
/// and every iteration's condition known at import. Loop-carried values may
/// be sequences and optionals (each iteration's are static). Binds the
/// node's outputs; scan values are the rows concatenated.
Status unrollLoop(NodeContext& ctx, Value* maxTrip, Value* cond, std::vector<ImportValue> carried) {
  auto trips = constantIntegerScalar(maxTrip);
  if (!trips) return Error("the trip count is not known at import time");
  std::vector<std::vector<Value*>> rows;
  for (int64_t i = 0;; ++i) {
    auto going = constantIntegerScalar(cond);
    if (!going) return Error("the condition of iteration " + std::to_string(i) + " is not known at import time");
    if (!*going || i >= *trips) break;
    if (i >= kMaxUnrolledIterations)
      return Error("it runs more than " + std::to_string(kMaxUnrolledIterations) + " iterations");
    DenseTensor index = DenseTensor::zeros(kI64Scalar);
    index.setInt(0, i);
    std::vector<ImportValue> inputs = {ImportValue::ofTensor(ctx.constant(std::move(index))),
                                       ImportValue::ofTensor(cond)};
    inputs.insert(inputs.end(), carried.begin(), carried.end());
    auto outputs = ctx.inlineBody("body", inputs, "_iter" + std::to_string(i));
    if (!outputs) return outputs.takeError();
    if (outputs->size() < 1 + carried.size())
      return Error("the body gives " + std::to_string(outputs->size()) + " outputs, expected at least " +
                   std::to_string(1 + carried.size()));
    for (size_t k = 0; k < outputs->size(); ++k)
      if ((*outputs)[k].kind != ValueKind::Tensor && (k == 0 || k > carried.size()))
        return Error("body output " + std::to_string(k) + " is " + std::string(valueKindName((*outputs)[k].kind)) +
                     ", expected a tensor (" + (k == 0 ? "the condition" : "a scan output") + ")");
    KILN_TRY_VALUE(next, scalarInput(ctx, (*outputs)[0].tensor, DType::Bool, "the condition the body gives"));
    cond = next;
    for (size_t c = 0; c < carried.size(); ++c) carried[c] = (*outputs)[1 + c];
    rows.resize(outputs->size() - 1 - carried.size());
    for (size_t k = 0; k < rows.size(); ++k) rows[k].push_back((*outputs)[1 + carried.size() + k].tensor);
  }
  for (size_t c = 0; c < carried.size(); ++c) ctx.setAnyOutput(c, carried[c]);
  for (size_t k = 0; k < rows.size(); ++k) {
    std::vector<Value*> stacked;
    for (Value* row : rows[k]) {
      auto one = unsqueezeAxes(ctx, row, {0});
      if (!one) return one.takeError();
      stacked.push_back(*one);
    }
    auto joined = ctx.emit(OpKind::Concat, stacked, {{"axis", Attribute(int64_t{0})}});
    if (!joined) return joined.takeError();
    ctx.setOutput(carried.size() + k, *joined);
  }
  if (rows.empty() && ctx.numOutputs() > carried.size())
    return Error("it runs no iteration, and the types of its scan outputs are not known without one");
  return {};
}

Status convertLoop(NodeContext& ctx) {
  Value* maxTrip;
  if (ctx.hasInput(0)) {
    KILN_TRY_VALUE(raw, ctx.input(0));
    KILN_TRY_VALUE(trip, scalarInput(ctx, raw, DType::I64, "the trip count M"));
    maxTrip = trip;
  } else {
    // No bound: the body's condition alone ends the loop.
    DenseTensor unbounded = DenseTensor::zeros(kI64Scalar);
    unbounded.setInt(0, std::numeric_limits<int64_t>::max());
    maxTrip = ctx.constant(std::move(unbounded));
  }
  Value* cond;
  if (ctx.hasInput(1)) {
    KILN_TRY_VALUE(raw, ctx.input(1));
    KILN_TRY_VALUE(c, scalarInput(ctx, raw, DType::Bool, "the condition"));
    cond = c;
  } else {
    cond = ctx.scalar(DType::Bool, 1);
  }
  std::vector<ImportValue> carriedValues;
  for (size_t i = 2; i < ctx.numInputs(); ++i) {
    auto v = ctx.anyInput(i);
    if (!v) return v.takeError();
    carriedValues.push_back(std::move(*v));
  }
  for (size_t c = 0; c < carriedValues.size(); ++c) {
    if (carriedValues[c].kind == ValueKind::Tensor) continue;
    // Kiln has no sequence or optional at run time: a loop carrying one is
    // unrolled at import, each iteration's value static.
    auto unrolled = unrollLoop(ctx, maxTrip, cond, carriedValues);
    if (!unrolled)
      return ctx.error("loop-carried value " + std::to_string(c) + " " + inQuotesName(ctx, 2 + c) + " is " +
                       std::string(valueKindName(carriedValues[c].kind)) +
                       ", so the loop must be unrolled at import (Kiln resolves sequences and optionals at import), "
                       "but it cannot be: " +
                       unrolled.error().message());
    return {};
  }
  std::vector<Value*> carried;
  std::vector<TensorType> formal = {kI64Scalar, kBoolScalar};
  for (const ImportValue& v : carriedValues) {
    carried.push_back(v.tensor);
    formal.push_back(v.tensor->type());
  }
  const size_t numCarried = carried.size();
  auto body = importLoopBody(ctx, formal, numCarried);
  if (!body) {
    // A body that needs its iteration number at import time (a Slice
    // bounded by it: Kiln takes slice bounds as attributes) cannot be a
    // region; with a known trip count and condition it is unrolled.
    auto unrolled = unrollLoop(ctx, maxTrip, cond, carriedValues);
    if (!unrolled)
      return Error(body.error().message() + "; nor can it be unrolled: " + unrolled.error().message(),
                   body.error().location());
    return {};
  }
  Function& region = *body->body;
  // The body's condition must be a scalar; its outputs come from the body.
  {
    Builder b(region);
    Op* ret = region.returnOp();
    b.setInsertionPoint(ret);
    b.setLocation(ret->loc());
    auto next = bodyScalar(b, ret->operand(0), DType::Bool, "the condition the body gives", ctx);
    if (!next) return next.takeError();
    ret->setOperand(0, *next);
    std::vector<TensorType> types = region.resultTypes();
    types[0] = kBoolScalar;
    region.setResultTypes(std::move(types));
  }
  const std::vector<TensorType>& returned = region.resultTypes();
  const size_t numScans = returned.size() - 1 - numCarried;
  if (ctx.numOutputs() > numCarried + numScans)
    return ctx.error("has " + std::to_string(ctx.numOutputs()) + " outputs, but the body gives " +
                     std::to_string(numCarried) + " loop-carried and " + std::to_string(numScans) + " scan values");
  std::vector<TensorType> resultTypes;
  for (size_t c = 0; c < numCarried; ++c) resultTypes.push_back(region.argument(2 + c)->type());
  for (size_t s = 0; s < numScans; ++s) {
    TensorType stacked = returned[1 + numCarried + s];
    stacked.shape.insert(stacked.shape.begin(), Dim::unknown());
    resultTypes.push_back(std::move(stacked));
  }
  std::vector<Value*> operands = {maxTrip, cond};
  operands.insert(operands.end(), carried.begin(), carried.end());
  operands.insert(operands.end(), body->captures.begin(), body->captures.end());
  std::vector<std::unique_ptr<Function>> regions;
  regions.push_back(std::move(body->body));
  AttrMap attrs{{"num_carried", Attribute(static_cast<int64_t>(numCarried))}};
  auto results = emitRegionOp(ctx, OpKind::Loop, std::move(operands), std::move(attrs), std::move(resultTypes),
                                  std::move(regions));
  if (!results) return results.takeError();
  for (size_t i = 0; i < results->size(); ++i) ctx.setOutput(i, (*results)[i]);
  return {};
}

/// What one scan runs: the body's states and scan inputs, each scan input's
/// iteration axis and direction (1 = last row first).
struct ScanPlan {
  std::vector<int64_t> inputAxes, inputDirections;
  int64_t trips = 0;
};

/// Builds at `b` (in function `f`) a loop that scans `inputs` (rows along
/// plan.inputAxes) with `body` (the imported scan body: states, rows, then
/// its captures) from `states`; `captures` are `f`'s values for the body's
/// captures. Returns the final states and the scan values stacked along a
/// new axis 0 in iteration order.
Expected<std::vector<Value*>> buildScanLoop(NodeContext& ctx, Builder& b, const Function& body,
                                            std::span<Value* const> states, std::span<Value* const> inputs,
                                            std::span<Value* const> captures, const ScanPlan& plan) {
  const size_t numStates = states.size();
  const size_t numInputs = inputs.size();
  // The loop body: (i, cond, states..., scan inputs..., body captures...).
  auto wrapper = std::make_unique<Function>("");
  wrapper->setLoc(b.location());
  Value* iter = wrapper->addArgument(kI64Scalar);
  Value* condArg = wrapper->addArgument(kBoolScalar);
  std::vector<Value*> bodyArgs;
  for (Value* s : states) bodyArgs.push_back(wrapper->addArgument(s->type()));
  std::vector<Value*> inputArgs;
  for (Value* x : inputs) inputArgs.push_back(wrapper->addArgument(x->type()));
  std::vector<Value*> captureArgs;
  for (Value* c : captures) captureArgs.push_back(wrapper->addArgument(c->type()));
  Builder wb(*wrapper);
  wb.setLocation(b.location());
  Value* last = nullptr;
  for (size_t j = 0; j < numInputs; ++j) {
    Value* index = iter;
    if (plan.inputDirections[j]) {
      if (!last) last = wb.scalar(DType::I64, static_cast<double>(plan.trips - 1));
      KILN_TRY_VALUE(reversed, wb.value(OpKind::Sub, {last, iter}));
      index = reversed;
    }
    KILN_TRY_VALUE(row, wb.value(OpKind::Gather, {inputArgs[j], index},
                                 {{"axis", Attribute(plan.inputAxes[j])}}));
    bodyArgs.push_back(row);
  }
  bodyArgs.insert(bodyArgs.end(), captureArgs.begin(), captureArgs.end());
  if (bodyArgs.size() != body.numArguments())
    return ctx.error("internal: the scan body takes " + std::to_string(body.numArguments()) + " arguments, given " +
                     std::to_string(bodyArgs.size()));
  auto outputs = inlineBody(wb, body, bodyArgs);
  if (!outputs) return ctx.error(outputs.error().message());
  if (outputs->size() < numStates)
    return ctx.error("the body gives " + std::to_string(outputs->size()) + " outputs, fewer than its " +
                     std::to_string(numStates) + " state variables");
  std::vector<Value*> returned = {condArg};
  returned.insert(returned.end(), outputs->begin(), outputs->end());
  wb.ret(returned);

  std::vector<TensorType> resultTypes;
  for (size_t s = 0; s < numStates; ++s) {
    auto wide = widen(states[s]->type(), (*outputs)[s]->type());
    if (!wide || *wide != states[s]->type())
      return ctx.error("state variable " + std::to_string(s) + " enters the body as " + states[s]->type().str() +
                       " but leaves it as " + (*outputs)[s]->type().str());
    resultTypes.push_back(states[s]->type());
  }
  for (size_t k = numStates; k < outputs->size(); ++k) {
    TensorType stacked = (*outputs)[k]->type();
    stacked.shape.insert(stacked.shape.begin(), Dim::fixed(plan.trips));
    resultTypes.push_back(std::move(stacked));
  }
  std::vector<Value*> operands = {b.scalar(DType::I64, static_cast<double>(plan.trips)), b.scalar(DType::Bool, 1)};
  operands.insert(operands.end(), states.begin(), states.end());
  operands.insert(operands.end(), inputs.begin(), inputs.end());
  operands.insert(operands.end(), captures.begin(), captures.end());
  Op* loop = b.create(OpKind::Loop, std::move(operands), std::move(resultTypes),
                      {{"num_carried", Attribute(static_cast<int64_t>(numStates))}});
  loop->addRegion(std::move(wrapper));
  return loop->results();
}

/// Reads `name` (one int per scan input or output), defaulting to zeros.
Expected<std::vector<int64_t>> perValueInts(NodeContext& ctx, std::string_view name, size_t count) {
  auto values = ctx.intsAttr(name, std::vector<int64_t>(count, 0));
  if (!values) return values.takeError();
  if (values->size() != count)
    return ctx.error("attribute '" + std::string(name) + "' has " + std::to_string(values->size()) +
                     " values, expected " + std::to_string(count));
  for (int64_t d : *values)
    if (name.find("direction") != std::string_view::npos && d != 0 && d != 1)
      return ctx.error("attribute '" + std::string(name) + "' holds " + std::to_string(d) + ", expected 0 or 1");
  return values;
}

/// The scan inputs' static length along their axes, which must agree.
Expected<int64_t> scanLength(NodeContext& ctx, std::span<Value* const> inputs, const std::vector<int64_t>& axes) {
  int64_t trips = -1;
  for (size_t j = 0; j < inputs.size(); ++j) {
    const Dim& d = inputs[j]->type().shape[static_cast<size_t>(axes[j])];
    if (!d.isStatic())
      return ctx.error("scan input " + std::to_string(j) + " is " + inputs[j]->type().str() +
                       ": Kiln needs the length of the scanned axis at import time");
    if (trips >= 0 && d.size != trips)
      return ctx.error("scan inputs have lengths " + std::to_string(trips) + " and " + std::to_string(d.size) +
                       " along their scanned axes");
    trips = d.size;
  }
  if (trips < 0) return ctx.error("has no scan inputs");
  return trips;
}

TensorType withoutAxis(TensorType t, int64_t axis) {
  t.shape.erase(t.shape.begin() + axis);
  return t;
}

/// Scan, opset 9 and later: states and scan inputs without a batch dim.
Status convertScan9(NodeContext& ctx) {
  auto numScanAttr = ctx.intAttr("num_scan_inputs", -1);
  if (!numScanAttr) return numScanAttr.takeError();
  const int64_t numScanInputs = *numScanAttr;
  const size_t numInputs = ctx.numInputs();
  if (numScanInputs < 1 || static_cast<size_t>(numScanInputs) > numInputs)
    return ctx.error("num_scan_inputs is " + std::to_string(numScanInputs) + ", expected 1 to " +
                     std::to_string(numInputs));
  const size_t numScan = static_cast<size_t>(numScanInputs);
  const size_t numStates = numInputs - numScan;
  std::vector<Value*> states, inputs;
  for (size_t i = 0; i < numInputs; ++i) {
    KILN_TRY_VALUE(v, ctx.input(i));
    (i < numStates ? states : inputs).push_back(v);
  }
  ScanPlan plan;
  auto axes = perValueInts(ctx, "scan_input_axes", numScan);
  if (!axes) return axes.takeError();
  auto directions = perValueInts(ctx, "scan_input_directions", numScan);
  if (!directions) return directions.takeError();
  for (size_t j = 0; j < numScan; ++j) {
    auto axis = normalizeAxis(ctx, (*axes)[j], inputs[j]->type().rank(), "scan_input_axes");
    if (!axis) return axis.takeError();
    plan.inputAxes.push_back(*axis);
  }
  plan.inputDirections = *directions;
  auto trips = scanLength(ctx, inputs, plan.inputAxes);
  if (!trips) return trips.takeError();
  plan.trips = *trips;

  std::vector<TensorType> formal;
  for (Value* s : states) formal.push_back(s->type());
  for (size_t j = 0; j < numScan; ++j) formal.push_back(withoutAxis(inputs[j]->type(), plan.inputAxes[j]));
  auto body = ctx.importBody("body", formal);
  if (!body) return body.takeError();
  const size_t numOutputs = body->body->resultTypes().size() - std::min(numStates, body->body->resultTypes().size());

  auto built = buildScanLoop(ctx, ctx.builder(), *body->body, states, inputs, body->captures, plan);
  if (!built) return built.takeError();
  std::vector<Value*> results = std::move(*built);

  auto outAxes = perValueInts(ctx, "scan_output_axes", numOutputs);
  if (!outAxes) return outAxes.takeError();
  auto outDirections = perValueInts(ctx, "scan_output_directions", numOutputs);
  if (!outDirections) return outDirections.takeError();
  for (size_t k = 0; k < numOutputs; ++k) {
    Value*& v = results[numStates + k];
    if ((*outDirections)[k]) {
      // Stacked last iteration first.
      DenseTensor order = DenseTensor::zeros(TensorType{DType::I64, {Dim::fixed(plan.trips)}});
      for (int64_t t = 0; t < plan.trips; ++t) order.setInt(t, plan.trips - 1 - t);
      KILN_TRY_VALUE(reversed, ctx.emit(OpKind::Gather, {v, ctx.constant(std::move(order))},
                                        {{"axis", Attribute(int64_t{0})}}));
      v = reversed;
    }
    auto axis = normalizeAxis(ctx, (*outAxes)[k], v->type().rank(), "scan_output_axes");
    if (!axis) return axis.takeError();
    if (*axis != 0) {
      // Axis 0 (the iterations) moves to `axis`.
      std::vector<int64_t> perm;
      for (int64_t d = 1; d < v->type().rank(); ++d) perm.push_back(d);
      perm.insert(perm.begin() + *axis, 0);
      KILN_TRY_VALUE(moved, ctx.emit(OpKind::Transpose, {v}, {{"perm", Attribute(perm)}}));
      v = moved;
    }
  }
  for (size_t i = 0; i < results.size() && i < ctx.numOutputs(); ++i) ctx.setOutput(i, results[i]);
  return {};
}

/// Scan, opset 8: every state and scan input has a leading batch dim, and
/// each batch element is scanned on its own: a loop over the batch around
/// the loop over the rows.
Status convertScan8(NodeContext& ctx) {
  if (ctx.hasInput(0)) return ctx.error("sequence_lens is not supported (every sequence must have the full length)");
  auto numScanAttr = ctx.intAttr("num_scan_inputs", -1);
  if (!numScanAttr) return numScanAttr.takeError();
  const int64_t numScanInputs = *numScanAttr;
  const size_t numInputs = ctx.numInputs();
  if (numScanInputs < 1 || static_cast<size_t>(numScanInputs) > numInputs - 1)
    return ctx.error("num_scan_inputs is " + std::to_string(numScanInputs) + ", expected 1 to " +
                     std::to_string(numInputs - 1));
  const size_t numScan = static_cast<size_t>(numScanInputs);
  const size_t numStates = numInputs - 1 - numScan;
  std::vector<Value*> states, inputs;
  for (size_t i = 1; i < numInputs; ++i) {
    KILN_TRY_VALUE(v, ctx.input(i));
    if (v->type().rank() < (i <= numStates ? 1 : 2))
      return ctx.error("input " + std::to_string(i) + " is " + v->type().str() + ", which has no batch dim");
    (i <= numStates ? states : inputs).push_back(v);
  }
  const Dim batch = inputs[0]->type().shape[0];
  if (!batch.isStatic()) return ctx.error("Kiln needs the batch size of a Scan at import time");
  ScanPlan plan;
  auto directions = perValueInts(ctx, "directions", numScan);
  if (!directions) return directions.takeError();
  plan.inputDirections = *directions;
  plan.inputAxes.assign(numScan, 0);
  std::vector<TensorType> rowTypes;  // one batch element of each scan input
  for (Value* x : inputs) rowTypes.push_back(withoutAxis(x->type(), 0));
  {
    int64_t trips = -1;
    for (size_t j = 0; j < numScan; ++j) {
      const Dim& d = rowTypes[j].shape[0];
      if (!d.isStatic() || (trips >= 0 && d.size != trips))
        return ctx.error("the scan inputs need one static sequence length, got " + inputs[j]->type().str());
      trips = d.size;
    }
    plan.trips = trips;
  }
  std::vector<TensorType> formal;
  for (Value* s : states) formal.push_back(withoutAxis(s->type(), 0));
  for (const TensorType& t : rowTypes) formal.push_back(withoutAxis(t, 0));
  auto body = ctx.importBody("body", formal);
  if (!body) return body.takeError();

  // The batch loop's body: (b, cond, states..., inputs..., captures...) ->
  // (cond, final states of element b..., scan values of element b...).
  auto outer = std::make_unique<Function>("");
  Value* index = outer->addArgument(kI64Scalar);
  Value* condArg = outer->addArgument(kBoolScalar);
  std::vector<Value*> fullStates, fullInputs, captureArgs;
  for (Value* s : states) fullStates.push_back(outer->addArgument(s->type()));
  for (Value* x : inputs) fullInputs.push_back(outer->addArgument(x->type()));
  for (Value* c : body->captures) captureArgs.push_back(outer->addArgument(c->type()));
  Builder ob(*outer);
  std::vector<Value*> elementStates, elementInputs;
  const AttrMap axis0{{"axis", Attribute(int64_t{0})}};
  for (Value* s : fullStates) {
    KILN_TRY_VALUE(e, ob.value(OpKind::Gather, {s, index}, axis0));
    elementStates.push_back(e);
  }
  for (Value* x : fullInputs) {
    KILN_TRY_VALUE(e, ob.value(OpKind::Gather, {x, index}, axis0));
    elementInputs.push_back(e);
  }
  auto scanned = buildScanLoop(ctx, ob, *body->body, elementStates, elementInputs, captureArgs, plan);
  if (!scanned) return scanned.takeError();
  std::vector<Value*> returned = {condArg};
  returned.insert(returned.end(), scanned->begin(), scanned->end());
  ob.ret(returned);
  std::vector<TensorType> resultTypes;
  for (Value* v : *scanned) {
    TensorType t = v->type();
    t.shape.insert(t.shape.begin(), batch);
    resultTypes.push_back(std::move(t));
  }
  std::vector<Value*> operands = {ctx.scalar(DType::I64, static_cast<double>(batch.size)), ctx.scalar(DType::Bool, 1)};
  operands.insert(operands.end(), states.begin(), states.end());
  operands.insert(operands.end(), inputs.begin(), inputs.end());
  operands.insert(operands.end(), body->captures.begin(), body->captures.end());
  std::vector<std::unique_ptr<Function>> regions;
  regions.push_back(std::move(outer));
  // Every value is a scan value of the batch loop: nothing is carried.
  auto results = emitRegionOp(ctx, OpKind::Loop, std::move(operands), {{"num_carried", Attribute(int64_t{0})}},
                                  std::move(resultTypes), std::move(regions));
  if (!results) return results.takeError();
  for (size_t i = 0; i < results->size() && i < ctx.numOutputs(); ++i) ctx.setOutput(i, (*results)[i]);
  return {};
}

constexpr OpConverter kConverters[] = {
    {"", "If", 1, kNewest, &convertIf},
    {"", "Loop", 1, kNewest, &convertLoop},
    {"", "Scan", 8, 8, &convertScan8},
    {"", "Scan", 9, kNewest, &convertScan9},
};

}  // namespace

std::span<const OpConverter> controlFlowConverters() { return kConverters; }

}  // namespace kiln::onnx_import
