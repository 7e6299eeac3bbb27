// The precision a model is compiled for (`--precision`, `precision=` in
// Python, a `.kc`'s precision): what the autocast pass (passes/Autocast.cpp)
// and the backends' libraries make of a float32 model. docs/precision.md
// says what each one means, op by op.
//
//   fp32  float32 everywhere (the default).
//   tf32  float32 tensors; CUDA's matmuls and convolutions may round their
//         inputs to TF32 on the tensor cores (PyTorch's allow_tf32). The
//         CPU has no TF32 and computes in float32.
//   bf16  matmuls and convolutions take bfloat16 inputs and accumulate and
//         store in float32; everything else stays float32.
//   fp16  the same with float16 inputs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ir/Support.h"
#include "ir/Types.h"

namespace kiln {

enum class Precision : uint8_t { FP32, TF32, BF16, FP16 };

/// "fp32", "tf32", "bf16" or "fp16".
std::string_view precisionName(Precision p);
/// The precision `name` names (also "f32", "float32", "bfloat16", "f16",
/// "float16", "half"), or an error listing the valid names.
Expected<Precision> parsePrecision(std::string_view name);
/// The dtype the autocast pass gives the inputs of matmuls and
/// convolutions: bf16 or f16; none for fp32 and tf32.
std::optional<DType> autocastDType(Precision p);

}  // namespace kiln
