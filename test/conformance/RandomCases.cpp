// Statistical checks of the ONNX test cases that draw random numbers; see
// RandomCases.h and docs/onnx.md ("Random cases").
#include "test/conformance/RandomCases.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "onnx.pb.h"

namespace fs = std::filesystem;

namespace kiln::conformance {
namespace {

/// The fixed list: every ONNX backend case of Bernoulli and of Dropout in
/// training mode with a ratio above 0 (the zero-ratio ones are exact and
/// compared element by element).
struct Listed {
  std::string_view name;
  RandomCase kind;
};
constexpr Listed kRandomCases[] = {
    {"node/test_bernoulli", RandomCase::Bernoulli},
    {"node/test_bernoulli_double", RandomCase::Bernoulli},
    {"node/test_bernoulli_seed", RandomCase::Bernoulli},
    {"node/test_bernoulli_expanded", RandomCase::BernoulliFunction},
    {"node/test_bernoulli_double_expanded", RandomCase::BernoulliFunction},
    {"node/test_bernoulli_seed_expanded", RandomCase::BernoulliFunction},
    {"node/test_training_dropout", RandomCase::Dropout},
    {"node/test_training_dropout_default", RandomCase::Dropout},
    {"node/test_training_dropout_default_mask", RandomCase::Dropout},
    {"node/test_training_dropout_mask", RandomCase::Dropout},
};

constexpr double kRtol = 1e-3, kAtol = 1e-5;

bool near(double got, double want, double rtol) { return std::fabs(got - want) <= kAtol + rtol * std::fabs(want); }

std::string str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// `t` repeated `copies` times along dim 0 (a scalar stays as it is).
DenseTensor tiled(const DenseTensor& t, int64_t copies) {
  if (t.type.rank() == 0) return t;
  DenseTensor out = t;
  out.type.shape[0] = Dim::fixed(t.type.shape[0].size * copies);
  out.bytes.clear();
  out.bytes.reserve(t.bytes.size() * static_cast<size_t>(copies));
  for (int64_t c = 0; c < copies; ++c) out.bytes.insert(out.bytes.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

/// The model with dim 0 of every graph input in `tiledInputs` and of every
/// output of rank >= 1 multiplied by `copies`, written to a temporary file.
Expected<fs::path> writeEnlargedModel(const fs::path& modelPath, const std::vector<std::string>& tiledInputs,
                                      int64_t copies) {
  std::ifstream in(modelPath, std::ios::binary);
  onnx::ModelProto model;
  if (!in || !model.ParseFromIstream(&in)) return Error("cannot read " + modelPath.string());
  auto scale = [&](onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type() || v.type().tensor_type().shape().dim_size() == 0) return;
    auto* dim = v.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0);
    if (dim->has_dim_value()) dim->set_dim_value(dim->dim_value() * copies);
  };
  for (auto& input : *model.mutable_graph()->mutable_input())
    if (std::find(tiledInputs.begin(), tiledInputs.end(), input.name()) != tiledInputs.end()) scale(input);
  for (auto& output : *model.mutable_graph()->mutable_output()) scale(output);
  static int serial = 0;
  const fs::path path = fs::temp_directory_path() /
                        ("kiln-conformance-" + std::to_string(getpid()) + "-" + std::to_string(++serial) + ".onnx");
  std::ofstream out(path, std::ios::binary);
  if (!out || !model.SerializeToOstream(&out)) return Error("cannot write " + path.string());
  return path;
}

/// Output types: count, dtypes and shapes as the data set's (dim 0 times
/// `copies`).
std::string checkTypes(const std::vector<Tensor>& got, const std::vector<DenseTensor>& want, int64_t copies) {
  if (got.size() != want.size())
    return "the model computes " + std::to_string(got.size()) + " outputs, the data set has " +
           std::to_string(want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    TensorType expected = want[k].type;
    if (expected.rank() > 0) expected.shape[0] = Dim::fixed(expected.shape[0].size * copies);
    if (got[k].type() != expected)
      return "output " + std::to_string(k) + " is " + got[k].type().str() + ", expected " + expected.str();
  }
  return "";
}

/// Outputs of two runs: integers and bools equal, floats within `rtol`.
std::string checkSame(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rtol,
                      const std::string& what) {
  if (a.size() != b.size())
    return what + ": " + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " outputs";
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].type() != b[k].type())
      return what + ": output " + std::to_string(k) + " is " + a[k].type().str() + " and " + b[k].type().str();
    const bool exact = !isFloat(a[k].dtype()) || rtol == 0;
    for (int64_t i = 0; i < a[k].numElements(); ++i) {
      const double x = a[k].getDouble(i), y = b[k].getDouble(i);
      if (exact ? x != y : !near(x, y, rtol))
        return what + ": output " + std::to_string(k) + " element " + std::to_string(i) + " is " + str(x) + " and " +
               str(y);
    }
  }
  return "";
}

/// |count - expected| within kSigmas binomial standard deviations (exact
/// when the variance is 0).
std::string checkCount(double count, double expected, double variance, const std::string& what) {
  const double bound = kSigmas * std::sqrt(variance);
  if (std::fabs(count - expected) <= bound + 1e-9) return "";
  return what + ": " + str(count) + ", expected " + str(expected) + " +- " + str(bound) + " (" + str(kSigmas) +
         " binomial standard deviations)";
}

/// Bernoulli: values in {0, 1}, certain outcomes exact, and with `copies`
/// > 1 (p tiled that many times) the count of ones per position of the
/// original input and in all.
std::string checkBernoulli(RandomCase kind, const DenseTensor& p, const Tensor& y, int64_t copies) {
  const int64_t n = p.numElements() / copies;
  if (n == 0) return "";
  std::vector<double> ones(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < y.numElements(); ++i) {
    const double v = y.getDouble(i), pi = p.getDouble(i % n);
    const double q = kind == RandomCase::Bernoulli ? pi : 1.0 - pi;  // the probability of a one
    if (v != 0.0 && v != 1.0) return "element " + std::to_string(i) + " is " + str(v) + ", expected 0 or 1";
    if ((q <= 0 && v != 0.0) || (q >= 1 && v != 1.0))
      return "element " + std::to_string(i) + " is " + str(v) + " with probability of a one " + str(q);
    ones[static_cast<size_t>(i % n)] += v;
  }
  if (copies == 1) return "";
  double total = 0, expectedTotal = 0, varianceTotal = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double pi = p.getDouble(i);
    const double q = std::clamp(kind == RandomCase::Bernoulli ? pi : 1.0 - pi, 0.0, 1.0);
    const double expected = static_cast<double>(copies) * q, variance = expected * (1 - q);
    if (std::string why = checkCount(ones[static_cast<size_t>(i)], expected, variance,
                                     "ones at position " + std::to_string(i) + " (p = " + str(pi) + ")");
        !why.empty())
      return why;
    total += ones[static_cast<size_t>(i)];
    expectedTotal += expected;
    varianceTotal += variance;
  }
  return checkCount(total, expectedTotal, varianceTotal, "ones in all");
}

/// Dropout: each output element 0 (dropped) or x / (1 - ratio) (kept), the
/// mask (when an output) saying which, and with `copies` > 1 the count kept.
std::string checkDropout(const DenseTensor& x, double ratio, const std::vector<Tensor>& out, int64_t copies) {
  const Tensor& y = out[0];
  const Tensor* mask = out.size() > 1 ? &out[1] : nullptr;
  const int64_t n = x.numElements();
  if (n == 0) return "";
  double kept = 0;
  for (int64_t i = 0; i < y.numElements(); ++i) {
    const double v = y.getDouble(i), scaled = x.getDouble(i % n) / (1.0 - ratio);
    // Without a mask output, a kept element is one that is not 0 (x from
    // a normal distribution is never exactly 0).
    const bool keep = mask ? mask->getInt(i) != 0 : v != 0.0;
    if (keep ? !near(v, scaled, kRtol) : v != 0.0)
      return "element " + std::to_string(i) + " is " + str(v) +
             (mask ? std::string(" with mask ") + (keep ? "1" : "0") : "") + ", expected " +
             (keep ? str(scaled) : std::string("0"));
    kept += keep ? 1 : 0;
  }
  if (copies == 1) return "";
  const double count = static_cast<double>(y.numElements());
  return checkCount(kept, count * (1 - ratio), count * ratio * (1 - ratio), "elements kept");
}

std::string checkValues(RandomCase kind, const std::vector<std::pair<std::string, DenseTensor>>& inputs,
                        const std::vector<Tensor>& out, int64_t copies) {
  if (inputs.empty()) return "the data set has no inputs";
  if (kind != RandomCase::Dropout) return checkBernoulli(kind, inputs[0].second, out[0], copies);
  // Dropout(x, ratio = 0.5, training_mode = false): in inference all is kept.
  double ratio = inputs.size() > 1 ? inputs[1].second.getDouble(0) : 0.5;
  if (inputs.size() > 2 && inputs[2].second.getDouble(0) == 0.0) ratio = 0.0;
  return checkDropout(inputs[0].second, ratio, out, copies);
}

}  // namespace

std::optional<RandomCase> randomCaseOf(std::string_view name) {
  for (const Listed& c : kRandomCases)
    if (c.name == name) return c.kind;
  return std::nullopt;
}

std::string checkRandomCase(RandomCase kind, const fs::path& modelPath,
                            const std::vector<std::pair<std::string, DenseTensor>>& inputs,
                            const std::vector<DenseTensor>& want, const RunModel& run) {
  const std::string path = modelPath.string();
  std::map<std::string, DenseTensor> byName(inputs.begin(), inputs.end());
  auto first = run(path, byName, false);
  if (!first) return first.error().str();
  if (std::string why = checkTypes(*first, want, 1); !why.empty()) return why;
  if (std::string why = checkValues(kind, inputs, *first, 1); !why.empty()) return why;
  auto second = run(path, byName, false);
  if (!second) return second.error().str();
  if (std::string why = checkSame(*first, *second, 0, "two runs with the same seed differ"); !why.empty()) return why;
  auto reference = run(path, byName, true);
  if (!reference) return "the interpreter: " + reference.error().str();
  if (std::string why = checkSame(*first, *reference, 1e-4, "against the interpreter"); !why.empty()) return why;

  // Enough samples to see the distribution: every input of rank >= 1 and
  // every output tiled kSampleCopies times along dim 0.
  std::vector<std::pair<std::string, DenseTensor>> enlargedInputs;
  std::vector<std::string> tiledNames;
  for (const auto& [name, t] : inputs) {
    enlargedInputs.emplace_back(name, tiled(t, kSampleCopies));
    if (t.type.rank() > 0) tiledNames.push_back(name);
  }
  auto enlarged = writeEnlargedModel(modelPath, tiledNames, kSampleCopies);
  if (!enlarged) return enlarged.error().str();
  auto many =
      run(enlarged->string(), std::map<std::string, DenseTensor>(enlargedInputs.begin(), enlargedInputs.end()), false);
  std::error_code ignored;
  fs::remove(*enlarged, ignored);
  if (!many) return "the model enlarged " + std::to_string(kSampleCopies) + " times: " + many.error().str();
  if (std::string why = checkTypes(*many, want, kSampleCopies); !why.empty()) return "enlarged: " + why;
  if (std::string why = checkValues(kind, enlargedInputs, *many, kSampleCopies); !why.empty())
    return "enlarged " + std::to_string(kSampleCopies) + " times: " + why;
  return "";
}

}  // namespace kiln::conformance
