// splitAtHostOps (Stages.h): one walk that marks each op as prefix (no host
// op's result reaches it), host (a data-dependent or control-flow op the
// prefix feeds) or suffix (everything after), then copies the prefix and
// suffix ops into functions of their own, and a host `if`'s or `loop`'s
// regions into functions of their own; runStages, the run of the parts that
// the CPU and CUDA executors share.
#include "codegen/Stages.h"

#include <cstdint>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "runtime/ControlFlow.h"

namespace kiln::codegen {

namespace {

/// Copies `op` into `into`, its operands mapped through `map`, and maps its
/// results.
void copyOp(const Op& op, Function& into, std::unordered_map<const Value*, Value*>& map) {
  std::vector<Value*> operands;
  for (Value* v : op.operands()) operands.push_back(map.at(v));
  std::vector<TensorType> types;
  for (Value* r : op.results()) types.push_back(r->type());
  Op* copy = into.insert(nullptr, Op::create(op.kind(), std::move(operands), std::move(types), op.attrs(), op.loc()));
  for (size_t i = 0; i < op.numResults(); ++i) {
    copy->result(i)->setName(op.result(i)->name());
    map[op.result(i)] = copy->result(i);
  }
  for (size_t r = 0; r < op.numRegions(); ++r) copy->addRegion(op.region(r)->clone());
}

bool runsOnHost(const Op& op) { return op.info().hasDataDependentShape() || op.info().isControlFlow(); }

/// The host step of `if` or `loop` `op` of `f`, the `index`-th such op:
/// its regions as functions of their own, named for errors (`@f.loop0.body`).
Expected<FunctionStages::HostOp> controlFlowStep(const Op& op, const Function& f, size_t index) {
  FunctionStages::HostOp host;
  host.name = std::string(op.name());
  host.kind = op.kind();
  host.loc = op.loc();
  if (op.kind() == OpKind::Loop) host.numCarried = op.getInt("num_carried");
  for (const Value* r : op.results()) host.resultTypes.push_back(r->type());
  const size_t wantRegions = op.kind() == OpKind::If ? 2 : 1;
  if (op.numRegions() != wantRegions)
    return op.emitError("has " + std::to_string(op.numRegions()) + " regions, expected " + std::to_string(wantRegions));
  for (size_t r = 0; r < wantRegions; ++r) {
    std::unique_ptr<Function> body = op.region(r)->clone();
    const char* role = op.kind() == OpKind::Loop ? "body" : r == 0 ? "then" : "else";
    body->setName(f.name() + "." + host.name + std::to_string(index) + "." + role);
    if (!body->returnOp()) return op.emitError("has a region with no 'return'");
    auto module = std::make_unique<Module>();
    module->addFunction(std::move(body));
    host.bodies.push_back(std::move(module));
  }
  return host;
}

}  // namespace

bool hasHostOps(const Function& f) {
  for (const auto& op : f.ops())
    if (runsOnHost(*op)) return true;
  return false;
}

Expected<std::optional<FunctionStages>> splitAtHostOps(const Function& f) {
  enum class Part : uint8_t { Prefix, Host, Suffix };
  std::unordered_map<const Op*, Part> part;
  std::unordered_set<const Value*> late;  // values a host op's result reaches
  bool any = false;
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return) continue;
    bool reached = false;
    for (Value* v : op->operands()) reached = reached || late.count(v);
    const bool host = runsOnHost(*op);
    any = any || host;
    part[op.get()] = reached ? Part::Suffix : host ? Part::Host : Part::Prefix;
    if (reached || host)
      for (Value* r : op->results()) late.insert(r);
  }
  if (!any) return std::optional<FunctionStages>{};

  FunctionStages stages;
  // Where each value the later parts read is found; prefix values get a
  // prefix result the first time one is read.
  std::unordered_map<const Value*, StageValue> found;
  for (size_t i = 0; i < f.numArguments(); ++i) found[f.argument(i)] = {StageValue::From::Argument, i, 0};
  std::vector<const Value*> prefixResults;
  auto locate = [&](const Value* v) -> StageValue {
    if (auto it = found.find(v); it != found.end()) return it->second;
    // Only a prefix value is not found yet.
    StageValue s{StageValue::From::Prefix, prefixResults.size(), 0};
    prefixResults.push_back(v);
    return found[v] = s;
  };

  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return || part.at(op.get()) != Part::Host) continue;
    FunctionStages::HostOp host;
    if (op->info().isControlFlow()) {
      auto step = controlFlowStep(*op, f, stages.host.size());
      if (!step) return step.takeError();
      host = std::move(*step);
    } else {
      auto described = dataDependentOpOf(*op);
      if (!described) return described.takeError();
      host.op = *described;
      host.name = std::string(op->name());
      host.kind = op->kind();
      host.loc = op->loc();
    }
    for (Value* v : op->operands()) host.operands.push_back(locate(v));
    for (size_t r = 0; r < op->numResults(); ++r)
      found[op->result(r)] = {StageValue::From::Host, stages.host.size(), r};
    stages.host.push_back(std::move(host));
  }

  // The suffix: its arguments are the values its ops read that it does not
  // define, in order of first use; its results are the original results
  // its ops compute. The others (arguments, prefix and host results) pass
  // it by, so that a host result's size (a loop's scan stack) returned as
  // it is does not compile the suffix again.
  auto suffix = std::make_unique<Function>(f.name() + ".after");
  suffix->setLoc(f.loc());
  std::unordered_map<const Value*, Value*> suffixMap;
  std::unordered_set<const Value*> suffixDefined;
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return || part.at(op.get()) != Part::Suffix) continue;
    for (Value* v : op->operands()) {
      if (suffixMap.count(v)) continue;
      stages.suffixInputs.push_back(locate(v));
      suffixMap[v] = suffix->addArgument(v->type(), v->name());
    }
    copyOp(*op, *suffix, suffixMap);
    for (Value* r : op->results()) suffixDefined.insert(r);
  }
  std::vector<Value*> suffixResults;
  std::vector<TensorType> suffixTypes;
  std::vector<std::string> suffixNames;
  if (const Op* ret = f.returnOp()) {
    for (size_t i = 0; i < ret->numOperands(); ++i) {
      Value* v = ret->operand(i);
      if (!suffixDefined.count(v)) {
        stages.results.push_back(locate(v));
        continue;
      }
      stages.results.push_back({StageValue::From::Suffix, suffixResults.size(), 0});
      suffixResults.push_back(suffixMap.at(v));
      suffixTypes.push_back(i < f.resultTypes().size() ? f.resultTypes()[i] : v->type());
      suffixNames.push_back(i < f.resultTypes().size() ? f.resultName(i) : std::string());
    }
  }
  // Suffix ops no result reads are dead: no suffix then.
  if (!suffixResults.empty()) {
    suffix->insert(nullptr, Op::create(OpKind::Return, std::move(suffixResults), {}, {}, f.loc()));
    suffix->setResultTypes(std::move(suffixTypes));
    for (size_t i = 0; i < suffixNames.size(); ++i) suffix->setResultName(i, suffixNames[i]);
    stages.suffix = std::make_unique<Module>();
    stages.suffix->addFunction(std::move(suffix));
  } else {
    stages.suffixInputs.clear();
  }

  // The prefix: every prefix op (dead ones are left to the pipeline's DCE),
  // returning the values the later parts read.
  if (!prefixResults.empty()) {
    auto prefix = std::make_unique<Function>(f.name() + ".before");
    prefix->setLoc(f.loc());
    std::unordered_map<const Value*, Value*> map;
    for (size_t i = 0; i < f.numArguments(); ++i) {
      map[f.argument(i)] = prefix->addArgument(f.argument(i)->type(), f.argument(i)->name());
    }
    for (const auto& op : f.ops())
      if (op->kind() != OpKind::Return && part.at(op.get()) == Part::Prefix) copyOp(*op, *prefix, map);
    std::vector<Value*> results;
    std::vector<TensorType> types;
    for (const Value* v : prefixResults) {
      results.push_back(map.at(v));
      types.push_back(v->type());
    }
    prefix->insert(nullptr, Op::create(OpKind::Return, std::move(results), {}, {}, f.loc()));
    prefix->setResultTypes(std::move(types));
    stages.prefix = std::make_unique<Module>();
    stages.prefix->addFunction(std::move(prefix));
  }
  return std::optional<FunctionStages>{std::move(stages)};
}

Status checkInputs(const Function& f, const std::vector<Tensor>& inputs) {
  if (inputs.size() != f.numArguments())
    return Error("function '" + f.name() + "' takes " + std::to_string(f.numArguments()) + " inputs, got " +
                 std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = f.argument(i)->type();
    bool fits = inputs[i].dtype() == want.dtype && inputs[i].rank() == want.rank();
    for (int64_t d = 0; fits && d < want.rank(); ++d)
      fits = !want.shape[d].isStatic() || want.shape[d].size == inputs[i].shape()[d];
    if (!fits)
      return Error("input " + std::to_string(i) + " of '" + f.name() + "' is " + inputs[i].type().str() +
                   ", expected " + want.str());
  }
  return {};
}

std::optional<std::vector<Tensor>> staticArgumentsOf(const Function& f) {
  std::vector<Tensor> example;
  for (const Value* a : f.arguments()) {
    if (!a->type().isStatic()) return std::nullopt;
    example.emplace_back(a->type().dtype, staticDims(a->type().shape));
  }
  return example;
}

std::string whyStaged(const FunctionStages& stages) {
  const FunctionStages::HostOp& first = stages.host.front();
  if (first.isControlFlow()) return "has control flow (" + first.name + ")";
  return "has ops whose result sizes depend on values (" + first.name + ")";
}

Error notOneProgram(const std::string& name, const FunctionStages& stages) {
  if (stages.host.front().isControlFlow())
    return Error("'" + name + "' " + whyStaged(stages) +
                 ": it runs as compiled stages with that op on the host between them and each of its bodies compiled "
                 "as a program of its own, not as one program (docs/codegen.md section 7)");
  return Error("'" + name + "' " + whyStaged(stages) +
               ": it runs as compiled stages with those ops on the host between them, one program per size they "
               "give, not as one program (docs/codegen.md section 6)");
}

Expected<std::vector<Tensor>> runStages(const Function& f, const FunctionStages& stages,
                                        const std::vector<Tensor>& inputs, const StageRunners& runners) {
  // The host ops may read arguments directly, so every input is checked
  // against its argument's type here, not only by the prefix's executor.
  KILN_TRY(checkInputs(f, inputs));
  std::vector<Tensor> before;
  if (stages.prefix) {
    auto ran = runners.prefix(inputs);
    if (!ran) return ran.takeError();
    before = std::move(*ran);
  }
  std::vector<std::vector<Tensor>> host(stages.host.size());
  auto at = [&](const StageValue& v) -> const Tensor& {
    switch (v.from) {
      case StageValue::From::Argument: return inputs[v.index];
      case StageValue::From::Prefix: return before[v.index];
      case StageValue::From::Host:
      case StageValue::From::Suffix: break;
    }
    return host[v.index][v.result];
  };
  for (size_t i = 0; i < stages.host.size(); ++i) {
    const FunctionStages::HostOp& op = stages.host[i];
    std::vector<const Tensor*> operands;
    for (const StageValue& v : op.operands) operands.push_back(&at(v));
    Expected<std::vector<Tensor>> results = std::vector<Tensor>{};
    if (!op.isControlFlow()) {
      // Its results are as large as the values make them: memory that runs
      // out is this op's error.
      try {
        results = runDataDependentOp(op.op, operands);
      } catch (const std::bad_alloc&) {
        results =
            Error("'" + op.name + "' cannot allocate its results, whose sizes its operands' values give: out of memory",
                  op.loc);
      }
    } else {
      // The bodies run compiled, by the executor's runner of each.
      BodyRunner runBody = [&](size_t region, std::vector<Tensor> bodyInputs) -> Expected<std::vector<Tensor>> {
        if (region >= op.bodies.size())
          return Error("'" + op.name + "' has no region " + std::to_string(region) + " to run", op.loc);
        KILN_TRY(checkInputs(*op.bodies[region]->functions().front(), bodyInputs));
        return runners.body(i, region, bodyInputs);
      };
      if (op.kind == OpKind::If)
        results = runIf(operands, op.resultTypes.size(), runBody, op.loc);
      else
        results = runLoop(operands, op.numCarried, op.resultTypes, runBody, op.loc);
    }
    if (!results) return results.takeError();
    host[i] = std::move(*results);
  }
  std::vector<Tensor> after;
  if (stages.suffix) {
    // TODO(kiln): bucket data-dependent sizes (pad to a bound) so that the
    // suffix compiles once for counts that vary from run to run.
    std::vector<Tensor> suffixInputs;
    for (const StageValue& v : stages.suffixInputs) suffixInputs.push_back(at(v));
    auto ran = runners.suffix(suffixInputs);
    if (!ran) return ran.takeError();
    after = std::move(*ran);
  }
  std::vector<Tensor> outputs;
  std::vector<size_t> movedTo(after.size(), SIZE_MAX);  // a suffix result returned twice is copied
  for (const StageValue& v : stages.results) {
    if (v.from != StageValue::From::Suffix) {
      outputs.push_back(at(v));
      continue;
    }
    if (v.index >= after.size())
      return Error("the suffix of '" + f.name() + "' gave " + std::to_string(after.size()) + " results");
    if (movedTo[v.index] != SIZE_MAX) {
      outputs.push_back(outputs[movedTo[v.index]]);
      continue;
    }
    movedTo[v.index] = outputs.size();
    outputs.push_back(std::move(after[v.index]));
  }
  return outputs;
}

}  // namespace kiln::codegen
