// Loading and saving models by file extension: the one place that maps
// `.onnx`, `.kiln`, `.kiln.txt` and `.kir` to their readers and writers, so
// that `kiln run`, `kiln check` and `kiln convert` treat every format alike.
// Text IR is verified on load, because the parser leaves type and arity
// checks to the verifier and a model must be well formed before it runs.
#include "frontend/Model.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <set>

#include "frontend/KilnFormat.h"
#include "frontend/onnx/OnnxExporter.h"
#include "frontend/onnx/OnnxImporter.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace kiln {

namespace {

struct FormatInfo {
  ModelFormat format;
  std::string_view extension;
  std::string_view name;
};

// `.kiln.txt` comes before `.kiln` only for readability: matching is by
// suffix, and `x.kiln.txt` does not end in `.kiln`.
constexpr std::array<FormatInfo, 4> kFormats = {{
    {ModelFormat::Onnx, ".onnx", "ONNX"},
    {ModelFormat::KilnText, ".kiln.txt", "Kiln text protobuf"},
    {ModelFormat::Kiln, ".kiln", "Kiln binary protobuf"},
    {ModelFormat::KilnIR, ".kir", "Kiln IR text"},
}};

/// Case-insensitive suffix test: `MODEL.ONNX` is as much ONNX as `model.onnx`.
bool endsWithIgnoringCase(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), s.end() - static_cast<std::ptrdiff_t>(suffix.size()),
                    [](char lower, char c) { return std::tolower(static_cast<unsigned char>(c)) == lower; });
}

std::string knownExtensions() {
  std::string list;
  for (const FormatInfo& f : kFormats) list += (list.empty() ? "" : ", ") + std::string(f.extension);
  return list;
}

Expected<std::unique_ptr<Module>> loadTextIR(const std::string& path) {
  auto text = readFileBounded(path, kMaxModelFileBytes);
  if (!text) return text.takeError();
  auto module = parseModule(*text, path);
  if (!module) return module.takeError();
  if (Status s = verify(**module); !s) return s.takeError();
  if ((*module)->functions().empty()) return Error(path + ": the file holds no function, so there is no model to load");
  return module;
}

}  // namespace

Expected<ModelFormat> modelFormatOf(std::string_view path) {
  for (const FormatInfo& f : kFormats)
    if (endsWithIgnoringCase(path, f.extension)) return f.format;
  if (endsWithIgnoringCase(path, ".kc"))
    return Error("'" + std::string(path) +
                 "' is a compiled executable (.kc); running those needs `kiln compile`, which this build does not have "
                 "yet (expected a model file: " +
                 knownExtensions() + ")");
  return Error("cannot tell the format of '" + std::string(path) + "' from its name (expected one of " +
               knownExtensions() + ")");
}

std::string_view modelFormatName(ModelFormat format) {
  for (const FormatInfo& f : kFormats)
    if (f.format == format) return f.name;
  return "unknown";
}

Expected<std::unique_ptr<Module>> loadModel(const std::string& path, const LoadOptions& options) {
  auto format = modelFormatOf(path);
  if (!format) return format.takeError();
  switch (*format) {
    case ModelFormat::Onnx:
      return importOnnx(path, options);
    case ModelFormat::Kiln:
    case ModelFormat::KilnText:
      return readKilnModel(path);
    case ModelFormat::KilnIR:
      return loadTextIR(path);
  }
  return Error("unhandled model format for '" + path + "'");
}

std::string_view valueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::Tensor: return "a tensor";
    case ValueKind::Sequence: return "a sequence";
    case ValueKind::OptionalNone: return "an absent optional";
    case ValueKind::OptionalTensor: return "an optional tensor";
    case ValueKind::OptionalSequence: return "an optional sequence";
  }
  return "a value";
}

std::string elementName(const std::string& name, size_t index) { return name + "." + std::to_string(index); }

std::map<std::string, DenseTensor> flattenGraphValues(const std::map<std::string, GraphValue>& values) {
  std::map<std::string, DenseTensor> flat;
  for (const auto& [name, value] : values) {
    const bool isSequence = value.kind == ValueKind::Sequence || value.kind == ValueKind::OptionalSequence;
    for (size_t i = 0; i < value.tensors.size(); ++i) flat[isSequence ? elementName(name, i) : name] = value.tensors[i];
  }
  return flat;
}

Expected<std::map<std::string, GraphValue>> groupGraphValues(const std::string& path,
                                                             const std::map<std::string, DenseTensor>& tensors) {
  std::map<std::string, ValueKind> structured;
  auto format = modelFormatOf(path);
  if (!format) return format.takeError();
  if (*format == ModelFormat::Onnx) {
    auto inputs = readOnnxStructuredInputs(path);
    if (!inputs) return inputs.takeError();
    structured = std::move(*inputs);
  }
  auto isIndex = [](const std::string& s) {
    return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::map<std::string, GraphValue> values;
  std::set<std::string> used;  // the names grouped into a sequence or optional
  for (const auto& [name, kind] : structured) {
    GraphValue& value = values[name];
    if (kind == ValueKind::OptionalTensor) {
      auto it = tensors.find(name);
      value.kind = it == tensors.end() ? ValueKind::OptionalNone : ValueKind::OptionalTensor;
      if (it != tensors.end()) value.tensors.push_back(it->second);
      used.insert(name);
      continue;
    }
    // A sequence's elements are NAME.0, NAME.1, ... with no gap.
    for (size_t i = 0;; ++i) {
      auto it = tensors.find(elementName(name, i));
      if (it == tensors.end()) break;
      value.tensors.push_back(it->second);
      used.insert(it->first);
    }
    const std::string prefix = name + ".";
    for (auto it = tensors.lower_bound(prefix); it != tensors.end() && it->first.starts_with(prefix); ++it)
      if (isIndex(it->first.substr(prefix.size())) && !used.count(it->first))
        return Error(path + ": '" + it->first + "' is bound, but '" + elementName(name, value.tensors.size()) +
                     "' is not: the elements of sequence input '" + name + "' are bound as " + name + ".0, " + name +
                     ".1, ... with no gap");
    if (value.tensors.empty() && kind == ValueKind::Sequence)
      return Error(path + ": sequence input '" + name + "' is not bound: bind its elements as " + name + ".0, " + name +
                   ".1, ...");
    value.kind = value.tensors.empty() ? ValueKind::OptionalNone : kind;
  }
  for (const auto& [name, tensor] : tensors)
    if (!used.count(name)) values[name] = GraphValue{ValueKind::Tensor, {tensor}};
  return values;
}

namespace {

/// The graph outputs of a function that has tensor results only.
std::vector<GraphOutputForm> tensorOutputs(const Function& f) {
  std::vector<GraphOutputForm> outputs;
  for (size_t i = 0; i < f.resultTypes().size(); ++i) outputs.push_back({f.resultName(i), ValueKind::Tensor, i, 1});
  return outputs;
}

/// loadModelForInputs with the tensors to bind by argument name (`tensors`)
/// and the graph inputs that may be fixed as constants (`freezable`).
Expected<SpecializedModel> loadSpecialized(const std::string& path, LoadOptions specialized,
                                           const std::map<std::string, DenseTensor>& tensors,
                                           const std::map<std::string, const DenseTensor*>& freezable) {
  for (const auto& [name, tensor] : tensors) specialized.inputShapes[name] = staticDims(tensor.type.shape);
  auto format = modelFormatOf(path);
  if (!format) return format.takeError();
  if (*format != ModelFormat::Onnx) {
    if (!specialized.inputForms.empty())
      return Error(path + ": sequence and optional inputs ('" + specialized.inputForms.begin()->first +
                   "') exist only in ONNX models");
    auto module = loadModel(path, specialized);
    if (!module) return module.takeError();
    std::vector<GraphOutputForm> outputs = tensorOutputs(*(*module)->functions().front());
    return SpecializedModel{std::move(*module), {}, std::move(outputs)};
  }
  std::vector<GraphOutputForm> outputs;
  auto generic = importOnnx(path, specialized, {}, &outputs);
  if (generic) return SpecializedModel{std::move(*generic), {}, std::move(outputs)};

  // Shape-like inputs: what a Reshape, Expand, Slice or OneHot may read its
  // shape, bounds or depth from.
  constexpr int64_t kMaxFrozenElements = 64;
  std::map<std::string, DenseTensor> frozen;
  for (const auto& [name, t] : freezable)
    if (t->type.dtype == DType::I64 || t->type.dtype == DType::I32 ||
        (t->type.rank() <= 1 && t->numElements() <= kMaxFrozenElements))
      frozen[name] = *t;
  // Inputs the caller will not bind take their initializers: fixed too.
  specialized.freezeUnboundDefaults = true;
  outputs.clear();
  auto again = importOnnx(path, specialized, frozen, &outputs);
  if (!again) return generic.takeError();
  SpecializedModel result{std::move(*again), {}, std::move(outputs)};
  for (const auto& [name, t] : frozen) result.frozenInputs.push_back(name);
  return result;
}

}  // namespace

Expected<SpecializedModel> loadModelForInputs(const std::string& path, const LoadOptions& options,
                                              const std::map<std::string, DenseTensor>& inputs) {
  std::map<std::string, const DenseTensor*> freezable;
  for (const auto& [name, t] : inputs) freezable[name] = &t;
  return loadSpecialized(path, options, inputs, freezable);
}

Expected<SpecializedModel> loadModelForInputs(const std::string& path, const LoadOptions& options,
                                              const std::map<std::string, GraphValue>& inputs) {
  LoadOptions specialized = options;
  std::map<std::string, const DenseTensor*> freezable;
  for (const auto& [name, value] : inputs) {
    if (value.kind == ValueKind::Tensor) {
      if (value.tensors.size() != 1)
        return Error("input '" + name + "' is a tensor but is given " + std::to_string(value.tensors.size()));
      freezable[name] = &value.tensors[0];
      continue;
    }
    InputForm form{value.kind, {}};
    for (const DenseTensor& t : value.tensors) form.shapes.push_back(staticDims(t.type.shape));
    specialized.inputForms[name] = std::move(form);
  }
  return loadSpecialized(path, specialized, flattenGraphValues(inputs), freezable);
}

Status saveModel(const Module& module, const std::string& path) {
  auto format = modelFormatOf(path);
  if (!format) return format.takeError();
  if (module.functions().empty()) return Error("cannot write '" + path + "': the module holds no function");
  switch (*format) {
    case ModelFormat::Onnx:
      return writeOnnxModel(module, path);
    case ModelFormat::Kiln:
    case ModelFormat::KilnText:
      return writeKilnModel(module, path);
    case ModelFormat::KilnIR:
      // Text IR holds every function, so nothing is lost by writing them all.
      return writeFileAtomically(path, print(module));
  }
  return Error("unhandled model format for '" + path + "'");
}

}  // namespace kiln
