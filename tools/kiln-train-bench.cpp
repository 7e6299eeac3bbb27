// kiln-train-bench: times Kiln's training step on a model, for bench/run.py's
// training rows (issue 6 item 8). It uses the training library as `kiln
// train` does: loads an ONNX (or any Kiln-readable) model specialized to the
// batch given as .npy files with its weights as parameters
// (training/TrainableModel.h loadTrainableModel), builds the one-function
// training step (training/Step.h makeTrainingStep: cross-entropy loss, then
// SGD with momentum or AdamW), binds its arguments (bindStepInputs),
// compiles it through a Session (driver/Session.h; -O3 by default, no
// interpreter fallback) and runs warm-up steps and timed steps the way
// `kiln train` runs them: parameters and optimizer state are donated
// arguments (trainingStepAliases), which each step updates in place
// (CompiledModel::runInPlace) for the next (the same batch every step; only
// the run is timed). It prints the median, min and max step time and the
// loss of every step, as text or, with --json, one JSON object like `kiln
// run --bench --json`; --profile adds the time of each compiled step
// (StepProfile) on stderr.
//
// Language models: an output of rank 3, [B, T, V] token scores, is flattened
// to [B*T, V] before the loss and the labels, [B, T] next tokens, to [B*T],
// which is PyTorch's F.cross_entropy(logits.view(-1, V), targets.view(-1)).
//
// A tool for benchmarks, built by the default build and installed nowhere;
// `kiln train` (tools/TrainCommand.cpp) is the user's command.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "codegen/cpu/CpuExecutable.h"
#include "driver/Session.h"
#include "frontend/Model.h"
#include "ir/Json.h"
#include "ir/Builder.h"
#include "passes/TrainingStep.h"
#include "runtime/Npy.h"
#include "tools/CommandLine.h"
#include "training/Step.h"
#include "training/TrainableModel.h"

namespace kiln {
namespace {

using cli::millis;
using cli::OptionSpec;

constexpr std::string_view kTool = "kiln-train-bench";

constexpr OptionSpec kOptions[] = {
    {"--input", "NAME=FILE.npy", "bind the model input NAME to the array in FILE.npy (the batch)", true},
    {"--labels", "FILE.npy", "int64 class labels: [B] for [B, C] scores, [B, T] for [B, T, V] token scores"},
    {"--optimizer", "sgd|adamw", "SGD (with --momentum, default 0.9) or AdamW (weight decay 0.01); default sgd"},
    {"--lr", "X", "learning rate (default 0.01)"},
    {"--momentum", "X", "SGD momentum (default 0.9)"},
    {"--steps", "N", "timed training steps (default 20)"},
    {"--warmup", "N", "untimed steps before the timed ones (default 3)"},
    {"--threads", "N", "threads that split each kernel (default: all cores)"},
    {"-O", "N", "optimization level of the pass pipeline, 0 to 3 (default 3)"},
    {"--json", "", "print one JSON object instead of text"},
    {"--profile", "", "print the time of each compiled step, largest first, on stderr"},
    {"--save-step", "FILE.kir", "also write the training-step function (before the pass pipeline) to FILE.kir"},
    {"--no-cache", "", "neither read nor write the kernel cache ($KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln)"},
    KILN_PRECISION_OPTIONS,
    {"--help", "", "show this help", false, "-h"},
};

int fail(const std::string& message) {
  std::cerr << kTool << ": error: " << message << "\n";
  return cli::kExitError;
}

int usage(const std::string& message) {
  std::cerr << kTool << ": " << message << "\n(see " << kTool << " --help)\n";
  return cli::kExitUsage;
}

/// The folder of `kiln`'s kernel cache, found the way the kiln tool finds it.
std::string defaultCacheDir() {
  if (const char* dir = std::getenv("KILN_CACHE_DIR"); dir && *dir) return dir;
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir && *dir) return std::string(dir) + "/kiln";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kiln";
  return "";
}

Expected<double> parseNumber(const std::string& text, const std::string& what, double lo, double hi) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= lo && v <= hi))
    return Error(what + " is '" + text + "', expected a number in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
  return v;
}

/// Flattens a [B, T, V] model output to [B*T, V] (the language-model loss);
/// other outputs are left alone. Returns whether it flattened.
Expected<bool> flattenTokenScores(Function& f) {
  Op* ret = f.returnOp();
  if (!ret || ret->numOperands() == 0) return Error("the model has no output");
  Value* out = ret->operand(0);
  const TensorType type = out->type();
  if (type.rank() != 3) return false;
  const std::vector<int64_t> dims = staticDims(type.shape);
  Builder b(f);
  auto reshaped =
      b.value(OpKind::Reshape, {out}, {}, {TensorType{type.dtype, staticShape({dims[0] * dims[1], dims[2]})}});
  if (!reshaped) return reshaped.takeError();
  Value* flat = *reshaped;
  ret->setOperand(0, flat);
  std::vector<TensorType> types = f.resultTypes();
  types[0] = flat->type();
  f.setResultTypes(types);
  return true;
}

int runBench(int argc, char** argv) {
  std::vector<std::string> raw(argv + 1, argv + argc);
  auto parsed = cli::parseArgs(kTool, kOptions, raw);
  if (!parsed) return usage(parsed.takeError().message());
  const cli::ParsedArgs& args = *parsed;
  if (args.has("--help")) {
    std::cout << "usage: " << kTool
              << " MODEL --input NAME=FILE.npy... --labels FILE.npy [--optimizer sgd|adamw] [--steps N] [--json]\n\n"
                 "Times the training step (forward, cross-entropy loss, backward, optimizer update) of MODEL\n"
                 "compiled by the CPU JIT, feeding each step's new parameters and state to the next.\n\n"
              << cli::formatOptions(kOptions);
    return cli::kExitOk;
  }
  if (args.positionals().size() != 1) return usage("expected one MODEL file");
  const std::string modelPath = args.positionals()[0];
  if (!args.has("--labels")) return usage("--labels FILE.npy is required");

  TrainingStepOptions stepOptions;
  double lr = 0.01, momentum = 0.9;
  int64_t steps = 20, warmup = 3;
  codegen::CpuOptions cpu;
  std::string optimizer = "sgd";
  if (const std::string* v = args.get("--optimizer")) optimizer = *v;
  if (optimizer != "sgd" && optimizer != "adamw")
    return usage("--optimizer is '" + optimizer + "', expected sgd or adamw");
  if (const std::string* v = args.get("--lr")) {
    auto x = parseNumber(*v, "--lr", 0, 1e6);
    if (!x) return usage(x.takeError().message());
    lr = *x;
  }
  if (const std::string* v = args.get("--momentum")) {
    auto x = parseNumber(*v, "--momentum", 0, 1);
    if (!x) return usage(x.takeError().message());
    momentum = *x;
  }
  for (auto [name, target, lo] : {std::tuple{"--steps", &steps, 1}, {"--warmup", &warmup, 0}}) {
    if (const std::string* v = args.get(name)) {
      auto n = cli::parseInteger(*v, name, lo, 1000000);
      if (!n) return usage(n.takeError().message());
      *target = *n;
    }
  }
  if (const std::string* v = args.get("--threads")) {
    auto n = cli::parseInteger(*v, "--threads", 1, 4096);
    if (!n) return usage(n.takeError().message());
    cpu.threads = static_cast<int>(*n);
  }
  if (const std::string* v = args.get("-O")) {
    auto n = cli::parseInteger(*v, "-O", 0, 3);
    if (!n) return usage(n.takeError().message());
    cpu.optLevel = static_cast<int>(*n);
  }
  if (!args.has("--no-cache")) cpu.cacheDir = defaultCacheDir();
  codegen::StepProfile profile;
  if (args.has("--profile")) cpu.profile = &profile;
  if (optimizer == "sgd") {
    stepOptions.optimizer.kind = OptimizerKind::Sgd;
    stepOptions.optimizer.momentum = momentum;
  } else {
    stepOptions.optimizer.kind = OptimizerKind::AdamW;
    stepOptions.optimizer.weightDecay = 0.01;  // torch.optim.AdamW's default
  }

  // The batch.
  std::map<std::string, Tensor> batch;
  for (const std::string& binding : args.all("--input")) {
    const size_t eq = binding.find('=');
    if (eq == std::string::npos || eq == 0)
      return usage("--input '" + binding + "' is not NAME=FILE.npy");
    auto t = readNpy(binding.substr(eq + 1));
    if (!t) return fail(t.takeError().message());
    batch[binding.substr(0, eq)] = std::move(*t);
  }
  auto labelsRead = readNpy(*args.get("--labels"));
  if (!labelsRead) return fail(labelsRead.takeError().message());
  Tensor labels = std::move(*labelsRead);
  if (labels.dtype() != DType::I64) return fail("--labels " + *args.get("--labels") + " is " + labels.type().str() +
                                                ", expected int64 class indices");

  // The model for training, specialized to the batch's shapes, as `kiln
  // train` loads it.
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : batch) shapes[name] = t.shape();
  auto loaded = training::loadTrainableModel(modelPath, shapes, Session::evaluator());
  if (!loaded) return fail(loaded.takeError().message());
  Module& module = **loaded;
  Function& f = *module.functions().front();
  size_t numParams = 0;  // buildTrainingStep's default choice: float arguments with defaults
  for (size_t i = 0; i < f.numArguments(); ++i)
    if (f.argumentDefault(i) && isFloat(f.argument(i)->type().dtype)) ++numParams;
  auto flattened = flattenTokenScores(f);
  if (!flattened) return fail(modelPath + ": " + flattened.takeError().message());
  if (*flattened) {
    Tensor flat(DType::I64, {static_cast<int64_t>(labels.numBytes() / sizeof(int64_t))});
    std::memcpy(flat.raw(), labels.raw(), labels.numBytes());
    labels = std::move(flat);
  }
  // Cross-entropy's labels index dim 1 of the scores; PyTorch refuses one
  // outside [0, C) (other than ignore_index), and so does this tool, where
  // the compiled loss would silently count it as a zero score.
  if (const TensorType scores = f.resultTypes().front(); scores.rank() >= 2 && scores.shape[1].isStatic()) {
    const int64_t classes = scores.shape[1].size;
    for (int64_t i = 0; i < labels.numElements(); ++i) {
      const int64_t label = labels.getInt(i);
      if ((label < 0 || label >= classes) && label != stepOptions.loss.ignoreIndex)
        return fail("--labels " + *args.get("--labels") + ": label " + std::to_string(label) + " at " +
                    std::to_string(i) + " is outside [0, " + std::to_string(classes) + "), the model's classes");
    }
  }
  if (Status s = training::makeTrainingStep(f, stepOptions, /*classesLast=*/false); !s)
    return fail(modelPath + ": " + s.takeError().message());
  if (const std::string* path = args.get("--save-step"))
    if (Status s = saveModel(module, *path); !s) return fail(s.takeError().message());

  // The arguments: parameters and state from their defaults, the batch by
  // name, the labels and the learning rate.
  training::StepFeed feed;
  feed.inputs = std::move(batch);
  feed.labels = std::move(labels);
  feed.lr = training::learningRateTensor(f.resultTypes().front().dtype, lr);
  auto bound = training::bindStepInputs(f, {}, std::move(feed));
  if (!bound)
    return fail(modelPath + ": " + bound.takeError().message() + " (the batch is given with --input NAME=FILE.npy)");
  std::vector<Tensor>& inputs = *bound;
  // Parameters and optimizer state are donated: each step writes their new
  // values into `inputs` (runInPlace), as `kiln train` runs its step.
  auto precision = cli::precisionOption(args);
  if (!precision) return usage(precision.error().message());
  auto created = Session::create({.device = "cpu", .allowFallback = false, .cpu = cpu, .precision = *precision});
  std::unique_ptr<Session> session = std::move(std::get<std::unique_ptr<Session>>(created));  // the CPU is always there
  auto model = session->compile(f, {.aliases = trainingStepAliases(f)});
  if (!model) return fail(model.takeError().message());
  const auto compileStart = std::chrono::steady_clock::now();
  Status prepared = (*model)->prepare(inputs);
  for (const std::string& notice : session->takeNotices()) std::cerr << kTool << ": note: " << notice << "\n";
  if (!prepared) return fail(prepared.takeError().message());
  const double compileMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - compileStart).count();

  std::vector<double> times, losses;
  for (int64_t k = 0; k < warmup + steps; ++k) {
    if (k == warmup) profile.entries.clear();  // only the timed steps
    const auto start = std::chrono::steady_clock::now();
    auto outputs = (*model)->runInPlace(inputs);
    const auto stop = std::chrono::steady_clock::now();
    if (!outputs) return fail("step " + std::to_string(k + 1) + ": " + outputs.takeError().message());
    if (k >= warmup) times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    losses.push_back((*outputs)[0].getDouble(0));
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = cli::median(times);
  if (args.has("--json")) {
    std::cout << "{\"model\": " << jsonString(modelPath) << ", \"optimizer\": \"" << optimizer
              << "\", \"parameters\": " << numParams << ", \"steps\": " << n << ", \"median_ms\": " << millis(median)
              << ", \"min_ms\": " << millis(sorted.front()) << ", \"max_ms\": " << millis(sorted.back())
              << ", \"compile_ms\": " << millis(compileMs) << ", \"losses\": [";
    for (size_t i = 0; i < losses.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", losses[i]);
      std::cout << (i ? ", " : "") << buf;
    }
    std::cout << "]}\n";
  } else {
    std::cout << "training step: median " << millis(median) << " ms, min " << millis(sorted.front()) << " ms, max "
              << millis(sorted.back()) << " ms (" << n << " steps after " << warmup << " warm-up; compiled in "
              << millis(compileMs) << " ms)\nloss: first " << losses.front() << ", last " << losses.back() << "\n";
  }
  if (args.has("--profile")) std::cerr << profile.format();
  return cli::kExitOk;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::runBench(argc, argv); }
