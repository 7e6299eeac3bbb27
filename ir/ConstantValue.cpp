// The values that `constant` ops give (ir/ConstantValue.h).
#include "ir/ConstantValue.h"

#include <cstring>

namespace kiln {

const DenseTensor* constantTensor(const Value* v) {
  const Op* def = v ? v->definingOp() : nullptr;
  if (!def || def->kind() != OpKind::Constant) return nullptr;
  const Attribute* value = def->attr("value");
  if (!value || value->kind() != AttrKind::Tensor) return nullptr;
  return &value->getTensor();
}

std::optional<double> constantScalar(const Value* v) {
  const DenseTensor* t = constantTensor(v);
  if (!t || t->numElements() != 1) return std::nullopt;
  return t->getDouble(0);
}

std::optional<int64_t> constantIntegerScalar(const Value* v) {
  const DenseTensor* t = constantTensor(v);
  if (!t || t->numElements() != 1 || !(isInteger(t->type.dtype) || t->type.dtype == DType::Bool)) return std::nullopt;
  return t->getInt(0);
}

std::optional<double> splatValue(const Value* v) {
  const DenseTensor* t = constantTensor(v);
  if (!t || t->numElements() <= 0) return std::nullopt;
  const size_t size = dtypeSize(t->type.dtype);
  if (t->bytes.size() != size * static_cast<size_t>(t->numElements())) return std::nullopt;
  for (size_t at = size; at < t->bytes.size(); at += size)
    if (std::memcmp(t->bytes.data(), t->bytes.data() + at, size) != 0) return std::nullopt;
  return t->getDouble(0);
}

}  // namespace kiln
