// The communicator of a job started by `mpirun` (Open MPI, or any MPI; also
// under Slurm's srun): collectives as MPI's non-blocking calls, each waited
// for with a deadline, so that a rank that died or hangs makes the others
// fail with an error naming the collective instead of waiting forever.
// Only `kiln train` links it (library kiln_mpi); docs/distributed.md.
#pragma once

#include <memory>
#include <string>

#include "runtime/Collectives.h"

namespace kiln {

/// Whether this process was started by an MPI launcher (mpirun, srun):
/// Open MPI's, PMI's or PMIx's environment.
bool launchedByMpi();

class MpiCommunicator final : public Communicator {
 public:
  /// Initializes MPI for the process (once); `timeoutSeconds` bounds every
  /// wait for a collective (0: none).
  static Expected<std::shared_ptr<MpiCommunicator>> initialize(double timeoutSeconds);
  ~MpiCommunicator() override;  // MPI_Finalize

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  /// This rank's index among the ranks of its machine (one GPU per local rank).
  int localRank() const { return localRank_; }
  int localSize() const { return localSize_; }

  Expected<std::unique_ptr<CollectiveRequest>> startAllReduce(void* data, int64_t count, DType dtype,
                                                              ReduceKind kind, const std::string& what) override;
  Expected<std::unique_ptr<CollectiveRequest>> startBroadcast(void* data, int64_t bytes, int root,
                                                              const std::string& what) override;
  Expected<std::unique_ptr<CollectiveRequest>> startReduce(void* data, int64_t count, DType dtype, ReduceKind kind,
                                                           int root, const std::string& what) override;
  Expected<std::unique_ptr<CollectiveRequest>> startAllGather(const void* in, void* out, int64_t bytes,
                                                              const std::string& what) override;
  Expected<std::unique_ptr<CollectiveRequest>> startReduceScatter(const void* in, void* out, int64_t count,
                                                                  DType dtype, ReduceKind kind,
                                                                  const std::string& what) override;
  void abort(int exitCode) override;

 private:
  MpiCommunicator() = default;
  int rank_ = 0, size_ = 1, localRank_ = 0, localSize_ = 1;
  double timeout_ = 0;
  std::string name_;
};

}  // namespace kiln
