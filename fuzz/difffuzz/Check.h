// Running a difffuzz case on the reference interpreter and on a backend
// (the CPU JIT, the emulated GPU) and comparing the two by the rule of
// docs/ops.md, "Differential testing tolerances": NaN positions exact,
// integers and booleans exact, floats within an error bound carried
// element by element from the ops' own allowances (ulps for elementwise
// ops, n·eps of the sum of magnitudes for sums, GEMMs and convolutions),
// infinities equal, and the sign of zero where the ops define it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "driver/Session.h"
#include "fuzz/difffuzz/Case.h"

namespace kiln::difffuzz {

/// What the interpreter gives for a case, with the error each output
/// element is allowed.
struct Reference {
  std::vector<Tensor> outputs;
  /// Per output, per element: the allowed absolute error (inf: any finite
  /// value or an infinity of the same sign).
  std::vector<std::vector<double>> allowed;
  /// Per output, per element: whether a NaN is accepted where the
  /// interpreter has a number: an intermediate it depends on may overflow
  /// on the way (products past the range that the interpreter's double
  /// sums keep), and inf - inf is NaN.
  std::vector<std::vector<bool>> mayBeNaN;
  /// Per output: whether the sign of a zero result is defined.
  std::vector<bool> zeroSignDefined;
  /// Each node's value (for the shrinker's node-to-input replacement).
  std::vector<Tensor> nodeValues;
};

/// The interpreter's results and tolerances; an error when the interpreter
/// refuses the case (the case is skipped).
Expected<Reference> reference(const Case& c);

enum class Outcome { Agree, Diverge, Skipped };

struct Verdict {
  Outcome outcome = Outcome::Agree;
  std::string message;  // what diverged, where
};

/// A backend: a session for one device.
struct Backend {
  std::string name;  // "cpu" or "cuda"
  std::unique_ptr<Session> session;
  double seconds = 0;  // time spent in it
  size_t cases = 0;
};

/// Runs `c` on `backend` and compares with `ref`. A case the backend
/// cannot lower (ops it does not support) is Skipped; a failed run is a
/// divergence.
Verdict check(const Case& c, const Reference& ref, Backend& backend);

/// The first divergence between `got` and `ref`'s outputs, or none.
Verdict compare(const Reference& ref, const std::vector<Tensor>& got);

}  // namespace kiln::difffuzz
