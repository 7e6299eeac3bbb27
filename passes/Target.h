// What a compilation target's libraries take. Passes that choose library
// calls (select-library) ask a Target; codegen/ implements one per target
// (codegen/cpu/CpuTarget.h: oneDNN on the CPU; codegen/cuda/CudaTarget.h:
// cuBLASLt), so passes/ never includes codegen headers and the arrows of
// the layers still point one way.
#pragma once

#include <span>
#include <string_view>

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

}  // namespace kiln
