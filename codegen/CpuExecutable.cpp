// The CPU executor of CpuExecutable.h. A compiled function is a list of
// steps over value slots: slots hold arguments, constants (materialized
// once from their attributes) and kernel results; each step is one JIT
// kernel or one oneDNN primitive (codegen/DnnlKernels.h: f32 matmul and conv,
// with their fused epilogues as post-ops) reading and writing slots. Which
// ops go to oneDNN is decided from the op alone (libraryKernelFor), so the
// step list is a function of the optimized module.
//
// Intermediates live in one arena per compiled shape set, at the offsets of
// passes/MemoryPlan.h's planMemory over the step list (in place where the
// plan says), allocated when the shape set is compiled; a run allocates
// only the tensors it returns. Arguments and constants are read where they
// are. So a CpuExecutor runs one call at a time. Before a kernel runs, the
// run-time errors the interpreter reports (a gather or scatter index out of
// range, an integer division by zero, an integer pow's negative exponent)
// are checked on the host, because the kernels clamp and guard instead of
// failing.
#include "codegen/Session.h"
#include "codegen/CpuExecutable.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "codegen/CpuTarget.h"
#include "codegen/KernelCache.h"
#include "codegen/LowerToKernels.h"
#include "codegen/Lowering.h"
#include "codegen/llvm/CpuJit.h"
#include "ir/Verifier.h"
#include "passes/MemoryPlan.h"
#include "passes/PassManager.h"
#include "runtime/DnnlKernels.h"
#include "runtime/HostCheck.h"
#include "runtime/Interpreter.h"

namespace kiln::codegen {

struct CompiledFunction {
  /// A run-time check the interpreter makes and the kernels do not (a
  /// `check` op of the IR, runtime/HostCheck.h) on the value in `slot`.
  struct SlotCheck {
    HostCheck check;
    int slot = 0;
  };
  struct Step {
    const Op* op = nullptr;
    std::vector<int> operands;  // slots
    int result = 0;             // slot
    KernelFn fn = nullptr;
    std::unique_ptr<DnnlKernel> library;  // instead of fn
    std::vector<SlotCheck> checks;
    int64_t parallelExtent = 1;
    bool parallel = false;  // worth splitting across threads
  };
  std::unique_ptr<Module> module;  // the specialized, optimized copy the steps point into
  std::vector<Tensor> constants;   // slots numArgs .. numArgs + constants - 1
  std::vector<TensorType> slotTypes;
  std::vector<Step> steps;
  std::vector<int> results;  // slots
  /// Where each slot's data is: arena slots point into `arena`, constant
  /// slots into `constants`; argument and output slots are set per run.
  std::vector<void*> slotData;
  /// The slots a run allocates: results of steps that the function returns.
  std::vector<int> outputSlots;
  /// Step results written straight into a donated argument: (slot, argument).
  std::vector<std::pair<int, size_t>> inPlaceSlots;
  /// Results copied into their donated arguments after the last step:
  /// (source slot, argument).
  std::vector<std::pair<int, size_t>> finalCopies;
  /// Per result: true when it goes into a donated argument.
  std::vector<bool> donated;
  std::unique_ptr<uint8_t, decltype(&std::free)> arena{nullptr, &std::free};
  MemoryPlan plan;  // of `module`'s function
  int64_t arenaBytes = 0;
  std::vector<void*> buffers;  // per-step scratch for kernel arguments
  std::vector<kir::Kernel> kernels;
  KernelCode code;
  size_t numArgs = 0;
};

namespace {

/// Result elements times the iterations of the reductions inside, a rough
/// measure of a kernel's work for deciding whether threads pay off.
int64_t estimateWork(const kir::ExprPtr& e) {
  int64_t inner = 1;
  for (const kir::ExprPtr& a : e->args) inner = std::max(inner, estimateWork(a));
  if (e->kind == kir::ExprKind::Reduce)
    for (int64_t x : e->extents) inner *= std::max<int64_t>(x, 1);
  return inner;
}

int64_t estimateWork(const std::vector<kir::StmtPtr>& body) {
  int64_t work = 0;
  for (const kir::StmtPtr& s : body) {
    if (s->kind == kir::Stmt::Kind::Store)
      work += estimateWork(s->value);
    else
      work += s->extent * estimateWork(s->body);
  }
  return work;
}

/// The contentHash of each kernel's printed kernel IR (KernelCode::hashes),
/// without the buffers' value names: those are for reading only, and a
/// module printed and parsed again may name unnamed values.
std::vector<std::string> kernelHashes(const std::vector<kir::Kernel>& kernels) {
  std::vector<std::string> hashes;
  for (kir::Kernel k : kernels) {
    for (kir::Buffer& b : k.buffers) b.name.clear();
    hashes.push_back(contentHash(kir::printKernel(k)));
  }
  return hashes;
}

/// Calls `visit` on every load in `e`.
void forEachLoad(const kir::ExprPtr& e, const std::function<void(const kir::Expr&)>& visit) {
  if (e->kind == kir::ExprKind::Load) visit(*e);
  for (const kir::ExprPtr& a : e->args) forEachLoad(a, visit);
}

/// The i64 index expression `e` with the loop variables in `zero` (loops of
/// extent 1) replaced by 0 and folded, so that `%i0 * 32 + %i1` over
/// `%i0 in 0..1` reads as `%i1`.
kir::ExprPtr withZeroVars(const kir::ExprPtr& e, const std::set<int>& zero) {
  if (e->kind == kir::ExprKind::Var) return zero.count(e->id) ? kir::index(0) : e;
  if (e->kind != kir::ExprKind::Binary || e->type != DType::I64) return e;
  kir::ExprPtr a = withZeroVars(e->args[0], zero), b = withZeroVars(e->args[1], zero);
  switch (e->binary) {
    case kir::BinaryFn::Add: return kir::add(a, b);
    case kir::BinaryFn::Sub: return kir::sub(a, b);
    case kir::BinaryFn::Mul: return kir::mul(a, b);
    case kir::BinaryFn::Div: return kir::div(a, b);
    case kir::BinaryFn::Rem: return kir::rem(a, b);
    default: return kir::binary(e->binary, a, b);
  }
}

/// Whether `kernel` reads buffer `input` only at the element it is about to
/// write: the output is written by one store, and every load of `input` is
/// in that store's value at the store's index. Such a kernel may write its
/// result over `input` (a donated argument, passes/MemoryPlan.h).
bool readsOnlyAtStoredIndex(const kir::Kernel& kernel, size_t input) {
  const int output = static_cast<int>(kernel.buffers.size()) - 1;
  int stores = 0;
  bool ok = true;
  std::set<int> zero;
  std::function<void(const std::vector<kir::StmtPtr>&)> walk = [&](const std::vector<kir::StmtPtr>& body) {
    for (const kir::StmtPtr& s : body) {
      if (s->kind == kir::Stmt::Kind::For) {
        if (s->extent == 1) zero.insert(s->var);
        walk(s->body);
        continue;
      }
      if (s->buffer == output) ++stores;
      const std::string at = kir::printExpr(withZeroVars(s->index, zero));
      forEachLoad(s->index, [&](const kir::Expr& l) { ok = ok && l.id != static_cast<int>(input); });
      forEachLoad(s->value, [&](const kir::Expr& l) {
        if (l.id == static_cast<int>(input))
          ok = ok && s->buffer == output && kir::printExpr(withZeroVars(l.args[0], zero)) == at;
      });
    }
  };
  walk(kernel.body);
  return ok && stores == 1;
}

/// Below this much work per kernel, waking threads costs more than it saves.
constexpr int64_t kParallelWork = 1 << 15;
/// A oneDNN call below this many multiply-adds runs on one thread
/// (omp_set_num_threads(1) around it): splitting a small product costs an
/// OpenMP barrier, and on a loaded machine a wait for a descheduled thread.
/// On the e2e models 2^17 measured no slower than letting oneDNN split every
/// call, within the noise of this shared machine (docs/matmul.md).
constexpr int64_t kLibraryParallelWork = 1 << 17;

}  // namespace

std::unique_ptr<Module> cloneFunction(const Function& f) {
  auto module = std::make_unique<Module>();
  module->addFunction(f.clone());
  return module;
}

namespace {

/// A copy of `source` whose arguments have `types` (static shapes) and
/// whose results alias the donated arguments of `aliases`, run through
/// `target`'s pipeline of `optLevel`.
Expected<std::unique_ptr<Module>> specializeAndOptimize(const Function& source, const std::vector<TensorType>& types,
                                                        const std::vector<ResultAlias>& aliases, const Target& target,
                                                        int optLevel, CompileReport* report) {
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
  passContext.evaluator = &Session::evaluator();
  passContext.target = &target;
  PassManagerOptions passOptions;
  passOptions.timePasses = report != nullptr;
  PassManager pm(passOptions, passContext);
  KILN_TRY(pm.addOptLevel(optLevel));
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

}  // namespace

Expected<std::vector<kir::Kernel>> lowerToKernels(const Function& f, const std::vector<TensorType>& types,
                                                  int optLevel, std::unique_ptr<Module>* optimized) {
  if (types.size() != f.numArguments())
    return Error("function '" + f.name() + "' takes " + std::to_string(f.numArguments()) + " inputs, got " +
                 std::to_string(types.size()));
  auto module = specializeAndOptimize(f, types, {}, *targetNamed("cuda"), optLevel, nullptr);
  if (!module) return module.takeError();
  auto steps = lowerToSteps(*(*module)->functions().front(), "kiln_");
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
  return executor;
}

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::createOptimized(const Function& optimized, const KernelCode* code,
                                                                    CpuOptions options) {
  auto executor = create(optimized, options);
  if (!executor) return executor.takeError();
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < optimized.numArguments(); ++i) {
    const TensorType& type = optimized.argument(i)->type();
    if (!type.isStatic())
      return Error("argument " + std::to_string(i) + " of the optimized function '" + optimized.name() + "' has type " +
                   type.str() + "; an optimized function has static shapes");
    shapes.push_back(staticDims(type.shape));
  }
  auto compiled = (*executor)->finish(cloneFunction(optimized), code);
  if (!compiled) return compiled.takeError();
  (*executor)->cache_.emplace(std::move(shapes), std::move(*compiled));
  return executor;
}

Expected<CompiledFunction*> CpuExecutor::compiled(const std::vector<Tensor>& inputs) {
  const Function& source = *module_->functions().front();
  if (inputs.size() != source.numArguments())
    return Error("function '" + source.name() + "' takes " + std::to_string(source.numArguments()) + " inputs, got " +
                 std::to_string(inputs.size()));
  std::vector<std::vector<int64_t>> shapes;
  for (const Tensor& t : inputs) shapes.push_back(t.shape());
  if (auto it = cache_.find(shapes); it != cache_.end()) return it->second.get();
  unsupported_.clear();

  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  auto module =
      specializeAndOptimize(source, types, options_.aliases, *targetNamed("cpu"), options_.optLevel, options_.report);
  if (!module) return module.takeError();
  auto compiled = finish(std::move(*module), nullptr);
  if (!compiled) return compiled.takeError();
  CompiledFunction* result = compiled->get();
  cache_.emplace(std::move(shapes), std::move(*compiled));
  return result;
}

int defaultThreads() { return std::max(1, omp_get_num_procs()); }

Expected<std::unique_ptr<CompiledFunction>> CpuExecutor::finish(std::unique_ptr<Module> optimized,
                                                                const KernelCode* code) {
  const auto lowerStart = std::chrono::steady_clock::now();
  auto compiled = std::make_unique<CompiledFunction>();
  compiled->module = std::move(optimized);
  Function& f = *compiled->module->functions().front();
  // oneDNN plans a primitive's work split for the thread count current when
  // it is created; a run may have left it at 1 (small calls run alone).
  setDnnlThreads(threads_);
  KILN_TRY(verify(*compiled->module));

  // Slots: arguments, then constants, then op results in order.
  std::map<const Value*, int> slots;
  compiled->numArgs = f.numArguments();
  for (size_t i = 0; i < f.numArguments(); ++i) {
    slots[f.argument(i)] = static_cast<int>(i);
    compiled->slotTypes.push_back(f.argument(i)->type());
  }
  int next = static_cast<int>(f.numArguments());
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Constant) continue;
    compiled->constants.push_back(Tensor::fromDense(op->getTensor("value")));
    slots[op->result()] = next++;
    compiled->slotTypes.push_back(op->result()->type());
  }
  // Names are unique within the JIT: one prefix per compiled shape set.
  std::vector<std::string> unsupported;
  auto lowered = lowerToSteps(f, "kiln" + std::to_string(compiledCount_) + "_", &unsupported);
  if (!lowered) {
    if (unsupported.empty()) return lowered.takeError();
    unsupported_ = unsupported;
    std::string list;
    for (const std::string& u : unsupported) list += (list.empty() ? "" : "; ") + u;
    return Error("the CPU JIT cannot compile '" + f.name() + "': " + list);
  }
  // Checks run on the host before the step that follows them.
  std::vector<CompiledFunction::SlotCheck> pendingChecks;
  for (LoweredStep& lowered : *lowered) {
    const Op* op = lowered.op;
    if (lowered.kind == LoweredStep::Kind::Check) {
      pendingChecks.push_back({std::move(lowered.check), slots.at(op->operand(0))});
      continue;
    }
    CompiledFunction::Step step;
    step.op = op;
    step.result = next++;
    slots[op->result()] = step.result;
    compiled->slotTypes.push_back(op->result()->type());
    step.checks = std::exchange(pendingChecks, {});
    for (const Value* v : op->operands()) step.operands.push_back(slots.at(v));
    if (lowered.kind == LoweredStep::Kind::Library) {
      std::vector<bool> constant;
      for (const Value* v : op->operands())
        constant.push_back(!v->isArgument() && v->definingOp()->kind() == OpKind::Constant);
      auto library = DnnlKernel::create(lowered.call, constant);
      if (!library) return op->emitError("oneDNN cannot run this library call: " + library.error().message());
      step.library = std::move(*library);
      step.parallel = step.library->work() >= kLibraryParallelWork;
      compiled->steps.push_back(std::move(step));
      continue;
    }
    step.parallelExtent = lowered.kernel.parallelExtent();
    step.parallel = estimateWork(lowered.kernel.body) >= kParallelWork;
    compiled->kernels.push_back(std::move(lowered.kernel));
    compiled->steps.push_back(std::move(step));
  }
  compiled->results.clear();
  for (const Value* v : f.returnOp()->operands()) compiled->results.push_back(slots.at(v));
  for (const kir::Kernel& k : compiled->kernels) compiled->code.names.push_back(k.name);

  // The arena: each step's result at its planned offset, except results
  // the function returns, which each run allocates for the caller, and
  // results written in place into donated arguments.
  // A donated argument takes its result in place only from a generated
  // kernel that reads it at the element it writes; oneDNN's steps never.
  std::map<const Op*, const kir::Kernel*> kernelOf;
  {
    size_t nextKernel = 0;
    for (const CompiledFunction::Step& step : compiled->steps)
      if (!step.library) kernelOf[step.op] = &compiled->kernels[nextKernel++];
  }
  const ReadsInPlace readsInPlace = [&](const Op& op, size_t operand) {
    auto it = kernelOf.find(&op);
    return it != kernelOf.end() && readsOnlyAtStoredIndex(*it->second, operand);
  };
  auto plan = planMemory(f, {}, readsInPlace);
  if (!plan) return plan.takeError();
  compiled->plan = *plan;
  std::map<const Value*, size_t> inPlaceArgument;
  compiled->donated.assign(compiled->results.size(), false);
  for (const MemoryPlan::Alias& a : plan->aliases) {
    compiled->donated[a.result] = true;
    const Value* v = f.returnOp()->operand(a.result);
    if (v == f.argument(a.argument)) continue;
    if (a.inPlace)
      inPlaceArgument[v] = a.argument;
    else
      compiled->finalCopies.push_back({compiled->results[a.result], a.argument});
  }
  compiled->arenaBytes = std::max<int64_t>(plan->peak, MemoryPlan::kAlignment);
  compiled->arena.reset(static_cast<uint8_t*>(std::aligned_alloc(MemoryPlan::kAlignment, compiled->arenaBytes)));
  if (!compiled->arena) return Error("cannot allocate the " + std::to_string(compiled->arenaBytes) + "-byte arena");
  compiled->slotData.assign(compiled->slotTypes.size(), nullptr);
  for (size_t i = 0; i < compiled->constants.size(); ++i)
    compiled->slotData[compiled->numArgs + i] = compiled->constants[i].raw();
  size_t maxBuffers = 0;
  for (const CompiledFunction::Step& step : compiled->steps) {
    maxBuffers = std::max(maxBuffers, step.operands.size() + 1);
    if (auto it = inPlaceArgument.find(step.op->result()); it != inPlaceArgument.end())
      compiled->inPlaceSlots.push_back({step.result, it->second});
    else if (const MemoryPlan::Buffer* b = plan->find(step.op->result()))
      compiled->slotData[step.result] = compiled->arena.get() + b->offset;
    else
      compiled->outputSlots.push_back(step.result);
  }
  compiled->buffers.resize(maxBuffers);
  if (options_.report)
    options_.report->lowering += std::chrono::duration<double>(std::chrono::steady_clock::now() - lowerStart).count();

  if (code) {
    // Stored code is bound only to the kernels it was compiled from.
    compiled->code.hashes = kernelHashes(compiled->kernels);
    const KernelCode& lowered = compiled->code;
    if (code->names.size() != lowered.names.size())
      return Error("the stored kernel code has " + std::to_string(code->names.size()) + " kernels, but '" + f.name() +
                   "' lowers to " + std::to_string(lowered.names.size()));
    for (size_t i = 0; i < lowered.names.size(); ++i)
      if (code->names[i] != lowered.names[i] || code->hashes[i] != lowered.hashes[i])
        return Error("stored kernel " + std::to_string(i) + " '" + code->names[i] + "' does not match kernel '" +
                     lowered.names[i] + "' that '" + f.name() + "' lowers to (its kernel IR differs)");
    auto fns = jit_->load(code->objects, compiled->code.names, options_.report);
    if (!fns) return fns.takeError();
    size_t next = 0;
    for (CompiledFunction::Step& step : compiled->steps)
      if (!step.library) step.fn = (*fns)[next++];
    compiled->code.objects = code->objects;
  } else if (!compiled->kernels.empty()) {
    auto fns = jit_->compile(compiled->kernels, options_.threads, kernelCache_.get(), options_.report);
    if (!fns) return fns.takeError();
    size_t next = 0;
    for (CompiledFunction::Step& step : compiled->steps)
      if (!step.library) step.fn = fns->entries[next++];
    compiled->code.objects = std::move(fns->objects);
  }
  ++compiledCount_;
  return compiled;
}

Expected<std::pair<const Module*, KernelCode>> CpuExecutor::compiledCode(const std::vector<Tensor>& inputs) {
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  KernelCode code = (*c)->code;
  if (code.hashes.empty()) code.hashes = kernelHashes((*c)->kernels);
  return std::make_pair(static_cast<const Module*>((*c)->module.get()), std::move(code));
}

std::vector<std::string> CpuExecutor::takeNotices() { return kernelCache_->takeNotices(); }

Status CpuExecutor::prepare(const std::vector<Tensor>& inputs) {
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return {};
}

namespace {

/// The profile's entries for `cf`'s steps, with no time yet: each names the
/// op's result and says what runs (the oneDNN primitive, or the op or the
/// fused ops with the result's type).
std::vector<StepProfile::Entry> profileEntries(const CompiledFunction& cf) {
  std::vector<StepProfile::Entry> entries;
  for (const CompiledFunction::Step& step : cf.steps) {
    StepProfile::Entry e;
    e.name = "%" + step.op->result()->name();
    if (step.library) {
      e.what = step.library->description();
    } else {
      e.what = std::string(step.op->name());
      if (const Function* body = step.op->region()) {
        e.what += "(";
        bool first = true;
        for (const auto& inner : body->ops()) {
          if (inner->kind() == OpKind::Return) continue;
          e.what += (first ? "" : " ") + std::string(inner->name());
          first = false;
        }
        e.what += ")";
      }
      e.what += " -> " + step.op->result()->type().str();
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

}  // namespace

std::string StepProfile::format(size_t limit) const {
  std::vector<const Entry*> sorted;
  double total = 0;
  for (const Entry& e : entries) {
    sorted.push_back(&e);
    total += e.seconds;
  }
  std::stable_sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->seconds > b->seconds; });
  std::ostringstream out;
  char line[96];
  std::snprintf(line, sizeof line, "%8s %6s %10s  %s\n", "total ms", "share", "ms/call", "step");
  out << line;
  for (size_t i = 0; i < sorted.size() && i < limit; ++i) {
    const Entry& e = *sorted[i];
    std::snprintf(line, sizeof line, "%8.2f %5.1f%% %10.4f  ", e.seconds * 1e3, total > 0 ? 100 * e.seconds / total : 0.0,
                  e.calls ? e.seconds * 1e3 / static_cast<double>(e.calls) : 0.0);
    out << line << e.name << " = " << e.what << "\n";
  }
  if (sorted.size() > limit) out << "(" << sorted.size() - limit << " more steps)\n";
  std::snprintf(line, sizeof line, "%8.2f ms in %zu steps\n", total * 1e3, entries.size());
  out << line;
  return out.str();
}

Expected<std::vector<Tensor>> CpuExecutor::run(const std::vector<Tensor>& inputs) {
  if (!options_.aliases.empty()) {
    std::vector<Tensor> donated = inputs;
    auto results = runInPlace(donated);
    if (!results) return results;
    for (const ResultAlias& a : options_.aliases) (*results)[a.result] = std::move(donated[a.argument]);
    return results;
  }
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return execute(**c, inputs);
}

Expected<std::vector<Tensor>> CpuExecutor::runInPlace(std::vector<Tensor>& inputs) {
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return execute(**c, inputs);
}

Expected<std::vector<Tensor>> CpuExecutor::execute(CompiledFunction& cf, const std::vector<Tensor>& inputs) {
  // Arguments are only read, except donated ones, which only runInPlace
  // (whose caller gives up their old values) or run's private copy reach.
  for (size_t i = 0; i < cf.numArgs; ++i) cf.slotData[i] = const_cast<uint8_t*>(inputs[i].raw());
  for (const auto& [slot, argument] : cf.inPlaceSlots) cf.slotData[slot] = cf.slotData[argument];
  std::map<int, Tensor> outputs;
  for (int s : cf.outputSlots) {
    const TensorType& type = cf.slotTypes[s];
    Tensor& t = outputs[s] = Tensor(type.dtype, staticDims(type.shape));
    cf.slotData[s] = t.raw();
  }
  StepProfile* profile = options_.profile;
  if (profile && profile->entries.size() != cf.steps.size()) profile->entries = profileEntries(cf);
  for (size_t k = 0; k < cf.steps.size(); ++k) {
    const CompiledFunction::Step& step = cf.steps[k];
    for (const CompiledFunction::SlotCheck& c : step.checks)
      KILN_TRY(runHostCheck(c.check, cf.slotData[c.slot], cf.slotTypes[c.slot].dtype,
                            numElements(cf.slotTypes[c.slot].shape)));
    void** args = cf.buffers.data();
    for (size_t i = 0; i < step.operands.size(); ++i) args[i] = cf.slotData[step.operands[i]];
    args[step.operands.size()] = cf.slotData[step.result];
    const auto start = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (step.library) {
      setDnnlThreads(step.parallel ? threads_ : 1);
      step.library->run(args);
    } else if (step.parallel && threads_ > 1) {
      const KernelFn fn = step.fn;
      const int64_t extent = step.parallelExtent;
#pragma omp parallel num_threads(threads_)
      {
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t begin = extent * t / n, end = extent * (t + 1) / n;
        if (begin < end) fn(args, nullptr, begin, end);
      }
    } else {
      step.fn(args, nullptr, 0, step.parallelExtent);
    }
    if (profile) {
      profile->entries[k].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++profile->entries[k].calls;
    }
  }
  // Each output tensor is moved to its last result and copied to earlier
  // ones (a value returned twice).
  std::map<int, size_t> lastUse;
  for (size_t r = 0; r < cf.results.size(); ++r)
    if (!cf.donated[r]) lastUse[cf.results[r]] = r;
  std::vector<Tensor> results;
  for (size_t r = 0; r < cf.results.size(); ++r) {
    const int s = cf.results[r];
    if (cf.donated[r])
      results.emplace_back();
    else if (s < static_cast<int>(cf.numArgs))
      results.push_back(inputs[s]);
    else if (s < static_cast<int>(cf.numArgs + cf.constants.size()))
      results.push_back(cf.constants[s - cf.numArgs]);
    else if (lastUse.at(s) == r)
      results.push_back(std::move(outputs.at(s)));
    else
      results.push_back(outputs.at(s));
  }
  // After the results are taken: a result may return an argument's old
  // value, which a copy below overwrites.
  if (!cf.finalCopies.empty()) {
    // A copy whose source is an argument that another copy overwrites (two
    // donated arguments swapping values) reads it from a staged copy.
    std::vector<std::vector<uint8_t>> staged;
    staged.reserve(cf.finalCopies.size());
    std::vector<const void*> sources;
    for (const auto& [source, argument] : cf.finalCopies) {
      const void* from = cf.slotData[source];
      for (const auto& other : cf.finalCopies)
        if (source == static_cast<int>(other.second)) {
          const uint8_t* bytes = static_cast<const uint8_t*>(from);
          staged.emplace_back(bytes, bytes + inputs[argument].numBytes());
          from = staged.back().data();
          break;
        }
      sources.push_back(from);
    }
    for (size_t i = 0; i < cf.finalCopies.size(); ++i) {
      const size_t argument = cf.finalCopies[i].second;
      std::memcpy(cf.slotData[argument], sources[i], inputs[argument].numBytes());
    }
  }
  return results;
}

Expected<std::string> CpuExecutor::kernelIR(const std::vector<Tensor>& inputs) {
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  std::string text;
  size_t next = 0;
  for (const CompiledFunction::Step& step : (*c)->steps) {
    text += text.empty() ? "" : "\n";
    if (step.library)
      text += "library %" + step.op->result()->name() + ": " + step.library->description() + "\n";
    else
      text += kir::printKernel((*c)->kernels[next++]);
  }
  return text;
}

Expected<std::string> CpuExecutor::llvmIR(const std::vector<Tensor>& inputs) {
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return jit_->optimizedIR((*c)->kernels);
}

Expected<MemoryPlan> CpuExecutor::memoryPlan(const std::vector<Tensor>& inputs) {
  auto c = compiled(inputs);
  if (!c) return c.takeError();
  return (*c)->plan;
}

size_t CpuExecutor::numKernels(const std::vector<Tensor>& inputs) {
  auto c = compiled(inputs);
  return c ? (*c)->steps.size() : 0;
}

}  // namespace kiln::codegen
