// kiln-conformance: runs the ONNX backend test cases that Debian ships
// (libonnx-testdata) through the importer and the reference interpreter.
//
// Each case folder holds model.onnx and test_data_set_*/ with input_K.pb and
// output_K.pb. input_K.pb binds to the K-th graph input that has no
// initializer; inputs with an initializer take it as their default. Outputs
// are compared with rtol 1e-3 and atol 1e-5 (NaN equals NaN), integers and
// bools exactly, shapes and dtypes exactly. Cases whose graph inputs or
// outputs are sequences, optionals, maps, strings or bfloat16 are skipped.
//
// Kiln compiles static shapes, so each data set runs on the model
// specialized to its inputs, exactly as `kiln run` does (loadModelForInputs
// in frontend/Model.h): input shapes bound, and where the model computes
// shapes from input values (Reshape's shape fed by input_1.pb), those
// shape-like inputs fixed as constants; the PASS line says so.
//
// Prints one line per case, `PASS|FAIL|SKIP <suite>/<case>: reason`, and
// last `N passed, M failed, K skipped`. With --expected FILE the exit status
// is non-zero when a listed case does not pass; --write-passing FILE writes
// the passing cases (one per line) to regenerate that list.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "frontend/onnx/OnnxImporter.h"
#include "onnx.pb.h"
#include "runtime/Interpreter.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-5;
const char* const kSuites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};

struct Outcome {
  enum Kind { Pass, Fail, Skip } kind;
  std::string reason;
};

/// Why a value's type makes the case a skip, or "".
std::string skipReason(const onnx::TypeProto& type, const std::string& name) {
  switch (type.value_case()) {
    case onnx::TypeProto::kSequenceType: return "'" + name + "' is a sequence";
    case onnx::TypeProto::kMapType: return "'" + name + "' is a map";
    case onnx::TypeProto::kOptionalType: return "'" + name + "' is an optional";
    case onnx::TypeProto::kTensorType:
      if (type.tensor_type().elem_type() == onnx::TensorProto::STRING) return "'" + name + "' holds strings";
      if (type.tensor_type().elem_type() == onnx::TensorProto::BFLOAT16) return "'" + name + "' is bfloat16";
      return "";
    default: return "";
  }
}

Expected<std::string> readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Compares one output; "" when it matches.
std::string compare(const Tensor& got, const DenseTensor& want, size_t index) {
  const std::string what = "output " + std::to_string(index);
  if (got.type() != want.type) return what + " is " + got.type().str() + ", expected " + want.type.str();
  const Tensor expected = Tensor::fromDense(want);
  const bool exact = !isFloat(want.type.dtype);
  for (int64_t i = 0; i < got.numElements(); ++i) {
    if (exact) {
      if (got.getInt(i) != expected.getInt(i))
        return what + " element " + std::to_string(i) + " is " + std::to_string(got.getInt(i)) + ", expected " +
               std::to_string(expected.getInt(i));
      continue;
    }
    const double a = got.getDouble(i), b = expected.getDouble(i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (a == b) continue;  // equal infinities
    if (std::isfinite(a) && std::isfinite(b) && std::fabs(a - b) <= kAtol + kRtol * std::fabs(b)) continue;
    return what + " element " + std::to_string(i) + " is " + std::to_string(a) + ", expected " + std::to_string(b);
  }
  return "";
}

/// The sorted test_data_set_* folders of a case.
std::vector<fs::path> dataSets(const fs::path& dir) {
  std::vector<fs::path> sets;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory() && entry.path().filename().string().starts_with("test_data_set_"))
      sets.push_back(entry.path());
  std::sort(sets.begin(), sets.end());
  return sets;
}

/// The tensors input_0.pb, input_1.pb, ... (or output_K.pb) of a data set.
Expected<std::vector<DenseTensor>> readTensors(const fs::path& set, const std::string& prefix) {
  std::vector<DenseTensor> tensors;
  for (size_t k = 0;; ++k) {
    const fs::path path = set / (prefix + "_" + std::to_string(k) + ".pb");
    if (!fs::exists(path)) break;
    auto t = readOnnxTensor(path.string());
    if (!t) return t.takeError();
    tensors.push_back(std::move(*t));
  }
  return tensors;
}

class CaseRunner {
 public:
  CaseRunner(const fs::path& dir) : dir_(dir) {}

  Outcome run() {
    auto bytes = readFile(dir_ / "model.onnx");
    if (!bytes) return {Outcome::Fail, bytes.error().message()};
    if (!model_.ParseFromString(*bytes)) return {Outcome::Fail, "model.onnx is not a valid ModelProto"};
    std::set<std::string> initializers;
    for (const auto& init : model_.graph().initializer()) initializers.insert(init.name());
    for (const auto& input : model_.graph().input()) {
      if (std::string why = skipReason(input.type(), input.name()); !why.empty()) return {Outcome::Skip, why};
      if (!initializers.count(input.name())) boundInputs_.push_back(input.name());
    }
    for (const auto& output : model_.graph().output())
      if (std::string why = skipReason(output.type(), output.name()); !why.empty()) return {Outcome::Skip, why};

    evaluator_ = std::make_unique<InterpreterEvaluator>();
    LoadOptions options;
    options.evaluator = evaluator_.get();
    const std::string modelPath = (dir_ / "model.onnx").string();

    std::string note;
    const auto sets = dataSets(dir_);
    if (sets.empty()) return {Outcome::Fail, "no test_data_set_* folder"};
    for (const fs::path& set : sets) {
      auto inputs = readTensors(set, "input");
      if (!inputs) return {Outcome::Fail, inputs.error().message()};
      auto outputs = readTensors(set, "output");
      if (!outputs) return {Outcome::Fail, outputs.error().message()};
      if (inputs->size() > boundInputs_.size())
        return {Outcome::Fail, std::to_string(inputs->size()) + " input files for " +
                                   std::to_string(boundInputs_.size()) + " graph inputs without initializer"};
      std::map<std::string, DenseTensor> byName;
      for (size_t k = 0; k < inputs->size(); ++k) byName[boundInputs_[k]] = (*inputs)[k];

      // Specialized to the data set's inputs as `kiln run` does (frontend/Model.h).
      auto specialized = loadModelForInputs(modelPath, options, byName);
      if (!specialized) return {Outcome::Fail, specialized.error().str()};
      const Module* module = specialized->module.get();
      if (!specialized->frozenInputs.empty()) {
        note = "inputs fixed at import:";
        for (const std::string& name : specialized->frozenInputs) note += " " + name;
      }
      const Function& f = *module->functions().front();
      std::vector<Tensor> args;
      for (size_t i = 0; i < f.numArguments(); ++i) {
        const std::string& name = f.argument(i)->name();
        if (auto it = byName.find(name); it != byName.end()) {
          args.push_back(Tensor::fromDense(it->second));
        } else if (const DenseTensor* dflt = f.argumentDefault(i)) {
          args.push_back(Tensor::fromDense(*dflt));
        } else {
          return {Outcome::Fail, "no input_K.pb binds argument '" + name + "'"};
        }
      }
      auto results = interpret(f, std::move(args));
      if (!results) return {Outcome::Fail, results.error().str()};
      if (results->size() != outputs->size())
        return {Outcome::Fail, "the model computes " + std::to_string(results->size()) + " outputs, the data set has " +
                                   std::to_string(outputs->size())};
      for (size_t k = 0; k < results->size(); ++k)
        if (std::string diff = compare((*results)[k], (*outputs)[k], k); !diff.empty())
          return {Outcome::Fail, set.filename().string() + ": " + diff};
    }
    return {Outcome::Pass, note.empty() ? std::to_string(sets.size()) + " data set(s)" : note};
  }

 private:
  fs::path dir_;
  onnx::ModelProto model_;
  std::vector<std::string> boundInputs_;
  std::unique_ptr<InterpreterEvaluator> evaluator_;
};

/// One error message on one line.
std::string oneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

int usage() {
  std::cerr << "usage: kiln-conformance [--data DIR] [--expected FILE] [--write-passing FILE] [--filter TEXT]\n"
               "  Runs the ONNX backend test cases under DIR/{node,pytorch-converted,pytorch-operator,simple}\n"
               "  (default /usr/share/libonnx-testdata/data) on Kiln's interpreter.\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dataDir = "/usr/share/libonnx-testdata/data", expectedFile, writeFile, filter;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--data")
      dataDir = value();
    else if (arg == "--expected")
      expectedFile = value();
    else if (arg == "--write-passing")
      writeFile = value();
    else if (arg == "--filter")
      filter = value();
    else
      return usage();
  }
  if (!fs::is_directory(dataDir)) {
    std::cerr << "kiln-conformance: no test data at " << dataDir << " (install libonnx-testdata)\n";
    return 77;  // ctest's skip code
  }
  std::set<std::string> expected;
  if (!expectedFile.empty()) {
    std::ifstream in(expectedFile);
    if (!in) {
      std::cerr << "kiln-conformance: cannot read " << expectedFile << "\n";
      return 2;
    }
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line[0] != '#') expected.insert(line);
  }

  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> passing;
  std::set<std::string> seen;
  for (const char* suite : kSuites) {
    const fs::path suiteDir = fs::path(dataDir) / suite;
    if (!fs::is_directory(suiteDir)) continue;
    std::vector<fs::path> cases;
    for (const auto& entry : fs::directory_iterator(suiteDir))
      if (entry.is_directory()) cases.push_back(entry.path());
    std::sort(cases.begin(), cases.end());
    for (const fs::path& dir : cases) {
      const std::string name = std::string(suite) + "/" + dir.filename().string();
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      seen.insert(name);
      const Outcome outcome = CaseRunner(dir).run();
      const char* label = outcome.kind == Outcome::Pass ? "PASS" : outcome.kind == Outcome::Fail ? "FAIL" : "SKIP";
      std::cout << label << " " << name << ": " << oneLine(outcome.reason) << "\n" << std::flush;
      if (outcome.kind == Outcome::Pass) {
        ++passed;
        passing.push_back(name);
      } else if (outcome.kind == Outcome::Fail) {
        ++failed;
      } else {
        ++skipped;
      }
    }
  }

  int status = 0;
  if (!expectedFile.empty()) {
    const std::set<std::string> passSet(passing.begin(), passing.end());
    for (const std::string& name : expected) {
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      if (passSet.count(name)) continue;
      std::cout << "REGRESSION " << name << (seen.count(name) ? ": expected to pass" : ": case not found") << "\n";
      status = 1;
    }
  }
  if (!writeFile.empty()) {
    std::ofstream out(writeFile);
    for (const std::string& name : passing) out << name << "\n";
    if (!out) {
      std::cerr << "kiln-conformance: cannot write " << writeFile << "\n";
      status = 2;
    }
  }
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped\n";
  return status;
}
