// Shape rules of the Collective family: the collectives of a data-parallel job.
// Helpers shared by the families are in ir/ShapeRuleSupport.h; the table
// at the end registers this family's rule of each of its ops (ir/Ops.def).
#include "ir/ShapeRuleSupport.h"

namespace kiln::shape_rules {
namespace {

/// Collectives keep their operand's type, except that all_gather multiplies
/// dim `axis` by the world size and reduce_scatter divides it.
Result inferCollective(const ShapeQuery& q) {
  const TensorType& x = operand(q, 0);
  if (const Attribute* r = q.attr("reduction")) {
    const std::string& name = r->getString();
    if (name != "sum" && name != "mean") return fail(q, "has reduction \"" + name + "\", expected sum or mean");
    if (name == "mean" && !isFloat(x.dtype)) return fail(q, "averages float tensors, got " + x.str());
    if (x.dtype == DType::Bool) return fail(q, "reduces numbers, got " + x.str());
  }
  if (const Attribute* root = q.attr("root"); root && root->getInt() < 0)
    return fail(q, "has a negative root rank " + std::to_string(root->getInt()));
  if (q.kind != OpKind::AllGather && q.kind != OpKind::ReduceScatter) return Types{x};
  const int64_t world = q.attr("world_size")->getInt();
  if (world < 1) return fail(q, "has world_size " + std::to_string(world) + ", expected at least 1");
  auto axis = normalizeAxis(q.attr("axis")->getInt(), x.rank());
  if (!axis) return fail(q, "has axis " + std::to_string(q.attr("axis")->getInt()) + ", out of range for " + x.str());
  Shape shape = x.shape;
  Dim& d = shape[*axis];
  if (d.isStatic()) {
    if (q.kind == OpKind::AllGather) {
      d.size *= world;
    } else {
      if (d.size % world != 0)
        return fail(q, "splits dim " + std::to_string(*axis) + " of " + x.str() + " into " + std::to_string(world) +
                           " blocks; it must divide evenly");
      d.size /= world;
    }
  } else {
    d = Dim();  // unknown
  }
  return Types{{x.dtype, std::move(shape)}};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace rules {
const Rule AllReduce = &inferCollective;
const Rule BroadcastFrom = &inferCollective;
const Rule ReduceTo = &inferCollective;
const Rule AllGather = &inferCollective;
const Rule ReduceScatter = &inferCollective;
}  // namespace rules

}  // namespace kiln::shape_rules
