// Tests of runtime/Npz: the .npz archives `kiln train --data` reads. The
// fixtures under test/unit/data/npz were written by NumPy 1.24
// (make-fixtures.py there): numpy.savez (stored members), savez_compressed
// (deflated), positional names, an empty archive, zip64 records, and data
// descriptors (an archive written to a file NumPy could not seek in). Then
// round trips through our writer, and every way an archive can be damaged:
// truncation at every offset, flipped bytes, and hand-patched headers, each
// of which must be an error naming the problem, never a crash or a misread.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/Npz.h"

namespace kiln {
namespace {

using namespace std::string_literals;

std::string fixturePath(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/test/unit/data/npz/" + name;
}

std::string fixture(const std::string& name) {
  std::ifstream in(fixturePath(name), std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << fixturePath(name);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The error message of parsing `bytes`, or "" when it parsed.
std::string parseError(std::string_view bytes) {
  auto arrays = parseNpz(bytes, "in.npz");
  return arrays ? std::string() : arrays.error().message();
}

uint32_t get32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}
uint16_t get16(const std::string& s, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(s[at]) | static_cast<uint8_t>(s[at + 1]) << 8);
}
void put32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put16(std::string& s, size_t at, uint16_t v) {
  s[at] = static_cast<char>(v & 0xff);
  s[at + 1] = static_cast<char>(v >> 8);
}

/// CRC-32 (the zip polynomial), bit by bit: an oracle independent of zlib.
uint32_t crc32(std::string_view data) {
  uint32_t crc = 0xffffffff;
  for (char c : data) {
    crc ^= static_cast<uint8_t>(c);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320 & (0u - (crc & 1)));
  }
  return ~crc;
}

/// Offsets into an archive without comment or zip64 records: the central
/// directory entry and local header of member `i`, and its data.
struct MemberAt {
  size_t central, local, data, size;
};
MemberAt member(const std::string& zip, int i) {
  size_t end = zip.size() - 22;
  EXPECT_EQ(get32(zip, end), 0x06054b50u);
  size_t pos = get32(zip, end + 16);
  for (int k = 0; k < i; ++k) pos += 46 + get16(zip, pos + 28) + get16(zip, pos + 30) + get16(zip, pos + 32);
  EXPECT_EQ(get32(zip, pos), 0x02014b50u);
  MemberAt m;
  m.central = pos;
  m.local = get32(zip, pos + 42);
  m.data = m.local + 30 + get16(zip, m.local + 26) + get16(zip, m.local + 28);
  m.size = get32(zip, pos + 20);
  return m;
}

/// Renames member `i` in both its headers (same length, so nothing moves).
void renameMember(std::string& zip, int i, const std::string& fileName) {
  MemberAt m = member(zip, i);
  ASSERT_EQ(get16(zip, m.central + 28), fileName.size());
  zip.replace(m.central + 46, fileName.size(), fileName);
  zip.replace(m.local + 30, fileName.size(), fileName);
}

Tensor filled(DType dtype, std::vector<int64_t> shape) {
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, dtype == DType::Bool ? i % 2 : i * 3 - 4);
  return t;
}

void expectSame(const Tensor& a, const Tensor& b, const std::string& name) {
  EXPECT_EQ(a.dtype(), b.dtype()) << name;
  EXPECT_EQ(a.shape(), b.shape()) << name;
  ASSERT_EQ(a.numBytes(), b.numBytes()) << name;
  if (a.numBytes() != 0) {
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.numBytes()), 0) << name;
  }
}

/// The arrays make-fixtures.py saves in stored.npz and compressed.npz.
void expectFixtureArrays(const std::vector<NpzArray>& arrays) {
  ASSERT_EQ(arrays.size(), 9u);
  const char* names[] = {"f32", "f64", "i64", "i32", "u8", "b", "f16", "scalar", "empty"};
  for (size_t i = 0; i < arrays.size(); ++i) EXPECT_EQ(arrays[i].name, names[i]);

  const Tensor& f32 = arrays[0].tensor;
  ASSERT_EQ(f32.dtype(), DType::F32);
  EXPECT_EQ(f32.shape(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f32.getDouble(i), i * 0.5 - 1);

  const Tensor& f64 = arrays[1].tensor;
  ASSERT_EQ(f64.dtype(), DType::F64);
  EXPECT_EQ(f64.shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(f64.getDouble(0), 1e300);
  EXPECT_EQ(f64.getDouble(1), -2.5);

  const Tensor& i64 = arrays[2].tensor;
  ASSERT_EQ(i64.dtype(), DType::I64);
  EXPECT_EQ(i64.shape(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(i64.getInt(0), -3);
  EXPECT_EQ(i64.getInt(2), int64_t{1} << 40);

  const Tensor& i32 = arrays[3].tensor;
  ASSERT_EQ(i32.dtype(), DType::I32);
  EXPECT_EQ(i32.getInt(0), -2147483648LL);
  EXPECT_EQ(i32.getInt(1), 2147483647);

  const Tensor& u8 = arrays[4].tensor;
  ASSERT_EQ(u8.dtype(), DType::U8);
  EXPECT_EQ(u8.getInt(1), 255);
  EXPECT_EQ(u8.getInt(2), 17);

  const Tensor& b = arrays[5].tensor;
  ASSERT_EQ(b.dtype(), DType::Bool);
  EXPECT_EQ(b.shape(), (std::vector<int64_t>{4}));
  EXPECT_EQ(b.getInt(0), 1);
  EXPECT_EQ(b.getInt(1), 0);

  const Tensor& f16 = arrays[6].tensor;
  ASSERT_EQ(f16.dtype(), DType::F16);
  EXPECT_EQ(f16.getDouble(0), 65504.0);
  EXPECT_TRUE(std::signbit(f16.getDouble(1)));

  const Tensor& scalar = arrays[7].tensor;
  ASSERT_EQ(scalar.dtype(), DType::F32);
  EXPECT_TRUE(scalar.shape().empty());
  EXPECT_EQ(scalar.getDouble(0), 42.0);

  const Tensor& empty = arrays[8].tensor;
  ASSERT_EQ(empty.dtype(), DType::F32);
  EXPECT_EQ(empty.shape(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(empty.numBytes(), 0u);
}

TEST(NpzTest, ReadsNumpySavez) {
  auto arrays = readNpz(fixturePath("stored.npz"));
  ASSERT_TRUE(arrays.ok()) << arrays.error().message();
  expectFixtureArrays(*arrays);
}

TEST(NpzTest, ReadsNumpySavezCompressed) {
  auto arrays = readNpz(fixturePath("compressed.npz"));
  ASSERT_TRUE(arrays.ok()) << arrays.error().message();
  expectFixtureArrays(*arrays);
  // The fixture really is deflated: method 8 in the first central entry.
  std::string zip = fixture("compressed.npz");
  EXPECT_EQ(get16(zip, member(zip, 0).central + 10), 8);
}

TEST(NpzTest, ReadsZip64Records) {
  std::string zip = fixture("zip64.npz");
  // The fixture has a zip64 end record and its locator before the end record.
  ASSERT_EQ(get32(zip, zip.size() - 22 - 20), 0x07064b50u);
  auto arrays = parseNpz(zip, "zip64.npz");
  ASSERT_TRUE(arrays.ok()) << arrays.error().message();
  ASSERT_EQ(arrays->size(), 2u);
  EXPECT_EQ((*arrays)[0].name, "a");
  ASSERT_EQ((*arrays)[0].tensor.dtype(), DType::I32);
  EXPECT_EQ((*arrays)[0].tensor.shape(), (std::vector<int64_t>{5}));
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*arrays)[0].tensor.getInt(i), i);
  EXPECT_EQ((*arrays)[1].name, "b");
  EXPECT_EQ((*arrays)[1].tensor.shape(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ((*arrays)[1].tensor.getDouble(0), 1.5);
}

/// Written to a file NumPy cannot seek in: the local headers have zero
/// sizes and CRCs, the real ones follow the data in data descriptors; the
/// reader takes them from the central directory.
TEST(NpzTest, ReadsDataDescriptors) {
  std::string zip = fixture("streamed.npz");
  ASSERT_EQ(get16(zip, 6), 8);    // flag bit 3 in the first local header
  ASSERT_EQ(get32(zip, 18), 0u);  // and no compressed size there
  auto arrays = parseNpz(zip, "streamed.npz");
  ASSERT_TRUE(arrays.ok()) << arrays.error().message();
  ASSERT_EQ(arrays->size(), 2u);
  EXPECT_EQ((*arrays)[0].name, "a");
  ASSERT_EQ((*arrays)[0].tensor.dtype(), DType::I16);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*arrays)[0].tensor.getInt(i), i);
  EXPECT_EQ((*arrays)[1].name, "b");
  EXPECT_EQ((*arrays)[1].tensor.shape(), (std::vector<int64_t>{2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*arrays)[1].tensor.getDouble(i), 1.0);
}

TEST(NpzTest, PositionalNamesAndEmptyArchive) {
  auto arrays = readNpz(fixturePath("positional.npz"));
  ASSERT_TRUE(arrays.ok()) << arrays.error().message();
  ASSERT_EQ(arrays->size(), 2u);
  EXPECT_EQ((*arrays)[0].name, "arr_0");
  EXPECT_EQ((*arrays)[0].tensor.getInt(1), 2);
  EXPECT_EQ((*arrays)[1].name, "arr_1");
  EXPECT_EQ((*arrays)[1].tensor.getDouble(0), 3.0);

  // numpy.savez() with no arrays: an empty list, not an error.
  auto none = readNpz(fixturePath("empty-archive.npz"));
  ASSERT_TRUE(none.ok()) << none.error().message();
  EXPECT_TRUE(none->empty());
}

TEST(NpzTest, EveryDTypeRoundTrips) {
  std::vector<NpzArray> arrays;
  for (DType dtype : kAllDTypes) {
    if (dtype == DType::BF16) continue;  // NumPy has no bfloat16
    arrays.push_back({std::string(dtypeName(dtype)), filled(dtype, {2, 3})});
  }
  arrays.push_back({"scalar", filled(DType::F64, {})});
  arrays.push_back({"empty", Tensor(DType::I32, {2, 0, 3})});
  arrays.push_back({"dir/nested name", filled(DType::F32, {1})});
  for (bool zip64 : {false, true}) {
    auto bytes = serializeNpz(arrays, zip64);
    ASSERT_TRUE(bytes.ok()) << bytes.error().message();
    // Zip64 adds the end record and locator (76 bytes) and extra fields.
    EXPECT_EQ(get32(*bytes, bytes->size() - 42) == 0x07064b50u, zip64);
    auto back = parseNpz(*bytes, "roundtrip.npz");
    ASSERT_TRUE(back.ok()) << back.error().message();
    ASSERT_EQ(back->size(), arrays.size());
    for (size_t i = 0; i < arrays.size(); ++i) {
      EXPECT_EQ((*back)[i].name, arrays[i].name);
      expectSame((*back)[i].tensor, arrays[i].tensor, arrays[i].name);
    }
  }
  // Deterministic: the same arrays give the same bytes.
  EXPECT_EQ(*serializeNpz(arrays), *serializeNpz(arrays));
  auto none = serializeNpz({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->size(), 22u);
  EXPECT_TRUE(parseNpz(*none, "none.npz")->empty());
}

TEST(NpzTest, WriterRejectsBadNames) {
  Tensor t = filled(DType::F32, {2});
  auto dup = serializeNpz({{"x", t}, {"y", t}, {"x", t}});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().message().find("two arrays named 'x'"), std::string::npos) << dup.error().message();
  auto empty = serializeNpz({{"", t}});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message().find("empty name"), std::string::npos) << empty.error().message();
  auto bf16 = serializeNpz({{"w", Tensor(DType::BF16, {2})}});
  ASSERT_FALSE(bf16.ok());
  EXPECT_NE(bf16.error().message().find("array 'w': dtype bf16 has no NumPy equivalent"), std::string::npos)
      << bf16.error().message();
}

TEST(NpzTest, FilesRoundTripAndErrorsNameThePath) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kiln-npz-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "t.npz").string();
  ASSERT_TRUE(writeNpz(path, {{"x", filled(DType::F32, {3})}, {"y", filled(DType::I64, {2})}}).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto back = readNpz(path);
  ASSERT_TRUE(back.ok()) << back.error().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].tensor.getInt(1), -1);

  auto missing = readNpz((dir / "missing.npz").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("missing.npz"), std::string::npos);
  auto folder = readNpz(dir.string());
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.error().message().find("it is a folder, not a .npz file"), std::string::npos)
      << folder.error().message();

  // A bad array: an error naming the path, and the existing file is kept.
  Status s = writeNpz(path, {{"x", filled(DType::F32, {3})}, {"x", filled(DType::F32, {3})}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find(path), std::string::npos) << s.error().message();
  EXPECT_TRUE(readNpz(path).ok());

  std::string bad = (dir / "no-such-dir" / "t.npz").string();
  s = writeNpz(bad, {{"x", filled(DType::F32, {3})}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("no-such-dir"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "no-such-dir"));
  std::filesystem::remove_all(dir);
}

TEST(NpzTest, NotAZipFile) {
  EXPECT_NE(parseError("").find("in.npz: not a zip file"), std::string::npos);
  EXPECT_NE(parseError("hello, world, this is text and not an archive").find("not a zip file"), std::string::npos);
  EXPECT_NE(parseError("\x93NUMPY\x01\x00 and the rest"s).find("this is a .npy file, expected a .npz"),
            std::string::npos);
}

TEST(NpzTest, EveryTruncationIsAnError) {
  for (const char* name : {"stored.npz", "compressed.npz", "zip64.npz", "streamed.npz"}) {
    std::string zip = fixture(name);
    for (size_t n = 0; n < zip.size(); ++n) {
      std::string message = parseError(std::string_view(zip).substr(0, n));
      EXPECT_FALSE(message.empty()) << name << " cut to " << n << " bytes parsed";
    }
  }
  std::string message = parseError(fixture("stored.npz").substr(0, 100));
  EXPECT_NE(message.find("truncated archive"), std::string::npos) << message;
}

/// A changed byte anywhere in a member's data is caught by its CRC-32, in
/// stored members; in deflated ones by the CRC or by the inflater.
TEST(NpzTest, FlippedDataBytesAreCaught) {
  std::string zip = fixture("stored.npz");
  for (int i : {0, 2, 7}) {
    MemberAt m = member(zip, i);
    for (size_t at = m.data; at < m.data + m.size; ++at) {
      std::string bad = zip;
      bad[at] ^= 0x20;
      std::string message = parseError(bad);
      EXPECT_NE(message.find("CRC-32 mismatch"), std::string::npos) << "byte " << at << ": " << message;
    }
  }
  std::string compressed = fixture("compressed.npz");
  MemberAt m = member(compressed, 0);
  for (size_t at = m.data; at < m.data + m.size; ++at) {
    std::string bad = compressed;
    bad[at] ^= 0x01;
    EXPECT_FALSE(parseError(bad).empty()) << "byte " << at;
  }
}

/// Any single changed byte anywhere: an error or a correct read, never a
/// crash (this runs under the sanitizers in the fuzz build too).
TEST(NpzTest, FlippedBytesAnywhereNeverCrash) {
  for (const char* name : {"compressed.npz", "zip64.npz"}) {
    std::string zip = fixture(name);
    for (size_t at = 0; at < zip.size(); ++at) {
      for (uint8_t x : {0x01, 0x80, 0xff}) {
        std::string bad = zip;
        bad[at] ^= static_cast<char>(x);
        auto arrays = parseNpz(bad, name);
        if (arrays) {
          EXPECT_LE(arrays->size(), 9u);
        }
      }
    }
  }
}

TEST(NpzTest, MemberErrors) {
  auto base = serializeNpz({{"a", filled(DType::F32, {2})}, {"b", filled(DType::I32, {3})}});
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(parseNpz(*base, "in.npz").ok());

  std::string notNpy = *base;
  renameMember(notNpy, 1, "b.txt");
  EXPECT_NE(parseError(notNpy).find("in.npz: member 'b.txt' is not a .npy file"), std::string::npos)
      << parseError(notNpy);

  std::string dup = *base;
  renameMember(dup, 1, "a.npy");
  EXPECT_NE(parseError(dup).find("two members named 'a.npy'"), std::string::npos) << parseError(dup);

  std::string bzip2 = *base;
  put16(bzip2, member(bzip2, 1).central + 10, 12);
  EXPECT_NE(parseError(bzip2).find("member 'b.npy': unsupported compression method 12 (bzip2)"), std::string::npos)
      << parseError(bzip2);

  std::string encrypted = *base;
  put16(encrypted, member(encrypted, 0).central + 8, 1);
  EXPECT_NE(parseError(encrypted).find("encrypted members are not supported"), std::string::npos);

  // A member whose .npy is bad: parseNpy's message, after the member's name.
  // The CRC is fixed up so that the .npy parser is what objects.
  std::string badNpy = *base;
  MemberAt m = member(badNpy, 1);
  ASSERT_EQ(badNpy.substr(m.data, 6), "\x93NUMPY");
  badNpy[m.data + 6] = 9;  // format version 9
  uint32_t fixedCrc = crc32(std::string_view(badNpy).substr(m.data, m.size));
  put32(badNpy, m.central + 16, fixedCrc);
  put32(badNpy, m.local + 14, fixedCrc);
  EXPECT_NE(parseError(badNpy).find("in.npz: member 'b.npy': unsupported .npy format version 9"), std::string::npos)
      << parseError(badNpy);

  std::string wrongCrc = *base;
  put32(wrongCrc, member(wrongCrc, 0).central + 16, 0x12345678);
  EXPECT_NE(parseError(wrongCrc).find("member 'a.npy': CRC-32 mismatch (the archive records 0x12345678"),
            std::string::npos)
      << parseError(wrongCrc);

  // The local header must name the member the central directory names.
  std::string local = *base;
  local[member(local, 0).local + 30] = 'z';
  EXPECT_NE(parseError(local).find("the local file header names 'z.npy'"), std::string::npos) << parseError(local);
}

TEST(NpzTest, SizesFromHeadersAreBounded) {
  // A deflated member claiming 4 GB from a few hundred bytes: refused
  // before any buffer is sized from it.
  std::string zip = fixture("compressed.npz");
  std::string huge = zip;
  put32(huge, member(huge, 0).central + 24, 0xfffffff0);
  EXPECT_NE(parseError(huge).find("more than deflate can produce"), std::string::npos) << parseError(huge);

  // A plausible but wrong size: the inflater stops at it.
  std::string small = zip;
  MemberAt m = member(small, 0);
  put32(small, m.central + 24, get32(small, m.central + 24) - 1);
  EXPECT_NE(parseError(small).find("inflates to more than"), std::string::npos) << parseError(small);
  std::string large = zip;
  put32(large, m.central + 24, get32(large, m.central + 24) + 1);
  EXPECT_NE(parseError(large).find("but the archive records"), std::string::npos) << parseError(large);

  // A deflate stream cut short (its compressed size made smaller).
  std::string cut = zip;
  put32(cut, m.central + 20, get32(cut, m.central + 20) - 8);
  EXPECT_NE(parseError(cut).find("truncated deflate data"), std::string::npos) << parseError(cut);

  // Stored data running past the central directory.
  std::string stored = fixture("stored.npz");
  MemberAt s = member(stored, 8);
  put32(stored, s.central + 20, 100000);
  put32(stored, s.central + 24, 100000);
  EXPECT_NE(parseError(stored).find("run into the central directory"), std::string::npos) << parseError(stored);

  // A member count that cannot fit in the central directory's size.
  std::string count = fixture("stored.npz");
  put16(count, count.size() - 22 + 8, 60000);
  put16(count, count.size() - 22 + 10, 60000);
  EXPECT_NE(parseError(count).find("60000 members cannot fit"), std::string::npos) << parseError(count);

  // A central directory offset beyond the file.
  std::string offset = fixture("stored.npz");
  put32(offset, offset.size() - 22 + 16, 0x7fffffff);
  EXPECT_NE(parseError(offset).find("lies outside the file"), std::string::npos) << parseError(offset);
}

}  // namespace
}  // namespace kiln
