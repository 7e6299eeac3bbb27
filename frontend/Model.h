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

#include <memory>
#include <string>
#include <string_view>

#include "ir/Evaluator.h"
#include "ir/IR.h"

namespace kiln {

enum class ModelFormat { Onnx, Kiln, KilnText, KilnIR };

/// The format named by `path`'s extension; an error listing the known
/// extensions otherwise.
Expected<ModelFormat> modelFormatOf(std::string_view path);
std::string_view modelFormatName(ModelFormat format);

struct LoadOptions {
  /// Evaluates ops on constants while importing (ONNX shape computations
  /// such as Shape -> Gather -> Concat -> Reshape fold to constants). May be
  /// null: then nothing is folded and such models may fail to import.
  const OpEvaluator* evaluator = nullptr;
};

/// Reads the model at `path`. Errors name the file and, where there is one,
/// the node; a model that uses unsupported ops fails with all of them listed.
Expected<std::unique_ptr<Module>> loadModel(const std::string& path, const LoadOptions& options = {});

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
