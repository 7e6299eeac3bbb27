// Elementwise kernels: unary math, broadcasting binary arithmetic, logical
// and comparison ops, select and cast. Each op is one line naming its float
// and integer semantics; the loops live in a few shared templates. Floats
// compute in double, signed integers in int64 and unsigned ones in uint64,
// with two's-complement wrap-around, so results are rounded (or wrapped)
// only once, when stored; uint64 gives unsigned comparison, division and
// remainder the values of u64 elements from 2^63 up. The scalar rules
// (NaN-propagating max/min, mod and rem, division that never traps, pow by
// squaring, round half to even, ...) are ir/ScalarSemantics.h's, which the
// CPU JIT and the CUDA emitter share; this file adds only the errors a
// kernel cannot report (a zero divisor, a negative integer exponent).
#include <cmath>
#include <type_traits>

#include "runtime/Kernels.h"

namespace kiln {
namespace {

/// An integer result, or the run-time error that prevents it.
template <typename T>
struct IntResult {
  T value = 0;
  const char* error = nullptr;
};

template <typename T>
IntResult<T> ok(T value) {
  return {value};
}

/// Calls `f(T{})` with the type in which integers of `dtype` compute: int64
/// for the signed dtypes, uint64 for the unsigned ones and bool.
template <typename F>
auto withIntType(DType dtype, F f) {
  return isSigned(dtype) ? f(int64_t{0}) : f(uint64_t{0});
}

/// A unary op on float and integer dtypes (not bool).
template <typename FloatFn, typename IntFn>
Status numericUnary(const KernelCall& c, FloatFn f, IntFn g) {
  const Tensor& x = c.in(0);
  if (x.dtype() == DType::Bool) return dtypeError(c.op, x.dtype(), "a numeric dtype");
  if (isFloat(x.dtype())) {
    for (int64_t i = 0; i < x.numElements(); ++i) c.out().setDouble(i, f(x.getDouble(i)));
    return {};
  }
  return withIntType(x.dtype(), [&](auto zero) -> Status {
    using T = decltype(zero);
    for (int64_t i = 0; i < x.numElements(); ++i)
      c.out().setInt(i, static_cast<int64_t>(g(static_cast<T>(x.getInt(i)))));
    return {};
  });
}

/// Walks the broadcast of operands 0 and 1 over the result's shape, calling
/// `f(resultIndex, offsetOfA, offsetOfB)`; stops at the first error.
template <typename F>
Status walkBinary(const KernelCall& c, F f) {
  const std::vector<int64_t>& shape = c.out().shape();
  Status status;
  walk(shape, {broadcastStrides(c.in(0).shape(), shape), broadcastStrides(c.in(1).shape(), shape)}, {0, 0},
       [&](int64_t i, const std::vector<int64_t>& off) {
         if (status) status = f(i, off[0], off[1]);
       });
  return status;
}

/// A broadcasting arithmetic op; `g` may fail (division by zero).
template <typename FloatFn, typename IntFn>
Status numericBinary(const KernelCall& c, FloatFn f, IntFn g) {
  const Tensor& a = c.in(0);
  const Tensor& b = c.in(1);
  if (a.dtype() != b.dtype())
    return c.op.emitError("operands have different dtypes " + std::string(dtypeName(a.dtype())) + " and " +
                          std::string(dtypeName(b.dtype())));
  if (a.dtype() == DType::Bool) return dtypeError(c.op, a.dtype(), "a numeric dtype");
  Tensor& out = c.out();
  if (isFloat(a.dtype()))
    return walkBinary(c, [&](int64_t i, int64_t ia, int64_t ib) -> Status {
      out.setDouble(i, f(a.getDouble(ia), b.getDouble(ib)));
      return {};
    });
  return withIntType(a.dtype(), [&](auto zero) -> Status {
    using T = decltype(zero);
    return walkBinary(c, [&](int64_t i, int64_t ia, int64_t ib) -> Status {
      IntResult<T> r = g(static_cast<T>(a.getInt(ia)), static_cast<T>(b.getInt(ib)));
      if (r.error) return c.op.emitError(r.error);
      out.setInt(i, static_cast<int64_t>(r.value));
      return {};
    });
  });
}

/// A broadcasting comparison with a bool result; any dtype.
template <typename Cmp>
Status compare(const KernelCall& c, Cmp cmp) {
  const Tensor& a = c.in(0);
  const Tensor& b = c.in(1);
  Tensor& out = c.out();
  if (isFloat(a.dtype()))
    return walkBinary(c, [&](int64_t i, int64_t ia, int64_t ib) -> Status {
      out.setInt(i, cmp(a.getDouble(ia), b.getDouble(ib)));
      return {};
    });
  return withIntType(a.dtype(), [&](auto zero) -> Status {
    using T = decltype(zero);
    return walkBinary(c, [&](int64_t i, int64_t ia, int64_t ib) -> Status {
      out.setInt(i, cmp(static_cast<T>(a.getInt(ia)), static_cast<T>(b.getInt(ib))));
      return {};
    });
  });
}

/// A broadcasting op on bool tensors.
template <typename F>
Status logical(const KernelCall& c, F f) {
  for (size_t k = 0; k < 2; ++k)
    if (c.in(k).dtype() != DType::Bool) return dtypeError(c.op, c.in(k).dtype(), "bool operands");
  return walkBinary(c, [&](int64_t i, int64_t ia, int64_t ib) -> Status {
    c.out().setInt(i, f(c.in(0).getInt(ia) != 0, c.in(1).getInt(ib) != 0));
    return {};
  });
}

template <typename T>
IntResult<T> intDiv(T x, T y) {
  if (y == 0) return {0, "integer division by zero"};
  return {kiln_idiv(x, y)};
}

template <typename T>
IntResult<T> intRem(T x, T y) {
  if (y == 0) return {0, "integer remainder by zero"};
  return {kiln_irem(x, y)};
}

template <typename T>
IntResult<T> intMod(T x, T y) {
  if (y == 0) return {0, "integer remainder by zero"};
  return {kiln_imod(x, y)};
}

template <typename T>
IntResult<T> intPow(T base, T exponent) {
  if constexpr (std::is_signed_v<T>)
    if (exponent < 0) return {0, "integer pow with a negative exponent"};
  return {kiln_ipow(base, exponent)};
}

}  // namespace

namespace kernels {

// clang-format off
Status Neg(const KernelCall& c) { return numericUnary(c, [](double x) { return -x; }, [](auto x) { return kiln_ineg(x); }); }
Status Abs(const KernelCall& c) { return numericUnary(c, [](double x) { return std::fabs(x); }, [](auto x) { return kiln_iabs(x); }); }
Status Sign(const KernelCall& c) { return numericUnary(c, kiln_fsign<double>, [](auto x) { return kiln_isign(x); }); }
Status Relu(const KernelCall& c) { return numericUnary(c, kiln_frelu<double>, [](auto x) { return kiln_irelu(x); }); }
Status Exp(const KernelCall& c) { return mapFloats(c, [](double x) { return std::exp(x); }); }
Status Log(const KernelCall& c) { return mapFloats(c, [](double x) { return std::log(x); }); }
Status Sqrt(const KernelCall& c) { return mapFloats(c, [](double x) { return std::sqrt(x); }); }
Status Rsqrt(const KernelCall& c) { return mapFloats(c, [](double x) { return 1.0 / std::sqrt(x); }); }
Status Reciprocal(const KernelCall& c) { return mapFloats(c, [](double x) { return 1.0 / x; }); }
Status Tanh(const KernelCall& c) { return mapFloats(c, [](double x) { return std::tanh(x); }); }
Status Sigmoid(const KernelCall& c) { return mapFloats(c, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }); }
Status Erf(const KernelCall& c) { return mapFloats(c, [](double x) { return std::erf(x); }); }
Status Sin(const KernelCall& c) { return mapFloats(c, [](double x) { return std::sin(x); }); }
Status Cos(const KernelCall& c) { return mapFloats(c, [](double x) { return std::cos(x); }); }
Status Tan(const KernelCall& c) { return mapFloats(c, [](double x) { return std::tan(x); }); }
Status Asin(const KernelCall& c) { return mapFloats(c, [](double x) { return std::asin(x); }); }
Status Acos(const KernelCall& c) { return mapFloats(c, [](double x) { return std::acos(x); }); }
Status Atan(const KernelCall& c) { return mapFloats(c, [](double x) { return std::atan(x); }); }
Status Sinh(const KernelCall& c) { return mapFloats(c, [](double x) { return std::sinh(x); }); }
Status Cosh(const KernelCall& c) { return mapFloats(c, [](double x) { return std::cosh(x); }); }
Status Asinh(const KernelCall& c) { return mapFloats(c, [](double x) { return std::asinh(x); }); }
Status Acosh(const KernelCall& c) { return mapFloats(c, [](double x) { return std::acosh(x); }); }
Status Atanh(const KernelCall& c) { return mapFloats(c, [](double x) { return std::atanh(x); }); }
Status HardSwish(const KernelCall& c) { return mapFloats(c, kiln_fhardswish<double>); }
Status Floor(const KernelCall& c) { return mapFloats(c, [](double x) { return std::floor(x); }); }
Status Ceil(const KernelCall& c) { return mapFloats(c, [](double x) { return std::ceil(x); }); }
Status Round(const KernelCall& c) { return mapFloats(c, [](double x) { return kiln_fround(x); }); }

Status Add(const KernelCall& c) { return numericBinary(c, [](double x, double y) { return x + y; }, [](auto x, auto y) { return ok(kiln_iadd(x, y)); }); }
Status Sub(const KernelCall& c) { return numericBinary(c, [](double x, double y) { return x - y; }, [](auto x, auto y) { return ok(kiln_isub(x, y)); }); }
Status Mul(const KernelCall& c) { return numericBinary(c, [](double x, double y) { return x * y; }, [](auto x, auto y) { return ok(kiln_imul(x, y)); }); }
Status Div(const KernelCall& c) { return numericBinary(c, [](double x, double y) { return x / y; }, [](auto x, auto y) { return intDiv(x, y); }); }
Status Pow(const KernelCall& c) { return numericBinary(c, [](double x, double y) { return std::pow(x, y); }, [](auto x, auto y) { return intPow(x, y); }); }
Status Max(const KernelCall& c) { return numericBinary(c, kiln_fmax<double>, [](auto x, auto y) { return ok(kiln_imax(x, y)); }); }
Status Min(const KernelCall& c) { return numericBinary(c, kiln_fmin<double>, [](auto x, auto y) { return ok(kiln_imin(x, y)); }); }
Status Mod(const KernelCall& c) { return numericBinary(c, kiln_fmod<double>, [](auto x, auto y) { return intMod(x, y); }); }
Status Rem(const KernelCall& c) { return numericBinary(c, [](double x, double y) { return kiln_frem(x, y); }, [](auto x, auto y) { return intRem(x, y); }); }

Status And(const KernelCall& c) { return logical(c, [](bool x, bool y) { return x && y; }); }
Status Or(const KernelCall& c) { return logical(c, [](bool x, bool y) { return x || y; }); }
Status Xor(const KernelCall& c) { return logical(c, [](bool x, bool y) { return x != y; }); }

Status Eq(const KernelCall& c) { return compare(c, [](auto x, auto y) { return x == y; }); }
Status Ne(const KernelCall& c) { return compare(c, [](auto x, auto y) { return x != y; }); }
Status Lt(const KernelCall& c) { return compare(c, [](auto x, auto y) { return x < y; }); }
Status Le(const KernelCall& c) { return compare(c, [](auto x, auto y) { return x <= y; }); }
Status Gt(const KernelCall& c) { return compare(c, [](auto x, auto y) { return x > y; }); }
Status Ge(const KernelCall& c) { return compare(c, [](auto x, auto y) { return x >= y; }); }
// clang-format on

Status Not(const KernelCall& c) {
  const Tensor& x = c.in(0);
  if (x.dtype() != DType::Bool) return dtypeError(c.op, x.dtype(), "a bool operand");
  for (int64_t i = 0; i < x.numElements(); ++i) c.out().setInt(i, x.getInt(i) == 0);
  return {};
}

Status IsNan(const KernelCall& c) {
  const Tensor& x = c.in(0);
  if (!isFloat(x.dtype())) return dtypeError(c.op, x.dtype(), "a float dtype");
  for (int64_t i = 0; i < x.numElements(); ++i) c.out().setInt(i, std::isnan(x.getDouble(i)));
  return {};
}

Status IsInf(const KernelCall& c) {
  const Tensor& x = c.in(0);
  if (!isFloat(x.dtype())) return dtypeError(c.op, x.dtype(), "a float dtype");
  for (int64_t i = 0; i < x.numElements(); ++i) c.out().setInt(i, std::isinf(x.getDouble(i)));
  return {};
}

Status Select(const KernelCall& c) {
  const Tensor& cond = c.in(0);
  if (cond.dtype() != DType::Bool) return dtypeError(c.op, cond.dtype(), "a bool condition");
  Tensor& out = c.out();
  for (size_t k = 1; k < 3; ++k)
    if (c.in(k).dtype() != out.dtype())
      return dtypeError(c.op, c.in(k).dtype(), std::string(dtypeName(out.dtype())) + " values");
  const std::vector<int64_t>& shape = out.shape();
  walk(shape,
       {broadcastStrides(cond.shape(), shape), broadcastStrides(c.in(1).shape(), shape),
        broadcastStrides(c.in(2).shape(), shape)},
       {0, 0, 0}, [&](int64_t i, const std::vector<int64_t>& off) {
         if (cond.getInt(off[0]))
           copyElement(c.in(1), off[1], out, i);
         else
           copyElement(c.in(2), off[2], out, i);
       });
  return {};
}

Status Cast(const KernelCall& c) {
  // Tensor's setters implement the cast rules: float to integer truncates
  // toward zero, integers wrap, anything to bool is `x != 0`. A u64 to a
  // float goes through getDouble, which reads values from 2^63 up as
  // unsigned.
  const Tensor& x = c.in(0);
  const bool throughDouble = isFloat(x.dtype()) || (isFloat(c.out().dtype()) && x.dtype() == DType::U64);
  for (int64_t i = 0; i < x.numElements(); ++i) {
    if (throughDouble)
      c.out().setDouble(i, x.getDouble(i));
    else
      c.out().setInt(i, x.getInt(i));
  }
  return {};
}

}  // namespace kernels
}  // namespace kiln
