// Reading and writing NumPy .npy files (format versions 1, 2 and 3), the
// on-disk tensor format of `kiln run`. Every dtype of Kiln that NumPy has is
// supported (bf16 has no NumPy dtype); Fortran order and big-endian data are
// rejected with a message rather than silently transposed or byte-swapped.
#pragma once

#include <string>
#include <string_view>

#include "ir/Support.h"
#include "runtime/Tensor.h"

namespace kiln {

/// Parses the bytes of a .npy file; `what` names it in errors.
Expected<Tensor> parseNpy(std::string_view bytes, const std::string& what);
Expected<Tensor> readNpy(const std::string& path);
/// The bytes of a version 1.0 .npy file holding `t`.
Expected<std::string> serializeNpy(const Tensor& t);
/// Writes atomically (temporary file, then rename).
Status writeNpy(const std::string& path, const Tensor& t);

/// Runtime-internal (writeNpy, writeNpz): writes `bytes` to `path + ".tmp"`
/// and renames it to `path`, so a reader never sees a partly written file
/// and an existing one is untouched on error; the temporary file is removed
/// on failure. Errors read "cannot write '<path>': <reason>".
Status writeBytesAtomically(const std::string& path, std::string_view bytes);

}  // namespace kiln
