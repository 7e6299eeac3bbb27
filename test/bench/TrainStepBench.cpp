// Measures one training step of the e2e GPT (test/e2e/gpt/model.onnx, idx
// [2, 8], Adam, MSE on the logits) on the CPU executor, run the two ways a
// training loop can: `run` feeds each step's new parameters and state back
// as the next step's inputs (every step allocates its results); `in-place`
// donates them (CpuOptions::aliases = trainingStepAliases) and calls
// runInPlace, so they stay in the caller's tensors. Prints steps per second
// and the bytes and allocations (global operator new) per step, and checks
// that both ways end with the same parameters. Not a test; run by hand:
//   build/test/kiln-train-step-bench [steps]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <sstream>

#include "codegen/cpu/CpuExecutable.h"
#include "passes/PassManager.h"
#include "passes/TrainingStep.h"
#include "runtime/Interpreter.h"
#include "training/Step.h"
#include "training/TrainableModel.h"

namespace {
std::atomic<size_t> allocatedBytes{0}, allocations{0};
}  // namespace

void* operator new(size_t n) {
  allocatedBytes += n;
  ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace kiln {
namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "error: %s\n", what.c_str());
  return 1;
}

int benchMain(int steps) {
  InterpreterEvaluator evaluator;
  auto m = training::loadTrainableModel(std::string(KILN_SOURCE_DIR) + "/test/e2e/gpt/model.onnx", {{"idx", {2, 8}}},
                                        evaluator);
  if (!m) return fail(m.error().str());
  Function& f = *(*m)->functions()[0];
  PassManager pm({}, PassContext{&evaluator});
  if (Status s = pm.addOptLevel(2); !s.ok()) return fail(s.error().str());
  std::ostringstream log;
  if (Status s = pm.run(**m, log); !s.ok()) return fail(s.error().str());
  TrainingStepOptions options{LossConfig{LossKind::Mse}, OptimizerConfig{OptimizerKind::Adam}, std::nullopt};
  if (Status s = buildTrainingStep(f, options); !s.ok()) return fail(s.error().str());

  // Random tokens and targets; parameters and state from their defaults.
  std::mt19937 rng(3);
  training::StepFeed feed;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const Value* a = f.argument(i);
    if (f.argumentDefault(i) || a->name() == "lr") continue;
    Tensor t(a->type().dtype, staticDims(a->type().shape));
    for (int64_t e = 0; e < t.numElements(); ++e) {
      if (isInteger(t.dtype()))
        t.setInt(e, std::uniform_int_distribution<int64_t>(0, 63)(rng));
      else
        t.setDouble(e, std::uniform_real_distribution<double>(-1, 1)(rng));
    }
    (a->name() == "labels" ? feed.labels : feed.inputs[a->name()]) = std::move(t);
  }
  feed.lr = training::learningRateTensor(f.resultTypes().front().dtype, 1e-3);
  auto bound = training::bindStepInputs(f, {}, std::move(feed));
  if (!bound) return fail(bound.error().str());
  std::vector<Tensor> inputs = std::move(*bound);
  int64_t paramBytes = 0;
  const std::vector<ResultAlias> aliases = trainingStepAliases(f);
  for (const ResultAlias& a : aliases) paramBytes += static_cast<int64_t>(inputs[a.argument].numBytes());
  std::printf("gpt training step: %zu arguments, %zu donated (%lld bytes of parameters and state)\n", f.numArguments(),
              aliases.size(), static_cast<long long>(paramBytes));

  // Both executors compiled first; then blocks of steps alternate between
  // them and each keeps its fastest block (this machine is shared).
  std::unique_ptr<codegen::CpuExecutor> exec[2];
  std::vector<Tensor> last[2] = {inputs, inputs};
  auto step = [&](int mode) -> Status {
    std::vector<Tensor>& state = last[mode];
    if (mode == 1) {
      auto r = exec[1]->runInPlace(state);
      return r ? Status() : Status(r.takeError());
    }
    auto r = exec[0]->run(state);
    if (!r) return r.takeError();
    for (const ResultAlias& a : aliases) state[a.argument] = std::move((*r)[a.result]);
    return Status();
  };
  for (int mode = 0; mode < 2; ++mode) {
    codegen::CpuOptions cpu;
    if (mode == 1) cpu.aliases = aliases;
    auto e = codegen::CpuExecutor::create(f, cpu);
    if (!e) return fail(e.error().str());
    exec[mode] = std::move(*e);
    if (Status s = step(mode); !s.ok()) return fail(s.error().str());  // compiles
  }
  auto plan = exec[1]->memoryPlan(last[1]);
  if (!plan) return fail(plan.error().str());
  int inPlace = 0;
  for (const MemoryPlan::Alias& a : plan->aliases) {
    inPlace += a.inPlace;
    if (!a.inPlace) std::printf("  copied: %s (%s)\n", a.argumentName.c_str(), a.whyCopied.c_str());
  }
  std::printf("in-place plan: %d of %zu donated results written in place, arena %lld bytes\n", inPlace,
              plan->aliases.size(), static_cast<long long>(plan->peak));
  const int block = std::max(1, steps / 10);
  double best[2] = {1e30, 1e30};
  size_t bytes[2] = {0, 0}, count[2] = {0, 0};
  for (int round = 0; round < 10; ++round) {
    for (int mode = 0; mode < 2; ++mode) {
      const size_t bytes0 = allocatedBytes, count0 = allocations;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < block; ++i)
        if (Status s = step(mode); !s.ok()) return fail(s.error().str());
      best[mode] = std::min(best[mode], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      bytes[mode] += allocatedBytes - bytes0;
      count[mode] += allocations - count0;
    }
  }
  for (int mode = 0; mode < 2; ++mode)
    std::printf("%-8s %8.1f steps/s (best block of %d)  %10.0f bytes/step  %6.1f allocations/step\n",
                mode ? "in-place" : "run", block / best[mode], block, double(bytes[mode]) / (10.0 * block),
                double(count[mode]) / (10.0 * block));
  for (const ResultAlias& a : aliases)
    if (last[0][a.argument].numBytes() != last[1][a.argument].numBytes() ||
        std::memcmp(last[0][a.argument].raw(), last[1][a.argument].raw(), last[0][a.argument].numBytes()) != 0)
      return fail("argument " + f.argument(a.argument)->name() + " differs between the two ways");
  std::printf("both ways end with identical parameters and state\n");
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::benchMain(argc > 1 ? std::atoi(argv[1]) : 200); }
