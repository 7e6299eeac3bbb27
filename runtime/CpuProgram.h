// A compiled CPU program as plain data: what code generation produces
// (codegen/cpu/CpuCompiler.h) and what the CPU runtime executes
// (runtime/CpuRunner.h), with nothing in between — no IR, no lowering, no
// LLVM. A `.kc` file stores one (runtime/KcFile.h).
//
// A program works on slots, one per buffer it reads or writes: the
// arguments, the constants, then one per step result. A step is a generated
// kernel (by name, in the program's shared object) or a library call
// (runtime/LibraryCall.h), with the host checks to run before it
// (runtime/HostCheck.h). Intermediates live in one arena at the memory
// plan's offsets; results a run returns are allocated per run; results
// written into donated arguments (a training step's parameters) go there in
// place, or are copied after the last step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/Types.h"
#include "runtime/HostCheck.h"
#include "runtime/Collectives.h"
#include "runtime/LibraryCall.h"
#include "runtime/Tensor.h"

namespace kiln {

/// What machine code is generated for: code built for one target runs only
/// on a CPU with the same triple, name and features.
struct CpuMachine {
  std::string triple;
  std::string cpu;
  std::string features;  // "+avx,+avx2,-sse4a,...", as LLVM lists them
  bool operator==(const CpuMachine&) const = default;
};

struct CpuProgram {
  struct Argument {
    std::string name;
    TensorType type;  // static
    /// The value an argument takes when the caller leaves it out (an ONNX
    /// initializer that is also a graph input); dtype F32 and no dims when
    /// it has none — see hasDefault.
    bool hasDefault = false;
    Tensor defaultValue;
  };

  enum class SlotKind : uint8_t {
    Argument,  // `index` is the argument
    Constant,  // `index` is the constant
    Arena,     // `index` is the offset in the arena
    Output,    // allocated by each run and returned
    InPlace,   // written into donated argument `index`
  };
  struct Slot {
    SlotKind kind = SlotKind::Arena;
    TensorType type;  // static
    int64_t index = 0;
  };

  struct SlotCheck {
    HostCheck check;
    int slot = 0;
  };

  struct Step {
    enum class Kind : uint8_t { Kernel, Library, Collective };
    Kind kind = Kind::Kernel;
    /// The result's value name, and what computes it ("fused(add relu) ->
    /// f32[8,12]"), for profiles and messages.
    std::string name;
    std::string what;
    int kernel = -1;   // Kernel: index into kernelNames
    LibraryCall call;  // Library
    /// Collective: run on the communicator (runtime/Collectives.h); an
    /// all-reduce is waited for only when a later step reads its result.
    CollectiveCall collective;
    std::vector<int> operands;
    int result = 0;
    std::vector<SlotCheck> checks;
    /// Kernel: the extent of its parallel loop, and whether its work is
    /// worth splitting across threads (a library call's too).
    int64_t parallelExtent = 1;
    bool parallel = false;
  };

  struct Result {
    std::string name;  // the caller's name for it (a graph output), or empty
    int slot = 0;
    /// The donated argument the result is written into, or -1.
    int aliasedArgument = -1;
  };

  /// The function it was compiled from, for messages.
  std::string name;
  std::vector<Argument> arguments;
  std::vector<Tensor> constants;
  std::vector<Slot> slots;
  std::vector<Step> steps;
  std::vector<Result> results;
  /// Results copied into their donated arguments after the last step:
  /// (source slot, argument).
  std::vector<std::pair<int, int>> finalCopies;
  int64_t arenaBytes = 0;

  /// The code: a shared object defining each kernel of kernelNames, built
  /// for `machine` by code generator `codegenVersion`. kernelHashes[i] is the
  /// contentHash of kernel i's kernel IR.
  std::vector<std::string> kernelNames;
  std::vector<std::string> kernelHashes;
  std::string sharedObject;
  CpuMachine machine;
  std::string codegenVersion;

  /// Checks that every index (slots, arguments, constants, kernels, library
  /// call buffers) is in range and every type static, so that a program
  /// read from a file can never make the runtime read out of bounds.
  Status validate() const;
};

/// The program's bytes, without its shared object, and with the data of
/// constants and argument defaults of `inlineBelow` bytes or more left out
/// (a `.kc` stores those in sections of their own).
std::string serializeProgram(const CpuProgram& program, size_t inlineBelow);
/// Reads serializeProgram's bytes into `program`; a constant or default
/// left out is an empty Tensor for the caller to fill in. `what` names the
/// bytes in errors. Call validate() once everything is filled in.
Status parseProgram(std::string_view bytes, const std::string& what, CpuProgram& program);

/// The error of slot `slot`'s tensor that cannot be allocated (a result a
/// run returns, a value copied back to the host), naming its value, the
/// step computing it and the output it is.
Error slotAllocationError(const CpuProgram& p, int slot);

}  // namespace kiln
