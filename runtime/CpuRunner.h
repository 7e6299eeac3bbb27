// Runs a compiled CPU program (runtime/Program.h): loads its kernels'
// shared object (runtime/LoadedCode.h), creates its oneDNN primitives
// (runtime/DnnlKernels.h), or for a matmul of a few rows by a constant its
// own kernel with that constant packed once (runtime/PackedMatmul.h), and
// its arena, then runs the steps in order on `threads` threads: a kernel's
// parallel loop and a packed matmul's panels in chunks on the runtime's
// thread pool (runtime/ThreadPool.h, whose caller never waits for a thread
// the OS has not scheduled), oneDNN's own loops on its OpenMP team, whose
// idle threads spin only briefly when other programs fill the cores
// (runtime/openmp/); the pool's workers sleep before each parallel oneDNN
// call, so the two do not compete for cores.
// Host checks run before the step they guard. A runner owns one arena, so
// it runs one call at a time.
//
// It links no LLVM and sees no IR: this is what runs a `.kc` file, inside
// `kiln` and in programs that embed Kiln (runtime/Kiln.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/Program.h"
#include "runtime/ProgramLoaders.h"
#include "runtime/Tensor.h"

namespace kiln {

class DnnlKernel;
class LoadedCode;
class PackedMatmul;

/// Time spent in each step of a program, added up over the runs of a runner
/// given it (`kiln-train-bench --profile`). One entry per step, in step
/// order; a run of another program starts the table again. Timing each step
/// adds two clock reads per step and nothing when no profile is given. The
/// CUDA runner fills the same table from CUDA events
/// (runtime/cuda/CudaRunner.h CudaRunOptions::profile).
struct StepProfile {
  struct Entry {
    /// The step's result and what computes it (the oneDNN primitive, or
    /// the op or fused ops with the result's type).
    std::string name;
    std::string what;
    double seconds = 0;
    int64_t calls = 0;
    /// Floating-point operations of one call (2 per multiply-add of a
    /// library call's matmul or convolution); 0 where not counted.
    double flops = 0;
    /// Bytes of the buffers one call reads and writes (its operands' and
    /// its result's sizes): the least memory traffic it can have, which
    /// the table's GB/s divides by its time; 0 where not counted.
    double bytes = 0;
  };
  std::vector<Entry> entries;
  /// The table sorted by time, largest first, with each step's share,
  /// milliseconds per call, GFLOP/s and GB/s (where counted); at most
  /// `limit` rows, then the total.
  std::string format(size_t limit = 40) const;
};

/// The host memory that compiled programs hold while they run, added up
/// over every runner given it (`kiln run --memory-stats` on the CPU, the
/// counterpart of the CUDA allocator's statistics): each live runner's
/// arena (the memory plan's intermediate values) and its program's
/// constants, and the results each run allocates. The oneDNN primitives'
/// own copies of reordered weights and the packed matmul weights are not
/// counted. Runners that share one run one at a time.
struct CpuMemoryStats {
  /// Runners alive, and the most at once.
  int64_t programs = 0, maxPrograms = 0;
  /// Their arenas' bytes (as allocated: rounded up to 64), now and at most.
  uint64_t arena = 0, maxArena = 0;
  /// Their programs' constants' bytes, now and at most.
  uint64_t constants = 0, maxConstants = 0;
  /// The results the last run allocated (outputs and copies out of the
  /// arena, not returned arguments or constants), and the most of one run.
  uint64_t results = 0, maxResults = 0;
  /// Arenas, constants and one run's results held at once, at most.
  uint64_t peak = 0;
  int64_t runs = 0;

  void addRunner(uint64_t arenaBytes, uint64_t constantBytes);
  void removeRunner(uint64_t arenaBytes, uint64_t constantBytes);
  void addRun(uint64_t resultBytes);
  /// A table like the CUDA allocator's: current and peak per row.
  std::string format() const;
};

/// The threads `threads = 0` stands for: the cores this process may run on.
int defaultThreads();

/// The CPU's runner of a program: a LoadedProgram (runtime/ProgramLoaders.h),
/// the one interface every runner of a stored program implements.
class CpuRunner : public LoadedProgram {
 public:
  /// A runner of `program` on `threads` threads (0: defaultThreads()); the
  /// program is validated first. `profile`, when given, receives each
  /// step's time; `memory`, when given, the runner's arena and constants
  /// for its life and each run's results.
  static Expected<std::unique_ptr<CpuRunner>> create(std::shared_ptr<const Program> program, int threads = 0,
                                                     StepProfile* profile = nullptr, CpuMemoryStats* memory = nullptr);
  ~CpuRunner() override;

  /// Runs on `inputs`, one per argument, of the argument's type. Donated
  /// arguments (results that alias them) are copied first, so `inputs` are
  /// left alone and every result comes back.
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs) override;

  /// Runs and writes each donated argument's result into `inputs`' memory
  /// (in place where the program's plan allows, else by a copy after the
  /// last step); those results come back as empty Tensors. On an error the
  /// donated tensors may hold partly updated values.
  Expected<std::vector<Tensor>> runInPlace(std::vector<Tensor>& inputs);

  const Program& program() const { return *program_; }
  /// The library call's description of step `i` (its oneDNN primitive, or
  /// the runtime's packed matmul), or "" for a kernel.
  std::string libraryDescription(size_t i) const;

 private:
  CpuRunner() = default;
  Status checkInputs(const std::vector<Tensor>& inputs) const;
  Expected<std::vector<Tensor>> execute(const std::vector<Tensor>& inputs);

  std::shared_ptr<const Program> program_;
  int threads_ = 1;
  StepProfile* profile_ = nullptr;
  CpuMemoryStats* memory_ = nullptr;
  uint64_t arenaBytes_ = 0, constantBytes_ = 0;  // as counted in memory_
  std::unique_ptr<LoadedCode> code_;
  std::vector<std::unique_ptr<DnnlKernel>> libraries_;  // per step; null for kernels
  // Per step: the runtime's own kernel of a library call that multiplies a
  // few rows by a constant (PackedMatmul.h), which then has no DnnlKernel.
  std::vector<std::unique_ptr<PackedMatmul>> packed_;
  std::unique_ptr<uint8_t, decltype(&std::free)> arena_{nullptr, &std::free};
  std::vector<void*> slotData_;
  std::vector<void*> buffers_;  // per-step scratch for kernel arguments
  // Per slot, in the current run: a bound on max|v| of the value a oneDNN
  // call computed (DnnlKernel::run), or -1; the next calls reading it take
  // it instead of scanning it. callBounds_ is the per-step scratch.
  std::vector<double> slotBounds_;
  std::vector<double> callBounds_;
  bool donates_ = false;
  // Worked out once, so that a run allocates nothing it does not return:
  // the arguments' dims; the slots each run points at an input (argument
  // and in-place slots: slot, argument) or at a tensor it allocates; and
  // per result, whether it takes its tensor (its slot's last result) or a
  // copy.
  std::vector<std::vector<int64_t>> argumentDims_;
  std::vector<std::pair<int, size_t>> inputSlots_;
  std::vector<int> outputSlots_;
  std::vector<bool> movesResult_;
  /// Per step: for an all-reduce whose result a later step reads, true (it
  /// is waited for before that step); every other collective is waited for
  /// at once.
  std::vector<bool> asyncCollective_;
};

}  // namespace kiln
