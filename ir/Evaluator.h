// An interface for evaluating one op on constant operands. Passes that fold
// constants (canonicalize) receive one through their PassContext; the
// runtime's interpreter implements it. This keeps passes independent of the
// runtime while constant folding uses the same reference kernels as the
// interpreter, so folding and execution can never disagree.
#pragma once

#include <span>
#include <vector>

#include "ir/IR.h"

namespace kiln {

class OpEvaluator {
 public:
  virtual ~OpEvaluator() = default;
  /// Results of `op` applied to `operands` (one per operand, static shapes).
  virtual Expected<std::vector<DenseTensor>> evaluate(
      const Op& op, std::span<const DenseTensor* const> operands) const = 0;
};

}  // namespace kiln
