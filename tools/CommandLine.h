// A small command-line parser for the `kiln` subcommands. Each subcommand
// declares its options once, as a table; parsing, the "valid options" list
// in errors and the --help text all come from that table, so they cannot
// disagree. Options are `--name VALUE` or `--name=VALUE`; flags take no
// value; `--` ends the options.
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/Precision.h"
#include "ir/Support.h"

namespace kiln::cli {

/// Exit statuses of every `kiln` command.
enum ExitCode : int { kExitOk = 0, kExitError = 1, kExitUsage = 2 };

/// One option of a subcommand.
struct OptionSpec {
  std::string_view name;     // "--input"
  std::string_view metavar;  // "NAME=FILE.npy"; empty for a flag
  std::string_view help;
  bool repeatable = false;
  std::string_view alias = {};  // "-o"
};

/// A parsed command line: option values by option name, and positionals.
class ParsedArgs {
 public:
  bool has(std::string_view name) const { return values_.count(std::string(name)) != 0; }
  /// The last value of `name`, or null when it was not given.
  const std::string* get(std::string_view name) const;
  /// Every value of a repeatable option, in order.
  std::vector<std::string> all(std::string_view name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  friend Expected<ParsedArgs> parseArgs(std::string_view command, std::span<const OptionSpec> specs,
                                        std::span<const std::string> args);
  std::map<std::string, std::vector<std::string>, std::less<>> values_;
  std::vector<std::string> positionals_;
};

/// Parses `args` (without the program and subcommand names). Errors are
/// usage errors: an unknown option (listing the valid ones), a missing or
/// unexpected value, a non-repeatable option given twice.
Expected<ParsedArgs> parseArgs(std::string_view command, std::span<const OptionSpec> specs,
                               std::span<const std::string> args);

/// The option table as help text, one option per line, aligned.
std::string formatOptions(std::span<const OptionSpec> specs);

/// Parses a whole decimal number in [minValue, maxValue]; an error naming
/// `what` otherwise.
Expected<int64_t> parseInteger(std::string_view text, std::string_view what, int64_t minValue, int64_t maxValue);
/// Parses a finite decimal number (strtod's syntax); an error naming `what`
/// otherwise.
Expected<double> parseNumber(const std::string& text, std::string_view what);
/// `512MiB`, `2GiB`, `64KiB` or a number of bytes; an error naming `what`.
Expected<int64_t> parseByteSize(std::string_view text, std::string_view what);

/// `--precision P` (docs/precision.md), with `--allow-tf32` its older
/// spelling of tf32; fp32 when neither is given. Giving both, or an unknown
/// name, is an error.
Expected<Precision> precisionOption(const ParsedArgs& args);
/// The table entries of the two options, for every command that takes them.
#define KILN_PRECISION_OPTIONS                                                                                    \
  {"--precision", "fp32|tf32|bf16|fp16",                                                                          \
   "matmuls and convolutions in bf16 or fp16 with f32 accumulation, or TF32 on CUDA (default fp32; "             \
   "docs/precision.md)"},                                                                                          \
      {"--allow-tf32", "", "the same as --precision tf32 (CUDA: f32 matrix products may use TF32)"}

/// Milliseconds as the timing outputs print them (`kiln run --bench`,
/// kiln-train-bench): four decimals.
std::string millis(double ms);
/// The median of `values`: the middle one, or the mean of the two middle
/// ones for an even count; 0 when empty.
double median(std::vector<double> values);

}  // namespace kiln::cli
