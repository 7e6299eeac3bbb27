// Reduction kernels: reduce_{sum,mean,max,min,prod} over a set of axes and
// argmax/argmin along one axis. Each input element is folded into the
// accumulator of its output element (found by walking the input with zero
// strides on the reduced dims), so any rank works, rank 0 and empty dims
// included. Floats accumulate in double; integer sums and products wrap in
// int64 (uint64 for unsigned dtypes) and the mean of integers truncates.
// Float sums and means are compensated (Neumaier), so the reference is
// more accurate than any backend's blocked f32 sum, at any length.
#include <cmath>
#include <limits>

#include "runtime/Kernels.h"

namespace kiln {
namespace {

/// The smallest and largest value of an integer or bool dtype, as the
/// bits of an int64 (u64's largest reads as -1; its compute type, uint64,
/// gives it back).
int64_t lowestOf(DType t) {
  switch (t) {
    case DType::I32: return std::numeric_limits<int32_t>::min();
    case DType::I16: return std::numeric_limits<int16_t>::min();
    case DType::I8: return std::numeric_limits<int8_t>::min();
    case DType::U8:
    case DType::U16:
    case DType::U32:
    case DType::U64:
    case DType::Bool: return 0;
    default: return std::numeric_limits<int64_t>::min();
  }
}

int64_t highestOf(DType t) {
  switch (t) {
    case DType::I32: return std::numeric_limits<int32_t>::max();
    case DType::I16: return std::numeric_limits<int16_t>::max();
    case DType::I8: return std::numeric_limits<int8_t>::max();
    case DType::U8: return std::numeric_limits<uint8_t>::max();
    case DType::U16: return std::numeric_limits<uint16_t>::max();
    case DType::U32: return std::numeric_limits<uint32_t>::max();
    case DType::U64: return static_cast<int64_t>(std::numeric_limits<uint64_t>::max());
    case DType::Bool: return 1;
    default: return std::numeric_limits<int64_t>::max();
  }
}

enum class Reduction { Sum, Mean, Max, Min, Prod };

template <typename Acc>
Acc initialValue(Reduction r, DType t) {
  constexpr bool kFloat = std::is_same_v<Acc, double>;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  switch (r) {
    case Reduction::Sum:
    case Reduction::Mean: return Acc(0);
    case Reduction::Prod: return Acc(1);
    case Reduction::Max: return kFloat ? Acc(-kInf) : Acc(lowestOf(t));
    case Reduction::Min: return kFloat ? Acc(kInf) : Acc(highestOf(t));
  }
  return Acc(0);
}

template <typename Acc>
Acc combine(Reduction r, Acc acc, Acc v) {
  if constexpr (std::is_same_v<Acc, double>) {
    if ((r == Reduction::Max || r == Reduction::Min) && (std::isnan(acc) || std::isnan(v)))
      return std::numeric_limits<double>::quiet_NaN();
  }
  switch (r) {
    case Reduction::Sum:
    case Reduction::Mean: return addAcc(acc, v);
    case Reduction::Prod: return mulAcc(acc, v);
    case Reduction::Max: return v > acc ? v : acc;
    case Reduction::Min: return v < acc ? v : acc;
  }
  return acc;
}

Status reduce(const KernelCall& c, Reduction r) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out();
  const int64_t rank = x.rank();
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  const std::vector<int64_t>& axes = c.op.getInts("axes");
  for (int64_t axis : axes) {
    auto a = checkedAxis(c.op, axis, rank);
    if (!a) return a.takeError();
    if (reduced[*a]) return c.op.emitError("axis " + std::to_string(axis) + " is repeated in axes");
    reduced[*a] = true;
  }
  if (axes.empty()) reduced.assign(static_cast<size_t>(rank), true);

  // Strides that map an input element to its output element: the row-major
  // strides of the kept dims, zero on reduced dims (keepdims only inserts 1s,
  // which does not change the flat order).
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[d]) kept.push_back(x.shape()[d]);
  if (product(kept) != out.numElements())
    return c.op.emitError("result " + out.type().str() + " does not match the reduction of " + x.type().str());
  const std::vector<int64_t> keptStrides = rowMajorStrides(kept);
  std::vector<int64_t> strides(static_cast<size_t>(rank), 0);
  for (int64_t d = 0, k = 0; d < rank; ++d)
    if (!reduced[d]) strides[d] = keptStrides[k++];
  const int64_t count = out.numElements() ? x.numElements() / out.numElements() : 0;

  return withComputeType(x.dtype(), [&]<typename Acc>() -> Status {
    constexpr bool kFloat = std::is_same_v<Acc, double>;
    std::vector<Acc> acc(static_cast<size_t>(out.numElements()), initialValue<Acc>(r, x.dtype()));
    if (kFloat && (r == Reduction::Sum || r == Reduction::Mean)) {
      // Compensated (Neumaier) summation: each element's rounding error is
      // kept in `lost` and added back at the end, so the sum is within a
      // few ulps of double of the exact one whatever the length (a plain
      // double loop drifts by about sqrt(n) ulps: 1e-12 relative over 2^28
      // elements of f64, where PyTorch's cascade stays near 1e-16). Where
      // the sum is not finite, the compensation is meaningless (inf - inf)
      // and the plain sum stands.
      std::vector<double> lost(acc.size(), 0.0);
      walk(x.shape(), {strides}, {0}, [&](int64_t i, const std::vector<int64_t>& off) {
        const double a = static_cast<double>(acc[off[0]]), v = getElement<double>(x, i), sum = a + v;
        lost[off[0]] += std::fabs(a) >= std::fabs(v) ? (a - sum) + v : (v - sum) + a;
        acc[off[0]] = static_cast<Acc>(sum);
      });
      for (size_t k = 0; k < acc.size(); ++k) {
        const double a = static_cast<double>(acc[k]);
        if (std::isfinite(a) && std::isfinite(lost[k])) acc[k] = static_cast<Acc>(a + lost[k]);
      }
    } else {
      walk(x.shape(), {strides}, {0}, [&](int64_t i, const std::vector<int64_t>& off) {
        acc[off[0]] = combine(r, acc[off[0]], getElement<Acc>(x, i));
      });
    }
    if (r == Reduction::Mean) {
      if (!kFloat && count == 0 && out.numElements() > 0) return c.op.emitError("integer mean over zero elements");
      for (Acc& a : acc) a = kFloat ? a / static_cast<Acc>(count) : (count ? a / static_cast<Acc>(count) : 0);
    }
    writeAll(out, acc);
    return {};
  });
}

/// argmax (`wantMax`) or argmin along one axis; ties and NaN as docs/ops.md.
Status argReduce(const KernelCall& c, bool wantMax) {
  const Tensor& x = c.in(0);
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), std::max<int64_t>(x.rank(), 1));
  if (!axis) return axis.takeError();
  const bool last = c.op.getBool("select_last_index");
  const int64_t dim = x.rank() ? x.shape()[*axis] : 1;
  const int64_t outer = product(x.shape(), 0, *axis);
  const int64_t inner = product(x.shape(), *axis + 1, x.shape().size());
  if (c.out().numElements() != outer * inner)
    return c.op.emitError("result " + c.out().type().str() + " does not match the reduction of " + x.type().str());
  if (dim == 0 && outer * inner > 0)
    return c.op.emitError("cannot take the arg" + std::string(wantMax ? "max" : "min") + " of an empty axis");
  withComputeType(x.dtype(), [&]<typename Acc>() {
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        int64_t best = 0;
        Acc bestValue = getElement<Acc>(x, o * dim * inner + i);
        for (int64_t k = 1; k < dim; ++k) {
          const Acc v = getElement<Acc>(x, (o * dim + k) * inner + i);
          // NaN (v != v) beats every number; among equals, the first or last wins.
          const bool vNan = v != v;
          const bool bestNan = bestValue != bestValue;
          bool better;
          if (vNan || bestNan)
            better = vNan && (!bestNan || last);
          else
            better = (wantMax ? v > bestValue : v < bestValue) || (last && v == bestValue);
          if (better) {
            best = k;
            bestValue = v;
          }
        }
        c.out().setInt(o * inner + i, best);
      }
    }
  });
  return {};
}

}  // namespace

namespace kernels {

Status ReduceSum(const KernelCall& c) { return reduce(c, Reduction::Sum); }
Status ReduceMean(const KernelCall& c) { return reduce(c, Reduction::Mean); }
Status ReduceMax(const KernelCall& c) { return reduce(c, Reduction::Max); }
Status ReduceMin(const KernelCall& c) { return reduce(c, Reduction::Min); }
Status ReduceProd(const KernelCall& c) { return reduce(c, Reduction::Prod); }
Status ArgMax(const KernelCall& c) { return argReduce(c, true); }
Status ArgMin(const KernelCall& c) { return argReduce(c, false); }

}  // namespace kernels
}  // namespace kiln
