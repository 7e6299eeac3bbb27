// The session of Session.h: the evaluator, notices and the
// JIT-or-interpreter rule, in one place for every command (its device comes
// from Device.h).
#include "driver/Session.h"

#include <optional>
#include <sstream>

#include "passes/PassManager.h"
#include "runtime/HostCpu.h"
#include "runtime/Interpreter.h"

namespace kiln {

std::variant<std::unique_ptr<Session>, DeviceError> Session::create(SessionOptions options) {
  // TF32 is the CUDA libraries' choice when a runner is made: for the
  // models this session compiles and for stored programs it adopts.
  if (options.precision == Precision::TF32) options.cuda.run.allowTf32 = true;
  std::string notice;
  auto device = resolveDevice(options.device, &notice);
  if (auto* error = std::get_if<DeviceError>(&device)) return std::move(*error);
  std::unique_ptr<Session> session(new Session(std::move(options), std::get<DeviceChoice>(device)));
  if (!notice.empty()) session->addNotice(notice);
  return session;
}

const OpEvaluator& Session::evaluator() { return interpreterEvaluator(); }

std::vector<std::string> Session::takeNotices() {
  std::lock_guard<std::mutex> lock(noticesMutex_);
  return std::exchange(notices_, {});
}

void Session::addNotice(std::string notice) {
  std::lock_guard<std::mutex> lock(noticesMutex_);
  notices_.push_back(std::move(notice));
}

Status autocastModule(Module& m, Precision precision) {
  if (!autocastDType(precision)) return Status::success();
  PassContext ctx;
  ctx.evaluator = &Session::evaluator();
  ctx.precision = precision;
  PassManager pm({}, ctx);
  KILN_TRY(pm.addPipeline("autocast,canonicalize,cse,dce"));
  std::ostringstream log;
  return pm.run(m, log);
}

std::string cpuPrecisionNotice(Precision precision) {
  if (precision == Precision::TF32) return "--precision tf32: the CPU has no TF32; it computes in f32";
  // The CPU JIT's low precision is oneDNN's, which needs the instructions.
  const std::set<std::string> cpu = hostCpuFeatures();
  std::string missing;
  if (precision == Precision::BF16 && !cpu.count("avx512bf16") && !cpu.count("amx-bf16"))
    missing = "AVX-512 BF16 or AMX-BF16";
  if (precision == Precision::FP16 && !cpu.count("avx512fp16") && !cpu.count("amx-fp16"))
    missing = "AVX-512 FP16 or AMX-FP16";
  if (missing.empty()) return "";
  return "--precision " + std::string(precisionName(precision)) + ": this CPU has no " + missing +
         " instructions, so it computes in f32";
}

Precision Session::effectivePrecision() {
  std::call_once(precisionChecked_, [&] {
    effectivePrecision_ = options_.precision;
    // The interpreter computes any precision; CUDA's are the GPU's.
    if (options_.interpret || device_.kind == DeviceChoice::Kind::Cuda) return;
    if (std::string notice = cpuPrecisionNotice(options_.precision); !notice.empty()) {
      addNotice(std::move(notice));
      effectivePrecision_ = Precision::FP32;
    }
  });
  return effectivePrecision_;
}

Expected<std::unique_ptr<CompiledModel>> Session::compile(const Function& f, const CompileOptions& options) {
  std::unique_ptr<CompiledModel> model(new CompiledModel(*this, f, options.aliases));
  if (const Precision precision = effectivePrecision(); autocastDType(precision)) {
    // One autocast for every backend and the interpreter: the same casts,
    // so the interpreter stays the reference.
    std::unique_ptr<Module> copy = codegen::cloneFunction(f);
    KILN_TRY(autocastModule(*copy, precision));
    model->function_ = copy->functions().front().get();
    model->autocast_ = std::move(copy);
  }
  const Function& source = *model->function_;
  if (options_.interpret) return model;
  if (device_.kind == DeviceChoice::Kind::Cuda) {
    auto context = cudaContext();
    if (!context) return context.takeError();
    codegen::CudaOptions cuda = options_.cuda;
    cuda.precision = effectivePrecision();
    cuda.aliases = options.aliases;
    cuda.run.keepDonated = options.keepDonatedOnDevice;
    auto executor = codegen::CudaExecutor::create(source, std::move(*context), std::move(cuda));
    if (!executor) return executor.takeError();
    model->cudaExecutor_ = std::move(*executor);
    return model;
  }
  codegen::CpuOptions cpu = options_.cpu;
  if (options.threads > 0) cpu.threads = options.threads;
  cpu.aliases = options.aliases;
  cpu.precision = effectivePrecision();
  auto executor = codegen::CpuExecutor::create(source, cpu);
  if (!executor) return executor.takeError();
  model->executor_ = std::move(*executor);
  return model;
}

std::unique_ptr<CompiledModel> Session::adopt(const Function& f, std::unique_ptr<codegen::CpuExecutor> executor) {
  std::unique_ptr<CompiledModel> model(new CompiledModel(*this, f, {}));
  if (!options_.interpret) model->executor_ = std::move(executor);
  return model;
}

std::unique_ptr<CompiledModel> Session::adopt(const Function& f, std::unique_ptr<codegen::CudaExecutor> executor) {
  std::unique_ptr<CompiledModel> model(new CompiledModel(*this, f, {}));
  model->cudaExecutor_ = std::move(executor);
  return model;
}

Expected<std::shared_ptr<cuda::CudaContext>> Session::cudaContext() {
  if (device_.kind != DeviceChoice::Kind::Cuda) return Error("the session runs on " + device_.str() + ", not CUDA");
  auto context = cuda::CudaContext::get(device_.cuda, cuda::LibrarySearchOptions::fromEnvironment());
  if (context && options_.cudaMemoryLimit) (*context)->allocator().setLimit(*options_.cudaMemoryLimit);
  return context;
}

CompiledModel::CompiledModel(Session& session, const Function& f, std::vector<ResultAlias> aliases)
    : session_(session), function_(&f), aliases_(std::move(aliases)) {}
CompiledModel::~CompiledModel() = default;

void CompiledModel::fallBack() {
  std::string notice = "the CPU JIT cannot compile this model yet, so it runs on the reference interpreter:";
  for (const std::string& op : unsupported_) notice += "\n  " + op;
  session_.addNotice(std::move(notice));
  executor_.reset();
}

Status CompiledModel::prepare(const std::vector<Tensor>& inputs) {
  // CUDA never falls back: an op it cannot lower is an error naming it.
  if (cudaExecutor_) return cudaExecutor_->prepare(inputs);
  if (!executor_) return {};
  Status prepared = executor_->prepare(inputs);
  for (std::string& notice : executor_->takeNotices()) session_.addNotice(std::move(notice));
  if (prepared) return prepared;
  // Only ops the JIT cannot lower yet fall back, and never silently.
  if (executor_->unsupportedOps().empty() || !session_.options().allowFallback) return prepared;
  unsupported_ = executor_->unsupportedOps();
  fallBack();
  return {};
}

bool CompiledModel::fellBackInRun() {
  // A function run in stages (data-dependent ops, control flow) compiles
  // the parts whose shapes only a run gives during that run
  // (docs/codegen.md sections 6 and 7); an op the JIT cannot lower there
  // sends the model to the interpreter as one found by prepare does. Such
  // a function takes no donated arguments, so the failed run changed none.
  if (!executor_ || executor_->unsupportedOps().empty() || !session_.options().allowFallback) return false;
  unsupported_ = executor_->unsupportedOps();
  fallBack();
  return true;
}

Expected<std::vector<Tensor>> CompiledModel::run(const std::vector<Tensor>& inputs) {
  // Compiled shapes run straight away; a new one compiles first, which may
  // send the model to the interpreter.
  if (cudaExecutor_) return cudaExecutor_->run(inputs);
  if (!executor_ || !executor_->isCompiled(inputs)) KILN_TRY(prepare(inputs));
  if (executor_) {
    auto results = executor_->run(inputs);
    if (results || !fellBackInRun()) return results;
  }
  return interpret(*function_, inputs);
}

Expected<std::vector<Tensor>> CompiledModel::runInPlace(std::vector<Tensor>& inputs,
                                                        const std::vector<const Tensor*>* next) {
  if (cudaExecutor_) return cudaExecutor_->runInPlace(inputs, next);
  if (!executor_ || !executor_->isCompiled(inputs)) KILN_TRY(prepare(inputs));
  if (executor_) {
    auto results = executor_->runInPlace(inputs);
    if (results || !fellBackInRun()) return results;
  }
  auto results = interpret(*function_, inputs);
  if (!results) return results;
  for (const ResultAlias& a : aliases_) inputs[a.argument] = std::exchange((*results)[a.result], Tensor());
  return results;
}

Status CompiledModel::syncDonated() {
  return cudaExecutor_ ? cudaExecutor_->syncDonated() : Status::success();
}

}  // namespace kiln
