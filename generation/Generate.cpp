// The generate loop (generation/Generate.h).
#include "generation/Generate.h"

#include <chrono>
#include <cmath>

#include "generation/Sampler.h"

namespace kiln::generation {

namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// How each donated cache receives its new value in `program` (JIT only).
std::string cacheUpdates(Program& program) {
  codegen::CpuExecutor* executor = program.compiled->executor();
  if (!executor) return "";
  auto plan = executor->memoryPlan(program.inputs);
  if (!plan) return "";
  size_t inPlace = 0;
  std::string copied;
  for (const MemoryPlan::Alias& a : plan->aliases) {
    if (a.inPlace)
      ++inPlace;
    else if (copied.empty())
      copied = "; " + a.argumentName + " copied: " + a.whyCopied;
  }
  return std::to_string(inPlace) + " of " + std::to_string(plan->aliases.size()) + " caches updated in place" + copied;
}

}  // namespace

Expected<Generation> generate(std::vector<Program>& programs, const Decoder& d, const Tensor& prompt,
                              const GenerateOptions& options) {
  const int64_t newTokens = options.newTokens;
  const int64_t batch = prompt.shape()[0], promptLength = prompt.shape()[1];
  const int64_t total = promptLength + newTokens;
  const int64_t vocab = programs[0].function->resultTypes()[programs[0].logits].shape[2].size;
  Sampler sampler(options.temperature, options.topK, options.seed);
  Tensor sequence(DType::I64, {batch, total});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < promptLength; ++t) sequence.setInt(b * total + t, prompt.getInt(b * promptLength + t));
  Tensor stepLogits(DType::F32, {batch, newTokens, vocab});
  // Chooses token `step` of every sequence from row `row` of `logits`.
  auto choose = [&](const Tensor& logits, int64_t row, int64_t step) {
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<double> values = logitsRow(logits, b, row);
      for (int64_t v = 0; v < vocab; ++v) stepLogits.setDouble((b * newTokens + step) * vocab + v, values[v]);
      sequence.setInt(b * total + promptLength + step, sampler.choose(values));
    }
  };
  auto runStep = [&](Program& program) -> Expected<Tensor> {
    // Every step runs a program compiled before the loop; one that would
    // compile again (its shapes changed) is a bug here, not a slow step.
    if (codegen::CpuExecutor* executor = program.compiled->executor();
        executor && !executor->isCompiled(program.inputs))
      return Error("internal error: a step of kiln generate would compile its program again");
    auto outputs = program.compiled->runInPlace(program.inputs);
    if (!outputs) return outputs.takeError();
    return std::move((*outputs)[program.logits]);
  };

  double prefillSeconds = 0, decodeSeconds = 0;
  std::string updates;  // how the caches were updated, for the report
  if (newTokens > 0 && d.cached()) {
    Program& prefill = programs[0];
    Program& decode = programs.back();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < promptLength; ++t)
        prefill.inputs[prefill.ids].setInt(b * promptLength + t, prompt.getInt(b * promptLength + t));
    prefill.inputs[prefill.position].setInt(0, 0);
    auto start = std::chrono::steady_clock::now();
    auto logits = runStep(prefill);
    if (!logits) return logits.error();
    choose(*logits, promptLength - 1, 0);
    if (Status s = prefill.compiled->syncDonated(); !s) return s.error();
    prefillSeconds = seconds(std::chrono::steady_clock::now() - start);
    if (&decode != &prefill)
      for (const ResultAlias& a : prefill.aliases) {
        const std::string& name = prefill.function->argument(a.argument)->name();
        for (size_t i = 0; i < decode.function->numArguments(); ++i)
          if (decode.function->argument(i)->name() == name) decode.inputs[i] = std::move(prefill.inputs[a.argument]);
      }
    start = std::chrono::steady_clock::now();
    for (int64_t step = 1; step < newTokens; ++step) {
      const int64_t position = promptLength + step - 1;
      for (int64_t b = 0; b < batch; ++b) decode.inputs[decode.ids].setInt(b, sequence.getInt(b * total + position));
      decode.inputs[decode.position].setInt(0, position);
      auto next = runStep(decode);
      if (!next) return next.error();
      choose(*next, 0, step);
    }
    decodeSeconds = seconds(std::chrono::steady_clock::now() - start);
    updates = cacheUpdates(decode);
  } else if (newTokens > 0) {
    Program& program = programs[0];
    const int64_t runLength = program.inputs[program.ids].shape()[1];
    // Fills the ids input with the first `length` tokens and `pad` after.
    auto feed = [&](int64_t length, int64_t pad) {
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t t = 0; t < runLength; ++t)
          program.inputs[program.ids].setInt(b * runLength + t, t < length ? sequence.getInt(b * total + t) : pad);
    };
    for (int64_t step = 0; step < newTokens; ++step) {
      const int64_t length = promptLength + step;
      feed(length, 0);
      auto start = std::chrono::steady_clock::now();
      auto logits = runStep(program);
      if (!logits) return logits.error();
      (step == 0 ? prefillSeconds : decodeSeconds) += seconds(std::chrono::steady_clock::now() - start);
      if (step == 0 && length < runLength) {
        // The padding must not reach the logits of the tokens before it.
        feed(length, vocab - 1);
        auto other = runStep(program);
        if (!other) return other.error();
        for (int64_t b = 0; b < batch; ++b) {
          std::vector<double> x = logitsRow(*logits, b, length - 1), y = logitsRow(*other, b, length - 1);
          for (int64_t v = 0; v < vocab; ++v)
            if (!(std::abs(x[v] - y[v]) <= 1e-5 + 1e-4 * std::abs(x[v])))
              return Error(options.modelPath + ": the logits at position " + std::to_string(length - 1) +
                           " change with the tokens after it (" + std::to_string(x[v]) + " and " +
                           std::to_string(y[v]) + " for token " + std::to_string(v) +
                           "); kiln generate needs a causal, decoder-only model");
        }
      }
      choose(*logits, length - 1, step);
    }
  }
  Generation result;
  result.sequence = std::move(sequence);
  result.stepLogits = std::move(stepLogits);
  result.prefillSeconds = prefillSeconds;
  result.decodeSeconds = decodeSeconds;
  result.cacheUpdates = std::move(updates);
  return result;
}

}  // namespace kiln::generation
