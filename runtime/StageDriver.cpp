// The stage driver of StageDriver.h: runStages, moved out of the compiler so
// that a stored staged program runs with no IR module (the bodies' argument
// types come from their sub-programs), and StagedRunner.
#include "runtime/StageDriver.h"

#include <cstdint>
#include <new>

#include "runtime/ControlFlow.h"
#include "runtime/DataDependent.h"

namespace kiln {

Status checkStageInputs(const std::string& name, const std::vector<TensorType>& types,
                        const std::vector<Tensor>& inputs) {
  if (inputs.size() != types.size())
    return Error("function '" + name + "' takes " + std::to_string(types.size()) + " inputs, got " +
                 std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = types[i];
    bool fits = inputs[i].dtype() == want.dtype && inputs[i].rank() == want.rank();
    for (int64_t d = 0; fits && d < want.rank(); ++d)
      fits = !want.shape[d].isStatic() || want.shape[d].size == inputs[i].shape()[d];
    if (!fits)
      return Error("input " + std::to_string(i) + " of '" + name + "' is " + inputs[i].type().str() + ", expected " +
                   want.str());
  }
  return {};
}

Expected<std::vector<Tensor>> runStages(const Stages& stages, const std::vector<Tensor>& inputs,
                                        const StageRunners& runners) {
  KILN_TRY(checkStageInputs(stages.name, stages.argumentTypes, inputs));
  std::vector<Tensor> before;
  if (stages.prefix != -1) {
    auto ran = runners.prefix(inputs);
    if (!ran) return ran.takeError();
    before = std::move(*ran);
  }
  std::vector<std::vector<Tensor>> host(stages.host.size());
  std::vector<Tensor> after;
  // Every value is looked up checked: stages read from a file are
  // validated, but what a part returns is known only now.
  auto at = [&](const StageValue& v, size_t hostsRun) -> Expected<const Tensor*> {
    const std::vector<Tensor>* from = nullptr;
    size_t index = v.index;
    switch (v.from) {
      case StageValue::From::Argument: from = &inputs; break;
      case StageValue::From::Prefix: from = &before; break;
      case StageValue::From::Host:
        if (v.index < hostsRun) from = &host[v.index];
        index = v.result;
        break;
      case StageValue::From::Suffix: from = &after; break;
    }
    if (!from || index >= from->size())
      return Error("the stages of '" + stages.name + "' read a value that no part gave (place " +
                   std::to_string(static_cast<int>(v.from)) + ", index " + std::to_string(v.index) + ", result " +
                   std::to_string(v.result) + ")");
    return &(*from)[index];
  };
  for (size_t i = 0; i < stages.host.size(); ++i) {
    const HostStep& op = stages.host[i];
    std::vector<const Tensor*> operands;
    for (const StageValue& v : op.operands) {
      auto t = at(v, i);
      if (!t) return t.takeError();
      operands.push_back(*t);
    }
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
      BodyRunner runBody = [&](size_t region, std::vector<Tensor> bodyInputs) -> Expected<std::vector<Tensor>> {
        if (region >= op.bodies.size())
          return Error("'" + op.name + "' has no region " + std::to_string(region) + " to run", op.loc);
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
  if (stages.suffix != -1) {
    // TODO(kiln): bucket data-dependent sizes (pad to a bound) so that the
    // suffix compiles once for counts that vary from run to run.
    std::vector<Tensor> suffixInputs;
    for (const StageValue& v : stages.suffixInputs) {
      if (v.from == StageValue::From::Suffix) return Error("the suffix of '" + stages.name + "' reads its own result");
      auto t = at(v, host.size());
      if (!t) return t.takeError();
      suffixInputs.push_back(**t);
    }
    auto ran = runners.suffix(suffixInputs);
    if (!ran) return ran.takeError();
    after = std::move(*ran);
  }
  std::vector<Tensor> outputs;
  std::vector<size_t> movedTo(after.size(), SIZE_MAX);  // a suffix result returned twice is copied
  for (const StageValue& v : stages.results) {
    if (v.from != StageValue::From::Suffix) {
      auto t = at(v, host.size());
      if (!t) return t.takeError();
      outputs.push_back(**t);
      continue;
    }
    if (v.index >= after.size())
      return Error("the suffix of '" + stages.name + "' gave " + std::to_string(after.size()) + " results");
    if (movedTo[v.index] != SIZE_MAX) {
      outputs.push_back(outputs[movedTo[v.index]]);
      continue;
    }
    movedTo[v.index] = outputs.size();
    outputs.push_back(std::move(after[v.index]));
  }
  return outputs;
}

Expected<std::unique_ptr<StagedRunner>> StagedRunner::create(std::shared_ptr<const StagedProgram> program,
                                                             const PartLoader& load) {
  KILN_TRY(program->validate());
  std::unique_ptr<StagedRunner> runner(new StagedRunner());
  for (size_t i = 0; i < program->programs.size(); ++i) {
    auto loaded = load(i);
    if (!loaded) return loaded.takeError();
    runner->loaded_.push_back(std::move(*loaded));
  }
  runner->program_ = std::move(program);
  return runner;
}

Expected<std::vector<Tensor>> StagedRunner::runPart(size_t part, const std::vector<Tensor>& inputs,
                                                    const std::string& role) {
  const StagedProgram& p = *program_;
  const StagedProgram::Part& which = p.parts[part];
  if (which.kind == StagedProgram::Part::Kind::Program) {
    // A stored part runs only the shapes it was compiled for: a body whose
    // inputs changed shape (a loop's carried values) cannot run it.
    const Program& program = p.programs[which.index];
    for (size_t i = 0; i < inputs.size() && i < program.arguments.size(); ++i)
      if (inputs[i].type() != program.arguments[i].type)
        return Error(role + " '" + program.name + "' of the stored program was compiled for input " +
                     std::to_string(i) + " of type " + program.arguments[i].type.str() + ", but is given " +
                     inputs[i].type().str() +
                     "; shapes that change at run time need the model itself (kiln run model.onnx), not a .kc");
    if (inputs.size() != program.arguments.size())
      return Error(role + " '" + program.name + "' takes " + std::to_string(program.arguments.size()) +
                   " inputs, got " + std::to_string(inputs.size()));
    return loaded_[which.index]->run(inputs);
  }
  const Stages& stages = p.stages[which.index];
  StageRunners runners;
  runners.prefix = [&](const std::vector<Tensor>& in) {
    return runPart(static_cast<size_t>(stages.prefix), in, "the prefix");
  };
  runners.suffix = [&](const std::vector<Tensor>& in) {
    return runPart(static_cast<size_t>(stages.suffix), in, "the suffix");
  };
  runners.body = [&](size_t host, size_t region, const std::vector<Tensor>& in) {
    const HostStep& step = stages.host[host];
    const char* what = step.kind == OpKind::Loop ? "the body" : region == 0 ? "the then branch" : "the else branch";
    return runPart(static_cast<size_t>(step.bodies[region]), in, std::string(what) + " of '" + step.name + "'");
  };
  return runStages(stages, inputs, runners);
}

Expected<std::vector<Tensor>> StagedRunner::run(const std::vector<Tensor>& inputs) {
  return runPart(0, inputs, "the function");
}

}  // namespace kiln
