// Reading, checking and batching the training data (Data.h): every check
// of an array against the model happens here, before anything is compiled,
// so a bad file costs no compile time and its error names the file.
#include "training/Data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "runtime/Npz.h"
#include "training/Numerics.h"

namespace kiln::training {

std::string shapeString(const std::vector<int64_t>& dims, size_t from) {
  std::string s = "[";
  for (size_t i = from; i < dims.size(); ++i) s += (i > from ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

namespace {

std::string dimsString(const Shape& shape, size_t from = 0) {
  std::string s = "[";
  for (size_t i = from; i < shape.size(); ++i) s += (i > from ? "," : "") + shape[i].str();
  return s + "]";
}

/// The NumPy name of a dtype, for advice on converting an array.
std::string numpyName(DType dtype) {
  switch (dtype) {
    case DType::F64: return "float64";
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::I16: return "int16";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    case DType::U16: return "uint16";
    case DType::U32: return "uint32";
    case DType::U64: return "uint64";
    case DType::Bool: return "bool";
  }
  return "?";
}

/// A copy of `t` converted element by element to `dtype`.
Tensor convertTensor(const Tensor& t, DType dtype) {
  Tensor out(dtype, t.shape());
  const int64_t n = t.numElements();
  if (isFloat(dtype))
    for (int64_t i = 0; i < n; ++i) out.setDouble(i, t.getDouble(i));
  else
    for (int64_t i = 0; i < n; ++i) out.setInt(i, t.getInt(i));
  return out;
}

}  // namespace

/// Reads `file` and checks it against the model: every error names the file
/// and says what was expected.
Expected<Dataset> loadDataset(const std::string& file, const DataSpec& spec, const NoticeFn& notice) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return Error(file + ": no such file");
  auto arrays = readNpz(file);
  if (!arrays) return arrays.takeError();  // runtime/Npz's errors name the file
  std::string present;
  const Tensor *x = nullptr, *y = nullptr;
  for (const NpzArray& a : *arrays) {
    present += (present.empty() ? "" : ", ") + a.name;
    if (a.name == spec.xKey) x = &a.tensor;
    if (a.name == spec.yKey) y = &a.tensor;
  }
  for (const auto& [key, found] : {std::pair{spec.xKey, x}, std::pair{spec.yKey, y}})
    if (!found)
      return Error(file + ": no array '" + key + "' (the file holds: " + (present.empty() ? "nothing" : present) +
                   "); name the input and label arrays with --data-keys X,Y");
  return checkDataset(file, *x, *y, spec, notice);
}

/// Checks arrays `x` and `y` against the model: every error names `file`
/// (the arrays' source) and says what was expected.
Expected<Dataset> checkDataset(const std::string& file, const Tensor& xArray, const Tensor& yArray,
                               const DataSpec& spec, const NoticeFn& notice) {
  const Tensor *x = &xArray, *y = &yArray;
  if (x->rank() == 0) return Error(file + ": '" + spec.xKey + "' is a scalar; expected one sample per row");
  if (y->rank() == 0) return Error(file + ": '" + spec.yKey + "' is a scalar; expected one label per sample");
  Dataset d;
  d.file = file;
  d.size = x->shape()[0];
  if (x->shape()[0] != y->shape()[0])
    return Error(file + ": '" + spec.xKey + "' holds " + std::to_string(x->shape()[0]) + " samples but '" + spec.yKey +
                 "' holds " + std::to_string(y->shape()[0]) + " labels; expected one label per sample");
  if (d.size == 0) return Error(file + ": the dataset is empty ('" + spec.xKey + "' holds 0 samples)");

  // x: the input's dtype, per-sample shape its dims after the batch dim.
  const std::string xDesc = "'" + spec.xKey + "' (" + numpyName(x->dtype()) + shapeString(x->shape()) + ")";
  if (!isFloat(x->dtype()) || !isFloat(spec.input.dtype)) {
    if (x->dtype() != spec.input.dtype)
      return Error(file + ": " + xDesc + " does not match the model's input '" + spec.inputName + "' of type " +
                   spec.input.str() + "; convert it with x.astype(numpy." + numpyName(spec.input.dtype) + ")");
  }
  if (x->rank() != spec.input.rank()) {
    return Error(file + ": " + xDesc + " holds samples of shape " + shapeString(x->shape(), 1) +
                 ", but the model's input '" + spec.inputName + "' (" + spec.input.str() +
                 ") expects samples of shape " + dimsString(spec.input.shape, 1));
  }
  for (int64_t k = 1; k < x->rank(); ++k) {
    const Dim& dim = spec.input.shape[k];
    if (dim.isStatic() && dim.size != x->shape()[k])
      return Error(file + ": " + xDesc + " holds samples of shape " + shapeString(x->shape(), 1) +
                   ", but the model's input '" + spec.inputName + "' (" + spec.input.str() +
                   ") expects samples of shape " + dimsString(spec.input.shape, 1));
  }
  if (x->dtype() != spec.input.dtype) {
    if (notice)
      notice(file + ": '" + spec.xKey + "' is " + numpyName(x->dtype()) + ", converted to the model input's " +
             numpyName(spec.input.dtype));
    d.x = convertTensor(*x, spec.input.dtype);
  } else {
    d.x = *x;
  }
  if (int64_t bad = firstNonFinite(d.x); bad >= 0)
    return Error(file + ": '" + spec.xKey + "' holds a non-finite value (" + shortest(d.x.getDouble(bad)) + ") at [" +
                 indexString(bad, d.x.shape()) + "]; every input must be finite");

  // y: class indices for cross-entropy and NLL, targets like the output for MSE.
  const bool classLoss = spec.loss != LossKind::Mse;
  const std::string lossName = spec.loss == LossKind::CrossEntropy ? "cross_entropy"
                               : spec.loss == LossKind::Nll        ? "nll"
                                                                   : "mse";
  const std::string yDesc = "'" + spec.yKey + "' (" + numpyName(y->dtype()) + shapeString(y->shape()) + ")";
  Shape expected(spec.output.shape.begin() + 1, spec.output.shape.end());
  if (classLoss) {
    if (spec.output.rank() < 2)
      return Error(spec.modelPath + ": --loss " + lossName + " needs an output of shape [batch, classes, ...], but " +
                   spec.outputName + " is " + spec.output.str());
    expected.erase(spec.classesLast ? expected.end() - 1 : expected.begin());
    if (!isInteger(y->dtype()))
      return Error(file + ": " + yDesc + " holds " + numpyName(y->dtype()) + " labels, but --loss " + lossName +
                   " takes integer class indices; convert them with y.astype(numpy.int64)");
  } else if (!isFloat(y->dtype())) {
    return Error(file + ": " + yDesc + " holds " + numpyName(y->dtype()) + " targets, but --loss mse takes " +
                 numpyName(spec.output.dtype) + " targets like the output; convert them with y.astype(numpy." +
                 numpyName(spec.output.dtype) + ")");
  }
  bool shapeOk = y->rank() == static_cast<int64_t>(expected.size()) + 1;
  for (size_t k = 0; shapeOk && k < expected.size(); ++k)
    shapeOk = !expected[k].isStatic() || expected[k].size == y->shape()[k + 1];
  if (!shapeOk)
    return Error(file + ": " + yDesc + " holds labels of shape " + shapeString(y->shape(), 1) + ", but --loss " +
                 lossName + " on the model's output " + spec.outputName + " (" + spec.output.str() +
                 ") expects labels of shape " + dimsString(expected) + " per sample" +
                 (!classLoss         ? ""
                  : spec.classesLast ? " (--classes-last: the classes are the output's last dim)"
                                     : " (the classes are dim 1 of the output, as for PyTorch's cross_entropy; "
                                       "--classes-last takes them from the last dim)"));
  const DType yType = classLoss ? DType::I64 : spec.output.dtype;
  if (y->dtype() != yType && !classLoss && notice)
    notice(file + ": '" + spec.yKey + "' is " + numpyName(y->dtype()) + ", converted to the model output's " +
           numpyName(yType));
  d.y = y->dtype() == yType ? *y : convertTensor(*y, yType);
  if (classLoss) {
    const Dim& classes = spec.classesLast ? spec.output.shape.back() : spec.output.shape[1];
    if (!classes.isStatic())
      return Error(spec.modelPath + ": the model's output " + spec.outputName + " (" + spec.output.str() +
                   ") has no fixed number of classes (dim " + (spec.classesLast ? "-1" : "1") +
                   "), so labels cannot be checked");
    const int64_t* labels = d.y.data<int64_t>();
    for (int64_t i = 0; i < d.y.numElements(); ++i)
      if ((labels[i] < 0 || labels[i] >= classes.size) && labels[i] != spec.ignoreIndex)
        return Error(file + ": label " + spec.yKey + "[" + indexString(i, d.y.shape()) +
                     "] = " + std::to_string(labels[i]) + " is outside [0, " + std::to_string(classes.size) +
                     "): the model's output " + spec.outputName + " has " + std::to_string(classes.size) +
                     " classes (and the ignored label, --ignore-index, is " + std::to_string(spec.ignoreIndex) + ")");
  } else if (int64_t bad = firstNonFinite(d.y); bad >= 0) {
    return Error(file + ": '" + spec.yKey + "' holds a non-finite target (" + shortest(d.y.getDouble(bad)) + ") at [" +
                 indexString(bad, d.y.shape()) + "]");
  }
  return d;
}

/// Rows `rows` of `t` (a dataset array) as one batch tensor.
Tensor gatherRows(const Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<int64_t> shape = t.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out(t.dtype(), shape);
  const size_t rowBytes = t.numBytes() / static_cast<size_t>(t.shape()[0]);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.raw() + i * rowBytes, t.raw() + static_cast<size_t>(rows[i]) * rowBytes, rowBytes);
  return out;
}

/// The sample order of each epoch: a Fisher-Yates shuffle driven by a
/// generator seeded from (seed, epoch) alone, so any epoch's order can be
/// recomputed (resume) without replaying the ones before it.
std::vector<int64_t> epochOrder(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle) return order;
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(epoch),
                    static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32)};
  std::mt19937_64 rng(seq);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng() % static_cast<uint64_t>(i + 1)]);
  return order;
}

BatchPrefetcher::BatchPrefetcher(const Dataset& data, const BatchPlan& plan, bool overlap, int64_t first, int64_t end)
    : gatherer_(data, plan), overlap_(overlap), end_(end) {
  launch(first);
}

BatchPrefetcher::~BatchPrefetcher() {
  if (pending_.valid()) pending_.wait();
}

void BatchPrefetcher::launch(int64_t step) {
  if (step >= end_) return;
  auto gather = [this, step] { return gatherer_.gather(step); };
  pending_ = overlap_ ? std::async(std::launch::async, gather) : std::async(std::launch::deferred, gather);
}

Batch BatchPrefetcher::next() {
  Batch batch = pending_.get();
  launch(batch.step + 1);  // gathered while the caller runs this step
  return batch;
}

}  // namespace kiln::training
