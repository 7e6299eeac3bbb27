// From a function at the end of a target pipeline to its steps, the same for
// every target: each op in order becomes one step — a `check` a host check
// (runtime/HostCheck.h), a `library` group a library call
// (runtime/LibraryCall.h), any other op or fused group a generated kernel
// (codegen/Lowering.h) — and constants and the `return` none. The CPU
// program (codegen/CpuProgram.h) and the CUDA emitter (codegen/cuda/) both
// start here, so the two targets cannot drift apart; what differs between
// them is their pipeline's choices (which calls go to a library), decided by
// passes before this point.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/IR.h"
#include "runtime/HostCheck.h"
#include "runtime/Collectives.h"
#include "runtime/LibraryCall.h"

namespace kiln::codegen {

/// One step of a lowered function.
struct LoweredStep {
  enum class Kind { Kernel, Library, Check, Collective };
  Kind kind = Kind::Kernel;
  /// The op of the step (for a check, the `check` op).
  const Op* op = nullptr;
  kir::Kernel kernel;  // Kind::Kernel
  LibraryCall call;    // Kind::Library
  HostCheck check;     // Kind::Check
  CollectiveCall collective;  // Kind::Collective
};

/// The steps of `f` (an optimized function with static shapes). Kernels are
/// named `<prefix><op name>_<step>`. Ops that cannot be lowered yet are one
/// error naming every such op, each as `why at location`, in `unsupported`
/// when given.
Expected<std::vector<LoweredStep>> lowerToSteps(const Function& f, std::string_view prefix,
                                                std::vector<std::string>* unsupported = nullptr);

/// The steps as text: a check as its op, a library call as
/// `library %name: <description>` (`describeCall` gives the library's words,
/// e.g. codegen/cpu/CpuTarget.h's describeLibraryCallText), a kernel as its
/// kernel IR. What `kiln compile --emit=kernel` and `kiln-opt --target T
/// --print-kernels` print.
std::string printSteps(const std::vector<LoweredStep>& steps,
                       const std::function<std::string(const LibraryCall&)>& describeCall);

}  // namespace kiln::codegen
