// Element types, shapes with static and symbolic dimensions, and tensor
// types. `f32[?,784]` is a TensorType with one unknown and one static dim;
// `f32[N,784]` names the unknown dim so that shape rules can relate dims of
// different values; `f32[]` is a scalar.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

/// Element types. `Bool` is spelled `bool`. The numbers are stored in
/// compiled programs (.kc), so new dtypes are added at the end (the
/// unsigned types wider than u8 came after bool); kAllDTypes lists them in
/// the order of DESIGN.md.
enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool, U16, U32, U64 };

inline constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                                       DType::I32, DType::I16, DType::I8,  DType::U64,  DType::U32,
                                       DType::U16, DType::U8,  DType::Bool};
/// The dtype with the largest number: every DType is at most this.
inline constexpr DType kLastDType = DType::U64;

std::string_view dtypeName(DType t);
std::optional<DType> parseDType(std::string_view name);
/// Bytes per element.
size_t dtypeSize(DType t);
bool isFloat(DType t);
bool isInteger(DType t);  // signed or unsigned, not bool
bool isSigned(DType t);

/// One dimension: a static size, an unknown size (`?`), or a symbolic size
/// (`N`) that is equal wherever the same symbol appears in one function.
struct Dim {
  static constexpr int64_t kDynamic = -1;
  int64_t size = kDynamic;
  std::string symbol;  // non-empty only for symbolic dims

  static Dim fixed(int64_t n) { return {n, {}}; }
  static Dim unknown() { return {kDynamic, {}}; }
  static Dim symbolic(std::string name) { return {kDynamic, std::move(name)}; }

  bool isStatic() const { return size >= 0; }
  bool isSymbolic() const { return size < 0 && !symbol.empty(); }
  bool isUnknown() const { return size < 0 && symbol.empty(); }
  bool operator==(const Dim&) const = default;
  std::string str() const;
};

using Shape = std::vector<Dim>;

std::string shapeStr(const Shape& shape);
/// True when every dim is static.
bool isStaticShape(const Shape& shape);
/// Product of static dims; only meaningful for static shapes.
int64_t numElements(const Shape& shape);
Shape staticShape(const std::vector<int64_t>& dims);
std::vector<int64_t> staticDims(const Shape& shape);

/// `axis` of a rank-`rank` tensor in [0, rank) (a negative one counts from
/// the end), or nullopt when it is not in [-rank, rank). Every layer
/// normalizes axes with this; checkedAxis (IR.h) adds the error for an op.
std::optional<int64_t> normalizeAxis(int64_t axis, int64_t rank);

/// True when `a` and `b` may describe the same dim at run time.
bool dimsCompatible(const Dim& a, const Dim& b);
/// The more precise of two compatible dims.
Dim refineDim(const Dim& a, const Dim& b);

struct TensorType {
  DType dtype = DType::F32;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  bool isStatic() const { return isStaticShape(shape); }
  bool operator==(const TensorType&) const = default;
  /// `f32[2,?,N]`.
  std::string str() const;
};

/// True when a tensor of type `a` may be a value of type `b`: same dtype and
/// rank, and every pair of dims compatible.
bool typesCompatible(const TensorType& a, const TensorType& b);

/// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBFloat16(float f);
float bfloat16ToFloat(uint16_t b);

}  // namespace kiln
