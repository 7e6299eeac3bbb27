// The checks of a model's inputs (InputCheck.h).
#include "runtime/InputCheck.h"

namespace kiln {

std::string_view numpyName(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return "float64";
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    case DType::BF16:
      return "bfloat16 (not a NumPy dtype)";
    case DType::I64:
      return "int64";
    case DType::I32:
      return "int32";
    case DType::I16:
      return "int16";
    case DType::I8:
      return "int8";
    case DType::U8:
      return "uint8";
    case DType::U16:
      return "uint16";
    case DType::U32:
      return "uint32";
    case DType::U64:
      return "uint64";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

std::optional<std::string> checkInput(const std::string& name, const TensorType& expected, const Tensor& actual,
                                      const std::string& source, SymbolBindings& symbols) {
  const std::string head =
      "input '" + name + "' expects " + expected.str() + ", got " + actual.type().str() + " " + source;
  if (actual.dtype() != expected.dtype) {
    if (expected.dtype == DType::BF16) return head;
    return head + " (convert it with .astype(numpy." + std::string(numpyName(expected.dtype)) + "))";
  }
  if (actual.rank() != expected.rank())
    return head + " (rank " + std::to_string(actual.rank()) + ", expected rank " + std::to_string(expected.rank()) +
           ")";
  for (int64_t d = 0; d < expected.rank(); ++d) {
    const Dim& dim = expected.shape[d];
    const int64_t size = actual.shape()[d];
    if (dim.isStatic() && dim.size != size)
      return head + " (dim " + std::to_string(d) + " must be " + std::to_string(dim.size) + ")";
    if (!dim.isSymbolic()) continue;
    auto [it, inserted] = symbols.emplace(dim.symbol, std::make_pair(size, name));
    if (!inserted && it->second.first != size)
      return head + " (" + dim.symbol + " is " + std::to_string(it->second.first) + " from input '" +
             it->second.second + "')";
  }
  return std::nullopt;
}

}  // namespace kiln
