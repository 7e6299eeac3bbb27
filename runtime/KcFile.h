// `.kc` compiled artifacts (docs/codegen.md section 5): a compiled CPU
// program (runtime/Program.h) with everything it needs to run, and the
// optimized module it was compiled from. A file is
//
//   "KILNKC\0\0"  u32 format version  u32 number of sections
//   sections, each: u32 kind  u32 zero  u64 payload size
//                   32-byte BLAKE3 hash of the payload  payload
//
// with integers little-endian and the sections, in this order:
//
//   target   text `key=value` lines: triple, cpu, features (what the code
//            was built for), codegen (the code generator's version) and the
//            compile flags (opt-level); for another device's program
//            `device=NAME` (a backend's name: cuda), codegen and opt-level
//   module   the optimized module as Kiln IR text, each top-level constant
//            and argument default of 64 bytes or more elided to a
//            zero-element placeholder (`dense<f32[0]>[]`); read only to
//            compile the program again (`kiln run --recompile`, another CPU)
//   program  the program (serializeProgram), tensors of 64 bytes or more
//            left to the weights section
//   plan     text: the memory plan of the function (MemoryPlan::str())
//   code     the program's shared object (ELF); for another device, its
//            code (CUDA's CUBINs and PTX, runtime/cuda/CudaProgram.h
//            serializeCudaCode)
//   stages   empty, or a program with host steps (an `if`, a `loop`, a
//            nonzero: Program.h StagedProgram, serializeStagedProgram):
//            its stages and every part's program with its code (a shared
//            object per part on the CPU, CUBINs and PTX per part on CUDA),
//            all tensors inline. Then the program, code and plan sections
//            are empty (the plan section holds the parts' plans as text),
//            the weights section counts none, and the module section
//            holds the function with its control flow, not optimized
//            (for the interpreter and `kiln run --recompile`).
//   weights  u32 count, then per tensor of 64 bytes or more: u8 place (0:
//            the constant of that index, in the module's order of its
//            top-level constant ops, 1: argument default), u64 index, the
//            dtype's name (u8 length and bytes: "f32"), u32 rank, i64 dims,
//            u64 size and the little-endian element bytes
//
// The reader checks everything before using it: the magic, a format
// version it knows (another one is refused, naming both), every section's
// size against what remains and its checksum, every count and index, each
// weight's type against the value it fills, and the program with
// Program::validate. A truncated or corrupt file is a clear error, never
// a crash. Reading needs no IR parser and no LLVM: the module is parsed
// only on request (artifactModule).
//
// A `.kc` holds machine code: run one only if you would run a program from
// the same place (docs/cli.md).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ir/IR.h"
#include "ir/Precision.h"
#include "runtime/Program.h"

namespace kiln {

/// The device name of the host CPU: a `.kc`'s device when its program's
/// code is a shared object for this kind of machine, the CPU backend's name
/// (codegen/cpu/CpuBackend.h).
inline constexpr std::string_view kHostDevice = "cpu";

/// The `.kc` format version this Kiln reads and writes. Version 1 (Kiln
/// before compiled programs were plain data) held only object files to link
/// into a JIT; version 2 had no layout in its convolutions' library calls,
/// version 3 no element types (int8 calls), version 4 no stages section
/// (no programs with host steps). Such files are refused with a request to
/// compile the model again.
inline constexpr uint32_t kArtifactVersion = 5;
/// The first bytes of every `.kc` file.
inline constexpr std::string_view kArtifactMagic{"KILNKC\0\0", 8};

struct CompiledArtifact {
  int optLevel = 3;
  /// The precision it was compiled for (`--precision`, docs/precision.md):
  /// the target section's `precision=`, fp32 when absent.
  Precision precision = Precision::FP32;
  /// The backend that compiled it: kHostDevice ("cpu"), whose program
  /// holds its shared object; or another ("cuda"), whose `program` holds its
  /// steps, slots and plan without a shared object and `deviceCode` its code
  /// (runtime/cuda/CudaProgram.h cudaProgramOf reads CUDA's). Which runner
  /// runs it is runtime/ProgramLoaders.h's to say.
  std::string device = std::string(kHostDevice);
  std::string deviceCode;
  /// The program, complete: constants, argument defaults and code; null
  /// when the artifact holds a program with host steps (`staged`).
  std::shared_ptr<Program> program;
  /// A program with host steps (its parts complete, each with its code),
  /// or null.
  std::shared_ptr<StagedProgram> staged;
  /// The module section as it is (large tensors elided); see artifactModule.
  std::string moduleText;
  std::string memoryPlan;
};

/// The `.kc` bytes of `program`, compiled from `optimized` (one function)
/// at `optLevel`, with `memoryPlan`'s text.
/// A `device` other than kHostDevice (a backend's name, "cuda") writes
/// that device's program: `program` is its plan and `deviceCode` its code
/// (CUDA's serializeCudaCode), stored in the code section, and the target
/// section says `device=NAME` instead of naming a CPU.
/// `precision` is recorded in the target section (`precision=bf16`) unless
/// fp32.
Expected<std::string> serializeArtifact(const Function& optimized, const Program& program, int optLevel,
                                        const std::string& memoryPlan, std::string_view device = kHostDevice,
                                        std::string_view deviceCode = {}, Precision precision = Precision::FP32);

/// The `.kc` bytes of `staged`, a function with host steps compiled from
/// `source` (the function with its control flow, stored as the module) at
/// `optLevel`, with `plans` (the parts' memory plans as text). Its programs
/// hold their code (CPU: shared objects, for `machine`) or its deviceCode
/// does (another device's).
Expected<std::string> serializeStagedArtifact(const Function& source, const StagedProgram& staged, int optLevel,
                                              const std::string& plans, std::string_view device,
                                              const CpuMachine& machine, const std::string& codegenVersion,
                                              Precision precision = Precision::FP32);

/// A `.kc` program's signature: its name, arguments (names, static types,
/// defaults) and results' names and types, whether staged or not.
struct ArtifactSignature {
  std::string name;
  std::vector<Program::Argument> arguments;
  std::vector<std::string> resultNames;
  std::vector<TensorType> resultTypes;
};
ArtifactSignature signatureOf(const CompiledArtifact& artifact);

/// Reads `.kc` bytes; `filename` names the file in errors.
Expected<CompiledArtifact> parseArtifact(std::string_view bytes, const std::string& filename);

/// The artifact's optimized module, parsed and verified, with the elided
/// tensors restored from its program.
Expected<std::unique_ptr<Module>> artifactModule(const CompiledArtifact& artifact, const std::string& filename);

}  // namespace kiln
