// Runs a compiled CUDA program (CudaProgram.h) on one device: loads the
// image the device can run (a CUBIN, else the PTX for the driver to
// compile), uploads the constants once, and keeps the arena, the
// arguments' and results' device buffers and their pinned host staging for
// the life of the runner, so that every run touches the same addresses.
//
// A run copies the inputs into pinned staging on the host, then on the
// device: host-to-device copies on the copy stream, an event the compute
// stream waits for, the steps in order on the compute stream (kernels with
// their grid and block, library calls), the results back into pinned
// staging, one synchronization. The second run of a runner captures that
// device work as a CUDA graph and later runs replay it: the graph reads the
// same pinned buffers, which each run fills first (CudaRunOptions::graphs
// turns this off). Host checks of an argument run on the host before it is
// copied; a check of a computed value copies it back first, and such a
// program is never captured.
//
// A training loop (runInPlace with keepDonated and `next`) keeps its
// parameters on the device and has the next batch copied into a second set
// of argument buffers on the copy stream while the current step computes;
// each set has its own graph.
//
// A runner runs one call at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/CpuRunner.h"
#include "runtime/Tensor.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaProgram.h"

namespace kiln::cuda {

class CachingAllocator;

struct CudaRunOptions {
  /// Capture the steady state as a CUDA graph and replay it.
  bool graphs = true;
  /// Let f32 matrix products use TF32 (off: full f32, as PyTorch with
  /// allow_tf32 = False).
  bool allowTf32 = false;
  /// When given, each run adds its steps' times to it: each kernel and
  /// library call between two timed CUDA events on the compute stream
  /// (cuEventElapsedTime, read after the run's one synchronization), with
  /// 2 flops per multiply-add of a library call. A profiled run launches
  /// every step itself: no CUDA graph is captured or replayed, since a
  /// graph's nodes cannot be timed one by one from the host.
  StepProfile* profile = nullptr;
  /// runInPlace keeps donated arguments (a training step's parameters and
  /// optimizer state) on the device: their new values are not copied back,
  /// and the next runInPlace with the same host tensors copies them in no
  /// more. The host tensors are stale until syncDonated() — which run()
  /// calls itself — and must stay alive and untouched until then.
  bool keepDonated = false;
  /// Time each run's copies and device work apart with CUDA events
  /// (CudaRunStats' milliseconds; `kiln run --device cuda --bench`).
  bool timeRuns = false;
};

/// What one run moved and, with CudaRunOptions::timeRuns, how long each part
/// took: the host's copies into and out of pinned staging, the copies
/// between the host and the device, and the device's work in between.
struct CudaRunStats {
  /// Host copies into pinned staging (each input copied in at most once)
  /// and out of it (each result, and donated arguments' new values).
  int64_t stagedInputs = 0, stagedResults = 0;
  uint64_t stagedInputBytes = 0, stagedResultBytes = 0;
  /// Copies between the host's staging and the device.
  int64_t hostToDeviceCopies = 0, deviceToHostCopies = 0;
  uint64_t hostToDeviceBytes = 0, deviceToHostBytes = 0;
  /// The host's time in staging copies (steady clock); with timeRuns, the
  /// device's (CUDA events): copies in, the steps, copies out.
  double stagingMs = 0;
  double copyInMs = 0, deviceMs = 0, copyOutMs = 0;
  bool timed = false;  // the three device times were measured
};

/// CUDA's runner of a program: a LoadedProgram (runtime/ProgramLoaders.h),
/// as the CPU's CpuRunner is.
class CudaRunner : public LoadedProgram {
 public:
  static Expected<std::unique_ptr<CudaRunner>> create(std::shared_ptr<const CudaProgram> program,
                                                      std::shared_ptr<CudaContext> context,
                                                      CudaRunOptions options = {});
  ~CudaRunner() override;

  /// Runs on `inputs` (host tensors, one per argument, of its type) and
  /// returns the results on the host. Donated arguments are left alone:
  /// their new values come back as results. The inputs are read where they
  /// are, each copied once into pinned staging on its way to the device.
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs) override;
  /// Runs and writes each donated argument's new value into `inputs`; those
  /// results come back as empty Tensors.
  ///
  /// `next`, when given, points at the next runInPlace's inputs (null
  /// entries are skipped): those that are not donated are copied to the
  /// device on the copy stream while this run computes, and that run copies
  /// them no more when it is given the same tensors. They must stay alive
  /// and unchanged until then.
  Expected<std::vector<Tensor>> runInPlace(std::vector<Tensor>& inputs,
                                           const std::vector<const Tensor*>* next = nullptr);
  /// With keepDonated: copies the donated arguments' newest values back into
  /// the host tensors they came from; nothing to do otherwise.
  Status syncDonated();

  const CudaProgram& program() const { return *program_; }
  CudaContext& context() const { return *context_; }
  /// Which image the device loaded ("CUBIN sm_90", "PTX for sm_75, ...").
  const std::string& image() const { return image_; }
  /// Runs replayed from a captured CUDA graph so far.
  int64_t graphReplays() const { return replays_; }
  /// The copies and times of the last run.
  const CudaRunStats& lastRunStats() const { return stats_; }

 private:
  struct Impl;
  explicit CudaRunner(std::unique_ptr<Impl> impl);
  /// One run on `inputs`; `inPlace` (the same tensors, writable) receives
  /// the donated arguments' new values (runInPlace), else they are results.
  Expected<std::vector<Tensor>> execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* inPlace,
                                        const std::vector<const Tensor*>* next);

  std::unique_ptr<Impl> impl_;
  std::shared_ptr<const CudaProgram> program_;
  std::shared_ptr<CudaContext> context_;
  std::string image_;
  int64_t replays_ = 0;
  CudaRunStats stats_;
};

}  // namespace kiln::cuda
