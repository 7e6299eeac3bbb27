// The numerics guard (Numerics.h). The interpreter re-run is the reference:
// if it finds every value finite where the JIT's step did not, the message
// says so, since that is a difference between the two backends.
#include "training/Numerics.h"

#include <cmath>
#include <cstdio>

#include "runtime/Interpreter.h"

namespace kiln::training {

namespace {

/// Describes `op` for a message: "'exp' (%h) at model.onnx: node '/Exp'".
std::string describeOp(const Op& op) {
  std::string s = "'" + std::string(op.name()) + "'";
  if (!op.result(0)->name().empty()) s += " (%" + op.result(0)->name() + ")";
  if (!op.loc().isUnknown()) s += " at " + op.loc().str();
  return s;
}

}  // namespace

std::string shortest(double v) {
  if (std::isnan(v)) return "nan";  // printf's sign of a NaN means nothing to a user
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string indexString(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::string s;
  for (size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s;
}

int64_t firstNonFinite(const Tensor& t) {
  if (!isFloat(t.dtype())) return -1;
  const int64_t n = t.numElements();
  if (t.dtype() == DType::F32) {
    const float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  }
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(t.getDouble(i))) return i;
  return -1;
}

std::string describeNonFiniteResult(const Function& step, const std::vector<Tensor>& results, bool checkAll) {
  const double loss = results[0].getDouble(0);
  if (!std::isfinite(loss)) return "the loss is " + shortest(loss);
  if (!checkAll) return "";
  for (size_t i = 1; i < results.size(); ++i)
    if (int64_t at = firstNonFinite(results[i]); at >= 0)
      return "the new value of '" + step.resultName(i) + "' holds " + shortest(results[i].getDouble(at)) + " at [" +
             indexString(at, results[i].shape()) + "]";
  return "";
}

std::string findNonFiniteOp(const Function& step, const std::vector<Tensor>& inputs) {
  std::string found;
  size_t index = 0;
  auto observer = [&](const Op& op, const std::vector<Tensor>& results) -> Status {
    ++index;
    for (const Tensor& r : results) {
      if (int64_t bad = firstNonFinite(r); bad >= 0) {
        found = "first produced by " + describeOp(op) + " (op " + std::to_string(index) +
                " of the training step): " + shortest(r.getDouble(bad)) + " at [" + indexString(bad, r.shape()) +
                "] of its " + r.type().str() + " result";
        return Error("stop");
      }
    }
    return Status::success();
  };
  auto r = interpret(step, inputs, observer);
  if (!found.empty()) return found;
  if (!r) return "the interpreter's re-run of the step failed: " + r.error().message();
  return "but the interpreter's re-run of the same step gives finite values everywhere (a difference between the "
         "CPU JIT and the interpreter)";
}

}  // namespace kiln::training
