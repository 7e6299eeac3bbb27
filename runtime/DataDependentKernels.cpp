// The data-dependent ops (DataDependent.h) and their interpreter kernels.
// unique follows numpy.unique (with ONNX's outputs: first indices, inverse
// indices and counts); non_max_suppression follows ONNX Runtime's CPU
// kernel: candidates above the score threshold taken by descending score
// (ties by box index), each kept unless its IoU with a box kept before
// exceeds the threshold, until max_output_boxes_per_class are kept.
#include "runtime/DataDependent.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/Kernels.h"

namespace kiln {

namespace {

// --- nonzero ---------------------------------------------------------------------

Expected<std::vector<Tensor>> nonZero(const Tensor& x) {
  const int64_t n = x.numElements();
  std::vector<int64_t> hits;
  for (int64_t i = 0; i < n; ++i) {
    const bool nonzero = isFloat(x.dtype()) ? x.getDouble(i) != 0.0 : x.getInt(i) != 0;
    if (nonzero) hits.push_back(i);
  }
  // A scalar is a one-element vector, as in NumPy.
  const std::vector<int64_t> dims = x.rank() == 0 ? std::vector<int64_t>{1} : x.shape();
  const int64_t count = static_cast<int64_t>(hits.size());
  Tensor out(DType::I64, {static_cast<int64_t>(dims.size()), count});
  int64_t* o = out.data<int64_t>();
  for (int64_t j = 0; j < count; ++j) {
    int64_t flat = hits[j];
    for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
      o[d * count + j] = flat % dims[d];
      flat /= dims[d];
    }
  }
  std::vector<Tensor> results;
  results.push_back(std::move(out));
  return results;
}

// --- unique ----------------------------------------------------------------------

/// Orders two numbers with NaN after every other value and equal to NaN, so
/// that sorting has a strict weak order (NumPy sorts NaN last).
template <typename Acc>
int compareValues(Acc a, Acc b) {
  if constexpr (std::is_same_v<Acc, double>) {
    const bool nanA = std::isnan(a), nanB = std::isnan(b);
    if (nanA || nanB) return nanA == nanB ? 0 : (nanA ? 1 : -1);
  }
  return a < b ? -1 : (b < a ? 1 : 0);
}

template <typename Acc>
Expected<std::vector<Tensor>> uniqueAs(const DataDependentOp& op, const Tensor& x) {
  const std::vector<int64_t>& shape = x.shape();
  // The operand as `outer` x `slices` x `inner`: slice s is every element
  // whose index along the axis is s, in row-major order.
  int64_t outer = 1, slices = x.numElements(), inner = 1;
  if (op.axis) {
    slices = shape[*op.axis];
    for (int64_t d = 0; d < *op.axis; ++d) outer *= shape[d];
    for (int64_t d = *op.axis + 1; d < x.rank(); ++d) inner *= shape[d];
  }
  const std::vector<Acc> values = readAs<Acc>(x);
  auto element = [&](int64_t slice, int64_t k) { return values[(k / inner * slices + slice) * inner + k % inner]; };
  const int64_t sliceSize = outer * inner;
  auto compareSlices = [&](int64_t a, int64_t b) {
    for (int64_t k = 0; k < sliceSize; ++k)
      if (int c = compareValues<Acc>(element(a, k), element(b, k)); c != 0) return c;
    return 0;
  };

  // Stable sort, so the first of equal slices is the first occurrence.
  std::vector<int64_t> order(static_cast<size_t>(slices));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return compareSlices(a, b) < 0; });
  std::vector<int64_t> firsts, counts, inverse(static_cast<size_t>(slices));
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || compareSlices(order[i - 1], order[i]) != 0) {
      firsts.push_back(order[i]);
      counts.push_back(0);
    }
    inverse[order[i]] = static_cast<int64_t>(firsts.size()) - 1;
    ++counts.back();
  }
  // Unsorted: the groups in order of first occurrence.
  std::vector<int64_t> groupOrder(firsts.size());
  std::iota(groupOrder.begin(), groupOrder.end(), int64_t{0});
  if (!op.sorted)
    std::sort(groupOrder.begin(), groupOrder.end(), [&](int64_t a, int64_t b) { return firsts[a] < firsts[b]; });
  std::vector<int64_t> rank(groupOrder.size());
  for (size_t g = 0; g < groupOrder.size(); ++g) rank[groupOrder[g]] = static_cast<int64_t>(g);

  const int64_t count = static_cast<int64_t>(firsts.size());
  std::vector<int64_t> valueDims = {count};
  if (op.axis) {
    valueDims = shape;
    valueDims[*op.axis] = count;
  }
  std::vector<Tensor> results;
  results.emplace_back(x.dtype(), valueDims);
  results.emplace_back(DType::I64, std::vector<int64_t>{count});
  results.emplace_back(DType::I64, std::vector<int64_t>{slices});
  results.emplace_back(DType::I64, std::vector<int64_t>{count});
  Tensor& out = results[0];
  const size_t elementSize = dtypeSize(x.dtype());
  for (int64_t g = 0; g < count; ++g) {
    const int64_t from = firsts[groupOrder[g]];
    // Copy bytes, so values keep their exact bits (NaN payloads, -0.0).
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(out.raw() + ((o * count + g) * inner) * elementSize,
                  x.raw() + ((o * slices + from) * inner) * elementSize, static_cast<size_t>(inner) * elementSize);
    results[1].data<int64_t>()[g] = from;
    results[3].data<int64_t>()[g] = counts[groupOrder[g]];
  }
  for (int64_t s = 0; s < slices; ++s) results[2].data<int64_t>()[s] = rank[inverse[s]];
  return results;
}

// --- non_max_suppression ---------------------------------------------------------------

/// A box as its extent along x and y.
struct Extent {
  double xMin, xMax, yMin, yMax;
  double area() const { return (xMax - xMin) * (yMax - yMin); }
};

Extent extentOf(const Tensor& boxes, int64_t at, bool centerPointBox) {
  const double a = boxes.getDouble(at), b = boxes.getDouble(at + 1), c = boxes.getDouble(at + 2),
               d = boxes.getDouble(at + 3);
  if (centerPointBox) return {a - c / 2, a + c / 2, b - d / 2, b + d / 2};
  // Corners [y1, x1, y2, x2], in either order.
  return {std::min(b, d), std::max(b, d), std::min(a, c), std::max(a, c)};
}

/// Whether `a` and `b` overlap by more than `threshold` (intersection over
/// union); boxes of no area never do.
bool suppresses(const Extent& a, const Extent& b, double threshold) {
  const double xMin = std::max(a.xMin, b.xMin), xMax = std::min(a.xMax, b.xMax);
  const double yMin = std::max(a.yMin, b.yMin), yMax = std::min(a.yMax, b.yMax);
  if (xMax <= xMin || yMax <= yMin) return false;
  const double intersection = (xMax - xMin) * (yMax - yMin);
  const double unionArea = a.area() + b.area() - intersection;
  if (a.area() <= 0 || b.area() <= 0 || unionArea <= 0) return false;
  return intersection / unionArea > threshold;
}

Expected<std::vector<Tensor>> nonMaxSuppression(const DataDependentOp& op, std::span<const Tensor* const> operands) {
  if (operands.size() < 2) return Error("'non_max_suppression' needs boxes and scores", op.loc);
  const Tensor& boxes = *operands[0];
  const Tensor& scores = *operands[1];
  // The shape rule's conditions again: the executor may pass arguments
  // straight from the caller.
  if (boxes.rank() != 3 || boxes.shape()[2] != 4 || scores.rank() != 3 || scores.shape()[0] != boxes.shape()[0] ||
      scores.shape()[2] != boxes.shape()[1])
    return Error("'non_max_suppression' takes boxes[B,N,4] and scores[B,C,N], got " + boxes.type().str() + " and " +
                     scores.type().str(),
                 op.loc);
  for (size_t i = 2; i < operands.size(); ++i)
    if (operands[i]->numElements() != 1)
      return Error("'non_max_suppression' operand " + std::to_string(i) + " has type " + operands[i]->type().str() +
                       ", expected one element",
                   op.loc);
  const int64_t maxPerClass = operands.size() > 2 ? std::max<int64_t>(operands[2]->getInt(0), 0) : 0;
  const double iouThreshold = operands.size() > 3 ? operands[3]->getDouble(0) : 0.0;
  const std::optional<double> scoreThreshold =
      operands.size() > 4 ? std::optional<double>(operands[4]->getDouble(0)) : std::nullopt;
  if (iouThreshold < 0 || iouThreshold > 1)
    return Error("'non_max_suppression' iou_threshold is " + std::to_string(iouThreshold) + ", expected it in [0, 1]",
                 op.loc);
  const int64_t batches = scores.shape()[0], classes = scores.shape()[1], count = scores.shape()[2];

  std::vector<int64_t> selected;  // (batch, class, box) triples
  std::vector<int64_t> candidates;
  std::vector<Extent> kept;
  for (int64_t b = 0; b < batches && maxPerClass > 0; ++b) {
    std::vector<Extent> extents;
    for (int64_t i = 0; i < count; ++i) extents.push_back(extentOf(boxes, (b * count + i) * 4, op.centerPointBox));
    for (int64_t c = 0; c < classes; ++c) {
      const int64_t base = (b * classes + c) * count;
      candidates.clear();
      for (int64_t i = 0; i < count; ++i)
        if (!scoreThreshold || scores.getDouble(base + i) > *scoreThreshold) candidates.push_back(i);
      std::stable_sort(candidates.begin(), candidates.end(),
                       [&](int64_t x, int64_t y) { return scores.getDouble(base + x) > scores.getDouble(base + y); });
      kept.clear();
      for (int64_t i : candidates) {
        if (static_cast<int64_t>(kept.size()) >= maxPerClass) break;
        const Extent& e = extents[i];
        if (std::any_of(kept.begin(), kept.end(), [&](const Extent& k) { return suppresses(k, e, iouThreshold); }))
          continue;
        kept.push_back(e);
        selected.insert(selected.end(), {b, c, i});
      }
    }
  }
  Tensor out(DType::I64, {static_cast<int64_t>(selected.size() / 3), 3});
  std::copy(selected.begin(), selected.end(), out.data<int64_t>());
  std::vector<Tensor> results;
  results.push_back(std::move(out));
  return results;
}

}  // namespace

Expected<DataDependentOp> dataDependentOpOf(const Op& op) {
  if (!op.info().hasDataDependentShape()) return op.emitError("is not an op with data-dependent result sizes");
  DataDependentOp d;
  d.kind = op.kind();
  d.loc = op.loc();
  if (op.kind() == OpKind::Unique) {
    d.sorted = op.getBool("sorted");
    const std::vector<int64_t>& axis = op.getInts("axis");
    if (axis.size() > 1) return op.emitError("has " + std::to_string(axis.size()) + " axes, expected at most one");
    if (!axis.empty()) {
      auto a = checkedAxis(op, axis.front(), op.operand(0)->type().rank());
      if (!a) return a.takeError();
      d.axis = *a;
    }
  }
  if (op.kind() == OpKind::NonMaxSuppression) d.centerPointBox = op.getBool("center_point_box");
  return d;
}

Expected<std::vector<Tensor>> runDataDependentOp(const DataDependentOp& op, std::span<const Tensor* const> operands) {
  if (operands.empty()) return Error("'" + std::string(opName(op.kind)) + "' has no operands", op.loc);
  switch (op.kind) {
    case OpKind::NonZero: return nonZero(*operands[0]);
    case OpKind::Unique:
      if (op.axis && *op.axis >= operands[0]->rank())
        return Error("'unique' axis " + std::to_string(*op.axis) + " is out of range for rank " +
                         std::to_string(operands[0]->rank()),
                     op.loc);
      return isFloat(operands[0]->dtype()) ? uniqueAs<double>(op, *operands[0]) : uniqueAs<int64_t>(op, *operands[0]);
    case OpKind::NonMaxSuppression: return nonMaxSuppression(op, operands);
    default:
      return Error("'" + std::string(opName(op.kind)) + "' is not an op with data-dependent result sizes", op.loc);
  }
}

namespace kernels {

namespace {

/// The interpreter's kernel of every data-dependent op: its results are
/// sized here, not by the interpreter.
Status runInto(const KernelCall& c) {
  auto op = dataDependentOpOf(c.op);
  if (!op) return op.takeError();
  auto results = runDataDependentOp(*op, c.operands);
  if (!results) return results.takeError();
  for (size_t r = 0; r < results->size() && r < c.results.size(); ++r) c.results[r] = std::move((*results)[r]);
  return {};
}

}  // namespace

Status NonZero(const KernelCall& c) { return runInto(c); }
Status Unique(const KernelCall& c) { return runInto(c); }
Status NonMaxSuppression(const KernelCall& c) { return runInto(c); }

}  // namespace kernels

}  // namespace kiln
