// Tensor: a host buffer with a dtype and a static shape, the currency of the
// interpreter and (later) of the runtime's host side.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "ir/Attributes.h"
#include "ir/Types.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);  // zero-filled

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numElements() const;
  size_t numBytes() const { return data_.size(); }
  TensorType type() const { return TensorType{dtype_, staticShape(shape_)}; }

  uint8_t* raw() { return data_.data(); }
  const uint8_t* raw() const { return data_.data(); }
  template <typename T>
  T* data() { return reinterpret_cast<T*>(data_.data()); }
  template <typename T>
  const T* data() const { return reinterpret_cast<const T*>(data_.data()); }

  /// Element `i` as double / int64, and stores converting from them.
  double getDouble(int64_t i) const;
  int64_t getInt(int64_t i) const;
  void setDouble(int64_t i, double v);
  void setInt(int64_t i, int64_t v);

  static Tensor fromDense(const DenseTensor& t);
  /// A tensor holding `bytes` (exactly its type's size; checked by the
  /// caller), copied once without zero-filling first: for large weights.
  static Tensor fromBytes(DType dtype, std::vector<int64_t> shape, std::string_view bytes);
  DenseTensor toDense() const;
  /// Row-major strides in elements.
  std::vector<int64_t> strides() const;

 private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> data_;
};

}  // namespace kiln
