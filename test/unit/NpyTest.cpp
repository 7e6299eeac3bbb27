// Tests of runtime/Npy: the .npy files `kiln run` reads inputs from and
// writes outputs to. Round trips of every dtype NumPy shares with Kiln,
// 0-d and zero-size arrays, byte-for-byte agreement with what NumPy 1.24's
// np.save writes, and every way a file can be malformed: the reader must
// return an error naming the problem, never crash or misread.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include "runtime/Npy.h"

namespace kiln {
namespace {

using namespace std::string_literals;

/// A version 1.0 .npy file with header dict `dict`, padded like NumPy pads
/// it (spaces, then '\n', so that the data starts on a 64-byte boundary).
std::string npyFile(const std::string& dict, const std::string& data, char major = 1) {
  std::string header = dict;
  size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY"s;
  out += major;
  out += '\0';
  size_t len = header.size();
  for (size_t k = 0; k < (major == 1 ? 2u : 4u); ++k) out += static_cast<char>((len >> (8 * k)) & 0xff);
  return out + header + data;
}

/// The error message of parsing `bytes`, or "" when it parsed.
std::string parseError(const std::string& bytes) {
  auto t = parseNpy(bytes, "in.npy");
  return t ? std::string() : t.error().message();
}

Tensor roundTrip(const Tensor& t) {
  auto bytes = serializeNpy(t);
  EXPECT_TRUE(bytes.ok()) << (bytes ? "" : bytes.error().message());
  if (!bytes) return {};
  auto back = parseNpy(*bytes, "roundtrip.npy");
  EXPECT_TRUE(back.ok()) << (back ? "" : back.error().message());
  return back ? *back : Tensor();
}

TEST(NpyTest, EveryNumpyDTypeRoundTrips) {
  for (DType dtype : kAllDTypes) {
    if (dtype == DType::BF16) continue;  // NumPy has no bfloat16
    Tensor t(dtype, {2, 3});
    for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, dtype == DType::Bool ? i % 2 : i * 3 - 4);
    Tensor back = roundTrip(t);
    EXPECT_EQ(back.dtype(), dtype) << dtypeName(dtype);
    EXPECT_EQ(back.shape(), t.shape()) << dtypeName(dtype);
    ASSERT_EQ(back.numBytes(), t.numBytes()) << dtypeName(dtype);
    EXPECT_EQ(std::memcmp(back.raw(), t.raw(), t.numBytes()), 0) << dtypeName(dtype);
  }
}

TEST(NpyTest, Float16KeepsItsBits) {
  Tensor t(DType::F16, {4});
  t.setDouble(0, 65504.0);  // largest half
  t.setDouble(1, -0.0);
  t.setDouble(2, 6.103515625e-05);  // smallest normal half
  t.setDouble(3, std::numeric_limits<double>::infinity());
  Tensor back = roundTrip(t);
  ASSERT_EQ(back.dtype(), DType::F16);
  EXPECT_EQ(back.getDouble(0), 65504.0);
  EXPECT_TRUE(std::signbit(back.getDouble(1)));
  EXPECT_EQ(back.getDouble(2), 6.103515625e-05);
  EXPECT_TRUE(std::isinf(back.getDouble(3)));
}

TEST(NpyTest, ZeroDimensionalAndZeroSizeArrays) {
  Tensor scalar(DType::F64, {});
  scalar.setDouble(0, 2.5);
  Tensor back = roundTrip(scalar);
  EXPECT_TRUE(back.shape().empty());
  EXPECT_EQ(back.getDouble(0), 2.5);

  Tensor empty(DType::I32, {2, 0, 3});
  back = roundTrip(empty);
  EXPECT_EQ(back.shape(), (std::vector<int64_t>{2, 0, 3}));
  EXPECT_EQ(back.numBytes(), 0u);

  Tensor vector0(DType::Bool, {0});
  back = roundTrip(vector0);
  EXPECT_EQ(back.shape(), (std::vector<int64_t>{0}));
}

TEST(NpyTest, BFloat16HasNoNumpyDType) {
  auto bytes = serializeNpy(Tensor(DType::BF16, {2}));
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.error().message().find("no NumPy equivalent"), std::string::npos);
}

/// What np.save writes (NumPy 1.24), byte for byte, and what we write.
TEST(NpyTest, MatchesNumpyBytes) {
  Tensor f16(DType::F16, {2, 2});
  for (int i = 0; i < 4; ++i) f16.setDouble(i, std::vector<double>{1.5, -2, 3, 65504}[i]);
  std::string numpyF16 =
      npyFile("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }", "\x00\x3e\x00\xc0\x00\x42\xff\x7b"s);
  EXPECT_EQ(*serializeNpy(f16), numpyF16);
  EXPECT_EQ(numpyF16.size() % 64, 8u);  // data starts at 128 bytes

  Tensor b(DType::Bool, {3});
  b.setInt(0, 1);
  b.setInt(2, 1);
  EXPECT_EQ(*serializeNpy(b), npyFile("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", "\x01\x00\x01"s));

  Tensor scalar(DType::I32, {});
  scalar.setInt(0, 7);
  EXPECT_EQ(*serializeNpy(scalar),
            npyFile("{'descr': '<i4', 'fortran_order': False, 'shape': (), }", "\x07\x00\x00\x00"s));

  EXPECT_EQ(*serializeNpy(Tensor(DType::I64, {2, 0, 3})),
            npyFile("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 0, 3), }", ""));
}

TEST(NpyTest, ReadsWhatNumpyWrites) {
  // Exactly np.save(np.array([True, False, True])), including its padding.
  std::string bytes = "\x93NUMPY\x01\x00v\x00{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }"s +
                      std::string(60, ' ') + "\n\x01\x00\x01"s;
  auto t = parseNpy(bytes, "b.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->dtype(), DType::Bool);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(t->getInt(0), 1);
  EXPECT_EQ(t->getInt(1), 0);

  // Version 2.0 (4-byte header length), double quotes, no trailing comma,
  // native and byte-order-free descriptors.
  t = parseNpy(npyFile("{\"descr\": \"=i2\", \"fortran_order\": False, \"shape\": (2,)}", "\x05\x00\xff\xff"s, 2),
               "v2.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->dtype(), DType::I16);
  EXPECT_EQ(t->getInt(1), -1);

  // Single-byte types may say '>' or '|': there is no byte order to get wrong.
  t = parseNpy(npyFile("{'descr': '>i1', 'fortran_order': False, 'shape': (1,), }", "\xfe"s), "i1.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->getInt(0), -2);
  t = parseNpy(npyFile("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", "\xfe"s), "u1.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->getInt(0), 254);
}

TEST(NpyTest, ReadsUnsignedIntegers) {
  // np.array([2**64 - 2], np.uint64), [2**32 - 1] as uint32, [65534] as uint16.
  auto t = parseNpy(npyFile("{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }",
                            "\xfe\xff\xff\xff\xff\xff\xff\xff"s),
                    "u8.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->dtype(), DType::U64);
  EXPECT_EQ(static_cast<uint64_t>(t->getInt(0)), 18446744073709551614u);
  EXPECT_EQ(t->getDouble(0), 18446744073709551614.0);
  t = parseNpy(npyFile("{'descr': '<u4', 'fortran_order': False, 'shape': (1,), }", "\xff\xff\xff\xff"s), "u4.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->dtype(), DType::U32);
  EXPECT_EQ(t->getInt(0), 4294967295);
  t = parseNpy(npyFile("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", "\xfe\xff"s), "u2.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->dtype(), DType::U16);
  EXPECT_EQ(t->getInt(0), 65534);
  EXPECT_EQ(*serializeNpy(*t), npyFile("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", "\xfe\xff"s));
}

TEST(NpyTest, FortranOrderIsRejectedWithAdvice) {
  std::string bytes = npyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::string(24, '\0'));
  std::string message = parseError(bytes);
  EXPECT_NE(message.find("in.npy"), std::string::npos) << message;
  EXPECT_NE(message.find("Fortran-order arrays are not supported"), std::string::npos) << message;
  EXPECT_NE(message.find("ascontiguousarray"), std::string::npos) << message;
}

TEST(NpyTest, BigEndianIsRejected) {
  std::string message =
      parseError(npyFile("{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", "\0\0\0\1\0\0\0\2"s));
  EXPECT_NE(message.find("big-endian data ('>i4') is not supported"), std::string::npos) << message;
}

TEST(NpyTest, MalformedHeadersAreErrors) {
  const std::string data4 = "\0\0\0\0"s;
  struct Case {
    std::string bytes;
    std::string expected;
  };
  const Case cases[] = {
      {"", "missing the \\x93NUMPY magic"},
      {"PK\x03\x04 not npy at all", "missing the \\x93NUMPY magic"},
      {"\x93NUMPY\x01"s, "missing the \\x93NUMPY magic"},  // shorter than the fixed prefix
      {"\x93NUMPY\x04\x00\x10\x00{}"s, "unsupported .npy format version 4"},
      {"\x93NUMPY\x02\x00\x10\x00"s, "truncated .npy header"},
      {"\x93NUMPY\x01\x00\xff\x00{'descr'"s, "truncated .npy header"},
      {npyFile("'descr': '<f4'", data4), "expected '{'"},
      {npyFile("{'descr': '<f4', 'fortran_order': False}", data4), "needs 'descr', 'fortran_order' and 'shape'"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", data4), "unexpected key 'extra'"},
      {npyFile("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", data4), "'fortran_order' must be True or False"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': 1}", data4), "'shape' must be a tuple"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", data4), "bad dimension in 'shape'"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (L,)}", data4), "bad dimension in 'shape'"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (1L2,)}", data4), "bad dimension in 'shape'"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", data4),
       "bad dimension in 'shape'"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576, 1048576)}", data4),
       "array too large"},
      {npyFile("{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", data4), "expected ',' or '}'"},
      {npyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", data4), "expected ',' or '}'"},
      {npyFile("{'descr': '<f4', 3: 4}", data4), "expected 'key':"},
      {npyFile("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", data4),
       "structured dtypes are not supported"},
      {npyFile("{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}", data4), "unsupported dtype '<c8'"},
      {npyFile("{'descr': '<U3', 'fortran_order': False, 'shape': (1,)}", data4), "unsupported dtype '<U3'"},
      {npyFile("{'descr': 'O', 'fortran_order': False, 'shape': (1,)}", data4), "unsupported dtype 'O'"},
  };
  for (const Case& c : cases) {
    std::string message = parseError(c.bytes);
    EXPECT_NE(message.find(c.expected), std::string::npos) << "got: '" << message << "', expected: " << c.expected;
    if (!message.empty()) {
      EXPECT_EQ(message.rfind("in.npy: ", 0), 0u) << message;
    }
  }
}

TEST(NpyTest, DataSizeMustMatchTheShape) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_NE(parseError(npyFile(header, std::string(23, '\0')))
                .find("truncated data: expected 24 bytes for shape [2,3], found 23"),
            std::string::npos);
  EXPECT_NE(parseError(npyFile(header, "")).find("found 0"), std::string::npos);
  EXPECT_NE(parseError(npyFile(header, std::string(25, '\0'))).find("trailing bytes"), std::string::npos);
  // A huge declared shape with no data is an error before any allocation.
  EXPECT_NE(parseError(npyFile("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }", ""))
                .find("truncated data"),
            std::string::npos);
}

TEST(NpyTest, BoolBytesMustBeZeroOrOne) {
  std::string message = parseError(npyFile("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", "\x01\x02"s));
  EXPECT_NE(message.find("bool array holds a byte other than 0 or 1"), std::string::npos) << message;
}

TEST(NpyTest, FilesRoundTripAndErrorsNameThePath) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kiln-npy-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "t.npy").string();
  Tensor t(DType::F32, {3});
  t.setDouble(1, 0.25);
  ASSERT_TRUE(writeNpy(path, t).ok());
  auto back = readNpy(path);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->getDouble(1), 0.25);

  auto missing = readNpy((dir / "missing.npy").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("missing.npy"), std::string::npos);

  // A folder that does not exist: an error, and nothing written anywhere.
  std::string bad = (dir / "no-such-dir" / "t.npy").string();
  Status s = writeNpy(bad, t);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("no-such-dir"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "no-such-dir"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
