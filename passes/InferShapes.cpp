// The `infer-shapes` pass: makes declared result types as precise as the
// shape rules allow, so that later passes (fusion, memory planning, codegen)
// see static dims wherever the inputs determine them.
#include <optional>
#include <string>

#include "ir/ShapeRules.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

/// `declared` refined dim by dim with `inferred`, or nullopt when they
/// disagree on the dtype, the rank or a static dim.
std::optional<TensorType> refineType(const TensorType& declared, const TensorType& inferred) {
  if (declared.dtype != inferred.dtype || declared.rank() != inferred.rank()) return std::nullopt;
  TensorType refined = declared;
  for (size_t d = 0; d < refined.shape.size(); ++d) {
    if (!dimsCompatible(declared.shape[d], inferred.shape[d])) return std::nullopt;
    refined.shape[d] = refineDim(declared.shape[d], inferred.shape[d]);
  }
  return refined;
}

/// Refines every declared result type of every op, in program order, with
/// the types its shape rule infers from the (already refined) operand types,
/// then the function's result types from the values it returns. A dim
/// becomes more precise and never less: static beats symbolic, symbolic
/// beats unknown, and a declared symbol is kept over another symbol. Types
/// that contradict the rule (another dtype or rank, two different static
/// sizes) are an error naming the op; the pass stops there, keeping the
/// refinements made before it. Function arguments are left alone:
/// they are the function's contract with its callers. A region (a `fused`
/// op's body) is refined too: its arguments take the operands' types, its
/// ops are refined in order, and the op's results take what it returns.
///
///   %y = add(%x, %b) : f32[?,?]      with %x: f32[N,3], %b: f32[3]
///   becomes
///   %y = add(%x, %b) : f32[N,3]
class InferShapesPass : public Pass {
 public:
  std::string_view name() const override { return "infer-shapes"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) {
      auto fnChanged = runOnFunction(*f);
      if (!fnChanged) return fnChanged.takeError();
      changed |= *fnChanged;
    }
    return changed;
  }

 private:
  /// Refines `region` from the types of `op`'s operands, then `op`'s result
  /// types from the region's (both kept equal, as the verifier requires).
  static Expected<bool> refineRegion(Op& op, Function& region) {
    bool changed = false;
    if (region.numArguments() != op.numOperands() || region.resultTypes().size() != op.numResults())
      return op.emitError("has a region that does not match its operands and results");
    for (size_t i = 0; i < op.numOperands(); ++i) {
      if (!op.operand(i) || region.argument(i)->type() == op.operand(i)->type()) continue;
      region.argument(i)->setType(op.operand(i)->type());
      changed = true;
    }
    auto inner = runOnFunction(region);
    if (!inner) return inner.takeError();
    changed |= *inner;
    for (size_t i = 0; i < op.numResults(); ++i) {
      auto refined = refineType(op.result(i)->type(), region.resultTypes()[i]);
      if (!refined)
        return op.emitError("result " + std::to_string(i) + " is declared " + op.result(i)->type().str() +
                            " but its region returns " + region.resultTypes()[i].str());
      if (*refined != op.result(i)->type()) {
        op.result(i)->setType(std::move(*refined));
        changed = true;
      }
    }
    std::vector<TensorType> types;
    for (Value* r : op.results()) types.push_back(r->type());
    region.setResultTypes(std::move(types));
    return changed;
  }

  /// A loop's carried results take their initial values' types when its
  /// body, given those types, returns them unchanged (the carried values
  /// keep their shapes on every iteration): then the body's arguments take
  /// them, its ops are refined, and its scan results' element types with
  /// them. A body that changes a carried value's type (one that grows, say)
  /// or does not take the initial types is left as it is.
  static Expected<bool> refineLoopFromInitialValues(Op& op) {
    Function& body = *op.region(0);
    const size_t K = static_cast<size_t>(op.getInt("num_carried"));
    if (body.numArguments() != op.numOperands() || body.resultTypes().size() != 1 + op.numResults()) return false;
    bool differs = false;
    for (size_t i = 2; i < op.numOperands(); ++i) differs |= body.argument(i)->type() != op.operand(i)->type();
    if (!differs) return false;
    std::unique_ptr<Function> trial = body.clone();
    for (size_t i = 2; i < op.numOperands(); ++i) trial->argument(i)->setType(op.operand(i)->type());
    if (auto refined = runOnFunction(*trial); !refined) return false;
    const Op* ret = trial->returnOp();
    if (!ret || ret->numOperands() != body.resultTypes().size()) return false;
    for (size_t k = 0; k < K; ++k)
      if (ret->operand(1 + k)->type() != trial->argument(2 + k)->type()) return false;

    for (size_t i = 2; i < op.numOperands(); ++i) body.argument(i)->setType(op.operand(i)->type());
    auto inner = runOnFunction(body);
    if (!inner) return inner.takeError();
    std::vector<TensorType> signature = body.resultTypes();
    const Op* bodyRet = body.returnOp();
    for (size_t r = 0; r < op.numResults(); ++r) {
      // A carried result is the value the body returns; a scan result
      // stacks it along a new first dim, whose size stays as declared.
      TensorType type = bodyRet->operand(1 + r)->type();
      if (r >= K) type.shape.insert(type.shape.begin(), op.result(r)->type().shape.empty()
                                                            ? Dim::unknown()
                                                            : op.result(r)->type().shape.front());
      auto refined = refineType(op.result(r)->type(), type);
      if (!refined)
        return op.emitError("result " + std::to_string(r) + " is declared " + op.result(r)->type().str() +
                            " but its body gives " + type.str());
      op.result(r)->setType(*refined);
      signature[1 + r] = r < K ? *refined : bodyRet->operand(1 + r)->type();
    }
    body.setResultTypes(std::move(signature));
    return true;
  }

  /// Refines the ops of a control-flow body, leaving its signature alone.
  static Expected<bool> refineBody(Function& body) {
    const std::vector<TensorType> signature = body.resultTypes();
    auto changed = runOnFunction(body);
    if (!changed) return changed;
    body.setResultTypes(signature);
    return changed;
  }

  static Expected<bool> runOnFunction(Function& f) {
    bool changed = false;
    for (const auto& op : f.ops()) {
      if (op->kind() == OpKind::Return) continue;
      auto inferred = inferResultTypes(*op);
      if (!inferred) return inferred.takeError();
      if (inferred->size() != op->numResults())
        return op->emitError("has " + std::to_string(op->numResults()) + " results, but its shape rule gives " +
                             std::to_string(inferred->size()));
      for (size_t i = 0; i < op->numResults(); ++i) {
        Value* result = op->result(i);
        auto refined = refineType(result->type(), (*inferred)[i]);
        if (!refined)
          return op->emitError("result " + std::to_string(i) + " is declared " + result->type().str() +
                               " but inferred " + (*inferred)[i].str());
        if (*refined != result->type()) {
          result->setType(std::move(*refined));
          changed = true;
        }
      }
      if (op->info().isControlFlow()) {
        // A body's arguments may take other types on each iteration (a
        // loop's carried values) and its results are tied to the op's by
        // the verifier's looser rule, so only its ops are refined.
        if (op->kind() == OpKind::Loop) {
          auto loopChanged = refineLoopFromInitialValues(*op);
          if (!loopChanged) return loopChanged.takeError();
          changed |= *loopChanged;
        }
        for (size_t r = 0; r < op->numRegions(); ++r) {
          auto bodyChanged = refineBody(*op->region(r));
          if (!bodyChanged) return bodyChanged.takeError();
          changed |= *bodyChanged;
        }
      } else if (Function* region = op->region()) {
        auto regionChanged = refineRegion(*op, *region);
        if (!regionChanged) return regionChanged.takeError();
        changed |= *regionChanged;
      }
    }
    if (Op* ret = f.returnOp(); ret && ret->numOperands() == f.resultTypes().size()) {
      std::vector<TensorType> types = f.resultTypes();
      for (size_t i = 0; i < types.size(); ++i) {
        if (!ret->operand(i)) continue;
        auto refined = refineType(types[i], ret->operand(i)->type());
        if (!refined)
          return ret->emitError("operand " + std::to_string(i) + " has type " + ret->operand(i)->type().str() +
                                ", but @" + f.name() + " declares result type " + types[i].str());
        types[i] = std::move(*refined);
      }
      if (types != f.resultTypes()) {
        f.setResultTypes(std::move(types));
        changed = true;
      }
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createInferShapesPass() { return std::make_unique<InferShapesPass>(); }

}  // namespace kiln
