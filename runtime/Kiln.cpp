// The embedding API of Kiln.h: a `.kc` file read (runtime/KcFile.h) and run
// by the runner its device's loader gives (runtime/ProgramLoaders.h: on the
// CPU, its code checked against this CPU and run by a CpuRunner).
#include "runtime/Kiln.h"

#include <fstream>
#include <sstream>

#include "runtime/KcFile.h"
#include "runtime/ProgramLoaders.h"

namespace kiln {

namespace {

/// Files larger than this are not models Kiln wrote.
constexpr std::streamoff kMaxFileBytes = std::streamoff{1} << 36;

}  // namespace

Model::~Model() = default;

Expected<std::unique_ptr<Model>> Model::load(const std::string& path, ModelOptions options) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Error(path + ": cannot open the file");
  const std::streamoff size = in.tellg();
  if (size < 0 || size > kMaxFileBytes) return Error(path + ": not a compiled model (too large)");
  in.seekg(0);
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in.read(bytes.data(), size)) return Error(path + ": cannot read the file");
  return fromBytes(bytes, path, options);
}

Expected<std::unique_ptr<Model>> Model::fromBytes(std::string_view bytes, const std::string& name,
                                                  ModelOptions options) {
  auto artifact = parseArtifact(bytes, name);
  if (!artifact) return artifact.takeError();
  const CpuProgram& program = *artifact->program;
  std::unique_ptr<Model> model(new Model());
  model->program_ = artifact->program;
  // The runner of the device the program was compiled for.
  ProgramRunOptions run;
  run.threads = options.threads;
  auto runner = loadProgram(*artifact, name, run);
  if (!runner) return runner.takeError();
  model->runner_ = std::move(*runner);
  for (const CpuProgram::Argument& a : program.arguments) model->inputs_.push_back({a.name, a.type, a.hasDefault});
  for (size_t r = 0; r < program.results.size(); ++r) {
    const std::string& n = program.results[r].name;
    model->outputs_.push_back({n.empty() ? "output_" + std::to_string(r) : n,
                               program.slots[static_cast<size_t>(program.results[r].slot)].type, false});
  }
  return model;
}

Expected<std::vector<Tensor>> Model::run(const std::vector<Tensor>& inputs) {
  if (inputs.size() != inputs_.size())
    return Error("the model takes " + std::to_string(inputs_.size()) + " inputs, got " + std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].type() != inputs_[i].type)
      return Error("input '" + inputs_[i].name + "' expects " + inputs_[i].type.str() + ", got " +
                   inputs[i].type().str());
  return runner_->run(inputs);
}

Expected<std::map<std::string, Tensor>> Model::run(const std::map<std::string, Tensor>& named) {
  for (const auto& [name, tensor] : named) {
    bool known = false;
    for (const Port& p : inputs_) known = known || p.name == name;
    if (!known) {
      std::string names;
      for (const Port& p : inputs_) names += (names.empty() ? "" : ", ") + p.name;
      return Error("the model has no input '" + name + "' (its inputs: " + names + ")");
    }
  }
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    auto it = named.find(inputs_[i].name);
    if (it != named.end()) {
      inputs.push_back(it->second);
    } else if (program_->arguments[i].hasDefault) {
      inputs.push_back(program_->arguments[i].defaultValue);
    } else {
      return Error("input '" + inputs_[i].name + "' (" + inputs_[i].type.str() + ") is missing");
    }
  }
  auto outputs = run(inputs);
  if (!outputs) return outputs.takeError();
  std::map<std::string, Tensor> byName;
  for (size_t r = 0; r < outputs_.size(); ++r) byName[outputs_[r].name] = std::move((*outputs)[r]);
  return byName;
}

}  // namespace kiln
