// What the `kiln` subcommands share: how errors are printed.
#include "tools/KilnCommands.h"

#include <iostream>

namespace kiln::cli {

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
