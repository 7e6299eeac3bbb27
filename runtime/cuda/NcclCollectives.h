// The collectives of a data-parallel job on CUDA, through NCCL (opened with
// dlopen: runtime/cuda/CudaLibraries.h loadNccl; the emulated GPU brings its
// own, test/devices/emulator/Nccl.cpp). Each rank holds one GPU; rank 0 makes
// NCCL's unique id and the job's host communicator (MPI,
// runtime/Collectives.h) hands it to the others, then every rank joins.
// The CUDA runner enqueues a program's collective steps on its stream
// (CudaRunner.cpp), so they run in stream order between the kernels.
// docs/distributed.md.
#pragma once

#include <memory>
#include <string>

#include "runtime/Collectives.h"
#include "runtime/cuda/CudaContext.h"

namespace kiln::cuda {

class NcclCommunicator {
 public:
  /// Joins the job of `host` (its rank and size) on `context`'s device.
  static Expected<std::shared_ptr<NcclCommunicator>> create(Communicator& host, CudaContext& context);
  ~NcclCommunicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "NCCL 2.23.0 (<path>)".
  const std::string& name() const { return name_; }

  /// Whether `call` runs here; an error naming what is not supported.
  Status supports(const CollectiveCall& call) const;
  /// Enqueues `call` from device buffer `in` into `out` on `stream`.
  Status enqueue(const CollectiveCall& call, CUdeviceptr in, CUdeviceptr out, CUstream stream,
                 const CudaExecApi& api) const;

 private:
  NcclCommunicator() = default;
  struct Api;
  std::shared_ptr<Api> api_;
  void* comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::string name_;
};

/// The process's NCCL communicator (kiln train under mpirun with --device
/// cuda), or null.
NcclCommunicator* processNccl();
void setProcessNccl(std::shared_ptr<NcclCommunicator> nccl);

}  // namespace kiln::cuda
