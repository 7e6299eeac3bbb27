// The emulated GPU's NCCL: libnccl.so.2 beside the emulator's libcuda.so.1
// (nccl.cmake), for Kiln's data-parallel training on CUDA in CI (docs/
// distributed.md). It implements the entry points of runtime/cuda/NcclAbi.h
// between the processes of one machine, each with its own emulated GPU:
//
//  - ncclGetUniqueId names a POSIX shared-memory segment; rank 0 creates
//    it in ncclCommInitRank, the other ranks open it, and it is unlinked
//    once all have (it lives while they keep it mapped).
//  - Each collective is a work item on its stream (kilnEmulatorEnqueue), so
//    it runs in stream order like a kernel. It moves the data in chunks
//    through the segment: every rank copies its chunk into its slot, waits
//    at a barrier for the others, computes its result from all slots, and
//    waits again before the slots are reused.
//  - A rank that never arrives makes the others fail after a timeout
//    ($KILN_NCCL_TIMEOUT seconds, 300 by default), with the fault naming
//    the collective, as a hung NCCL call would end in a watchdog's error.
//
// Not NVIDIA's NCCL: no rings, trees or GPU-direct copies; a reference for
// the semantics, and slow.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "runtime/cuda/NcclAbi.h"
#include "test/devices/emulator/EmulatorHooks.h"

#define KILN_NCCL_EXPORT extern "C" __attribute__((visibility("default")))

using namespace kiln::cuda::nccl;

namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;  // per rank and exchange

struct Header {
  std::atomic<uint32_t> ready;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  uint32_t ranks;
};

size_t segmentBytes(int ranks) { return 4096 + static_cast<size_t>(ranks) * kChunkBytes; }

double timeoutSeconds() {
  const char* v = std::getenv("KILN_NCCL_TIMEOUT");
  return v && *v ? std::atof(v) : 300.0;
}

}  // namespace

struct kiln::cuda::nccl::ncclComm {
  int rank = 0, ranks = 1;
  Header* header = nullptr;
  uint8_t* slots = nullptr;
  size_t bytes = 0;
  std::string name;

  uint8_t* slot(int r) const { return slots + static_cast<size_t>(r) * kChunkBytes; }

  /// Waits until every rank has arrived; false after the timeout.
  bool barrier() {
    const uint32_t generation = header->generation.load();
    if (header->arrived.fetch_add(1) + 1 == static_cast<uint32_t>(ranks)) {
      header->arrived.store(0);
      header->generation.fetch_add(1);
      return true;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds());
    for (int spins = 0; header->generation.load() == generation; ++spins) {
      if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    return true;
  }
};

namespace {

size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

template <typename T>
void reduceAs(void* out, const ncclComm& c, size_t n, ncclRedOp_t op) {
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) {
    T v = reinterpret_cast<const T*>(c.slot(0))[i];
    for (int r = 1; r < c.ranks; ++r) {
      const T x = reinterpret_cast<const T*>(c.slot(r))[i];
      if (op == ncclSum || op == ncclAvg) v = static_cast<T>(v + x);
      if (op == ncclProd) v = static_cast<T>(v * x);
      if (op == ncclMax) v = x > v ? x : v;
      if (op == ncclMin) v = x < v ? x : v;
    }
    if (op == ncclAvg) v = static_cast<T>(v / static_cast<T>(c.ranks));
    dst[i] = v;
  }
}

/// The slots' `n` elements reduced by `op` into `out`.
bool reduceSlots(void* out, const ncclComm& c, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: reduceAs<int8_t>(out, c, n, op); return true;
    case ncclUint8: reduceAs<uint8_t>(out, c, n, op); return true;
    case ncclInt32: reduceAs<int32_t>(out, c, n, op); return true;
    case ncclUint32: reduceAs<uint32_t>(out, c, n, op); return true;
    case ncclInt64: reduceAs<int64_t>(out, c, n, op); return true;
    case ncclUint64: reduceAs<uint64_t>(out, c, n, op); return true;
    case ncclFloat32: reduceAs<float>(out, c, n, op); return true;
    case ncclFloat64: reduceAs<double>(out, c, n, op); return true;
    default: return false;  // float16 and bfloat16 are not reduced here
  }
}

enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter };

struct Work {
  ncclComm* comm;
  Kind kind;
  unsigned long long send, recv;
  size_t count;  // AllGather: per rank sent; ReduceScatter: per rank received
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
};

const char* kindName(Kind k) {
  switch (k) {
    case Kind::AllReduce: return "ncclAllReduce";
    case Kind::Broadcast: return "ncclBroadcast";
    case Kind::Reduce: return "ncclReduce";
    case Kind::AllGather: return "ncclAllGather";
    case Kind::ReduceScatter: return "ncclReduceScatter";
  }
  return "nccl";
}

void fault(const Work& w, const char* why) {
  char message[256];
  std::snprintf(message, sizeof message, "emulated NCCL: %s on rank %d of %d: %s", kindName(w.kind), w.comm->rank,
                w.comm->ranks, why);
  kilnEmulatorFault(message);
}

void run(void* user) {
  const Work& w = *static_cast<const Work*>(user);
  ncclComm& c = *w.comm;
  const size_t elem = typeSize(w.type);
  const size_t perChunk = kChunkBytes / elem;
  const int ranks = c.ranks;
  const size_t inCount = w.kind == Kind::ReduceScatter ? w.count * static_cast<size_t>(ranks) : w.count;
  const size_t outCount = w.kind == Kind::AllGather ? w.count * static_cast<size_t>(ranks) : w.count;
  auto* in = static_cast<uint8_t*>(kilnEmulatorTranslate(w.send, inCount * elem));
  auto* out = static_cast<uint8_t*>(kilnEmulatorTranslate(w.recv, outCount * elem));
  // A broadcast reads the root's buffer only; a reduce writes the root's only.
  const bool needsIn = w.kind != Kind::Broadcast || c.rank == w.root;
  const bool needsOut = w.kind != Kind::Reduce || c.rank == w.root;
  if ((needsIn && !in && inCount > 0) || (needsOut && !out && outCount > 0))
    return fault(w, "a buffer is not device memory");
  // Blocks of `block` elements exchanged one chunk at a time: ReduceScatter
  // exchanges each rank's block in turn, the others their whole buffer.
  const int blocks = w.kind == Kind::ReduceScatter ? ranks : 1;
  for (int b = 0; b < blocks; ++b) {
    for (size_t off = 0; off < w.count || (off == 0 && w.count == 0); off += perChunk) {
      const size_t n = w.count - off < perChunk ? w.count - off : perChunk;
      const size_t at = (static_cast<size_t>(b) * w.count + off) * elem;
      if (w.kind != Kind::Broadcast || c.rank == w.root) std::memcpy(c.slot(c.rank), in + at, n * elem);
      if (!c.barrier()) return fault(w, "another rank did not arrive (it stopped, died or hangs)");
      switch (w.kind) {
        case Kind::AllReduce:
          if (!reduceSlots(out + off * elem, c, n, w.type, w.op)) return fault(w, "this data type is not reduced");
          break;
        case Kind::Reduce:
          if (c.rank == w.root && !reduceSlots(out + off * elem, c, n, w.type, w.op))
            return fault(w, "this data type is not reduced");
          break;
        case Kind::Broadcast: std::memcpy(out + off * elem, c.slot(w.root), n * elem); break;
        case Kind::AllGather:
          for (int r = 0; r < ranks; ++r)
            std::memcpy(out + (static_cast<size_t>(r) * w.count + off) * elem, c.slot(r), n * elem);
          break;
        case Kind::ReduceScatter:
          if (c.rank == b && !reduceSlots(out + off * elem, c, n, w.type, w.op))
            return fault(w, "this data type is not reduced");
          break;
      }
      if (!c.barrier()) return fault(w, "another rank did not arrive (it stopped, died or hangs)");
      if (w.count == 0) break;
    }
  }
}

ncclResult_t enqueue(Work w, cudaStream_t stream) {
  if (!w.comm) return ncclInvalidArgument;
  if (typeSize(w.type) == 0) return ncclInvalidArgument;
  if ((w.kind == Kind::Broadcast || w.kind == Kind::Reduce) && (w.root < 0 || w.root >= w.comm->ranks))
    return ncclInvalidArgument;
  auto* item = new Work(w);
  const int rc = kilnEmulatorEnqueue(stream, &run, item, [](void* p) { delete static_cast<Work*>(p); });
  return rc == 0 ? ncclSuccess : ncclUnhandledCudaError;
}

}  // namespace

KILN_NCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = 22300;  // the API of NCCL 2.23
  return ncclSuccess;
}

KILN_NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (emulated NCCL: its shared memory)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "unknown result";
  }
}

KILN_NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(getpid()));
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "/kiln-nccl-%016llx",
                static_cast<unsigned long long>(rng()));
  return ncclSuccess;
}

KILN_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* out, int ranks, ncclUniqueId id, int rank) {
  if (!out || ranks < 1 || rank < 0 || rank >= ranks || id.internal[0] != '/') return ncclInvalidArgument;
  auto comm = new ncclComm;
  comm->rank = rank;
  comm->ranks = ranks;
  comm->name.assign(id.internal, strnlen(id.internal, sizeof id.internal));
  comm->bytes = segmentBytes(ranks);
  int fd = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds());
  if (rank == 0) {
    fd = shm_open(comm->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(comm->bytes)) != 0) {
      if (fd >= 0) close(fd);
      delete comm;
      return ncclSystemError;
    }
  } else {
    while ((fd = shm_open(comm->name.c_str(), O_RDWR, 0600)) < 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        delete comm;
        return ncclSystemError;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void* map = MAP_FAILED;
  for (;;) {
    struct stat st {};
    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= comm->bytes) {
      map = mmap(nullptr, comm->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  close(fd);
  if (map == MAP_FAILED) {
    delete comm;
    return ncclSystemError;
  }
  comm->header = static_cast<Header*>(map);
  comm->slots = static_cast<uint8_t*>(map) + 4096;
  if (rank == 0) {
    comm->header->ranks = static_cast<uint32_t>(ranks);
    comm->header->ready.store(1);
  }
  while (comm->header->ready.load() == 0) {
    if (std::chrono::steady_clock::now() > deadline) return ncclSystemError;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (comm->header->ranks != static_cast<uint32_t>(ranks)) return ncclInvalidUsage;
  // The last rank to attach unlinks the segment's name; the mappings stay.
  if (comm->header->attached.fetch_add(1) + 1 == static_cast<uint32_t>(ranks)) shm_unlink(comm->name.c_str());
  *out = comm;
  return ncclSuccess;
}

KILN_NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  munmap(comm->header, comm->bytes);
  delete comm;
  return ncclSuccess;
}

KILN_NCCL_EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue({comm, Kind::AllReduce, reinterpret_cast<uintptr_t>(send), reinterpret_cast<uintptr_t>(recv), count,
                  type, op, 0},
                 stream);
}

KILN_NCCL_EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                            ncclComm_t comm, cudaStream_t stream) {
  return enqueue({comm, Kind::Broadcast, reinterpret_cast<uintptr_t>(send), reinterpret_cast<uintptr_t>(recv), count,
                  type, ncclSum, root},
                 stream);
}

KILN_NCCL_EXPORT ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue({comm, Kind::Reduce, reinterpret_cast<uintptr_t>(send), reinterpret_cast<uintptr_t>(recv), count,
                  type, op, root},
                 stream);
}

KILN_NCCL_EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendCount, ncclDataType_t type,
                                            ncclComm_t comm, cudaStream_t stream) {
  return enqueue({comm, Kind::AllGather, reinterpret_cast<uintptr_t>(send), reinterpret_cast<uintptr_t>(recv),
                  sendCount, type, ncclSum, 0},
                 stream);
}

KILN_NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t type,
                                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue({comm, Kind::ReduceScatter, reinterpret_cast<uintptr_t>(send), reinterpret_cast<uintptr_t>(recv),
                  recvCount, type, op, 0},
                 stream);
}
