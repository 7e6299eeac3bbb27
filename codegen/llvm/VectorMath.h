// Inline f32 math for the LLVM emitter: exp, log, tanh, erf and sigmoid as
// straight-line LLVM IR (range reduction, a polynomial, selects for the
// special cases), so that loops calling them vectorize like any other
// arithmetic instead of making one libm call per element. Accuracy against
// glibc over the whole f32 range is asserted by test/unit/VectorMathTest.cpp
// (max ulp per function listed in docs/codegen.md section 3); inf, -inf,
// NaN, signed zeros, denormal inputs and results, overflow and saturation
// come out as libm gives them. f64 keeps libm: these polynomials are f32's.
#pragma once

#include <llvm/IR/IRBuilder.h>

namespace kiln::codegen {

/// e^x for an f32 (or vector of f32) value `x`.
llvm::Value* emitExpF32(llvm::IRBuilder<>& b, llvm::Value* x);
/// Natural log of `x` (f32).
llvm::Value* emitLogF32(llvm::IRBuilder<>& b, llvm::Value* x);
/// tanh(x) (f32).
llvm::Value* emitTanhF32(llvm::IRBuilder<>& b, llvm::Value* x);
/// erf(x) (f32).
llvm::Value* emitErfF32(llvm::IRBuilder<>& b, llvm::Value* x);
/// 1 / (1 + e^-x) (f32), accurate also where the result is tiny.
llvm::Value* emitSigmoidF32(llvm::IRBuilder<>& b, llvm::Value* x);

}  // namespace kiln::codegen
