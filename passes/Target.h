// What a compilation target's libraries take. Passes that choose library
// calls (select-library) ask a Target; codegen/ implements one per target
// (codegen/cpu/CpuTarget.h: oneDNN on the CPU; codegen/cuda/CudaTarget.h:
// cuBLASLt), so passes/ never includes codegen headers and the arrows of
// the layers still point one way.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "ir/IR.h"

namespace kiln {

class Target {
 public:
  virtual ~Target() = default;

  /// The name `--target` selects: its backend's (codegen/Backend.h), "cpu" or "cuda".
  virtual std::string_view name() const = 0;

  /// Whether one library call should compute `anchor` (a matmul, conv or
  /// conv_transpose with static shapes) followed by `epilogue`: ops each of
  /// which reads the previous one's result (the first reads the anchor's)
  /// once, has the anchor's result type (but for a last one that casts an
  /// f32 result to bf16 or f16: the call stores its result so), and is its
  /// reader's only source of that value. The answer covers the whole call — dtypes, shapes, sizes
  /// too small to pay for a library call, and post-ops the library has —
  /// so an empty epilogue asks whether the anchor alone goes to the library.
  virtual bool acceptsLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) const = 0;

  /// Whether the target's library computes conv_weight_grad itself; if not,
  /// expand-conv-weight-grad rewrites it as a forward convolution.
  virtual bool takesConvWeightGrad() const { return false; }

  /// Whether `conv` (a channels-first 2-d conv with static shapes) is better
  /// computed channels last, its input and result stored [N, H, W, C]
  /// (assign-layouts). No, unless the target says so.
  virtual bool prefersChannelsLast(const Op& conv) const {
    (void)conv;
    return false;
  }
};

/// The `transpose` defining operand `i` of `matmul` (0: a, 1: b) that a
/// library call computing `matmul` reads in place: one that swaps the
/// operand's last two dims and leaves the others, with `matmul` its only
/// user (reading it once); else null. select-library puts it in the
/// matmul's library group, the transpose's operand becomes the group's, and
/// the call reads it through transposed strides (LibraryCall::transposedA,
/// transposedB) instead of a kernel copying it first: a Linear's weight as
/// exporters store it ([N, K], Gemm's transB; one of at most 2^26 elements
/// canonicalize folds when it is a constant, not when it is a parameter of
/// a training step), the transposed activations and gradients of a
/// backward pass (x^T dy of a weight's gradient), attention's k^T.
inline const Op* transposeReadInPlace(const Op& matmul, size_t i) {
  if (matmul.kind() != OpKind::MatMul || matmul.numOperands() != 2 || i > 1) return nullptr;
  const Value* v = matmul.operand(i);
  const Op* t = v->definingOp();
  if (!t || t->kind() != OpKind::Transpose || v->users().size() != 1 || v->type().rank() < 2) return nullptr;
  const Attribute* perm = t->attr("perm");
  if (!perm || perm->kind() != AttrKind::Ints) return nullptr;
  const std::vector<int64_t>& p = perm->getInts();
  const size_t rank = v->type().rank();
  if (p.size() != rank) return nullptr;
  for (size_t d = 0; d + 2 < rank; ++d)
    if (p[d] != static_cast<int64_t>(d)) return nullptr;
  if (p[rank - 2] != static_cast<int64_t>(rank - 1) || p[rank - 1] != static_cast<int64_t>(rank - 2)) return nullptr;
  return t;
}

}  // namespace kiln
