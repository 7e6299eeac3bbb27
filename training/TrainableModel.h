// The model side of training: loading a model so that its weights are
// trainable arguments (loadTrainableModel, the one way Kiln loads a model
// for training).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/Evaluator.h"
#include "ir/IR.h"

namespace kiln::training {

/// The model at `path` loaded for training: its weights are arguments with
/// defaults, so that a training step (passes/TrainingStep.h) trains them.
/// ONNX: every float initializer of rank >= 1 is declared a graph input
/// before import (frontend/onnx/OnnxTraining.h), so it stays one argument
/// named and shaped as in the file, and constant folding cannot rewrite it
/// (Gemm's transB would fold W into an unnamed W^T that nothing trains).
/// Other formats: their named float constants are lifted
/// (liftConstantsToParameters). Graph inputs named in `shapes` are
/// specialized to those static shapes (ONNX at import, so shapes computed
/// from a dynamic batch fold); then the module is verified and its shapes
/// inferred. `evaluator` folds constant ops during import and inference
/// (codegen::Session::evaluator()).
Expected<std::unique_ptr<Module>> loadTrainableModel(const std::string& path,
                                                     const std::map<std::string, std::vector<int64_t>>& shapes,
                                                     const OpEvaluator& evaluator);

}  // namespace kiln::training
