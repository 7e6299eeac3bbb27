// A function split at its ops whose result sizes depend on values
// (OpInfo::hasDataDependentShape: nonzero, unique, non_max_suppression), so
// that the CPU executor can compile what it can before them for the input
// shapes, run them on the host, and compile the rest for the sizes they
// gave (docs/codegen.md section 6):
//
//   prefix: the ops that depend on no data-dependent result, as a function
//           of the original arguments whose results are the values the
//           later parts read;
//   host:   the data-dependent ops whose operands the prefix (or the
//           arguments) give, run by runtime/DataDependent.h;
//   suffix: every other op, as a function of the arguments, prefix values
//           and host results it reads, returning the original results.
//
// The suffix may hold further data-dependent ops (a nonzero of a unique's
// values); the executor that runs it splits it again.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "runtime/DataDependent.h"

namespace kiln::codegen {

/// Where a value of the original function is found during a staged run.
struct StageValue {
  enum class From : uint8_t { Argument, Prefix, Host };
  From from = From::Argument;
  /// The argument, the prefix result, or the host op.
  size_t index = 0;
  /// The host op's result.
  size_t result = 0;
};

struct FunctionStages {
  /// One data-dependent op run on the host between the prefix and suffix.
  struct HostOp {
    DataDependentOp op;
    std::string name;  // `nonzero`, for errors and notices
    std::vector<StageValue> operands;
  };

  /// The prefix (arguments: the original ones), or null when no value
  /// the later parts read needs an op of it.
  std::unique_ptr<Module> prefix;
  std::vector<HostOp> host;
  /// The suffix, or null when the original results are all arguments,
  /// prefix results or host results (`results` then says which).
  std::unique_ptr<Module> suffix;
  /// The suffix's arguments, in order.
  std::vector<StageValue> suffixInputs;
  /// Without a suffix: where each original result is.
  std::vector<StageValue> results;
};

/// `f` split at its top-level data-dependent ops, or nullopt when it has
/// none.
Expected<std::optional<FunctionStages>> splitAtDataDependentOps(const Function& f);

}  // namespace kiln::codegen
