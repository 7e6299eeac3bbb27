// Kiln's scalar semantics, written once: what max, min, mod, rem, integer
// division and pow, round, sign, relu, float-to-integer casts and integer
// arithmetic mean on one element, wherever they run. Three compilers read
// this text:
//  - the host compiler, for the interpreter (runtime/ElementwiseKernels.cpp,
//    the reference oracle) and Tensor's conversions (runtime/Tensor.cpp);
//  - NVRTC, as the start of every CUDA translation unit
//    (codegen/cuda/CudaEmitter.cpp; CMake embeds this file as a string);
//  - clang-16, which compiles it to LLVM bitcode that the CPU JIT links into
//    each kernel module (codegen/llvm/ScalarLibrary.h).
// So it includes nothing and uses compiler builtins where it needs libm
// (NVRTC has no standard headers), is valid C++17, and its names are global
// with a `kiln_` prefix: one spelling serves host C++, CUDA C++ and the C
// entry points of the bitcode. Floats come as `float` and `double`,
// integers as any builtin integer type (the dtype's own width on the CPU and
// GPU; in the interpreter int64 for the signed dtypes and uint64 for the
// unsigned ones, which wrap on store: both give the same bits, as wrapping
// arithmetic is arithmetic modulo 2^width, and comparison, division and
// remainder see the same values).
//
// Naming follows LLVM: `rem` is C's truncated remainder (the dividend's
// sign), `mod` is Python's % (the divisor's sign).
//
// The functions are written to compile to branch-free code: conditions are
// combined with | and & (not the short-circuit || and &&, which clang turns
// into branches), and every operation that could trap or be undefined is
// made safe and then computed unconditionally, with the special cases
// chosen afterwards. Branches inside a kernel's loop would stop LLVM's
// vectorizer; selects do not.
//
// Include guards rather than #pragma once: the CUDA prelude pastes this text
// into the main file, where #pragma once draws a warning.
#ifndef KILN_IR_SCALAR_SEMANTICS_H
#define KILN_IR_SCALAR_SEMANTICS_H

#if defined(__CUDACC__)
#define KILN_SCALAR __device__ __forceinline__
#else
#define KILN_SCALAR inline
#endif

// --- What each compiler spells differently -----------------------------------

#if defined(__CUDACC__)
// CUDA's device math library; rint rounds half to even in the default
// (and only) rounding mode of device code.
KILN_SCALAR float kiln_frem(float x, float y) { return fmodf(x, y); }
KILN_SCALAR double kiln_frem(double x, double y) { return fmod(x, y); }
KILN_SCALAR float kiln_fround(float x) { return rintf(x); }
KILN_SCALAR double kiln_fround(double x) { return rint(x); }
#else
// GCC's and clang's builtins need no header; clang lowers them to LLVM's
// frem (given -fno-math-errno) and llvm.roundeven, which vectorize.
/// C's fmod: the truncated remainder, with the dividend's sign.
KILN_SCALAR float kiln_frem(float x, float y) { return __builtin_fmodf(x, y); }
KILN_SCALAR double kiln_frem(double x, double y) { return __builtin_fmod(x, y); }
/// Rounds half to even whatever the current rounding mode (clang 16 spells
/// C23's roundeven only as an elementwise builtin).
#if defined(__clang__)
KILN_SCALAR float kiln_fround(float x) { return __builtin_elementwise_roundeven(x); }
KILN_SCALAR double kiln_fround(double x) { return __builtin_elementwise_roundeven(x); }
#else
KILN_SCALAR float kiln_fround(float x) { return __builtin_roundevenf(x); }
KILN_SCALAR double kiln_fround(double x) { return __builtin_roundeven(x); }
#endif
#endif

// --- Floats --------------------------------------------------------------------

/// max and min propagate NaN (x + y is NaN when either is), unlike C's fmax,
/// which returns the other operand. Of two equal values the second is
/// returned, so max(0, -0) is -0.
template <typename T>
KILN_SCALAR T kiln_fmax(T x, T y) {
  return ((x != x) | (y != y)) ? x + y : (x > y ? x : y);
}
template <typename T>
KILN_SCALAR T kiln_fmin(T x, T y) {
  return ((x != x) | (y != y)) ? x + y : (x < y ? x : y);
}

/// hard_swish: x * min(max(x + 3, 0), 6) / 6 in PyTorch's order of
/// operations (the kernel IR lowering builds the same expression), with max
/// and min propagating NaN; -inf gives NaN (as -inf * 0), +inf gives +inf.
template <typename T>
KILN_SCALAR T kiln_fhardswish(T x) {
  return x * kiln_fmin(kiln_fmax(x + T(3), T(0)), T(6)) / T(6);
}

/// Python's mod: the remainder moved to the divisor's sign. A zero
/// remainder keeps its sign (-0.0 mod 3 is -0.0), as the interpreter always
/// did; mod by zero is NaN, as fmod's.
template <typename T>
KILN_SCALAR T kiln_fmod(T x, T y) {
  const T r = kiln_frem(x, y);
  return ((r != T(0)) & ((r < T(0)) != (y < T(0)))) ? T(r + y) : r;
}

/// -1, 0 or 1; NaN stays NaN and a zero keeps its sign.
template <typename T>
KILN_SCALAR T kiln_fsign(T x) {
  return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x);
}

/// max(x, 0) that keeps NaN (a NaN input is not hidden as 0); -0 gives +0.
template <typename T>
KILN_SCALAR T kiln_frelu(T x) {
  return ((x > T(0)) | (x != x)) ? x : T(0);
}

/// Float to integer: truncates toward zero into int64, NaN gives 0 and
/// values beyond int64's range its nearest end (C++ leaves both undefined);
/// a narrower integer dtype then keeps the low bits (wraps).
template <typename T>
KILN_SCALAR long long kiln_ftoi(T x) {
  const bool high = x >= T(9223372036854775807.0), low = x <= T(-9223372036854775808.0);  // +-2^63
  const long long truncated = (long long)(((x != x) | high | low) ? T(0) : x);
  return high ? 9223372036854775807LL : (low ? -9223372036854775807LL - 1 : truncated);
}

/// Float to an unsigned 64-bit integer: as kiln_ftoi below 2^63 (so a
/// negative value wraps, as it does for the narrower unsigned dtypes), exact
/// truncation from 2^63 up, and 2^64 - 1 from 2^64 up; NaN gives 0.
template <typename T>
KILN_SCALAR unsigned long long kiln_ftou(T x) {
  const bool upper = x >= T(9223372036854775808.0), high = x >= T(18446744073709551616.0);  // 2^63, 2^64
  const unsigned long long wide = (unsigned long long)((upper & !high) ? x : T(0));
  const unsigned long long low = (unsigned long long)kiln_ftoi(x);
  return high ? 18446744073709551615ULL : (upper ? wide : low);
}

// --- Integers --------------------------------------------------------------------

/// The unsigned type in which T's arithmetic wraps: unsigned int for every
/// type up to int (narrower unsigned types would promote to signed int,
/// where a product can overflow), else T's own width.
template <typename T>
struct kiln_wrapping {
  typedef unsigned int type;
};
template <>
struct kiln_wrapping<long> {
  typedef unsigned long type;
};
template <>
struct kiln_wrapping<long long> {
  typedef unsigned long long type;
};
template <>
struct kiln_wrapping<unsigned long> {
  typedef unsigned long type;
};
template <>
struct kiln_wrapping<unsigned long long> {
  typedef unsigned long long type;
};

/// + - * and negation wrap (two's complement), never overflow: signed
/// overflow is undefined behaviour in C++ and CUDA C++.
template <typename T>
KILN_SCALAR T kiln_iadd(T x, T y) {
  typedef typename kiln_wrapping<T>::type U;
  return T(U(x) + U(y));
}
template <typename T>
KILN_SCALAR T kiln_isub(T x, T y) {
  typedef typename kiln_wrapping<T>::type U;
  return T(U(x) - U(y));
}
template <typename T>
KILN_SCALAR T kiln_imul(T x, T y) {
  typedef typename kiln_wrapping<T>::type U;
  return T(U(x) * U(y));
}
template <typename T>
KILN_SCALAR T kiln_ineg(T x) {
  typedef typename kiln_wrapping<T>::type U;
  return T(U(0) - U(x));
}
/// |INT_MIN| wraps to INT_MIN.
template <typename T>
KILN_SCALAR T kiln_iabs(T x) {
  return x < T(0) ? kiln_ineg(x) : x;
}
template <typename T>
KILN_SCALAR T kiln_isign(T x) {
  return T((x > T(0)) - (x < T(0)));
}
template <typename T>
KILN_SCALAR T kiln_irelu(T x) {
  return x > T(0) ? x : T(0);
}
template <typename T>
KILN_SCALAR T kiln_imax(T x, T y) {
  return x > y ? x : y;
}
template <typename T>
KILN_SCALAR T kiln_imin(T x, T y) {
  return x < y ? x : y;
}

/// Whether y is -1 of a signed type (for an unsigned T no value is).
template <typename T>
KILN_SCALAR bool kiln_is_minus_one(T y) {
  return (T(-1) < T(0)) & (y == T(-1));
}

/// Integer division truncates and never traps: a zero divisor gives 0 (the
/// executors report it on the host before a kernel runs; the interpreter
/// reports it instead of calling this), and INT_MIN / -1 wraps to INT_MIN.
/// The divisor actually used is never 0 or -1, so the hardware division
/// cannot fault; x / -1 is computed as -(x / 1), so that both cases use
/// the one division (see above: no branch around it).
template <typename T>
KILN_SCALAR T kiln_idiv(T x, T y) {
  const bool zero = y == T(0), minusOne = kiln_is_minus_one(y);
  const T quotient = T(x / ((zero | minusOne) ? T(1) : y));
  return zero ? T(0) : (minusOne ? kiln_ineg(quotient) : quotient);
}

/// C's %: the dividend's sign; 0 for a zero divisor, and INT_MIN % -1 is 0.
template <typename T>
KILN_SCALAR T kiln_irem(T x, T y) {
  const bool special = (y == T(0)) | kiln_is_minus_one(y);
  const T remainder = T(x % (special ? T(1) : y));
  return special ? T(0) : remainder;
}

/// Python's %: the divisor's sign; 0 for a zero divisor.
template <typename T>
KILN_SCALAR T kiln_imod(T x, T y) {
  const T r = kiln_irem(x, y);
  return ((r != T(0)) & ((r < T(0)) != (y < T(0)))) ? T(r + y) : r;
}

/// x^y by squaring, wrapping. A negative y is an error the executors and
/// the interpreter report before calling this; here it would run over all
/// of y's bits and stop.
template <typename T>
KILN_SCALAR T kiln_ipow(T x, T y) {
  typedef typename kiln_wrapping<T>::type U;
  U result = 1, base = U(x), exponent = U(y);
  for (; exponent != 0; exponent >>= 1, base *= base)
    if (exponent & 1) result *= base;
  return T(result);
}

#endif  // KILN_IR_SCALAR_SEMANTICS_H
