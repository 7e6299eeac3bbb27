// `kiln convert IN -o OUT`: translates a model between the formats Kiln
// reads and writes, chosen by the file extensions (frontend/Model.h), or
// prints its Kiln IR with --emit=ir. The output is written atomically, so a
// failed conversion never leaves a partial OUT behind.
#include <iostream>

#include "frontend/Model.h"
#include "ir/Printer.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "convert";

constexpr OptionSpec kOptions[] = {
    {"--output", "OUT", "the file to write; its extension picks the format", false, "-o"},
    {"--emit", "ir", "print the model as Kiln IR text on stdout instead of writing a file"},
    {"--input-shape", "NAME=2x3x8",
     "ONNX: import specialized to this static shape of input NAME, as kiln run does for its inputs", true},
    {"--help", "", "show this help", false, "-h"},
};

int run(const ParsedArgs& args) {
  const auto& positionals = args.positionals();
  if (positionals.size() != 1)
    return usageError(kName, positionals.empty() ? "missing the input MODEL"
                                                 : "expected one input MODEL, got '" + positionals[1] +
                                                       "' as well (the output is given with -o OUT)");
  const std::string* emit = args.get("--emit");
  const std::string* out = args.get("--output");
  if (emit && *emit != "ir") return usageError(kName, "unknown --emit kind '" + *emit + "' (valid: ir)");
  if (emit && out) return usageError(kName, "--emit=ir prints to stdout; use -o OUT.kir to write Kiln IR to a file");
  if (!emit && !out) return usageError(kName, "missing -o OUT (or --emit=ir to print the IR)");
  if (out) {
    // Check the output's format before the (possibly long) import.
    if (auto format = modelFormatOf(*out); !format) {
      reportError(kName, format.takeError());
      return kExitError;
    }
  }

  auto shapes = parseInputShapes(args);
  if (!shapes) return usageError(kName, shapes.error().message());
  auto inFormat = modelFormatOf(positionals[0]);
  if (!inFormat) {
    reportError(kName, inFormat.takeError());
    return kExitError;
  }
  if (!shapes->empty() && *inFormat != ModelFormat::Onnx)
    return usageError(kName, "--input-shape specializes ONNX models at import; '" + positionals[0] +
                                 "' is not one (its symbolic dims are written as they are)");
  // An ONNX model whose shapes are computed from a dynamic batch imports
  // only specialized (as kiln run imports it for its inputs): the error
  // then names the --input-shape options it needs.
  Expected<std::unique_ptr<Module>> module = Error("");
  if (*inFormat == ModelFormat::Onnx) {
    auto loaded = loadOnnxWithShapes(positionals[0], *shapes, /*allowAssumed=*/false);
    module = loaded ? Expected<std::unique_ptr<Module>>(std::move(loaded->module)) : loaded.takeError();
  } else {
    module = loadVerifiedModel(positionals[0]);
  }
  if (!module) {
    reportError(kName, module.takeError());
    return kExitError;
  }
  if (emit) {
    print(**module, std::cout);
    return kExitOk;
  }
  if (Status s = saveModel(**module, *out); !s) {
    reportError(kName, s.takeError());
    return kExitError;
  }
  return kExitOk;
}

}  // namespace

const Command& convertCommand() {
  static const Command command{
      kName,
      "convert a model between .onnx, .kiln, .kiln.txt and .kir",
      "MODEL -o OUT | MODEL --emit=ir [--input-shape NAME=2x3x8]...",
      "Reads MODEL and writes it to OUT in the format OUT's extension names (.kiln binary protobuf,\n"
      ".kiln.txt text protobuf, .kir Kiln IR, .onnx). --emit=ir prints the Kiln IR instead. An ONNX model is\n"
      "imported specialized to the --input-shape shapes, which one that computes shapes from dynamic dims\n"
      "(a dynamic-batch transformer) needs.",
      kOptions,
      &run,
  };
  return command;
}

}  // namespace kiln::cli
