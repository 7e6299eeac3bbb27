// The compiler's back ends behind one interface, and the registry that names
// them. A backend is what `--target NAME` and a `.kc`'s device select: its
// name, the Target that passes ask (passes/Target.h: which library calls
// it takes), its pass pipeline for -O0..3, how it schedules a kernel's
// loops and describes a library call, a compiler from an optimized function
// to a program, and the loading of a program it stored. The CPU backend
// (codegen/cpu/CpuBackend.h: oneDNN, LLVM) and the CUDA backend
// (codegen/cuda/CudaBackend.h: cuBLASLt, cuDNN, NVRTC) are registered
// here; another registers itself with registerBackend and every tool that
// takes `--target` finds it, with no other edit (test/unit/stub-backend/).
//
// Lower -> schedule -> emit happens in one place: lowerForBackend gives a
// function's steps with each kernel scheduled by the backend, and every
// compiler (layoutProgram, codegen/cpu/CpuCompiler.h) and every printer of
// kernels (kiln-opt, `kiln compile --emit=kernel`) starts from it.
//
// No target is chosen by comparing its name anywhere else: code that needs
// a target asks the registry (backendNamed) or holds the Backend.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/KernelIR.h"
#include "codegen/LowerToKernels.h"
#include "ir/IR.h"
#include "passes/MemoryPlan.h"
#include "passes/Target.h"
#include "runtime/CpuProgram.h"
#include "runtime/KcFile.h"
#include "runtime/LibraryCall.h"

namespace kiln::codegen {

struct CompileReport;

/// A function compiled by a backend: the plain-data program (steps, slots,
/// arena, library calls; on the CPU with its shared object) and the
/// target's code object as a `.kc` stores it, with what only the compiler
/// keeps (the kernels' IR in program order, the memory plan, the compiler's
/// log). runtime/ProgramLoaders.h runs it from `device`, `program` and
/// `code` alone.
struct BackendProgram {
  /// The backend's name: the `.kc`'s device.
  std::string device;
  std::shared_ptr<CpuProgram> program;
  /// The code section of its `.kc` beside the program: CUBINs and PTX on
  /// CUDA; empty where the program holds its code (the CPU's shared object).
  std::string code;
  std::vector<kir::Kernel> kernels;
  MemoryPlan plan;
  /// What the target's compiler said (NVRTC's warnings); empty if nothing.
  std::string log;
};

/// What a backend's compiler is made with. Each backend takes options of
/// its own type, derived from this (codegen/cpu/CpuBackend.h
/// CpuCompilerOptions, codegen/cuda/CudaBackend.h CudaCompilerOptions); a
/// backend given another's options says so.
struct BackendOptions {
  virtual ~BackendOptions() = default;
  /// Kernel names are `<prefix><op>_<step>`.
  std::string kernelPrefix = "kiln_";
  /// When given, compile times are added to it (`--time-passes`).
  CompileReport* report = nullptr;
};

/// Compiles optimized functions (through the backend's pipeline already)
/// into programs; it keeps what compilations share (a JIT, a kernel cache,
/// the loaded NVRTC).
class ProgramCompiler {
 public:
  virtual ~ProgramCompiler() = default;
  /// `optimized` compiled. Ops that cannot be lowered yet make one error
  /// naming every one, each also in `unsupported` (`name (why) at loc`).
  virtual Expected<BackendProgram> compile(const Function& optimized, std::vector<std::string>* unsupported) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  /// The name `--target` and a `.kc`'s device give: "cpu", "cuda".
  virtual std::string_view name() const = 0;
  /// One line for `--help` and errors: what it compiles for.
  virtual std::string_view description() const = 0;
  /// What passes ask about the target's libraries (select-library,
  /// assign-layouts, expand-conv-weight-grad).
  virtual const Target& target() const = 0;
  /// The pass pipeline of -O`level` (0..3), from the imported graph to the
  /// function whose ops become its steps; passes/PassManager.h
  /// optLevelPipeline(level, true) unless the backend says otherwise.
  virtual std::string pipeline(int level) const;
  /// Decides how `kernel`'s loops run on the target (kir::Schedule).
  virtual void schedule(kir::Kernel& kernel) const = 0;
  /// A library step in the library's own words, for printed kernel lists.
  virtual std::string describeLibraryCall(const LibraryCall& call) const = 0;
  /// A compiler with `options` (null: the backend's defaults), which must
  /// be the backend's own options type.
  virtual Expected<std::unique_ptr<ProgramCompiler>> createCompiler(const BackendOptions* options) const = 0;
  /// The program a `.kc` written by this backend holds, checked to run
  /// here; an error says why not (another CPU, a corrupt code section).
  virtual Expected<BackendProgram> load(const CompiledArtifact& artifact, const std::string& filename) const = 0;
};

/// Adds `backend` to the registry; an error when its name is empty, not a
/// plain word (letters, digits, '-', '_') or taken.
Status registerBackend(std::unique_ptr<Backend> backend);
/// The backend named `name`, or null.
const Backend* backendNamed(std::string_view name);
/// The backend named `name`, or an error listing the registered ones.
Expected<const Backend*> findBackend(std::string_view name);
/// Every registered backend, the built-in ones (cpu, cuda) first.
std::vector<const Backend*> registeredBackends();
/// The registered names as "cpu, cuda" (for usage errors).
std::string backendNames();
/// The backend whose Target is `target`, or null.
const Backend* backendOf(const Target& target);

/// The steps of `f` (an optimized function with static shapes), each
/// kernel scheduled by `backend`: the one lowering every compiler and every
/// printer of kernels starts from. Errors as lowerToSteps.
Expected<std::vector<LoweredStep>> lowerForBackend(const Function& f, const Backend& backend, std::string_view prefix,
                                                   std::vector<std::string>* unsupported = nullptr);

/// The steps of every function of `m` as kiln-opt prints them after its
/// kernel-level steps: "kernels of @f for cpu:" and printSteps' text.
Expected<std::string> printBackendSteps(const Module& m, const Backend& backend);

}  // namespace kiln::codegen
