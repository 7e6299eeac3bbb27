// DType tables, shape helpers and the 16-bit float conversions.
#include "ir/Types.h"

#include <cstring>

namespace kiln {

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypeInfo[] = {
    {DType::F64, "f64", 8}, {DType::F32, "f32", 4}, {DType::F16, "f16", 2}, {DType::BF16, "bf16", 2},
    {DType::I64, "i64", 8}, {DType::I32, "i32", 4}, {DType::I16, "i16", 2}, {DType::I8, "i8", 1},
    {DType::U8, "u8", 1},   {DType::Bool, "bool", 1}, {DType::U16, "u16", 2},   {DType::U32, "u32", 4},
    {DType::U64, "u64", 8},
};
}  // namespace

std::string_view dtypeName(DType t) { return kDTypeInfo[static_cast<int>(t)].name; }
size_t dtypeSize(DType t) { return kDTypeInfo[static_cast<int>(t)].size; }

std::optional<DType> parseDType(std::string_view name) {
  for (const auto& info : kDTypeInfo)
    if (name == info.name) return info.type;
  return std::nullopt;
}

bool isFloat(DType t) { return t == DType::F64 || t == DType::F32 || t == DType::F16 || t == DType::BF16; }
bool isInteger(DType t) { return !isFloat(t) && t != DType::Bool; }
bool isSigned(DType t) {
  return isFloat(t) || t == DType::I64 || t == DType::I32 || t == DType::I16 || t == DType::I8;
}

std::string Dim::str() const {
  if (isStatic()) return std::to_string(size);
  return symbol.empty() ? "?" : symbol;
}

std::string shapeStr(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += shape[i].str();
  }
  return s + "]";
}

bool isStaticShape(const Shape& shape) {
  for (const Dim& d : shape)
    if (!d.isStatic()) return false;
  return true;
}

int64_t numElements(const Shape& shape) {
  int64_t n = 1;
  for (const Dim& d : shape) n *= d.size;
  return n;
}

Shape staticShape(const std::vector<int64_t>& dims) {
  Shape s;
  s.reserve(dims.size());
  for (int64_t d : dims) s.push_back(Dim::fixed(d));
  return s;
}

std::vector<int64_t> staticDims(const Shape& shape) {
  std::vector<int64_t> dims;
  dims.reserve(shape.size());
  for (const Dim& d : shape) dims.push_back(d.size);
  return dims;
}

std::optional<int64_t> normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return std::nullopt;
  return axis < 0 ? axis + rank : axis;
}

bool dimsCompatible(const Dim& a, const Dim& b) {
  if (a.isStatic() && b.isStatic()) return a.size == b.size;
  return true;
}

bool typesCompatible(const TensorType& a, const TensorType& b) {
  if (a.dtype != b.dtype || a.rank() != b.rank()) return false;
  for (size_t i = 0; i < a.shape.size(); ++i)
    if (!dimsCompatible(a.shape[i], b.shape[i])) return false;
  return true;
}

Dim refineDim(const Dim& a, const Dim& b) {
  if (a.isStatic()) return a;
  if (b.isStatic()) return b;
  if (a.isSymbolic()) return a;
  return b;
}

std::string TensorType::str() const { return std::string(dtypeName(dtype)) + shapeStr(shape); }

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t exp = (x >> 23) & 0xff;
  uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(half);
}

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400));
      x = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000 | mant << 13;
  } else {
    x = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t floatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float bfloat16ToFloat(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace kiln
