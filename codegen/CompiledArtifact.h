// `.kc` compiled artifacts (docs/codegen.md section 5): everything needed to
// run a model on the CPU without running passes or LLVM. A file is
//
//   "KILNKC\0\0"  u32 format version  u32 number of sections
//   sections, each: u32 kind  u32 zero  u64 payload size
//                   32-byte BLAKE3 hash of the payload  payload
//
// with integers little-endian and the sections, in this order:
//
//   target   text `key=value` lines: triple, cpu, features (the target the
//            objects were built for), codegen (kCpuCodegenVersion), and the
//            compile flags (opt-level)
//   module   the specialized, optimized module as Kiln IR text, each constant
//            and argument default of 64 bytes or more elided to a
//            zero-element placeholder (`dense<f32[0]>[]`)
//   kernels  text: one `name kernel-IR-hash` line per generated kernel, in
//            step order (oneDNN steps are chosen again from the module)
//   plan     text: the memory plan of the function (MemoryPlan::str())
//   objects  u32 count, then per object file u64 size and its bytes
//   weights  u32 count, then per elided tensor: u8 place (0: constant op,
//            1: argument default), u64 index (among the function's
//            constant ops, or argument), the dtype's name (u8 length and
//            bytes: "f32"), u32 rank, i64 dims, u64 size and the
//            little-endian element bytes
//
// The loader checks everything before using it: the magic, a format
// version it knows (a newer one is refused, naming both), every section's
// size against what remains and its checksum, every count and index against
// the module, each weight's type against the value it fills, and then the
// module with the verifier. A truncated or corrupt file is a clear error,
// never a crash. Object code is only used on a host of the same target: a
// file built for another is recompiled from its module by the caller
// (CpuExecutor::createOptimized without code; see targetMismatch).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "codegen/CpuExecutable.h"
#include "codegen/llvm/CpuJit.h"
#include "ir/IR.h"

namespace kiln::codegen {

/// The newest `.kc` format version this Kiln reads and the one it writes.
inline constexpr uint32_t kArtifactVersion = 1;
/// The first bytes of every `.kc` file.
inline constexpr std::string_view kArtifactMagic{"KILNKC\0\0", 8};

struct CompiledArtifact {
  CpuMachine target;
  std::string codegenVersion{kCpuCodegenVersion};
  int optLevel = 2;
  /// The specialized, optimized module (one function), weights included.
  std::unique_ptr<Module> module;
  KernelCode code;
  std::string memoryPlan;
};

/// The `.kc` bytes of `artifact`.
Expected<std::string> serializeArtifact(const CompiledArtifact& artifact);

/// Reads `.kc` bytes; `filename` names the file in errors.
Expected<CompiledArtifact> parseArtifact(std::string_view bytes, const std::string& filename);

/// Why code built for `built` cannot run here (`host`), or "" when it can.
std::string targetMismatch(const CompiledArtifact& artifact, const CpuMachine& host);

}  // namespace kiln::codegen
