// CudaExecutor (CudaExecutor.h).
#include "codegen/cuda/CudaExecutor.h"

#include <chrono>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaBackend.h"
#include "codegen/Stages.h"
#include "codegen/cuda/CudaCompiler.h"
#include "ir/Printer.h"
#include "runtime/KcFile.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::codegen {

struct CudaExecutor::Compiled {
  std::unique_ptr<Module> module;  // null for a stored program
  std::optional<MemoryPlan> plan;
  std::shared_ptr<const cuda::CudaProgram> program;
  std::unique_ptr<cuda::CudaRunner> runner;
};

CudaExecutor::CudaExecutor() = default;
CudaExecutor::~CudaExecutor() = default;

Expected<std::unique_ptr<CudaExecutor>> CudaExecutor::create(const Function& f,
                                                             std::shared_ptr<cuda::CudaContext> context,
                                                             CudaOptions options) {
  std::unique_ptr<CudaExecutor> e(new CudaExecutor());
  e->module_ = cloneFunction(f);
  e->context_ = std::move(context);
  e->options_ = std::move(options);
  // Every part of a staged function is a CUDA program of its own, on the
  // same device; none takes donated arguments (refused).
  auto staged = StagedExecutors<CudaExecutor>::create(
      *e->module_->functions().front(), !e->options_.aliases.empty(),
      [&](const Function& part) { return create(part, e->context_, e->options_); });
  if (!staged) return staged.takeError();
  e->staged_ = std::move(*staged);
  return e;
}

Expected<std::unique_ptr<CudaExecutor>> CudaExecutor::fromProgram(std::shared_ptr<const cuda::CudaProgram> program,
                                                                  std::shared_ptr<cuda::CudaContext> context,
                                                                  CudaOptions options) {
  std::unique_ptr<CudaExecutor> e(new CudaExecutor());
  e->context_ = std::move(context);
  e->options_ = std::move(options);
  auto compiled = std::make_unique<Compiled>();
  auto runner = cuda::CudaRunner::create(program, e->context_, e->options_.run);
  if (!runner) return runner.takeError();
  compiled->runner = std::move(*runner);
  ShapeCache<Compiled>::Shapes shapes;
  for (const Program::Argument& a : program->plan.arguments) shapes.push_back(staticDims(a.type.shape));
  compiled->program = std::move(program);
  e->cache_.add(std::move(shapes), std::move(compiled));
  return e;
}

Expected<std::unique_ptr<CudaExecutor>> CudaExecutor::fromStaged(std::shared_ptr<const StagedProgram> program,
                                                                 std::shared_ptr<cuda::CudaContext> context,
                                                                 CudaOptions options) {
  std::unique_ptr<CudaExecutor> e(new CudaExecutor());
  e->context_ = std::move(context);
  e->options_ = std::move(options);
  auto parts = cuda::cudaPartsOf(*program, "the stored program '" + program->name + "'");
  if (!parts) return parts.takeError();
  auto stored = StagedRunner::create(program, [&](size_t i) -> Expected<std::unique_ptr<LoadedProgram>> {
    auto part = cuda::CudaRunner::create((*parts)[i], e->context_, e->options_.run);
    if (!part) return part.takeError();
    return std::unique_ptr<LoadedProgram>(std::move(*part));
  });
  if (!stored) return stored.takeError();
  e->stored_ = std::move(*stored);
  return e;
}

Expected<std::string> stagedCudaArtifact(const Function& f, const std::vector<TensorType>& types,
                                         const CudaCompilerOptions& options, int optLevel, CompileReport* report,
                                         std::string* plans, Precision precision) {
  const Backend& backend = cudaBackend();
  auto compiler = backend.createCompiler(&options);
  if (!compiler) return compiler.takeError();
  PartCompiler compile = [&](const Function& part, const std::vector<TensorType>& partTypes,
                             size_t) -> Expected<BackendProgram> {
    auto optimized = specializeAndOptimize(part, partTypes, {}, backend, optLevel, report);
    if (!optimized) return optimized.takeError();
    return (*compiler)->compile(*(*optimized)->functions().front(), nullptr);
  };
  auto staged = compileStagedProgram(f, types, compile);
  if (!staged) return staged.takeError();
  if (plans) *plans = staged->plans;
  return serializeStagedArtifact(f, *staged->program, optLevel, staged->plans, cuda::kCudaDevice, CpuMachine{},
                                 staged->program->programs.empty() ? std::string()
                                                                   : staged->program->programs[0].codegenVersion,
                                 precision);
}

Expected<CudaExecutor::Compiled*> CudaExecutor::compiled(const std::vector<Tensor>& inputs) {
  return cache_.getOrCompile(inputs, [&] { return compile(inputs); });
}

Expected<std::unique_ptr<CudaExecutor::Compiled>> CudaExecutor::compile(const std::vector<Tensor>& inputs) {
  if (!module_) {
    std::string compiledFor;
    for (const auto& [s, c] : cache_.entries())
      for (const Program::Argument& a : c->program->plan.arguments) compiledFor += (compiledFor.empty() ? "" : ", ") + a.type.str();
    return Error("the stored CUDA program was compiled for inputs " + compiledFor +
                 "; compile the model again for other shapes");
  }
  const Function& f = *module_->functions().front();
  if (inputs.size() != f.numArguments())
    return Error("'" + f.name() + "' takes " + std::to_string(f.numArguments()) + " inputs, got " +
                 std::to_string(inputs.size()));
  unsupported_.clear();
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  auto optimized = specializeAndOptimize(f, types, options_.aliases, cudaBackend(), options_.optLevel,
                                         options_.report);
  if (!optimized) return optimized.takeError();
  auto nvrtc = cuda::loadNvrtc(context_->searchOptions());
  if (!nvrtc) return nvrtc.takeError();
  CudaCompileOptions compileOptions;
  compileOptions.archs = options_.archs;
  if (compileOptions.archs.empty())
    compileOptions.archs = defaultCudaArchs(**nvrtc, context_->device().computeMajor, context_->device().computeMinor,
                                            &compileOptions.ptxArch);
  unsupported_.clear();
  auto compilation = compileCudaProgram(*(*optimized)->functions().front(), **nvrtc, compileOptions, &unsupported_);
  if (!compilation) return compilation.takeError();
  auto c = std::make_unique<Compiled>();
  c->module = std::move(*optimized);
  c->plan = std::move(compilation->plan);
  c->program = compilation->program;
  auto runner = cuda::CudaRunner::create(c->program, context_, options_.run);
  if (!runner) return runner.takeError();
  c->runner = std::move(*runner);
  return c;
}

Status CudaExecutor::prepare(const std::vector<Tensor>& inputs) {
  // With stages, the prefix and the bodies whose arguments have static
  // shapes compile now (StagedExecutors::prepare).
  if (staged_) return staged_->prepare(inputs, unsupported_);
  if (stored_) return Status::success();  // its parts check their inputs when run
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return Status::success();
}

Expected<std::vector<Tensor>> CudaExecutor::run(const std::vector<Tensor>& inputs) {
  if (staged_) return staged_->run(inputs, unsupported_);
  if (stored_) return stored_->run(inputs);
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return (*c)->runner->run(inputs);
}

Expected<std::vector<Tensor>> CudaExecutor::runInPlace(std::vector<Tensor>& inputs,
                                                       const std::vector<const Tensor*>* next) {
  if (staged_) return staged_->run(inputs, unsupported_);  // no donated arguments (refused by create)
  if (stored_) return stored_->run(inputs);
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  // Values kept on the device by the runner of other shapes come home first.
  for (const auto& [shapes, other] : cache_.entries())
    if (other.get() != *c) KILN_TRY(other->runner->syncDonated());
  // Staged only for a run of the same program.
  bool sameShapes = next && next->size() == inputs.size();
  for (size_t a = 0; sameShapes && a < inputs.size(); ++a)
    sameShapes = !(*next)[a] || (*next)[a]->shape() == inputs[a].shape();
  return (*c)->runner->runInPlace(inputs, sameShapes ? next : nullptr);
}

Status CudaExecutor::syncDonated() {
  for (const auto& [shapes, c] : cache_.entries()) KILN_TRY(c->runner->syncDonated());
  return Status::success();
}

Expected<std::pair<const Module*, std::shared_ptr<const cuda::CudaProgram>>> CudaExecutor::compiledProgram(
    const std::vector<Tensor>& inputs) {
  if (staged_) return notOneProgram(module_->functions().front()->name(), staged_->stages());
  if (stored_) return Error("a stored program with host steps keeps no module or program of its own");
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return std::make_pair(static_cast<const Module*>((*c)->module.get()), (*c)->program);
}

Expected<MemoryPlan> CudaExecutor::memoryPlan(const std::vector<Tensor>& inputs) {
  if (staged_) return notOneProgram(module_->functions().front()->name(), staged_->stages());
  if (stored_) return Error("a stored program keeps no memory plan");
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  if (!(*c)->plan) return Error("a stored program keeps no memory plan");
  return *(*c)->plan;
}

Expected<std::string> CudaExecutor::artifact(const std::vector<Tensor>& inputs) {
  if (staged_) {
    std::vector<TensorType> types;
    for (const Tensor& t : inputs) types.push_back(t.type());
    CudaCompilerOptions compilerOptions;
    compilerOptions.archs = options_.archs;
    compilerOptions.deviceMajor = context_->device().computeMajor;
    compilerOptions.deviceMinor = context_->device().computeMinor;
    compilerOptions.search = context_->searchOptions();
    return stagedCudaArtifact(*module_->functions().front(), types, compilerOptions, options_.optLevel,
                              options_.report, nullptr, options_.precision);
  }
  if (stored_)
    return Error("this model runs a stored CUDA program (a .kc file), which keeps its own file; copy that file instead");
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  if (!(*c)->module || !(*c)->plan)
    return Error("this model runs a stored CUDA program (a .kc file), which keeps its own file; copy that file instead");
  const Function& optimized = *(*c)->module->functions().front();
  // The memory plan's text names the values as the stored module's text
  // does, as for the CPU (CpuExecutor::artifact).
  MemoryPlan plan = *(*c)->plan;
  const auto printedNames = printedValueNames(optimized);
  for (MemoryPlan::Buffer& b : plan.buffers)
    if (auto it = printedNames.find(b.value); it != printedNames.end()) b.name = it->second;
  const cuda::CudaProgram& program = *(*c)->program;
  return serializeArtifact(optimized, program.plan, options_.optLevel, plan.str(), "cuda",
                           cuda::serializeCudaCode(program), options_.precision);
}

const cuda::CudaRunner* CudaExecutor::lastRunner() const {
  return cache_.last() ? cache_.last()->runner.get() : nullptr;
}

}  // namespace kiln::codegen
