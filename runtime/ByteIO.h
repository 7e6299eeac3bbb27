// Little-endian byte writing and a bounds-checked reading cursor, for the
// binary formats the runtime reads from files it did not write itself
// (`.kc` sections, compiled programs): every length, count and index is
// checked against what remains before it is used, so a truncated or corrupt
// file is an error naming what was being read, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ir/Support.h"

namespace kiln {

/// Appends the low `bytes` bytes of `v`, little-endian.
inline void putLE(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

/// Appends a u32 length and the bytes of `s`.
inline void putString(std::string& out, std::string_view s) {
  putLE(out, s.size(), 4);
  out.append(s);
}

/// A cursor over bytes; errors are prefixed with `where` (the file and the
/// part of it being read).
class ByteReader {
 public:
  ByteReader(std::string_view bytes, std::string where) : bytes_(bytes), where_(std::move(where)) {}

  size_t remaining() const { return bytes_.size() - pos_; }
  Error error(const std::string& message) const { return Error(where_ + ": " + message); }

  Expected<uint64_t> uint(int bytes, std::string_view what) {
    if (remaining() < static_cast<size_t>(bytes))
      return error("truncated: " + std::string(what) + " needs " + std::to_string(bytes) + " bytes, " +
                   std::to_string(remaining()) + " remain");
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(bytes_[pos_ + i])} << (8 * i);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }

  /// A u64 that must be at most `max`.
  Expected<int64_t> bounded(int bytes, int64_t max, std::string_view what) {
    auto v = uint(bytes, what);
    if (!v) return v.takeError();
    if (*v > static_cast<uint64_t>(max))
      return error("corrupt: " + std::string(what) + " is " + std::to_string(*v) + ", at most " + std::to_string(max));
    return static_cast<int64_t>(*v);
  }

  Expected<std::string_view> take(uint64_t n, std::string_view what) {
    if (n > remaining())
      return error("truncated: " + std::string(what) + " has " + std::to_string(n) + " bytes, " +
                   std::to_string(remaining()) + " remain");
    std::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }

  /// A u32 length and that many bytes.
  Expected<std::string> string(std::string_view what) {
    auto n = uint(4, what);
    if (!n) return n.takeError();
    auto s = take(*n, what);
    if (!s) return s.takeError();
    return std::string(*s);
  }

 private:
  std::string_view bytes_;
  std::string where_;
  size_t pos_ = 0;
};

}  // namespace kiln
