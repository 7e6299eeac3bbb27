// splitAtHostOps (Stages.h): one walk that marks each op as prefix (no host
// op's result reaches it), host (a data-dependent or control-flow op the
// prefix feeds) or suffix (everything after), then copies the prefix and
// suffix ops into functions of their own, and a host `if`'s or `loop`'s
// regions into functions of their own.
#include "codegen/Stages.h"

#include <unordered_map>
#include <unordered_set>

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
    return op.emitError("has " + std::to_string(op.numRegions()) + " regions, expected " +
                        std::to_string(wantRegions));
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

}  // namespace kiln::codegen
