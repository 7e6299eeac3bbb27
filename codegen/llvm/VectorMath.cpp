// The polynomials: exp, log and tanh are Cephes' single-precision ones
// (expf.c, logf.c, tanhf.c by S. Moshier); erf's were fitted for Kiln by
// least squares on Chebyshev nodes (erf(x) = x + x P(x^2) below 0.875,
// 1 - e^(-x^2) Q(1/x) up to 4, where f32's erf is 1). Everything is
// branch-free: both sides of each range split are computed and a select
// picks one, and every special case is a select on the input, so the loop
// vectorizer treats these like plain arithmetic. Inputs are clamped before
// the float-to-int conversion, which would be poison for NaN or out-of-range
// values. Horner steps use llvm.fmuladd (one FMA where the CPU has it).
#include "codegen/llvm/VectorMath.h"

#include <llvm/IR/Intrinsics.h>

#include <initializer_list>
#include <limits>

namespace kiln::codegen {
namespace {

llvm::Value* constant(llvm::Value* like, double v) { return llvm::ConstantFP::get(like->getType(), v); }

llvm::Value* intConstant(llvm::Type* intTy, int64_t v) {
  return llvm::ConstantInt::get(intTy, static_cast<uint64_t>(v), true);
}

/// The i32 type with `x`'s vector shape.
llvm::Type* intType(llvm::IRBuilder<>& b, llvm::Value* x) {
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(x->getType()))
    return llvm::VectorType::get(b.getInt32Ty(), vt->getElementCount());
  return b.getInt32Ty();
}

llvm::Value* fmuladd(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y, llvm::Value* z) {
  return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {x->getType()}, {x, y, z});
}

/// c[0] * x^(n-1) + ... + c[n-1], by Horner's rule.
llvm::Value* polynomial(llvm::IRBuilder<>& b, llvm::Value* x, std::initializer_list<double> c) {
  auto it = c.begin();
  llvm::Value* r = constant(x, *it++);
  for (; it != c.end(); ++it) r = fmuladd(b, r, x, constant(x, *it));
  return r;
}

llvm::Value* clamp(llvm::IRBuilder<>& b, llvm::Value* x, double lo, double hi) {
  // maxnum(NaN, lo) is lo: callers select NaN back in.
  llvm::Value* v = b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, x, constant(x, lo));
  return b.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, v, constant(x, hi));
}

llvm::Value* isNan(llvm::IRBuilder<>& b, llvm::Value* x) { return b.CreateFCmpUNO(x, x); }

llvm::Value* copySign(llvm::IRBuilder<>& b, llvm::Value* magnitude, llvm::Value* sign) {
  return b.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, magnitude, sign);
}

/// 2^n for an i32 `n` in [-126, 127], as the bits of a normal float.
llvm::Value* powerOfTwo(llvm::IRBuilder<>& b, llvm::Value* n, llvm::Type* floatTy) {
  llvm::Value* biased = b.CreateAdd(n, intConstant(n->getType(), 127));
  return b.CreateBitCast(b.CreateShl(biased, intConstant(n->getType(), 23)), floatTy);
}

}  // namespace

llvm::Value* emitExpF32(llvm::IRBuilder<>& b, llvm::Value* x) {
  // Below -104 the result rounds to 0 and above 89 it is inf; inside, n
  // stays in [-150, 128] and each half of it is a normal power of two.
  llvm::Value* xc = clamp(b, x, -104.0, 89.0);
  llvm::Value* n =
      b.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven, b.CreateFMul(xc, constant(x, 1.44269504088896341)));
  // r = x - n ln2 in two steps (0.693359375 has 9 significant bits, so n
  // times it is exact), |r| <= ln2 / 2.
  llvm::Value* r = fmuladd(b, n, constant(x, -0.693359375), xc);
  r = fmuladd(b, n, constant(x, 2.12194440e-4), r);
  llvm::Value* p = polynomial(
      b, r, {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1});
  p = b.CreateFAdd(b.CreateFAdd(b.CreateFMul(p, b.CreateFMul(r, r)), r), constant(x, 1.0));
  // p * 2^n as (p * 2^n1) * 2^n2: the first product is exact, the second
  // rounds once, also when the result is denormal.
  llvm::Type* iTy = intType(b, x);
  llvm::Value* ni = b.CreateFPToSI(n, iTy);
  llvm::Value* n1 = b.CreateAShr(ni, intConstant(iTy, 1));
  llvm::Value* n2 = b.CreateSub(ni, n1);
  llvm::Value* result = b.CreateFMul(b.CreateFMul(p, powerOfTwo(b, n1, x->getType())), powerOfTwo(b, n2, x->getType()));
  return b.CreateSelect(isNan(b, x), x, result);
}

llvm::Value* emitLogF32(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Type* iTy = intType(b, x);
  // Denormals are scaled into the normal range first: x = m 2^e with m in
  // [0.5, 1) read from the bits.
  llvm::Value* denormal = b.CreateFCmpOLT(x, constant(x, std::numeric_limits<float>::min()));
  llvm::Value* scaled = b.CreateSelect(denormal, b.CreateFMul(x, constant(x, 8388608.0)), x);
  llvm::Value* bits = b.CreateBitCast(scaled, iTy);
  llvm::Value* e = b.CreateSub(b.CreateLShr(bits, intConstant(iTy, 23)),
                               b.CreateSelect(denormal, intConstant(iTy, 126 + 23), intConstant(iTy, 126)));
  llvm::Value* m = b.CreateBitCast(
      b.CreateOr(b.CreateAnd(bits, intConstant(iTy, 0x007fffff)), intConstant(iTy, 0x3f000000)), x->getType());
  // m < sqrt(1/2) becomes 2m, so that f = m - 1 lies in [sqrt(1/2) - 1, sqrt(2) - 1].
  llvm::Value* small = b.CreateFCmpOLT(m, constant(x, 0.707106781186547524));
  e = b.CreateSub(e, b.CreateZExt(small, iTy));
  llvm::Value* f = b.CreateFSub(b.CreateSelect(small, b.CreateFAdd(m, m), m), constant(x, 1.0));
  llvm::Value* ef = b.CreateSIToFP(e, x->getType());
  llvm::Value* z = b.CreateFMul(f, f);
  llvm::Value* y = polynomial(b, f,
                              {7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1, 1.4249322787E-1,
                               -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1});
  y = b.CreateFMul(b.CreateFMul(y, f), z);
  // + e ln2, with ln2 split as 0.693359375 - 2.12194440e-4.
  y = fmuladd(b, ef, constant(x, -2.12194440e-4), y);
  y = fmuladd(b, z, constant(x, -0.5), y);
  llvm::Value* result = fmuladd(b, ef, constant(x, 0.693359375), b.CreateFAdd(f, y));
  llvm::Value* inf = constant(x, std::numeric_limits<double>::infinity());
  result = b.CreateSelect(b.CreateFCmpOEQ(x, inf), inf, result);
  result = b.CreateSelect(b.CreateFCmpOEQ(x, constant(x, 0.0)), constant(x, -std::numeric_limits<double>::infinity()),
                          result);
  result = b.CreateSelect(b.CreateFCmpOLT(x, constant(x, 0.0)), constant(x, std::numeric_limits<double>::quiet_NaN()),
                          result);
  return b.CreateSelect(isNan(b, x), x, result);
}

llvm::Value* emitTanhF32(llvm::IRBuilder<>& b, llvm::Value* x) {
  // On |x| and copying the sign back, so tanh(-0) is -0.
  llvm::Value* a = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  llvm::Value* z = b.CreateFMul(a, a);
  llvm::Value* p =
      polynomial(b, z, {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2, 1.33314422036E-1, -3.33332819422E-1});
  llvm::Value* nearZero = fmuladd(b, b.CreateFMul(p, z), a, a);
  // 1 - 2 / (e^2a + 1): e^2a overflows to inf above 44, giving exactly 1.
  llvm::Value* e = emitExpF32(b, b.CreateFAdd(a, a));
  llvm::Value* far = b.CreateFSub(constant(x, 1.0), b.CreateFDiv(constant(x, 2.0), b.CreateFAdd(e, constant(x, 1.0))));
  llvm::Value* result = b.CreateSelect(b.CreateFCmpOLT(a, constant(x, 0.625)), nearZero, far);
  return copySign(b, result, x);  // NaN stays NaN through both branches
}

llvm::Value* emitErfF32(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Value* a = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  llvm::Value* z = b.CreateFMul(a, a);
  llvm::Value* p = polynomial(b, z,
                              {-6.254293257370591e-4, 5.042351316660643e-3, -2.679867297410965e-2,
                               1.1282670497894287e-1, -3.761257529258728e-1, 1.2837916612625122e-1});
  llvm::Value* nearZero = fmuladd(b, a, p, a);
  // Beyond 4, f32's erf is 1: clamping there keeps e^(-x^2) and 1/x finite.
  llvm::Value* ac = clamp(b, a, 0.875, 4.0);
  llvm::Value* q = polynomial(
      b, b.CreateFDiv(constant(x, 1.0), ac),
      {3.796865639742464e-4, -2.032501809298992e-2, 1.2718021869659424e-1, -3.6329200863838196e-1, 5.831818580627441e-1,
       -5.095129609107971e-1, 5.202694237232208e-2, 5.575852990150452e-1, 3.595332964323461e-4});
  llvm::Value* far = b.CreateFSub(constant(x, 1.0), b.CreateFMul(emitExpF32(b, b.CreateFNeg(b.CreateFMul(ac, ac))), q));
  llvm::Value* result = copySign(b, b.CreateSelect(b.CreateFCmpOLT(a, constant(x, 0.875)), nearZero, far), x);
  return b.CreateSelect(isNan(b, x), x, result);
}

llvm::Value* emitSigmoidF32(llvm::IRBuilder<>& b, llvm::Value* x) {
  // With e = e^-|x|: 1 / (1 + e) for x >= 0, e / (1 + e) below, so that
  // tiny results keep their precision instead of 1 / inf = 0.
  llvm::Value* e = emitExpF32(b, b.CreateFNeg(b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x)));
  llvm::Value* numerator = b.CreateSelect(b.CreateFCmpOLT(x, constant(x, 0.0)), e, constant(x, 1.0));
  return b.CreateFDiv(numerator, b.CreateFAdd(constant(x, 1.0), e));  // NaN: e is NaN
}

}  // namespace kiln::codegen
