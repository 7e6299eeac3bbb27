// The part of NCCL's ABI that Kiln uses, as nccl.h (NCCL 2.x) declares it:
// the unique id, result codes, data types, reduction ops and the entry
// points of communicator setup and the five collectives. Kiln includes no
// CUDA header (runtime/cuda/CudaLibraries.h says why); runtime/cuda/
// CudaLibraries.cpp, which opens NVIDIA's libnccl.so.2 with dlopen, and the
// emulated GPU's NCCL (test/devices/emulator/Nccl.cpp), which implements
// these entry points, both take the numbers from here.
#pragma once

#include <cstddef>

namespace kiln::cuda {

struct CudaStreamState;  // CUstream

namespace nccl {

using cudaStream_t = CudaStreamState*;

constexpr int NCCL_UNIQUE_ID_BYTES = 128;
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
struct ncclComm;
using ncclComm_t = ncclComm*;

/// ncclResult_t.
using ncclResult_t = int;
constexpr ncclResult_t ncclSuccess = 0;
constexpr ncclResult_t ncclUnhandledCudaError = 1;
constexpr ncclResult_t ncclSystemError = 2;
constexpr ncclResult_t ncclInternalError = 3;
constexpr ncclResult_t ncclInvalidArgument = 4;
constexpr ncclResult_t ncclInvalidUsage = 5;
constexpr ncclResult_t ncclRemoteError = 6;

/// ncclDataType_t.
using ncclDataType_t = int;
constexpr ncclDataType_t ncclInt8 = 0;
constexpr ncclDataType_t ncclUint8 = 1;
constexpr ncclDataType_t ncclInt32 = 2;
constexpr ncclDataType_t ncclUint32 = 3;
constexpr ncclDataType_t ncclInt64 = 4;
constexpr ncclDataType_t ncclUint64 = 5;
constexpr ncclDataType_t ncclFloat16 = 6;
constexpr ncclDataType_t ncclFloat32 = 7;
constexpr ncclDataType_t ncclFloat64 = 8;
constexpr ncclDataType_t ncclBfloat16 = 9;

/// ncclRedOp_t (ncclAvg since NCCL 2.10).
using ncclRedOp_t = int;
constexpr ncclRedOp_t ncclSum = 0;
constexpr ncclRedOp_t ncclProd = 1;
constexpr ncclRedOp_t ncclMax = 2;
constexpr ncclRedOp_t ncclMin = 3;
constexpr ncclRedOp_t ncclAvg = 4;

using GetVersionFn = ncclResult_t (*)(int* version);
using GetUniqueIdFn = ncclResult_t (*)(ncclUniqueId* id);
using CommInitRankFn = ncclResult_t (*)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
using CommDestroyFn = ncclResult_t (*)(ncclComm_t comm);
using GetErrorStringFn = const char* (*)(ncclResult_t result);
using AllReduceFn = ncclResult_t (*)(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                     ncclComm_t comm, cudaStream_t stream);
using BroadcastFn = ncclResult_t (*)(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                     ncclComm_t comm, cudaStream_t stream);
using ReduceFn = ncclResult_t (*)(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                  int root, ncclComm_t comm, cudaStream_t stream);
using AllGatherFn = ncclResult_t (*)(const void* send, void* recv, size_t sendCount, ncclDataType_t type,
                                     ncclComm_t comm, cudaStream_t stream);
using ReduceScatterFn = ncclResult_t (*)(const void* send, void* recv, size_t recvCount, ncclDataType_t type,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

}  // namespace nccl
}  // namespace kiln::cuda
