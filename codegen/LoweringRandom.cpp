// Lowerings of the Random family: the counter-based samplers, a hash of (seed, element index).
// The index helpers are in codegen/LoweringSupport.h; the table at the end
// registers this family's lowering of each of its ops (null where it has none).
#include "codegen/LoweringSupport.h"

#include <algorithm>
#include <limits>
#include <numbers>
#include <numeric>

namespace kiln::codegen {
namespace {

using namespace lower;

// --- Random ------------------------------------------------------------------------

/// `v >> k` on the 64 bits of i64 `v`, as unsigned (logical shift), built
/// from operations the kernel IR has: the low 63 bits divided by 2^k, plus
/// the sign bit moved to bit 63 - k. LLVM turns it back into one shift.
ExprPtr shiftRightLogical(const ExprPtr& v, int k) {
  const ExprPtr low = kir::binary(kir::BinaryFn::And, v, kir::index(std::numeric_limits<int64_t>::max()));
  const ExprPtr shifted = kir::binary(kir::BinaryFn::Div, low, kir::index(int64_t{1} << k));
  const ExprPtr top = kir::select(kir::binary(kir::BinaryFn::Lt, v, kir::index(0)), kir::index(int64_t{1} << (63 - k)),
                                  kir::index(0));
  return kir::binary(kir::BinaryFn::Add, shifted, top);
}

/// u_i in [0, 1) as an f64 expression: the interpreter's sample of element
/// `i` (runtime/RandomKernels.cpp), (splitmix64(seed * G + i) >> 11) * 2^-53,
/// in wrapping i64 arithmetic on the same bits.
ExprPtr uniformAt(int64_t seed, const ExprPtr& i) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  // splitmix64 adds G first; seed * G + G folds on the host (unsigned, so
  // wrapping is defined).
  const uint64_t start = static_cast<uint64_t>(seed) * kGolden + kGolden;
  auto bits = [](uint64_t u) { return kir::index(static_cast<int64_t>(u)); };
  ExprPtr z = kir::binary(kir::BinaryFn::Add, bits(start), i);
  z = kir::binary(kir::BinaryFn::Mul, kir::binary(kir::BinaryFn::Xor, z, shiftRightLogical(z, 30)),
                  bits(0xBF58476D1CE4E5B9ull));
  z = kir::binary(kir::BinaryFn::Mul, kir::binary(kir::BinaryFn::Xor, z, shiftRightLogical(z, 27)),
                  bits(0x94D049BB133111EBull));
  z = kir::binary(kir::BinaryFn::Xor, z, shiftRightLogical(z, 31));
  return kir::binary(kir::BinaryFn::Mul, kir::cast(shiftRightLogical(z, 11), DType::F64),
                     kir::constant(DType::F64, 0x1.0p-53));
}

/// random_uniform: low + (high - low) * u_i in f64, then the result dtype.
Expected<ExprPtr> lowerRandomUniform(const Op& op, LoweringContext&, const Index& index) {
  const ExprPtr i = linearize(index, dimsOf(op.result()));
  const double low = op.getFloat("low"), high = op.getFloat("high");
  const ExprPtr u = uniformAt(op.getInt("seed"), i);
  const ExprPtr v = kir::binary(kir::BinaryFn::Add, kir::constant(DType::F64, low),
                                kir::binary(kir::BinaryFn::Mul, kir::constant(DType::F64, high - low), u));
  return kir::cast(v, op.result()->type().dtype);
}

/// random_normal: Box-Muller of u_{2j}, u_{2j+1} (j = i / 2), the cosine
/// for even i and the sine for odd i, as the interpreter; in f64.
Expected<ExprPtr> lowerRandomNormal(const Op& op, LoweringContext&, const Index& index) {
  using kir::BinaryFn;
  const ExprPtr i = linearize(index, dimsOf(op.result()));
  const int64_t seed = op.getInt("seed");
  const ExprPtr odd = kir::binary(BinaryFn::Rem, i, kir::index(2));
  const ExprPtr even = kir::binary(BinaryFn::Sub, i, odd);  // 2j
  const ExprPtr u1 = kir::binary(BinaryFn::Max, uniformAt(seed, even), kir::constant(DType::F64, 0x1.0p-53));
  const ExprPtr u2 = uniformAt(seed, kir::binary(BinaryFn::Add, even, kir::index(1)));
  const ExprPtr radius = kir::unary(
      kir::UnaryFn::Sqrt, kir::binary(BinaryFn::Mul, kir::constant(DType::F64, -2.0), kir::unary(kir::UnaryFn::Log, u1)));
  const ExprPtr angle = kir::binary(BinaryFn::Mul, kir::constant(DType::F64, 2.0 * std::numbers::pi), u2);
  const ExprPtr z = kir::binary(
      BinaryFn::Mul, radius,
      kir::select(kir::binary(BinaryFn::Eq, odd, kir::index(0)), kir::unary(kir::UnaryFn::Cos, angle),
                  kir::unary(kir::UnaryFn::Sin, angle)));
  const ExprPtr v = kir::binary(BinaryFn::Add, kir::constant(DType::F64, op.getFloat("mean")),
                                kir::binary(BinaryFn::Mul, kir::constant(DType::F64, op.getFloat("std")), z));
  return kir::cast(v, op.result()->type().dtype);
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace lowerings {
using kir::BinaryFn;
using kir::ReduceKind;
using kir::UnaryFn;
const LowerFn RandomUniform = lowerRandomUniform;
const LowerFn RandomNormal = lowerRandomNormal;
}  // namespace lowerings

}  // namespace kiln::codegen
