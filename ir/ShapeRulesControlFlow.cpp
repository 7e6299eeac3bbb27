// Shape rules of the ControlFlow family: if, loop, check, fused and return, whose results are
// declared or empty.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

Result inferReturn(const ShapeQuery&) { return Types{}; }

/// A fused op's results are what its region returns, which a ShapeQuery
/// does not see: the rule accepts the declared types (the verifier checks
/// the region against them) and checks that `kind` names a kernel kind.
Result inferFused(const ShapeQuery& q) {
  auto kind = lookupAttr(q, "kind", AttrKind::String);
  if (!kind) return kind.takeError();
  const std::string& name = (*kind)->getString();
  if (name != "elementwise" && name != "reduction" && name != "matmul_epilogue" && name != "conv_epilogue" &&
      name != "library")
    return fail(q, "has kind \"" + name +
                       "\", expected elementwise, reduction, matmul_epilogue, conv_epilogue or library");
  return Types(q.declared.begin(), q.declared.end());
}

/// The operand types of `if` and `loop` that the op itself reads: a bool
/// scalar condition and, for a loop, an i64 scalar trip bound. The results
/// are declared: what the bodies compute (checked by the verifier against the
/// regions, which the rule does not see).
Status expectScalar(const ShapeQuery& q, size_t i, DType dtype, std::string_view what) {
  const TensorType& t = operand(q, i);
  if (t.dtype == dtype && t.rank() == 0) return Status::success();
  return fail(q, operandName(i) + " (" + std::string(what) + ") has type " + t.str() + ", expected " +
                     std::string(dtypeName(dtype)) + "[]");
}

Result inferIf(const ShapeQuery& q) {
  KILN_TRY(expectScalar(q, 0, DType::Bool, "the condition"));
  return Types(q.declared.begin(), q.declared.end());
}

Result inferLoop(const ShapeQuery& q) {
  KILN_TRY(expectScalar(q, 0, DType::I64, "the trip bound"));
  KILN_TRY(expectScalar(q, 1, DType::Bool, "the condition"));
  auto carried = lookupAttr(q, "num_carried", AttrKind::Int);
  if (!carried) return carried.takeError();
  const int64_t n = (*carried)->getInt();
  if (n < 0 || n > static_cast<int64_t>(q.operands.size()) - 2)
    return fail(q, "has num_carried " + std::to_string(n) + ", expected 0 to " +
                       std::to_string(q.operands.size() - 2) + " (the operands after the bound and condition)");
  if (!q.declared.empty() && static_cast<int64_t>(q.declared.size()) < n)
    return fail(q, "has " + std::to_string(q.declared.size()) + " results, fewer than its " + std::to_string(n) +
                       " carried values");
  return Types(q.declared.begin(), q.declared.end());
}

/// A check reads an integer (or bool) tensor and gives nothing; its
/// condition is one of three, and an index check names a dim size.
Result inferCheck(const ShapeQuery& q) {
  auto condition = lookupAttr(q, "condition", AttrKind::String);
  if (!condition) return condition.takeError();
  const std::string& name = (*condition)->getString();
  if (name != "in_range" && name != "nonzero" && name != "nonnegative")
    return fail(q, "has condition \"" + name + "\", expected in_range, nonzero or nonnegative");
  if (isFloat(q.operands[0].dtype)) return fail(q, "checks integer tensors, got " + q.operands[0].str());
  if (name == "in_range") {
    auto size = lookupAttr(q, "size", AttrKind::Int);
    if (!size) return size.takeError();
    if ((*size)->getInt() < 0) return fail(q, "has a negative size " + std::to_string((*size)->getInt()));
  }
  return Types{};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule If = &inferIf;
const Rule Loop = &inferLoop;
const Rule Check = &inferCheck;
const Rule Fused = &inferFused;
const Rule Return = &inferReturn;
}  // namespace rules

}  // namespace kiln::shape_rules
