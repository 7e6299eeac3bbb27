// Parses the text form of Kiln IR (docs/ir.md). Errors are reported as
// `file:line:col: error: message`; malformed input never crashes.
#pragma once

#include <memory>
#include <string_view>

#include "ir/IR.h"

namespace kiln {

/// Parses a whole module. The result is not verified; call verify().
/// `firstLine` offsets reported line numbers (for --split-input-file chunks).
Expected<std::unique_ptr<Module>> parseModule(std::string_view text, std::string_view filename,
                                              int firstLine = 1);

}  // namespace kiln
