// .npz reader and writer: the zip container around runtime/Npy's .npy
// members. The layout follows PKWARE's APPNOTE (the subset Python's zipfile
// writes): local file headers with the data after them, a central directory
// that indexes them, an end-of-central-directory record, and for archives or
// members past 2 GiB the zip64 variants of the last two plus zip64 "extended
// information" extra fields. The reader finds the end record, walks the
// central directory, and for each member checks its local header and reads
// its data; the local header's sizes are not used, since a writer streaming
// to a pipe leaves them zero and puts the real ones in a data descriptor,
// while the central directory always has them.
#include "runtime/Npz.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "runtime/Npy.h"

namespace kiln {

namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint16_t kZip64ExtraId = 0x0001;
/// Sizes and offsets above this get zip64 records when writing: Python's
/// zipfile.ZIP64_LIMIT, below the format's 0xffffffff so that readers which
/// treat the 32-bit fields as signed read our files too.
constexpr uint64_t kZip64Limit = (uint64_t{1} << 31) - 1;
/// Deflate turns one byte of input into at most 1032 bytes of output (a
/// 258-byte match in two bits); a member declaring more than this ratio is
/// corrupt, and is refused before any output buffer is sized from it.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint16_t kMethodStored = 0;
constexpr uint16_t kMethodDeflated = 8;

Error bad(const std::string& what, const std::string& msg) { return Error(what + ": " + msg); }

uint64_t readLE(std::string_view bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
  return v;
}

void appendLE(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

/// Whether [offset, offset + length) lies within [0, limit), without overflow.
bool fits(uint64_t offset, uint64_t length, uint64_t limit) { return offset <= limit && length <= limit - offset; }

std::string methodName(uint16_t method) {
  switch (method) {
    case 1: return "shrink";
    case 2:
    case 3:
    case 4:
    case 5: return "reduce";
    case 6: return "implode";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "LZMA";
    case 93: return "Zstandard";
    case 95: return "xz";
    case 98: return "PPMd";
    case 99: return "AES encryption";
    default: return "unknown method";
  }
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t crc32Of(std::string_view data) {
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

/// One member as the central directory describes it.
struct CentralEntry {
  std::string fileName;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressedSize = 0;
  uint64_t uncompressedSize = 0;
  uint64_t localHeaderOffset = 0;
};

/// Replaces the 32-bit fields of `e` that are 0xffffffff by the values of
/// the zip64 extended-information field in `extra`, which holds exactly
/// those, in the order uncompressed size, compressed size, offset.
Status applyZip64Extra(std::string_view extra, CentralEntry& e, const std::string& where) {
  bool wantUncompressed = e.uncompressedSize == 0xffffffff;
  bool wantCompressed = e.compressedSize == 0xffffffff;
  bool wantOffset = e.localHeaderOffset == 0xffffffff;
  if (!wantUncompressed && !wantCompressed && !wantOffset) return Status::success();
  size_t pos = 0;
  while (pos + 4 <= extra.size()) {
    uint16_t id = static_cast<uint16_t>(readLE(extra, pos, 2));
    uint16_t len = static_cast<uint16_t>(readLE(extra, pos + 2, 2));
    if (len > extra.size() - pos - 4) return Error(where + ": extra field runs past its header");
    if (id == kZip64ExtraId) {
      std::string_view field = extra.substr(pos + 4, len);
      size_t at = 0;
      for (auto [want, target] :
           {std::pair{wantUncompressed, &e.uncompressedSize}, std::pair{wantCompressed, &e.compressedSize},
            std::pair{wantOffset, &e.localHeaderOffset}}) {
        if (!want) continue;
        if (at + 8 > field.size()) return Error(where + ": zip64 extra field too short for the sizes it must hold");
        *target = readLE(field, at, 8);
        at += 8;
      }
      return Status::success();
    }
    pos += 4 + len;
  }
  return Error(where + ": sizes or offset marked as zip64 (0xffffffff) but no zip64 extra field");
}

/// The inflated bytes of a raw deflate stream that must produce exactly
/// `size` bytes. The buffer grows with the output actually produced, so a
/// lying size cannot cause a large allocation by itself.
Expected<std::string> inflateMember(std::string_view compressed, uint64_t size, const std::string& where) {
  if (size > kMaxDeflateRatio * (compressed.size() + 1))
    return Error(where + ": declares " + std::to_string(size) + " bytes inflated from " +
                 std::to_string(compressed.size()) +
                 " compressed, more than deflate can produce; the archive is corrupt");
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return Error(where + ": cannot initialize zlib's inflate");
  std::string out;
  // One byte beyond `size`, so that a stream producing more is noticed.
  const uint64_t limit = size + 1;
  out.resize(
      static_cast<size_t>(std::min<uint64_t>(limit, std::max<uint64_t>(uint64_t{1} << 16, 4 * compressed.size()))));
  size_t inPos = 0, produced = 0;
  int rc = Z_OK;
  while (true) {
    if (produced == out.size()) {
      if (out.size() == limit) break;
      out.resize(static_cast<size_t>(std::min<uint64_t>(limit, 2 * uint64_t{out.size()})));
    }
    if (z.avail_in == 0 && inPos < compressed.size()) {
      size_t chunk = std::min<size_t>(compressed.size() - inPos, size_t{1} << 30);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data() + inPos));
      z.avail_in = static_cast<uInt>(chunk);
      inPos += chunk;
    }
    size_t room = std::min<size_t>(out.size() - produced, size_t{1} << 30);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    z.avail_out = static_cast<uInt>(room);
    rc = inflate(&z, Z_NO_FLUSH);
    produced += room - z.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR) {
      // No progress: either the output is full (grown above) or more input
      // is to be fed; otherwise the input ran out before the stream's end.
      if (z.avail_out == 0 || (z.avail_in == 0 && inPos < compressed.size())) continue;
      break;
    }
    std::string msg = z.msg ? z.msg : "zlib error " + std::to_string(rc);
    inflateEnd(&z);
    return Error(where + ": corrupt deflate data (" + msg + ")");
  }
  const bool ended = rc == Z_STREAM_END;
  const bool trailing = ended && (z.avail_in != 0 || inPos != compressed.size());
  inflateEnd(&z);
  if (produced > size)
    return Error(where + ": inflates to more than the " + std::to_string(size) + " bytes the archive records");
  if (!ended) return Error(where + ": truncated deflate data (the stream ends before its last block)");
  if (produced != size)
    return Error(where + ": inflates to " + std::to_string(produced) + " bytes, but the archive records " +
                 std::to_string(size));
  if (trailing) return Error(where + ": bytes after the end of the deflate stream");
  out.resize(produced);
  return out;
}

/// Where the central directory is and how many entries it has, from the
/// end record (and the zip64 end record when there is one).
struct Directory {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t entries = 0;
  uint64_t end = 0;  // where the records after the directory start
};

Expected<Directory> findDirectory(std::string_view bytes, const std::string& what) {
  // The end record is the last 22 bytes plus a comment of at most 64 KiB;
  // its comment length must reach exactly the end of the file.
  std::optional<size_t> endPos;
  if (bytes.size() >= kEndSize) {
    size_t lowest = bytes.size() - kEndSize - std::min<size_t>(bytes.size() - kEndSize, 0xffff);
    for (size_t pos = bytes.size() - kEndSize + 1; pos-- > lowest;) {
      if (readLE(bytes, pos, 4) == kEndSig && pos + kEndSize + readLE(bytes, pos + 20, 2) == bytes.size()) {
        endPos = pos;
        break;
      }
    }
  }
  if (!endPos) {
    if (bytes.size() >= 4 && readLE(bytes, 0, 4) == kLocalHeaderSig)
      return bad(what, "truncated archive: a zip file without its end-of-central-directory record");
    if (bytes.substr(0, 6) == "\x93NUMPY") return bad(what, "not a zip file: this is a .npy file, expected a .npz");
    return bad(what, "not a zip file (expected a .npz archive as numpy.savez writes it)");
  }
  uint64_t disk = readLE(bytes, *endPos + 4, 2), cdDisk = readLE(bytes, *endPos + 6, 2);
  uint64_t diskEntries = readLE(bytes, *endPos + 8, 2);
  Directory dir;
  dir.entries = readLE(bytes, *endPos + 10, 2);
  dir.size = readLE(bytes, *endPos + 12, 4);
  dir.offset = readLE(bytes, *endPos + 16, 4);
  dir.end = *endPos;
  if (*endPos >= kZip64LocatorSize && readLE(bytes, *endPos - kZip64LocatorSize, 4) == kZip64LocatorSig) {
    size_t locator = *endPos - kZip64LocatorSize;
    uint64_t recordPos = readLE(bytes, locator + 8, 8);
    if (readLE(bytes, locator + 16, 4) > 1) return bad(what, "multi-disk (split) zip archives are not supported");
    if (!fits(recordPos, kZip64EndSize, locator) || readLE(bytes, recordPos, 4) != kZip64EndSig)
      return bad(what, "truncated archive: the zip64 end-of-central-directory locator points outside the file");
    disk = readLE(bytes, recordPos + 16, 4);
    cdDisk = readLE(bytes, recordPos + 20, 4);
    diskEntries = readLE(bytes, recordPos + 24, 8);
    dir.entries = readLE(bytes, recordPos + 32, 8);
    dir.size = readLE(bytes, recordPos + 40, 8);
    dir.offset = readLE(bytes, recordPos + 48, 8);
    dir.end = recordPos;
  }
  if (disk != 0 || cdDisk != 0 || diskEntries != dir.entries)
    return bad(what, "multi-disk (split) zip archives are not supported");
  if (!fits(dir.offset, dir.size, dir.end))
    return bad(what, "truncated archive: the central directory (" + std::to_string(dir.size) + " bytes at offset " +
                         std::to_string(dir.offset) + ") lies outside the file");
  if (dir.entries > dir.size / kCentralHeaderSize)
    return bad(what, "corrupt archive: " + std::to_string(dir.entries) +
                         " members cannot fit in a central directory of " + std::to_string(dir.size) + " bytes");
  return dir;
}

Expected<std::vector<CentralEntry>> readCentralDirectory(std::string_view bytes, const Directory& dir,
                                                         const std::string& what) {
  std::vector<CentralEntry> entries;
  entries.reserve(static_cast<size_t>(dir.entries));
  const uint64_t end = dir.offset + dir.size;
  uint64_t pos = dir.offset;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    const std::string where = what + ": central directory entry " + std::to_string(i);
    if (!fits(pos, kCentralHeaderSize, end) || readLE(bytes, pos, 4) != kCentralHeaderSig)
      return Error(where + ": missing or truncated (expected a central file header signature PK\\1\\2)");
    CentralEntry e;
    e.flags = static_cast<uint16_t>(readLE(bytes, pos + 8, 2));
    e.method = static_cast<uint16_t>(readLE(bytes, pos + 10, 2));
    e.crc = static_cast<uint32_t>(readLE(bytes, pos + 16, 4));
    e.compressedSize = readLE(bytes, pos + 20, 4);
    e.uncompressedSize = readLE(bytes, pos + 24, 4);
    uint64_t nameLen = readLE(bytes, pos + 28, 2), extraLen = readLE(bytes, pos + 30, 2);
    uint64_t commentLen = readLE(bytes, pos + 32, 2);
    uint64_t startDisk = readLE(bytes, pos + 34, 2);
    e.localHeaderOffset = readLE(bytes, pos + 42, 4);
    if (!fits(pos + kCentralHeaderSize, nameLen + extraLen + commentLen, end))
      return Error(where + ": its name, extra field and comment run past the central directory");
    e.fileName = std::string(bytes.substr(pos + kCentralHeaderSize, nameLen));
    std::string_view extra = bytes.substr(pos + kCentralHeaderSize + nameLen, extraLen);
    KILN_TRY(applyZip64Extra(extra, e, what + ": member '" + e.fileName + "'"));
    if (startDisk != 0 && startDisk != 0xffff) return bad(what, "multi-disk (split) zip archives are not supported");
    entries.push_back(std::move(e));
    pos += kCentralHeaderSize + nameLen + extraLen + commentLen;
  }
  return entries;
}

/// The uncompressed bytes of member `e`, CRC-checked; `storage` holds them
/// when they had to be inflated, otherwise they are a view into `bytes`.
Expected<std::string_view> memberData(std::string_view bytes, const Directory& dir, const CentralEntry& e,
                                      const std::string& where, std::string& storage) {
  if (e.flags & 1) return Error(where + ": encrypted members are not supported");
  if (e.method != kMethodStored && e.method != kMethodDeflated)
    return Error(where + ": unsupported compression method " + std::to_string(e.method) + " (" + methodName(e.method) +
                 "); expected stored (0) or deflate (8), as numpy.savez and "
                 "numpy.savez_compressed write");
  uint64_t at = e.localHeaderOffset;
  if (!fits(at, kLocalHeaderSize, dir.offset) || readLE(bytes, at, 4) != kLocalHeaderSig)
    return Error(where + ": no local file header at offset " + std::to_string(at) + " (truncated or corrupt archive)");
  uint64_t nameLen = readLE(bytes, at + 26, 2), extraLen = readLE(bytes, at + 28, 2);
  if (!fits(at + kLocalHeaderSize, nameLen + extraLen, dir.offset))
    return Error(where + ": local file header runs into the central directory (truncated or corrupt archive)");
  if (bytes.substr(at + kLocalHeaderSize, nameLen) != e.fileName)
    return Error(where + ": the local file header names '" + std::string(bytes.substr(at + kLocalHeaderSize, nameLen)) +
                 "', the central directory '" + e.fileName + "' (corrupt archive)");
  uint64_t dataStart = at + kLocalHeaderSize + nameLen + extraLen;
  if (!fits(dataStart, e.compressedSize, dir.offset))
    return Error(where + ": truncated archive: " + std::to_string(e.compressedSize) + " bytes of data at offset " +
                 std::to_string(dataStart) + " run into the central directory at " + std::to_string(dir.offset));
  std::string_view raw = bytes.substr(dataStart, e.compressedSize);
  std::string_view data = raw;
  if (e.method == kMethodStored) {
    if (e.compressedSize != e.uncompressedSize)
      return Error(where + ": stored member whose compressed size (" + std::to_string(e.compressedSize) +
                   ") differs from its size (" + std::to_string(e.uncompressedSize) + ")");
  } else {
    auto inflated = inflateMember(raw, e.uncompressedSize, where);
    if (!inflated) return inflated.takeError();
    storage = std::move(*inflated);
    data = storage;
  }
  uint32_t crc = crc32Of(data);
  if (crc != e.crc)
    return Error(where + ": CRC-32 mismatch (the archive records " + hex32(e.crc) + ", the data has " + hex32(crc) +
                 "); the file is corrupt");
  return data;
}

}  // namespace

Expected<std::vector<NpzArray>> parseNpz(std::string_view bytes, const std::string& what) {
  auto dir = findDirectory(bytes, what);
  if (!dir) return dir.takeError();
  auto entries = readCentralDirectory(bytes, *dir, what);
  if (!entries) return entries.takeError();
  std::vector<NpzArray> arrays;
  std::set<std::string> seen;
  for (const CentralEntry& e : *entries) {
    const std::string where = what + ": member '" + e.fileName + "'";
    constexpr std::string_view kSuffix = ".npy";
    if (e.fileName.size() <= kSuffix.size() || !e.fileName.ends_with(kSuffix))
      return Error(where + " is not a .npy file (expected every member of a .npz to be NAME.npy)");
    std::string name = e.fileName.substr(0, e.fileName.size() - kSuffix.size());
    if (!seen.insert(name).second) return Error(what + ": two members named '" + e.fileName + "'");
    std::string storage;
    auto data = memberData(bytes, *dir, e, where, storage);
    if (!data) return data.takeError();
    auto tensor = parseNpy(*data, where);
    if (!tensor) return tensor.takeError();
    arrays.push_back({std::move(name), std::move(*tensor)});
  }
  return arrays;
}

Expected<std::vector<NpzArray>> readNpz(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Error("cannot read '" + path + "': it is a folder, not a .npz file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("cannot open '" + path + "': " + std::strerror(errno));
  std::string bytes;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && std::filesystem::is_regular_file(path, ec)) {
    // One read of the whole file: training sets are often hundreds of MB.
    bytes.resize(static_cast<size_t>(size));
    if (!in.read(bytes.data(), static_cast<std::streamsize>(size)) || in.peek() != EOF)
      return Error("cannot read '" + path + "': it changed size while being read");
  } else {
    std::ostringstream ss;  // a pipe or a device: read until its end
    ss << in.rdbuf();
    bytes = std::move(ss).str();
  }
  if (in.bad()) return Error("cannot read '" + path + "': " + std::strerror(errno));
  return parseNpz(bytes, path);
}

Expected<std::string> serializeNpz(const std::vector<NpzArray>& arrays, bool forceZip64) {
  // 1980-01-01 00:00:00, the earliest MS-DOS date, for reproducible files.
  constexpr uint16_t kDosTime = 0, kDosDate = (1 << 5) | 1;
  // Made by Unix (3) so that unzip gives the members the mode below.
  constexpr uint16_t kUnix = 3 << 8;
  constexpr uint32_t kFileMode = 0100644u << 16;
  std::string out, central;
  std::set<std::string> seen;
  for (const NpzArray& a : arrays) {
    if (a.name.empty()) return Error("cannot write an array with an empty name to a .npz");
    if (!seen.insert(a.name).second) return Error("two arrays named '" + a.name + "'; .npz names must be unique");
    const std::string fileName = a.name + ".npy";
    if (fileName.size() > 0xffff) return Error("array name '" + a.name.substr(0, 40) + "...' is too long for a .npz");
    auto npy = serializeNpy(a.tensor);
    if (!npy) return Error("array '" + a.name + "': " + npy.error().message());
    const uint64_t size = npy->size(), offset = out.size();
    const uint32_t crc = crc32Of(*npy);
    const bool zip64Sizes = forceZip64 || size > kZip64Limit;
    const bool zip64Offset = forceZip64 || offset > kZip64Limit;
    const uint16_t version = zip64Sizes || zip64Offset ? 45 : 20;
    // Python's zipfile marks names that are not ASCII as UTF-8 (flag bit 11).
    const bool ascii = std::all_of(fileName.begin(), fileName.end(), [](char c) { return (c & 0x80) == 0; });
    const uint16_t flags = ascii ? 0 : 1 << 11;

    std::string localExtra, centralExtra;
    if (zip64Sizes) {
      appendLE(localExtra, kZip64ExtraId, 2);
      appendLE(localExtra, 16, 2);
      appendLE(localExtra, size, 8);
      appendLE(localExtra, size, 8);
    }
    if (zip64Sizes || zip64Offset) {
      appendLE(centralExtra, kZip64ExtraId, 2);
      appendLE(centralExtra, (zip64Sizes ? 16 : 0) + (zip64Offset ? 8 : 0), 2);
      if (zip64Sizes) {
        appendLE(centralExtra, size, 8);
        appendLE(centralExtra, size, 8);
      }
      if (zip64Offset) appendLE(centralExtra, offset, 8);
    }
    const uint64_t size32 = zip64Sizes ? 0xffffffff : size;

    appendLE(out, kLocalHeaderSig, 4);
    appendLE(out, version, 2);
    appendLE(out, flags, 2);
    appendLE(out, kMethodStored, 2);
    appendLE(out, kDosTime, 2);
    appendLE(out, kDosDate, 2);
    appendLE(out, crc, 4);
    appendLE(out, size32, 4);
    appendLE(out, size32, 4);
    appendLE(out, fileName.size(), 2);
    appendLE(out, localExtra.size(), 2);
    out += fileName;
    out += localExtra;
    out += *npy;

    appendLE(central, kCentralHeaderSig, 4);
    appendLE(central, kUnix | version, 2);
    appendLE(central, version, 2);
    appendLE(central, flags, 2);
    appendLE(central, kMethodStored, 2);
    appendLE(central, kDosTime, 2);
    appendLE(central, kDosDate, 2);
    appendLE(central, crc, 4);
    appendLE(central, size32, 4);
    appendLE(central, size32, 4);
    appendLE(central, fileName.size(), 2);
    appendLE(central, centralExtra.size(), 2);
    appendLE(central, 0, 2);  // comment length
    appendLE(central, 0, 2);  // disk number
    appendLE(central, 0, 2);  // internal attributes
    appendLE(central, kFileMode, 4);
    appendLE(central, zip64Offset ? 0xffffffff : offset, 4);
    central += fileName;
    central += centralExtra;
  }
  const uint64_t cdOffset = out.size(), cdSize = central.size(), count = arrays.size();
  out += central;
  if (forceZip64 || count >= 0xffff || cdOffset > kZip64Limit || cdSize > kZip64Limit) {
    const uint64_t recordPos = out.size();
    appendLE(out, kZip64EndSig, 4);
    appendLE(out, kZip64EndSize - 12, 8);  // size of the rest of the record
    appendLE(out, kUnix | 45, 2);
    appendLE(out, 45, 2);
    appendLE(out, 0, 4);  // this disk
    appendLE(out, 0, 4);  // disk of the central directory
    appendLE(out, count, 8);
    appendLE(out, count, 8);
    appendLE(out, cdSize, 8);
    appendLE(out, cdOffset, 8);
    appendLE(out, kZip64LocatorSig, 4);
    appendLE(out, 0, 4);  // disk of the zip64 end record
    appendLE(out, recordPos, 8);
    appendLE(out, 1, 4);  // number of disks
  }
  appendLE(out, kEndSig, 4);
  appendLE(out, 0, 2);  // this disk
  appendLE(out, 0, 2);  // disk of the central directory
  appendLE(out, std::min<uint64_t>(count, 0xffff), 2);
  appendLE(out, std::min<uint64_t>(count, 0xffff), 2);
  appendLE(out, std::min<uint64_t>(cdSize, 0xffffffff), 4);
  appendLE(out, std::min<uint64_t>(cdOffset, 0xffffffff), 4);
  appendLE(out, 0, 2);  // comment length
  return out;
}

Status writeNpz(const std::string& path, const std::vector<NpzArray>& arrays) {
  auto bytes = serializeNpz(arrays);
  if (!bytes) return Error("cannot write '" + path + "': " + bytes.error().message());
  return writeBytesAtomically(path, *bytes);
}

}  // namespace kiln
