// Tensor: a host buffer with a dtype and a static shape, the currency of the
// interpreter and of the runtime's host side. Buffers whose size comes from
// a model (results, the arena, constants, copies of inputs) are allocated
// through Tensor::allocate and the helpers beside it, which turn a size that
// overflows or memory that runs out into an error naming the value, its type
// and the bytes instead of an uncaught std::bad_alloc.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/Attributes.h"
#include "ir/ByteSize.h"
#include "ir/Support.h"
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

  /// A zero-filled tensor, or allocationError (naming `value`, e.g. "%y",
  /// and `origin`) when its size overflows or the memory is not there.
  static Expected<Tensor> allocate(DType dtype, std::vector<int64_t> shape, std::string_view value,
                                   std::string_view origin = {});
  /// A copy of `t`, or allocationError like allocate().
  static Expected<Tensor> copyOf(const Tensor& t, std::string_view value, std::string_view origin = {});
  /// fromDense, or allocationError like allocate().
  static Expected<Tensor> copyOf(const DenseTensor& t, std::string_view value, std::string_view origin = {});

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
