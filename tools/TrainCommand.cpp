// `kiln train`: trains a model on arrays from a .npz file. The model's
// weights become the parameters of one training-step function
// (passes/TrainingStep.h: forward, loss, backward and optimizer update as
// graph ops), which the CPU JIT compiles once per batch size it meets: the
// batch size, and the size of the last, partial batch of an epoch unless
// --drop-last drops it. The loop feeds each step's new parameters and
// optimizer state back as the next step's arguments.
//
// Everything that can be checked before training is: the files, the arrays'
// names, dtypes and per-sample shapes against the model's input and output,
// labels in range, non-finite inputs, the batch size against the data, the
// output and checkpoint paths. Each problem is one line naming the file,
// what was wrong and what was expected, and nothing is trained or written.
//
// Batches: each epoch visits the samples in an order drawn from --seed and
// the epoch number alone (no generator state is carried between epochs), so
// a checkpoint needs only the step count to resume exactly. The next batch
// is gathered on a background thread while the current step runs (double
// buffering; --no-overlap gathers in line, with the same batches).
//
// Numerics: a non-finite loss stops training with the step number. With
// --check-numerics every result of every step is checked, and on the first
// non-finite value the step is run again on the reference interpreter op by
// op to name the first op whose result is not finite.
//
// docs/cli.md documents the command, docs/training.md the loop.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "codegen/Session.h"
#include "codegen/CpuExecutable.h"
#include "codegen/ThreadChooser.h"
#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "frontend/onnx/OnnxTraining.h"
#include "ir/Builder.h"
#include "ir/Verifier.h"
#include "passes/PassManager.h"
#include "passes/TrainingStep.h"
#include "runtime/Interpreter.h"
#include "runtime/Npz.h"
#include "tools/DeviceSelection.h"
#include "tools/KilnCommands.h"
#include "tools/TrainData.h"
#include "training/TrainableModel.h"

namespace kiln::cli {

namespace {

using namespace train;

constexpr std::string_view kName = "train";

constexpr OptionSpec kOptions[] = {
    {"--data", "FILE.npz", "the training data: arrays x (the model's input) and y (the labels)"},
    {"--data-keys", "X,Y", "the names of the input and label arrays in the .npz files (default: x,y)"},
    {"--zero-inputs", "NAME,...",
     "model inputs besides the one x feeds that take zeros at every step (an RNN's initial "
     "state, as PyTorch's default); their dims named like x's batch dim take the batch size"},
    {"--eval", "FILE.npz",
     "evaluate on this data after each epoch: loss, and accuracy and a confusion matrix for "
     "class losses"},
    {"--eval-every", "N",
     "--eval: also evaluate every N steps (\"eval at step S: ...\"; a step that ends an epoch is evaluated once)"},
    {"--loss", "cross_entropy|nll|mse", "the loss on the model's first output (default: cross_entropy)"},
    {"--label-smoothing", "X", "cross_entropy: label smoothing in [0, 1] (default: 0)"},
    {"--ignore-index", "N",
     "cross_entropy, nll: labels equal to N are no class: they add no loss and are left out of the mean, the "
     "accuracy and the confusion matrix (default: -100, as PyTorch)"},
    {"--reduction", "mean|sum",
     "cross_entropy, nll, mse: the step's loss is the mean over the labels (default) or their sum (eval reports "
     "the mean either way)"},
    {"--classes-last", "",
     "cross_entropy, nll: the classes are the output's last dim ([N, T, C] logits of a "
     "sequence model, labels [N, T]) instead of dim 1"},
    {"--optimizer", "sgd|adam|adamw", "the optimizer, with torch.optim's formulas (default: sgd)"},
    {"--lr", "X", "the learning rate (required for sgd; default 0.001 for adam and adamw)"},
    {"--momentum", "X", "sgd: momentum (default: 0)"},
    {"--nesterov", "", "sgd: Nesterov momentum"},
    {"--weight-decay", "X", "sgd, adam: L2 penalty; adamw: decoupled decay (default: 0, adamw 0.01)"},
    {"--betas", "B1,B2", "adam, adamw: the moment decay rates (default: 0.9,0.999)"},
    {"--eps", "X", "adam, adamw: the denominator's epsilon (default: 1e-8)"},
    {"--lr-schedule", "constant|step|cosine", "the learning rate over the steps (default: constant)"},
    {"--lr-step-size", "N", "step schedule: multiply the rate by --lr-gamma every N steps"},
    {"--lr-gamma", "X", "step schedule: the factor (default: 0.1)"},
    {"--warmup-steps", "N", "cosine schedule: steps of linear warm-up from 0 (default: 0)"},
    {"--min-lr", "X", "cosine schedule: the rate at the last step (default: 0)"},
    {"--batch-norm", "train|frozen",
     "batch norms: normalize each batch with its own statistics and update the running ones, as PyTorch's "
     "model.train() (default: train), or keep normalizing with the model's running statistics"},
    {"--bn-momentum", "X",
     "batch norm train mode: the running statistics' update rate, torch.nn.BatchNorm's momentum, for every batch "
     "norm (default: each batch norm's own from the model, 1 - an ONNX momentum; 0.1 without one)"},
    {"--batch-size", "N", "samples per step (default: 32)"},
    {"--epochs", "N", "passes over the data (default: 1)"},
    {"--steps", "N", "optimizer steps in all, instead of --epochs (counted from the start, also with --resume)"},
    {"--seed", "N", "the seed of the shuffled sample order (default: 0)"},
    {"--no-shuffle", "", "visit the samples in file order"},
    {"--drop-last", "", "drop each epoch's last batch when it is smaller than --batch-size"},
    {"--device", "cpu|cuda[:N]|auto", "where to train (default: cpu); cuda never falls back to the CPU"},
    {"--threads", "N|auto",
     "CPU JIT: threads that split each kernel (default: all cores); auto: all cores or one, whichever the steps "
     "measure faster (on a machine other programs keep busy, one), re-checked as training goes on"},
    {"--output", "OUT", "write the trained model (an ONNX model as .onnx with its initializers' names kept)", false,
     "-o"},
    {"--checkpoint-every", "N", "write a checkpoint every N steps (needs --checkpoint-dir)"},
    {"--checkpoint-dir", "DIR", "where checkpoints go, as DIR/step-N.npz"},
    {"--resume", "CKPT.npz", "continue from a checkpoint of this model and data (same batch size, seed, shuffling)"},
    {"--check-numerics", "", "check every value of every step; name the op that first produces a NaN or Inf"},
    {"--no-overlap", "", "gather each batch in line instead of on a background thread during the previous step"},
    {"--log-every", "N", "when stderr is not a terminal: a progress line every N steps (default: about 10 lines)"},
    {"--help", "", "show this help", false, "-h"},
};

using Clock = std::chrono::steady_clock;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

/// A whole, finite decimal number.
Expected<double> parseNumber(const std::string& text, std::string_view what) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    return Error(std::string(what) + " expects a finite number, got '" + text + "'");
  return v;
}

// ---------------------------------------------------------------------------
// Options

struct TrainOptions {
  std::string modelPath, dataPath, evalPath, outputPath, checkpointDir, resumePath;
  std::string xKey = "x", yKey = "y";
  std::vector<std::string> zeroInputs;
  TrainingStepOptions step;
  double lr = 0;
  int64_t batchSize = 32;
  std::optional<int64_t> epochs, steps;
  uint64_t seed = 0;
  bool shuffle = true, dropLast = false, overlap = true, checkNumerics = false;
  bool autoThreads = false;  // --threads auto (codegen/ThreadChooser.h)
  /// The class axis of cross_entropy and nll is the output's last, not 1.
  bool classesLast = false;
  int64_t checkpointEvery = 0;
  int64_t evalEvery = 0;  // 0: after each epoch only
  std::optional<int64_t> logEvery;
  codegen::CpuOptions cpu;
};

/// Fills `o` from the command line; a usage error's message otherwise.
std::optional<std::string> parseOptions(const ParsedArgs& args, TrainOptions& o) {
  const auto& positionals = args.positionals();
  if (positionals.empty()) return "missing the MODEL to train";
  if (positionals.size() > 1) return "unexpected argument '" + positionals[1] + "': the data is given with --data";
  o.modelPath = positionals[0];
  if (!args.get("--data")) return "missing --data FILE.npz (the training data)";
  o.dataPath = *args.get("--data");
  if (const std::string* v = args.get("--eval")) o.evalPath = *v;
  if (const std::string* keys = args.get("--data-keys")) {
    const size_t comma = keys->find(',');
    if (comma == std::string::npos || comma == 0 || comma + 1 == keys->size() ||
        keys->find(',', comma + 1) != std::string::npos)
      return "--data-keys expects X,Y (the input and label array names), got '" + *keys + "'";
    o.xKey = keys->substr(0, comma);
    o.yKey = keys->substr(comma + 1);
    if (o.xKey == o.yKey) return "--data-keys names the same array '" + o.xKey + "' twice";
  }

  if (const std::string* names = args.get("--zero-inputs")) {
    for (size_t start = 0; start <= names->size();) {
      const size_t comma = std::min(names->find(',', start), names->size());
      const std::string name = names->substr(start, comma - start);
      if (name.empty()) return "--zero-inputs expects NAME,... (model input names), got '" + *names + "'";
      o.zeroInputs.push_back(name);
      start = comma + 1;
    }
  }

  auto number = [&](std::string_view name, double& out) -> std::optional<std::string> {
    if (const std::string* v = args.get(name)) {
      auto parsed = parseNumber(*v, name);
      if (!parsed) return parsed.error().message();
      out = *parsed;
    }
    return std::nullopt;
  };
  auto integer = [&](std::string_view name, int64_t minValue,
                     std::optional<int64_t>& out) -> std::optional<std::string> {
    if (const std::string* v = args.get(name)) {
      auto parsed = parseInteger(*v, name, minValue, int64_t{1} << 40);
      if (!parsed) return parsed.error().message();
      out = *parsed;
    }
    return std::nullopt;
  };

  const std::string loss = args.get("--loss") ? *args.get("--loss") : "cross_entropy";
  if (loss == "cross_entropy")
    o.step.loss.kind = LossKind::CrossEntropy;
  else if (loss == "nll")
    o.step.loss.kind = LossKind::Nll;
  else if (loss == "mse")
    o.step.loss.kind = LossKind::Mse;
  else
    return "--loss expects cross_entropy, nll or mse, got '" + loss + "'";
  if (auto e = number("--label-smoothing", o.step.loss.labelSmoothing)) return e;
  if (args.has("--label-smoothing") && o.step.loss.kind != LossKind::CrossEntropy)
    return "--label-smoothing applies to --loss cross_entropy only";
  std::optional<int64_t> ignoreIndex;
  if (auto e = integer("--ignore-index", -(int64_t{1} << 40), ignoreIndex)) return e;
  if (ignoreIndex) {
    if (o.step.loss.kind == LossKind::Mse) return "--ignore-index applies to class losses, not mse";
    o.step.loss.ignoreIndex = *ignoreIndex;
  }
  const std::string reduction = args.get("--reduction") ? *args.get("--reduction") : "mean";
  if (reduction != "mean" && reduction != "sum") return "--reduction expects mean or sum, got '" + reduction + "'";
  o.step.loss.reduction = reduction;
  o.classesLast = args.has("--classes-last");
  if (o.classesLast && o.step.loss.kind == LossKind::Mse) return "--classes-last applies to class losses, not mse";
  if (o.step.loss.labelSmoothing < 0 || o.step.loss.labelSmoothing > 1)
    return "--label-smoothing expects a value in [0, 1], got " + *args.get("--label-smoothing");

  const std::string optimizer = args.get("--optimizer") ? *args.get("--optimizer") : "sgd";
  OptimizerConfig& opt = o.step.optimizer;
  if (optimizer == "sgd")
    opt.kind = OptimizerKind::Sgd;
  else if (optimizer == "adam")
    opt.kind = OptimizerKind::Adam;
  else if (optimizer == "adamw")
    opt.kind = OptimizerKind::AdamW;
  else
    return "--optimizer expects sgd, adam or adamw, got '" + optimizer + "'";
  const bool sgd = opt.kind == OptimizerKind::Sgd;
  for (std::string_view sgdOnly : {"--momentum", "--nesterov"})
    if (!sgd && args.has(sgdOnly)) return std::string(sgdOnly) + " applies to --optimizer sgd only";
  for (std::string_view adamOnly : {"--betas", "--eps"})
    if (sgd && args.has(adamOnly)) return std::string(adamOnly) + " applies to --optimizer adam and adamw only";
  if (!args.get("--lr") && sgd) return "--optimizer sgd needs a learning rate: --lr X";
  o.lr = sgd ? 0 : 1e-3;
  if (auto e = number("--lr", o.lr)) return e;
  if (o.lr <= 0) return "--lr expects a positive learning rate, got " + *args.get("--lr");
  if (opt.kind == OptimizerKind::AdamW) opt.weightDecay = 0.01;  // torch.optim.AdamW's default
  if (auto e = number("--weight-decay", opt.weightDecay)) return e;
  if (opt.weightDecay < 0) return "--weight-decay expects a value >= 0, got " + *args.get("--weight-decay");
  if (auto e = number("--momentum", opt.momentum)) return e;
  if (opt.momentum < 0) return "--momentum expects a value >= 0, got " + *args.get("--momentum");
  opt.nesterov = args.has("--nesterov");
  if (opt.nesterov && opt.momentum == 0) return "--nesterov needs --momentum greater than 0";
  if (const std::string* betas = args.get("--betas")) {
    const size_t comma = betas->find(',');
    auto b1 = parseNumber(comma == std::string::npos ? *betas : betas->substr(0, comma), "--betas");
    auto b2 = parseNumber(comma == std::string::npos ? "" : betas->substr(comma + 1), "--betas");
    if (!b1 || !b2 || *b1 < 0 || *b1 >= 1 || *b2 < 0 || *b2 >= 1)
      return "--betas expects B1,B2, two numbers in [0, 1), got '" + *betas + "'";
    opt.beta1 = *b1;
    opt.beta2 = *b2;
  }
  if (auto e = number("--eps", opt.eps)) return e;
  if (opt.eps < 0) return "--eps expects a value >= 0, got " + *args.get("--eps");

  LrScheduleConfig& schedule = o.step.schedule;
  const std::string scheduleName = args.get("--lr-schedule") ? *args.get("--lr-schedule") : "constant";
  if (scheduleName == "constant")
    schedule.kind = LrScheduleKind::Constant;
  else if (scheduleName == "step")
    schedule.kind = LrScheduleKind::Step;
  else if (scheduleName == "cosine")
    schedule.kind = LrScheduleKind::CosineWarmup;
  else
    return "--lr-schedule expects constant, step or cosine, got '" + scheduleName + "'";
  for (std::string_view stepOnly : {"--lr-step-size", "--lr-gamma"})
    if (args.has(stepOnly) && schedule.kind != LrScheduleKind::Step)
      return std::string(stepOnly) + " applies to --lr-schedule step only";
  for (std::string_view cosineOnly : {"--warmup-steps", "--min-lr"})
    if (args.has(cosineOnly) && schedule.kind != LrScheduleKind::CosineWarmup)
      return std::string(cosineOnly) + " applies to --lr-schedule cosine only";
  std::optional<int64_t> stepSize, warmup;
  if (auto e = integer("--lr-step-size", 1, stepSize)) return e;
  if (schedule.kind == LrScheduleKind::Step && !stepSize) return "--lr-schedule step needs --lr-step-size N";
  schedule.stepSize = stepSize.value_or(1);
  if (auto e = number("--lr-gamma", schedule.gamma)) return e;
  if (schedule.gamma <= 0) return "--lr-gamma expects a factor > 0, got " + *args.get("--lr-gamma");
  if (auto e = integer("--warmup-steps", 0, warmup)) return e;
  schedule.warmupSteps = warmup.value_or(0);
  if (auto e = number("--min-lr", schedule.minLr)) return e;
  if (schedule.minLr < 0) return "--min-lr expects a rate >= 0, got " + *args.get("--min-lr");

  const std::string batchNorm = args.get("--batch-norm") ? *args.get("--batch-norm") : "train";
  if (batchNorm == "train")
    o.step.batchNorm.mode = BatchNormMode::Train;
  else if (batchNorm == "frozen")
    o.step.batchNorm.mode = BatchNormMode::Frozen;
  else
    return "--batch-norm expects train or frozen, got '" + batchNorm + "'";
  if (args.has("--bn-momentum") && o.step.batchNorm.mode != BatchNormMode::Train)
    return "--bn-momentum applies to --batch-norm train only";
  if (args.has("--bn-momentum")) {
    double m = 0;
    if (auto e = number("--bn-momentum", m)) return e;
    if (!(m > 0 && m <= 1)) return "--bn-momentum expects a value in (0, 1], got " + *args.get("--bn-momentum");
    o.step.batchNorm.momentum = m;
  }

  std::optional<int64_t> batch, seed, every, threads;
  if (auto e = integer("--batch-size", 1, batch)) return e;
  if (batch) o.batchSize = *batch;
  if (auto e = integer("--epochs", 1, o.epochs)) return e;
  if (auto e = integer("--steps", 1, o.steps)) return e;
  if (o.epochs && o.steps) return "--epochs and --steps contradict each other: give one";
  if (!o.steps && !o.epochs) o.epochs = 1;
  if (auto e = integer("--seed", 0, seed)) return e;
  if (seed) o.seed = static_cast<uint64_t>(*seed);
  o.shuffle = !args.has("--no-shuffle");
  if (seed && !o.shuffle) return "--seed chooses the shuffled order, and --no-shuffle turns shuffling off";
  o.dropLast = args.has("--drop-last");
  o.overlap = !args.has("--no-overlap");
  o.checkNumerics = args.has("--check-numerics");
  if (auto e = integer("--log-every", 1, o.logEvery)) return e;
  o.autoThreads = args.get("--threads") && *args.get("--threads") == "auto";
  if (!o.autoThreads && integer("--threads", 1, threads))
    return "--threads expects a number of threads (1 or more) or auto, got '" + *args.get("--threads") + "'";
  if (threads) o.cpu.threads = static_cast<int>(std::min<int64_t>(*threads, 4096));
  o.cpu.cacheDir = kernelCacheDir(args);

  if (const std::string* out = args.get("--output")) {
    if (out->empty()) return "-o needs a file name";
    o.outputPath = *out;
  }
  std::optional<int64_t> checkpointEvery;
  if (auto e = integer("--checkpoint-every", 1, checkpointEvery)) return e;
  if (const std::string* dir = args.get("--checkpoint-dir")) o.checkpointDir = *dir;
  if (checkpointEvery && o.checkpointDir.empty()) return "--checkpoint-every needs --checkpoint-dir DIR";
  if (!checkpointEvery && !o.checkpointDir.empty()) return "--checkpoint-dir needs --checkpoint-every N";
  o.checkpointEvery = checkpointEvery.value_or(0);
  if (const std::string* resume = args.get("--resume")) o.resumePath = *resume;
  std::optional<int64_t> evalEvery;
  if (auto e = integer("--eval-every", 1, evalEvery)) return e;
  if (evalEvery && !args.has("--eval")) return "--eval-every needs --eval FILE.npz";
  o.evalEvery = evalEvery.value_or(0);
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// The model

/// The model at `path` for training (training/TrainableModel.h).
Expected<std::unique_ptr<Module>> loadTrainable(const std::string& path,
                                                const std::map<std::string, std::vector<int64_t>>& shapes) {
  return training::loadTrainableModel(path, shapes, Session::evaluator());
}

/// What the loop needs to know of the model's signature.
struct ModelSignature {
  std::vector<std::string> params;  // trained arguments, in argument order
  size_t dataArg = 0;               // the argument the x array feeds
  TensorType input, output;
  std::string inputName, outputName;
  /// --zero-inputs: name -> declared type.
  std::map<std::string, TensorType> zeroInputs;
  /// The training data's sample shape (x's dims after the first): the fed
  /// input's dims after the batch dim, symbolic ones included.
  std::vector<int64_t> sampleShape;

  /// The static shape of zero input `name` for batches of `batch`.
  std::vector<int64_t> zeroShape(const std::string& name, int64_t batch) const {
    std::vector<int64_t> shape;
    for (const Dim& d : zeroInputs.at(name).shape) shape.push_back(d.isStatic() ? d.size : batch);
    return shape;
  }
};

Expected<ModelSignature> signatureOf(const Function& f, const std::string& path,
                                     const std::vector<std::string>& zeroInputs) {
  ModelSignature s;
  if (f.resultTypes().empty()) return Error(path + ": the model has no output to put a loss on");
  s.output = f.resultTypes()[0];
  s.outputName = f.resultName(0).empty() ? "output 0" : "'" + f.resultName(0) + "'";
  if (!isFloat(s.output.dtype))
    return Error(path + ": the model's output " + s.outputName + " is " + s.output.str() +
                 "; a loss needs a float output");
  std::vector<std::string> data;
  std::string all;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const Value* a = f.argument(i);
    if (f.argumentDefault(i)) {
      if (a->type().dtype == s.output.dtype) s.params.push_back(a->name());
      continue;
    }
    const std::string name = a->name().empty() ? "#" + std::to_string(i) : a->name();
    all += (all.empty() ? "" : ", ") + name + " (" + a->type().str() + ")";
    if (std::find(zeroInputs.begin(), zeroInputs.end(), name) != zeroInputs.end()) {
      s.zeroInputs[name] = a->type();
      continue;
    }
    data.push_back(name);
    s.dataArg = i;
  }
  for (const std::string& name : zeroInputs)
    if (!s.zeroInputs.count(name))
      return Error(path + ": --zero-inputs names '" + name + "', which is not an input without a default of the " +
                   "model (those are: " + (all.empty() ? "none" : all) + ")");
  if (data.size() != 1) {
    std::string list;
    for (const std::string& d : data) list += (list.empty() ? "" : ", ") + d;
    return Error(path + ": kiln train feeds one model input from the data's x array, but the model has " +
                 std::to_string(data.size()) + " inputs without a default" + (list.empty() ? "" : " (" + list + ")") +
                 (data.size() > 1 ? "; give the others zeros with --zero-inputs NAME,..." : ""));
  }
  if (s.params.empty())
    return Error(path + ": the model has no weights to train (no " + std::string(dtypeName(s.output.dtype)) +
                 " initializer or argument with a default)");
  s.input = f.argument(s.dataArg)->type();
  s.inputName = data[0];
  if (s.input.rank() < 1) return Error(path + ": the model's input '" + s.inputName + "' is a scalar; no batch dim");
  // A zero input's dims are static or the batch dim's symbol.
  const Dim& batchDim = s.input.shape[0];
  for (const auto& [name, type] : s.zeroInputs)
    for (const Dim& d : type.shape)
      if (!d.isStatic() && !(batchDim.isSymbolic() && d.isSymbolic() && d.symbol == batchDim.symbol))
        return Error(path + ": --zero-inputs: input '" + name + "' (" + type.str() + ") has dim " + d.str() +
                     ", which is neither fixed nor the batch dim of '" + s.inputName + "' (" + s.input.str() +
                     "), so its size is unknown");
  if (s.output.rank() < 1) return Error(path + ": the model's output " + s.outputName + " is a scalar; no batch dim");
  return s;
}

/// The model specialized to the first batch, for a model that does not
/// import with a dynamic batch dim, and its data inputs' declared types.
struct SpecializedSignature {
  std::unique_ptr<Module> module;
  std::vector<std::pair<std::string, TensorType>> declared;
};

/// Loads the ONNX model of `o` with its one fed input specialized to the
/// first batch of the training data (x's sample shape, min(batch size,
/// samples) rows) and --zero-inputs to theirs. The caller reports an error
/// after the unspecialized import's.
Expected<SpecializedSignature> loadSpecializedToFirstBatch(const TrainOptions& o) {
  auto declared = readOnnxDataInputs(o.modelPath);
  if (!declared) return declared.takeError();
  const std::pair<std::string, TensorType>* fed = nullptr;
  for (const auto& input : *declared)
    if (std::find(o.zeroInputs.begin(), o.zeroInputs.end(), input.first) == o.zeroInputs.end()) {
      if (fed) return Error("the model has several inputs without a default; give all but one zeros with --zero-inputs");
      fed = &input;
    }
  if (!fed || fed->second.rank() < 1) return Error("the model has no input with a batch dim for the data");
  auto arrays = readNpz(o.dataPath);
  if (!arrays) return arrays.takeError();
  const Tensor* x = nullptr;
  for (const NpzArray& a : *arrays)
    if (a.name == o.xKey) x = &a.tensor;
  if (!x) return Error(o.dataPath + " has no array '" + o.xKey + "'");
  const TensorType& type = fed->second;
  bool fits = x->rank() == type.rank() && x->shape()[0] > 0;
  for (int64_t k = 1; fits && k < type.rank(); ++k)
    fits = !type.shape[k].isStatic() || type.shape[k].size == x->shape()[k];
  if (!fits)
    return Error(o.dataPath + ": '" + o.xKey + "' (" + shapeString(x->shape()) + ") does not fit the model's input '" +
                 fed->first + "' (" + type.str() + ")");
  const int64_t batch = std::min(o.batchSize, x->shape()[0]);
  const Dim& batchDim = type.shape[0];
  std::map<std::string, std::vector<int64_t>> shapes;
  shapes[fed->first] = x->shape();
  shapes[fed->first][0] = batch;
  for (const auto& input : *declared) {
    if (&input == fed) continue;
    std::vector<int64_t> shape;
    for (const Dim& d : input.second.shape) {
      if (!d.isStatic() && !(batchDim.isSymbolic() && d.isSymbolic() && d.symbol == batchDim.symbol))
        return Error("--zero-inputs: input '" + input.first + "' (" + input.second.str() + ") has dim " + d.str() +
                     ", which is neither fixed nor the batch dim of '" + fed->first + "'");
      shape.push_back(d.isStatic() ? d.size : batch);
    }
    shapes[input.first] = shape;
  }
  auto module = loadTrainable(o.modelPath, shapes);
  if (!module) return module.takeError();
  return SpecializedSignature{std::move(*module), std::move(*declared)};
}

// ---------------------------------------------------------------------------
// Compiled programs, one per batch size

/// Runs a compiled program; a training step that donates its parameters and
/// state (runInPlace) leaves their new values in its inputs.
using Runner = std::function<Expected<std::vector<Tensor>>(std::vector<Tensor>&)>;

struct Program {
  std::unique_ptr<Module> forward;  // the model specialized to the batch size
  std::unique_ptr<Module> step;     // its training step
  std::unique_ptr<codegen::CpuExecutor> stepExecutor, forwardExecutor;
  Runner runStep, runForward;
  int64_t stepRuns = 0;
  /// The step compiled for one thread, when the thread chooser asks for it:
  /// oneDNN plans each primitive's split for the threads current when it is
  /// created, so fewer threads need primitives of their own.
  std::unique_ptr<codegen::CpuExecutor> stepExecutorOne;
  Runner runStepOne;
};

class Trainer {
 public:
  Trainer(const TrainOptions& o, const ModelSignature& sig) : o_(o), sig_(sig) {}

  /// The training step for batches of `batch` samples, built and compiled
  /// on first use.
  Expected<Program*> program(int64_t batch) {
    auto it = programs_.find(batch);
    if (it != programs_.end()) return it->second.get();
    auto p = std::make_unique<Program>();
    std::vector<int64_t> shape = {batch};
    shape.insert(shape.end(), sig_.sampleShape.begin(), sig_.sampleShape.end());
    std::map<std::string, std::vector<int64_t>> shapes = {{sig_.inputName, shape}};
    for (const auto& [name, type] : sig_.zeroInputs) shapes[name] = sig_.zeroShape(name, batch);
    auto forward = loadTrainable(o_.modelPath, shapes);
    if (!forward) return forward.takeError();
    p->forward = std::move(*forward);
    p->step = std::make_unique<Module>();
    p->step->addFunction(p->forward->functions().front()->clone());
    Function& f = *p->step->functions().front();
    if (o_.classesLast && f.resultTypes()[0].rank() > 2) {
      // [N, T..., C] -> [N, C, T...]: the class axis where the loss ops read
      // it, as PyTorch's cross_entropy(logits.transpose(1, 2), labels).
      const int64_t rank = f.resultTypes()[0].rank();
      std::vector<int64_t> perm = {0, rank - 1};
      for (int64_t d = 1; d < rank - 1; ++d) perm.push_back(d);
      Builder b(f);
      auto transposed = b.value(OpKind::Transpose, {f.returnOp()->operand(0)}, {{"perm", Attribute(perm)}});
      if (!transposed) return transposed.takeError();
      std::vector<Value*> results(f.returnOp()->operands().begin(), f.returnOp()->operands().end());
      results[0] = *transposed;
      std::vector<TensorType> types = f.resultTypes();
      types[0] = (*transposed)->type();
      f.returnOp()->setOperands(results);
      f.setResultTypes(types);
    }
    TrainingStepOptions options = o_.step;
    options.parameters = sig_.params;
    KILN_TRY(buildTrainingStep(*p->step->functions().front(), options));
    return programs_.emplace(batch, std::move(p)).first->second.get();
  }

  /// Compiles `f` for `inputs`; when the JIT cannot lower some op yet, the
  /// interpreter runs it instead, with a notice naming the ops.
  /// With `donate` (a training step), the executor updates the parameters
  /// and state in place (trainingStepAliases, CpuExecutor::runInPlace).
  /// `threads` > 0 overrides --threads.
  Expected<Runner> compile(const Function& f, const std::vector<Tensor>& inputs,
                           std::unique_ptr<codegen::CpuExecutor>& executor, bool donate = false, int threads = 0) {
    codegen::CpuOptions cpu = o_.cpu;
    if (threads > 0) cpu.threads = threads;
    if (donate) cpu.aliases = trainingStepAliases(f);
    auto created = codegen::CpuExecutor::create(f, cpu);
    if (!created) return created.takeError();
    executor = std::move(*created);
    Status prepared = executor->prepare(inputs);
    for (const std::string& notice : executor->takeNotices()) std::cerr << "kiln train: note: " << notice << "\n";
    if (!prepared) {
      if (executor->unsupportedOps().empty()) return prepared.takeError();
      std::cerr << "kiln train: note: the CPU JIT cannot compile @" << f.name()
                << " yet, so it runs on the reference interpreter:";
      for (const std::string& op : executor->unsupportedOps()) std::cerr << "\n  " << op;
      std::cerr << "\n";
      executor.reset();
      return Runner([&f](const std::vector<Tensor>& in) { return interpret(f, in); });
    }
    codegen::CpuExecutor* e = executor.get();
    if (donate) return Runner([e](std::vector<Tensor>& in) { return e->runInPlace(in); });
    return Runner([e](std::vector<Tensor>& in) { return e->run(in); });
  }

  const TrainOptions& o_;
  const ModelSignature& sig_;
  std::map<int64_t, std::unique_ptr<Program>> programs_;
};

// ---------------------------------------------------------------------------
// Numerics

/// Describes `op` for a message: "'exp' (%h) at model.onnx: node '/Exp'".
std::string describeOp(const Op& op) {
  std::string s = "'" + std::string(op.name()) + "'";
  if (!op.result(0)->name().empty()) s += " (%" + op.result(0)->name() + ")";
  if (!op.loc().isUnknown()) s += " at " + op.loc().str();
  return s;
}

/// Runs the step on the interpreter op by op and names the first op whose
/// result holds a non-finite value.
std::string findNonFiniteOp(const Function& step, const std::vector<Tensor>& inputs) {
  std::string found;
  size_t index = 0;
  auto observer = [&](const Op& op, const std::vector<Tensor>& results) -> Status {
    ++index;
    for (const Tensor& r : results) {
      if (int64_t bad = firstNonFinite(r); bad >= 0) {
        found = "first produced by " + describeOp(op) + " (op " + std::to_string(index) +
                " of the training step): " + shortest(r.getDouble(bad)) + " at [" + indexString(bad, r.shape()) +
                "] of its " + r.type().str() + " result";
        return Error("stop");
      }
    }
    return Status::success();
  };
  auto r = interpret(step, inputs, observer);
  if (!found.empty()) return found;
  if (!r) return "the interpreter's re-run of the step failed: " + r.error().message();
  return "but the interpreter's re-run of the same step gives finite values everywhere (a difference between the "
         "CPU JIT and the interpreter)";
}

// ---------------------------------------------------------------------------
// Progress

class Progress {
 public:
  Progress(int64_t total, int64_t first, int64_t stepsPerEpoch, std::optional<int64_t> logEvery)
      : total_(total), first_(first), stepsPerEpoch_(stepsPerEpoch), tty_(isatty(fileno(stderr)) != 0) {
    every_ = logEvery.value_or(std::max<int64_t>(1, (total - first) / 10));
    start_ = last_ = Clock::now();
  }

  /// After step `step` (0-based) of `samples` samples with loss `loss`.
  void stepDone(int64_t step, int64_t samples, double loss) {
    samples_ += samples;
    lossSum_ += loss;
    ++lossCount_;
    const int64_t done = step + 1;
    const auto now = Clock::now();
    if (tty_) {
      if (now - last_ < std::chrono::milliseconds(100) && done != total_) return;
      std::cerr << "\r" << line(done) << "\033[K" << std::flush;
      drawn_ = true;
    } else {
      if (done % every_ != 0 && done != total_) return;
      std::cerr << line(done) << "\n";
    }
    last_ = now;
    lossSum_ = 0;
    lossCount_ = 0;
  }

  /// Erases the updating line before other output, which then takes its
  /// place; the next step draws it again below.
  void breakLine() {
    if (tty_ && drawn_) std::cerr << "\r\033[K" << std::flush;
    drawn_ = false;
  }

  /// Time not spent training (compiling, evaluating), left out of
  /// samples/s and the ETA.
  void exclude(Clock::duration d) { excluded_ += d; }
  /// Seconds spent training so far.
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_ - excluded_).count(); }
  double samplesPerSecond() const { return samples_ / std::max(seconds(), 1e-9); }
  void setLearningRate(double lr) { lr_ = lr; }
  int64_t samples() const { return samples_; }

 private:
  std::string line(int64_t done) const {
    const double elapsed = seconds();
    const double eta = done > first_ ? elapsed / static_cast<double>(done - first_) * (total_ - done) : 0;
    return "step " + std::to_string(done) + "/" + std::to_string(total_) + " epoch " +
           std::to_string((done - 1) / stepsPerEpoch_ + 1) + " loss " + fixed(lossSum_ / std::max(lossCount_, 1), 6) +
           " lr " + shortest(lr_) + " samples/s " + fixed(samplesPerSecond(), 1) + " eta " + fixed(eta, 1) + "s";
  }

  int64_t total_, first_, stepsPerEpoch_;
  bool tty_;
  int64_t every_;
  Clock::time_point start_, last_;
  Clock::duration excluded_{};
  double lr_ = 0;
  int64_t samples_ = 0;
  double lossSum_ = 0;
  int lossCount_ = 0;
  bool drawn_ = false;
};

// ---------------------------------------------------------------------------
// Evaluation

struct EvalResult {
  double loss = 0;
  int64_t correct = 0, counted = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted]
};

/// Adds the loss and predictions of `out` (the model's output on a batch)
/// against `labels` to `r`; losses are summed per label position.
void accumulateEval(const Tensor& out, const Tensor& labels, const TrainOptions& o, EvalResult& r) {
  const int64_t n = out.shape()[0];
  if (o.step.loss.kind == LossKind::Mse) {
    for (int64_t i = 0; i < out.numElements(); ++i) {
      const double d = out.getDouble(i) - labels.getDouble(i);
      r.loss += d * d;
    }
    r.counted += out.numElements();
    return;
  }
  // Element (sample b, class c, position k): [N, C, inner...] or, with
  // --classes-last, [N, inner..., C].
  const int64_t classes = o.classesLast ? out.shape().back() : out.shape()[1];
  const int64_t inner = out.numElements() / std::max<int64_t>(1, n * classes);
  auto at = [&](int64_t b, int64_t c, int64_t k) {
    return o.classesLast ? (b * inner + k) * classes + c : (b * classes + c) * inner + k;
  };
  if (r.confusion.empty()) r.confusion.assign(classes, std::vector<int64_t>(classes, 0));
  const double eps = o.step.loss.labelSmoothing;
  std::vector<double> logits(classes);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t k = 0; k < inner; ++k) {
      for (int64_t c = 0; c < classes; ++c) logits[c] = out.getDouble(at(b, c, k));
      const int64_t label = labels.getInt(b * inner + k);
      if (label == o.step.loss.ignoreIndex) continue;  // no loss, not counted, as PyTorch
      const int64_t predicted = std::max_element(logits.begin(), logits.end()) - logits.begin();
      if (o.step.loss.kind == LossKind::Nll) {
        r.loss -= logits[label];
      } else {
        const double m = logits[predicted];
        double sum = 0;
        for (double v : logits) sum += std::exp(v - m);
        const double logSum = m + std::log(sum);
        double smooth = 0;
        for (double v : logits) smooth += logSum - v;
        r.loss += (1 - eps) * (logSum - logits[label]) + eps / classes * smooth;
      }
      r.correct += predicted == label;
      ++r.counted;
      ++r.confusion[label][predicted];
    }
  }
}

std::string formatConfusion(const std::vector<std::vector<int64_t>>& m) {
  size_t width = 4;
  for (const auto& row : m)
    for (int64_t v : row) width = std::max(width, std::to_string(v).size() + 1);
  width = std::max(width, std::to_string(m.size()).size() + 1);
  auto cell = [&](const std::string& s, size_t w) { return std::string(w > s.size() ? w - s.size() : 0, ' ') + s; };
  std::string out = "confusion matrix (rows: true class, columns: predicted class):\n";
  out += cell("true\\pred", 9);
  for (size_t c = 0; c < m.size(); ++c) out += cell(std::to_string(c), width);
  out += "\n";
  for (size_t t = 0; t < m.size(); ++t) {
    out += cell(std::to_string(t), 9);
    for (int64_t v : m[t]) out += cell(std::to_string(v), width);
    out += "\n";
  }
  return out;
}

// ---------------------------------------------------------------------------
// Checkpoints and the trained model

/// Format 2 added kiln.train_options; format 1 checkpoints are refused.
constexpr int64_t kCheckpointVersion = 2;
constexpr std::string_view kCheckpointMeta = "kiln.train_state";
constexpr std::string_view kCheckpointOptions = "kiln.train_options";

/// Names and values of the step's leading arguments (parameters, then
/// optimizer state), as the checkpoint stores them.
struct TrainState {
  std::vector<std::string> names;
  std::vector<Tensor> values;
};

std::vector<int64_t> checkpointMeta(const TrainOptions& o, int64_t step, int64_t samples) {
  return {kCheckpointVersion, step, static_cast<int64_t>(o.seed), o.batchSize, o.shuffle, o.dropLast, samples};
}

/// The options a resumed run must share with the checkpoint to continue
/// the same optimization: the optimizer's, the learning rate and its
/// schedule, stored as kiln.train_options (float64, in this order).
struct CheckedOption {
  const char* name;
  double value;
  std::string (*show)(double);
};

std::string showNumber(double v) { return shortest(v); }
std::string showOptimizer(double v) {
  const int64_t k = static_cast<int64_t>(v);
  return k == static_cast<int64_t>(OptimizerKind::Sgd)    ? "sgd"
         : k == static_cast<int64_t>(OptimizerKind::Adam) ? "adam"
         : k == static_cast<int64_t>(OptimizerKind::AdamW) ? "adamw"
                                                            : shortest(v);
}
std::string showSchedule(double v) {
  const int64_t k = static_cast<int64_t>(v);
  return k == static_cast<int64_t>(LrScheduleKind::Constant)       ? "constant"
         : k == static_cast<int64_t>(LrScheduleKind::Step)         ? "step"
         : k == static_cast<int64_t>(LrScheduleKind::CosineWarmup) ? "cosine"
                                                                    : shortest(v);
}
std::string showFlag(double v) { return v != 0 ? "on" : "off"; }

std::vector<CheckedOption> checkpointOptions(const TrainOptions& o) {
  const OptimizerConfig& opt = o.step.optimizer;
  const LrScheduleConfig& sch = o.step.schedule;
  const bool cosine = sch.kind == LrScheduleKind::CosineWarmup;
  return {
      {"--optimizer", static_cast<double>(opt.kind), showOptimizer},
      {"--lr", o.lr, showNumber},
      {"--momentum", opt.momentum, showNumber},
      {"dampening", opt.dampening, showNumber},
      {"--nesterov", opt.nesterov ? 1.0 : 0.0, showFlag},
      {"--weight-decay", opt.weightDecay, showNumber},
      {"--betas (beta1)", opt.beta1, showNumber},
      {"--betas (beta2)", opt.beta2, showNumber},
      {"--eps", opt.eps, showNumber},
      {"--lr-schedule", static_cast<double>(sch.kind), showSchedule},
      {"--lr-step-size", static_cast<double>(sch.stepSize), showNumber},
      {"--lr-gamma", sch.gamma, showNumber},
      {"--warmup-steps", static_cast<double>(sch.warmupSteps), showNumber},
      {"--min-lr", sch.minLr, showNumber},
      // The cosine runs over the run's total steps; the others ignore them.
      {"the cosine schedule's total steps (--steps or --epochs)", cosine ? static_cast<double>(sch.totalSteps) : 0.0,
       showNumber},
  };
}

Status writeCheckpoint(const std::string& path, const TrainState& state, const std::vector<int64_t>& meta,
                       const std::vector<CheckedOption>& options) {
  std::vector<NpzArray> arrays;
  for (size_t i = 0; i < state.names.size(); ++i) arrays.push_back({state.names[i], state.values[i]});
  Tensor m(DType::I64, {static_cast<int64_t>(meta.size())});
  for (size_t i = 0; i < meta.size(); ++i) m.setInt(static_cast<int64_t>(i), meta[i]);
  arrays.push_back({std::string(kCheckpointMeta), m});
  Tensor opts(DType::F64, {static_cast<int64_t>(options.size())});
  for (size_t i = 0; i < options.size(); ++i) opts.setDouble(static_cast<int64_t>(i), options[i].value);
  arrays.push_back({std::string(kCheckpointOptions), opts});
  return writeNpz(path, arrays);
}

/// Loads a checkpoint into `state` and returns the step it was written at;
/// every disagreement with this run is an error naming it.
Expected<int64_t> readCheckpoint(const std::string& path, const TrainOptions& o, int64_t samples, TrainState& state) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Error(path + ": no such checkpoint file");
  auto arrays = readNpz(path);
  if (!arrays) return Error(path + ": not a readable checkpoint: " + arrays.error().message());
  std::map<std::string, const Tensor*> byName;
  for (const NpzArray& a : *arrays) byName[a.name] = &a.tensor;
  auto metaIt = byName.find(std::string(kCheckpointMeta));
  if (metaIt == byName.end() || metaIt->second->dtype() != DType::I64 || metaIt->second->numElements() != 7)
    return Error(path + ": not a kiln train checkpoint (no " + std::string(kCheckpointMeta) + " array)");
  const Tensor& meta = *metaIt->second;
  if (meta.getInt(0) == 1)
    return Error(path + ": checkpoint format 1, written before checkpoints stored the optimizer and learning-rate "
                 "options; this kiln resumes format " +
                 std::to_string(kCheckpointVersion) +
                 " only (resume it with the kiln that wrote it, or train again from the model)");
  if (meta.getInt(0) != kCheckpointVersion)
    return Error(path + ": checkpoint format " + std::to_string(meta.getInt(0)) + ", this kiln reads format " +
                 std::to_string(kCheckpointVersion));
  const std::vector<int64_t> mine = checkpointMeta(o, 0, samples);
  const char* what[] = {
      "", "", "--seed", "--batch-size", "shuffling (--no-shuffle)", "--drop-last", "the number of training samples"};
  for (size_t i = 2; i < mine.size(); ++i)
    if (meta.getInt(static_cast<int64_t>(i)) != mine[i])
      return Error(path + ": the checkpoint was written with " + what[i] + " " +
                   std::to_string(meta.getInt(static_cast<int64_t>(i))) + ", this run has " + std::to_string(mine[i]) +
                   "; resuming needs the same data and batching to continue exactly");
  const std::vector<CheckedOption> options = checkpointOptions(o);
  auto optionsIt = byName.find(std::string(kCheckpointOptions));
  if (optionsIt == byName.end() || optionsIt->second->dtype() != DType::F64 ||
      optionsIt->second->numElements() != static_cast<int64_t>(options.size()))
    return Error(path + ": not a kiln train checkpoint of format " + std::to_string(kCheckpointVersion) + " (no " +
                 std::string(kCheckpointOptions) + " array of " + std::to_string(options.size()) + " values)");
  for (size_t i = 0; i < options.size(); ++i) {
    const double stored = optionsIt->second->getDouble(static_cast<int64_t>(i));
    if (stored != options[i].value)
      return Error(path + ": the checkpoint was written with " + options[i].name + " " + options[i].show(stored) +
                   ", this run has " + options[i].show(options[i].value) +
                   "; resuming needs the same optimizer and learning rate to continue exactly");
  }
  for (size_t i = 0; i < state.names.size(); ++i) {
    auto it = byName.find(state.names[i]);
    if (it == byName.end())
      return Error(path + ": the checkpoint has no '" + state.names[i] + "' (written for another model or optimizer?)");
    if (it->second->type() != state.values[i].type())
      return Error(path + ": '" + state.names[i] + "' is " + it->second->type().str() + " in the checkpoint, " +
                   state.values[i].type().str() + " in this run's training step");
    state.values[i] = *it->second;
  }
  if (byName.size() != state.names.size() + 2)
    return Error(path + ": the checkpoint holds " + std::to_string(byName.size() - 2) +
                 " arrays, this run's training step " + std::to_string(state.names.size()) +
                 " (written for another model or optimizer?)");
  return meta.getInt(1);
}

/// Writes the model at o.modelPath with trained `params` to o.outputPath:
/// ONNX by replacing the initializers' values in a copy of the file, other
/// formats through saveModel after setting the weights' values.
Status writeTrainedModel(const TrainOptions& o, const std::map<std::string, DenseTensor>& params) {
  auto format = modelFormatOf(o.modelPath);
  if (!format) return format.takeError();
  if (*format == ModelFormat::Onnx) return writeOnnxWithInitializers(o.modelPath, params, o.outputPath);
  LoadOptions options;
  options.evaluator = &Session::evaluator();
  auto module = loadModel(o.modelPath, options);
  if (!module) return module.takeError();
  Function& f = *(*module)->functions().front();
  std::set<std::string> done;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    auto it = params.find(f.argument(i)->name());
    if (it == params.end() || !f.argumentDefault(i)) continue;
    f.setArgumentDefault(i, std::make_shared<const DenseTensor>(it->second));
    done.insert(it->first);
  }
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Constant) continue;
    auto it = params.find(op->result()->name());
    if (it == params.end() || done.count(it->first)) continue;
    op->setAttr("value", Attribute(it->second));
    done.insert(it->first);
  }
  for (const auto& [name, value] : params)
    if (!done.count(name)) return Error(o.modelPath + ": no weight named '" + name + "' to write the trained value to");
  return saveModel(**module, o.outputPath);
}

// ---------------------------------------------------------------------------

int fail(const Error& e) {
  reportError(kName, e);
  return kExitError;
}

int run(const ParsedArgs& args) {
  TrainOptions o;
  if (auto problem = parseOptions(args, o)) return usageError(kName, *problem);

  DeviceChoice device;
  if (int status = selectDevice(kName, args.get("--device") ? *args.get("--device") : "cpu", device); status != kExitOk)
    return status;
  if (device.kind == DeviceChoice::Kind::Cuda) {
    if (args.get("--device") && *args.get("--device") == "auto") {
      std::cerr << "kiln train: note: CUDA is usable on " << device.str()
                << ", but training on CUDA is not implemented in this build; --device auto trains on the cpu\n";
    } else {
      return fail(Error("CUDA is usable on " + device.str() +
                        ", but training on CUDA is not implemented in this build; Kiln never falls back to the CPU "
                        "on its own: use --device cpu"));
    }
  }

  // Output paths are checked before anything runs.
  auto inFormat = modelFormatOf(o.modelPath);
  if (!inFormat) return fail(inFormat.takeError());
  if (!o.outputPath.empty()) {
    auto outFormat = modelFormatOf(o.outputPath);
    if (!outFormat) return fail(Error("-o " + o.outputPath + ": " + outFormat.error().message()));
    if (*inFormat == ModelFormat::Onnx && *outFormat != ModelFormat::Onnx)
      return fail(Error("-o " + o.outputPath +
                        ": an ONNX model is written back as ONNX (a .onnx file) with its "
                        "graph unchanged; convert it afterwards with kiln convert"));
    const std::filesystem::path parent = std::filesystem::path(o.outputPath).parent_path();
    std::error_code ec;
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
      return fail(Error("-o " + o.outputPath + ": the folder '" + parent.string() + "' does not exist"));
  }

  // The model, unspecialized, for its signature; an ONNX model whose shapes
  // are computed from a dynamic batch imports only specialized, to the first
  // batch, with its declared input types kept for the signature.
  auto model = loadTrainable(o.modelPath, {});
  std::vector<std::pair<std::string, TensorType>> declared;
  if (!model && *inFormat == ModelFormat::Onnx) {
    auto specialized = loadSpecializedToFirstBatch(o);
    if (!specialized)
      return fail(Error(model.error().message() + "; specialized to the first batch of the training data, it does " +
                        "not load either: " + specialized.error().message()));
    model = std::move(specialized->module);
    declared = std::move(specialized->declared);
  }
  if (!model) return fail(model.takeError());
  auto sig = signatureOf(*(*model)->functions().front(), o.modelPath, o.zeroInputs);
  if (!sig) return fail(sig.takeError());
  for (const auto& [name, type] : declared) {
    if (name == sig->inputName) sig->input = type;
    if (sig->zeroInputs.count(name)) sig->zeroInputs[name] = type;
  }

  // The data, checked against the model's input.
  const DataSpec spec{o.modelPath,    o.xKey,          o.yKey,           sig->input,   sig->output,
                      sig->inputName, sig->outputName, o.step.loss.kind, o.classesLast, o.step.loss.ignoreIndex};
  auto trainData = loadDataset(o.dataPath, spec);
  if (!trainData) return fail(trainData.takeError());
  sig->sampleShape.assign(trainData->x.shape().begin() + 1, trainData->x.shape().end());
  const Dim& batchDim = sig->input.shape[0];
  if (batchDim.isStatic() && batchDim.size != o.batchSize)
    return fail(Error(o.modelPath + ": the model's input '" + sig->inputName + "' (" + sig->input.str() +
                      ") has a fixed batch size of " + std::to_string(batchDim.size) + "; pass --batch-size " +
                      std::to_string(batchDim.size) + " (or export the model with a dynamic batch dim)"));
  BatchPlan plan{trainData->size, o.batchSize, 0, o.shuffle, o.dropLast, o.seed};
  if (o.dropLast && o.batchSize > trainData->size)
    return fail(Error(o.dataPath + ": --batch-size " + std::to_string(o.batchSize) +
                      " with --drop-last leaves no "
                      "batch: the data holds " +
                      std::to_string(trainData->size) + " samples"));
  plan.stepsPerEpoch = o.dropLast ? trainData->size / o.batchSize : (trainData->size + o.batchSize - 1) / o.batchSize;
  const int64_t remainder = trainData->size % o.batchSize;
  if (batchDim.isStatic() && !o.dropLast && remainder != 0)
    return fail(Error(o.modelPath + ": the model's input '" + sig->inputName + "' has a fixed batch size of " +
                      std::to_string(batchDim.size) + ", and " + o.dataPath + " holds " +
                      std::to_string(trainData->size) + " samples, which leaves a last batch of " +
                      std::to_string(remainder) + "; pass --drop-last"));
  std::optional<Dataset> evalData;
  if (!o.evalPath.empty()) {
    auto loaded = loadDataset(o.evalPath, spec);
    if (!loaded) return fail(loaded.takeError());
    const std::vector<int64_t> evalSample(loaded->x.shape().begin() + 1, loaded->x.shape().end());
    if (evalSample != sig->sampleShape)
      return fail(Error(o.evalPath + ": '" + o.xKey + "' holds samples of shape " + shapeString(loaded->x.shape(), 1) +
                        ", the training data samples of shape " + shapeString(trainData->x.shape(), 1) +
                        "; the model is compiled for one sample shape"));
    if (batchDim.isStatic() && loaded->size % batchDim.size != 0)
      return fail(Error(o.evalPath + ": " + std::to_string(loaded->size) + " samples do not split into batches of " +
                        std::to_string(batchDim.size) + ", the model's fixed batch size"));
    evalData = std::move(*loaded);
  }
  const int64_t totalSteps = o.steps ? *o.steps : *o.epochs * plan.stepsPerEpoch;
  o.step.schedule.totalSteps = totalSteps;
  if (o.step.schedule.kind == LrScheduleKind::CosineWarmup && o.step.schedule.warmupSteps >= totalSteps)
    return usageError(kName, "--warmup-steps " + std::to_string(o.step.schedule.warmupSteps) +
                                 " leaves no cosine part: this run has " + std::to_string(totalSteps) + " steps");

  // The step for the full batch size; its leading arguments are the state.
  Trainer trainer(o, *sig);
  auto first = trainer.program(std::min(o.batchSize, trainData->size));
  if (!first) return fail(first.takeError());
  const Function& stepFn = *(*first)->step->functions().front();
  const size_t numState = stepFn.resultTypes().size() - 1;
  TrainState state;
  for (size_t i = 0; i < numState; ++i) {
    state.names.push_back(stepFn.argument(i)->name());
    state.values.push_back(Tensor::fromDense(*stepFn.argumentDefault(i)));
  }

  // The state by name: the step names each parameter (and batch norm running
  // statistic) like the model's weight. What it updates goes to -o; frozen
  // running statistics are not state and stay as they are.
  std::map<std::string, size_t> stateIndex;
  for (size_t i = 0; i < numState; ++i) stateIndex[state.names[i]] = i;
  std::vector<std::string> updated;
  for (const std::string& name : sig->params)
    if (stateIndex.count(name)) updated.push_back(name);

  int64_t startStep = 0;
  if (!o.resumePath.empty()) {
    auto resumed = readCheckpoint(o.resumePath, o, trainData->size, state);
    if (!resumed) return fail(resumed.takeError());
    startStep = *resumed;
    if (startStep > totalSteps)
      return fail(Error(o.resumePath + ": the checkpoint is at step " + std::to_string(startStep) + ", past the " +
                        std::to_string(totalSteps) + " steps this run asks for"));
    std::cerr << "kiln train: resuming at step " << startStep << " from " << o.resumePath << "\n";
  }
  if (o.checkpointEvery) {
    std::error_code ec;
    std::filesystem::create_directories(o.checkpointDir, ec);
    if (ec || !std::filesystem::is_directory(o.checkpointDir))
      return fail(Error("--checkpoint-dir " + o.checkpointDir + ": cannot create the folder: " +
                        (ec ? ec.message() : std::string("a file of that name exists"))));
  }

  Tensor lr(sig->output.dtype, {});
  lr.setDouble(0, o.lr);

  // The step's inputs: state, then by name the batch, labels and lr, and the
  // defaults of any other argument.
  auto stepInputs = [&](const Function& f, std::vector<Tensor> leading, Batch& batch) {
    const int64_t batchSize = batch.x.shape()[0];
    std::vector<Tensor> in = std::move(leading);
    for (size_t i = in.size(); i < f.numArguments(); ++i) {
      const std::string& name = f.argument(i)->name();
      if (name == "labels")
        in.push_back(std::move(batch.y));
      else if (name == "lr")
        in.push_back(lr);
      else if (name == sig->inputName)
        in.push_back(std::move(batch.x));
      else if (sig->zeroInputs.count(name))
        in.push_back(Tensor(f.argument(i)->type().dtype, sig->zeroShape(name, batchSize)));
      else
        in.push_back(Tensor::fromDense(*f.argumentDefault(i)));
    }
    return in;
  };

  // The thread count of the steps with --threads auto.
  std::optional<codegen::ThreadChooser> chooser;

  // One evaluation pass over `evalData` with the current parameters.
  auto evaluate = [&]() -> Expected<EvalResult> {
    EvalResult r;
    BatchPlan evalPlan{evalData->size, o.batchSize, (evalData->size + o.batchSize - 1) / o.batchSize, false, false, 0};
    BatchGatherer gatherer(*evalData, evalPlan);
    for (int64_t k = 0; k < evalPlan.stepsPerEpoch; ++k) {
      Batch batch = gatherer.gather(k);
      auto p = trainer.program(evalPlan.sizeOf(k));
      if (!p) return p.takeError();
      const Function& f = *(*p)->forward->functions().front();
      std::vector<Tensor> in;
      for (size_t i = 0; i < f.numArguments(); ++i) {
        if (i == sig->dataArg)
          in.push_back(batch.x);
        else if (sig->zeroInputs.count(f.argument(i)->name()))
          in.push_back(Tensor(f.argument(i)->type().dtype, sig->zeroShape(f.argument(i)->name(), evalPlan.sizeOf(k))));
        else if (auto it = stateIndex.find(f.argument(i)->name()); it != stateIndex.end())
          in.push_back(state.values[it->second]);
        else
          in.push_back(Tensor::fromDense(*f.argumentDefault(i)));
      }
      if (!(*p)->runForward) {
        auto runner = trainer.compile(f, in, (*p)->forwardExecutor);
        if (!runner) return runner.takeError();
        (*p)->runForward = std::move(*runner);
      }
      auto out = (*p)->runForward(in);
      if (!out) return out.takeError();
      accumulateEval((*out)[0], batch.y, o, r);
    }
    return r;
  };
  const bool classLoss = o.step.loss.kind != LossKind::Mse;
  std::optional<EvalResult> lastEval;
  auto printEval = [&](const EvalResult& r, const std::string& when) {
    std::cout << "eval " << when << ": loss " << fixed(r.loss / std::max<int64_t>(1, r.counted), 6);
    if (classLoss)
      std::cout << " accuracy " << fixed(static_cast<double>(r.correct) / std::max<int64_t>(1, r.counted), 4) << " ("
                << r.correct << "/" << r.counted << ")";
    std::cout << "\n" << std::flush;
  };

  BatchGatherer gatherer(*trainData, plan);
  Progress progress(totalSteps, startStep, plan.stepsPerEpoch, o.logEvery);
  // One evaluation, not counted in the training speed, printed and kept
  // for the confusion matrix at the end.
  auto evaluateAndPrint = [&](const std::string& when) -> Status {
    const auto evalStart = Clock::now();
    auto r = evaluate();
    progress.exclude(Clock::now() - evalStart);
    if (!r) return r.takeError();
    printEval(*r, when);
    lastEval = std::move(*r);
    return Status();
  };
  std::future<Batch> next;
  auto launch = [&](int64_t step) {
    if (step >= totalSteps) return;
    next = o.overlap ? std::async(std::launch::async, [&gatherer, step] { return gatherer.gather(step); })
                     : std::async(std::launch::deferred, [&gatherer, step] { return gatherer.gather(step); });
  };
  // Stops the run on an error: the progress line erased, the gather in
  // flight finished.
  auto stop = [&](const Error& e) {
    progress.breakLine();
    if (next.valid()) next.wait();
    return fail(e);
  };
  launch(startStep);
  double epochLoss = 0;
  int64_t epochSteps = 0;
  double lastLoss = NAN;
  for (int64_t k = startStep; k < totalSteps; ++k) {
    Batch batch = next.get();
    launch(k + 1);  // gathered while this step runs
    const int64_t size = batch.x.shape()[0];
    const auto compileStart = Clock::now();
    auto p = trainer.program(size);
    if (!p) return stop(p.takeError());
    const Function& f = *(*p)->step->functions().front();
    std::vector<Tensor> in = stepInputs(f, std::move(state.values), batch);
    if (!(*p)->runStep) {
      progress.breakLine();  // compiling may print notices
      // In place, except with --check-numerics, which re-runs a failing
      // step from its old inputs.
      auto runner = trainer.compile(f, in, (*p)->stepExecutor, !o.checkNumerics);
      if (!runner) return stop(runner.takeError());
      (*p)->runStep = std::move(*runner);
    }
    // With --threads auto, the step's thread count follows what the steps
    // of the full batch size measure (codegen/ThreadChooser.h): all cores,
    // or one on a machine other programs keep busy. Not the default: oneDNN
    // may sum in another order on another thread count, so results could
    // differ in the last bits from a run that chose otherwise.
    if (!chooser && o.autoThreads && (*p)->stepExecutor) chooser.emplace(codegen::defaultThreads());
    const bool timed = chooser && (*p)->stepExecutor && size == o.batchSize && (*p)->stepRuns++ > 0;
    const bool oneThread = chooser && (*p)->stepExecutor && chooser->many() > 1 &&
                           (timed ? chooser->next() : chooser->current()) == 1;
    if (oneThread && !(*p)->runStepOne) {
      progress.breakLine();
      auto runner = trainer.compile(f, in, (*p)->stepExecutorOne, !o.checkNumerics, 1);
      if (!runner) return stop(runner.takeError());
      (*p)->runStepOne = std::move(*runner);
    }
    progress.exclude(Clock::now() - compileStart);
    const auto runStart = Clock::now();
    auto out = oneThread ? (*p)->runStepOne(in) : (*p)->runStep(in);
    if (!out) return stop(out.takeError());
    if (timed)
      if (auto note = chooser->record(std::chrono::duration<double>(Clock::now() - runStart).count())) {
        progress.breakLine();
        std::cerr << "kiln train: note: " << *note << "\n";
      }
    // Results donated to their arguments (empty in `out`) are in `in`.
    for (size_t i = 1; i < out->size(); ++i)
      if ((*out)[i].numBytes() == 0) (*out)[i] = std::move(in[i - 1]);
    const double loss = (*out)[0].getDouble(0);
    const int64_t epoch = plan.epochOf(k);
    const std::string where = "step " + std::to_string(k + 1) + " (epoch " + std::to_string(epoch + 1) + ")";
    std::string bad;
    if (!std::isfinite(loss)) bad = "the loss is " + shortest(loss);
    if (o.checkNumerics && bad.empty())
      for (size_t i = 1; i < out->size() && bad.empty(); ++i)
        if (int64_t at = firstNonFinite((*out)[i]); at >= 0)
          bad = "the new value of '" + f.resultName(i) + "' holds " + shortest((*out)[i].getDouble(at)) + " at [" +
                indexString(at, (*out)[i].shape()) + "]";
    if (!bad.empty()) {
      std::string message = where + ": " + bad;
      if (o.checkNumerics)
        message += "; " + findNonFiniteOp(f, in);
      else
        message += " (--check-numerics names the op that produces it)";
      return stop(Error(message + "; training stopped" + (o.outputPath.empty() ? "" : ", nothing written")));
    }
    state.values.assign(std::make_move_iterator(out->begin() + 1), std::make_move_iterator(out->end()));
    lastLoss = loss;
    epochLoss += loss;
    ++epochSteps;
    progress.setLearningRate(scheduledLearningRate(o.step.schedule, o.lr, k));
    progress.stepDone(k, size, loss);

    if (o.checkpointEvery && (k + 1) % o.checkpointEvery == 0) {
      const std::string path =
          (std::filesystem::path(o.checkpointDir) / ("step-" + std::to_string(k + 1) + ".npz")).string();
      if (Status s = writeCheckpoint(path, state, checkpointMeta(o, k + 1, trainData->size), checkpointOptions(o)); !s)
        return stop(s.takeError());
    }
    const bool epochEnd = (k + 1) % plan.stepsPerEpoch == 0 || k + 1 == totalSteps;
    // --eval-every: a step that ends an epoch is evaluated once, after it.
    if (evalData && o.evalEvery && (k + 1) % o.evalEvery == 0 && !epochEnd) {
      progress.breakLine();
      if (Status s = evaluateAndPrint("at step " + std::to_string(k + 1)); !s) return stop(s.takeError());
    }
    if (epochEnd) {
      progress.breakLine();
      std::cout << "epoch " << epoch + 1 << ": mean loss " << fixed(epochLoss / std::max<int64_t>(1, epochSteps), 6)
                << " over " << epochSteps << " steps\n"
                << std::flush;
      epochLoss = 0;
      epochSteps = 0;
      if (evalData)
        if (Status s = evaluateAndPrint("after epoch " + std::to_string(epoch + 1)); !s) return stop(s.takeError());
    }
  }
  progress.breakLine();
  if (evalData && !lastEval)  // resumed at the end: nothing trained
    if (Status s = evaluateAndPrint("at step " + std::to_string(totalSteps)); !s) return fail(s.takeError());
  std::cout << "trained " << totalSteps - startStep << (totalSteps - startStep == 1 ? " step (" : " steps (")
            << progress.samples() << " samples) in " << fixed(progress.seconds(), 2)
            << " s (not counting compilation and evaluation), " << fixed(progress.samplesPerSecond(), 1)
            << " samples/s; final loss " << fixed(lastLoss, 6) << "\n";
  // A wider table reads worse than none (a language model's vocabulary).
  constexpr size_t kMaxConfusionClasses = 32;
  if (lastEval && classLoss && lastEval->confusion.size() <= kMaxConfusionClasses)
    std::cout << formatConfusion(lastEval->confusion);
  else if (lastEval && classLoss)
    std::cout << "(no confusion matrix: " << lastEval->confusion.size() << " classes, more than "
              << kMaxConfusionClasses << ")\n";

  if (!o.outputPath.empty()) {
    std::map<std::string, DenseTensor> params;
    for (const std::string& name : updated) params[name] = state.values[stateIndex.at(name)].toDense();
    if (Status s = writeTrainedModel(o, params); !s) return fail(s.takeError());
    std::cout << "wrote " << o.outputPath << "\n";
  }
  return kExitOk;
}

}  // namespace

const Command& trainCommand() {
  static const Command command{
      kName,
      "train a model on arrays from a .npz file",
      "MODEL --data FILE.npz [--loss NAME] [--optimizer NAME] [--lr X] [--batch-size N] [--epochs N | --steps N] "
      "[-o OUT]",
      "Trains MODEL (.onnx, .kiln, .kiln.txt, .kir) on the arrays x (inputs, one sample per row) and y (labels)\n"
      "of FILE.npz: its weights (ONNX float initializers; arguments with a default) are updated by one\n"
      "compiled training step per batch (forward, loss, backward and optimizer update as graph ops).\n"
      "Everything about the data is checked against the model before training starts. Progress goes to\n"
      "stderr (an updating line on a terminal, else plain lines); epoch summaries, --eval results, the\n"
      "confusion matrix and the final summary to stdout. -o writes the trained model in the input's format.",
      kOptions,
      &run,
  };
  return command;
}

}  // namespace kiln::cli
