// A library call as plain data: one matmul, convolution or transposed
// convolution (f32, or int8 with its requantization) with the epilogue the library applies to its result
// (post-ops), described by shapes and numbers alone. Code generation fills
// one in from a `library` group of the IR (codegen/cpu/CpuTarget.h), a compiled
// program stores it, and the runtime creates the library's primitive from it
// (runtime/DnnlKernels.h on the CPU) without seeing the IR.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/Types.h"

namespace kiln {

/// One post-op: an elementwise function of the running value, or a binary op
/// with a tensor operand of the call that broadcasts into the result.
struct PostOp {
  enum class Kind : uint8_t {
    Relu, Tanh, Sigmoid, Exp, Log, Abs, Sqrt,
    Linear,  // alpha * x + beta
    GeluErf, GeluTanh, Swish,  // swish: x * sigmoid(alpha * x)
    Add, Sub, Mul, Div, Max, Min,  // binary, the running value on the left
    Clip,  // min(max(x, alpha), beta): max or min with a constant (ReLU6's min(x, 6))
  };
  Kind kind = Kind::Relu;
  float alpha = 0;
  float beta = 0;
  /// Binary: the call's operand (its index among the call's buffers) and its
  /// dims, right-aligned to the result's rank with leading 1s.
  int operand = -1;
  std::vector<int64_t> dims;
  /// The op it came from, for descriptions: "add", "relu", "gelu_erf".
  std::string name;

  bool isBinary() const { return kind >= Kind::Add && kind <= Kind::Min; }
  bool operator==(const PostOp&) const = default;
};

struct LibraryCall {
  enum class Kind : uint8_t { MatMul, Conv, ConvTranspose, ConvWeightGrad };
  Kind kind = Kind::MatMul;
  /// The call's buffers holding the anchor's operands: (a, b) of a matmul,
  /// (x, w[, bias]) of a convolution, (x, dy) of a convolution's weight
  /// gradient (whose result is w-shaped); the result is the last buffer.
  std::vector<int> operands;
  /// Their dims, and the result's.
  std::vector<std::vector<int64_t>> operandDims;
  std::vector<int64_t> resultDims;
  /// The buffer the result is written to: the call's buffers are its
  /// operands, then the result.
  int resultBuffer = 0;
  /// Convolutions: strides, pads (begins then ends), dilations (all per
  /// spatial dim, filled in), groups; output_padding of a transposed one.
  std::vector<int64_t> strides, pads, dilations, outputPadding;
  int64_t groups = 1;
  /// Convolutions: x, the result and tensor post-op operands are stored
  /// channels last ([N, D..., C], as their dims say); w stays [M, C/g, K...].
  bool channelsLast = false;
  /// Matmuls: a's buffer holds a with its last two dims swapped ([..., K,
  /// M] for operandDims[0] of [..., M, K]), read through transposed
  /// strides: the dy^T of a weight's gradient dy^T x (passes/Target.h,
  /// transposeReadInPlace), which no transpose kernel then copies.
  bool transposedA = false;
  /// Matmuls: b's buffer holds b with its last two dims swapped ([..., N,
  /// K] for operandDims[1] of [..., K, N]), read through transposed strides:
  /// a Linear's weight stored as exporters store it, attention's k for
  /// q k^T (passes/Target.h, transposeReadInPlace).
  bool transposedB = false;
  std::vector<PostOp> postOps;
  /// Quantized calls (qconv, qmatmul): x and the result are u8 or i8, w i8
  /// and the bias i32; `scales` (one per output channel) take the i32
  /// accumulator to the result's scale, where relu (a post-op) applies and
  /// the result's zero point is added; padding holds x's zero point.
  /// Mixed-precision calls (the autocast pass's): every operand (x, w, the
  /// bias; a and b) bf16 or f16 as srcType says, accumulated in f32, where
  /// the post-ops apply. A float call's dstType may be bf16 or f16: the
  /// f32 value after the post-ops is stored rounded to it (an epilogue's
  /// last cast). F32 for every other call (whose operands and result share
  /// one float type).
  DType srcType = DType::F32;
  DType dstType = DType::F32;
  int32_t srcZeroPoint = 0;
  int32_t dstZeroPoint = 0;
  std::vector<float> scales;

  bool quantized() const { return isInteger(srcType); }
  bool mixedPrecision() const { return srcType == DType::BF16 || srcType == DType::F16; }
  bool operator==(const LibraryCall&) const = default;
};

/// The multiply-adds of `call`'s matmul or convolution: each result element
/// of a matmul takes k, of a convolution C/g x taps; each input element of
/// a transposed convolution meets M/g x taps weights. Whether a call is
/// worth splitting across threads is decided from it.
int64_t libraryCallWork(const LibraryCall& call);

}  // namespace kiln
