// What the `kiln` subcommands share: how errors are printed.
#include "tools/KilnCommands.h"

#include <iostream>

#include "frontend/Model.h"
#include "ir/Verifier.h"
#include "runtime/Interpreter.h"

namespace kiln::cli {

Expected<std::unique_ptr<Module>> loadVerifiedModel(const std::string& path) {
  static const InterpreterEvaluator evaluator;
  LoadOptions options;
  options.evaluator = &evaluator;
  auto module = loadModel(path, options);
  if (!module) return module.takeError();
  KILN_TRY(verify(**module));
  return module;
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
