// compileCpuProgram (CpuCompiler.h).
#include "codegen/cpu/CpuCompiler.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>

#include "codegen/KernelCache.h"
#include "codegen/Lowering.h"
#include "codegen/cpu/CpuBackend.h"
#include "codegen/llvm/CpuJit.h"
#include "ir/ByteSize.h"
#include "ir/Verifier.h"

namespace kiln::codegen {

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


/// Below this much work per kernel (codegen's estimateWork: result
/// elements times reduction iterations), a generated kernel runs on the
/// calling thread alone. Measured here (kiln run --bench, 2 threads against
/// 1): a two-op elementwise kernel over 32K elements took 5.8 against
/// 2.7 us, over 128K-2M elements the same time either way (one core
/// saturates the memory), and a row-mean over [197,768] 4.2 against
/// 5.2 us; every OpenMP region also risks a stall of a scheduler tick
/// (4-12 ms maxima seen) when the machine is busy and a team thread is
/// descheduled. 2^15 split most of a transformer's small kernels.
constexpr int64_t kParallelWork = 1 << 18;
/// The same for a concat's plain copy (lowerConcatKernel): measured as
/// above, a copy runs no faster on 2 threads up to 2M elements, and a
/// thread descheduled on a busy machine stalls the step (GoogLeNet's
/// 376K-element concat took 7.7-14.6 ms a call on 2 threads while other
/// builds loaded this machine, 0.23-0.26 ms on one).
constexpr int64_t kParallelCopyWork = 1 << 21;
/// A oneDNN call below this many multiply-adds runs on one thread
/// (omp_set_num_threads(1) around it): splitting a small product costs an
/// OpenMP barrier, and on a loaded machine a wait for a descheduled thread.
/// On the e2e models 2^17 measured no slower than letting oneDNN split every
/// call, within the noise of this shared machine (docs/matmul.md).
constexpr int64_t kLibraryParallelWork = 1 << 17;


/// What computes `op`, for profiles: its name, a fused op's ops in
/// parentheses, and the result type.
std::string describeStep(const Op& op) {
  std::string what(op.name());
  if (const Function* body = op.region()) {
    what += "(";
    bool first = true;
    for (const auto& inner : body->ops()) {
      if (inner->kind() == OpKind::Return) continue;
      what += (first ? "" : " ") + std::string(inner->name());
      first = false;
    }
    what += ")";
  }
  return what + " -> " + op.result()->type().str();
}

}  // namespace

std::string targetMismatch(const Program& program, const CpuMachine& host) {
  if (program.codegenVersion != kCpuCodegenVersion)
    return "its code generator is '" + program.codegenVersion + "', this Kiln's is '" +
           std::string(kCpuCodegenVersion) + "'";
  const CpuMachine& built = program.machine;
  if (built.triple != host.triple) return "it was built for '" + built.triple + "', this machine is '" + host.triple + "'";
  if (built.cpu != host.cpu) return "it was built for CPU '" + built.cpu + "', this CPU is '" + host.cpu + "'";
  if (built.features != host.features) return "it was built for other CPU features than this CPU's";
  return "";
}

std::vector<std::string> kernelHashes(const std::vector<kir::Kernel>& kernels) {
  std::vector<std::string> hashes;
  for (kir::Kernel k : kernels) {
    for (kir::Buffer& b : k.buffers) b.name.clear();
    hashes.push_back(contentHash(kir::printKernel(k)));
  }
  return hashes;
}

bool elidedAsView(const LoweredStep& step, const MemoryPlan& plan, bool checksPending) {
  if (step.kind == LoweredStep::Kind::Check || checksPending) return false;
  const MemoryPlan::Buffer* b = plan.find(step.op->result());
  return b && (b->viewOf >= 0 || (step.op->kind() == OpKind::Concat && b->copiedOperands.empty()));
}

Expected<CpuCompilation> layoutProgram(const Function& f, const Backend& backend, const std::string& kernelPrefix,
                                       std::vector<std::string>* unsupportedOut) {
  for (size_t i = 0; i < f.numArguments(); ++i)
    if (!f.argument(i)->type().isStatic())
      return Error("argument " + std::to_string(i) + " of '" + f.name() + "' has type " +
                   f.argument(i)->type().str() + "; compiled programs have static shapes");
  const Op* ret = f.returnOp();
  if (!ret) return Error("'" + f.name() + "' has no return");

  CpuCompilation out;
  out.program = std::make_shared<Program>();
  Program& p = *out.program;
  p.name = f.name();

  // Slots: arguments, then constants, then step results in order.
  std::map<const Value*, int> slots;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const Value* a = f.argument(i);
    Program::Argument arg;
    arg.name = a->name();
    arg.type = a->type();
    if (const DenseTensor* d = f.argumentDefault(i)) {
      arg.hasDefault = true;
      auto value = Tensor::copyOf(*d, "the default of argument %" + a->name());
      if (!value) return value.takeError();
      arg.defaultValue = std::move(*value);
    }
    p.arguments.push_back(std::move(arg));
    slots[a] = static_cast<int>(p.slots.size());
    p.slots.push_back({Program::SlotKind::Argument, a->type(), static_cast<int64_t>(i)});
  }
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Constant) continue;
    slots[op->result()] = static_cast<int>(p.slots.size());
    p.slots.push_back(
        {Program::SlotKind::Constant, op->result()->type(), static_cast<int64_t>(p.constants.size())});
    auto value = Tensor::copyOf(op->getTensor("value"), "the constant %" + op->result()->name());
    if (!value) return op->emitError(value.error().message());
    p.constants.push_back(std::move(*value));
  }

  std::vector<std::string> unsupported;
  auto lowered = lowerForBackend(f, backend, kernelPrefix, &unsupported);
  if (!lowered) {
    if (unsupportedOut) *unsupportedOut = unsupported;
    return lowered.takeError();
  }
  // The arena: each step's result at its planned offset, except results
  // the function returns, which each run allocates for the caller, and
  // results written in place into donated arguments. A donated argument
  // takes its result in place only from a generated kernel that reads it at
  // the element it writes; library calls never.
  std::map<const Op*, const kir::Kernel*> kernelOf;
  for (const LoweredStep& step : *lowered)
    if (step.kind == LoweredStep::Kind::Kernel) kernelOf[step.op] = &step.kernel;
  const ReadsInPlace readsInPlace = [&](const Op& op, size_t operand) {
    auto it = kernelOf.find(&op);
    return it != kernelOf.end() && readsOnlyAtStoredIndex(*it->second, operand);
  };
  auto plan = planMemory(f, {}, readsInPlace);
  if (!plan) return plan.takeError();
  out.plan = *plan;

  // Checks run on the host before the step that follows them.
  std::vector<Program::SlotCheck> pendingChecks;
  for (LoweredStep& step : *lowered) {
    const Op* op = step.op;
    if (step.kind == LoweredStep::Kind::Check) {
      pendingChecks.push_back({std::move(step.check), slots.at(op->operand(0))});
      continue;
    }
    if (elidedAsView(step, *plan, !pendingChecks.empty())) {
      slots[op->result()] = static_cast<int>(p.slots.size());
      p.slots.push_back({Program::SlotKind::Output, op->result()->type(), 0});  // placed below
      continue;
    }
    if (step.kind == LoweredStep::Kind::Kernel) {
      // Values in strided slices of a concatenation's buffer are read and
      // written at their strides, and a concat copies only the operands not
      // in their slices already (MemoryPlan::Buffer): such kernels are
      // lowered again from the plan.
      BufferStrides strides;
      bool strided = false;
      for (const Value* v : op->operands()) strided |= !strides.emplace_back(plan->stridesOf(v)).empty();
      strided |= !strides.emplace_back(plan->stridesOf(op->result())).empty();
      const std::vector<int> copies =
          op->kind() == OpKind::Concat ? plan->concatCopies(*op) : std::vector<int>{};
      if (strided || (op->kind() == OpKind::Concat && copies.size() != op->numOperands())) {
        auto kernel = op->kind() == OpKind::Concat ? lowerConcatKernel(*op, step.kernel.name, copies, strides)
                                                   : lowerOpToKernel(*op, step.kernel.name, strides);
        if (!kernel) return kernel.takeError();
        backend.schedule(*kernel);
        step.kernel = std::move(*kernel);
      }
    }
    Program::Step s;
    s.name = op->result()->name();
    s.what = describeStep(*op);
    if (op->kind() == OpKind::Concat) {
      // What the copy moves, for profiles: the operands not in their slices.
      const std::vector<int> copies = plan->concatCopies(*op);
      uint64_t bytes = 0;
      for (int k : copies) bytes += tensorByteSize(op->operand(static_cast<size_t>(k))->type()).value_or(0);
      s.what += " (copies " + std::to_string(copies.size()) + " of " + std::to_string(op->numOperands()) +
                " operands, " + std::to_string(bytes) + " bytes)";
    }
    for (const Value* v : op->operands()) s.operands.push_back(slots.at(v));
    s.result = static_cast<int>(p.slots.size());
    slots[op->result()] = s.result;
    p.slots.push_back({Program::SlotKind::Output, op->result()->type(), 0});  // placed below
    s.checks = std::exchange(pendingChecks, {});
    if (step.kind == LoweredStep::Kind::Collective) {
      s.kind = Program::Step::Kind::Collective;
      s.collective = std::move(step.collective);
    } else if (step.kind == LoweredStep::Kind::Library) {
      s.kind = Program::Step::Kind::Library;
      s.call = std::move(step.call);
      s.parallel = libraryCallWork(s.call) >= kLibraryParallelWork;
    } else {
      s.kind = Program::Step::Kind::Kernel;
      s.kernel = static_cast<int>(out.kernels.size());
      s.parallelExtent = step.kernel.parallelExtent();
      // A concat's copy is memory-bound: one core moves as much as two
      // (below), so it splits only when very large.
      s.parallel = estimateWork(step.kernel.body) >= (op->kind() == OpKind::Concat ? kParallelCopyWork : kParallelWork);
      p.kernelNames.push_back(step.kernel.name);
      out.kernels.push_back(std::move(step.kernel));
    }
    p.steps.push_back(std::move(s));
  }
  for (size_t r = 0; r < ret->numOperands(); ++r)
    p.results.push_back({f.resultName(r), slots.at(ret->operand(r)), -1});
  for (const MemoryPlan::Alias& a : plan->aliases) {
    const int argument = static_cast<int>(a.argument);
    p.results[a.result].aliasedArgument = argument;
    const Value* v = ret->operand(a.result);
    if (v == f.argument(a.argument)) continue;
    if (a.inPlace)
      p.slots[static_cast<size_t>(slots.at(v))] = {Program::SlotKind::InPlace, v->type(), argument};
    else
      p.finalCopies.emplace_back(slots.at(v), argument);
  }
  p.arenaBytes = std::max<int64_t>(plan->peak, MemoryPlan::kAlignment);
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Constant || op->kind() == OpKind::Return || op->kind() == OpKind::Check) continue;
    Program::Slot& slot = p.slots[static_cast<size_t>(slots.at(op->result()))];
    if (slot.kind == Program::SlotKind::InPlace) continue;
    if (const MemoryPlan::Buffer* b = plan->find(op->result())) slot = {Program::SlotKind::Arena, slot.type, b->offset};
  }
  p.kernelHashes = kernelHashes(out.kernels);
  return out;
}

Expected<CpuCompilation> compileCpuProgram(const Function& f, CpuJit& jit, const CpuCompileOptions& options,
                                           std::vector<std::string>* unsupportedOut) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point lowerStart = Clock::now();
  auto laid = layoutProgram(f, cpuBackend(), options.kernelPrefix, unsupportedOut);
  if (!laid) return laid.takeError();
  CpuCompilation out = std::move(*laid);
  Program& p = *out.program;
  if (options.report)
    options.report->lowering += std::chrono::duration<double>(Clock::now() - lowerStart).count();

  p.machine = jit.target();
  p.codegenVersion = std::string(kCpuCodegenVersion);
  if (!out.kernels.empty()) {
    auto code = jit.compile(out.kernels, options.threads, options.cache, options.report);
    if (!code) return code.takeError();
    p.sharedObject = std::move(*code);
  }
  KILN_TRY(p.validate());
  return out;
}

}  // namespace kiln::codegen
