// .npy reader and writer. The header is a Python dict literal; only the
// three keys NumPy writes are accepted, and every size is checked against
// the file before any allocation.
#include "runtime/Npy.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>

namespace kiln {

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr int64_t kMaxElements = int64_t{1} << 40;

struct NpyDType {
  DType dtype;
  const char* descr;
};
constexpr NpyDType kNpyDTypes[] = {
    {DType::F64, "f8"}, {DType::F32, "f4"}, {DType::F16, "f2"}, {DType::I64, "i8"}, {DType::I32, "i4"},
    {DType::I16, "i2"}, {DType::I8, "i1"},  {DType::U64, "u8"}, {DType::U32, "u4"}, {DType::U16, "u2"},
    {DType::U8, "u1"},  {DType::Bool, "b1"},
};

/// A tiny scanner over the header dict.
class HeaderScanner {
 public:
  explicit HeaderScanner(std::string_view s) : s_(s) {}
  void skipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t')) ++i_;
  }
  bool eat(char c) {
    skipSpace();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    skipSpace();
    return i_ < s_.size() && s_[i_] == c;
  }
  std::optional<std::string> quoted() {
    skipSpace();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return std::nullopt;
    char q = s_[i_++];
    size_t end = s_.find(q, i_);
    if (end == std::string_view::npos) return std::nullopt;
    std::string out(s_.substr(i_, end - i_));
    i_ = end + 1;
    return out;
  }
  std::optional<std::string> word() {
    skipSpace();
    size_t start = i_;
    while (i_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (start == i_) return std::nullopt;
    return std::string(s_.substr(start, i_ - start));
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

Error bad(const std::string& what, const std::string& msg) { return Error(what + ": " + msg); }

}  // namespace

Expected<Tensor> parseNpy(std::string_view bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic)
    return bad(what, "not a .npy file (missing the \\x93NUMPY magic)");
  int major = static_cast<uint8_t>(bytes[6]);
  size_t headerLen, headerStart;
  if (major == 1) {
    headerLen = static_cast<uint8_t>(bytes[8]) | static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8;
    headerStart = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad(what, "truncated .npy header");
    headerLen = 0;
    for (int k = 0; k < 4; ++k) headerLen |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + k])) << (8 * k);
    headerStart = 12;
  } else {
    return bad(what, "unsupported .npy format version " + std::to_string(major) + " (expected 1, 2 or 3)");
  }
  if (headerLen > bytes.size() - headerStart) return bad(what, "truncated .npy header");
  HeaderScanner h(bytes.substr(headerStart, headerLen));

  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> shape;
  if (!h.eat('{')) return bad(what, "malformed .npy header: expected '{'");
  while (!h.eat('}')) {
    auto key = h.quoted();
    if (!key || !h.eat(':')) return bad(what, "malformed .npy header: expected 'key':");
    if (*key == "descr") {
      descr = h.quoted();
      if (!descr) return bad(what, "malformed .npy header: 'descr' must be a string (structured dtypes are not supported)");
    } else if (*key == "fortran_order") {
      auto w = h.word();
      if (!w || (*w != "True" && *w != "False")) return bad(what, "malformed .npy header: 'fortran_order' must be True or False");
      fortran = *w == "True";
    } else if (*key == "shape") {
      if (!h.eat('(')) return bad(what, "malformed .npy header: 'shape' must be a tuple");
      std::vector<int64_t> dims;
      while (!h.eat(')')) {
        // Digits, optionally followed by the 'L' of a Python 2 long; at most
        // 15 digits, so the value fits int64 before the size checks below.
        auto w = h.word();
        if (w && w->back() == 'L') w->pop_back();
        if (!w || w->empty() || w->size() > 15 || w->find_first_not_of("0123456789") != std::string::npos)
          return bad(what, "malformed .npy header: bad dimension in 'shape'");
        dims.push_back(std::stoll(*w));
        h.eat(',');
      }
      shape = std::move(dims);
    } else {
      return bad(what, "malformed .npy header: unexpected key '" + *key + "'");
    }
    if (!h.eat(',') && !h.peek('}')) return bad(what, "malformed .npy header: expected ',' or '}'");
  }
  if (!descr || !fortran || !shape) return bad(what, "malformed .npy header: needs 'descr', 'fortran_order' and 'shape'");
  if (*fortran)
    return bad(what, "Fortran-order arrays are not supported; save a C-order array (numpy.ascontiguousarray)");

  char order = descr->empty() ? '?' : (*descr)[0];
  std::string code = descr->size() > 1 ? descr->substr(1) : "";
  if (order == '>' && code != "i1" && code != "u1" && code != "b1")
    return bad(what, "big-endian data ('" + *descr + "') is not supported; save as little-endian");
  if (order != '<' && order != '|' && order != '=' && order != '>')
    return bad(what, "unsupported dtype '" + *descr + "'");
  std::optional<DType> dtype;
  for (const NpyDType& d : kNpyDTypes)
    if (code == d.descr) dtype = d.dtype;
  if (!dtype)
    return bad(what, "unsupported dtype '" + *descr +
                         "' (expected float64/32/16, int64/32/16/8, uint64/32/16/8 or bool)");

  int64_t n = 1;
  for (int64_t d : *shape) {
    if (d < 0 || (d > 0 && n > kMaxElements / d)) return bad(what, "array too large");
    n *= d;
  }
  size_t dataStart = headerStart + headerLen;
  size_t need = static_cast<size_t>(n) * dtypeSize(*dtype);
  if (bytes.size() - dataStart < need)
    return bad(what, "truncated data: expected " + std::to_string(need) + " bytes for shape " +
                         shapeStr(staticShape(*shape)) + ", found " + std::to_string(bytes.size() - dataStart));
  if (bytes.size() - dataStart > need) return bad(what, "trailing bytes after the array data");
  auto allocated = Tensor::allocate(*dtype, *shape, "the array of '" + what + "'");
  if (!allocated) return allocated.takeError();
  Tensor& t = *allocated;
  if (need) std::memcpy(t.raw(), bytes.data() + dataStart, need);
  if (*dtype == DType::Bool)
    for (size_t i = 0; i < need; ++i)
      if (t.raw()[i] > 1) return bad(what, "bool array holds a byte other than 0 or 1");
  return t;
}

Expected<Tensor> readNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("cannot open '" + path + "': " + std::strerror(errno));
  // The file, then its array: a file larger than memory allows is an
  // error naming it.
  try {
    std::ostringstream ss;
    ss << in.rdbuf();
    return parseNpy(ss.str(), path);
  } catch (const std::bad_alloc&) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    return Error("cannot read '" + path + "': cannot allocate " + (ec ? std::string("the memory") : formatBytes(size)) +
                 " to hold it");
  }
}

Expected<std::string> serializeNpy(const Tensor& t) {
  const char* descr = nullptr;
  for (const NpyDType& d : kNpyDTypes)
    if (d.dtype == t.dtype()) descr = d.descr;
  if (!descr) return Error("dtype " + std::string(dtypeName(t.dtype())) + " has no NumPy equivalent");
  bool byteOrdered = dtypeSize(t.dtype()) > 1;
  std::string header = std::string("{'descr': '") + (byteOrdered ? "<" : "|") + descr +
                       "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape().size(); ++i) header += (i ? ", " : "") + std::to_string(t.shape()[i]);
  header += t.shape().size() == 1 ? ",), }" : "), }";  // Python's one-element tuple
  // Pad with spaces so that the data starts on a 64-byte boundary.
  size_t total = kMagic.size() + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out;
  try {
    out.reserve(kMagic.size() + 4 + header.size() + t.numBytes());
  } catch (const std::bad_alloc&) {
    return allocationError(kMagic.size() + 4 + header.size() + t.numBytes(), "the .npy file of a result", t.type());
  }
  out += kMagic;
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(t.raw()), t.numBytes());
  return out;
}

Status writeNpy(const std::string& path, const Tensor& t) {
  auto bytes = serializeNpy(t);
  if (!bytes) return bytes.takeError();
  return writeBytesAtomically(path, *bytes);
}

Status writeBytesAtomically(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return Error("cannot write '" + path + "': " + std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return Error("cannot write '" + path + "': " + std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Error("cannot write '" + path + "': " + std::strerror(errno));
  }
  return Status::success();
}

}  // namespace kiln
