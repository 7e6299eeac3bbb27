// splitAtHostOps (Stages.h): one walk that marks each op as prefix (no host
// op's result reaches it), host (a data-dependent or control-flow op the
// prefix feeds) or suffix (everything after), then copies the prefix and
// suffix ops into functions of their own, and a host `if`'s or `loop`'s
// regions into functions of their own; runStages over the runtime's stage
// driver (runtime/StageDriver.h); compileStagedProgram, every part compiled
// for the shapes known at compile time into one StagedProgram.
#include "codegen/Stages.h"

#include <cstdint>
#include <new>
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

/// The host step of `if` or `loop` `op` of `f`, the `index`-th such op, and
/// its regions as functions of their own, named for errors
/// (`@f.loop0.body`).
Status controlFlowStep(const Op& op, const Function& f, size_t index, HostStep& host,
                       std::vector<std::unique_ptr<Module>>& bodies) {
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
    bodies.push_back(std::move(module));
    host.bodies.push_back(static_cast<int>(r));
  }
  return {};
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

  FunctionStages split;
  Stages& stages = split.layout;
  stages.name = f.name();
  for (const Value* a : f.arguments()) stages.argumentTypes.push_back(a->type());
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
    HostStep host;
    std::vector<std::unique_ptr<Module>> bodies;
    if (op->info().isControlFlow()) {
      KILN_TRY(controlFlowStep(*op, f, stages.host.size(), host, bodies));
    } else {
      auto described = dataDependentOpOf(*op);
      if (!described) return described.takeError();
      host.op = *described;
      host.name = std::string(op->name());
      host.kind = op->kind();
      host.loc = op->loc();
      for (const Value* r : op->results()) host.resultTypes.push_back(r->type());
    }
    for (Value* v : op->operands()) host.operands.push_back(locate(v));
    for (size_t r = 0; r < op->numResults(); ++r)
      found[op->result(r)] = {StageValue::From::Host, stages.host.size(), r};
    stages.host.push_back(std::move(host));
    split.bodies.push_back(std::move(bodies));
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
    split.suffix = std::make_unique<Module>();
    split.suffix->addFunction(std::move(suffix));
    stages.suffix = 0;
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
    split.prefix = std::make_unique<Module>();
    split.prefix->addFunction(std::move(prefix));
    stages.prefix = 0;
  }
  return std::optional<FunctionStages>{std::move(split)};
}

Status checkInputs(const Function& f, const std::vector<Tensor>& inputs) {
  std::vector<TensorType> types;
  for (const Value* a : f.arguments()) types.push_back(a->type());
  return checkStageInputs(f.name(), types, inputs);
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
  const HostStep& first = stages.layout.host.front();
  if (first.isControlFlow()) return "has control flow (" + first.name + ")";
  return "has ops whose result sizes depend on values (" + first.name + ")";
}

Error notOneProgram(const std::string& name, const FunctionStages& stages) {
  if (stages.layout.host.front().isControlFlow())
    return Error("'" + name + "' " + whyStaged(stages) +
                 ": it runs as compiled stages with that op on the host between them and each of its bodies compiled "
                 "as a program of its own, not as one program (docs/codegen.md section 7)");
  return Error("'" + name + "' " + whyStaged(stages) +
               ": it runs as compiled stages with those ops on the host between them, one program per size they "
               "give, not as one program (docs/codegen.md section 6)");
}

Expected<std::vector<Tensor>> runStages(const FunctionStages& stages, const std::vector<Tensor>& inputs,
                                        const StageRunners& runners) {
  // The bodies' inputs are checked against their functions' arguments
  // here: the driver knows only the parts' runners.
  StageRunners checked = runners;
  checked.body = [&](size_t host, size_t region, const std::vector<Tensor>& in) -> Expected<std::vector<Tensor>> {
    KILN_TRY(checkInputs(stages.body(host, region), in));
    return runners.body(host, region, in);
  };
  return kiln::runStages(stages.layout, inputs, checked);
}

namespace {

/// Builds a StagedProgram part by part, each part after the part that
/// refers to it (compileStagedProgram).
class StagedBuilder {
 public:
  StagedBuilder(StagedProgram& out, std::string& plans, const PartCompiler& compile)
      : out_(out), plans_(plans), compile_(compile) {}

  /// The part that runs `f` on `types`; `results` receives its result types.
  Expected<int> part(const Function& f, const std::vector<TensorType>& types, std::vector<TensorType>& results) {
    if (hasHostOps(f)) return staged(f, types, results);
    auto compiled = compile_(f, types, out_.programs.size());
    if (!compiled) return compiled.takeError();
    const Program& p = *compiled->program;
    for (const Program::Result& r : p.results) results.push_back(p.slots[static_cast<size_t>(r.slot)].type);
    const int index = static_cast<int>(out_.parts.size());
    out_.parts.push_back({StagedProgram::Part::Kind::Program, out_.programs.size()});
    out_.programs.push_back(p);
    out_.deviceCode.push_back(compiled->code);
    plans_ += "memory plan @" + p.name + ": " + std::to_string(compiled->plan.numKernels) + " kernels\n" +
              compiled->plan.str();
    return index;
  }

 private:
  /// The shape a part needs but the compile cannot know: an error naming
  /// the host step that gives it and why.
  static Error notStatic(const Function& f, const HostStep& step, const std::string& what, const TensorType& type) {
    const std::string why = step.isControlFlow()
                                ? "is known only at run time (it depends on how often '" + step.name + "' runs)"
                                : "depends on the values '" + step.name + "' computes";
    return Error("'" + f.name() + "' cannot be stored as a .kc: " + what + " has type " + type.str() +
                     ", whose size " + why +
                     ", and a .kc holds every part compiled for shapes known at compile time; run the model "
                     "itself (kiln run MODEL.onnx), which compiles each part for the shapes a run gives",
                 step.loc);
  }

  Expected<int> staged(const Function& f, const std::vector<TensorType>& types, std::vector<TensorType>& results) {
    auto split = splitAtHostOps(f);
    if (!split) return split.takeError();
    FunctionStages& fs = **split;
    Stages node = fs.layout;
    node.argumentTypes = types;
    const int me = static_cast<int>(out_.parts.size());
    const size_t stagesIndex = out_.stages.size();
    out_.parts.push_back({StagedProgram::Part::Kind::Stages, stagesIndex});
    out_.stages.emplace_back();

    std::vector<TensorType> prefixTypes, suffixTypes;
    std::vector<std::vector<TensorType>> hostTypes(node.host.size());
    auto typeOf = [&](const StageValue& v) -> TensorType {
      switch (v.from) {
        case StageValue::From::Argument: return types.at(v.index);
        case StageValue::From::Prefix: return prefixTypes.at(v.index);
        case StageValue::From::Host: return hostTypes.at(v.index).at(v.result);
        case StageValue::From::Suffix: break;
      }
      return suffixTypes.at(v.index);
    };
    if (fs.prefix) {
      auto p = part(*fs.prefix->functions().front(), types, prefixTypes);
      if (!p) return p.takeError();
      node.prefix = *p;
    }
    for (size_t h = 0; h < node.host.size(); ++h) {
      HostStep& step = node.host[h];
      std::vector<TensorType> operandTypes;
      for (const StageValue& v : step.operands) operandTypes.push_back(typeOf(v));
      if (!step.isControlFlow()) {
        hostTypes[h] = step.resultTypes;  // sizes the values give
        continue;
      }
      std::vector<std::vector<TensorType>> regionResults;
      for (size_t r = 0; r < step.bodies.size(); ++r) {
        const Function& body = fs.body(h, r);
        const std::string role = step.kind == OpKind::Loop ? "the body of '" + step.name + "'"
                                 : r == 0                  ? "the then branch of '" + step.name + "'"
                                                           : "the else branch of '" + step.name + "'";
        // A region takes its op's operands: an `if` its captures, a `loop`
        // the iteration number, the condition, the carried values and its
        // captures.
        std::vector<TensorType> bodyTypes;
        if (step.kind == OpKind::If) {
          bodyTypes.assign(operandTypes.begin() + (operandTypes.empty() ? 0 : 1), operandTypes.end());
        } else {
          bodyTypes = {TensorType{DType::I64, {}}, TensorType{DType::Bool, {}}};
          if (operandTypes.size() >= 2) bodyTypes.insert(bodyTypes.end(), operandTypes.begin() + 2, operandTypes.end());
        }
        if (bodyTypes.size() != body.numArguments())
          return Error(role + " takes " + std::to_string(body.numArguments()) + " values, its op gives " +
                           std::to_string(bodyTypes.size()),
                       step.loc);
        for (size_t a = 0; a < bodyTypes.size(); ++a)
          if (!bodyTypes[a].isStatic()) {
            for (const StageValue& v : step.operands)
              if (v.from == StageValue::From::Host && !typeOf(v).isStatic())
                return notStatic(f, node.host[v.index], role + "'s input " + std::to_string(a), bodyTypes[a]);
            return Error("'" + f.name() + "' cannot be stored as a .kc: " + role + "'s input " + std::to_string(a) +
                             " has type " + bodyTypes[a].str() + ", not known at compile time",
                         step.loc);
          }
        std::vector<TensorType> bodyResults;
        auto b = part(body, bodyTypes, bodyResults);
        if (!b) return b.takeError();
        step.bodies[r] = *b;
        if (step.kind == OpKind::Loop) {
          for (int64_t c = 0; c < step.numCarried && static_cast<size_t>(c + 1) < bodyResults.size(); ++c)
            if (bodyResults[1 + c] != bodyTypes[2 + c])
              return Error("'" + f.name() + "' cannot be stored as a .kc: carried value " + std::to_string(c) +
                               " of '" + step.name + "' enters its body as " + bodyTypes[2 + c].str() +
                               " and leaves it as " + bodyResults[1 + c].str() +
                               ": its shape changes between iterations, and a .kc holds the body compiled for one "
                               "shape; run the model itself (kiln run MODEL.onnx)",
                           step.loc);
        }
        regionResults.push_back(std::move(bodyResults));
      }
      if (step.kind == OpKind::If) {
        if (regionResults[0] != regionResults[1]) {
          std::string then, otherwise;
          for (const TensorType& t : regionResults[0]) then += (then.empty() ? "" : ", ") + t.str();
          for (const TensorType& t : regionResults[1]) otherwise += (otherwise.empty() ? "" : ", ") + t.str();
          return Error("'" + f.name() + "' cannot be stored as a .kc: the branches of '" + step.name +
                           "' give results of different shapes (then: " + then + "; else: " + otherwise +
                           "), so the shapes after it are known only at run time; run the model itself (kiln run "
                           "MODEL.onnx)",
                       step.loc);
        }
        hostTypes[h] = regionResults[0];
      } else {
        // The carried values keep their types; a scan stack is as long as
        // the loop runs.
        const std::vector<TensorType>& body = regionResults[0];
        for (int64_t c = 0; c < step.numCarried; ++c) hostTypes[h].push_back(operandTypes.at(2 + c));
        for (size_t s = 1 + static_cast<size_t>(step.numCarried); s < body.size(); ++s) {
          TensorType stacked = body[s];
          stacked.shape.insert(stacked.shape.begin(), Dim::unknown());
          hostTypes[h].push_back(stacked);
        }
        if (hostTypes[h].size() != step.resultTypes.size())
          return Error("the body of '" + step.name + "' gives " + std::to_string(body.size()) + " values for " +
                           std::to_string(step.resultTypes.size()) + " results",
                       step.loc);
      }
    }
    if (fs.suffix) {
      std::vector<TensorType> inputTypes;
      for (size_t k = 0; k < node.suffixInputs.size(); ++k) {
        const StageValue& v = node.suffixInputs[k];
        TensorType t = typeOf(v);
        if (!t.isStatic()) {
          if (v.from == StageValue::From::Host)
            return notStatic(f, node.host[v.index],
                             "the ops after '" + node.host[v.index].name + "' read its result " +
                                 std::to_string(v.result) + ", which",
                             t);
          return Error("'" + f.name() + "' cannot be stored as a .kc: its ops after the host steps read a value of type " +
                       t.str() + ", not known at compile time");
        }
        inputTypes.push_back(std::move(t));
      }
      auto s = part(*fs.suffix->functions().front(), inputTypes, suffixTypes);
      if (!s) return s.takeError();
      node.suffix = *s;
    }
    for (const StageValue& v : node.results) results.push_back(typeOf(v));
    out_.stages[stagesIndex] = std::move(node);
    return me;
  }

  StagedProgram& out_;
  std::string& plans_;
  const PartCompiler& compile_;
};

}  // namespace

Expected<StagedCompilation> compileStagedProgram(const Function& f, const std::vector<TensorType>& types,
                                                 const PartCompiler& compile) {
  if (!hasHostOps(f)) return Error("'" + f.name() + "' has no host steps to compile in stages");
  if (types.size() != f.numArguments())
    return Error("function '" + f.name() + "' takes " + std::to_string(f.numArguments()) + " inputs, got " +
                 std::to_string(types.size()));
  StagedCompilation compilation;
  compilation.program = std::make_shared<StagedProgram>();
  StagedProgram& out = *compilation.program;
  out.name = f.name();
  for (size_t i = 0; i < f.numArguments(); ++i) {
    if (!types[i].isStatic()) return Error("input " + std::to_string(i) + " of '" + f.name() + "' has no static shape");
    Program::Argument a;
    a.name = f.argument(i)->name();
    a.type = types[i];
    if (const DenseTensor* d = f.argumentDefault(i)) {
      auto value = Tensor::copyOf(*d, "the default of argument %" + a.name);
      if (!value) return value.takeError();
      a.hasDefault = true;
      a.defaultValue = std::move(*value);
    }
    out.arguments.push_back(std::move(a));
  }
  StagedBuilder builder(out, compilation.plans, compile);
  std::vector<TensorType> results;
  auto entry = builder.part(f, types, results);
  if (!entry) return entry.takeError();
  out.resultTypes = results;
  for (size_t i = 0; i < results.size(); ++i)
    out.resultNames.push_back(i < f.resultTypes().size() ? f.resultName(i) : std::string());
  KILN_TRY(out.validate());
  return compilation;
}

}  // namespace kiln::codegen
