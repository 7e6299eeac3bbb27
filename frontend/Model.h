// Loading and saving whole models, whatever their format. This is the one
// entry point the `kiln` tool uses; it picks the reader or writer by the
// file name's extension:
//
//   .onnx       ONNX (import: frontend/onnx/OnnxImporter.h; export: OnnxExporter.h)
//   .kiln       the Kiln graph format, binary protobuf (frontend/KilnFormat.h)
//   .kiln.txt   the Kiln graph format, text protobuf
//   .kir        Kiln IR text (ir/Parser.h, ir/Printer.h)
//
// A loaded model is a Module whose first function is the model: its
// arguments are the graph inputs (named by the input names; an input that
// also has an initializer carries it as the argument's default), its results
// the graph outputs (named by the output names), weights are `constant` ops.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <string_view>

#include "ir/Evaluator.h"
#include "ir/IR.h"

namespace kiln {

enum class ModelFormat { Onnx, Kiln, KilnText, KilnIR };

/// The format named by `path`'s extension; an error listing the known
/// extensions otherwise.
Expected<ModelFormat> modelFormatOf(std::string_view path);
std::string_view modelFormatName(ModelFormat format);

class Builder;

/// Builds with `b` the gradients of `y` with respect to `xs`, `zs` held
/// constant (passes/Autodiff.h's buildGradients, which the frontend,
/// depending on ir/ only, is handed rather than calling it).
using GradientBuilder = Expected<std::vector<Value*>> (*)(Builder& b, Value* y, std::span<Value* const> xs,
                                                          std::span<Value* const> zs);

struct LoadOptions {
  /// Evaluates ops on constants while importing (ONNX shape computations
  /// such as Shape -> Gather -> Concat -> Reshape fold to constants). May be
  /// null: then nothing is folded and such models may fail to import.
  const OpEvaluator* evaluator = nullptr;
  /// Static shapes for graph inputs, from the tensors a caller will bind:
  /// the ONNX importer specializes the model to them, so that shapes PyTorch
  /// computes from a dynamic batch (Shape -> Gather -> Reshape) fold. An
  /// input whose declared type does not admit the shape keeps its declared
  /// type (binding the tensor then reports the mismatch).
  std::map<std::string, std::vector<int64_t>> inputShapes;
  /// Fixes as constants, at their initializers, the ONNX graph inputs that
  /// have one and that `inputShapes` does not name: the inputs a caller of
  /// loadModelForInputs will not bind, so they would take those defaults
  /// anyway (a sequence position given as a defaulted input, say).
  bool freezeUnboundDefaults = false;
  /// Imports ONNX's Gradient op (ai.onnx.preview.training). May be null:
  /// then a model with a Gradient node fails to import, saying why.
  GradientBuilder gradients = nullptr;
};

/// Reads the model at `path`. Errors name the file and, where there is one,
/// the node; a model that uses unsupported ops fails with all of them listed.
Expected<std::unique_ptr<Module>> loadModel(const std::string& path, const LoadOptions& options = {});

/// A model specialized to the inputs it will run on.
struct SpecializedModel {
  std::unique_ptr<Module> module;
  /// Inputs fixed as constants at import time (no longer arguments).
  std::vector<std::string> frozenInputs;
};

/// Loads `path` for running on `inputs` (by graph input name): with their
/// shapes as LoadOptions::inputShapes, and, when an ONNX model computes
/// shapes from input values (a Reshape's shape fed by a graph input), again
/// with its shape-like inputs (integer tensors, and scalars and vectors of at
/// most 64 elements) fixed as constants. Kiln compiles static shapes, so this
/// is what running such a model means; the error of the first attempt is
/// returned when the second fails too.
Expected<SpecializedModel> loadModelForInputs(const std::string& path, const LoadOptions& options,
                                              const std::map<std::string, DenseTensor>& inputs);

/// Writes `module`'s first function to `path` in the format its extension
/// names. The file is written atomically: on error nothing is left behind and
/// an existing file is untouched.
Status saveModel(const Module& module, const std::string& path);

/// Writes `contents` to `path` through a temporary file in the same folder
/// and a rename, so readers never see a partial file.
Status writeFileAtomically(const std::string& path, std::string_view contents);

/// Reads a whole file, refusing files larger than `maxBytes`.
Expected<std::string> readFileBounded(const std::string& path, int64_t maxBytes);

}  // namespace kiln
