// File helpers shared by the model readers and writers (frontend/Model.h
// declares the two that the rest of Kiln uses). Writers never leave a
// partial file behind: everything is written to temporary files beside the
// targets first, and only when all of them are complete are they renamed
// over the targets.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "frontend/Model.h"

namespace kiln {

/// One file to write: its path and its full contents.
struct FileContents {
  std::string path;
  std::string_view contents;
};

/// Writes every file to a temporary file in its target's folder, then renames
/// them over their targets in order. On an error before the renames nothing
/// is changed and the temporary files are removed. A model and its external
/// data file go through one call so that an old model never meets new data
/// because the second write failed.
Status writeFilesAtomically(const std::vector<FileContents>& files);

}  // namespace kiln
