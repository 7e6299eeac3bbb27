// The numerics guard of training: finding the first non-finite value of a
// step's results, and, to say where it came from, re-running the step on
// the reference interpreter op by op (runtime/Interpreter.h's OpObserver)
// until an op's result holds a NaN or an infinity, which is then named by
// its kind, value name, location and position in the step. Also the
// formatting of values and positions that the data checks share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "runtime/Tensor.h"

namespace kiln::training {

/// The index of the first non-finite element of a float tensor, or -1.
int64_t firstNonFinite(const Tensor& t);

/// What is not finite in `results` of training step `step` (the loss, then
/// its new parameters and state): "the loss is nan", or with `checkAll`
/// "the new value of 'w' holds inf at [0, 1]"; empty when nothing is.
std::string describeNonFiniteResult(const Function& step, const std::vector<Tensor>& results, bool checkAll);

/// Runs `step` on the interpreter with `inputs`, op by op, and names the
/// first op whose result holds a non-finite value ("first produced by 'log'
/// (%l) at m.kir: node 'take_log' (op 2 of the training step): nan at
/// [0, 0] of its f32[8,2] result"), or says that the re-run found none.
std::string findNonFiniteOp(const Function& step, const std::vector<Tensor>& inputs);

/// `v` as printf's %.6g, "nan" for any NaN.
std::string shortest(double v);
/// `flat` as an index into `shape`: "17" or "3, 5".
std::string indexString(int64_t flat, const std::vector<int64_t>& shape);

}  // namespace kiln::training
