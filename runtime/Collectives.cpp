// Collectives (Collectives.h): the single process's communicator, the
// communicator registry, and the collective ops' meaning in terms of a
// communicator's calls.
#include "runtime/Collectives.h"

#include <cstring>
#include <functional>

namespace kiln {

CollectiveRequest::~CollectiveRequest() = default;
Communicator::~Communicator() = default;

void Communicator::abort(int) {}

namespace {

class DoneRequest final : public CollectiveRequest {
 public:
  explicit DoneRequest(Status status) : status_(std::move(status)) {}
  Status wait() override { return std::exchange(status_, Status()); }

 private:
  Status status_;
};

/// A request whose `then` runs once `inner` is done (a gather's rearranging).
class ThenRequest final : public CollectiveRequest {
 public:
  ThenRequest(std::unique_ptr<CollectiveRequest> inner, std::function<void()> then)
      : inner_(std::move(inner)), then_(std::move(then)) {}
  Status wait() override {
    if (!inner_) return Status();
    Status s = inner_->wait();
    inner_.reset();
    if (s) then_();
    return s;
  }

 private:
  std::unique_ptr<CollectiveRequest> inner_;
  std::function<void()> then_;
};

/// Rank 0 of 1: every collective leaves its data as it is.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  Expected<std::unique_ptr<CollectiveRequest>> startAllReduce(void*, int64_t, DType, ReduceKind,
                                                              const std::string&) override {
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startBroadcast(void*, int64_t, int root,
                                                              const std::string& what) override {
    if (root != 0) return Error(what + ": root rank " + std::to_string(root) + " of a job of 1 rank");
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startReduce(void*, int64_t, DType, ReduceKind, int root,
                                                           const std::string& what) override {
    if (root != 0) return Error(what + ": root rank " + std::to_string(root) + " of a job of 1 rank");
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startAllGather(const void* in, void* out, int64_t bytes,
                                                              const std::string&) override {
    if (in != out) std::memmove(out, in, static_cast<size_t>(bytes));
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startReduceScatter(const void* in, void* out, int64_t count,
                                                                  DType dtype, ReduceKind,
                                                                  const std::string&) override {
    if (in != out) std::memmove(out, in, static_cast<size_t>(count) * dtypeSize(dtype));
    return completedRequest();
  }
};

std::shared_ptr<Communicator>& processCommunicator() {
  static std::shared_ptr<Communicator> c = std::make_shared<SingleProcess>();
  return c;
}

thread_local Communicator* tThreadCommunicator = nullptr;

Status checkWorld(const CollectiveCall& call, const Communicator& comm, const std::string& what) {
  if (call.worldSize != comm.size())
    return Error(what + ": " + describeCollective(call) + " was compiled for " + std::to_string(call.worldSize) +
                 " ranks, but the job has " + std::to_string(comm.size()) + " (" + comm.name() + ")");
  return Status();
}

}  // namespace

int64_t CollectiveCall::elements() const {
  int64_t n = 1;
  for (int64_t d : inputDims) n *= d;
  return n;
}

int64_t CollectiveCall::outerElements() const {
  int64_t n = 1;
  for (size_t i = 0; i < static_cast<size_t>(axis) && i < inputDims.size(); ++i) n *= inputDims[i];
  return n;
}

std::unique_ptr<CollectiveRequest> completedRequest(Status status) {
  return std::make_unique<DoneRequest>(std::move(status));
}

Status Communicator::allReduce(void* data, int64_t count, DType dtype, ReduceKind kind, const std::string& what) {
  auto r = startAllReduce(data, count, dtype, kind, what);
  if (!r) return r.takeError();
  return (*r)->wait();
}

Status Communicator::broadcast(void* data, int64_t bytes, int root, const std::string& what) {
  auto r = startBroadcast(data, bytes, root, what);
  if (!r) return r.takeError();
  return (*r)->wait();
}

Communicator& communicator() {
  if (tThreadCommunicator) return *tThreadCommunicator;
  return *processCommunicator();
}

void setProcessCommunicator(std::shared_ptr<Communicator> c) {
  processCommunicator() = c ? std::move(c) : std::make_shared<SingleProcess>();
}

ScopedThreadCommunicator::ScopedThreadCommunicator(Communicator& c) : previous_(tThreadCommunicator) {
  tThreadCommunicator = &c;
}
ScopedThreadCommunicator::~ScopedThreadCommunicator() { tThreadCommunicator = previous_; }

Expected<CollectiveCall> collectiveOf(const Op& op) {
  CollectiveCall call;
  switch (op.kind()) {
    case OpKind::AllReduce: call.kind = CollectiveCall::Kind::AllReduce; break;
    case OpKind::BroadcastFrom: call.kind = CollectiveCall::Kind::BroadcastFrom; break;
    case OpKind::ReduceTo: call.kind = CollectiveCall::Kind::ReduceTo; break;
    case OpKind::AllGather: call.kind = CollectiveCall::Kind::AllGather; break;
    case OpKind::ReduceScatter: call.kind = CollectiveCall::Kind::ReduceScatter; break;
    default: return op.emitError("is not a collective");
  }
  const TensorType& type = op.operand(0)->type();
  if (!type.isStatic()) return op.emitError("has a dynamic operand type " + type.str());
  call.dtype = type.dtype;
  call.inputDims = staticDims(type.shape);
  if (const Attribute* a = op.attr("reduction")) {
    const std::string& r = a->getString();
    if (r == "sum")
      call.reduction = ReduceKind::Sum;
    else if (r == "mean")
      call.reduction = ReduceKind::Mean;
    else
      return op.emitError("reduction '" + r + "': expected \"sum\" or \"mean\"");
  }
  if (const Attribute* a = op.attr("root")) call.root = a->getInt();
  if (const Attribute* a = op.attr("axis")) {
    call.axis = a->getInt();
    if (call.axis < 0) call.axis += static_cast<int64_t>(call.inputDims.size());
  }
  if (const Attribute* a = op.attr("world_size")) call.worldSize = a->getInt();
  return call;
}

std::string describeCollective(const CollectiveCall& call) {
  const std::string reduction = call.reduction == ReduceKind::Mean ? "mean" : "sum";
  switch (call.kind) {
    case CollectiveCall::Kind::AllReduce: return "all_reduce(" + reduction + ")";
    case CollectiveCall::Kind::BroadcastFrom: return "broadcast_from(rank " + std::to_string(call.root) + ")";
    case CollectiveCall::Kind::ReduceTo:
      return "reduce_to(" + reduction + ", rank " + std::to_string(call.root) + ")";
    case CollectiveCall::Kind::AllGather: return "all_gather(axis " + std::to_string(call.axis) + ")";
    case CollectiveCall::Kind::ReduceScatter:
      return "reduce_scatter(" + reduction + ", axis " + std::to_string(call.axis) + ")";
  }
  return "collective";
}

std::vector<int64_t> collectiveResultDims(const CollectiveCall& call) {
  std::vector<int64_t> dims = call.inputDims;
  const auto axis = static_cast<size_t>(call.axis);
  if (call.kind == CollectiveCall::Kind::AllGather && axis < dims.size()) dims[axis] *= call.worldSize;
  if (call.kind == CollectiveCall::Kind::ReduceScatter && axis < dims.size() && call.worldSize > 0)
    dims[axis] /= call.worldSize;
  return dims;
}

Expected<std::unique_ptr<CollectiveRequest>> startCollective(Communicator& comm, const CollectiveCall& call,
                                                             const void* in, void* out, const std::string& what) {
  const int64_t count = call.elements();
  const size_t elem = dtypeSize(call.dtype);
  const size_t bytes = static_cast<size_t>(count) * elem;
  const auto copyIn = [&] {
    if (in != out && bytes) std::memcpy(out, in, bytes);
  };
  switch (call.kind) {
    case CollectiveCall::Kind::AllReduce:
      copyIn();
      return comm.startAllReduce(out, count, call.dtype, call.reduction, what);
    case CollectiveCall::Kind::BroadcastFrom:
      copyIn();
      return comm.startBroadcast(out, static_cast<int64_t>(bytes), static_cast<int>(call.root), what);
    case CollectiveCall::Kind::ReduceTo:
      copyIn();
      return comm.startReduce(out, count, call.dtype, call.reduction, static_cast<int>(call.root), what);
    case CollectiveCall::Kind::AllGather: {
      KILN_TRY(checkWorld(call, comm, what));
      const int64_t outer = call.outerElements();
      if (outer == 1) return comm.startAllGather(in, out, static_cast<int64_t>(bytes), what);
      // [world][outer][inner] gathered, then laid out as [outer][world][inner].
      auto gathered = std::make_shared<std::vector<uint8_t>>(bytes * static_cast<size_t>(call.worldSize));
      auto started = comm.startAllGather(in, gathered->data(), static_cast<int64_t>(bytes), what);
      if (!started) return started.takeError();
      const size_t inner = bytes / static_cast<size_t>(outer);
      const int64_t world = call.worldSize;
      return std::unique_ptr<CollectiveRequest>(
          std::make_unique<ThenRequest>(std::move(*started), [gathered, out, outer, inner, world, bytes] {
            auto* dst = static_cast<uint8_t*>(out);
            for (int64_t r = 0; r < world; ++r)
              for (int64_t o = 0; o < outer; ++o)
                std::memcpy(dst + (static_cast<size_t>(o * world + r)) * inner,
                            gathered->data() + static_cast<size_t>(r) * bytes + static_cast<size_t>(o) * inner,
                            inner);
          }));
    }
    case CollectiveCall::Kind::ReduceScatter: {
      KILN_TRY(checkWorld(call, comm, what));
      const auto axis = static_cast<size_t>(call.axis);
      if (axis >= call.inputDims.size() || call.inputDims[axis] % call.worldSize != 0)
        return Error(what + ": " + describeCollective(call) + " of " + TensorType{call.dtype, staticShape(call.inputDims)}.str() +
                     " does not split into " + std::to_string(call.worldSize) + " ranks");
      const int64_t outer = call.outerElements();
      const int64_t world = call.worldSize;
      const size_t block = bytes / static_cast<size_t>(world);  // one rank's result
      const size_t inner = block / static_cast<size_t>(outer);
      // [outer][world][inner] laid out as [world][outer][inner].
      auto blocks = std::make_shared<std::vector<uint8_t>>(bytes);
      const auto* src = static_cast<const uint8_t*>(in);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t r = 0; r < world; ++r)
          std::memcpy(blocks->data() + static_cast<size_t>(r) * block + static_cast<size_t>(o) * inner,
                      src + static_cast<size_t>(o * world + r) * inner, inner);
      auto started = comm.startReduceScatter(blocks->data(), out, count / world, call.dtype, call.reduction, what);
      if (!started) return started.takeError();
      return std::unique_ptr<CollectiveRequest>(
          std::make_unique<ThenRequest>(std::move(*started), [blocks] {}));
    }
  }
  return Error(what + ": unknown collective");
}

}  // namespace kiln
