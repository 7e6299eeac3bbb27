// The checks of the tensors bound to a model's inputs, shared by `kiln run`
// and the Python package, so that both say the same: each message names the
// input, the type it expects and what it got, and how to convert it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ir/Types.h"
#include "runtime/Tensor.h"

namespace kiln {

/// The NumPy name of a dtype, for advice on converting an input.
std::string_view numpyName(DType dtype);

/// Symbolic dims bound so far: symbol -> (size, the input that fixed it).
using SymbolBindings = std::map<std::string, std::pair<int64_t, std::string>, std::less<>>;

/// Checks a tensor for input `name` against the argument type `expected`,
/// binding its symbolic dims. `source` says where the tensor came from
/// ("from 'x.npy'"). Returns a message, or nullopt when it fits.
std::optional<std::string> checkInput(const std::string& name, const TensorType& expected, const Tensor& actual,
                                      const std::string& source, SymbolBindings& symbols);

}  // namespace kiln
