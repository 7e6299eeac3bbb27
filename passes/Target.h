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
  /// once, has the anchor's result type, and is its reader's only source of
  /// that value. The answer covers the whole call — dtypes, shapes, sizes
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

/// The `transpose` that a library call computing `matmul` reads in place:
/// the op defining its b (operand 1) when it swaps b's last two dims and
/// leaves the others, of a constant (a Linear's weight, which exporters
/// store [N, K] with Gemm's transB), with `matmul` its only user; else
/// null. A transpose of a weight of at most 2^25 elements is folded by
/// canonicalize; a larger one (VGG-11's 25088x4096) would run as a kernel
/// copying the whole weight on every run, so select-library puts it in the
/// matmul's library group and the call reads b through transposed strides
/// (LibraryCall::transposedB). `isConstant` says whether the transpose's
/// operand is a constant (in a group's region: whether the group operand
/// behind the region argument is).
template <typename IsConstant>
const Op* transposeReadInPlace(const Op& matmul, IsConstant isConstant) {
  if (matmul.kind() != OpKind::MatMul || matmul.numOperands() != 2) return nullptr;
  const Value* b = matmul.operand(1);
  const Op* t = b->definingOp();
  if (!t || t->kind() != OpKind::Transpose || b->users().size() != 1 || b->type().rank() < 2) return nullptr;
  const Attribute* perm = t->attr("perm");
  if (!perm) return nullptr;
  const std::vector<int64_t>& p = perm->getInts();
  const size_t rank = b->type().rank();
  if (p.size() != rank) return nullptr;
  for (size_t i = 0; i + 2 < rank; ++i)
    if (p[i] != static_cast<int64_t>(i)) return nullptr;
  if (p[rank - 2] != static_cast<int64_t>(rank - 1) || p[rank - 1] != static_cast<int64_t>(rank - 2)) return nullptr;
  return isConstant(t->operand(0)) ? t : nullptr;
}

}  // namespace kiln
