// The subcommands of the `kiln` tool, one file each (RunCommand.cpp,
// CheckCommand.cpp, ConvertCommand.cpp), and what they share: the table
// that kiln.cpp dispatches on and prints in --help, and error reporting.
#pragma once

#include <span>
#include <string>
#include <string_view>

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
