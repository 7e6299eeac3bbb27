// splitAtDataDependentOps (Stages.h): one walk that marks each op as prefix
// (no data-dependent result reaches it), host (a data-dependent op the
// prefix feeds) or suffix (everything after), then copies the prefix and
// suffix ops into functions of their own.
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
  if (op.region()) copy->setRegion(op.region()->clone());
}

}  // namespace

Expected<std::optional<FunctionStages>> splitAtDataDependentOps(const Function& f) {
  enum class Part : uint8_t { Prefix, Host, Suffix };
  std::unordered_map<const Op*, Part> part;
  std::unordered_set<const Value*> late;  // values a data-dependent op's result reaches
  bool any = false;
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return) continue;
    bool reached = false;
    for (Value* v : op->operands()) reached = reached || late.count(v);
    const bool dataDependent = op->info().hasDataDependentShape();
    any = any || dataDependent;
    part[op.get()] = reached ? Part::Suffix : dataDependent ? Part::Host : Part::Prefix;
    if (reached || dataDependent)
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
    auto described = dataDependentOpOf(*op);
    if (!described) return described.takeError();
    FunctionStages::HostOp host{*described, std::string(op->name()), {}};
    for (Value* v : op->operands()) host.operands.push_back(locate(v));
    for (size_t r = 0; r < op->numResults(); ++r)
      found[op->result(r)] = {StageValue::From::Host, stages.host.size(), r};
    stages.host.push_back(std::move(host));
  }

  // The suffix: its arguments are the values its ops (and the return) read
  // that it does not define, in order of first use.
  auto suffix = std::make_unique<Function>(f.name() + ".after");
  suffix->setLoc(f.loc());
  std::unordered_map<const Value*, Value*> suffixMap;
  bool suffixHasOps = false;
  auto suffixValue = [&](Value* v) {
    if (suffixMap.count(v)) return;
    stages.suffixInputs.push_back(locate(v));
    suffixMap[v] = suffix->addArgument(v->type(), v->name());
  };
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Return && part.at(op.get()) != Part::Suffix) continue;
    for (Value* v : op->operands()) suffixValue(v);
    if (op->kind() == OpKind::Return) {
      if (!suffixHasOps) break;
      copyOp(*op, *suffix, suffixMap);
      continue;
    }
    copyOp(*op, *suffix, suffixMap);
    suffixHasOps = true;
  }
  if (suffixHasOps) {
    suffix->setResultTypes(f.resultTypes());
    for (size_t i = 0; i < f.resultTypes().size(); ++i) suffix->setResultName(i, f.resultName(i));
    stages.suffix = std::make_unique<Module>();
    stages.suffix->addFunction(std::move(suffix));
  } else {
    stages.suffixInputs.clear();
    if (const Op* ret = f.returnOp())
      for (Value* v : ret->operands()) stages.results.push_back(locate(v));
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
