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
//
// Kiln IR has tensors only. An ONNX graph input or output that is a
// sequence or an optional is specialized at import to the value it takes,
// as inputShapes specializes shapes: a sequence of N tensors is N arguments
// or results named elementName(name, 0..N-1), an optional holding a tensor
// is that tensor (named `name`), one holding a sequence is its elements, and
// an absent optional is nothing. The caller gives the inputs' forms
// (LoadOptions::inputForms, or loadModelForInputs from the values it will
// bind); the outputs' forms come back in SpecializedModel::outputs.
#pragma once

#include <map>
#include <memory>
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

/// What an ONNX graph value is: a tensor, a sequence of tensors, or an
/// optional that is absent or holds a tensor or a sequence.
enum class ValueKind { Tensor, Sequence, OptionalNone, OptionalTensor, OptionalSequence };
std::string_view valueKindName(ValueKind kind);

/// The name of element `index` of the sequence `name` among a loaded
/// function's arguments or results: "name.index".
std::string elementName(const std::string& name, size_t index);

/// The form a sequence or optional graph input is specialized to: its kind
/// and the shape of each of its tensors (a sequence's elements, an optional
/// tensor's one; none when absent).
struct InputForm {
  ValueKind kind = ValueKind::Tensor;
  std::vector<std::vector<int64_t>> shapes;
};

/// A value a caller binds to an ONNX graph input or reads from an output:
/// its kind and tensors (one for a tensor or an optional tensor, the
/// elements of a sequence, none for an absent optional).
struct GraphValue {
  ValueKind kind = ValueKind::Tensor;
  std::vector<DenseTensor> tensors;
};

/// What one ONNX graph output became in a loaded function: the `count`
/// results from `first` (1 for a tensor, N for a sequence of N, 0 for an
/// absent optional).
struct GraphOutputForm {
  std::string name;
  ValueKind kind = ValueKind::Tensor;
  size_t first = 0;
  size_t count = 1;
};

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
  /// The forms of the sequence and optional graph inputs (by name), which
  /// the ONNX importer needs: such an input becomes the tensor arguments of
  /// its form (the file comment). One without a form is an error naming it.
  std::map<std::string, InputForm> inputForms;
};

/// Reads the model at `path`. Errors name the file and, where there is one,
/// the node; a model that uses unsupported ops fails with all of them listed.
Expected<std::unique_ptr<Module>> loadModel(const std::string& path, const LoadOptions& options = {});

/// A model specialized to the inputs it will run on.
struct SpecializedModel {
  std::unique_ptr<Module> module;
  /// Inputs fixed as constants at import time (no longer arguments).
  std::vector<std::string> frozenInputs;
  /// Each graph output, in order, and the results it became.
  std::vector<GraphOutputForm> outputs;
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
/// The same with sequence and optional inputs: their forms become
/// LoadOptions::inputForms (only tensor inputs are ever fixed as constants).
/// Bind the loaded function's arguments to flattenGraphValues(inputs).
Expected<SpecializedModel> loadModelForInputs(const std::string& path, const LoadOptions& options,
                                              const std::map<std::string, GraphValue>& inputs);

/// The tensors of `values` by the argument names they bind in a function
/// loaded for them (a tensor or optional tensor by its own name, element i
/// of a sequence by elementName(name, i), an absent optional by none).
std::map<std::string, DenseTensor> flattenGraphValues(const std::map<std::string, GraphValue>& values);

/// The inverse, for callers that bind tensors by argument name (`kiln run`):
/// `tensors` grouped into the values of the graph inputs of the model at
/// `path`. An optional input is present when its name is bound, absent
/// otherwise; a sequence input takes NAME.0 .. NAME.N-1 (a gap, or none at
/// all, is an error naming it); other names are tensors.
Expected<std::map<std::string, GraphValue>> groupGraphValues(const std::string& path,
                                                             const std::map<std::string, DenseTensor>& tensors);

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
