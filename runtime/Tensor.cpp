// Tensor: a zero-initialised host buffer with a dtype and a static shape.
// Element access converts through double or int64 with the same rules as
// DenseTensor (bool as 0/1, 16-bit floats widened, integers wrap on store),
// except that storing a NaN or out-of-range double into an integer element
// saturates instead of being undefined behaviour. Tensor::allocate and
// copyOf are the checked allocations: sizes are computed without overflow
// and std::bad_alloc (or the vector's length_error) is caught where the
// buffer is made, so the error can name the value it was for.
#include "runtime/Tensor.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>
#include <stdexcept>

#include "ir/ScalarSemantics.h"

namespace kiln {

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

/// Truncates toward zero, mapping NaN to 0 and clamping to the int64 range
/// (ir/ScalarSemantics.h, as the compiled kernels cast), so that a
/// float-to-integer conversion never has undefined behaviour.
int64_t truncateToInt64(double v) { return kiln_ftoi(v); }

}  // namespace

Expected<Tensor> Tensor::allocate(DType dtype, std::vector<int64_t> shape, std::string_view value,
                                  std::string_view origin) {
  const std::optional<uint64_t> bytes = tensorByteSize(dtype, shape);
  Tensor result;
  result.dtype_ = dtype;
  result.shape_ = std::move(shape);
  if (!bytes) return allocationError(bytes, value, result.type(), origin);
  try {
    result.data_.assign(static_cast<size_t>(*bytes), 0);
  } catch (const std::bad_alloc&) {
    return allocationError(bytes, value, result.type(), origin);
  } catch (const std::length_error&) {
    return allocationError(bytes, value, result.type(), origin);
  }
  return result;
}

Expected<Tensor> Tensor::copyOf(const Tensor& t, std::string_view value, std::string_view origin) {
  Tensor result;
  result.dtype_ = t.dtype_;
  result.shape_ = t.shape_;
  try {
    result.data_ = t.data_;
  } catch (const std::bad_alloc&) {
    return allocationError(t.data_.size(), value, t.type(), origin);
  }
  return result;
}

Expected<Tensor> Tensor::copyOf(const DenseTensor& t, std::string_view value, std::string_view origin) {
  try {
    return fromDense(t);
  } catch (const std::bad_alloc&) {
    return allocationError(t.bytes.size(), value, t.type, origin);
  }
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  for ([[maybe_unused]] int64_t d : shape_) assert(d >= 0 && "tensor dims must be non-negative");
  data_.assign(static_cast<size_t>(numElements()) * dtypeSize(dtype_), 0);
}

int64_t Tensor::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

double Tensor::getDouble(int64_t i) const {
  const uint8_t* p = data_.data() + i * static_cast<int64_t>(dtypeSize(dtype_));
  switch (dtype_) {
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

int64_t Tensor::getInt(int64_t i) const {
  const uint8_t* p = data_.data() + i * static_cast<int64_t>(dtypeSize(dtype_));
  switch (dtype_) {
    case DType::I64: return load<int64_t>(p);
    case DType::I32: return load<int32_t>(p);
    case DType::I16: return load<int16_t>(p);
    case DType::I8: return load<int8_t>(p);
    case DType::U8: return load<uint8_t>(p);
    case DType::U16: return load<uint16_t>(p);
    case DType::U32: return load<uint32_t>(p);
    // The bits: values from 2^63 up read as negative (getUnsigned reads
    // them as they are).
    case DType::U64: return static_cast<int64_t>(load<uint64_t>(p));
    case DType::Bool: return load<uint8_t>(p) ? 1 : 0;
    case DType::F64:
    case DType::F32:
    case DType::F16:
    case DType::BF16: return truncateToInt64(getDouble(i));
  }
  return 0;
}

void Tensor::setDouble(int64_t i, double v) {
  uint8_t* p = data_.data() + i * static_cast<int64_t>(dtypeSize(dtype_));
  switch (dtype_) {
    case DType::F64: store<double>(p, v); break;
    case DType::F32: store<float>(p, static_cast<float>(v)); break;
    case DType::F16: store<uint16_t>(p, floatToHalf(static_cast<float>(v))); break;
    case DType::BF16: store<uint16_t>(p, floatToBFloat16(static_cast<float>(v))); break;
    case DType::Bool: store<uint8_t>(p, v != 0.0); break;
    case DType::I64:
    case DType::I32:
    case DType::I16:
    case DType::I8:
    case DType::U8:
    case DType::U16:
    case DType::U32: setInt(i, truncateToInt64(v)); break;
    case DType::U64: store<uint64_t>(p, kiln_ftou(v)); break;
  }
}

void Tensor::setInt(int64_t i, int64_t v) {
  uint8_t* p = data_.data() + i * static_cast<int64_t>(dtypeSize(dtype_));
  // Narrowing conversions of integers are modular since C++20: two's
  // complement wrap-around, as the IR specifies.
  switch (dtype_) {
    case DType::I64: store<int64_t>(p, v); break;
    case DType::I32: store<int32_t>(p, static_cast<int32_t>(v)); break;
    case DType::I16: store<int16_t>(p, static_cast<int16_t>(v)); break;
    case DType::I8: store<int8_t>(p, static_cast<int8_t>(v)); break;
    case DType::U8: store<uint8_t>(p, static_cast<uint8_t>(v)); break;
    case DType::U16: store<uint16_t>(p, static_cast<uint16_t>(v)); break;
    case DType::U32: store<uint32_t>(p, static_cast<uint32_t>(v)); break;
    case DType::U64: store<uint64_t>(p, static_cast<uint64_t>(v)); break;
    case DType::Bool: store<uint8_t>(p, v != 0); break;
    case DType::F64:
    case DType::F32:
    case DType::F16:
    case DType::BF16: setDouble(i, static_cast<double>(v)); break;
  }
}

Tensor Tensor::fromDense(const DenseTensor& t) {
  Tensor result(t.type.dtype, staticDims(t.type.shape));
  assert(result.data_.size() == t.bytes.size() && "dense tensor bytes do not match its type");
  std::memcpy(result.data_.data(), t.bytes.data(), std::min(result.data_.size(), t.bytes.size()));
  // Bools are stored as 0/1 bytes; normalise any other non-zero byte.
  if (result.dtype_ == DType::Bool)
    for (uint8_t& b : result.data_) b = b != 0;
  return result;
}

Tensor Tensor::fromBytes(DType dtype, std::vector<int64_t> shape, std::string_view bytes) {
  Tensor result;
  result.dtype_ = dtype;
  result.shape_ = std::move(shape);
  assert(static_cast<size_t>(result.numElements()) * dtypeSize(dtype) == bytes.size() &&
         "tensor bytes do not match its type");
  result.data_.assign(bytes.begin(), bytes.end());
  if (dtype == DType::Bool)
    for (uint8_t& b : result.data_) b = b != 0;
  return result;
}

DenseTensor Tensor::toDense() const {
  DenseTensor t;
  t.type = type();
  t.bytes = data_;
  return t;
}

std::vector<int64_t> Tensor::strides() const {
  std::vector<int64_t> s(shape_.size());
  int64_t stride = 1;
  for (size_t d = shape_.size(); d-- > 0;) {
    s[d] = stride;
    stride *= shape_[d];
  }
  return s;
}

}  // namespace kiln
