// The reference interpreter: runs any Function op by op on the CPU, for every
// dtype the op table allows. It is the oracle every backend is compared
// with, so its kernels are plain loops that are obviously correct; float
// math accumulates in double.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "ir/Evaluator.h"
#include "ir/IR.h"
#include "runtime/Tensor.h"

namespace kiln {

/// Runs `f` on `inputs` (one per argument, matching its types; symbolic dims
/// bound consistently) and returns one tensor per result.
Expected<std::vector<Tensor>> interpret(const Function& f, std::vector<Tensor> inputs);

/// Called with each op and its results as the interpreter runs it; an error
/// it returns stops the run and is returned (`kiln train --check-numerics`
/// names the first op that produces a non-finite value this way).
using OpObserver = std::function<Status(const Op& op, const std::vector<Tensor>& results)>;
Expected<std::vector<Tensor>> interpret(const Function& f, std::vector<Tensor> inputs, const OpObserver& observer);

/// Runs a single op on concrete operands.
Expected<std::vector<Tensor>> interpretOp(const Op& op, std::span<const Tensor* const> operands);

/// The interpreter as an OpEvaluator for constant folding.
class InterpreterEvaluator : public OpEvaluator {
 public:
  Expected<std::vector<DenseTensor>> evaluate(
      const Op& op, std::span<const DenseTensor* const> operands) const override;
};

/// The one InterpreterEvaluator that compiles fold constants with, so that
/// folding and running never disagree: the executors' (codegen/) and the
/// session's (driver/Session.h Session::evaluator).
const OpEvaluator& interpreterEvaluator();

}  // namespace kiln
