#include "ir/Precision.h"

namespace kiln {

std::string_view precisionName(Precision p) {
  switch (p) {
    case Precision::FP32: return "fp32";
    case Precision::TF32: return "tf32";
    case Precision::BF16: return "bf16";
    case Precision::FP16: return "fp16";
  }
  return "fp32";
}

Expected<Precision> parsePrecision(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return Precision::FP32;
  if (name == "tf32") return Precision::TF32;
  if (name == "bf16" || name == "bfloat16") return Precision::BF16;
  if (name == "fp16" || name == "f16" || name == "float16" || name == "half") return Precision::FP16;
  return Error("unknown precision '" + std::string(name) + "'; expected fp32, tf32, bf16 or fp16");
}

std::optional<DType> autocastDType(Precision p) {
  if (p == Precision::BF16) return DType::BF16;
  if (p == Precision::FP16) return DType::F16;
  return std::nullopt;
}

}  // namespace kiln
