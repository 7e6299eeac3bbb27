// `kiln check`: can Kiln take this model, and what is in it? For ONNX
// models every unsupported op is listed at once (op type, domain, opset,
// node names, counts), so that a user learns the whole gap in one run
// instead of one op per attempt. A model that loads gets a summary: its
// inputs (with their types and whether they have a default), outputs, an
// op histogram and the parameter count.
#include <algorithm>
#include <iostream>
#include <map>

#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "check";

constexpr OptionSpec kOptions[] = {
    {"--input-shape", "NAME=2x3x8",
     "ONNX: import specialized to this static shape of input NAME, as kiln run does for its inputs", true},
    {"--help", "", "show this help", false, "-h"},
};

/// `1,234,567`: parameter counts are read by people.
std::string withCommas(int64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string plural(int64_t n, std::string_view word) {
  return std::to_string(n) + " " + std::string(word) + (n == 1 ? "" : "s");
}

/// Lists the unsupported ops of an ONNX model; returns true when there are some.
bool reportUnsupportedOps(const std::string& path, int& exitCode) {
  auto unsupported = findUnsupportedOnnxOps(path);
  if (!unsupported) {
    reportError(kName, unsupported.takeError());
    exitCode = kExitError;
    return true;
  }
  if (unsupported->empty()) return false;
  int64_t nodes = 0;
  for (const UnsupportedOnnxOp& op : *unsupported) nodes += static_cast<int64_t>(op.nodes.size());
  std::cerr << "kiln check: error: " << path << " uses " << plural(static_cast<int64_t>(unsupported->size()), "op type")
            << " that Kiln does not support (" << plural(nodes, "node") << "):\n";
  for (const UnsupportedOnnxOp& op : *unsupported) {
    std::cerr << "  " << op.opType << " (domain " << (op.domain.empty() ? "ai.onnx" : op.domain) << ", opset "
              << op.opset << "): " << plural(static_cast<int64_t>(op.nodes.size()), "node") << ":";
    for (size_t i = 0; i < op.nodes.size(); ++i) std::cerr << (i ? ", " : " ") << op.nodes[i];
    std::cerr << "\n";
  }
  exitCode = kExitError;
  return true;
}

/// How an ONNX model was specialized for the summary: the --input-shape
/// options given, the shapes Kiln assumed, and the declared types.
struct Specialization {
  InputShapes given, assumed;
  std::map<std::string, TensorType> declaredInputs, declaredOutputs;
};

void printSummary(const std::string& path, ModelFormat format, const Function& f, const Specialization& spec) {
  std::cout << "model: " << path << " (" << modelFormatName(format) << ")\n";
  std::cout << "function: @" << f.name() << "\n";
  if (!spec.given.empty())
    std::cout << "specialized to: " << inputShapeList(spec.given) << " (--input-shape)\n";
  if (!spec.assumed.empty())
    std::cout << "specialized to: " << inputShapeList(spec.assumed)
              << " (the model computes shapes from its inputs' dynamic dims, so it loads only for given shapes, "
                 "as kiln run loads it for its inputs; ops and parameters are those of these shapes, "
                 "--input-shape chooses others)\n";
  // The types the file declares, where the import specialized them.
  auto shown = [](const std::map<std::string, TensorType>& declared, const std::string& name, const TensorType& type) {
    auto it = declared.find(name);
    return it == declared.end() ? type.str() : it->second.str();
  };

  int64_t parameters = 0, bytes = 0;
  std::cout << "inputs (" << f.numArguments() << "):\n";
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const Value* arg = f.argument(i);
    const DenseTensor* dflt = f.argumentDefault(i);
    std::cout << "  " << (arg->name().empty() ? "#" + std::to_string(i) : arg->name()) << ": "
              << shown(spec.declaredInputs, arg->name(), arg->type())
              << (dflt ? "  (has a default: optional)" : "  (required)") << "\n";
    if (dflt) {
      parameters += dflt->numElements();
      bytes += static_cast<int64_t>(dflt->bytes.size());
    }
  }
  std::cout << "outputs (" << f.resultTypes().size() << "):\n";
  for (size_t i = 0; i < f.resultTypes().size(); ++i)
    std::cout << "  " << (f.resultName(i).empty() ? "output_" + std::to_string(i) : f.resultName(i)) << ": "
              << shown(spec.declaredOutputs, f.resultName(i), f.resultTypes()[i]) << "\n";

  std::map<std::string_view, int64_t> histogram;
  int64_t total = 0;
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return) continue;
    ++histogram[op->name()];
    ++total;
    if (op->kind() == OpKind::Constant) {
      const DenseTensor& value = op->getTensor("value");
      parameters += value.numElements();
      bytes += static_cast<int64_t>(value.bytes.size());
    }
  }
  std::vector<std::pair<std::string_view, int64_t>> ops(histogram.begin(), histogram.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::cout << "ops (" << total << "):\n";
  for (const auto& [name, count] : ops)
    std::cout << "  " << name << std::string(name.size() < 24 ? 24 - name.size() : 1, ' ') << count << "\n";
  std::cout << "parameters: " << withCommas(parameters) << (parameters == 1 ? " element, " : " elements, ")
            << withCommas(bytes) << (bytes == 1 ? " byte" : " bytes") << " (constants and input defaults)\n";
}

int run(const ParsedArgs& args) {
  const auto& positionals = args.positionals();
  if (positionals.size() != 1)
    return usageError(kName, positionals.empty() ? "missing the MODEL to check"
                                                 : "expected one MODEL, got '" + positionals[1] + "' as well");
  const std::string& path = positionals[0];
  auto format = modelFormatOf(path);
  if (!format) {
    reportError(kName, format.takeError());
    return kExitError;
  }
  auto shapes = parseInputShapes(args);
  if (!shapes) return usageError(kName, shapes.error().message());
  if (!shapes->empty() && *format != ModelFormat::Onnx)
    return usageError(kName, "--input-shape specializes ONNX models at import; '" + path +
                                 "' is not one (its symbolic dims need no shapes to load)");
  int exitCode = kExitOk;
  if (*format == ModelFormat::Onnx && reportUnsupportedOps(path, exitCode)) return exitCode;

  Specialization spec;
  std::unique_ptr<Module> module;
  if (*format == ModelFormat::Onnx) {
    // Specialized as kiln run specializes it: a model whose shapes are
    // computed from a dynamic batch loads only so.
    auto loaded = loadOnnxWithShapes(path, *shapes, /*allowAssumed=*/true);
    if (!loaded) {
      reportError(kName, loaded.takeError());
      return kExitError;
    }
    module = std::move(loaded->module);
    spec.given = *shapes;
    spec.assumed = std::move(loaded->assumed);
    // The inputs Kiln chose shapes for are shown as declared, and so are
    // the outputs (their dims follow those inputs').
    if (!spec.assumed.empty())
      if (auto signature = readOnnxSignature(path)) {
        for (auto& [name, type] : signature->inputs)
          if (spec.assumed.count(name)) spec.declaredInputs.emplace(name, type);
        for (auto& [name, type] : signature->outputs) spec.declaredOutputs.emplace(name, type);
      }
  } else {
    auto loaded = loadVerifiedModel(path);
    if (!loaded) {
      reportError(kName, loaded.takeError());
      return kExitError;
    }
    module = std::move(*loaded);
  }
  if (module->functions().empty()) {
    reportError(kName, Error(path + ": the model holds no function"));
    return kExitError;
  }
  printSummary(path, *format, *module->functions().front(), spec);
  return kExitOk;
}

}  // namespace

const Command& checkCommand() {
  static const Command command{
      kName,
      "check that Kiln supports a model and summarize it",
      "MODEL [--input-shape NAME=2x3x8]...",
      "Loads MODEL (.onnx, .kiln, .kiln.txt or .kir). When it uses ONNX ops that Kiln does not support,\n"
      "lists every one of them (op type, domain, opset, nodes) and exits with status 1. Otherwise prints the\n"
      "inputs, outputs, an op histogram and the parameter count. An ONNX model is imported specialized to\n"
      "the --input-shape shapes; one that computes shapes from dynamic dims left unspecified (a dynamic-batch\n"
      "transformer) is summarized with each such dim 1, as the summary says.",
      kOptions,
      &run,
  };
  return command;
}

}  // namespace kiln::cli
