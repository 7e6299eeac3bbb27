// What the `kiln` subcommands share: how errors are printed, JSON strings.
#include "codegen/Session.h"
#include "tools/KilnCommands.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "frontend/Model.h"
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
