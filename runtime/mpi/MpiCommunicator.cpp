// MpiCommunicator (MpiCommunicator.h): MPI's non-blocking collectives,
// waited for by polling MPI_Test against a deadline.
#include "runtime/mpi/MpiCommunicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

std::string mpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

/// One MPI request; `then` runs once it is done (a mean's division, a
/// reduce's zeros on the other ranks).
class MpiRequest final : public CollectiveRequest {
 public:
  MpiRequest(MPI_Request request, std::string what, double timeout, std::function<void()> then)
      : request_(request), what_(std::move(what)), timeout_(timeout), then_(std::move(then)) {}
  Status wait() override {
    if (done_) return Status();
    const Clock::time_point start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
    for (int spins = 0;; ++spins) {
      int flag = 0;
      if (int rc = MPI_Test(&request_, &flag, MPI_STATUS_IGNORE); rc != MPI_SUCCESS)
        return Error(what_ + ": MPI failed: " + mpiError(rc));
      if (flag) break;
      if (timeout_ > 0 && Clock::now() > deadline) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", timeout_);
        return Error(what_ + " did not complete within " + seconds +
                     " s (--collective-timeout): another rank stopped, died or hangs");
      }
      // Spin briefly, then let the computing threads have the core.
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    done_ = true;
    if (then_) then_();
    return Status();
  }
  void progress() override {
    if (done_ || tested_) return;
    int flag = 0;
    MPI_Test(&request_, &flag, MPI_STATUS_IGNORE);
    tested_ = flag != 0;  // complete: wait() finds it so at once
  }

 private:
  MPI_Request request_;
  std::string what_;
  double timeout_;
  std::function<void()> then_;
  bool done_ = false;
  bool tested_ = false;
};

Expected<MPI_Datatype> mpiType(DType dtype, const std::string& what) {
  switch (dtype) {
    case DType::F64: return MPI_DOUBLE;
    case DType::F32: return MPI_FLOAT;
    case DType::I64: return MPI_INT64_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I16: return MPI_INT16_T;
    case DType::I8: return MPI_INT8_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::U16: return MPI_UINT16_T;
    case DType::U32: return MPI_UINT32_T;
    case DType::U64: return MPI_UINT64_T;
    default: break;
  }
  return Error(what + ": MPI reduces no " + std::string(dtypeName(dtype)) + " tensors");
}

Expected<int> mpiCount(int64_t n, const std::string& what) {
  if (n < 0 || n > INT_MAX) return Error(what + ": " + std::to_string(n) + " elements are more than one MPI call takes");
  return static_cast<int>(n);
}

/// Divides `count` floats at `data` by `by` (a mean's last step).
std::function<void()> scaleBy(void* data, int64_t count, DType dtype, double by) {
  return [=] {
    if (dtype == DType::F32) {
      auto* p = static_cast<float*>(data);
      const auto s = static_cast<float>(1.0 / by);
      for (int64_t i = 0; i < count; ++i) p[i] *= s;
    } else if (dtype == DType::F64) {
      auto* p = static_cast<double*>(data);
      for (int64_t i = 0; i < count; ++i) p[i] /= by;
    }
  };
}

/// The MPI type and count of a reduction of `count` elements of `dtype`.
struct Reduction {
  MPI_Datatype type;
  int count;
};
Expected<Reduction> reductionOf(int64_t count, DType dtype, ReduceKind kind, const std::string& what) {
  if (kind == ReduceKind::Mean && dtype != DType::F32 && dtype != DType::F64)
    return Error(what + ": a mean over ranks takes f32 or f64 tensors, got " + std::string(dtypeName(dtype)));
  auto type = mpiType(dtype, what);
  if (!type) return type.takeError();
  auto n = mpiCount(count, what);
  if (!n) return n.takeError();
  return Reduction{*type, *n};
}

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

bool launchedByMpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name)) return true;
  return false;
}

Expected<std::shared_ptr<MpiCommunicator>> MpiCommunicator::initialize(double timeoutSeconds) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS)
      return Error("MPI_Init failed: " + mpiError(rc));
  }
  // Errors come back as codes, and Kiln reports them.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::shared_ptr<MpiCommunicator> c(new MpiCommunicator());
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  MPI_Comm local;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank_, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
    MPI_Comm_rank(local, &c->localRank_);
    MPI_Comm_size(local, &c->localSize_);
    MPI_Comm_free(&local);
  } else {
    c->localRank_ = envInt("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    c->localSize_ = envInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  }
  c->timeout_ = timeoutSeconds;
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string v(version, static_cast<size_t>(length));
  if (size_t comma = v.find(','); comma != std::string::npos) v.resize(comma);
  c->name_ = "MPI (" + v + ")";
  return c;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiCommunicator::abort(int exitCode) { MPI_Abort(MPI_COMM_WORLD, exitCode); }

Expected<std::unique_ptr<CollectiveRequest>> MpiCommunicator::startAllReduce(void* data, int64_t count, DType dtype,
                                                                             ReduceKind kind, const std::string& what) {
  auto r = reductionOf(count, dtype, kind, what);
  if (!r) return r.takeError();
  MPI_Request request;
  if (int rc = MPI_Iallreduce(MPI_IN_PLACE, data, r->count, r->type, MPI_SUM, MPI_COMM_WORLD, &request);
      rc != MPI_SUCCESS)
    return Error(what + ": MPI_Iallreduce failed: " + mpiError(rc));
  std::function<void()> then;
  if (kind == ReduceKind::Mean) then = scaleBy(data, count, dtype, size_);
  return std::unique_ptr<CollectiveRequest>(std::make_unique<MpiRequest>(request, what, timeout_, std::move(then)));
}

Expected<std::unique_ptr<CollectiveRequest>> MpiCommunicator::startBroadcast(void* data, int64_t bytes, int root,
                                                                             const std::string& what) {
  if (root < 0 || root >= size_)
    return Error(what + ": root rank " + std::to_string(root) + " of a job of " + std::to_string(size_) + " ranks");
  auto n = mpiCount(bytes, what);
  if (!n) return n.takeError();
  MPI_Request request;
  if (int rc = MPI_Ibcast(data, *n, MPI_BYTE, root, MPI_COMM_WORLD, &request); rc != MPI_SUCCESS)
    return Error(what + ": MPI_Ibcast failed: " + mpiError(rc));
  return std::unique_ptr<CollectiveRequest>(std::make_unique<MpiRequest>(request, what, timeout_, nullptr));
}

Expected<std::unique_ptr<CollectiveRequest>> MpiCommunicator::startReduce(void* data, int64_t count, DType dtype,
                                                                          ReduceKind kind, int root,
                                                                          const std::string& what) {
  if (root < 0 || root >= size_)
    return Error(what + ": root rank " + std::to_string(root) + " of a job of " + std::to_string(size_) + " ranks");
  auto r = reductionOf(count, dtype, kind, what);
  if (!r) return r.takeError();
  MPI_Request request;
  const bool isRoot = rank_ == root;
  const int rc = MPI_Ireduce(isRoot ? MPI_IN_PLACE : data, isRoot ? data : nullptr, r->count, r->type, MPI_SUM, root,
                             MPI_COMM_WORLD, &request);
  if (rc != MPI_SUCCESS) return Error(what + ": MPI_Ireduce failed: " + mpiError(rc));
  const size_t bytes = static_cast<size_t>(count) * dtypeSize(dtype);
  std::function<void()> then;
  if (!isRoot)
    then = [data, bytes] { std::memset(data, 0, bytes); };
  else if (kind == ReduceKind::Mean)
    then = scaleBy(data, count, dtype, size_);
  return std::unique_ptr<CollectiveRequest>(std::make_unique<MpiRequest>(request, what, timeout_, std::move(then)));
}

Expected<std::unique_ptr<CollectiveRequest>> MpiCommunicator::startAllGather(const void* in, void* out, int64_t bytes,
                                                                             const std::string& what) {
  auto n = mpiCount(bytes, what);
  if (!n) return n.takeError();
  MPI_Request request;
  if (int rc = MPI_Iallgather(in, *n, MPI_BYTE, out, *n, MPI_BYTE, MPI_COMM_WORLD, &request); rc != MPI_SUCCESS)
    return Error(what + ": MPI_Iallgather failed: " + mpiError(rc));
  return std::unique_ptr<CollectiveRequest>(std::make_unique<MpiRequest>(request, what, timeout_, nullptr));
}

Expected<std::unique_ptr<CollectiveRequest>> MpiCommunicator::startReduceScatter(const void* in, void* out,
                                                                                 int64_t count, DType dtype,
                                                                                 ReduceKind kind,
                                                                                 const std::string& what) {
  auto r = reductionOf(count, dtype, kind, what);
  if (!r) return r.takeError();
  MPI_Request request;
  if (int rc = MPI_Ireduce_scatter_block(in, out, r->count, r->type, MPI_SUM, MPI_COMM_WORLD, &request);
      rc != MPI_SUCCESS)
    return Error(what + ": MPI_Ireduce_scatter_block failed: " + mpiError(rc));
  std::function<void()> then;
  if (kind == ReduceKind::Mean) then = scaleBy(out, count, dtype, size_);
  return std::unique_ptr<CollectiveRequest>(std::make_unique<MpiRequest>(request, what, timeout_, std::move(then)));
}

}  // namespace kiln
