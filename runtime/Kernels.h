// The interpreter's kernel interface (internal to runtime/). A kernel fills
// result tensors that the interpreter has already allocated with their
// concrete types (from the shape rules), so kernels only compute values.
//
// Every op kind has one kernel function below, named after its OpKind
// enumerator; the interpreter's dispatch table is generated from Ops.def
// and refers to `kernels::<Enum>`, so an op added to the table without a
// kernel declared here does not compile. Kernels of one family share a
// template over the compute type: float dtypes compute in double, signed
// integer and bool dtypes in int64, unsigned integer dtypes in uint64
// (narrowed with wrap-around on store).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ir/IR.h"
#include "ir/ScalarSemantics.h"
#include "runtime/Tensor.h"

namespace kiln {

/// One kernel invocation: the op (for attributes and diagnostics), its
/// operands and its pre-allocated, zero-filled results.
struct KernelCall {
  const Op& op;
  std::span<const Tensor* const> operands;
  std::span<Tensor> results;

  const Tensor& in(size_t i) const { return *operands[i]; }
  Tensor& out(size_t i = 0) const { return results[i]; }
  size_t numOperands() const { return operands.size(); }
};

using Kernel = Status (*)(const KernelCall&);

// --- Element access --------------------------------------------------------------

/// Element `i` of `t` in the compute type.
template <typename Acc>
Acc getElement(const Tensor& t, int64_t i) {
  if constexpr (std::is_same_v<Acc, double>)
    return t.getDouble(i);
  else
    return static_cast<Acc>(t.getInt(i));
}

/// All elements of `t` converted to `Acc` (double, int64_t or uint64_t).
template <typename Acc>
std::vector<Acc> readAs(const Tensor& t) {
  std::vector<Acc> v(static_cast<size_t>(t.numElements()));
  for (int64_t i = 0; i < t.numElements(); ++i) v[i] = getElement<Acc>(t, i);
  return v;
}

/// Stores element `i` of `t` from the compute type.
template <typename Acc>
void setElement(Tensor& t, int64_t i, Acc v) {
  if constexpr (std::is_same_v<Acc, double>)
    t.setDouble(i, v);
  else
    t.setInt(i, static_cast<int64_t>(v));
}

/// Stores `values` (one per element) into `t`.
template <typename Acc>
void writeAll(Tensor& t, const std::vector<Acc>& values) {
  for (int64_t i = 0; i < t.numElements(); ++i) setElement<Acc>(t, i, values[i]);
}

/// Calls `f.template operator()<Acc>()` with the compute type of `dtype`:
/// double for floats, int64_t for signed integers and bool, uint64_t for
/// unsigned integers (so that u64 elements from 2^63 up compare, divide
/// and convert as the unsigned values they are).
template <typename F>
auto withComputeType(DType dtype, F&& f) {
  if (isFloat(dtype)) return f.template operator()<double>();
  if (isInteger(dtype) && !isSigned(dtype)) return f.template operator()<uint64_t>();
  return f.template operator()<int64_t>();
}

/// a + b and a * b in the compute type (wrapping for integers, as
/// ir/ScalarSemantics.h defines integer arithmetic).
template <typename Acc>
Acc addAcc(Acc a, Acc b) {
  if constexpr (std::is_same_v<Acc, double>)
    return a + b;
  else
    return kiln_iadd(a, b);
}
template <typename Acc>
Acc mulAcc(Acc a, Acc b) {
  if constexpr (std::is_same_v<Acc, double>)
    return a * b;
  else
    return kiln_imul(a, b);
}

/// The error for an operand dtype that `op`'s kernel does not handle;
/// `expected` says what it takes ("a float dtype").
Error dtypeError(const Op& op, DType got, std::string_view expected);

/// Writes `f(x)` for every element x of float operand 0 into result 0
/// (which has the operand's shape): the loop of float unary ops.
template <typename F>
Status mapFloats(const KernelCall& c, F f) {
  const Tensor& x = c.in(0);
  if (!isFloat(x.dtype())) return dtypeError(c.op, x.dtype(), "a float dtype");
  for (int64_t i = 0; i < x.numElements(); ++i) c.out().setDouble(i, f(x.getDouble(i)));
  return {};
}

// --- Indexing ------------------------------------------------------------------

/// Product of `dims[begin, end)`.
int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end);
inline int64_t product(const std::vector<int64_t>& dims) { return product(dims, 0, dims.size()); }

/// Row-major strides of `shape`, in elements.
std::vector<int64_t> rowMajorStrides(const std::vector<int64_t>& shape);

/// Strides for reading an operand of shape `in` broadcast NumPy-style to
/// `out`: one per dim of `out`, zero where the operand is broadcast.
std::vector<int64_t> broadcastStrides(const std::vector<int64_t>& in, const std::vector<int64_t>& out);

/// Visits every element of a row-major `shape` in order, tracking for each
/// operand the flat offset `base + sum(index[d] * strides[d])`. Calls
/// `f(flatIndex, offsets)` where `offsets[j]` belongs to operand j.
template <typename F>
void walk(const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& strides,
          std::vector<int64_t> offsets, F&& f) {
  const int64_t n = product(shape);
  const size_t rank = shape.size();
  std::vector<int64_t> index(rank, 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    f(flat, offsets);
    for (size_t d = rank; d-- > 0;) {
      ++index[d];
      for (size_t j = 0; j < strides.size(); ++j) offsets[j] += strides[j][d];
      if (index[d] < shape[d]) break;
      for (size_t j = 0; j < strides.size(); ++j) offsets[j] -= strides[j][d] * shape[d];
      index[d] = 0;
    }
  }
}

/// Sets `index` to the row-major multi-index of element `flat` of `shape`.
void unravel(int64_t flat, const std::vector<int64_t>& shape, std::vector<int64_t>& index);

/// `[1,2,3]`: an int list for error messages.
std::string listStr(const std::vector<int64_t>& values);

/// The attribute `name` (or its default) as ints; empty when unset.
std::vector<int64_t> intsOr(const Op& op, std::string_view name);

/// Writes the bytes of element `src` of `from` to element `dst` of `to`
/// (same dtype): data movement without conversion.
inline void copyElement(const Tensor& from, int64_t src, Tensor& to, int64_t dst) {
  const size_t size = dtypeSize(from.dtype());
  std::memcpy(to.raw() + dst * static_cast<int64_t>(size), from.raw() + src * static_cast<int64_t>(size), size);
}

// --- Kernels, one per op kind ------------------------------------------------------

namespace kernels {

// ElementwiseKernels.cpp
Status Neg(const KernelCall&);
Status Abs(const KernelCall&);
Status Sign(const KernelCall&);
Status Exp(const KernelCall&);
Status Log(const KernelCall&);
Status Sqrt(const KernelCall&);
Status Rsqrt(const KernelCall&);
Status Reciprocal(const KernelCall&);
Status Tanh(const KernelCall&);
Status Sigmoid(const KernelCall&);
Status Relu(const KernelCall&);
Status Erf(const KernelCall&);
Status Sin(const KernelCall&);
Status Cos(const KernelCall&);
Status Tan(const KernelCall&);
Status Asin(const KernelCall&);
Status Acos(const KernelCall&);
Status Atan(const KernelCall&);
Status Sinh(const KernelCall&);
Status Cosh(const KernelCall&);
Status Asinh(const KernelCall&);
Status Acosh(const KernelCall&);
Status Atanh(const KernelCall&);
Status HardSwish(const KernelCall&);
Status Floor(const KernelCall&);
Status Ceil(const KernelCall&);
Status Round(const KernelCall&);
Status Not(const KernelCall&);
Status IsNan(const KernelCall&);
Status IsInf(const KernelCall&);
Status Add(const KernelCall&);
Status Sub(const KernelCall&);
Status Mul(const KernelCall&);
Status Div(const KernelCall&);
Status Pow(const KernelCall&);
Status Max(const KernelCall&);
Status Min(const KernelCall&);
Status Mod(const KernelCall&);
Status Rem(const KernelCall&);
Status And(const KernelCall&);
Status Or(const KernelCall&);
Status Xor(const KernelCall&);
Status Eq(const KernelCall&);
Status Ne(const KernelCall&);
Status Lt(const KernelCall&);
Status Le(const KernelCall&);
Status Gt(const KernelCall&);
Status Ge(const KernelCall&);
Status Select(const KernelCall&);
Status Cast(const KernelCall&);

// LayoutKernels.cpp
Status Constant(const KernelCall&);
Status Iota(const KernelCall&);
Status Broadcast(const KernelCall&);
Status Reshape(const KernelCall&);
Status Transpose(const KernelCall&);
Status Slice(const KernelCall&);
Status Concat(const KernelCall&);
Status Pad(const KernelCall&);
Status Gather(const KernelCall&);
Status GatherElements(const KernelCall&);
Status ScatterElements(const KernelCall&);
Status Return(const KernelCall&);

// ReduceKernels.cpp
Status ReduceSum(const KernelCall&);
Status ReduceMean(const KernelCall&);
Status ReduceMax(const KernelCall&);
Status ReduceMin(const KernelCall&);
Status ReduceProd(const KernelCall&);
Status ArgMax(const KernelCall&);
Status ArgMin(const KernelCall&);

// ContractionKernels.cpp
Status MatMul(const KernelCall&);
Status Conv(const KernelCall&);
Status ConvTranspose(const KernelCall&);
Status ConvWeightGrad(const KernelCall&);
Status MaxPool(const KernelCall&);
Status AvgPool(const KernelCall&);
Status QConv(const KernelCall&);
Status QMatMul(const KernelCall&);

// RandomKernels.cpp
Status RandomUniform(const KernelCall&);
Status RandomNormal(const KernelCall&);

// CompositeKernels.cpp
Status Softmax(const KernelCall&);
Status LogSoftmax(const KernelCall&);
Status LayerNorm(const KernelCall&);
Status BatchNorm(const KernelCall&);
Status Gelu(const KernelCall&);
Status Silu(const KernelCall&);
Status LeakyRelu(const KernelCall&);
Status Elu(const KernelCall&);
Status Softplus(const KernelCall&);
Status Attention(const KernelCall&);
Status CrossEntropy(const KernelCall&);
Status NllLoss(const KernelCall&);
Status MseLoss(const KernelCall&);
Status Quantize(const KernelCall&);
Status Dequantize(const KernelCall&);

// RecurrentKernels.cpp
Status Rnn(const KernelCall&);
Status Lstm(const KernelCall&);
Status Gru(const KernelCall&);

// CollectiveKernels.cpp: the collectives, on the thread's communicator
// (runtime/Collectives.h).
Status AllReduce(const KernelCall&);
Status BroadcastFrom(const KernelCall&);
Status ReduceTo(const KernelCall&);
Status AllGather(const KernelCall&);
Status ReduceScatter(const KernelCall&);

// HostCheck.cpp: the `check` op, the same code as compiled programs' host
// checks (runtime/HostCheck.h).
Status Check(const KernelCall&);

// DataDependentKernels.cpp: the ops whose result sizes depend on their
// operands' values (runtime/DataDependent.h); they size their results
// themselves, replacing the empty tensors the interpreter passes.
Status NonZero(const KernelCall&);
Status Unique(const KernelCall&);
Status NonMaxSuppression(const KernelCall&);

// Interpreter.cpp: a fused op runs its region through the interpreter.
Status Fused(const KernelCall&);
// Interpreter.cpp: `if` and `loop` interpret their bodies (ControlFlow.h).
Status If(const KernelCall&);
Status Loop(const KernelCall&);

}  // namespace kernels
}  // namespace kiln
