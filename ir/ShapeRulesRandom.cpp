// Shape rules of the Random family: the random samplers, whose result type is declared.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

Result inferRandom(const ShapeQuery& q) {
  auto declared = declaredType(q);
  if (!declared) return declared.takeError();
  if (!isFloat(declared->dtype)) return fail(q, "declared result type " + declared->str() + " must have a float dtype");
  if (q.kind == OpKind::RandomUniform) {
    auto low = floatAttr(q, "low");
    if (!low) return low.takeError();
    auto high = floatAttr(q, "high");
    if (!high) return high.takeError();
    if (!(*low <= *high))
      return fail(q,
                  "attribute 'low' = " + std::to_string(*low) + " must not exceed 'high' = " + std::to_string(*high));
  } else {
    auto stddev = floatAttr(q, "std");
    if (!stddev) return stddev.takeError();
    if (!(*stddev >= 0)) return fail(q, "attribute 'std' = " + std::to_string(*stddev) + ", expected >= 0");
  }
  KILN_TRY(intAttr(q, "seed"));
  return Types{*declared};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule RandomUniform = &inferRandom;
const Rule RandomNormal = &inferRandom;
}  // namespace rules

}  // namespace kiln::shape_rules
