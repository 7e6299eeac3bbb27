// A compiled program as plain data, shared by every target: what code
// generation produces (codegen/cpu/CpuCompiler.h, codegen/cuda/CudaCompiler.h)
// and what a runtime executes (runtime/CpuRunner.h, runtime/cuda/CudaRunner.h),
// with nothing in between — no IR, no lowering, no LLVM. A `.kc` file stores
// one (runtime/KcFile.h). The code itself is per target: on the CPU the
// shared object, machine and kernel names held here; on CUDA the CUBINs, PTX
// and launches of cuda::CudaProgram (runtime/cuda/CudaProgram.h), which
// holds a Program as its plan.
//
// A program works on slots, one per buffer it reads or writes: the
// arguments, the constants, then one per step result. A step is a generated
// kernel (by name, in the program's code) or a library call
// (runtime/LibraryCall.h), with the host checks to run before it
// (runtime/HostCheck.h). Intermediates live in one arena at the memory
// plan's offsets; results a run returns are allocated per run; results
// written into donated arguments (a training step's parameters) go there in
// place, or are copied after the last step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/Types.h"
#include "runtime/DataDependent.h"
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

struct Program {
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

  /// The bytes of the slots `step` reads and writes: its operands' sizes
  /// and its result's (a profile's least memory traffic of the step).
  uint64_t stepBytes(const Step& step) const;
};

/// The program's bytes, without its shared object, and with the data of
/// constants and argument defaults of `inlineBelow` bytes or more left out
/// (a `.kc` stores those in sections of their own).
std::string serializeProgram(const Program& program, size_t inlineBelow);
/// Reads serializeProgram's bytes into `program`; a constant or default
/// left out is an empty Tensor for the caller to fill in. `what` names the
/// bytes in errors. Call validate() once everything is filled in.
Status parseProgram(std::string_view bytes, const std::string& what, Program& program);

/// Where a value of a function run in stages is found during a run.
struct StageValue {
  enum class From : uint8_t { Argument, Prefix, Host, Suffix };
  From from = From::Argument;
  /// The argument, the prefix result, the host step, or the suffix result.
  size_t index = 0;
  /// The host step's result.
  size_t result = 0;
  bool operator==(const StageValue&) const = default;
};

/// One op run on the host between compiled parts: a data-dependent op
/// (runtime/DataDependent.h) or an `if` or `loop` (runtime/ControlFlow.h)
/// whose regions are sub-programs of their own.
struct HostStep {
  OpKind kind = OpKind::NonZero;
  /// `nonzero`, `loop`: for errors and notices.
  std::string name;
  /// A data-dependent op's kind and attributes (its loc: `loc`).
  DataDependentOp op;
  std::vector<StageValue> operands;
  /// `loop`: its `num_carried`.
  int64_t numCarried = 0;
  /// The op's declared result types (a loop's empty scan stacks take their
  /// row shapes from them); dims may be dynamic.
  std::vector<TensorType> resultTypes;
  /// `if` (then, else) and `loop` (its body): the sub-program of each
  /// region, an index whose meaning the holder gives (a part of a
  /// StagedProgram; the compiler's region number); empty for a
  /// data-dependent op.
  std::vector<int> bodies;
  Location loc;

  bool isControlFlow() const { return kind == OpKind::If || kind == OpKind::Loop; }
};

/// A function split at its host ops (docs/codegen.md sections 6 and 7): a
/// prefix compiled for the input shapes, the host steps, and a suffix of
/// everything after them. `prefix` and `suffix` are sub-programs (-1: the
/// part is absent), indices as HostStep::bodies.
struct Stages {
  /// The function's name, for errors.
  std::string name;
  /// Its arguments' types (dims may be dynamic: a run checks its inputs'
  /// dtypes, ranks and static dims against them).
  std::vector<TensorType> argumentTypes;
  int prefix = -1;
  std::vector<HostStep> host;
  int suffix = -1;
  /// The suffix's inputs, in order (never From::Suffix).
  std::vector<StageValue> suffixInputs;
  /// Where each of the function's results is.
  std::vector<StageValue> results;
  /// Checks every StageValue against the parts' sizes: `numResults(part)`
  /// gives a sub-program's result count (prefix, suffix), `isPart(i)`
  /// whether `i` names a sub-program at all.
  Status validate(const std::function<bool(int)>& isPart, const std::function<size_t(int)>& numResults) const;
};

/// How deep the Stages parts of a StagedProgram may nest (a body with
/// control flow, a suffix split again at a later host op): a run recurses
/// once per level, through several frames (the stage driver, the part's
/// runner, the std::function between them), so the bound keeps the deepest
/// run within a thread's stack also under AddressSanitizer, whose frames
/// are several times larger (1024 levels overflowed the 8 MiB main stack
/// there). The text IR's regions nest at most 32 deep (ir/Parser.cpp).
inline constexpr size_t kMaxStageDepth = 256;

/// A compiled function with host steps (an `if`, a `loop`, a nonzero):
/// sub-programs, each a Program (compiled code) or Stages of its own (a body
/// with control flow nested in it), part 0 the function itself. Plain data,
/// stored by a `.kc` (runtime/KcFile.h) and run by runtime/StageDriver.h.
struct StagedProgram {
  struct Part {
    enum class Kind : uint8_t { Program, Stages };
    Kind kind = Kind::Program;
    /// Into `programs` or `stages`.
    size_t index = 0;
  };

  /// The function's name, signature (argument names, static types,
  /// defaults) and results' names and types, as a Program gives them.
  std::string name;
  std::vector<Program::Argument> arguments;
  std::vector<std::string> resultNames;
  std::vector<TensorType> resultTypes;
  /// parts[0] is the function (Stages); a Stages part refers only to parts
  /// after itself, so that a run never recurses without end.
  std::vector<Part> parts;
  std::vector<Stages> stages;
  std::vector<Program> programs;
  /// Per program, its code for a device other than the host's (CUDA's
  /// serializeCudaCode); empty strings on the CPU, whose programs hold
  /// their shared objects.
  std::vector<std::string> deviceCode;

  /// The number of arguments and results of part `part`.
  size_t numArguments(size_t part) const;
  size_t numResults(size_t part) const;
  /// Every index in range (parts, stages, programs, stage values, host
  /// step bodies, only to later parts), nesting at most kMaxStageDepth
  /// deep, every program valid, so that a file can never make the runtime
  /// read out of bounds or recurse without bound.
  Status validate() const;
};

/// The bytes of a staged program with every program and its code; and
/// back. Call validate() after parsing.
std::string serializeStagedProgram(const StagedProgram& program);
Status parseStagedProgram(std::string_view bytes, const std::string& what, StagedProgram& program);

/// The error of slot `slot`'s tensor that cannot be allocated (a result a
/// run returns, a value copied back to the host), naming its value, the
/// step computing it and the output it is.
Error slotAllocationError(const Program& p, int slot);

}  // namespace kiln
