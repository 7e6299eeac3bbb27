// The session of Session.h: device resolution, the evaluator, notices and
// the JIT-or-interpreter rule, in one place for every command.
#include "codegen/Session.h"

#include <charconv>
#include <optional>

#include "runtime/Interpreter.h"

namespace kiln {

std::string DeviceChoice::str() const {
  if (kind == Kind::Cpu) return "cpu";
  return "cuda:" + std::to_string(cuda.index) + " (" + cuda.name + ")";
}

namespace {

/// The N of `cuda:N`, or nullopt when `digits` is not a whole number from 0
/// to kMaxDeviceIndex.
constexpr int kMaxDeviceIndex = 1 << 20;
std::optional<int> parseDeviceIndex(std::string_view digits) {
  int value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 0 ||
      value > kMaxDeviceIndex)
    return std::nullopt;
  return value;
}

}  // namespace

std::variant<DeviceChoice, DeviceError> resolveDevice(const std::string& spec, std::string* notice) {
  cuda::LibrarySearchOptions options = cuda::LibrarySearchOptions::fromEnvironment();
  if (spec == "cpu") return DeviceChoice{};
  if (spec == "auto") {
    cuda::CudaReport report = cuda::probeCuda(options);
    if (!report.usable()) {
      // One line; the missing driver's full search is for `kiln devices`.
      std::string reason = report.problem == cuda::CudaProblem::NoDriver
                               ? "no NVIDIA driver: libcuda.so.1 could not be loaded"
                               : report.message;
      if (!reason.empty() && reason.back() == '.') reason.pop_back();
      if (notice) *notice = "--device auto chose cpu (CUDA is not usable: " + reason + "; `kiln devices` tells more)";
      return DeviceChoice{};
    }
    DeviceChoice choice{DeviceChoice::Kind::Cuda, report.devices[static_cast<size_t>(report.usableDevices().front())]};
    if (notice) *notice = "--device auto chose " + choice.str();
    return choice;
  }
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    std::optional<int> index;
    if (spec != "cuda") {
      index = parseDeviceIndex(std::string_view(spec).substr(5));
      if (!index)
        return DeviceError{true, Error("the device index in --device cuda:N expects a whole number from 0 to " +
                                       std::to_string(kMaxDeviceIndex) + ", got '" + spec.substr(5) + "'")};
    }
    auto device = cuda::requireCudaDevice(options, index);
    if (!device) return DeviceError{false, Error("--device " + spec + ": " + device.error().message())};
    return DeviceChoice{DeviceChoice::Kind::Cuda, *device};
  }
  return DeviceError{true, Error("unknown device '" + spec + "' (valid devices: cpu, cuda, cuda:N, auto)")};
}

std::variant<std::unique_ptr<Session>, DeviceError> Session::create(SessionOptions options) {
  std::string notice;
  auto device = resolveDevice(options.device, &notice);
  if (auto* error = std::get_if<DeviceError>(&device)) return std::move(*error);
  std::unique_ptr<Session> session(new Session(std::move(options), std::get<DeviceChoice>(device)));
  if (!notice.empty()) session->addNotice(notice);
  return session;
}

const OpEvaluator& Session::evaluator() {
  static const InterpreterEvaluator evaluator;
  return evaluator;
}

std::vector<std::string> Session::takeNotices() {
  std::lock_guard<std::mutex> lock(noticesMutex_);
  return std::exchange(notices_, {});
}

void Session::addNotice(std::string notice) {
  std::lock_guard<std::mutex> lock(noticesMutex_);
  notices_.push_back(std::move(notice));
}

Expected<std::unique_ptr<CompiledModel>> Session::compile(const Function& f, const CompileOptions& options) {
  std::unique_ptr<CompiledModel> model(new CompiledModel(*this, f, options.aliases));
  if (options_.interpret) return model;
  if (device_.kind == DeviceChoice::Kind::Cuda) {
    auto context = cudaContext();
    if (!context) return context.takeError();
    codegen::CudaOptions cuda = options_.cuda;
    cuda.aliases = options.aliases;
    cuda.run.keepDonated = options.keepDonatedOnDevice;
    auto executor = codegen::CudaExecutor::create(f, std::move(*context), std::move(cuda));
    if (!executor) return executor.takeError();
    model->cudaExecutor_ = std::move(*executor);
    return model;
  }
  codegen::CpuOptions cpu = options_.cpu;
  if (options.threads > 0) cpu.threads = options.threads;
  cpu.aliases = options.aliases;
  auto executor = codegen::CpuExecutor::create(f, cpu);
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
    : session_(session), function_(f), aliases_(std::move(aliases)) {}
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
  return interpret(function_, inputs);
}

Expected<std::vector<Tensor>> CompiledModel::runInPlace(std::vector<Tensor>& inputs,
                                                        const std::vector<const Tensor*>* next) {
  if (cudaExecutor_) return cudaExecutor_->runInPlace(inputs, next);
  if (!executor_ || !executor_->isCompiled(inputs)) KILN_TRY(prepare(inputs));
  if (executor_) {
    auto results = executor_->runInPlace(inputs);
    if (results || !fellBackInRun()) return results;
  }
  auto results = interpret(function_, inputs);
  if (!results) return results;
  for (const ResultAlias& a : aliases_) inputs[a.argument] = std::exchange((*results)[a.result], Tensor());
  return results;
}

Status CompiledModel::syncDonated() {
  return cudaExecutor_ ? cudaExecutor_->syncDonated() : Status::success();
}

}  // namespace kiln
