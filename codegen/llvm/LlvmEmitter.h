// Kernel IR to LLVM IR: one LLVM function per kernel with the signature of
// docs/codegen.md, plus an always-inlined body whose buffer parameters are
// `noalias`, so that the vectorizer needs no run-time overlap checks.
#pragma once

#include <memory>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/Support.h"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace kiln::codegen {

/// Emits `kernels` into a new module of `context`. Errors are programmer
/// errors in kernel IR (a load of a missing buffer) caught by the verifier.
Expected<std::unique_ptr<llvm::Module>> emitLlvmModule(const std::vector<kir::Kernel>& kernels,
                                                       llvm::LLVMContext& context);

}  // namespace kiln::codegen
