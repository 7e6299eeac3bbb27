// `--device` resolution for the command line (DeviceSelection.h).
#include "tools/DeviceSelection.h"

#include <iostream>

#include "tools/KilnCommands.h"

namespace kiln::cli {

int selectDevice(std::string_view command, const std::string& spec, DeviceChoice& choice) {
  std::string notice;
  auto resolved = resolveDevice(spec, &notice);
  if (auto* problem = std::get_if<DeviceError>(&resolved)) {
    if (problem->usage) return usageError(command, problem->error.message());
    reportError(command, problem->error);
    return kExitError;
  }
  choice = std::get<DeviceChoice>(resolved);
  if (!notice.empty()) std::cerr << "kiln " << command << ": " << notice << "\n";
  return kExitOk;
}

}  // namespace kiln::cli
