// CpuRunner (CpuRunner.h).
#include "runtime/CpuRunner.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "runtime/Collectives.h"
#include "runtime/DnnlKernels.h"
#include "runtime/LoadedCode.h"
#include "runtime/PackedMatmul.h"
#include "runtime/ThreadPool.h"

namespace kiln {

namespace {

/// The alignment of the arena and its buffers: a cache line, and the widest
/// vector load of AVX-512 (the memory plan's offsets are multiples of it).
constexpr size_t kArenaAlignment = 64;


}  // namespace

int defaultThreads() { return std::max(1, omp_get_num_procs()); }

std::string StepProfile::format(size_t limit) const {
  std::vector<const Entry*> sorted;
  double total = 0;
  for (const Entry& e : entries) {
    sorted.push_back(&e);
    total += e.seconds;
  }
  std::stable_sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->seconds > b->seconds; });
  std::ostringstream out;
  char line[128];
  std::snprintf(line, sizeof line, "%8s %6s %10s %8s %8s  %s\n", "total ms", "share", "ms/call", "GFLOP/s", "GB/s",
                "step");
  out << line;
  double flops = 0, flopSeconds = 0;
  for (const Entry& e : entries)
    if (e.flops > 0) {
      flops += e.flops * static_cast<double>(e.calls);
      flopSeconds += e.seconds;
    }
  for (size_t i = 0; i < sorted.size() && i < limit; ++i) {
    const Entry& e = *sorted[i];
    char rate[16] = "-", bandwidth[16] = "-";
    if (e.flops > 0 && e.seconds > 0)
      std::snprintf(rate, sizeof rate, "%.1f", e.flops * static_cast<double>(e.calls) / e.seconds * 1e-9);
    if (e.bytes > 0 && e.seconds > 0)
      std::snprintf(bandwidth, sizeof bandwidth, "%.1f", e.bytes * static_cast<double>(e.calls) / e.seconds * 1e-9);
    std::snprintf(line, sizeof line, "%8.2f %5.1f%% %10.4f %8s %8s  ", e.seconds * 1e3,
                  total > 0 ? 100 * e.seconds / total : 0.0,
                  e.calls ? e.seconds * 1e3 / static_cast<double>(e.calls) : 0.0, rate, bandwidth);
    out << line << e.name << " = " << e.what << "\n";
  }
  if (sorted.size() > limit) out << "(" << sorted.size() - limit << " more steps)\n";
  std::snprintf(line, sizeof line, "%8.2f ms in %zu steps", total * 1e3, entries.size());
  out << line;
  if (flopSeconds > 0)
    std::snprintf(line, sizeof line, "; library calls %.2f ms at %.1f GFLOP/s", flopSeconds * 1e3,
                  flops / flopSeconds * 1e-9);
  else
    line[0] = 0;
  out << line << "\n";
  // The same time by kind of step: the op or fused ops, or the library
  // primitive, without shapes, so that many small steps of one kind (the
  // optimizer's updates, transposes) show up together.
  std::map<std::string, std::pair<double, int64_t>> byKind;
  for (const Entry& e : entries) {
    // A library call's kind is its words before the first shape ("cudnn
    // conv [2,16,14,14]*..." is a "cudnn conv").
    std::string kind = e.what.substr(0, e.what.find(" -> "));
    kind = kind.substr(0, kind.find(" ["));
    auto& [seconds, steps] = byKind[kind];
    seconds += e.seconds;
    ++steps;
  }
  if (byKind.size() > 1 && sorted.size() > limit) {
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> kinds(byKind.begin(), byKind.end());
    std::stable_sort(kinds.begin(), kinds.end(),
                     [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    out << "by kind:\n";
    for (size_t i = 0; i < kinds.size() && i < 20; ++i) {  // the 20 largest kinds
      std::snprintf(line, sizeof line, "%8.2f %5.1f%% %6lld steps  ", kinds[i].second.first * 1e3,
                    total > 0 ? 100 * kinds[i].second.first / total : 0.0,
                    static_cast<long long>(kinds[i].second.second));
      out << line << kinds[i].first << "\n";
    }
  }
  return out.str();
}

void CpuMemoryStats::addRunner(uint64_t arenaBytes, uint64_t constantBytes) {
  maxPrograms = std::max(maxPrograms, ++programs);
  maxArena = std::max(maxArena, arena += arenaBytes);
  maxConstants = std::max(maxConstants, constants += constantBytes);
  peak = std::max(peak, arena + constants);
}

void CpuMemoryStats::removeRunner(uint64_t arenaBytes, uint64_t constantBytes) {
  --programs;
  arena -= arenaBytes;
  constants -= constantBytes;
}

void CpuMemoryStats::addRun(uint64_t resultBytes) {
  ++runs;
  results = resultBytes;
  maxResults = std::max(maxResults, resultBytes);
  peak = std::max(peak, arena + constants + resultBytes);
}

std::string CpuMemoryStats::format() const {
  std::string text = "CPU memory of the compiled programs\n";
  char line[160];
  const auto row = [&](const char* name, uint64_t current, uint64_t most) {
    std::snprintf(line, sizeof line, "  %-14s %12s %12s\n", name, formatBytes(current).c_str(), formatBytes(most).c_str());
    text += line;
  };
  std::snprintf(line, sizeof line, "  %-14s %12s %12s\n", "", "current", "peak");
  text += line;
  row("arena", arena, maxArena);
  row("constants", constants, maxConstants);
  row("results", results, maxResults);  // the last run's; the largest run's
  row("in use", arena + constants + results, peak);
  std::snprintf(line, sizeof line, "  %-14s %12lld (at most %lld at once), %lld run%s\n", "programs",
                static_cast<long long>(programs), static_cast<long long>(maxPrograms), static_cast<long long>(runs),
                runs == 1 ? "" : "s");
  text += line;
  return text;
}

CpuRunner::~CpuRunner() {
  if (memory_) memory_->removeRunner(arenaBytes_, constantBytes_);
}

Expected<std::unique_ptr<CpuRunner>> CpuRunner::create(std::shared_ptr<const Program> program, int threads,
                                                       StepProfile* profile, CpuMemoryStats* memory) {
  KILN_TRY(program->validate());
  std::unique_ptr<CpuRunner> runner(new CpuRunner());
  runner->program_ = program;
  runner->threads_ = threads > 0 ? threads : defaultThreads();
  runner->profile_ = profile;
  const Program& p = *program;
  auto code = LoadedCode::load(p.sharedObject, p.kernelNames);
  if (!code) return Error("program '" + p.name + "': " + code.error().message());
  runner->code_ = std::move(*code);

  // oneDNN plans a primitive's work split for the thread count current when
  // it is created; a run may have left it at 1 (small calls run alone).
  setDnnlThreads(runner->threads_);
  size_t maxBuffers = 0;
  // b packed once per constant, for every small-row matmul by it (an
  // unrolled recurrent net multiplies by the same R^T at each time step).
  // By constant slot and whether it is read transposed (LibraryCall::transposedB).
  std::map<std::pair<int, bool>, std::shared_ptr<const PackedMatmul::Weights>> packedWeights;
  for (const Program::Step& step : p.steps) {
    maxBuffers = std::max(maxBuffers, step.operands.size() + 1);
    runner->packed_.emplace_back();
    // An all-reduce whose result a later step reads runs while the steps
    // in between do (a gradient bucket's reduction during the rest of the
    // backward pass); its operand is copied into its result first.
    bool async = false;
    if (step.kind == Program::Step::Kind::Collective && step.collective.kind == CollectiveCall::Kind::AllReduce) {
      for (const Program::Step& later : p.steps)
        for (int o : later.operands) async = async || o == step.result;
    }
    runner->asyncCollective_.push_back(async);
    if (step.kind != Program::Step::Kind::Library) {
      runner->libraries_.emplace_back();
      continue;
    }
    if (PackedMatmul::accepts(step.call)) {
      const int b = step.operands[static_cast<size_t>(step.call.operands[1])];
      const Program::Slot& slot = p.slots[static_cast<size_t>(b)];
      if (slot.kind == Program::SlotKind::Constant && slot.type.dtype == DType::F32) {
        std::shared_ptr<const PackedMatmul::Weights>& weights = packedWeights[{b, step.call.transposedB}];
        const std::vector<int64_t>& dims = step.call.operandDims[1];
        if (!weights)
          weights =
              PackedMatmul::pack(reinterpret_cast<const float*>(p.constants[static_cast<size_t>(slot.index)].raw()),
                                 dims[dims.size() - 2], dims.back(), step.call.transposedB);
        auto packed = PackedMatmul::create(step.call, weights);
        if (!packed) return Error("program '" + p.name + "', step %" + step.name + ": " + packed.error().message());
        runner->packed_.back() = std::move(*packed);
        runner->libraries_.emplace_back();
        continue;
      }
    }
    // Constant buffers (weights) are reordered into oneDNN's layout once.
    std::vector<bool> constant;
    for (int s : step.operands) constant.push_back(p.slots[static_cast<size_t>(s)].kind == Program::SlotKind::Constant);
    auto library = DnnlKernel::create(step.call, constant);
    if (!library) return Error("program '" + p.name + "', step %" + step.name + ": " + library.error().message());
    runner->libraries_.push_back(std::move(*library));
  }
  runner->buffers_.resize(maxBuffers);
  runner->callBounds_.resize(maxBuffers);
  runner->slotBounds_.assign(p.slots.size(), -1.0);

  const size_t arenaBytes =
      (static_cast<size_t>(std::max<int64_t>(p.arenaBytes, 1)) + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  runner->arena_.reset(static_cast<uint8_t*>(std::aligned_alloc(kArenaAlignment, arenaBytes)));
  if (!runner->arena_) {
    // Name the largest value that lives there, which is what to shrink.
    std::string largest;
    uint64_t largestBytes = 0;
    for (const Program::Step& step : p.steps) {
      const Program::Slot& slot = p.slots[static_cast<size_t>(step.result)];
      const uint64_t bytes = tensorByteSize(slot.type).value_or(0);
      if (slot.kind != Program::SlotKind::Arena || bytes <= largestBytes) continue;
      largestBytes = bytes;
      largest = "%" + step.name + ": " + slot.type.str() + " (" + step.what.substr(0, step.what.find(" -> ")) + ", " +
                formatBytes(bytes) + ")";
    }
    return Error("program '" + p.name + "': cannot allocate " + formatBytes(arenaBytes) +
                 " for its arena, the intermediate values of its " + std::to_string(p.steps.size()) + " steps" +
                 (largest.empty() ? std::string() : "; the largest is " + largest));
  }
  if (memory) {
    runner->memory_ = memory;
    runner->arenaBytes_ = arenaBytes;
    for (const Tensor& c : p.constants) runner->constantBytes_ += c.numBytes();
    memory->addRunner(runner->arenaBytes_, runner->constantBytes_);
  }
  runner->slotData_.assign(p.slots.size(), nullptr);
  for (size_t s = 0; s < p.slots.size(); ++s) {
    const Program::Slot& slot = p.slots[s];
    if (slot.kind == Program::SlotKind::Constant)
      runner->slotData_[s] = const_cast<uint8_t*>(p.constants[static_cast<size_t>(slot.index)].raw());
    else if (slot.kind == Program::SlotKind::Arena)
      runner->slotData_[s] = runner->arena_.get() + slot.index;
  }
  for (const Program::Result& r : p.results) runner->donates_ = runner->donates_ || r.aliasedArgument >= 0;
  for (const Program::Argument& a : p.arguments) runner->argumentDims_.push_back(staticDims(a.type.shape));
  for (size_t s = 0; s < p.slots.size(); ++s) {
    const Program::Slot& slot = p.slots[s];
    if (slot.kind == Program::SlotKind::Argument || slot.kind == Program::SlotKind::InPlace)
      runner->inputSlots_.emplace_back(static_cast<int>(s), static_cast<size_t>(slot.index));
    else if (slot.kind == Program::SlotKind::Output)
      runner->outputSlots_.push_back(static_cast<int>(s));
  }
  // An output tensor moves to its last result and is copied to earlier
  // ones (a value returned twice).
  runner->movesResult_.assign(p.results.size(), false);
  std::map<int, size_t> lastUse;
  for (size_t r = 0; r < p.results.size(); ++r)
    if (p.results[r].aliasedArgument < 0) lastUse[p.results[r].slot] = r;
  for (const auto& [slot, r] : lastUse) runner->movesResult_[r] = true;
  return runner;
}

std::string CpuRunner::libraryDescription(size_t i) const {
  if (i < packed_.size() && packed_[i]) return packed_[i]->description();
  return i < libraries_.size() && libraries_[i] ? libraries_[i]->description() : std::string();
}

Status CpuRunner::checkInputs(const std::vector<Tensor>& inputs) const {
  const Program& p = *program_;
  if (inputs.size() != p.arguments.size())
    return Error("'" + p.name + "' takes " + std::to_string(p.arguments.size()) + " inputs, got " +
                 std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].dtype() != p.arguments[i].type.dtype || inputs[i].shape() != argumentDims_[i])
      return Error("input " + std::to_string(i) + " ('" + p.arguments[i].name + "') of '" + p.name + "' is " +
                   inputs[i].type().str() + ", expected " + p.arguments[i].type.str() +
                   " (the program was compiled for these shapes)");
  return {};
}

Expected<std::vector<Tensor>> CpuRunner::run(const std::vector<Tensor>& inputs) {
  if (!donates_) {
    KILN_TRY(checkInputs(inputs));
    return execute(inputs);
  }
  // runInPlace writes into its inputs: it gets copies (checked, since an
  // input may be as large as memory allows).
  std::vector<Tensor> donated;
  donated.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string name =
        "a copy of input '" + (i < program_->arguments.size() ? program_->arguments[i].name : std::to_string(i)) + "'";
    auto copy = Tensor::copyOf(inputs[i], name);
    if (!copy) return Error("program '" + program_->name + "': " + copy.error().message());
    donated.push_back(std::move(*copy));
  }
  auto results = runInPlace(donated);
  if (!results) return results;
  for (size_t r = 0; r < program_->results.size(); ++r)
    if (const int a = program_->results[r].aliasedArgument; a >= 0) (*results)[r] = std::move(donated[static_cast<size_t>(a)]);
  return results;
}

Expected<std::vector<Tensor>> CpuRunner::runInPlace(std::vector<Tensor>& inputs) {
  KILN_TRY(checkInputs(inputs));
  return execute(inputs);
}

Expected<std::vector<Tensor>> CpuRunner::execute(const std::vector<Tensor>& inputs) {
  const Program& p = *program_;
  // The kernels' parallel loops and packed matmuls run on the process's pool
  // of threads_ threads (ThreadPool.h: the caller never waits for a thread
  // the OS has not scheduled); oneDNN's on its OpenMP team.
  ThreadPool* const pool = threads_ > 1 ? &ThreadPool::shared(threads_) : nullptr;
  // Arguments are only read, except donated ones, which only runInPlace
  // (whose caller gives up their old values) or run's private copy reach.
  for (const auto& [slot, argument] : inputSlots_) slotData_[static_cast<size_t>(slot)] = const_cast<uint8_t*>(inputs[argument].raw());
  std::vector<Tensor> outputs(outputSlots_.size());
  for (size_t o = 0; o < outputSlots_.size(); ++o) {
    const TensorType& type = p.slots[static_cast<size_t>(outputSlots_[o])].type;
    auto output = Tensor::allocate(type.dtype, staticDims(type.shape), "a result");
    if (!output) return slotAllocationError(p, outputSlots_[o]);
    outputs[o] = std::move(*output);
    slotData_[static_cast<size_t>(outputSlots_[o])] = outputs[o].raw();
  }
  // A bound holds for the run that computed it: arguments and outputs are
  // other tensors each run.
  std::fill(slotBounds_.begin(), slotBounds_.end(), -1.0);
  StepProfile* profile = profile_;
  if (profile && profile->entries.size() != p.steps.size()) {
    profile->entries.clear();
    for (size_t k = 0; k < p.steps.size(); ++k) {
      const DnnlKernel* library = libraries_[k].get();
      const PackedMatmul* packed = packed_[k].get();
      profile->entries.push_back({"%" + p.steps[k].name, library || packed ? libraryDescription(k) : p.steps[k].what});
      if (library) profile->entries.back().flops = 2.0 * static_cast<double>(library->work());
      if (packed) profile->entries.back().flops = 2.0 * static_cast<double>(packed->work());
      profile->entries.back().bytes = static_cast<double>(p.stepBytes(p.steps[k]));
    }
  }
  // All-reduces in flight, by result slot; each is waited for before the
  // first step that reads its result, and all before the run returns.
  std::vector<std::pair<int, std::unique_ptr<CollectiveRequest>>> pending;
  const auto waitFor = [&](int slot) -> Status {
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      if (it->first != slot) continue;
      Status s = it->second->wait();
      pending.erase(it);
      return s;
    }
    return Status();
  };
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const Program::Step& step = p.steps[k];
    if (!pending.empty()) {
      for (int o : step.operands) KILN_TRY(waitFor(o));
      for (const Program::SlotCheck& c : step.checks) KILN_TRY(waitFor(c.slot));
    }
    for (const Program::SlotCheck& c : step.checks) {
      const TensorType& type = p.slots[static_cast<size_t>(c.slot)].type;
      KILN_TRY(runHostCheck(c.check, slotData_[static_cast<size_t>(c.slot)], type.dtype, numElements(type.shape)));
    }
    void** args = buffers_.data();
    for (size_t i = 0; i < step.operands.size(); ++i) args[i] = slotData_[static_cast<size_t>(step.operands[i])];
    args[step.operands.size()] = slotData_[static_cast<size_t>(step.result)];
    const auto start = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (step.kind == Program::Step::Kind::Collective) {
      auto request = startCollective(communicator(), step.collective, args[0], args[1],
                                     describeCollective(step.collective) + " %" + step.name);
      if (!request) return Error("program '" + p.name + "': " + request.error().message());
      if (asyncCollective_[k])
        pending.emplace_back(step.result, std::move(*request));
      else
        KILN_TRY((*request)->wait());
    } else if (const PackedMatmul* packed = packed_[k].get()) {
      if (step.parallel && pool) {
        // On oneDNN's OpenMP team, as the library calls around it (a
        // recurrent cell's step products come between its input
        // projections): on the pool, oneDNN's idle threads, still spinning
        // after the last library call, took a core from the pool's worker,
        // and the LSTM text classifier at batch 1 ran at its one-thread
        // speed (4.2 ms against 2.5 ms on the team).
        pool->park();
#pragma omp parallel num_threads(threads_)
        packed->run(args, omp_get_thread_num(), omp_get_num_threads());
      } else {
        packed->run(args, 0, 1);
      }
    } else if (const DnnlKernel* library = libraries_[k].get()) {
      // The pool's workers sleep while oneDNN's OpenMP team has the cores.
      if (step.parallel && pool) pool->park();
      setDnnlThreads(step.parallel ? threads_ : 1);
      for (size_t i = 0; i < step.operands.size(); ++i)
        callBounds_[i] = slotBounds_[static_cast<size_t>(step.operands[i])];
      callBounds_[step.operands.size()] = -1;
      const std::span<double> bounds(callBounds_.data(), step.operands.size() + 1);
      if (Status ran = library->run(args, bounds); !ran)
        return Error("program '" + p.name + "', step %" + step.name + ": " + ran.error().message());
      slotBounds_[static_cast<size_t>(step.result)] = bounds.back();
    } else if (step.parallel && pool) {
      const KernelFn fn = code_->kernel(static_cast<size_t>(step.kernel));
      pool->parallelFor(step.parallelExtent, [&](int64_t begin, int64_t end) { fn(args, nullptr, begin, end); });
    } else {
      code_->kernel(static_cast<size_t>(step.kernel))(args, nullptr, 0, step.parallelExtent);
    }
    if (!libraries_[k]) slotBounds_[static_cast<size_t>(step.result)] = -1;  // (a slot written twice)
    if (profile) {
      profile->entries[k].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++profile->entries[k].calls;
    }
    for (auto& [slot, request] : pending) request->progress();
  }
  for (auto& [slot, request] : pending) KILN_TRY(request->wait());
  pending.clear();
  std::vector<Tensor> results;
  results.reserve(p.results.size());
  for (size_t r = 0; r < p.results.size(); ++r) {
    const int s = p.results[r].slot;
    const Program::Slot& slot = p.slots[static_cast<size_t>(s)];
    if (p.results[r].aliasedArgument >= 0) {
      results.emplace_back();
    } else if (slot.kind == Program::SlotKind::Argument) {
      results.push_back(inputs[static_cast<size_t>(slot.index)]);
    } else if (slot.kind == Program::SlotKind::Constant) {
      results.push_back(p.constants[static_cast<size_t>(slot.index)]);
    } else if (slot.kind == Program::SlotKind::Output) {
      const size_t o = static_cast<size_t>(std::find(outputSlots_.begin(), outputSlots_.end(), s) - outputSlots_.begin());
      if (movesResult_[r])
        results.push_back(std::move(outputs[o]));
      else
        results.push_back(outputs[o]);
    } else {
      Tensor copy(slot.type.dtype, staticDims(slot.type.shape));
      std::memcpy(copy.raw(), slotData_[static_cast<size_t>(s)], copy.numBytes());
      results.push_back(std::move(copy));
    }
  }
  // After the results are taken: a result may return an argument's old
  // value, which a copy below overwrites.
  if (!p.finalCopies.empty()) {
    // A copy whose source is an argument that another copy overwrites (two
    // donated arguments swapping values) reads it from a staged copy.
    std::vector<std::vector<uint8_t>> staged;
    staged.reserve(p.finalCopies.size());
    std::vector<const void*> sources;
    for (const auto& [source, argument] : p.finalCopies) {
      const void* from = slotData_[static_cast<size_t>(source)];
      const size_t bytes = inputs[static_cast<size_t>(argument)].numBytes();
      for (const auto& other : p.finalCopies) {
        const Program::Slot& src = p.slots[static_cast<size_t>(source)];
        const bool readsOverwritten = (src.kind == Program::SlotKind::Argument ||
                                       src.kind == Program::SlotKind::InPlace) &&
                                      src.index == other.second;
        if (readsOverwritten) {
          const uint8_t* begin = static_cast<const uint8_t*>(from);
          staged.emplace_back(begin, begin + bytes);
          from = staged.back().data();
          break;
        }
      }
      sources.push_back(from);
    }
    for (size_t i = 0; i < p.finalCopies.size(); ++i) {
      const size_t argument = static_cast<size_t>(p.finalCopies[i].second);
      std::memcpy(const_cast<uint8_t*>(inputs[argument].raw()), sources[i], inputs[argument].numBytes());
    }
  }
  if (memory_) {
    // What this run allocated: outputs, and copies of results in the arena.
    uint64_t bytes = 0;
    for (size_t r = 0; r < p.results.size(); ++r) {
      const Program::SlotKind kind = p.slots[static_cast<size_t>(p.results[r].slot)].kind;
      if (p.results[r].aliasedArgument < 0 &&
          (kind == Program::SlotKind::Output || kind == Program::SlotKind::Arena))
        bytes += results[r].numBytes();
    }
    memory_->addRun(bytes);
  }
  return results;
}

}  // namespace kiln
