// The parts of a data-parallel training job (docs/distributed.md) that are
// not the collectives themselves: which GPU a rank of a job trains on, and
// what a rank says when mpirun ends it because another rank died.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "ir/Support.h"

namespace kiln::training {

/// The CUDA device of one rank of a job on CUDA: each rank of a machine
/// takes the GPU of its local rank (NCCL refuses two ranks on one GPU).
/// `asked` is the --device given, `emulated` whether the driver is the
/// emulated GPU (each process has one of its own: the device is kept),
/// `usableGpus` the machine's. Nullopt keeps the device as chosen; an error
/// names a --device that pins every rank to one GPU, or more ranks on the
/// machine than it has GPUs.
Expected<std::optional<std::string>> rankCudaDevice(const std::string& asked, bool emulated, int usableGpus,
                                                    int localRank, int localSize);

/// On SIGTERM (mpirun ends the other ranks when one dies), writes
/// "PREFIX: rank R of W: stopped at step S: mpirun ended the job ..." to
/// stderr, S being `step` + 1 when the signal comes, and exits with
/// `exitStatus`. Only async-signal-safe calls; `prefix` and `step` must
/// outlive the process's run.
void reportTerminationOnSigterm(const char* prefix, int rank, int world, const std::atomic<int64_t>& step,
                                int exitStatus);

}  // namespace kiln::training
