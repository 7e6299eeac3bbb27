// Loading a model for training (TrainableModel.h).
// Kept apart from frontend/, which reads and writes formats and depends on
// ir/ only: making weights trainable lifts constants and infers shapes,
// which are passes.
#include "training/TrainableModel.h"

#include <filesystem>
#include <sstream>

#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "frontend/onnx/OnnxTraining.h"
#include "ir/Verifier.h"
#include "passes/PassManager.h"
#include "passes/TrainingStep.h"

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
  // Other formats keep symbolic dims; autodiff and the JIT need static ones.
  for (Value* a : f.arguments()) {
    auto it = shapes.find(a->name());
    if (it == shapes.end() || a->type().rank() != static_cast<int64_t>(it->second.size())) continue;
    a->setType(TensorType{a->type().dtype, staticShape(it->second)});
  }
  liftConstantsToParameters(f);
  KILN_TRY(verify(*module));
  PassContext ctx;
  ctx.evaluator = &evaluator;
  PassManager pm({}, ctx);
  KILN_TRY(pm.addPipeline("infer-shapes"));
  std::ostringstream log;  // written only when printing or timing passes, which this manager does not
  KILN_TRY(pm.run(*module, log));
  return module;
}

}  // namespace kiln::training
