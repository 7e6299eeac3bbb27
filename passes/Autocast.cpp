// The `autocast` pass: mixed precision as a graph transform
// (docs/precision.md). Under `--precision bf16` (fp16), every matmul and
// convolution of float32 operands — forward, transposed, weight gradient;
// a training step's backward GEMMs as well as its forward ones — takes
// bf16 (f16) inputs and keeps its f32 result, which the library computes
// with f32 accumulation (a mixed-precision contraction,
// ir/ShapeRulesContraction.cpp). Everything else — softmax, norms,
// reductions, exp and log, losses, the optimizer update on f32 master
// weights — stays f32, as under PyTorch's autocast, whose lists are the
// reference for which ops go to the low precision.
//
//   %y = matmul(%x, %w) : f32[8,256]
// becomes
//   %x.bf16 = cast(%x) : bf16[8,64]
//   %w.bf16 = cast(%w) : bf16[64,256]
//   %y = matmul(%x.bf16, %w.bf16) : f32[8,256]
//
// Rounding to the low precision happens at these casts and nowhere else:
// the interpreter and every backend round the same values (round to
// nearest even). A cast is put above the layout ops (transpose, reshape)
// that feed the contraction and nothing else, so that a weight read
// transposed in place (passes/Target.h transposeReadInPlace) still is, and
// the layout op moves half the bytes. canonicalize then folds the casts of
// constant weights into low-precision constants (once, at compile time),
// and removes a cast back to the type a value was widened from; CSE merges
// the casts of a value read by several contractions (attention's q, k and
// v projections).
#include <vector>

#include "ir/Builder.h"
#include "ir/Precision.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

/// `v` in dtype `low`: a cast of the value above the chain of layout ops
/// (transpose, reshape) that defines `v` and has no other user, with the
/// chain retyped to `low`; else a cast of `v` itself, before `user`.
Value* castInput(Function& f, Value* v, Op& user, DType low) {
  std::vector<Op*> chain;
  Value* top = v;
  while (Op* def = top->definingOp()) {
    if ((def->kind() != OpKind::Transpose && def->kind() != OpKind::Reshape) || top->users().size() != 1 ||
        def->operand(0)->type().dtype != DType::F32)
      break;
    chain.push_back(def);
    top = def->operand(0);
  }
  Builder b(f);
  Op* insertBefore = chain.empty() ? &user : chain.back();
  b.setInsertionPoint(insertBefore);
  b.setLocation(insertBefore->loc());
  Value* cast = b.create(OpKind::Cast, {top}, {TensorType{low, top->type().shape}})->result();
  if (chain.empty()) return cast;
  chain.back()->setOperand(0, cast);
  for (Op* op : chain) op->result()->setType(TensorType{low, op->result()->type().shape});
  return v;
}

bool autocastFunction(Function& f, DType low) {
  bool changed = false;
  std::vector<Op*> ops;
  for (const auto& op : f.ops()) ops.push_back(op.get());
  for (Op* op : ops) {
    for (size_t r = 0; r < op->numRegions(); ++r) changed = autocastFunction(*op->region(r), low) || changed;
    // The op table's contractions: matmul, conv, conv_transpose and
    // conv_weight_grad (qconv and qmatmul, of int8 operands, fail the f32
    // test below).
    if (op->info().opClass != OpClass::Contraction || op->numResults() != 1 ||
        op->result()->type().dtype != DType::F32)
      continue;
    bool allF32 = true;
    for (size_t i = 0; i < op->numOperands(); ++i) allF32 = allF32 && op->operand(i)->type().dtype == DType::F32;
    if (!allF32) continue;
    for (size_t i = 0; i < op->numOperands(); ++i) op->setOperand(i, castInput(f, op->operand(i), *op, low));
    changed = true;
  }
  return changed;
}

}  // namespace

class AutocastPass : public Pass {
 public:
  std::string_view name() const override { return "autocast"; }

  Expected<bool> run(Module& m, const PassContext& ctx) override {
    const std::optional<DType> low = autocastDType(ctx.precision);
    if (!low) return false;
    bool changed = false;
    for (const auto& f : m.functions()) changed = autocastFunction(*f, *low) || changed;
    return changed;
  }
};

std::unique_ptr<Pass> createAutocastPass() { return std::make_unique<AutocastPass>(); }

}  // namespace kiln
