// Data-movement kernels: constants, iota, broadcast, reshape, transpose,
// slice, concat, pad, and the index ops gather / gather_elements /
// scatter_elements. Except for iota, pad's fill value and scatter's
// reductions these copy element bytes, so they work for every dtype alike.
// Result shapes were computed by the shape rules; the checks here guard the
// kernels' own indexing against attributes the verifier would reject, so a
// malformed op is an error rather than an out-of-bounds access.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/Kernels.h"

namespace kiln {
namespace {

/// Reads an index operand's element as int64, adding `dim` to a negative
/// index, or reports an index outside `[-dim, dim)`.
Expected<int64_t> readIndex(const Op& op, const Tensor& indices, int64_t i, int64_t dim, int64_t axis) {
  int64_t idx = indices.getInt(i);
  const int64_t original = idx;
  if (idx < 0) idx += dim;
  if (idx < 0 || idx >= dim)
    return op.emitError("index " + std::to_string(original) + " is out of range for axis " + std::to_string(axis) +
                        " of size " + std::to_string(dim));
  return idx;
}

Status checkIndexDType(const Op& op, const Tensor& indices) {
  if (!isInteger(indices.dtype())) return dtypeError(op, indices.dtype(), "integer indices");
  return {};
}

}  // namespace

namespace kernels {

Status Constant(const KernelCall& c) {
  const DenseTensor& value = c.op.getTensor("value");
  Tensor& out = c.out();
  if (value.bytes.size() != out.numBytes() || value.type.dtype != out.dtype())
    return c.op.emitError("value of type " + value.type.str() + " does not fill its result " + out.type().str());
  std::memcpy(out.raw(), value.bytes.data(), out.numBytes());
  return {};
}

Status Iota(const KernelCall& c) {
  Tensor& out = c.out();
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), out.rank());
  if (!axis) return axis.takeError();
  const int64_t stride = product(out.shape(), *axis + 1, out.shape().size());
  const int64_t dim = out.shape()[*axis];
  for (int64_t i = 0; i < out.numElements(); ++i) out.setInt(i, (i / stride) % dim);
  return {};
}

Status Broadcast(const KernelCall& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out();
  const int64_t lead = out.rank() - x.rank();
  bool ok = lead >= 0;
  for (int64_t d = 0; ok && d < x.rank(); ++d) ok = x.shape()[d] == 1 || x.shape()[d] == out.shape()[lead + d];
  if (!ok) return c.op.emitError("cannot broadcast " + x.type().str() + " to " + out.type().str());
  walk(out.shape(), {broadcastStrides(x.shape(), out.shape())}, {0},
       [&](int64_t i, const std::vector<int64_t>& off) { copyElement(x, off[0], out, i); });
  return {};
}

Status Reshape(const KernelCall& c) {
  if (c.in(0).numBytes() != c.out().numBytes())
    return c.op.emitError("cannot reshape " + c.in(0).type().str() + " to " + c.out().type().str());
  // An empty tensor has no storage (raw() is null), and memcpy's pointers
  // must not be null even for 0 bytes (UBSan, CodegenTest.LayoutOps).
  if (c.out().numBytes() != 0) std::memcpy(c.out().raw(), c.in(0).raw(), c.out().numBytes());
  return {};
}

Status Transpose(const KernelCall& c) {
  const Tensor& x = c.in(0);
  const std::vector<int64_t>& perm = c.op.getInts("perm");
  if (static_cast<int64_t>(perm.size()) != x.rank())
    return c.op.emitError("perm " + listStr(perm) + " does not have one entry per dim of " + x.type().str());
  const std::vector<int64_t> inStrides = x.strides();
  std::vector<int64_t> strides;
  for (int64_t p : perm) {
    if (p < 0 || p >= x.rank()) return c.op.emitError("perm " + listStr(perm) + " is not a permutation");
    strides.push_back(inStrides[p]);
  }
  walk(c.out().shape(), {strides}, {0},
       [&](int64_t i, const std::vector<int64_t>& off) { copyElement(x, off[0], c.out(), i); });
  return {};
}

Status Slice(const KernelCall& c) {
  const Tensor& x = c.in(0);
  const std::vector<int64_t>& starts = c.op.getInts("starts");
  const std::vector<int64_t>& ends = c.op.getInts("ends");
  const std::vector<int64_t>& steps = c.op.getInts("steps");
  const size_t rank = x.shape().size();
  if (starts.size() != rank || ends.size() != rank || steps.size() != rank)
    return c.op.emitError("starts, ends and steps need one entry per dim of " + x.type().str());
  const std::vector<int64_t> inStrides = x.strides();
  std::vector<int64_t> strides(rank);
  int64_t base = 0;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t dim = x.shape()[d];
    const int64_t step = steps[d];
    if (step == 0) return c.op.emitError("step of dim " + std::to_string(d) + " is zero");
    // Python/ONNX semantics: negative starts count from the end, then clamp
    // to the range that a walk in the step's direction can visit.
    int64_t start = starts[d] < 0 ? starts[d] + dim : starts[d];
    start = step > 0 ? std::clamp<int64_t>(start, 0, dim) : std::clamp<int64_t>(start, -1, dim - 1);
    base += start * inStrides[d];
    strides[d] = step * inStrides[d];
  }
  // An empty result needs no reads; `base` may then point past the data.
  if (c.out().numElements() == 0) return {};
  walk(c.out().shape(), {strides}, {base},
       [&](int64_t i, const std::vector<int64_t>& off) { copyElement(x, off[0], c.out(), i); });
  return {};
}

Status Concat(const KernelCall& c) {
  Tensor& out = c.out();
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), out.rank());
  if (!axis) return axis.takeError();
  const int64_t outer = product(out.shape(), 0, *axis);
  const int64_t inner = product(out.shape(), *axis + 1, out.shape().size());
  const size_t elemSize = dtypeSize(out.dtype());
  int64_t offset = 0;  // along `axis`, where the current operand starts
  for (size_t k = 0; k < c.numOperands(); ++k) {
    const Tensor& x = c.in(k);
    if (x.dtype() != out.dtype() || x.rank() != out.rank())
      return c.op.emitError("operand " + std::to_string(k) + " of type " + x.type().str() +
                            " does not match the result " + out.type().str());
    const int64_t dim = x.shape()[*axis];
    const int64_t block = dim * inner;
    for (int64_t o = 0; o < outer && block > 0; ++o)
      std::memcpy(out.raw() + (o * out.shape()[*axis] + offset) * inner * static_cast<int64_t>(elemSize),
                  x.raw() + o * block * static_cast<int64_t>(elemSize), static_cast<size_t>(block) * elemSize);
    offset += dim;
  }
  return {};
}

Status Pad(const KernelCall& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out();
  const std::vector<int64_t>& pads = c.op.getInts("pads");
  const std::string& mode = c.op.getString("mode");
  const double value = c.op.getFloat("value");
  const size_t rank = x.shape().size();
  if (pads.size() != 2 * rank)
    return c.op.emitError("pads " + listStr(pads) + " need 2 entries per dim of " + x.type().str());
  if (mode != "constant" && mode != "reflect" && mode != "edge")
    return c.op.emitError("unknown mode '" + mode + "' (expected constant, reflect or edge)");
  if (mode != "constant" && x.numElements() == 0 && out.numElements() > 0)
    return c.op.emitError("mode '" + mode + "' cannot pad an empty tensor");
  const std::vector<int64_t> inStrides = x.strides();
  std::vector<int64_t> index;
  for (int64_t i = 0; i < out.numElements(); ++i) {
    unravel(i, out.shape(), index);
    int64_t src = 0;
    bool inside = true;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t dim = x.shape()[d];
      int64_t s = index[d] - pads[d];
      if (s < 0 || s >= dim) {
        if (mode == "constant") {
          inside = false;
          break;
        }
        if (mode == "edge") {
          s = std::clamp<int64_t>(s, 0, dim - 1);
        } else if (dim == 1) {
          s = 0;
        } else {
          // Mirror without repeating the edge; the pattern has period 2(dim-1).
          const int64_t period = 2 * (dim - 1);
          s = ((s % period) + period) % period;
          if (s >= dim) s = period - s;
        }
      }
      src += s * inStrides[d];
    }
    if (inside)
      copyElement(x, src, out, i);
    else
      out.setDouble(i, value);
  }
  return {};
}

Status Gather(const KernelCall& c) {
  const Tensor& data = c.in(0);
  const Tensor& indices = c.in(1);
  KILN_TRY(checkIndexDType(c.op, indices));
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), data.rank());
  if (!axis) return axis.takeError();
  const int64_t outer = product(data.shape(), 0, *axis);
  const int64_t dim = data.shape()[*axis];
  const int64_t inner = product(data.shape(), *axis + 1, data.shape().size());
  const int64_t count = indices.numElements();
  if (c.out().numElements() != outer * count * inner)
    return c.op.emitError("result " + c.out().type().str() + " does not match the gathered shape");
  for (int64_t p = 0; p < count; ++p) {
    auto idx = readIndex(c.op, indices, p, dim, *axis);
    if (!idx) return idx.takeError();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i)
        copyElement(data, (o * dim + *idx) * inner + i, c.out(), (o * count + p) * inner + i);
  }
  return {};
}

Status GatherElements(const KernelCall& c) {
  const Tensor& data = c.in(0);
  const Tensor& indices = c.in(1);
  KILN_TRY(checkIndexDType(c.op, indices));
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), data.rank());
  if (!axis) return axis.takeError();
  if (indices.rank() != data.rank())
    return c.op.emitError("indices " + indices.type().str() + " must have the rank of data " + data.type().str());
  const std::vector<int64_t> dataStrides = data.strides();
  std::vector<int64_t> index;
  for (int64_t i = 0; i < indices.numElements(); ++i) {
    unravel(i, indices.shape(), index);
    int64_t src = 0;
    for (int64_t d = 0; d < data.rank(); ++d) {
      int64_t coord = index[d];
      if (d == *axis) {
        auto idx = readIndex(c.op, indices, i, data.shape()[d], d);
        if (!idx) return idx.takeError();
        coord = *idx;
      } else if (coord >= data.shape()[d]) {
        return c.op.emitError("indices " + indices.type().str() + " exceed data " + data.type().str() + " in dim " +
                              std::to_string(d));
      }
      src += coord * dataStrides[d];
    }
    copyElement(data, src, c.out(), i);
  }
  return {};
}

Status ScatterElements(const KernelCall& c) {
  const Tensor& data = c.in(0);
  const Tensor& indices = c.in(1);
  const Tensor& updates = c.in(2);
  Tensor& out = c.out();
  KILN_TRY(checkIndexDType(c.op, indices));
  auto axis = checkedAxis(c.op, c.op.getInt("axis"), data.rank());
  if (!axis) return axis.takeError();
  const std::string& reduction = c.op.getString("reduction");
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" && reduction != "min")
    return c.op.emitError("unknown reduction '" + reduction + "' (expected none, add, mul, max or min)");
  if (indices.rank() != data.rank() || indices.shape() != updates.shape() || updates.dtype() != data.dtype())
    return c.op.emitError("indices " + indices.type().str() + " and updates " + updates.type().str() +
                          " must have one shape and the rank of data " + data.type().str());
  std::memcpy(out.raw(), data.raw(), out.numBytes());
  if (indices.numElements() == 0) return {};
  // Rows of indices' last dim, walked with an odometer over the dims before
  // it: an embedding's gradient scatters a million elements, and unravelling
  // each one's index took 20 ns of the 2 its add does.
  const int64_t rank = data.rank();
  const std::vector<int64_t> dataStrides = data.strides();
  const int64_t rowLength = indices.shape().back();
  const int64_t rowStride = *axis == rank - 1 ? 0 : dataStrides[rank - 1];
  if (*axis != rank - 1 && rowLength > data.shape()[rank - 1])
    return c.op.emitError("indices " + indices.type().str() + " exceed data " + data.type().str() + " in dim " +
                          std::to_string(rank - 1));
  const bool f32Add = reduction == "add" && data.dtype() == DType::F32;
  float* outF = f32Add ? out.data<float>() : nullptr;
  const float* updatesF = f32Add ? updates.data<float>() : nullptr;
  std::vector<int64_t> index(rank, 0);
  for (int64_t row = 0; row < indices.numElements(); row += rowLength) {
    int64_t base = 0;
    for (int64_t d = 0; d + 1 < rank; ++d) {
      if (d == *axis) continue;
      if (index[d] >= data.shape()[d])
        return c.op.emitError("indices " + indices.type().str() + " exceed data " + data.type().str() + " in dim " +
                              std::to_string(d));
      base += index[d] * dataStrides[d];
    }
    for (int64_t j = 0; j < rowLength; ++j) {
      const int64_t i = row + j;
      auto idx = readIndex(c.op, indices, i, data.shape()[*axis], *axis);
      if (!idx) return idx.takeError();
      const int64_t dst = base + *idx * dataStrides[*axis] + j * rowStride;
      if (f32Add) {
        outF[dst] += updatesF[i];
        continue;
      }
      if (reduction == "none") {
        copyElement(updates, i, out, dst);
        continue;
      }
      withComputeType(data.dtype(), [&]<typename Acc>() {
        const Acc cur = getElement<Acc>(out, dst);
        const Acc upd = getElement<Acc>(updates, i);
        Acc result;
        if (reduction == "add")
          result = addAcc(cur, upd);
        else if (reduction == "mul")
          result = mulAcc(cur, upd);
        else if (reduction == "max")
          result = (cur != cur || upd != upd) ? cur + upd : std::max(cur, upd);  // NaN propagates
        else
          result = (cur != cur || upd != upd) ? cur + upd : std::min(cur, upd);
        setElement<Acc>(out, dst, result);
      });
    }
    for (int64_t d = rank - 2; d >= 0; --d) {
      if (++index[d] < indices.shape()[d]) break;
      index[d] = 0;
    }
  }
  return {};
}

Status Return(const KernelCall&) {
  // `return` has no results; the interpreter reads its operands directly.
  return {};
}

}  // namespace kernels
}  // namespace kiln
