// CudaRunner (CudaRunner.h).
#include "runtime/cuda/CudaRunner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "runtime/Collectives.h"
#include "runtime/HostCheck.h"
#include "runtime/ThreadPool.h"
#include "runtime/cuda/CublasLtMatmul.h"
#include "runtime/cuda/NcclCollectives.h"
#include "runtime/cuda/CudnnConvolution.h"

namespace kiln::cuda {

namespace {

/// The library object that runs `call` (a cuBLASLt matmul or a cuDNN
/// convolution), or an error naming `stepName`.
Expected<std::unique_ptr<CudaLibraryStep>> createLibraryStep(const LibraryCall& call, DType dtype,
                                                             const LibrarySearchOptions& search, bool allowTf32,
                                                             const std::string& stepName) {
  const LibrarySearchOptions options = mathLibraryOptions(search);
  if (call.kind == LibraryCall::Kind::MatMul) {
    auto cublasLt = loadCublasLt(options);
    if (!cublasLt) return cublasLt.takeError();
    auto matmul = CublasLtMatmul::create(**cublasLt, call, dtype, allowTf32);
    if (!matmul) return Error(stepName + ": " + matmul.error().message());
    return std::unique_ptr<CudaLibraryStep>(std::move(*matmul));
  }
  auto cudnn = loadCudnn(options);
  if (!cudnn)
    return Error(stepName + " is a cuDNN convolution (" + describeCudnnConvolution(call) +
                 "), but cuDNN cannot be loaded here; compile the model again here (with KILN_NO_CUDNN=1 where "
                 "cuDNN is present but unwanted) to use Kiln's own convolution kernels.\n" +
                 cudnn.error().message());
  auto conv = CudnnConvolution::create(**cudnn, call, dtype, allowTf32);
  if (!conv) return Error(stepName + ": " + conv.error().message());
  return std::unique_ptr<CudaLibraryStep>(std::move(*conv));
}

/// A collective in a job of one process (rank 0 of 1, where each leaves
/// its operand as it is): a copy on the stream. A job of several ranks
/// runs NcclCollective instead.
class SingleProcessCollective final : public CudaLibraryStep {
 public:
  SingleProcessCollective(const CudaExecApi& api, CollectiveCall call) : api_(api), call_(std::move(call)) {}
  size_t workspaceBytes() const override { return 0; }
  Status run(CUstream stream, const std::vector<CUdeviceptr>& buffers, CUdeviceptr, size_t) const override {
    const size_t bytes = static_cast<size_t>(call_.elements()) * dtypeSize(call_.dtype);
    if (buffers.size() < 2 || buffers[0] == buffers[1] || bytes == 0) return Status();
    if (CUresult r = api_.cuMemcpyDtoDAsync(buffers[1], buffers[0], bytes, stream); r != CUDA_SUCCESS)
      return Error("copying on the device failed (CUDA error " + std::to_string(static_cast<int>(r)) + ")");
    return Status();
  }
  std::string describe() const override { return describeCollective(call_) + " (one process)"; }

 private:
  const CudaExecApi& api_;
  CollectiveCall call_;
};

/// A collective of a job of several ranks: NCCL's, enqueued on the stream.
class NcclCollective final : public CudaLibraryStep {
 public:
  NcclCollective(const CudaExecApi& api, const NcclCommunicator& nccl, CollectiveCall call)
      : api_(api), nccl_(nccl), call_(std::move(call)) {}
  size_t workspaceBytes() const override { return 0; }
  Status run(CUstream stream, const std::vector<CUdeviceptr>& buffers, CUdeviceptr, size_t) const override {
    return nccl_.enqueue(call_, buffers[0], buffers[1], stream, api_);
  }
  std::string describe() const override { return describeCollective(call_) + " (" + nccl_.name() + ")"; }

 private:
  const CudaExecApi& api_;
  const NcclCommunicator& nccl_;
  CollectiveCall call_;
};

size_t byteSize(const TensorType& type) {
  return static_cast<size_t>(numElements(type.shape)) * static_cast<size_t>(dtypeSize(type.dtype));
}

/// Copies `bytes` between a host tensor and pinned staging. One core's
/// memcpy runs at a fraction of what the copy engines take (a ResNet-50
/// batch of 64 is 38.5 MB: several milliseconds on one core), so a large
/// copy is shared by up to 8 threads, in blocks of 1 MiB.
void stagingCopy(void* to, const void* from, size_t bytes) {
  constexpr size_t kBlock = size_t{1} << 20;
  if (bytes < 4 * kBlock) {
    std::memcpy(to, from, bytes);
    return;
  }
  static ThreadPool pool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  const auto blocks = static_cast<int64_t>((bytes + kBlock - 1) / kBlock);
  pool.parallelFor(blocks, [&](int64_t begin, int64_t end) {
    const size_t first = static_cast<size_t>(begin) * kBlock;
    const size_t last = std::min(bytes, static_cast<size_t>(end) * kBlock);
    std::memcpy(static_cast<uint8_t*>(to) + first, static_cast<const uint8_t*>(from) + first, last - first);
  });
  pool.park();
}

double millisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

/// Device memory taken with cuMemAlloc for the life of a runner.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
};

}  // namespace

struct CudaRunner::Impl {
  std::shared_ptr<CudaContext> ctx;
  CudaRunOptions options;
  CUmodule module = nullptr;
  std::vector<CUfunction> functions;  // per kernel
  std::vector<unsigned> grids;        // per kernel
  std::vector<unsigned> blocks;       // per kernel
  std::vector<DeviceBuffer> owned;    // everything cuMemAlloc gave, freed at the end
  std::vector<void*> pinned;          // everything cuMemHostAlloc gave
  /// The device buffers of the arguments and what points at them. A run
  /// uses one set; the next run's inputs may be copied into the other while
  /// it computes (runInPlace's `next`). Donated arguments have one buffer,
  /// shared by both sets; the second set is made when first needed.
  struct ArgumentSet {
    std::vector<CUdeviceptr> argPtr;  // per argument
    std::vector<void*> argStage;      // per argument: pinned staging, host to device and back
    std::vector<CUdeviceptr> slotPtr;  // per slot
    /// Per step: the kernel's argument values and the pointers to them that
    /// cuLaunchKernel takes (or the library call's buffers).
    std::vector<std::vector<CUdeviceptr>> paramValues;
    std::vector<std::vector<void*>> params;
    /// Per argument: the host memory copied in ahead of the run (by the
    /// previous run's `next`), or null; and the event after those copies.
    std::vector<const uint8_t*> staged;
    CUevent stagedEvent = nullptr;
    /// The graph captured for this set: its steps, not the copies to and
    /// from the host (which may differ between runs).
    CUgraph graph = nullptr;
    CUgraphExec graphExec = nullptr;
  };
  std::array<ArgumentSet, 2> sets;
  int current = 0;   // the set the next run uses
  bool bothSets = false;
  std::vector<void*> resultStage;     // per result (not aliased): pinned, device to host
  /// Per step: the library call's runner, or null for a kernel.
  std::vector<std::unique_ptr<CudaLibraryStep>> libraries;
  CUdeviceptr workspace = 0;
  size_t workspaceBytes = 0;
  CUevent copied = nullptr;
  /// With CudaRunOptions::timeRuns: timed events before the copies in,
  /// after them, after the steps and after the copies out.
  std::array<CUevent, 4> runEvents{};
  /// With a profile: per step, the timed events recorded on the compute
  /// stream just before and just after it (CudaRunOptions::profile).
  std::vector<std::pair<CUevent, CUevent>> stepEvents;
  bool capturable = true;  // no host check of a computed value
  std::vector<bool> donated;  // per argument: a result is written into it
  /// Per argument: the host memory whose newest value is on the device
  /// only (a donated argument kept there, CudaRunOptions::keepDonated).
  std::vector<uint8_t*> resident;
  int runs = 0;

  /// The kernels' and library calls' buffers in `set`, from its slots.
  void bindParams(const Program& p, ArgumentSet& set) {
    set.paramValues.clear();
    set.params.clear();
    for (size_t k = 0; k < p.steps.size(); ++k) {
      const Program::Step& step = p.steps[k];
      std::vector<CUdeviceptr> values;
      for (int s : step.operands) values.push_back(set.slotPtr[static_cast<size_t>(s)]);
      values.push_back(set.slotPtr[static_cast<size_t>(step.result)]);
      if (!libraries[k]) values.push_back(0);  // a kernel's `sizes`, unused
      set.paramValues.push_back(std::move(values));
    }
    for (std::vector<CUdeviceptr>& values : set.paramValues) {
      std::vector<void*> pointers;
      for (CUdeviceptr& v : values) pointers.push_back(&v);
      set.params.push_back(std::move(pointers));
    }
  }

  /// The second argument set: its own buffers for the arguments that are
  /// not donated, everything else shared with the first.
  Status makeSecondSet(const Program& p) {
    if (bothSets) return Status::success();
    ArgumentSet& first = sets[0];
    ArgumentSet& second = sets[1];
    second.argPtr = first.argPtr;
    second.argStage = first.argStage;
    for (size_t a = 0; a < p.arguments.size(); ++a) {
      if (donated[a]) continue;
      const size_t bytes = byteSize(p.arguments[a].type);
      auto ptr = allocate(bytes, "the next run's input '" + p.arguments[a].name + "'");
      if (!ptr) return ptr.takeError();
      auto stage = allocatePinned(bytes, "the next run's input '" + p.arguments[a].name + "'");
      if (!stage) return stage.takeError();
      second.argPtr[a] = *ptr;
      second.argStage[a] = *stage;
    }
    second.slotPtr = first.slotPtr;
    for (size_t s = 0; s < p.slots.size(); ++s)
      if (p.slots[s].kind == Program::SlotKind::Argument)
        second.slotPtr[s] = second.argPtr[static_cast<size_t>(p.slots[s].index)];
    bindParams(p, second);
    second.staged.assign(p.arguments.size(), nullptr);
    KILN_TRY(check(ctx->api().cuEventCreate(&second.stagedEvent, CU_EVENT_DISABLE_TIMING), "creating an event"));
    bothSets = true;
    return Status::success();
  }

  Status check(CUresult r, const std::string& what) const { return ctx->check(r, what); }

  /// Device memory from the context's caching allocator, for the runner's
  /// life; an out-of-memory error says what it was for.
  Expected<CUdeviceptr> allocate(size_t bytes, const std::string& what) {
    auto ptr = ctx->allocator().allocate(std::max<size_t>(bytes, 1), ctx->computeStream());
    if (!ptr) return Error(ptr.error().message() + " (for " + what + ")");
    owned.push_back({*ptr, bytes});
    return *ptr;
  }

  Expected<void*> allocatePinned(size_t bytes, const std::string& what) {
    auto buffer = ctx->pinnedPool().acquire(std::max<size_t>(bytes, 1));
    if (!buffer) return Error(buffer.error().message() + " (pinned host staging for " + what + ")");
    pinned.push_back(buffer->data);
    return buffer->data;
  }

  ~Impl() {
    if (!ctx) return;
    const CudaExecApi& api = ctx->api();
    (void)ctx->makeCurrent();
    (void)api.cuStreamSynchronize(ctx->computeStream());
    for (ArgumentSet& set : sets) {
      if (set.graphExec) api.cuGraphExecDestroy(set.graphExec);
      if (set.graph) api.cuGraphDestroy(set.graph);
      if (set.stagedEvent) api.cuEventDestroy(set.stagedEvent);
    }
    if (copied) api.cuEventDestroy(copied);
    for (CUevent e : runEvents)
      if (e) api.cuEventDestroy(e);
    for (const auto& [start, end] : stepEvents) {
      if (start) api.cuEventDestroy(start);
      if (end) api.cuEventDestroy(end);
    }
    libraries.clear();
    for (const DeviceBuffer& b : owned) (void)ctx->allocator().free(b.ptr);
    for (void* p : pinned) ctx->pinnedPool().release(p);
    if (module) api.cuModuleUnload(module);
  }
};

CudaRunner::CudaRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaRunner::~CudaRunner() = default;

Expected<std::unique_ptr<CudaRunner>> CudaRunner::create(std::shared_ptr<const CudaProgram> program,
                                                         std::shared_ptr<CudaContext> context,
                                                         CudaRunOptions options) {
  KILN_TRY(program->validate());
  KILN_TRY(context->makeCurrent());
  auto impl = std::make_unique<Impl>();
  impl->ctx = context;
  impl->options = options;
  Impl& m = *impl;
  const CudaExecApi& api = context->api();
  const Program& p = program->plan;
  const std::string what = "program '" + p.name + "'";

  std::string image;
  if (!p.kernelNames.empty()) {
    auto choice = selectCudaImage(*program, context->device().computeMajor, context->device().computeMinor);
    if (!choice) return choice.takeError();
    image = choice->describe(*program);
    const void* data = choice->cubin >= 0 ? static_cast<const void*>(program->cubins[static_cast<size_t>(choice->cubin)].cubin.data())
                                          : static_cast<const void*>(program->ptx.c_str());
    KILN_TRY(m.check(api.cuModuleLoadData(&m.module, data), "loading the " + image + " of " + what + " (cuModuleLoadData)"));
    const int sms = std::max(1, context->device().multiprocessors);
    for (size_t k = 0; k < p.kernelNames.size(); ++k) {
      const std::string& name = p.kernelNames[k];
      CUfunction f = nullptr;
      KILN_TRY(m.check(api.cuModuleGetFunction(&f, m.module, name.c_str()), "finding kernel " + name + " in the module"));
      int maxThreads = 0;
      KILN_TRY(m.check(api.cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f),
                       "reading kernel " + name + "'s thread limit"));
      const CudaKernelLaunch& launch = program->launches[k];
      if (maxThreads < launch.blockSize)
        return Error("kernel " + name + " of " + what + " is launched with " + std::to_string(launch.blockSize) +
                     " threads a block, but the device allows it only " + std::to_string(maxThreads));
      // Every kernel strides over its work, so a grid of a few blocks per
      // multiprocessor covers any size.
      const int64_t needed = (launch.workItems + launch.blockSize - 1) / launch.blockSize;
      m.functions.push_back(f);
      m.blocks.push_back(static_cast<unsigned>(launch.blockSize));
      m.grids.push_back(static_cast<unsigned>(std::clamp<int64_t>(needed, 1, int64_t{sms} * 8)));
    }
  }

  // Device buffers: arguments, constants (uploaded now), the arena, outputs.
  for (size_t a = 0; a < p.arguments.size(); ++a) {
    const size_t bytes = byteSize(p.arguments[a].type);
    auto ptr = m.allocate(bytes, "input '" + p.arguments[a].name + "' of " + what);
    if (!ptr) return ptr.takeError();
    auto stage = m.allocatePinned(bytes, "input '" + p.arguments[a].name + "'");
    if (!stage) return stage.takeError();
    m.sets[0].argPtr.push_back(*ptr);
    m.sets[0].argStage.push_back(*stage);
  }
  std::vector<CUdeviceptr> constPtr;
  for (const Tensor& c : p.constants) {
    auto ptr = m.allocate(c.numBytes(), "a constant of " + what);
    if (!ptr) return ptr.takeError();
    if (c.numBytes() > 0)  // an empty constant has no host data to copy
      KILN_TRY(m.check(api.cuMemcpyHtoDAsync(*ptr, c.raw(), c.numBytes(), context->computeStream()),
                       "copying a constant of " + what + " to the device"));
    constPtr.push_back(*ptr);
  }
  auto arena = m.allocate(static_cast<size_t>(p.arenaBytes), "the arena of " + what);
  if (!arena) return arena.takeError();
  for (const Program::Slot& slot : p.slots) {
    CUdeviceptr ptr = 0;
    switch (slot.kind) {
      case Program::SlotKind::Argument:
      case Program::SlotKind::InPlace: ptr = m.sets[0].argPtr[static_cast<size_t>(slot.index)]; break;
      case Program::SlotKind::Constant: ptr = constPtr[static_cast<size_t>(slot.index)]; break;
      case Program::SlotKind::Arena: ptr = *arena + static_cast<CUdeviceptr>(slot.index); break;
      case Program::SlotKind::Output: {
        auto out = m.allocate(byteSize(slot.type), "a result of " + what);
        if (!out) return out.takeError();
        ptr = *out;
        break;
      }
    }
    m.sets[0].slotPtr.push_back(ptr);
  }
  for (const Program::Result& r : p.results) {
    void* stage = nullptr;
    if (r.aliasedArgument < 0) {
      auto s = m.allocatePinned(byteSize(p.slots[static_cast<size_t>(r.slot)].type), "a result");
      if (!s) return s.takeError();
      stage = *s;
    }
    m.resultStage.push_back(stage);
  }

  for (const Program::Step& step : p.steps) {
    for (const Program::SlotCheck& c : step.checks)
      if (p.slots[static_cast<size_t>(c.slot)].kind != Program::SlotKind::Argument) m.capturable = false;
    if (step.kind == Program::Step::Kind::Collective) {
      if (communicator().size() == 1) {
        m.libraries.push_back(std::make_unique<SingleProcessCollective>(api, step.collective));
        continue;
      }
      const NcclCommunicator* nccl = processNccl();
      if (!nccl)
        return Error("step %" + step.name + " of " + what + " is a collective (" +
                     describeCollective(step.collective) + ") in a job of " + std::to_string(communicator().size()) +
                     " ranks, and this process has no NCCL communicator (kiln train --device cuda under mpirun "
                     "makes one)");
      if (Status s = nccl->supports(step.collective); !s)
        return Error("step %" + step.name + " of " + what + ": " + s.error().message());
      // NCCL's calls are not captured into CUDA graphs here.
      m.capturable = false;
      m.libraries.push_back(std::make_unique<NcclCollective>(api, *nccl, step.collective));
    } else if (step.kind == Program::Step::Kind::Library) {
      auto library = createLibraryStep(step.call, p.slots[static_cast<size_t>(step.result)].type.dtype,
                                       context->searchOptions(), options.allowTf32, "step %" + step.name + " of " + what);
      if (!library) return library.takeError();
      m.workspaceBytes = std::max(m.workspaceBytes, (*library)->workspaceBytes());
      m.libraries.push_back(std::move(*library));
    } else {
      m.libraries.push_back(nullptr);
    }
  }
  m.bindParams(p, m.sets[0]);
  if (m.workspaceBytes > 0) {
    auto workspace = m.allocate(m.workspaceBytes, "the math libraries' workspace");
    if (!workspace) return workspace.takeError();
    m.workspace = *workspace;
  }
  m.donated.assign(p.arguments.size(), false);
  for (const Program::Result& r : p.results)
    if (r.aliasedArgument >= 0) m.donated[static_cast<size_t>(r.aliasedArgument)] = true;
  m.resident.assign(p.arguments.size(), nullptr);
  m.sets[0].staged.assign(p.arguments.size(), nullptr);
  KILN_TRY(m.check(api.cuEventCreate(&m.sets[0].stagedEvent, CU_EVENT_DISABLE_TIMING), "creating an event"));
  KILN_TRY(m.check(api.cuEventCreate(&m.copied, CU_EVENT_DISABLE_TIMING), "creating an event"));
  if (options.timeRuns)
    for (CUevent& e : m.runEvents) KILN_TRY(m.check(api.cuEventCreate(&e, 0), "creating a timing event"));
  if (options.profile) {
    // Timed events (flags 0): the device stamps each when the stream
    // reaches it, so a step's time excludes the host's launch overhead and
    // the stream is not synchronized per step.
    m.stepEvents.assign(p.steps.size(), {nullptr, nullptr});
    for (auto& [start, end] : m.stepEvents) {
      KILN_TRY(m.check(api.cuEventCreate(&start, 0), "creating a profiling event"));
      KILN_TRY(m.check(api.cuEventCreate(&end, 0), "creating a profiling event"));
    }
  }
  KILN_TRY(m.check(api.cuStreamSynchronize(context->computeStream()), "uploading the constants of " + what));

  std::unique_ptr<CudaRunner> runner(new CudaRunner(std::move(impl)));
  runner->program_ = std::move(program);
  runner->context_ = std::move(context);
  runner->image_ = image;
  return runner;
}

Status CudaRunner::syncDonated() {
  Impl& m = *impl_;
  if (std::none_of(m.resident.begin(), m.resident.end(), [](uint8_t* h) { return h != nullptr; })) return Status::success();
  KILN_TRY(context_->makeCurrent());
  const CudaExecApi& api = context_->api();
  const Program& p = program_->plan;
  for (size_t a = 0; a < m.resident.size(); ++a) {
    if (!m.resident[a]) continue;
    KILN_TRY(m.check(api.cuMemcpyDtoHAsync(m.sets[0].argStage[a], m.sets[0].argPtr[a], byteSize(p.arguments[a].type),
                                           context_->computeStream()),
                     "copying '" + p.arguments[a].name + "' back to the host"));
  }
  KILN_TRY(m.check(api.cuStreamSynchronize(context_->computeStream()), "copying donated values back to the host"));
  for (size_t a = 0; a < m.resident.size(); ++a)
    if (uint8_t* host = std::exchange(m.resident[a], nullptr))
      std::memcpy(host, m.sets[0].argStage[a], byteSize(p.arguments[a].type));
  return Status::success();
}

Expected<std::vector<Tensor>> CudaRunner::run(const std::vector<Tensor>& inputs) {
  // The device's copies of donated arguments are about to be overwritten.
  KILN_TRY(syncDonated());
  return execute(inputs, nullptr, nullptr);
}

Expected<std::vector<Tensor>> CudaRunner::runInPlace(std::vector<Tensor>& inputs,
                                                     const std::vector<const Tensor*>* next) {
  return execute(inputs, &inputs, next);
}

Expected<std::vector<Tensor>> CudaRunner::execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* inPlace,
                                                  const std::vector<const Tensor*>* next) {
  Impl& m = *impl_;
  const bool writeDonated = inPlace != nullptr;
  stats_ = CudaRunStats{};
  Impl::ArgumentSet& S = m.sets[static_cast<size_t>(m.current)];
  const Program& p = program_->plan;
  const CudaExecApi& api = context_->api();
  const CUstream compute = context_->computeStream(), copy = context_->copyStream();
  KILN_TRY(context_->makeCurrent());
  if (inputs.size() != p.arguments.size())
    return Error("'" + p.name + "' takes " + std::to_string(p.arguments.size()) + " inputs, got " +
                 std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].type() != p.arguments[i].type)
      return Error("input " + std::to_string(i) + " ('" + p.arguments[i].name + "') of '" + p.name + "' is " +
                   inputs[i].type().str() + ", expected " + p.arguments[i].type.str() +
                   " (the program was compiled for these shapes)");
  // Checks of arguments run on the host, before anything is copied.
  for (const Program::Step& step : p.steps)
    for (const Program::SlotCheck& c : step.checks) {
      const Program::Slot& slot = p.slots[static_cast<size_t>(c.slot)];
      if (slot.kind != Program::SlotKind::Argument) continue;
      const Tensor& t = inputs[static_cast<size_t>(slot.index)];
      KILN_TRY(runHostCheck(c.check, t.raw(), t.dtype(), t.numElements()));
    }
  // Kept on the device (runInPlace with keepDonated): a donated argument
  // whose host memory is the one its newest value came from is not copied
  // in, and its new value is not copied out until syncDonated(). Any other
  // argument is copied in; a donated one that another run left on the
  // device is replaced by the host's value.
  const bool keep = writeDonated && m.options.keepDonated;
  std::vector<bool> upload(inputs.size(), true);
  for (size_t a = 0; a < inputs.size(); ++a) {
    if (!m.donated[a]) continue;
    if (keep && m.resident[a] == inputs[a].raw()) upload[a] = false;
    m.resident[a] = nullptr;
  }
  // Copied in ahead by the previous run (its `next`): the same host memory.
  bool stagedUsed = false;
  for (size_t a = 0; a < inputs.size(); ++a) {
    if (!m.donated[a] && S.staged[a] && S.staged[a] == inputs[a].raw()) {
      upload[a] = false;
      stagedUsed = true;
    }
    S.staged[a] = nullptr;
  }
  // Each input copied once, from the caller's tensor into pinned staging.
  const auto stagingStart = std::chrono::steady_clock::now();
  for (size_t a = 0; a < inputs.size(); ++a)
    if (upload[a]) {
      stagingCopy(S.argStage[a], inputs[a].raw(), inputs[a].numBytes());
      ++stats_.stagedInputs;
      stats_.stagedInputBytes += inputs[a].numBytes();
    }
  stats_.stagingMs += millisecondsSince(stagingStart);

  StepProfile* profile = m.options.profile;
  if (profile && profile->entries.size() != p.steps.size()) {
    profile->entries.clear();
    for (size_t k = 0; k < p.steps.size(); ++k) {
      profile->entries.push_back({"%" + p.steps[k].name, m.libraries[k] ? m.libraries[k]->describe() : p.steps[k].what});
      // As on the CPU: 2 flops per multiply-add of a matmul or convolution.
      if (p.steps[k].kind == Program::Step::Kind::Library)
        profile->entries.back().flops = 2.0 * static_cast<double>(libraryCallWork(p.steps[k].call));
      profile->entries.back().bytes = static_cast<double>(p.stepBytes(p.steps[k]));
    }
  }
  // CUDA_LAUNCH_BLOCKING=1, as for PyTorch: each step is waited for, so
  // that an error names the kernel that failed.
  const char* blockingEnv = std::getenv("CUDA_LAUNCH_BLOCKING");
  const bool blocking = blockingEnv && std::string_view(blockingEnv) == "1";
  const bool graphs = m.options.graphs && m.capturable && !profile && !blocking;

  // A run: the inputs to the device (on the copy stream, ordered before the
  // steps by an event, or on the compute stream before a replayed graph),
  // the steps (captured as a graph once, then replayed), the results back.
  // The copies stay outside the graph: which inputs are copied may change
  // from run to run, and they are timed apart from the steps.
  auto uploadInputs = [&](CUstream stream) -> Status {
    for (size_t a = 0; a < inputs.size(); ++a)
      if (upload[a]) {
        KILN_TRY(m.check(api.cuMemcpyHtoDAsync(S.argPtr[a], S.argStage[a], inputs[a].numBytes(), stream),
                         "copying input '" + p.arguments[a].name + "' to the device"));
        ++stats_.hostToDeviceCopies;
        stats_.hostToDeviceBytes += inputs[a].numBytes();
      }
    return Status::success();
  };
  auto enqueueSteps = [&]() -> Status {
    for (size_t k = 0; k < p.steps.size(); ++k) {
      const Program::Step& step = p.steps[k];
      for (const Program::SlotCheck& c : step.checks) {
        const Program::Slot& slot = p.slots[static_cast<size_t>(c.slot)];
        if (slot.kind == Program::SlotKind::Argument) continue;
        auto checked = Tensor::allocate(slot.type.dtype, staticDims(slot.type.shape), "a value");
        if (!checked) return slotAllocationError(p, c.slot);
        Tensor& value = *checked;
        KILN_TRY(m.check(api.cuMemcpyDtoHAsync(value.raw(), S.slotPtr[static_cast<size_t>(c.slot)], value.numBytes(), compute),
                         "copying a checked value back"));
        KILN_TRY(m.check(api.cuStreamSynchronize(compute), "computing the value a host check reads"));
        KILN_TRY(runHostCheck(c.check, value.raw(), value.dtype(), value.numElements()));
      }
      if (profile)
        KILN_TRY(m.check(api.cuEventRecord(m.stepEvents[k].first, compute), "recording a profiling event"));
      if (const CudaLibraryStep* library = m.libraries[k].get()) {
        if (Status ran = library->run(compute, S.paramValues[k], m.workspace, m.workspaceBytes); !ran)
          return Error("step %" + step.name + " of '" + p.name + "' (" + library->describe() + "): " + ran.error().message());
        if (blocking) KILN_TRY(m.check(api.cuStreamSynchronize(compute), "running " + library->describe()));
      } else {
        const size_t kernel = static_cast<size_t>(step.kernel);
        KILN_TRY(m.check(api.cuLaunchKernel(m.functions[kernel], m.grids[kernel], 1, 1, m.blocks[kernel], 1, 1, 0,
                                            compute, S.params[k].data(), nullptr),
                         "launching kernel " + p.kernelNames[kernel] + " (" + step.what + ")"));
        if (blocking)
          KILN_TRY(m.check(api.cuStreamSynchronize(compute),
                           "running kernel " + p.kernelNames[kernel] + " (" + step.what + ")"));
      }
      if (profile)
        KILN_TRY(m.check(api.cuEventRecord(m.stepEvents[k].second, compute), "recording a profiling event"));
    }
    // Results copied into donated arguments after the last step.
    for (const auto& [source, argument] : p.finalCopies)
      KILN_TRY(m.check(api.cuMemcpyDtoDAsync(S.argPtr[static_cast<size_t>(argument)], S.slotPtr[static_cast<size_t>(source)],
                                             inputs[static_cast<size_t>(argument)].numBytes(), compute),
                       "copying a result into its donated input"));
    return Status::success();
  };
  auto downloadResults = [&]() -> Status {
    auto copyBack = [&](void* to, CUdeviceptr from, size_t bytes, const std::string& what) -> Status {
      KILN_TRY(m.check(api.cuMemcpyDtoHAsync(to, from, bytes, compute), "copying " + what + " back to the host"));
      ++stats_.deviceToHostCopies;
      stats_.deviceToHostBytes += bytes;
      return Status::success();
    };
    for (size_t r = 0; r < p.results.size(); ++r) {
      const Program::Result& result = p.results[r];
      if (result.aliasedArgument >= 0) continue;
      const size_t s = static_cast<size_t>(result.slot);
      KILN_TRY(copyBack(m.resultStage[r], S.slotPtr[s], byteSize(p.slots[s].type), "result " + std::to_string(r)));
    }
    for (size_t r = 0; r < p.results.size() && !keep; ++r)
      if (const int a = p.results[r].aliasedArgument; a >= 0)
        KILN_TRY(copyBack(S.argStage[static_cast<size_t>(a)], S.argPtr[static_cast<size_t>(a)],
                          inputs[static_cast<size_t>(a)].numBytes(),
                          "donated input '" + p.arguments[static_cast<size_t>(a)].name + "'"));
    return Status::success();
  };
  auto record = [&](size_t event, CUstream stream) -> Status {
    if (!m.options.timeRuns) return Status::success();
    return m.check(api.cuEventRecord(m.runEvents[event], stream), "recording a timing event");
  };

  // The first run launches its steps one by one; from the second on, a
  // graph captured once per argument set replays them.
  const bool replay = graphs && m.runs >= 1;
  if (replay && !S.graphExec) {
    KILN_TRY(m.check(api.cuStreamBeginCapture(compute, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "starting a graph capture"));
    Status captured = enqueueSteps();
    const CUresult ended = api.cuStreamEndCapture(compute, &S.graph);
    KILN_TRY(std::move(captured));
    KILN_TRY(m.check(ended, "ending the graph capture of '" + p.name + "'"));
    KILN_TRY(m.check(api.cuGraphInstantiateWithFlags(&S.graphExec, S.graph, 0), "instantiating the graph of '" + p.name + "'"));
  }
  const CUstream uploadStream = replay ? compute : copy;
  KILN_TRY(record(0, uploadStream));
  KILN_TRY(uploadInputs(uploadStream));
  KILN_TRY(record(1, uploadStream));
  if (!replay) {
    KILN_TRY(m.check(api.cuEventRecord(m.copied, copy), "recording the inputs' copy"));
    KILN_TRY(m.check(api.cuStreamWaitEvent(compute, m.copied, 0), "ordering the steps after the inputs' copy"));
  }
  if (stagedUsed)
    KILN_TRY(m.check(api.cuStreamWaitEvent(compute, S.stagedEvent, 0), "ordering the steps after the inputs copied ahead"));
  if (replay) {
    KILN_TRY(m.check(api.cuGraphLaunch(S.graphExec, compute), "replaying the graph of '" + p.name + "'"));
    ++replays_;
  } else {
    KILN_TRY(enqueueSteps());
  }
  KILN_TRY(record(2, compute));
  KILN_TRY(downloadResults());
  KILN_TRY(record(3, compute));
  // The next run's inputs (those not donated) go to the device on the copy
  // stream while this run computes, into the other argument set.
  if (next) {
    if (next->size() != inputs.size())
      return Error("'" + p.name + "': the next run's inputs number " + std::to_string(next->size()) + ", expected " +
                   std::to_string(inputs.size()));
    KILN_TRY(m.makeSecondSet(p));
    Impl::ArgumentSet& T = m.sets[static_cast<size_t>(1 - m.current)];
    for (size_t a = 0; a < inputs.size(); ++a) {
      T.staged[a] = nullptr;
      const Tensor* t = (*next)[a];
      if (m.donated[a] || !t || t->type() != p.arguments[a].type) continue;
      std::memcpy(T.argStage[a], t->raw(), t->numBytes());
      KILN_TRY(m.check(api.cuMemcpyHtoDAsync(T.argPtr[a], T.argStage[a], t->numBytes(), copy),
                       "copying the next run's input '" + p.arguments[a].name + "' to the device"));
      T.staged[a] = t->raw();
    }
    KILN_TRY(m.check(api.cuEventRecord(T.stagedEvent, copy), "recording the next run's inputs' copy"));
    m.current = 1 - m.current;
  }
  if (Status ran = m.check(api.cuStreamSynchronize(compute), "running '" + p.name + "'"); !ran)
    return Error(ran.error().message() +
                 (blocking ? "" : "\n(kernels run asynchronously: run with CUDA_LAUNCH_BLOCKING=1 to learn which step failed)"));
  ++m.runs;
  // Every event has been reached now: each step's time, as the device
  // measured it.
  if (profile) {
    for (size_t k = 0; k < p.steps.size(); ++k) {
      float ms = 0;
      KILN_TRY(m.check(api.cuEventElapsedTime(&ms, m.stepEvents[k].first, m.stepEvents[k].second),
                       "reading the time of step %" + p.steps[k].name + " (cuEventElapsedTime)"));
      profile->entries[k].seconds += static_cast<double>(ms) * 1e-3;
      ++profile->entries[k].calls;
    }
  }

  if (m.options.timeRuns) {
    float ms[3] = {0, 0, 0};
    for (size_t e = 0; e < 3; ++e)
      KILN_TRY(m.check(api.cuEventElapsedTime(&ms[e], m.runEvents[e], m.runEvents[e + 1]),
                       "reading the time of a run's part (cuEventElapsedTime)"));
    stats_.copyInMs = ms[0];
    stats_.deviceMs = ms[1];
    stats_.copyOutMs = ms[2];
    stats_.timed = true;
  }

  // The results out of staging: each into a new tensor, or a donated
  // argument's new value into the caller's tensor (runInPlace) or, left
  // on the device (keepDonated), noted as resident there.
  const auto unstagingStart = std::chrono::steady_clock::now();
  auto unstage = [&](Tensor& to, const void* from) {
    stagingCopy(to.raw(), from, to.numBytes());
    ++stats_.stagedResults;
    stats_.stagedResultBytes += to.numBytes();
  };
  std::vector<Tensor> results;
  for (size_t r = 0; r < p.results.size(); ++r) {
    const Program::Result& result = p.results[r];
    const int a = result.aliasedArgument;
    if (a >= 0 && inPlace) {
      Tensor& donated = (*inPlace)[static_cast<size_t>(a)];
      if (keep)
        m.resident[static_cast<size_t>(a)] = donated.raw();
      else
        unstage(donated, S.argStage[static_cast<size_t>(a)]);
      results.emplace_back();
      continue;
    }
    const TensorType& type = a >= 0 ? p.arguments[static_cast<size_t>(a)].type
                                    : p.slots[static_cast<size_t>(result.slot)].type;
    auto t = Tensor::allocate(type.dtype, staticDims(type.shape), "a result");
    if (!t) return slotAllocationError(p, result.slot);
    unstage(*t, a >= 0 ? S.argStage[static_cast<size_t>(a)] : m.resultStage[r]);
    results.push_back(std::move(*t));
  }
  stats_.stagingMs += millisecondsSince(unstagingStart);
  return results;
}

}  // namespace kiln::cuda
