// The emulated GPU's context (Device.h): handles, queues, the scheduler,
// stream capture and graphs.
#include "test/devices/emulator/Device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace kiln::emulator {

namespace {
/// cuda.h's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
void* const kLegacyStream = reinterpret_cast<void*>(0x1);
void* const kPerThreadStream = reinterpret_cast<void*>(0x2);
}  // namespace

LoadedModule::~LoadedModule() {
  if (!memory) return;
  for (uint64_t address : variableAddresses)
    if (address) memory->free(address);
}

Context::Context(const EmulatorOptions& options) : options_(options), memory_(options.memoryLimit), rng_(options.seed) {
  legacy_ = std::make_shared<Stream>();
  legacy_->order = 0;
  legacy_->blocking = true;
  perThread_ = std::make_shared<Stream>();
  perThread_->order = nextStreamOrder_++;
  perThread_->blocking = false;
  streams_ = {legacy_, perThread_};
}

Context::~Context() {
  // Work and graphs may hold modules, whose variables live in memory_.
  for (auto& s : streams_) s->queue.clear();
  streams_.clear();
  events_.clear();
  graphExecs_.clear();
  graphs_.clear();
  functions_.clear();
  modules_.clear();
  for (void* p : hostAllocations_) std::free(p);
}

void Context::fail(CUresult code, const std::string& message) {
  if (sticky_ == 0) sticky_ = code;
  for (auto& s : streams_) s->queue.clear();
  reportFault(code, message);
}

// ---- handles

std::shared_ptr<Stream> Context::stream(void* handle) {
  if (handle == nullptr || handle == kLegacyStream) return legacy_;
  if (handle == kPerThreadStream) return perThread_;
  for (const auto& s : streams_)
    if (s.get() == handle && !s->destroyed) return s;
  return nullptr;
}

void* Context::createStream(bool blocking) {
  auto s = std::make_shared<Stream>();
  s->order = nextStreamOrder_++;
  s->blocking = blocking;
  streams_.push_back(s);
  return s.get();
}

CUresult Context::destroyStream(void* handle) {
  std::shared_ptr<Stream> s = stream(handle);
  if (!s || s == legacy_ || s == perThread_) return kErrorInvalidHandle;
  // Queued work still runs (as on a GPU); the stream leaves the schedule
  // once it is empty.
  s->destroyed = true;
  if (s->capture) s->capture->invalidated = true;
  if (s->queue.empty()) streams_.erase(std::find(streams_.begin(), streams_.end(), s));
  return kSuccess;
}

std::shared_ptr<Event> Context::event(void* handle) {
  auto it = events_.find(handle);
  return it == events_.end() ? nullptr : it->second;
}

void* Context::createEvent(unsigned flags) {
  auto e = std::make_shared<Event>();
  e->flags = flags;
  events_[e.get()] = e;
  return e.get();
}

CUresult Context::destroyEvent(void* handle) { return events_.erase(handle) ? kSuccess : kErrorInvalidHandle; }

// ---- queues

std::vector<StreamPoint> Context::implicitWaits(const std::shared_ptr<Stream>& stream) {
  // The legacy default stream waits for the blocking streams' earlier work,
  // and they wait for its earlier work.
  std::vector<StreamPoint> waits;
  if (stream == legacy_) {
    for (const auto& s : streams_)
      if (s != legacy_ && s->blocking && !s->doneUpTo(s->lastEnqueued)) waits.push_back(lastPoint(s));
  } else if (stream->blocking && !legacy_->doneUpTo(legacy_->lastEnqueued)) {
    waits.push_back(lastPoint(legacy_));
  }
  return waits;
}

bool Context::anyCapture() const {
  for (const auto& s : streams_)
    if (s->capture && !s->capture->invalidated) return true;
  return false;
}

bool Context::prohibitsUnsafeCall() {
  bool prohibited = false;
  for (const auto& s : streams_) {
    const auto& c = s->capture;
    if (!c || c->invalidated) continue;
    if (c->mode == 0 || (c->mode == 1 && c->thread == std::this_thread::get_id())) {
      c->invalidated = true;
      prohibited = true;
    }
  }
  return prohibited;
}

void Context::invalidateCaptures() {
  for (const auto& s : streams_)
    if (s->capture) s->capture->invalidated = true;
}

CUresult Context::push(const std::shared_ptr<Stream>& stream, Entry entry) {
  if (stream == legacy_) {
    // Work on the legacy stream would depend on a capturing blocking stream.
    for (const auto& s : streams_) {
      if (s->capture && s->blocking) {
        invalidateCaptures();
        return kErrorStreamCaptureImplicit;
      }
    }
  }
  std::vector<StreamPoint> implicit = implicitWaits(stream);
  entry.waits.insert(entry.waits.end(), implicit.begin(), implicit.end());
  entry.seq = nextSeq_++;
  stream->lastEnqueued = entry.seq;
  stream->queue.push_back(std::move(entry));
  return kSuccess;
}

CUresult Context::enqueue(const std::shared_ptr<Stream>& stream, std::shared_ptr<Work> work) {
  if (sticky_) return sticky_;
  if (stream->capture) {
    if (stream->capture->invalidated) return kErrorStreamCaptureInvalidated;
    stream->capture->graph->nodes.push_back(std::move(work));
    return kSuccess;
  }
  Entry entry;
  entry.work = std::move(work);
  return push(stream, std::move(entry));
}

CUresult Context::recordEvent(const std::shared_ptr<Event>& event, const std::shared_ptr<Stream>& stream) {
  if (sticky_) return sticky_;
  if (stream->capture) {
    // A fork/join point of the capture, not a node.
    if (stream->capture->invalidated) return kErrorStreamCaptureInvalidated;
    event->capture = stream->capture;
    return kSuccess;
  }
  event->capture = nullptr;
  Entry entry;
  entry.record = event;
  CUresult result = push(stream, std::move(entry));
  if (result != kSuccess) return result;
  event->recorded = true;
  event->timed = false;
  event->point = lastPoint(stream);
  return kSuccess;
}

CUresult Context::waitEvent(const std::shared_ptr<Stream>& stream, const std::shared_ptr<Event>& event) {
  if (sticky_) return sticky_;
  if (event->capture && !event->capture->invalidated) {
    // Joining a capture: the stream's work goes into the same graph.
    if (stream->capture && stream->capture != event->capture) {
      invalidateCaptures();
      return kErrorStreamCaptureMerge;
    }
    stream->capture = event->capture;
    return kSuccess;
  }
  if (stream->capture) {
    if (event->recorded && !event->point.stream->doneUpTo(event->point.seq)) {
      stream->capture->invalidated = true;
      return kErrorStreamCaptureIsolation;
    }
    return kSuccess;
  }
  if (!event->recorded || event->point.stream->doneUpTo(event->point.seq)) return kSuccess;
  Entry entry;
  entry.waits.push_back(event->point);
  return push(stream, std::move(entry));
}

std::vector<StreamPoint> Context::allPoints() {
  std::vector<StreamPoint> points;
  for (const auto& s : streams_)
    if (!s->queue.empty()) points.push_back(lastPoint(s));
  return points;
}

void Context::run(Entry& entry, Stream& stream) {
  if (entry.record) {
    Event& e = *entry.record;
    if (e.point.stream.get() == &stream && e.point.seq == entry.seq) {
      e.time = std::chrono::steady_clock::now();
      e.timed = true;
    }
  }
  if (!entry.work) return;
  Fault fault;
  workFaulted_ = false;
  runningWork_ = true;
  const bool ok = entry.work->run(*this, fault);
  runningWork_ = false;
  if (!ok) {
    fail(fault.code, fault.message);
    return;
  }
  if (workFaulted_) {
    workFaulted_ = false;
    fail(kErrorIllegalAddress, workFault_);
  }
}

CUresult Context::runUntil(const std::vector<StreamPoint>& targets, size_t maxSteps) {
  if (sticky_) return sticky_;
  // What the targets need: for each stream, the last command that must
  // run, following the waits of every command included.
  std::unordered_map<Stream*, uint64_t> needed;
  std::vector<StreamPoint> work = targets;
  while (!work.empty()) {
    StreamPoint p = work.back();
    work.pop_back();
    uint64_t& upTo = needed[p.stream.get()];
    if (upTo >= p.seq) continue;
    const uint64_t from = upTo;
    upTo = p.seq;
    for (const Entry& e : p.stream->queue) {
      if (e.seq > p.seq) break;
      if (e.seq <= from) continue;
      for (const StreamPoint& w : e.waits) work.push_back(w);
    }
  }
  std::vector<std::shared_ptr<Stream>> involved;
  for (const auto& s : streams_)
    if (needed.count(s.get())) involved.push_back(s);
  auto done = [&]() {
    for (const StreamPoint& p : targets)
      if (!p.stream->doneUpTo(p.seq)) return false;
    return true;
  };
  size_t steps = 0;
  std::vector<Stream*> ready;
  while (!done()) {
    if (steps++ >= maxSteps) return kErrorNotReady;
    ready.clear();
    for (const auto& s : involved) {
      if (s->queue.empty() || s->queue.front().seq > needed[s.get()]) continue;
      bool waitsDone = true;
      for (const StreamPoint& w : s->queue.front().waits) waitsDone = waitsDone && w.stream->doneUpTo(w.seq);
      if (waitsDone) ready.push_back(s.get());
    }
    if (ready.empty()) {
      // Cannot happen: waits only name points enqueued before them.
      fail(kErrorLaunchFailed, "the emulator's scheduler found no runnable command");
      return sticky_;
    }
    Stream* s = ready.front();
    if (options_.adversarial && ready.size() > 1) s = ready[rng_() % ready.size()];
    Entry entry = std::move(s->queue.front());
    s->queue.pop_front();
    run(entry, *s);
    if (sticky_) return sticky_;
  }
  // Destroyed streams leave the schedule once drained.
  streams_.erase(std::remove_if(streams_.begin(), streams_.end(),
                                [](const std::shared_ptr<Stream>& s) { return s->destroyed && s->queue.empty(); }),
                 streams_.end());
  return sticky_;
}

void Context::hostFault(const std::string& message) {
  if (runningWork_) {
    workFault_ = message;
    workFaulted_ = true;
  } else {
    fail(kErrorIllegalAddress, message);
  }
}

// ---- capture and graphs

CUresult Context::beginCapture(const std::shared_ptr<Stream>& stream, int mode) {
  if (sticky_) return sticky_;
  if (stream == legacy_) return kErrorStreamCaptureUnsupported;
  if (stream->capture) return kErrorIllegalState;
  auto capture = std::make_shared<Capture>();
  capture->graph = std::make_shared<Graph>();
  capture->origin = stream.get();
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  stream->capture = capture;
  return kSuccess;
}

CUresult Context::endCapture(const std::shared_ptr<Stream>& stream, void** graphHandle) {
  *graphHandle = nullptr;
  if (!stream->capture) return kErrorIllegalState;
  std::shared_ptr<Capture> capture = stream->capture;
  if (capture->origin != stream.get()) return kErrorStreamCaptureUnmatched;
  for (const auto& s : streams_)
    if (s->capture == capture) s->capture = nullptr;
  for (auto& [handle, e] : events_)
    if (e->capture == capture) e->capture = nullptr;
  if (capture->invalidated) return kErrorStreamCaptureInvalidated;
  if (sticky_) return sticky_;
  graphs_[capture->graph.get()] = capture->graph;
  *graphHandle = capture->graph.get();
  return kSuccess;
}

int Context::captureStatus(const std::shared_ptr<Stream>& stream) const {
  if (!stream->capture) return 0;
  return stream->capture->invalidated ? 2 : 1;
}

std::shared_ptr<Graph> Context::graph(void* handle) {
  auto it = graphs_.find(handle);
  return it == graphs_.end() ? nullptr : it->second;
}

CUresult Context::destroyGraph(void* handle) { return graphs_.erase(handle) ? kSuccess : kErrorInvalidHandle; }

void* Context::instantiate(const std::shared_ptr<Graph>& graph) {
  auto exec = std::make_shared<GraphExec>();
  exec->nodes = graph->nodes;
  graphExecs_[exec.get()] = exec;
  return exec.get();
}

std::shared_ptr<GraphExec> Context::graphExec(void* handle) {
  auto it = graphExecs_.find(handle);
  return it == graphExecs_.end() ? nullptr : it->second;
}

CUresult Context::destroyGraphExec(void* handle) { return graphExecs_.erase(handle) ? kSuccess : kErrorInvalidHandle; }

CUresult Context::launchGraph(const std::shared_ptr<GraphExec>& exec, const std::shared_ptr<Stream>& stream) {
  for (const auto& node : exec->nodes) {
    CUresult result = enqueue(stream, node);
    if (result != kSuccess) return result;
  }
  return kSuccess;
}

// ---- modules

void* Context::addModule(std::shared_ptr<LoadedModule> module) {
  void* handle = module.get();
  modules_[handle] = std::move(module);
  return handle;
}

std::shared_ptr<LoadedModule> Context::module(void* handle) {
  auto it = modules_.find(handle);
  return it == modules_.end() ? nullptr : it->second;
}

CUresult Context::unloadModule(void* handle) {
  auto it = modules_.find(handle);
  if (it == modules_.end()) return kErrorInvalidHandle;
  for (const auto& k : it->second->kernels) {
    auto f = functionHandles_.find(k.get());
    if (f != functionHandles_.end()) {
      functions_.erase(f->second);
      functionHandles_.erase(f);
    }
  }
  modules_.erase(it);
  return kSuccess;
}

void* Context::function(const std::shared_ptr<LoadedModule>& module, const LoadedKernel* kernel) {
  auto it = functionHandles_.find(kernel);
  if (it != functionHandles_.end()) return it->second;
  auto f = std::make_unique<Function>();
  f->module = module;
  f->kernel = kernel;
  void* handle = f.get();
  functions_[handle] = std::move(f);
  functionHandles_[kernel] = handle;
  return handle;
}

Function* Context::findFunction(void* handle) {
  auto it = functions_.find(handle);
  return it == functions_.end() ? nullptr : it->second.get();
}

// ---- commands

bool KernelWork::run(Context& context, Fault& fault) {
  return runKernel(*kernel_, shape_, params_.data(), context.memory(), fault, &context.stats());
}

bool CopyWork::run(Context& context, Fault& fault) {
  DeviceMemory& memory = context.memory();
  const void* src = srcHost_;
  void* dst = dstHost_;
  if (kind_ != Kind::HostToDevice) src = memory.translate(srcDevice_, bytes_);
  if (kind_ != Kind::DeviceToHost) dst = memory.translate(dstDevice_, bytes_);
  if (!src || !dst) {
    const uint64_t bad = !src ? srcDevice_ : dstDevice_;
    fault.code = kErrorIllegalAddress;
    fault.message = "copy of " + std::to_string(bytes_) + " bytes: device address " + hexAddress(bad) +
                    " is no longer inside a live allocation (freed before the copy ran?); " + memory.nearest(bad);
    return false;
  }
  if (bytes_) std::memmove(dst, src, bytes_);
  return true;
}

bool MemsetWork::run(Context& context, Fault& fault) {
  uint8_t* dst = context.memory().translate(dst_, count_ * elementBytes_);
  if (!dst) {
    fault.code = kErrorIllegalAddress;
    fault.message = "memset of " + std::to_string(count_ * elementBytes_) + " bytes at " + hexAddress(dst_) +
                    ": not inside a live allocation; " + context.memory().nearest(dst_);
    return false;
  }
  if (elementBytes_ == 1) {
    std::memset(dst, static_cast<int>(value_ & 0xff), count_);
  } else {
    for (uint64_t i = 0; i < count_; ++i) std::memcpy(dst + 4 * i, &value_, 4);
  }
  return true;
}

HostWork::~HostWork() {
  if (destroy_) destroy_(user_);
}

bool HostWork::run(Context& context, Fault& fault) {
  fn_(user_);
  return true;
}

// ---- host memory

void* Context::allocateHost(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0) return nullptr;
  hostAllocations_.insert(p);
  return p;
}

bool Context::freeHost(void* pointer) {
  if (!hostAllocations_.erase(pointer)) return false;
  std::free(pointer);
  return true;
}

}  // namespace kiln::emulator
