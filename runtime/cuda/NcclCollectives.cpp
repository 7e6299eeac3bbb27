// NcclCommunicator (NcclCollectives.h).
#include "runtime/cuda/NcclCollectives.h"

#include "runtime/cuda/NcclAbi.h"

namespace kiln::cuda {

struct NcclCommunicator::Api {
  nccl::GetUniqueIdFn getUniqueId = nullptr;
  nccl::CommInitRankFn commInitRank = nullptr;
  nccl::CommDestroyFn commDestroy = nullptr;
  nccl::GetErrorStringFn getErrorString = nullptr;
  nccl::AllReduceFn allReduce = nullptr;
  nccl::BroadcastFn broadcast = nullptr;
  nccl::ReduceFn reduce = nullptr;
  nccl::AllGatherFn allGather = nullptr;
  nccl::ReduceScatterFn reduceScatter = nullptr;
};

namespace {

std::shared_ptr<NcclCommunicator>& processSlot() {
  static std::shared_ptr<NcclCommunicator> nccl;
  return nccl;
}

template <typename Fn>
Status resolveNccl(const CudaLibrary& library, const char* name, Fn& fn) {
  auto symbol = library.symbol(name);
  if (!symbol) return symbol.takeError();
  fn = reinterpret_cast<Fn>(*symbol);
  return Status();
}

Expected<nccl::ncclDataType_t> ncclType(DType dtype) {
  switch (dtype) {
    case DType::F32: return nccl::ncclFloat32;
    case DType::F64: return nccl::ncclFloat64;
    case DType::F16: return nccl::ncclFloat16;
    case DType::BF16: return nccl::ncclBfloat16;
    case DType::I64: return nccl::ncclInt64;
    case DType::I32: return nccl::ncclInt32;
    case DType::I8: return nccl::ncclInt8;
    case DType::U8: return nccl::ncclUint8;
    default: break;
  }
  return Error("NCCL has no " + std::string(dtypeName(dtype)) + " type");
}

}  // namespace

NcclCommunicator* processNccl() { return processSlot().get(); }
void setProcessNccl(std::shared_ptr<NcclCommunicator> nccl) { processSlot() = std::move(nccl); }

Expected<std::shared_ptr<NcclCommunicator>> NcclCommunicator::create(Communicator& host, CudaContext& context) {
  auto library = loadNccl(mathLibraryOptions(context.searchOptions()));
  if (!library) return library.takeError();
  auto api = std::make_shared<Api>();
  const CudaLibrary& lib = (*library)->library;
  KILN_TRY(resolveNccl(lib, "ncclGetUniqueId", api->getUniqueId));
  KILN_TRY(resolveNccl(lib, "ncclCommInitRank", api->commInitRank));
  KILN_TRY(resolveNccl(lib, "ncclCommDestroy", api->commDestroy));
  KILN_TRY(resolveNccl(lib, "ncclGetErrorString", api->getErrorString));
  KILN_TRY(resolveNccl(lib, "ncclAllReduce", api->allReduce));
  KILN_TRY(resolveNccl(lib, "ncclBroadcast", api->broadcast));
  KILN_TRY(resolveNccl(lib, "ncclReduce", api->reduce));
  KILN_TRY(resolveNccl(lib, "ncclAllGather", api->allGather));
  KILN_TRY(resolveNccl(lib, "ncclReduceScatter", api->reduceScatter));

  // Rank 0's unique id, to every rank over the host communicator.
  nccl::ncclUniqueId id{};
  if (host.rank() == 0)
    if (nccl::ncclResult_t r = api->getUniqueId(&id); r != nccl::ncclSuccess)
      return Error(std::string("ncclGetUniqueId failed: ") + api->getErrorString(r));
  KILN_TRY(host.broadcast(&id, sizeof id, 0, "the broadcast of NCCL's unique id"));
  KILN_TRY(context.makeCurrent());
  std::shared_ptr<NcclCommunicator> c(new NcclCommunicator());
  nccl::ncclComm_t comm = nullptr;
  if (nccl::ncclResult_t r = api->commInitRank(&comm, host.size(), id, host.rank()); r != nccl::ncclSuccess)
    return Error("ncclCommInitRank (rank " + std::to_string(host.rank()) + " of " + std::to_string(host.size()) +
                 ") failed: " + api->getErrorString(r));
  c->api_ = std::move(api);
  c->comm_ = comm;
  c->rank_ = host.rank();
  c->size_ = host.size();
  c->name_ = "NCCL " + (*library)->version + " (" + lib.path + ")";
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ && api_) api_->commDestroy(static_cast<nccl::ncclComm_t>(comm_));
}

Status NcclCommunicator::supports(const CollectiveCall& call) const {
  auto type = ncclType(call.dtype);
  if (!type) return Error(describeCollective(call) + ": " + type.error().message());
  const bool blocks = call.kind == CollectiveCall::Kind::AllGather || call.kind == CollectiveCall::Kind::ReduceScatter;
  if (blocks && call.outerElements() != 1)
    return Error(describeCollective(call) + " with a dim of more than one element before its axis is not run on CUDA "
                 "yet");
  if (blocks && call.worldSize != size_)
    return Error(describeCollective(call) + " was compiled for " + std::to_string(call.worldSize) +
                 " ranks, but the job has " + std::to_string(size_));
  return Status();
}

Status NcclCommunicator::enqueue(const CollectiveCall& call, CUdeviceptr in, CUdeviceptr out, CUstream stream,
                                 const CudaExecApi& exec) const {
  auto type = ncclType(call.dtype);
  if (!type) return type.takeError();
  const auto count = static_cast<size_t>(call.elements());
  const nccl::ncclRedOp_t op = call.reduction == ReduceKind::Mean ? nccl::ncclAvg : nccl::ncclSum;
  auto* comm = static_cast<nccl::ncclComm_t>(comm_);
  auto* s = reinterpret_cast<nccl::cudaStream_t>(stream);
  const void* send = reinterpret_cast<const void*>(in);
  void* recv = reinterpret_cast<void*>(out);
  nccl::ncclResult_t r = nccl::ncclSuccess;
  switch (call.kind) {
    case CollectiveCall::Kind::AllReduce: r = api_->allReduce(send, recv, count, *type, op, comm, s); break;
    case CollectiveCall::Kind::BroadcastFrom:
      r = api_->broadcast(send, recv, count, *type, static_cast<int>(call.root), comm, s);
      break;
    case CollectiveCall::Kind::ReduceTo:
      r = api_->reduce(send, recv, count, *type, op, static_cast<int>(call.root), comm, s);
      // reduce_to gives zeros off the root, where NCCL leaves the buffer.
      if (r == nccl::ncclSuccess && rank_ != call.root &&
          exec.cuMemsetD8Async(out, 0, count * dtypeSize(call.dtype), stream) != CUDA_SUCCESS)
        return Error(describeCollective(call) + ": clearing the result off the root failed");
      break;
    case CollectiveCall::Kind::AllGather: r = api_->allGather(send, recv, count, *type, comm, s); break;
    case CollectiveCall::Kind::ReduceScatter:
      r = api_->reduceScatter(send, recv, count / static_cast<size_t>(size_), *type, op, comm, s);
      break;
  }
  if (r != nccl::ncclSuccess) return Error(describeCollective(call) + ": NCCL failed: " + api_->getErrorString(r));
  return Status();
}

}  // namespace kiln::cuda
