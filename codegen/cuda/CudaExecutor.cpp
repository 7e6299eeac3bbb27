// CudaExecutor (CudaExecutor.h).
#include "codegen/cuda/CudaExecutor.h"

#include <chrono>

#include "codegen/CpuExecutable.h"
#include "codegen/CpuTarget.h"
#include "codegen/Session.h"
#include "codegen/Stages.h"
#include "codegen/cuda/CudaCompiler.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::codegen {

struct CudaExecutor::Compiled {
  std::unique_ptr<Module> module;  // null for a stored program
  std::optional<MemoryPlan> plan;
  std::shared_ptr<const cuda::CudaProgram> program;
  std::unique_ptr<cuda::CudaRunner> runner;
};

namespace {

std::vector<std::vector<int64_t>> shapesOf(const std::vector<Tensor>& inputs) {
  std::vector<std::vector<int64_t>> shapes;
  for (const Tensor& t : inputs) shapes.push_back(t.shape());
  return shapes;
}

}  // namespace

CudaExecutor::CudaExecutor() = default;
CudaExecutor::~CudaExecutor() = default;

Expected<std::unique_ptr<CudaExecutor>> CudaExecutor::create(const Function& f,
                                                             std::shared_ptr<cuda::CudaContext> context,
                                                             CudaOptions options) {
  std::unique_ptr<CudaExecutor> e(new CudaExecutor());
  e->module_ = cloneFunction(f);
  e->context_ = std::move(context);
  e->options_ = std::move(options);
  auto stages = splitAtHostOps(f);
  if (!stages) return stages.takeError();
  if (!*stages) return e;
  if (!e->options_.aliases.empty())
    return Error("'" + f.name() + "' " + whyStaged(**stages) +
                 ", which runs between compiled stages; such a function cannot take donated arguments");
  e->stages_ = std::make_unique<FunctionStages>(std::move(**stages));
  const FunctionStages& s = *e->stages_;
  // Every part is a CUDA program of its own, on the same device.
  CudaOptions partOptions = e->options_;
  partOptions.aliases.clear();
  auto part = [&](const Module& m) { return create(*m.functions().front(), e->context_, partOptions); };
  for (const FunctionStages::HostOp& op : s.host) {
    std::vector<std::unique_ptr<CudaExecutor>> bodies;
    for (const auto& body : op.bodies) {
      auto b = part(*body);
      if (!b) return b.takeError();
      bodies.push_back(std::move(*b));
    }
    e->bodies_.push_back(std::move(bodies));
  }
  if (s.prefix) {
    auto prefix = part(*s.prefix);
    if (!prefix) return prefix.takeError();
    e->prefix_ = std::move(*prefix);
  }
  if (s.suffix) {
    auto suffix = part(*s.suffix);
    if (!suffix) return suffix.takeError();
    e->suffix_ = std::move(*suffix);
  }
  return e;
}

Expected<std::vector<Tensor>> CudaExecutor::runStaged(const std::vector<Tensor>& inputs) {
  // Failures of a part name its unlowerable ops as this executor's.
  unsupported_.clear();
  auto noted = [this](CudaExecutor& part, const std::vector<Tensor>& in) {
    auto ran = part.run(in);
    if (!part.unsupported_.empty()) unsupported_ = part.unsupported_;
    return ran;
  };
  StageRunners runners;
  runners.prefix = [&](const std::vector<Tensor>& in) { return noted(*prefix_, in); };
  runners.suffix = [&](const std::vector<Tensor>& in) { return noted(*suffix_, in); };
  runners.body = [&](size_t host, size_t region, const std::vector<Tensor>& in) {
    return noted(*bodies_[host][region], in);
  };
  return runStages(*module_->functions().front(), *stages_, inputs, runners);
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
  std::vector<std::vector<int64_t>> shapes;
  for (const CpuProgram::Argument& a : program->plan.arguments) shapes.push_back(staticDims(a.type.shape));
  compiled->program = std::move(program);
  e->cache_.emplace(std::move(shapes), std::move(compiled));
  return e;
}

Expected<CudaExecutor::Compiled*> CudaExecutor::compiled(const std::vector<Tensor>& inputs) {
  const auto shapes = shapesOf(inputs);
  if (last_ && cache_.count(shapes) && cache_.at(shapes).get() == last_) return last_;
  if (auto it = cache_.find(shapes); it != cache_.end()) return last_ = it->second.get();
  if (!module_) {
    std::string compiledFor;
    for (const auto& [s, c] : cache_)
      for (const CpuProgram::Argument& a : c->program->plan.arguments) compiledFor += (compiledFor.empty() ? "" : ", ") + a.type.str();
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
  auto optimized = specializeAndOptimize(f, types, options_.aliases, *targetNamed("cuda"), options_.optLevel,
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
  last_ = c.get();
  cache_.emplace(shapes, std::move(c));
  return last_;
}

Status CudaExecutor::prepare(const std::vector<Tensor>& inputs) {
  // With stages, the prefix and the bodies whose arguments have static
  // shapes compile now, the rest on the run that gives their shapes.
  if (stages_) {
    unsupported_.clear();
    if (prefix_) {
      Status prepared = prefix_->prepare(inputs);
      unsupported_ = prefix_->unsupported_;
      if (!prepared) return prepared;
    }
    for (const auto& bodies : bodies_) {
      for (const auto& body : bodies) {
        auto example = staticArgumentsOf(*body->module_->functions().front());
        if (!example) continue;
        Status prepared = body->prepare(*example);
        unsupported_ = body->unsupported_;
        if (!prepared) return prepared;
      }
    }
    return Status::success();
  }
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return Status::success();
}

Expected<std::vector<Tensor>> CudaExecutor::run(const std::vector<Tensor>& inputs) {
  if (stages_) return runStaged(inputs);
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return (*c)->runner->run(inputs);
}

Expected<std::vector<Tensor>> CudaExecutor::runInPlace(std::vector<Tensor>& inputs,
                                                       const std::vector<const Tensor*>* next) {
  if (stages_) return runStaged(inputs);  // no donated arguments (refused by create)
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  // Values kept on the device by the runner of other shapes come home first.
  for (auto& [shapes, other] : cache_)
    if (other.get() != *c) KILN_TRY(other->runner->syncDonated());
  // Staged only for a run of the same program.
  bool sameShapes = next && next->size() == inputs.size();
  for (size_t a = 0; sameShapes && a < inputs.size(); ++a)
    sameShapes = !(*next)[a] || (*next)[a]->shape() == inputs[a].shape();
  return (*c)->runner->runInPlace(inputs, sameShapes ? next : nullptr);
}

Status CudaExecutor::syncDonated() {
  for (auto& [shapes, c] : cache_) KILN_TRY(c->runner->syncDonated());
  return Status::success();
}

Expected<std::pair<const Module*, std::shared_ptr<const cuda::CudaProgram>>> CudaExecutor::compiledProgram(
    const std::vector<Tensor>& inputs) {
  if (stages_) return notOneProgram(module_->functions().front()->name(), *stages_);
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return std::make_pair(static_cast<const Module*>((*c)->module.get()), (*c)->program);
}

Expected<MemoryPlan> CudaExecutor::memoryPlan(const std::vector<Tensor>& inputs) {
  if (stages_) return notOneProgram(module_->functions().front()->name(), *stages_);
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  if (!(*c)->plan) return Error("a stored program keeps no memory plan");
  return *(*c)->plan;
}

const cuda::CudaRunner* CudaExecutor::lastRunner() const { return last_ ? last_->runner.get() : nullptr; }

}  // namespace kiln::codegen
