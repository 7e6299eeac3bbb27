// The CPU executor of CpuExecutable.h: a cache of compiled programs, one
// per set of input shapes, each with its runner.
#include "codegen/cpu/CpuExecutable.h"

#include <chrono>
#include <sstream>

#include "codegen/Backend.h"
#include "codegen/KernelCache.h"
#include "codegen/cpu/CpuBackend.h"
#include "codegen/cpu/CpuCompiler.h"
#include "codegen/Stages.h"
#include "codegen/llvm/CpuJit.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/MemoryPlan.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "runtime/KcFile.h"

namespace kiln::codegen {

struct CompiledFunction {
  /// The optimized module and the compiler's view of it (kernel IR, memory
  /// plan); empty for a program run from a file.
  std::unique_ptr<Module> module;
  std::vector<kir::Kernel> kernels;
  std::optional<MemoryPlan> plan;
  std::shared_ptr<const Program> program;
  std::unique_ptr<CpuRunner> runner;
};

std::unique_ptr<Module> cloneFunction(const Function& f) {
  auto module = std::make_unique<Module>();
  module->addFunction(f.clone());
  return module;
}

Expected<std::unique_ptr<Module>> specializeAndOptimize(const Function& source, const std::vector<TensorType>& types,
                                                        const std::vector<ResultAlias>& aliases, const Backend& backend,
                                                        int optLevel, CompileReport* report) {
  if (optLevel < 0 || optLevel > 3)
    return Error("unknown optimization level -O" + std::to_string(optLevel) + "; expected -O0 to -O3");
  std::unique_ptr<Module> module = cloneFunction(source);
  Module& m = *module;
  Function& f = *m.functions().front();
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i].dtype != f.argument(i)->type().dtype)
      return Error("input " + std::to_string(i) + " of '" + f.name() + "' is " + types[i].str() + ", expected " +
                   f.argument(i)->type().str());
    f.argument(i)->setType(types[i]);
  }
  KILN_TRY(checkAliases(f, aliases));
  for (const ResultAlias& a : aliases) f.setResultAlias(a.result, static_cast<int>(a.argument));
  PassContext passContext;
  passContext.evaluator = &interpreterEvaluator();
  passContext.target = &backend.target();
  PassManagerOptions passOptions;
  passOptions.timePasses = report != nullptr;
  PassManager pm(passOptions, passContext);
  KILN_TRY(pm.addPipeline(backend.pipeline(optLevel)));
  std::ostringstream log;
  const auto passStart = std::chrono::steady_clock::now();
  KILN_TRY(pm.run(m, log));
  KILN_TRY(verify(m));
  if (report) {
    report->passes += std::chrono::duration<double>(std::chrono::steady_clock::now() - passStart).count();
    report->passTimings += log.str();
  }
  return module;
}

Expected<std::vector<kir::Kernel>> lowerToKernels(const Function& f, const std::vector<TensorType>& types,
                                                  const Backend& backend, int optLevel,
                                                  std::unique_ptr<Module>* optimized) {
  if (types.size() != f.numArguments())
    return Error("function '" + f.name() + "' takes " + std::to_string(f.numArguments()) + " inputs, got " +
                 std::to_string(types.size()));
  auto module = specializeAndOptimize(f, types, {}, backend, optLevel, nullptr);
  if (!module) return module.takeError();
  auto steps = lowerForBackend(*(*module)->functions().front(), backend, "kiln_");
  if (!steps) return steps.takeError();
  std::vector<kir::Kernel> kernels;
  for (LoweredStep& step : *steps)
    if (step.kind == LoweredStep::Kind::Kernel) kernels.push_back(std::move(step.kernel));
  if (optimized) *optimized = std::move(*module);
  return kernels;
}

CpuExecutor::CpuExecutor(std::unique_ptr<Module> module, CpuOptions options)
    : module_(std::move(module)),
      options_(options),
      threads_(options.threads > 0 ? options.threads : defaultThreads()),
      kernelCache_(std::make_unique<KernelCache>(options.cacheDir)) {}
CpuExecutor::~CpuExecutor() = default;

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::create(const Function& f, CpuOptions options) {
  auto jit = CpuJit::create();
  if (!jit) return jit.takeError();
  std::unique_ptr<CpuExecutor> executor(new CpuExecutor(cloneFunction(f), options));
  executor->jit_ = std::move(*jit);
  // Each part of a staged function is compiled by an executor of its own,
  // per set of argument shapes; none takes donated arguments (refused).
  auto staged = StagedExecutors<CpuExecutor>::create(*executor->module_->functions().front(), !options.aliases.empty(),
                                                     [&](const Function& part) { return create(part, options); });
  if (!staged) return staged.takeError();
  executor->staged_ = std::move(*staged);
  return executor;
}

Error CpuExecutor::notOneProgram() const {
  if (stored_)
    return Error("this model runs a stored program with host steps (a .kc file), which keeps no kernel IR, memory plan "
                 "or module of its own to query");
  return codegen::notOneProgram(module_->functions().front()->name(), staged_->stages());
}

Status CpuExecutor::addCompiled(std::unique_ptr<CompiledFunction> compiled) {
  // Cached under the static shapes of the program's arguments.
  ShapeCache<CompiledFunction>::Shapes shapes;
  for (const Program::Argument& a : compiled->program->arguments) shapes.push_back(staticDims(a.type.shape));
  cache_.add(std::move(shapes), std::move(compiled));
  return {};
}

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::createOptimized(const Function& optimized, CpuOptions options) {
  for (size_t i = 0; i < optimized.numArguments(); ++i)
    if (!optimized.argument(i)->type().isStatic())
      return Error("argument " + std::to_string(i) + " of the optimized function '" + optimized.name() + "' has type " +
                   optimized.argument(i)->type().str() + "; an optimized function has static shapes");
  auto executor = create(optimized, options);
  if (!executor) return executor.takeError();
  auto compiled = (*executor)->finish(cloneFunction(optimized));
  if (!compiled) return compiled.takeError();
  KILN_TRY((*executor)->addCompiled(std::move(*compiled)));
  return executor;
}

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::fromProgram(std::shared_ptr<const Program> program,
                                                                CpuOptions options) {
  std::unique_ptr<CpuExecutor> executor(new CpuExecutor(nullptr, options));
  const auto start = std::chrono::steady_clock::now();
  auto runner = CpuRunner::create(program, executor->threads_, options.profile, options.memory);
  if (!runner) return runner.takeError();
  if (options.report) {
    options.report->link += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    options.report->kernels += static_cast<int>(program->kernelNames.size());
    options.report->storedModules += program->sharedObject.empty() ? 0 : 1;
  }
  auto compiled = std::make_unique<CompiledFunction>();
  compiled->program = std::move(program);
  compiled->runner = std::move(*runner);
  KILN_TRY(executor->addCompiled(std::move(compiled)));
  return executor;
}

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::fromStaged(std::shared_ptr<const StagedProgram> program,
                                                               CpuOptions options) {
  std::unique_ptr<CpuExecutor> executor(new CpuExecutor(nullptr, options));
  const auto start = std::chrono::steady_clock::now();
  auto stored = StagedRunner::create(program, [&](size_t i) -> Expected<std::unique_ptr<LoadedProgram>> {
    auto part = CpuRunner::create(std::shared_ptr<const Program>(program, &program->programs[i]), executor->threads_,
                                  options.profile, options.memory);
    if (!part) return part.takeError();
    return std::unique_ptr<LoadedProgram>(std::move(*part));
  });
  if (!stored) return stored.takeError();
  if (options.report) {
    options.report->link += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const Program& p : program->programs) {
      options.report->kernels += static_cast<int>(p.kernelNames.size());
      options.report->storedModules += p.sharedObject.empty() ? 0 : 1;
    }
  }
  executor->stored_ = std::move(*stored);
  return executor;
}

bool CpuExecutor::isCompiled(const std::vector<Tensor>& inputs) {
  if (stored_) return true;
  // With stages, the suffix's shapes depend on values: never all compiled
  // before a run.
  if (staged_) return false;
  return cache_.find(inputs) != nullptr;
}

Expected<CompiledFunction*> CpuExecutor::compiled(const std::vector<Tensor>& inputs) {
  return cache_.getOrCompile(inputs, [&] { return compile(inputs); });
}

Expected<std::unique_ptr<CompiledFunction>> CpuExecutor::compile(const std::vector<Tensor>& inputs) {
  if (!module_) {
    // A stored program runs only the shapes it was compiled for.
    const Program& p = *cache_.entries().begin()->second->program;
    if (inputs.size() != p.arguments.size())
      return Error("'" + p.name + "' takes " + std::to_string(p.arguments.size()) + " inputs, got " +
                   std::to_string(inputs.size()));
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].type() != p.arguments[i].type)
        return Error("input " + std::to_string(i) + " ('" + p.arguments[i].name + "') of '" + p.name + "' is " +
                     inputs[i].type().str() + ", but the program was compiled for " + p.arguments[i].type.str());
    return Error("the compiled program of '" + p.name + "' does not take these inputs");
  }
  const Function& source = *module_->functions().front();
  if (inputs.size() != source.numArguments())
    return Error("function '" + source.name() + "' takes " + std::to_string(source.numArguments()) + " inputs, got " +
                 std::to_string(inputs.size()));
  unsupported_.clear();
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  auto module =
      specializeAndOptimize(source, types, options_.aliases, cpuBackend(), options_.optLevel, options_.report);
  if (!module) return module.takeError();
  return finish(std::move(*module));
}

Expected<std::unique_ptr<CompiledFunction>> CpuExecutor::finish(std::unique_ptr<Module> optimized) {
  auto compiled = std::make_unique<CompiledFunction>();
  compiled->module = std::move(optimized);
  KILN_TRY(verify(*compiled->module));
  const Function& f = *compiled->module->functions().front();
  CpuCompileOptions options;
  // Kernel names differ between the shape sets of one executor, as they
  // always have; each program has a shared object of its own.
  options.kernelPrefix = "kiln" + std::to_string(compiledCount_) + "_";
  options.threads = options_.threads;
  options.cache = kernelCache_.get();
  options.report = options_.report;
  std::vector<std::string> unsupported;
  auto compilation = compileCpuProgram(f, *jit_, options, &unsupported);
  if (!compilation) {
    if (unsupported.empty()) return compilation.takeError();
    unsupported_ = unsupported;
    std::string list;
    for (const std::string& u : unsupported) list += (list.empty() ? "" : "; ") + u;
    return Error("the CPU JIT cannot compile '" + f.name() + "': " + list);
  }
  const auto loadStart = std::chrono::steady_clock::now();
  auto runner = CpuRunner::create(compilation->program, threads_, options_.profile, options_.memory);
  if (!runner) return runner.takeError();
  if (options_.report)
    options_.report->link += std::chrono::duration<double>(std::chrono::steady_clock::now() - loadStart).count();
  compiled->kernels = std::move(compilation->kernels);
  compiled->plan = std::move(compilation->plan);
  compiled->program = std::move(compilation->program);
  compiled->runner = std::move(*runner);
  ++compiledCount_;
  return compiled;
}

Expected<std::pair<const Module*, std::shared_ptr<const Program>>> CpuExecutor::compiledProgram(
    const std::vector<Tensor>& inputs) {
  if (staged_ || stored_) return notOneProgram();
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return std::make_pair(static_cast<const Module*>((*c)->module.get()), (*c)->program);
}

std::vector<std::string> CpuExecutor::takeNotices() {
  std::vector<std::string> notices = kernelCache_->takeNotices();
  if (staged_)
    for (CpuExecutor* part : staged_->parts())
      for (std::string& n : part->takeNotices()) notices.push_back(std::move(n));
  return notices;
}

Status CpuExecutor::prepare(const std::vector<Tensor>& inputs) {
  // With stages, only the prefix's shapes are known before a run, and the
  // bodies' whose arguments have static shapes (StagedExecutors::prepare).
  if (staged_) return staged_->prepare(inputs, unsupported_);
  if (stored_) return {};  // its parts check their inputs when run
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return {};
}

Expected<std::vector<Tensor>> CpuExecutor::run(const std::vector<Tensor>& inputs) {
  if (staged_) return staged_->run(inputs, unsupported_);
  if (stored_) return stored_->run(inputs);
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return (*c)->runner->run(inputs);
}

Expected<std::vector<Tensor>> CpuExecutor::runInPlace(std::vector<Tensor>& inputs) {
  if (staged_) return staged_->run(inputs, unsupported_);  // no donated arguments (refused by create)
  if (stored_) return stored_->run(inputs);
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return (*c)->runner->runInPlace(inputs);
}

Expected<std::string> CpuExecutor::kernelIR(const std::vector<Tensor>& inputs) {
  if (staged_ || stored_) return notOneProgram();
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  if (!(*c)->module) return Error("a compiled program from a file does not keep its kernel IR");
  // The steps again, with the kernels under the names they were compiled
  // with, less the views that run no step.
  auto steps = lowerForBackend(*(*c)->module->functions().front(), cpuBackend(), "");
  if (!steps) return steps.takeError();
  std::vector<LoweredStep> run;
  size_t next = 0;
  bool checksPending = false;
  for (LoweredStep& step : *steps) {
    if ((*c)->plan && elidedAsView(step, *(*c)->plan, checksPending)) continue;
    checksPending = step.kind == LoweredStep::Kind::Check;
    if (step.kind == LoweredStep::Kind::Kernel) {
      if (next >= (*c)->kernels.size()) return Error("the compiled program has fewer kernels than its steps");
      step.kernel = (*c)->kernels[next++];
    }
    run.push_back(std::move(step));
  }
  return printSteps(run, [](const LibraryCall& call) { return cpuBackend().describeLibraryCall(call); });
}

Expected<std::string> CpuExecutor::llvmIR(const std::vector<Tensor>& inputs) {
  if (staged_ || stored_) return notOneProgram();
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  if (!(*c)->module) return Error("a compiled program from a file does not keep its kernel IR");
  return jit_->optimizedIR((*c)->kernels);
}

Expected<MemoryPlan> CpuExecutor::memoryPlan(const std::vector<Tensor>& inputs) {
  if (staged_ || stored_) return notOneProgram();
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  if (!(*c)->plan) return Error("a compiled program from a file does not keep its memory plan's values");
  return *(*c)->plan;
}

size_t CpuExecutor::numKernels(const std::vector<Tensor>& inputs) {
  if (staged_ || stored_) return 0;
  auto c = compiled(inputs);
  return c ? (*c)->program->steps.size() : 0;
}

Expected<std::string> CpuExecutor::stagedArtifact(const std::vector<Tensor>& inputs, std::string* planText) {
  const Function& f = *module_->functions().front();
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  // Every part through the pipeline and compiled by this executor's JIT,
  // each into a shared object of its own.
  PartCompiler compile = [&](const Function& part, const std::vector<TensorType>& partTypes,
                             size_t index) -> Expected<BackendProgram> {
    auto module = specializeAndOptimize(part, partTypes, {}, cpuBackend(), options_.optLevel, options_.report);
    if (!module) return module.takeError();
    CpuCompileOptions o;
    o.kernelPrefix = "kiln_part" + std::to_string(index) + "_";
    o.threads = options_.threads;
    o.cache = kernelCache_.get();
    o.report = options_.report;
    auto compilation = compileCpuProgram(*(*module)->functions().front(), *jit_, o, &unsupported_);
    if (!compilation) return compilation.takeError();
    BackendProgram out;
    out.device = std::string(kHostDevice);
    out.program = std::move(compilation->program);
    out.plan = std::move(compilation->plan);
    return out;
  };
  auto staged = compileStagedProgram(f, types, compile);
  if (!staged) return staged.takeError();
  if (planText) *planText = staged->plans;
  return serializeStagedArtifact(f, *staged->program, options_.optLevel, staged->plans, kHostDevice,
                                 CpuJit::hostTarget(), std::string(kCpuCodegenVersion), options_.precision);
}

Expected<std::string> CpuExecutor::artifact(const std::vector<Tensor>& inputs, std::string* planText) {
  if (staged_) return stagedArtifact(inputs, planText);
  if (stored_) return Error("this model runs a stored program (a .kc file), which keeps its own file; copy that file");
  auto compiled = compiledProgram(inputs);
  if (!compiled) return compiled.takeError();
  const Function& optimized = *compiled->first->functions().front();
  auto plan = planMemory(optimized);
  if (!plan) return plan.takeError();
  // The names the stored module's text gives the values.
  const auto printedNames = printedValueNames(optimized);
  for (MemoryPlan::Buffer& b : plan->buffers)
    if (auto it = printedNames.find(b.value); it != printedNames.end()) b.name = it->second;
  const std::string text = plan->str();
  if (planText)
    *planText = "memory plan @" + optimized.name() + ": " + std::to_string(plan->numKernels) + " kernels\n" + text;
  return serializeArtifact(optimized, *compiled->second, options_.optLevel, text, kHostDevice, {}, options_.precision);
}

}  // namespace kiln::codegen
