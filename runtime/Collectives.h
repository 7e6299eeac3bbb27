// Collectives: what the IR's collective ops (all_reduce, broadcast_from,
// reduce_to, all_gather, reduce_scatter; ir/Ops.def) do at run time, on the
// communicator of the process (docs/distributed.md).
//
// A Communicator joins the ranks of one data-parallel job. The process has
// one: MPI's under `mpirun` (runtime/mpi/MpiCommunicator.h, installed by
// `kiln train`), else the single process's, rank 0 of 1, on which every
// collective leaves its data as it is. Tests install their own for a thread
// (ScopedThreadCommunicator): ranks as threads, or a transport that records
// what it is asked.
//
// Collectives are started, then waited for (CollectiveRequest): the CPU
// runner starts an all-reduce when its step comes and waits only when a
// later step reads the result, so a gradient bucket's reduction overlaps
// the backward kernels that follow it. Every wait may have a deadline (the
// communicator's timeout): a rank that died or hangs makes the others fail
// with an error naming the collective, not hang.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "ir/Support.h"
#include "ir/Types.h"

namespace kiln {

enum class ReduceKind : uint8_t { Sum, Mean };

/// A collective in flight.
class CollectiveRequest {
 public:
  virtual ~CollectiveRequest();
  /// Waits until it is done; an error when it fails or misses the deadline.
  virtual Status wait() = 0;
  /// Lets the transport move data without waiting (MPI progresses a
  /// non-blocking collective only inside its calls); the runner calls it
  /// between steps for the requests in flight.
  virtual void progress() {}
};

/// A request that is done already.
std::unique_ptr<CollectiveRequest> completedRequest(Status status = {});

class Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "MPI (Open MPI v4.1.4)", "single process".
  virtual std::string name() const = 0;

  /// Reduces `count` elements of `dtype` at `data` in place over all ranks
  /// (Mean: the sum divided by size(); float dtypes only). `what` names it
  /// in errors.
  virtual Expected<std::unique_ptr<CollectiveRequest>> startAllReduce(void* data, int64_t count, DType dtype,
                                                                      ReduceKind kind, const std::string& what) = 0;
  /// Copies rank `root`'s `bytes` at `data` to every rank's `data`.
  virtual Expected<std::unique_ptr<CollectiveRequest>> startBroadcast(void* data, int64_t bytes, int root,
                                                                      const std::string& what) = 0;
  /// Sums (or averages) `count` elements at `data` over all ranks into
  /// rank `root`'s `data`; the other ranks' `data` becomes zeros.
  virtual Expected<std::unique_ptr<CollectiveRequest>> startReduce(void* data, int64_t count, DType dtype,
                                                                   ReduceKind kind, int root,
                                                                   const std::string& what) = 0;
  /// Every rank's `bytes` at `in`, in rank order, into `out` (size() *
  /// bytes).
  virtual Expected<std::unique_ptr<CollectiveRequest>> startAllGather(const void* in, void* out, int64_t bytes,
                                                                      const std::string& what) = 0;
  /// `in` holds size() blocks of `count` elements; block r, reduced over
  /// all ranks, goes to rank r's `out`.
  virtual Expected<std::unique_ptr<CollectiveRequest>> startReduceScatter(const void* in, void* out, int64_t count,
                                                                          DType dtype, ReduceKind kind,
                                                                          const std::string& what) = 0;
  /// Ends every rank of the job (MPI_Abort); returns only where there is
  /// no job to end.
  virtual void abort(int exitCode);

  Status allReduce(void* data, int64_t count, DType dtype, ReduceKind kind, const std::string& what);
  Status broadcast(void* data, int64_t bytes, int root, const std::string& what);
};

/// The communicator of the calling thread: its ScopedThreadCommunicator's,
/// else the process's (setProcessCommunicator), else the single process's.
Communicator& communicator();
/// Installs the process's communicator (kiln train under mpirun).
void setProcessCommunicator(std::shared_ptr<Communicator> c);

/// Makes `c` the calling thread's communicator while it lives.
class ScopedThreadCommunicator {
 public:
  explicit ScopedThreadCommunicator(Communicator& c);
  ~ScopedThreadCommunicator();
  ScopedThreadCommunicator(const ScopedThreadCommunicator&) = delete;
  ScopedThreadCommunicator& operator=(const ScopedThreadCommunicator&) = delete;

 private:
  Communicator* previous_;
};

/// One collective op as plain data: what a compiled program stores and the
/// runtime runs without the IR.
struct CollectiveCall {
  enum class Kind : uint8_t { AllReduce, BroadcastFrom, ReduceTo, AllGather, ReduceScatter };
  Kind kind = Kind::AllReduce;
  ReduceKind reduction = ReduceKind::Sum;
  int64_t root = 0;       // BroadcastFrom, ReduceTo
  int64_t axis = 0;       // AllGather, ReduceScatter
  int64_t worldSize = 1;  // AllGather, ReduceScatter: the size the shapes were made for
  DType dtype = DType::F32;
  std::vector<int64_t> inputDims;
  bool operator==(const CollectiveCall&) const = default;

  /// The operand's elements.
  int64_t elements() const;
  /// The operand's elements in the dims before `axis`: a gather or scatter
  /// moves one contiguous block per rank when it is 1.
  int64_t outerElements() const;
};

/// The collective of op `op` (a collective op with static operand type).
Expected<CollectiveCall> collectiveOf(const Op& op);
/// "all_reduce(mean)", "all_gather(axis 0)".
std::string describeCollective(const CollectiveCall& call);
/// The result's dims.
std::vector<int64_t> collectiveResultDims(const CollectiveCall& call);

/// Starts `call` on `comm` from `in` into `out` (sized by
/// collectiveResultDims); `what` names it in errors. `in` may be reused
/// once this returns: an all-reduce works in `out`, which must stay
/// untouched until the request is waited for.
Expected<std::unique_ptr<CollectiveRequest>> startCollective(Communicator& comm, const CollectiveCall& call,
                                                             const void* in, void* out, const std::string& what);

}  // namespace kiln
