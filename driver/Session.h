// A session: what every way of running a model shares — `kiln run`, `kiln
// train`, the benchmarks and the Python package. It owns the device choice,
// the compile options, the one evaluator that folds constants at import and
// in passes, the notices meant for the user (kernel cache problems, the
// device `auto` chose, an interpreter fallback), and the rule for models the
// JIT cannot compile yet: they run on the reference interpreter with a
// notice naming every such op, never silently, and not at all when the
// session forbids falling back.
//
//   auto session = Session::create({.device = "cpu"});
//   auto model = (*session)->compile(f);
//   auto outputs = (*model)->run(inputs);
//   for (const std::string& note : (*session)->takeNotices()) ...
//
// `--device cuda` never falls back to the CPU: without a usable GPU the
// session is not created, and the error says why (runtime/cuda/CudaDevices.h).
//
// The session is the driver layer (driver/README.md), above the compiler and
// the runtime: the executors it drives (codegen/cpu/CpuExecutable.h,
// codegen/cuda/CudaExecutor.h) know nothing of it.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaExecutor.h"
#include "driver/Device.h"
#include "ir/Evaluator.h"
#include "ir/IR.h"
#include "ir/Precision.h"
#include "passes/MemoryPlan.h"
#include "runtime/Tensor.h"

namespace kiln {

struct SessionOptions {
  /// `cpu`, `cuda`, `cuda:N` or `auto`.
  std::string device = "cpu";
  /// Run every model on the reference interpreter (`--interpret`).
  bool interpret = false;
  /// A model with ops the JIT cannot compile yet runs on the interpreter
  /// (with a notice); false makes that an error (`--no-fallback`).
  bool allowFallback = true;
  /// Threads, optimization level, kernel cache, compile report and step
  /// profile of the CPU JIT.
  codegen::CpuOptions cpu = {};
  /// Optimization level, graphs, TF32, architectures and compile report on
  /// CUDA: its own, set apart from `cpu`'s.
  codegen::CudaOptions cuda = {};
  /// The most device memory Kiln's allocator may reserve (`--cuda-memory-limit`).
  std::optional<size_t> cudaMemoryLimit = std::nullopt;
  /// `--precision` (docs/precision.md): bf16 and fp16 run every model
  /// through the autocast pass, on every device and on the interpreter
  /// alike; tf32 lets CUDA's libraries round f32 inputs to TF32 (the CPU
  /// computes in f32 and says so once).
  Precision precision = Precision::FP32;
};

/// Runs the autocast pass (with canonicalize, CSE and DCE after it) over
/// `m` for `precision`: nothing to do for fp32 and tf32.
Status autocastModule(Module& m, Precision precision);
/// Why this CPU computes `precision` in f32 (it lacks the instructions, or
/// it is tf32, which no CPU has), as a notice; empty when it need not.
std::string cpuPrecisionNotice(Precision precision);

/// Per-model options of Session::compile.
struct CompileOptions {
  /// Donated arguments: runInPlace writes each result into its argument
  /// (a training step's parameters and optimizer state;
  /// passes/MemoryPlan.h ResultAlias).
  std::vector<ResultAlias> aliases = {};
  /// Threads of this model instead of the session's, when > 0.
  int threads = 0;
  /// On CUDA, runInPlace keeps donated values on the device until
  /// CompiledModel::syncDonated() (a training loop's parameters and state;
  /// cuda::CudaRunOptions::keepDonated). No effect on the CPU.
  bool keepDonatedOnDevice = false;
};

class Session;

/// A function compiled by a session: on the JIT for the shapes of the inputs
/// it meets (each new set of shapes compiles once), or on the reference
/// interpreter when the session interprets or falls back.
class CompiledModel {
 public:
  ~CompiledModel();

  /// Compiles for the shapes of `inputs` unless already compiled. When the
  /// JIT cannot lower some ops, the model moves to the interpreter with a
  /// notice naming them, or fails if the session forbids falling back.
  Status prepare(const std::vector<Tensor>& inputs);

  /// Runs on `inputs`, compiling first when needed (a function run in
  /// stages compiles some parts during the run; ops the JIT cannot lower
  /// found there move the model to the interpreter as prepare's do). With
  /// donated arguments the inputs are left alone (their copies are updated).
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);
  /// Runs and writes each donated argument's new value into `inputs`, in
  /// place where the memory plan allows (codegen::CpuExecutor::runInPlace);
  /// the donated results come back empty.
  ///
  /// On CUDA, `next` (the next runInPlace's inputs; null entries skipped)
  /// are copied to the device while this run computes
  /// (cuda::CudaRunner::runInPlace); ignored elsewhere.
  Expected<std::vector<Tensor>> runInPlace(std::vector<Tensor>& inputs,
                                           const std::vector<const Tensor*>* next = nullptr);
  /// Brings donated values kept on the device (keepDonatedOnDevice) back
  /// into the host tensors runInPlace was given; nothing to do elsewhere.
  Status syncDonated();

  /// True when the model runs on the reference interpreter.
  bool interpreted() const { return !executor_ && !cudaExecutor_; }
  /// The ops that sent the model to the interpreter, as `name (why)`.
  const std::vector<std::string>& unsupportedOps() const { return unsupported_; }
  /// The JIT's executor (kernel IR, memory plans, `.kc` code), or null on the
  /// interpreter.
  codegen::CpuExecutor* executor() const { return executor_.get(); }
  /// The CUDA executor on a CUDA session, else null.
  codegen::CudaExecutor* cudaExecutor() const { return cudaExecutor_.get(); }
  /// The function run: the one compiled, or its autocast copy under
  /// `--precision bf16|fp16`.
  const Function& function() const { return *function_; }

 private:
  friend class Session;
  CompiledModel(Session& session, const Function& f, std::vector<ResultAlias> aliases);
  void fallBack();
  /// After a failed run: whether it failed on ops the JIT cannot lower
  /// (found during a staged run) and the model moved to the interpreter.
  bool fellBackInRun();

  Session& session_;
  /// The autocast copy of the function compiled, under bf16 or fp16.
  std::unique_ptr<Module> autocast_;
  const Function* function_;
  std::vector<ResultAlias> aliases_;
  std::unique_ptr<codegen::CpuExecutor> executor_;
  std::unique_ptr<codegen::CudaExecutor> cudaExecutor_;
  std::vector<std::string> unsupported_;
};

class Session {
 public:
  /// A session on `options.device`; an unusable or malformed device is an
  /// error (DeviceError::usage tells a malformed value apart).
  static std::variant<std::unique_ptr<Session>, DeviceError> create(SessionOptions options);

  /// Compiles `f` (which must outlive the result) for this session's
  /// device. Nothing is compiled until the first prepare() or run().
  Expected<std::unique_ptr<CompiledModel>> compile(const Function& f, const CompileOptions& options = {});
  /// A model that runs on `executor` (a `.kc` file's stored program), for
  /// `f`, its optimized function (which must outlive the result).
  std::unique_ptr<CompiledModel> adopt(const Function& f, std::unique_ptr<codegen::CpuExecutor> executor);
  std::unique_ptr<CompiledModel> adopt(const Function& f, std::unique_ptr<codegen::CudaExecutor> executor);
  /// The CUDA device's context (on a CUDA session).
  Expected<std::shared_ptr<cuda::CudaContext>> cudaContext();

  /// The evaluator passes and importers fold constants with: the
  /// interpreter's kernels, so folding and running never disagree.
  static const OpEvaluator& evaluator();

  const DeviceChoice& device() const { return device_; }
  const SessionOptions& options() const { return options_; }

  /// Notices since the last call, for the tool to print; safe to call from
  /// any thread.
  std::vector<std::string> takeNotices();
  void addNotice(std::string notice);

  /// The precision models compile for: options().precision, or fp32 where
  /// the CPU lacks its instructions or has no TF32 (with one notice).
  Precision effectivePrecision();

 private:
  Session(SessionOptions options, DeviceChoice device) : options_(std::move(options)), device_(std::move(device)) {}

  SessionOptions options_;
  DeviceChoice device_;
  std::mutex noticesMutex_;
  std::vector<std::string> notices_;
  std::once_flag precisionChecked_;
  Precision effectivePrecision_ = Precision::FP32;
};

}  // namespace kiln
