// What the `kiln` subcommands share: how errors are printed, JSON strings.
#include "driver/Session.h"
#include "tools/KilnCommands.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "ir/Verifier.h"
#include "runtime/Interpreter.h"

namespace kiln::cli {

Expected<std::unique_ptr<Module>> loadVerifiedModel(const std::string& path) {
  LoadOptions options;
  options.evaluator = &Session::evaluator();
  auto module = loadModel(path, options);
  if (!module) return module.takeError();
  KILN_TRY(verify(**module));
  return module;
}

Expected<std::vector<int64_t>> parseShape(const std::string& name, const std::string& text) {
  std::vector<int64_t> dims;
  if (text == "scalar") return dims;
  size_t start = 0;
  while (true) {
    const size_t x = text.find('x', start);
    auto dim = parseInteger(text.substr(start, x == std::string::npos ? std::string::npos : x - start),
                            "a dim of --input-shape " + name, 0, int64_t{1} << 40);
    if (!dim) return dim.takeError();
    dims.push_back(*dim);
    if (x == std::string::npos) return dims;
    start = x + 1;
  }
}

Expected<InputShapes> parseInputShapes(const ParsedArgs& args) {
  InputShapes shapes;
  for (const std::string& binding : args.all("--input-shape")) {
    const size_t eq = binding.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == binding.size())
      return Error("--input-shape expects NAME=DIMS such as x=2x3x8 (or NAME=scalar), got '" + binding + "'");
    auto dims = parseShape(binding.substr(0, eq), binding.substr(eq + 1));
    if (!dims) return Error(dims.error().message() + " (in '" + binding + "')");
    if (!shapes.emplace(binding.substr(0, eq), *dims).second)
      return Error("--input-shape gives '" + binding.substr(0, eq) + "' twice");
  }
  return shapes;
}

std::string inputShapeList(const InputShapes& shapes) {
  std::string list;
  for (const auto& [name, dims] : shapes) {
    std::string text;
    for (int64_t d : dims) text += (text.empty() ? "" : "x") + std::to_string(d);
    list += (list.empty() ? "" : " ") + name + "=" + (dims.empty() ? "scalar" : text);
  }
  return list;
}

namespace {

/// The problems of `shapes` against the declared data inputs: names that are
/// not inputs, shapes an input's type cannot take.
std::vector<std::string> shapeProblems(const std::vector<std::pair<std::string, TensorType>>& inputs,
                                       const InputShapes& shapes) {
  std::vector<std::string> problems;
  std::string list;
  for (const auto& [name, type] : inputs) list += (list.empty() ? "" : ", ") + name + " (" + type.str() + ")";
  for (const auto& [name, dims] : shapes) {
    // (Named apart: clang with OpenMP cannot capture a structured binding.)
    const std::string& shapeName = name;
    auto input = std::find_if(inputs.begin(), inputs.end(), [&](const auto& in) { return in.first == shapeName; });
    if (input == inputs.end()) {
      problems.push_back("--input-shape names '" + name + "', which is not an input; inputs: " + list);
      continue;
    }
    const TensorType& type = input->second;
    bool fits = dims.size() == type.shape.size();
    for (size_t d = 0; fits && d < dims.size(); ++d) fits = !type.shape[d].isStatic() || type.shape[d].size == dims[d];
    if (!fits)
      problems.push_back("--input-shape " + name + " gives " + shapeStr(staticShape(dims)) + ", which input '" + name +
                         "' of type " + type.str() + " cannot take");
  }
  return problems;
}

Expected<std::unique_ptr<Module>> loadShaped(const std::string& path, const InputShapes& shapes) {
  LoadOptions options;
  options.evaluator = &Session::evaluator();
  options.inputShapes = shapes;
  auto module = loadModel(path, options);
  if (!module) return module.takeError();
  KILN_TRY(verify(**module));
  if ((*module)->functions().empty()) return Error(path + ": the model holds no function");
  return module;
}

}  // namespace

Expected<ShapedModel> loadOnnxWithShapes(const std::string& path, const InputShapes& shapes, bool allowAssumed) {
  auto joined = [](const std::vector<std::string>& problems) {
    std::string message = problems.front();
    for (size_t i = 1; i < problems.size(); ++i) message += "; " + problems[i];
    return Error(message);
  };
  // The declared data inputs, read without importing; a model this reader
  // refuses (a sequence input, an output without a shape) may still import.
  auto inputs = readOnnxDataInputs(path);
  if (inputs && !shapes.empty())
    if (auto problems = shapeProblems(*inputs, shapes); !problems.empty()) return joined(problems);
  auto module = loadShaped(path, shapes);
  if (module) {
    // The shapes against the arguments as imported: one the input's type
    // cannot take left it as declared.
    std::vector<std::pair<std::string, TensorType>> arguments;
    const Function& f = *(*module)->functions().front();
    for (size_t i = 0; i < f.numArguments(); ++i) arguments.emplace_back(f.argument(i)->name(), f.argument(i)->type());
    if (auto problems = shapeProblems(arguments, shapes); !problems.empty()) return joined(problems);
    return ShapedModel{std::move(*module), {}};
  }
  if (!inputs) return module.takeError();
  // The inputs left dynamic, each dynamic dim 1: does the model import so?
  InputShapes assumed;
  for (const auto& [name, type] : *inputs) {
    if (type.isStatic() || shapes.count(name)) continue;
    std::vector<int64_t> dims;
    for (const Dim& d : type.shape) dims.push_back(d.isStatic() ? d.size : 1);
    assumed[name] = dims;
  }
  if (assumed.empty()) return module.takeError();
  InputShapes all = shapes;
  all.insert(assumed.begin(), assumed.end());
  auto again = loadShaped(path, all);
  if (!again) return module.takeError();
  if (allowAssumed) return ShapedModel{std::move(*again), std::move(assumed)};
  std::string declared;
  for (const auto& [name, type] : *inputs)
    if (assumed.count(name)) declared += (declared.empty() ? "" : ", ") + name + ": " + type.str();
  return Error(module.error().message() + "\n  the model computes shapes from the dynamic dims of its inputs (" +
                   declared + "), so it loads only for given shapes: add --input-shape for each, e.g. --input-shape " +
                   inputShapeList(assumed),
               module.error().location());
}

std::string kernelCacheDir(const ParsedArgs& args) {
  if (args.has("--no-cache")) return "";
  if (const std::string* dir = args.get("--cache-dir")) return *dir;
  // The environment is read here, in the tool; the libraries take the
  // folder as an option.
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? value : "";
  };
  if (std::string dir = env("KILN_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string dir = env("XDG_CACHE_HOME"); !dir.empty()) return dir + "/kiln";
  if (std::string home = env("HOME"); !home.empty()) return home + "/.cache/kiln";
  return "";
}

void reportError(std::string_view command, const Error& error) {
  if (error.location().isUnknown())
    std::cerr << "kiln " << command << ": error: " << error.message() << "\n";
  else
    std::cerr << error.str() << "\n";
}

int usageError(std::string_view command, const std::string& message) {
  std::cerr << "kiln " << command << ": error: " << message << " (see kiln " << command << " --help)\n";
  return kExitUsage;
}

}  // namespace kiln::cli
