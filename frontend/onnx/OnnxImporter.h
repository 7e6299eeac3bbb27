// ONNX import: an ONNX ModelProto (onnx.proto, compiled by protoc) to Kiln
// IR, with the semantics of the opset the model declares. No ONNX library is
// involved. docs/onnx.md lists the supported ops and opsets.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "frontend/Model.h"
#include "ir/IR.h"

namespace kiln {

/// Reads and imports the `.onnx` file at `path`. External data is resolved
/// relative to its folder and may not leave it.
Expected<std::unique_ptr<Module>> importOnnx(const std::string& path, const LoadOptions& options = {});

/// Imports a serialized ModelProto. `filename` is used in diagnostics;
/// `baseDir` is where external data lives ("" refuses external data).
Expected<std::unique_ptr<Module>> importOnnxBytes(std::string_view bytes, std::string_view filename,
                                                  const std::string& baseDir, const LoadOptions& options = {});

/// Variants that fix some graph inputs at import time (by name): each becomes
/// a constant instead of an argument, so shape computations on it fold. Kiln
/// takes shapes as attributes and declared types, so a model whose shapes
/// are graph inputs (Reshape's shape, Expand's shape, Tile's repeats) can only
/// be compiled for given values of them; the conformance runner uses this.
/// When `outputs` is given it receives what each graph output became (a
/// sequence or optional output is several results or none; Model.h).
Expected<std::unique_ptr<Module>> importOnnx(const std::string& path, const LoadOptions& options,
                                             const std::map<std::string, DenseTensor>& frozenInputs,
                                             std::vector<GraphOutputForm>* outputs = nullptr);
Expected<std::unique_ptr<Module>> importOnnxBytes(std::string_view bytes, std::string_view filename,
                                                  const std::string& baseDir, const LoadOptions& options,
                                                  const std::map<std::string, DenseTensor>& frozenInputs,
                                                  std::vector<GraphOutputForm>* outputs = nullptr);

/// One ONNX op type the importer cannot convert, with every node using it.
struct UnsupportedOnnxOp {
  std::string domain;  // "" for the default domain
  std::string opType;
  int64_t opset = 0;   // the model's opset for the domain
  std::vector<std::string> nodes;  // node names (or "#index" when unnamed)
};

/// The ops of the model at `path` that the importer does not support (empty
/// when all are); an error only when the file itself cannot be read.
Expected<std::vector<UnsupportedOnnxOp>> findUnsupportedOnnxOps(const std::string& path);

/// The graph inputs of the `.onnx` file at `path` that have no initializer
/// (the model's data inputs), in order, with their declared types (symbolic
/// dims kept), read without importing the graph: what a caller needs to
/// choose static shapes for a model that imports only specialized (its
/// shapes computed from a dynamic batch dim).
Expected<std::vector<std::pair<std::string, TensorType>>> readOnnxDataInputs(const std::string& path);

/// The data inputs (as readOnnxDataInputs) and the graph outputs of the
/// `.onnx` file at `path`, with their declared types, read without
/// importing the graph.
struct OnnxSignature {
  std::vector<std::pair<std::string, TensorType>> inputs, outputs;
};
Expected<OnnxSignature> readOnnxSignature(const std::string& path);

/// The graph inputs of the `.onnx` file at `path` that are sequences or
/// optionals, each with what it is declared (ValueKind::Sequence,
/// OptionalTensor or OptionalSequence), read without importing the graph.
Expected<std::map<std::string, ValueKind>> readOnnxStructuredInputs(const std::string& path);

/// Reads a serialized TensorProto (the `input_0.pb` files of the ONNX
/// backend tests). Strings and other types Kiln has no dtype for are errors.
Expected<DenseTensor> readOnnxTensor(const std::string& path);
Expected<DenseTensor> parseOnnxTensor(std::string_view bytes, std::string_view what);

/// What an ONNX value file holds: a TensorProto, a SequenceProto or an
/// OptionalProto (the graph value's declared type says which).
enum class OnnxValueFile { Tensor, Sequence, Optional };
/// Reads a value file of that kind as a GraphValue: a sequence of tensors,
/// or an optional that is absent or holds a tensor or such a sequence.
/// Maps, sparse tensors and nested sequences are errors naming the file.
Expected<GraphValue> readOnnxValue(const std::string& path, OnnxValueFile kind);
Expected<GraphValue> parseOnnxValue(std::string_view bytes, OnnxValueFile kind, std::string_view what);

}  // namespace kiln
