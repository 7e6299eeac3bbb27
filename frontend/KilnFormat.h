// The Kiln graph format (frontend/kiln.proto, docs/format.md): reading a
// model into Kiln IR and writing Kiln IR back out. What the writer writes the
// reader reads back to the same IR.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ir/IR.h"

namespace kiln {

/// Files larger than this are refused before they are parsed.
inline constexpr int64_t kMaxModelFileBytes = int64_t{4} << 30;

/// Reads a `.kiln` (binary) or `.kiln.txt` (text) model. External data files
/// are resolved relative to the model's folder and may not leave it.
Expected<std::unique_ptr<Module>> readKilnModel(const std::string& path);

/// Parses a model held in memory. `filename` is used in diagnostics;
/// `baseDir` is where external data lives ("" refuses external data).
Expected<std::unique_ptr<Module>> parseKilnModel(std::string_view bytes, bool text, std::string_view filename,
                                                 const std::string& baseDir);

struct KilnWriteOptions {
  /// Initializers of at least this many bytes go to an external data file
  /// `<model file name>.data` beside the model; 0 keeps everything inline.
  int64_t externalDataThreshold = 0;
};

/// Writes the first function of `module` as a `.kiln` or `.kiln.txt` model
/// (by extension), atomically.
Status writeKilnModel(const Module& module, const std::string& path, const KilnWriteOptions& options = {});

/// The serialized model in memory (binary or text protobuf), all data inline.
Expected<std::string> serializeKilnModel(const Module& module, bool text);

}  // namespace kiln
