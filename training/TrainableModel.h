// The model side of training: loading a model so that its weights are
// trainable arguments (loadTrainableModel, the one way Kiln loads a model
// for training), reading what the training loop needs of its signature
// (which input the data feeds, its output, its parameters), and writing the
// trained weights back into a model file in the input's format.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
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

/// What the training loop needs to know of the model's signature.
struct ModelSignature {
  std::vector<std::string> params;  // trained arguments, in argument order
  size_t dataArg = 0;               // the argument the x array feeds
  TensorType input, output;
  std::string inputName, outputName;  // outputName: "'logits'" or "output 0"
  /// Inputs fed zeros at every step: name -> declared type.
  std::map<std::string, TensorType> zeroInputs;
  /// The training data's sample shape (x's dims after the first): the fed
  /// input's dims after the batch dim. Set once the data is read.
  std::vector<int64_t> sampleShape;

  /// The static shape of zero input `name` for batches of `batch`.
  std::vector<int64_t> zeroShape(const std::string& name, int64_t batch) const;
};

/// The data a model is specialized to when it imports only with static
/// shapes (an ONNX model computing shapes from its dynamic batch): the first
/// batch of array `xKey` of `dataPath`, or, without a data file (batches
/// handed over, the Python kiln.Trainer), a batch of shape `shape`.
struct FirstBatch {
  std::string dataPath, xKey;
  int64_t batchSize = 1;
  std::vector<int64_t> shape;  // used when dataPath is empty
};

/// What readTrainingSignature's error says, after the path, of an ONNX
/// model that imports only specialized when `firstBatch` has neither a data
/// file nor a shape: the caller may try again with the first batch's shape.
inline constexpr std::string_view kNeedsFirstBatch =
    "the model imports only with its input shapes known (it computes shapes from them), so its signature is read "
    "with the first batch's shape";

/// Loads the model at `path` for training and reads its signature: one
/// float output to put a loss on, exactly one input without a default for
/// the data besides `zeroInputs`, whose dims are static or the batch dim,
/// and at least one weight. An ONNX model that does not import with its
/// batch dim unknown is imported specialized to `firstBatch`, with the
/// declared input types kept; both errors are reported when that fails too.
Expected<ModelSignature> readTrainingSignature(const std::string& path, const std::vector<std::string>& zeroInputs,
                                               const FirstBatch& firstBatch, const OpEvaluator& evaluator);

/// Checks, before training, that the trained model of `modelPath` can be
/// written to `outputPath`: a known format (ONNX stays ONNX) in an existing
/// folder.
Status checkTrainedModelPath(const std::string& modelPath, const std::string& outputPath);

/// Writes the model at `modelPath` with the trained `params` to `outputPath`:
/// ONNX by replacing the initializers' values in a copy of the file, other
/// formats through saveModel after setting the weights' values.
Status writeTrainedModel(const std::string& modelPath, const std::map<std::string, DenseTensor>& params,
                         const std::string& outputPath, const OpEvaluator& evaluator);

}  // namespace kiln::training
