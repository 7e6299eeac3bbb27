// The pass interface. A pass is a named unit that transforms a Module and
// says whether it changed anything; errors are values naming the op.
#pragma once

#include <memory>
#include <string_view>

#include "ir/Evaluator.h"
#include "ir/IR.h"
#include "ir/Precision.h"

namespace kiln {

class Target;

/// What passes may use besides the module: injected, never global.
struct PassContext {
  /// Evaluates ops on constants; null disables constant folding.
  const OpEvaluator* evaluator = nullptr;
  /// The target compiled for (passes/Target.h); null for target-independent
  /// pipelines. The target passes (select-library) need one.
  const Target* target = nullptr;
  /// data-parallel: the most bytes of gradients in one all-reduce bucket
  /// (DDP's bucket_cap_mb, 25 MB by default; `--bucket-cap-mb`).
  int64_t bucketCapBytes = int64_t{25} * 1024 * 1024;
  /// autocast: the precision compiled for (`--precision`); fp32 and tf32
  /// leave the graph alone.
  Precision precision = Precision::FP32;
};

class Pass {
 public:
  virtual ~Pass() = default;
  /// The flag that names the pass in pipelines.
  virtual std::string_view name() const = 0;
  /// Did it change the module? Or an error.
  virtual Expected<bool> run(Module& m, const PassContext& ctx) = 0;
};

#define KILN_PASS(Create, Flag, Summary) std::unique_ptr<Pass> Create();
#include "passes/Passes.def"

}  // namespace kiln
