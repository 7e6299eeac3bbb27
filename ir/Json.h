// JSON output: what `kiln ... --json`, `kiln devices --json` and the Python
// package's kiln.devices() write.
#pragma once

#include <string>
#include <string_view>

namespace kiln {

/// `s` as a JSON string literal, quoted and escaped.
std::string jsonString(std::string_view s);

}  // namespace kiln
