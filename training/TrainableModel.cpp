// Loading a model for training and writing it back (TrainableModel.h).
// Kept apart from frontend/, which reads and writes formats and depends on
// ir/ only: making weights trainable lifts constants and infers shapes,
// which are passes.
#include "training/TrainableModel.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "frontend/onnx/OnnxTraining.h"
#include "ir/OpTable.h"
#include "ir/Verifier.h"
#include "passes/PassManager.h"
#include "passes/TrainingStep.h"
#include "runtime/Npz.h"
#include "training/Data.h"

namespace kiln::training {

Expected<std::unique_ptr<Module>> loadTrainableModel(const std::string& path,
                                                     const std::map<std::string, std::vector<int64_t>>& shapes,
                                                     const OpEvaluator& evaluator) {
  LoadOptions options;
  options.evaluator = &evaluator;
  options.inputShapes = shapes;
  auto format = modelFormatOf(path);
  if (!format) return format.takeError();
  std::unique_ptr<Module> module;
  if (*format == ModelFormat::Onnx) {
    auto bytes = readFileBounded(path, (int64_t{1} << 31) - 1);
    if (!bytes) return bytes.takeError();
    auto declared = declareFloatInitializersAsInputs(*bytes, path);
    if (!declared) return declared.takeError();
    std::string dir = std::filesystem::path(path).parent_path().string();
    auto imported = importOnnxBytes(*declared, path, dir.empty() ? "." : dir, options);
    if (!imported) return imported.takeError();
    module = std::move(*imported);
  } else {
    auto loaded = loadModel(path, options);
    if (!loaded) return loaded.takeError();
    module = std::move(*loaded);
  }
  if (module->functions().empty()) return Error(path + ": the model holds no function to train");
  Function& f = *module->functions().front();
  // Kiln's random ops draw the same samples on every run (docs/ops.md): a
  // training step would apply one fixed dropout mask at every step, which is
  // not what the model asks for.
  for (const auto& op : f.ops())
    if (opInfo(op->kind()).opClass == OpClass::Random)
      return Error(path + ": '" + std::string(opName(op->kind())) +
                       "' draws random numbers (Dropout in training mode, Bernoulli or a Random* op); Kiln draws the "
                       "same ones at every step, so training would use one fixed sample: export the model in eval "
                       "mode",
                   op->loc());
  // Other formats keep symbolic dims; autodiff and the JIT need static ones.
  for (Value* a : f.arguments()) {
    auto it = shapes.find(a->name());
    if (it == shapes.end() || a->type().rank() != static_cast<int64_t>(it->second.size())) continue;
    a->setType(TensorType{a->type().dtype, staticShape(it->second)});
  }
  // ONNX weights are the initializers, already arguments; the importer's
  // folded constants (an LSTM's zero initial state from ConstantOfShape) are
  // not weights, and PyTorch does not train them.
  if (*format != ModelFormat::Onnx) liftConstantsToParameters(f);
  KILN_TRY(verify(*module));
  PassContext ctx;
  ctx.evaluator = &evaluator;
  PassManager pm({}, ctx);
  KILN_TRY(pm.addPipeline("infer-shapes"));
  std::ostringstream log;  // written only when printing or timing passes, which this manager does not
  KILN_TRY(pm.run(*module, log));
  return module;
}

std::vector<int64_t> ModelSignature::zeroShape(const std::string& name, int64_t batch) const {
  std::vector<int64_t> shape;
  for (const Dim& d : zeroInputs.at(name).shape) shape.push_back(d.isStatic() ? d.size : batch);
  return shape;
}

namespace {

Expected<ModelSignature> signatureOf(const Function& f, const std::string& path,
                                     const std::vector<std::string>& zeroInputs) {
  ModelSignature s;
  if (f.resultTypes().empty()) return Error(path + ": the model has no output to put a loss on");
  s.output = f.resultTypes()[0];
  s.outputName = f.resultName(0).empty() ? "output 0" : "'" + f.resultName(0) + "'";
  if (!isFloat(s.output.dtype))
    return Error(path + ": the model's output " + s.outputName + " is " + s.output.str() +
                 "; a loss needs a float output");
  std::vector<std::string> data;
  std::string all;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const Value* a = f.argument(i);
    if (f.argumentDefault(i)) {
      if (a->type().dtype == s.output.dtype) s.params.push_back(a->name());
      continue;
    }
    const std::string name = a->name().empty() ? "#" + std::to_string(i) : a->name();
    all += (all.empty() ? "" : ", ") + name + " (" + a->type().str() + ")";
    if (std::find(zeroInputs.begin(), zeroInputs.end(), name) != zeroInputs.end()) {
      s.zeroInputs[name] = a->type();
      continue;
    }
    data.push_back(name);
    s.dataArg = i;
  }
  for (const std::string& name : zeroInputs)
    if (!s.zeroInputs.count(name))
      return Error(path + ": --zero-inputs names '" + name + "', which is not an input without a default of the " +
                   "model (those are: " + (all.empty() ? "none" : all) + ")");
  if (data.size() != 1) {
    std::string list;
    for (const std::string& d : data) list += (list.empty() ? "" : ", ") + d;
    return Error(path + ": kiln train feeds one model input from the data's x array, but the model has " +
                 std::to_string(data.size()) + " inputs without a default" + (list.empty() ? "" : " (" + list + ")") +
                 (data.size() > 1 ? "; give the others zeros with --zero-inputs NAME,..." : ""));
  }
  if (s.params.empty())
    return Error(path + ": the model has no weights to train (no " + std::string(dtypeName(s.output.dtype)) +
                 " initializer or argument with a default)");
  s.input = f.argument(s.dataArg)->type();
  s.inputName = data[0];
  if (s.input.rank() < 1) return Error(path + ": the model's input '" + s.inputName + "' is a scalar; no batch dim");
  // A zero input's dims are static or the batch dim's symbol.
  const Dim& batchDim = s.input.shape[0];
  for (const auto& [name, type] : s.zeroInputs)
    for (const Dim& d : type.shape)
      if (!d.isStatic() && !(batchDim.isSymbolic() && d.isSymbolic() && d.symbol == batchDim.symbol))
        return Error(path + ": --zero-inputs: input '" + name + "' (" + type.str() + ") has dim " + d.str() +
                     ", which is neither fixed nor the batch dim of '" + s.inputName + "' (" + s.input.str() +
                     "), so its size is unknown");
  if (s.output.rank() < 1) return Error(path + ": the model's output " + s.outputName + " is a scalar; no batch dim");
  return s;
}

/// The model specialized to the first batch, for a model that does not
/// import with a dynamic batch dim, and its data inputs' declared types.
struct SpecializedSignature {
  std::unique_ptr<Module> module;
  std::vector<std::pair<std::string, TensorType>> declared;
};

/// Loads the ONNX model at `path` with its one fed input specialized to the
/// first batch of the training data (x's sample shape, min(batch size,
/// samples) rows) and the zero inputs to theirs. The caller reports an
/// error after the unspecialized import's.
Expected<SpecializedSignature> loadSpecializedToFirstBatch(const std::string& path,
                                                           const std::vector<std::string>& zeroInputs,
                                                           const FirstBatch& first, const OpEvaluator& evaluator) {
  auto declared = readOnnxDataInputs(path);
  if (!declared) return declared.takeError();
  const std::pair<std::string, TensorType>* fed = nullptr;
  for (const auto& input : *declared)
    if (std::find(zeroInputs.begin(), zeroInputs.end(), input.first) == zeroInputs.end()) {
      if (fed)
        return Error("the model has several inputs without a default; give all but one zeros with --zero-inputs");
      fed = &input;
    }
  if (!fed || fed->second.rank() < 1) return Error("the model has no input with a batch dim for the data");
  std::vector<int64_t> xShape = first.shape;
  std::string source = "the first batch";
  if (!first.dataPath.empty()) {
    auto arrays = readNpz(first.dataPath);
    if (!arrays) return arrays.takeError();
    const Tensor* x = nullptr;
    for (const NpzArray& a : *arrays)
      if (a.name == first.xKey) x = &a.tensor;
    if (!x) return Error(first.dataPath + " has no array '" + first.xKey + "'");
    xShape = x->shape();
    source = first.dataPath + ": '" + first.xKey + "'";
  } else if (xShape.empty()) {
    // Batches handed over one at a time: the model is read again with the
    // first one's shape (the Python kiln.Trainer does so).
    return Error(std::string(kNeedsFirstBatch));
  }
  const TensorType& type = fed->second;
  bool fits = static_cast<int64_t>(xShape.size()) == type.rank() && xShape[0] > 0;
  for (int64_t k = 1; fits && k < type.rank(); ++k)
    fits = !type.shape[k].isStatic() || type.shape[k].size == xShape[k];
  if (!fits)
    return Error(source + " (" + shapeString(xShape) + ") does not fit the model's input '" + fed->first + "' (" +
                 type.str() + ")");
  const int64_t batch = std::min(first.batchSize, xShape[0]);
  const Dim& batchDim = type.shape[0];
  std::map<std::string, std::vector<int64_t>> shapes;
  shapes[fed->first] = xShape;
  shapes[fed->first][0] = batch;
  for (const auto& input : *declared) {
    if (&input == fed) continue;
    std::vector<int64_t> shape;
    for (const Dim& d : input.second.shape) {
      if (!d.isStatic() && !(batchDim.isSymbolic() && d.isSymbolic() && d.symbol == batchDim.symbol))
        return Error("--zero-inputs: input '" + input.first + "' (" + input.second.str() + ") has dim " + d.str() +
                     ", which is neither fixed nor the batch dim of '" + fed->first + "'");
      shape.push_back(d.isStatic() ? d.size : batch);
    }
    shapes[input.first] = shape;
  }
  auto module = loadTrainableModel(path, shapes, evaluator);
  if (!module) return module.takeError();
  return SpecializedSignature{std::move(*module), std::move(*declared)};
}

}  // namespace

Expected<ModelSignature> readTrainingSignature(const std::string& path, const std::vector<std::string>& zeroInputs,
                                               const FirstBatch& firstBatch, const OpEvaluator& evaluator) {
  auto format = modelFormatOf(path);
  if (!format) return format.takeError();
  // The model, unspecialized, for its signature; an ONNX model whose shapes
  // are computed from a dynamic batch imports only specialized, to the
  // first batch, with its declared input types kept for the signature.
  auto model = loadTrainableModel(path, {}, evaluator);
  std::vector<std::pair<std::string, TensorType>> declared;
  if (!model && *format == ModelFormat::Onnx) {
    auto specialized = loadSpecializedToFirstBatch(path, zeroInputs, firstBatch, evaluator);
    if (!specialized && specialized.error().message() == kNeedsFirstBatch)
      return Error(path + ": " + std::string(kNeedsFirstBatch) + " (" + model.error().message() + ")");
    // The same error both ways (an unsupported op) is reported once.
    if (!specialized && specialized.error().message() == model.error().message()) return model.takeError();
    if (!specialized)
      return Error(model.error().message() + "; specialized to the first batch of the training data, it does " +
                   "not load either: " + specialized.error().message());
    model = std::move(specialized->module);
    declared = std::move(specialized->declared);
  }
  if (!model) return model.takeError();
  auto sig = signatureOf(*(*model)->functions().front(), path, zeroInputs);
  if (!sig) return sig.takeError();
  for (const auto& [name, type] : declared) {
    if (name == sig->inputName) sig->input = type;
    if (sig->zeroInputs.count(name)) sig->zeroInputs[name] = type;
  }
  return sig;
}

Status checkTrainedModelPath(const std::string& modelPath, const std::string& outputPath) {
  auto inFormat = modelFormatOf(modelPath);
  if (!inFormat) return inFormat.takeError();
  auto outFormat = modelFormatOf(outputPath);
  if (!outFormat) return Error("-o " + outputPath + ": " + outFormat.error().message());
  if (*inFormat == ModelFormat::Onnx && *outFormat != ModelFormat::Onnx)
    return Error("-o " + outputPath +
                 ": an ONNX model is written back as ONNX (a .onnx file) with its "
                 "graph unchanged; convert it afterwards with kiln convert");
  const std::filesystem::path parent = std::filesystem::path(outputPath).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
    return Error("-o " + outputPath + ": the folder '" + parent.string() + "' does not exist");
  return Status();
}

Status writeTrainedModel(const std::string& modelPath, const std::map<std::string, DenseTensor>& params,
                         const std::string& outputPath, const OpEvaluator& evaluator) {
  auto format = modelFormatOf(modelPath);
  if (!format) return format.takeError();
  if (*format == ModelFormat::Onnx) return writeOnnxWithInitializers(modelPath, params, outputPath);
  LoadOptions options;
  options.evaluator = &evaluator;
  auto module = loadModel(modelPath, options);
  if (!module) return module.takeError();
  Function& f = *(*module)->functions().front();
  std::set<std::string> done;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    auto it = params.find(f.argument(i)->name());
    if (it == params.end() || !f.argumentDefault(i)) continue;
    f.setArgumentDefault(i, std::make_shared<const DenseTensor>(it->second));
    done.insert(it->first);
  }
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Constant) continue;
    auto it = params.find(op->result()->name());
    if (it == params.end() || done.count(it->first)) continue;
    op->setAttr("value", Attribute(it->second));
    done.insert(it->first);
  }
  for (const auto& [name, value] : params)
    if (!done.count(name)) return Error(modelPath + ": no weight named '" + name + "' to write the trained value to");
  return saveModel(**module, outputPath);
}

}  // namespace kiln::training
