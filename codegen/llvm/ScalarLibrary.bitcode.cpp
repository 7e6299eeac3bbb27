// The C entry points of ir/ScalarSemantics.h that the LLVM emitter calls:
// one per function and dtype, named kiln_<function>_<dtype> (kiln_max_f32,
// kiln_div_i8, kiln_fptosi_f64, ...), each a plain call of the shared
// template. This file is not part of the host build: CMake compiles it with
// clang-16 to LLVM bitcode (codegen/CMakeLists.txt) and embeds the bitcode,
// which codegen/llvm/ScalarLibrary.cpp links into each kernel module. f16
// and bf16 compute in f32, and bool has no arithmetic, so neither has entry
// points of its own.
#include "ir/ScalarSemantics.h"

#define KILN_FLOAT_FUNCTIONS(T, S)                                \
  extern "C" T kiln_max_##S(T x, T y) { return kiln_fmax(x, y); } \
  extern "C" T kiln_min_##S(T x, T y) { return kiln_fmin(x, y); } \
  extern "C" T kiln_rem_##S(T x, T y) { return kiln_frem(x, y); } \
  extern "C" T kiln_mod_##S(T x, T y) { return kiln_fmod(x, y); } \
  extern "C" T kiln_sign_##S(T x) { return kiln_fsign(x); }       \
  extern "C" T kiln_relu_##S(T x) { return kiln_frelu(x); }       \
  extern "C" T kiln_round_##S(T x) { return kiln_fround(x); }     \
  extern "C" long long kiln_fptosi_##S(T x) { return kiln_ftoi(x); }   \
  extern "C" unsigned long long kiln_fptoui_##S(T x) { return kiln_ftou(x); }

KILN_FLOAT_FUNCTIONS(float, f32)
KILN_FLOAT_FUNCTIONS(double, f64)

#define KILN_INTEGER_FUNCTIONS(T, S)                              \
  extern "C" T kiln_add_##S(T x, T y) { return kiln_iadd(x, y); } \
  extern "C" T kiln_sub_##S(T x, T y) { return kiln_isub(x, y); } \
  extern "C" T kiln_mul_##S(T x, T y) { return kiln_imul(x, y); } \
  extern "C" T kiln_neg_##S(T x) { return kiln_ineg(x); }         \
  extern "C" T kiln_abs_##S(T x) { return kiln_iabs(x); }         \
  extern "C" T kiln_sign_##S(T x) { return kiln_isign(x); }       \
  extern "C" T kiln_relu_##S(T x) { return kiln_irelu(x); }       \
  extern "C" T kiln_max_##S(T x, T y) { return kiln_imax(x, y); } \
  extern "C" T kiln_min_##S(T x, T y) { return kiln_imin(x, y); } \
  extern "C" T kiln_div_##S(T x, T y) { return kiln_idiv(x, y); } \
  extern "C" T kiln_rem_##S(T x, T y) { return kiln_irem(x, y); } \
  extern "C" T kiln_mod_##S(T x, T y) { return kiln_imod(x, y); } \
  extern "C" T kiln_pow_##S(T x, T y) { return kiln_ipow(x, y); }

KILN_INTEGER_FUNCTIONS(long long, i64)
KILN_INTEGER_FUNCTIONS(int, i32)
KILN_INTEGER_FUNCTIONS(short, i16)
KILN_INTEGER_FUNCTIONS(signed char, i8)
KILN_INTEGER_FUNCTIONS(unsigned long long, u64)
KILN_INTEGER_FUNCTIONS(unsigned int, u32)
KILN_INTEGER_FUNCTIONS(unsigned short, u16)
KILN_INTEGER_FUNCTIONS(unsigned char, u8)
