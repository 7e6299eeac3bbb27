// The subcommands of the `kiln` tool, one file each (RunCommand.cpp,
// CheckCommand.cpp, ConvertCommand.cpp), and what they share: the table
// that kiln.cpp dispatches on and prints in --help, and error reporting.
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/IR.h"
#include "ir/Json.h"
#include "ir/Support.h"
#include "tools/CommandLine.h"

namespace kiln::cli {

/// One `kiln` subcommand: its name, a one-line summary, its usage line and
/// options (the help text comes from these), and its entry point.
struct Command {
  std::string_view name;
  std::string_view summary;
  std::string_view usage;        // after "usage: kiln NAME "
  std::string_view description;  // a paragraph printed in --help
  std::span<const OptionSpec> options;
  int (*run)(const ParsedArgs& args);
};

/// Loads the model at `path` (ONNX shape computations folded by the
/// interpreter) and verifies it.
Expected<std::unique_ptr<Module>> loadVerifiedModel(const std::string& path);

/// Static shapes for graph inputs, by name, as `--input-shape NAME=DIMS`
/// gives them (kiln compile, check, convert).
using InputShapes = std::map<std::string, std::vector<int64_t>>;

/// `2x3x8` (or `scalar`) as dims; an error naming `--input-shape NAME`.
Expected<std::vector<int64_t>> parseShape(const std::string& name, const std::string& text);
/// Every `--input-shape NAME=DIMS` of `args`; an error naming the first
/// malformed one.
Expected<InputShapes> parseInputShapes(const ParsedArgs& args);
/// `x=1x6x32 y=scalar`, the shapes as the --input-shape values that give them.
std::string inputShapeList(const InputShapes& shapes);

/// An ONNX model loaded specialized to input shapes (kiln check, convert).
struct ShapedModel {
  std::unique_ptr<Module> module;
  /// Shapes Kiln chose for inputs left dynamic (every dynamic dim 1), when
  /// the model imports only with static shapes and `allowAssumed` was given;
  /// empty otherwise.
  InputShapes assumed;
};

/// Loads and verifies the ONNX model at `path` specialized to `shapes`, as
/// kiln run specializes a model to its inputs: shapes PyTorch computes from
/// a dynamic batch (Shape -> Gather -> Reshape) fold. Each name must be a
/// data input whose declared type admits the shape (an error naming all
/// that do not). When the model does not import because it computes shapes
/// from dims that `shapes` leaves dynamic, it is imported again with each
/// such dim 1: with `allowAssumed` that model is returned and
/// ShapedModel::assumed says so; otherwise the error says which --input-shape
/// options the model needs.
Expected<ShapedModel> loadOnnxWithShapes(const std::string& path, const InputShapes& shapes, bool allowAssumed);

const Command& runCommand();
const Command& compileCommand();
const Command& checkCommand();
const Command& convertCommand();
const Command& devicesCommand();
const Command& trainCommand();
const Command& generateCommand();

/// The folder of the disk cache of compiled kernels: `--cache-dir`, else
/// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; empty
/// with `--no-cache` or when none of these is set.
std::string kernelCacheDir(const ParsedArgs& args);

/// Prints `error` to stderr as `kiln <command>: error: message`, or with
/// the error's own location (`file:line:col: error: ...`) when it has one.
void reportError(std::string_view command, const Error& error);
/// A usage error: the message and a pointer to --help; returns kExitUsage.
int usageError(std::string_view command, const std::string& message);

}  // namespace kiln::cli
