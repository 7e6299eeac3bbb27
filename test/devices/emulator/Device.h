// The emulated GPU's context: memory, loaded modules, streams, events and
// CUDA graphs, and the scheduler that runs queued work. DriverApi.cpp maps
// the driver API onto this class; it knows nothing of the C ABI.
//
// Nothing runs when it is enqueued. Work runs on the thread that waits for
// it (a synchronize, a query, a synchronous copy), and then only the work
// that the waited-for point depends on: earlier work of the same stream,
// the recorded points of events waited on, and the legacy default stream's
// implicit ordering with the blocking streams. Among the streams whose next
// command is ready, the scheduler takes them in creation order, or, with a
// seed (adversarial mode), in a seeded pseudo-random order, so that a host
// that forgets a cuStreamWaitEvent sees the race; in that mode each launch
// also runs its blocks, and its warps between barriers, in a shuffled order.
//
// A command that faults (a kernel's illegal or misaligned access, a trap,
// a host work item that calls kilnEmulatorFault) breaks the context as on a
// GPU: queued work is dropped and every later call returns the error, until
// the primary context is released and created again.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test/devices/emulator/DeviceMemory.h"
#include "test/devices/emulator/PtxInterpreter.h"

namespace kiln::emulator {

using CUresult = int;

// The CUresult values the emulator returns (cuda.h's cudaError_enum).
constexpr CUresult kSuccess = 0;
constexpr CUresult kErrorInvalidValue = 1;
constexpr CUresult kErrorOutOfMemory = 2;
constexpr CUresult kErrorNotInitialized = 3;
constexpr CUresult kErrorNoDevice = 100;
constexpr CUresult kErrorInvalidDevice = 101;
constexpr CUresult kErrorInvalidContext = 201;
constexpr CUresult kErrorNoBinaryForGpu = 209;
constexpr CUresult kErrorInvalidPtx = 218;
constexpr CUresult kErrorInvalidHandle = 400;
constexpr CUresult kErrorIllegalState = 401;
constexpr CUresult kErrorNotFound = 500;
constexpr CUresult kErrorNotReady = 600;
constexpr CUresult kErrorIllegalAddress = 700;
constexpr CUresult kErrorLaunchOutOfResources = 701;
constexpr CUresult kErrorMisalignedAddress = 716;
constexpr CUresult kErrorLaunchFailed = 719;
constexpr CUresult kErrorNotSupported = 801;
constexpr CUresult kErrorStreamCaptureUnsupported = 900;
constexpr CUresult kErrorStreamCaptureInvalidated = 901;
constexpr CUresult kErrorStreamCaptureMerge = 902;
constexpr CUresult kErrorStreamCaptureUnmatched = 903;
constexpr CUresult kErrorStreamCaptureIsolation = 905;
constexpr CUresult kErrorStreamCaptureImplicit = 906;
constexpr CUresult kErrorCapturedEvent = 907;

class Context;

/// A command of a stream, run once or (in a graph) many times.
class Work {
 public:
  virtual ~Work() = default;
  /// Runs the command; false with `fault` filled in when it fails.
  virtual bool run(Context& context, Fault& fault) = 0;
};

/// A module loaded into the context: its decoded PTX, the device memory of
/// its variables, and a launchable kernel per .entry.
struct LoadedModule {
  PtxModule ptx;
  std::vector<uint64_t> variableAddresses;
  std::vector<std::unique_ptr<LoadedKernel>> kernels;
  DeviceMemory* memory = nullptr;
  ~LoadedModule();
};

/// What a CUfunction handle points to.
struct Function {
  std::shared_ptr<LoadedModule> module;
  const LoadedKernel* kernel = nullptr;
};

struct Stream;
struct Graph;

/// Stream capture into a graph, shared by the origin stream and the
/// streams that joined it by waiting on an event recorded in it.
struct Capture {
  std::shared_ptr<Graph> graph;
  Stream* origin = nullptr;
  bool invalidated = false;
  int mode = 0;            // CUstreamCaptureMode: 0 global, 1 thread-local, 2 relaxed
  std::thread::id thread;  // that began it
};

/// A point in a stream: done when the stream has finished every command
/// up to `seq`.
struct StreamPoint {
  std::shared_ptr<Stream> stream;
  uint64_t seq = 0;
};

struct Event;

struct Entry {
  uint64_t seq = 0;
  std::shared_ptr<Work> work;      // null for an event record or a wait
  std::shared_ptr<Event> record;   // the event this entry records
  std::vector<StreamPoint> waits;  // points that must be done first
};

struct Stream {
  uint32_t order = 0;    // creation order; the legacy default stream is 0
  bool blocking = true;  // synchronizes with the legacy default stream
  bool destroyed = false;
  std::deque<Entry> queue;
  uint64_t lastEnqueued = 0;
  std::shared_ptr<Capture> capture;
  bool doneUpTo(uint64_t seq) const { return queue.empty() || queue.front().seq > seq; }
};

struct Event {
  unsigned flags = 0;
  bool recorded = false;
  StreamPoint point;   // the last record
  bool timed = false;  // the last record has run and set `time`
  std::chrono::steady_clock::time_point time;
  std::shared_ptr<Capture> capture;  // recorded in an active capture
};

struct Graph {
  std::vector<std::shared_ptr<Work>> nodes;
};

/// A kernel launch, with its parameters copied when it was enqueued (so a
/// graph replays the values captured).
class KernelWork : public Work {
 public:
  KernelWork(std::shared_ptr<LoadedModule> module, const LoadedKernel* kernel, const LaunchShape& shape,
             std::vector<uint8_t> params)
      : module_(std::move(module)), kernel_(kernel), shape_(shape), params_(std::move(params)) {}
  bool run(Context& context, Fault& fault) override;

 private:
  std::shared_ptr<LoadedModule> module_;
  const LoadedKernel* kernel_;
  LaunchShape shape_;
  std::vector<uint8_t> params_;
};

/// An asynchronous copy: host memory is read or written when it runs.
class CopyWork : public Work {
 public:
  enum class Kind { HostToDevice, DeviceToHost, DeviceToDevice };
  CopyWork(Kind kind, uint64_t dstDevice, void* dstHost, uint64_t srcDevice, const void* srcHost, uint64_t bytes)
      : kind_(kind),
        dstDevice_(dstDevice),
        dstHost_(dstHost),
        srcDevice_(srcDevice),
        srcHost_(srcHost),
        bytes_(bytes) {}
  bool run(Context& context, Fault& fault) override;

 private:
  Kind kind_;
  uint64_t dstDevice_;
  void* dstHost_;
  uint64_t srcDevice_;
  const void* srcHost_;
  uint64_t bytes_;
};

/// cuMemsetD8/D32: `count` elements of `elementBytes` bytes.
class MemsetWork : public Work {
 public:
  MemsetWork(uint64_t dst, uint32_t value, uint32_t elementBytes, uint64_t count)
      : dst_(dst), value_(value), elementBytes_(elementBytes), count_(count) {}
  bool run(Context& context, Fault& fault) override;

 private:
  uint64_t dst_;
  uint32_t value_;
  uint32_t elementBytes_;
  uint64_t count_;
};

/// Host work of the emulator's math libraries (kilnEmulatorEnqueue);
/// `destroy` runs when the last reference (queue, graph) lets go.
class HostWork : public Work {
 public:
  HostWork(void (*fn)(void*), void* user, void (*destroy)(void*)) : fn_(fn), user_(user), destroy_(destroy) {}
  ~HostWork() override;
  bool run(Context& context, Fault& fault) override;

 private:
  void (*fn_)(void*);
  void* user_;
  void (*destroy_)(void*);
};

struct GraphExec {
  std::vector<std::shared_ptr<Work>> nodes;
};

/// The emulator's settings, from the environment (DriverApi.cpp reads it).
struct EmulatorOptions {
  uint64_t memoryLimit = 4ull << 30;
  bool adversarial = false;
  uint64_t seed = 0;
  bool verbose = false;
  bool stats = false;  // print interpreter counts when the context goes
};

/// Called for every fault and load error (DriverApi.cpp keeps the message
/// for kilnEmulatorLastFault and prints it with $KILN_EMULATOR_VERBOSE).
void reportFault(CUresult code, const std::string& message);

class Context {
 public:
  explicit Context(const EmulatorOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  DeviceMemory& memory() { return memory_; }
  /// The sticky error of a fault, or 0.
  CUresult sticky() const { return sticky_; }
  /// Records a fault: the error becomes sticky and queued work is dropped.
  void fail(CUresult code, const std::string& message);

  // Handles. `stream` null or CU_STREAM_LEGACY is the legacy default stream;
  // null results are invalid handles.
  std::shared_ptr<Stream> stream(void* handle);
  void* createStream(bool blocking);
  CUresult destroyStream(void* handle);
  std::shared_ptr<Event> event(void* handle);
  void* createEvent(unsigned flags);
  CUresult destroyEvent(void* handle);

  /// Queues `work` on `stream` (recorded instead while it is captured).
  CUresult enqueue(const std::shared_ptr<Stream>& stream, std::shared_ptr<Work> work);
  CUresult recordEvent(const std::shared_ptr<Event>& event, const std::shared_ptr<Stream>& stream);
  CUresult waitEvent(const std::shared_ptr<Stream>& stream, const std::shared_ptr<Event>& event);

  /// Runs queued work until every point in `targets` is done. With
  /// `maxSteps`, runs at most that many commands and returns kErrorNotReady
  /// when the targets are not done yet.
  CUresult runUntil(const std::vector<StreamPoint>& targets, size_t maxSteps = ~size_t(0));
  /// Every stream's last point.
  std::vector<StreamPoint> allPoints();
  StreamPoint lastPoint(const std::shared_ptr<Stream>& stream) { return {stream, stream->lastEnqueued}; }
  bool anyCapture() const;
  /// A synchronizing call during capture invalidates it, as on a GPU.
  void invalidateCaptures();
  /// Whether a "potentially unsafe" call (allocation, a synchronous copy,
  /// synchronizing the context) by the calling thread is prohibited by an
  /// active capture: one of this thread's not begun in relaxed mode, or any
  /// thread's begun in global mode. The captures it conflicts with are
  /// invalidated, and the call should fail with
  /// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
  bool prohibitsUnsafeCall();

  // Capture and graphs.
  CUresult beginCapture(const std::shared_ptr<Stream>& stream, int mode);
  CUresult endCapture(const std::shared_ptr<Stream>& stream, void** graph);
  /// 0 none, 1 active, 2 invalidated (CUstreamCaptureStatus).
  int captureStatus(const std::shared_ptr<Stream>& stream) const;
  std::shared_ptr<Graph> graph(void* handle);
  CUresult destroyGraph(void* handle);
  void* instantiate(const std::shared_ptr<Graph>& graph);
  std::shared_ptr<GraphExec> graphExec(void* handle);
  CUresult destroyGraphExec(void* handle);
  CUresult launchGraph(const std::shared_ptr<GraphExec>& exec, const std::shared_ptr<Stream>& stream);

  // Modules.
  void* addModule(std::shared_ptr<LoadedModule> module);
  std::shared_ptr<LoadedModule> module(void* handle);
  CUresult unloadModule(void* handle);
  /// A CUfunction handle for `kernel` of `module` (the same handle each time).
  void* function(const std::shared_ptr<LoadedModule>& module, const LoadedKernel* kernel);
  Function* findFunction(void* handle);

  // Host allocations (cuMemHostAlloc).
  void* allocateHost(size_t bytes);
  bool freeHost(void* pointer);

  /// kilnEmulatorFault: fails the host work item now running, or, outside
  /// one, breaks the context at once.
  void hostFault(const std::string& message);

  const EmulatorOptions& options() const { return options_; }
  /// The block and warp order seed of a new launch: 0 (index order), or in
  /// adversarial mode a number drawn from the context's seeded generator.
  uint64_t launchOrderSeed() { return options_.adversarial ? (rng_() | 1) : 0; }
  InterpreterStats& stats() { return stats_; }

 private:
  void run(Entry& entry, Stream& stream);
  std::vector<StreamPoint> implicitWaits(const std::shared_ptr<Stream>& stream);
  CUresult push(const std::shared_ptr<Stream>& stream, Entry entry);

  EmulatorOptions options_;
  DeviceMemory memory_;  // first: destroyed after everything that holds device memory
  CUresult sticky_ = 0;
  std::mt19937_64 rng_;
  uint64_t nextSeq_ = 1;
  uint32_t nextStreamOrder_ = 1;
  std::shared_ptr<Stream> legacy_;
  std::shared_ptr<Stream> perThread_;
  std::vector<std::shared_ptr<Stream>> streams_;  // every stream with a handle or queued work, in creation order
  std::map<void*, std::shared_ptr<Event>> events_;
  std::map<void*, std::shared_ptr<Graph>> graphs_;
  std::map<void*, std::shared_ptr<GraphExec>> graphExecs_;
  std::map<void*, std::shared_ptr<LoadedModule>> modules_;
  std::map<void*, std::unique_ptr<Function>> functions_;
  std::map<const LoadedKernel*, void*> functionHandles_;
  std::set<void*> hostAllocations_;
  std::string workFault_;
  bool workFaulted_ = false;
  bool runningWork_ = false;
  InterpreterStats stats_;
};

}  // namespace kiln::emulator
