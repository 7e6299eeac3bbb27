// Reading and writing NumPy .npz files: zip archives whose members are .npy
// files, the training data format of `kiln train --data`. The reader takes
// what numpy.savez and numpy.savez_compressed write (members stored or
// deflated, zip64 records) and trusts nothing in the archive: the central
// directory is the index, every offset and size is checked against the file
// before use, a local header must agree with its central directory entry,
// inflated output only grows with what the stream really produces, and every
// member's CRC-32 is checked. The writer stores members uncompressed (the
// data is usually float arrays that deflate barely shrinks) with a fixed
// timestamp, so the same arrays always give the same bytes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/Support.h"
#include "runtime/Tensor.h"

namespace kiln {

/// One array of a .npz file: its name (the member's file name without ".npy") and its contents.
struct NpzArray {
  std::string name;
  Tensor tensor;
};

/// Parses the bytes of a .npz file (a zip archive of .npy members, as numpy.savez and numpy.savez_compressed write it):
/// members stored or deflated (zlib raw inflate), zip64 records as NumPy writes them for large arrays, CRC-32 checked.
/// Arrays in the archive's order; an archive without members gives an empty list. `what` names the file in errors.
Expected<std::vector<NpzArray>> parseNpz(std::string_view bytes, const std::string& what);
Expected<std::vector<NpzArray>> readNpz(const std::string& path);

/// The bytes of an uncompressed .npz holding `arrays` (names unique and non-empty). Zip64 records are written where
/// a size or offset needs them, as Python's zipfile does; `forceZip64` writes them for every member and the end of
/// the archive, which lets tests check that path on small arrays.
Expected<std::string> serializeNpz(const std::vector<NpzArray>& arrays, bool forceZip64 = false);
/// Writes an uncompressed .npz that numpy.load reads, atomically (temporary file, then rename); names must be unique
/// and non-empty.
Status writeNpz(const std::string& path, const std::vector<NpzArray>& arrays);

}  // namespace kiln
