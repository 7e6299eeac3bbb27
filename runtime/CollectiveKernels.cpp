// The interpreter's collectives: each op runs on the calling thread's
// communicator (runtime/Collectives.h) and waits for it; one process alone
// is rank 0 of 1, where each leaves its operand as it is.
#include "runtime/Collectives.h"
#include "runtime/Kernels.h"

namespace kiln::kernels {

namespace {

Status runCollective(const KernelCall& c) {
  auto call = collectiveOf(c.op);
  if (!call) return call.takeError();
  const std::string what = describeCollective(*call) + " %" + c.op.result()->name();
  auto request = startCollective(communicator(), *call, c.in(0).raw(), c.out().raw(), what);
  if (!request) return c.op.emitError(request.error().message());
  if (Status s = (*request)->wait(); !s) return c.op.emitError(s.error().message());
  return Status();
}

}  // namespace

Status AllReduce(const KernelCall& c) { return runCollective(c); }
Status BroadcastFrom(const KernelCall& c) { return runCollective(c); }
Status ReduceTo(const KernelCall& c) { return runCollective(c); }
Status AllGather(const KernelCall& c) { return runCollective(c); }
Status ReduceScatter(const KernelCall& c) { return runCollective(c); }

}  // namespace kiln::kernels
