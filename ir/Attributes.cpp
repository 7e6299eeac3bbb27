// Attribute kinds and dense tensor element access.
#include "ir/Attributes.h"

#include <cstring>

#include "ir/ScalarSemantics.h"

namespace kiln {

std::string_view attrKindName(AttrKind k) {
  switch (k) {
    case AttrKind::Int: return "int";
    case AttrKind::Float: return "float";
    case AttrKind::Bool: return "bool";
    case AttrKind::String: return "string";
    case AttrKind::Ints: return "int list";
    case AttrKind::Floats: return "float list";
    case AttrKind::Tensor: return "tensor";
  }
  return "?";
}

bool Attribute::operator==(const Attribute& other) const {
  if (kind() != other.kind()) return false;
  if (kind() == AttrKind::Tensor) return getTensor() == other.getTensor();
  return v_ == other.v_;
}

namespace {
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
}  // namespace

double DenseTensor::getDouble(int64_t i) const {
  const uint8_t* p = bytes.data() + i * dtypeSize(type.dtype);
  switch (type.dtype) {
    case DType::F64: return load<double>(p);
    case DType::F32: return load<float>(p);
    case DType::F16: return halfToFloat(load<uint16_t>(p));
    case DType::BF16: return bfloat16ToFloat(load<uint16_t>(p));
    case DType::I64: return static_cast<double>(load<int64_t>(p));
    case DType::I32: return load<int32_t>(p);
    case DType::I16: return load<int16_t>(p);
    case DType::I8: return load<int8_t>(p);
    case DType::U8: return load<uint8_t>(p);
    case DType::U16: return load<uint16_t>(p);
    case DType::U32: return load<uint32_t>(p);
    case DType::U64: return static_cast<double>(load<uint64_t>(p));
    case DType::Bool: return load<uint8_t>(p) ? 1.0 : 0.0;
  }
  return 0;
}

int64_t DenseTensor::getInt(int64_t i) const {
  const uint8_t* p = bytes.data() + i * dtypeSize(type.dtype);
  switch (type.dtype) {
    case DType::I64: return load<int64_t>(p);
    case DType::I32: return load<int32_t>(p);
    case DType::I16: return load<int16_t>(p);
    case DType::I8: return load<int8_t>(p);
    case DType::U8: return load<uint8_t>(p);
    case DType::U16: return load<uint16_t>(p);
    case DType::U32: return load<uint32_t>(p);
    case DType::U64: return static_cast<int64_t>(load<uint64_t>(p));  // the bits
    case DType::Bool: return load<uint8_t>(p) ? 1 : 0;
    default: return static_cast<int64_t>(getDouble(i));
  }
}

void DenseTensor::setDouble(int64_t i, double v) {
  uint8_t* p = bytes.data() + i * dtypeSize(type.dtype);
  switch (type.dtype) {
    case DType::F64: store<double>(p, v); break;
    case DType::F32: store<float>(p, static_cast<float>(v)); break;
    case DType::F16: store<uint16_t>(p, floatToHalf(static_cast<float>(v))); break;
    case DType::BF16: store<uint16_t>(p, floatToBFloat16(static_cast<float>(v))); break;
    case DType::Bool: store<uint8_t>(p, v != 0.0); break;
    case DType::U64: store<uint64_t>(p, kiln_ftou(v)); break;
    default: setInt(i, static_cast<int64_t>(v)); break;
  }
}

void DenseTensor::setInt(int64_t i, int64_t v) {
  uint8_t* p = bytes.data() + i * dtypeSize(type.dtype);
  switch (type.dtype) {
    case DType::I64: store<int64_t>(p, v); break;
    case DType::I32: store<int32_t>(p, static_cast<int32_t>(v)); break;
    case DType::I16: store<int16_t>(p, static_cast<int16_t>(v)); break;
    case DType::I8: store<int8_t>(p, static_cast<int8_t>(v)); break;
    case DType::U8: store<uint8_t>(p, static_cast<uint8_t>(v)); break;
    case DType::U16: store<uint16_t>(p, static_cast<uint16_t>(v)); break;
    case DType::U32: store<uint32_t>(p, static_cast<uint32_t>(v)); break;
    case DType::U64: store<uint64_t>(p, static_cast<uint64_t>(v)); break;
    case DType::Bool: store<uint8_t>(p, v != 0); break;
    default: setDouble(i, static_cast<double>(v)); break;
  }
}

DenseTensor DenseTensor::zeros(TensorType type) {
  DenseTensor t;
  t.bytes.assign(static_cast<size_t>(kiln::numElements(type.shape)) * dtypeSize(type.dtype), 0);
  t.type = std::move(type);
  return t;
}

}  // namespace kiln
