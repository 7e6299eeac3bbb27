// `kiln train`: the command line of the trainer (training/Trainer.h). This
// file parses the options into training::TrainOptions and prints what the
// trainer reports (formatted by training/Report.h): notices and the
// progress line on stderr (one line redrawn in place on a terminal, else
// plain lines every --log-every steps), epoch summaries, evaluations, the
// final summary and the confusion matrix on stdout, and errors with their
// exit status (1, or 2 for usage). Under mpirun it joins the job
// (training/DataParallel.h: each rank's GPU, its message when mpirun ends
// it). Training itself, the data checks, checkpoints, metrics and the
// numerics guard are the library's (training/README.md).
//
// docs/cli.md documents the command, docs/training.md the loop.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include <atomic>

#include "driver/Session.h"
#include "runtime/Collectives.h"
#include "runtime/cuda/CudaDevices.h"
#include "runtime/cuda/NcclCollectives.h"
#include "tools/DeviceSelection.h"
#include "tools/KilnCommands.h"
#include "training/DataParallel.h"
#include "training/Names.h"
#include "training/Report.h"
#include "training/Trainer.h"
#ifdef KILN_HAVE_MPI
#include "runtime/mpi/MpiCommunicator.h"
#endif

namespace kiln::cli {

namespace {

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
    {"--no-cuda-graph", "", "CUDA: launch every step each time instead of replaying a captured CUDA graph"},
    KILN_PRECISION_OPTIONS,
    {"--memory-stats", "", "CUDA: print the device memory statistics (allocated, reserved, peaks, cache hits) at the end"},
    {"--cuda-memory-limit", "BYTES", "CUDA: the most device memory Kiln may reserve, e.g. 2GiB or 512MiB"},
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
    {"--bucket-cap-mb", "X",
     "under mpirun: the most MB of gradients all-reduced together, as DDP's bucket_cap_mb (default: 25)"},
    {"--collective-timeout", "SECONDS",
     "under mpirun: a rank waiting longer than this for the others (one died or hangs) ends the job with the step "
     "(default: 300)"},
    {"--help", "", "show this help", false, "-h"},
};

// ---------------------------------------------------------------------------
// Options

/// The command line: the trainer's options and what only the command uses.
struct CommandOptions {
  training::TrainOptions train;
  codegen::CpuOptions cpu;          // --threads N, the kernel cache
  std::optional<int64_t> logEvery;  // progress lines without a terminal
  double collectiveTimeout = 300;   // seconds, under mpirun
};

/// Fills `c` from the command line; a usage error's message otherwise.
std::optional<std::string> parseOptions(const ParsedArgs& args, CommandOptions& c) {
  training::TrainOptions& o = c.train;
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
  if (auto kind = training::lossKindNamed(loss))
    o.step.loss.kind = *kind;
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
  if (auto kind = training::optimizerKindNamed(optimizer))
    opt.kind = *kind;
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
  if (auto kind = training::lrScheduleKindNamed(scheduleName))
    schedule.kind = *kind;
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
  if (auto mode = training::batchNormModeNamed(batchNorm))
    o.step.batchNorm.mode = *mode;
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

  std::optional<int64_t> batch, seed, threads;
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
  if (auto e = integer("--log-every", 1, c.logEvery)) return e;
  o.autoThreads = args.get("--threads") && *args.get("--threads") == "auto";
  if (!o.autoThreads && integer("--threads", 1, threads))
    return "--threads expects a number of threads (1 or more) or auto, got '" + *args.get("--threads") + "'";
  if (threads) c.cpu.threads = static_cast<int>(std::min<int64_t>(*threads, 4096));
  c.cpu.cacheDir = kernelCacheDir(args);

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
  if (args.has("--bucket-cap-mb")) {
    double mb = 0;
    if (auto e = number("--bucket-cap-mb", mb)) return e;
    if (!(mb > 0) || mb > 1e6) return "--bucket-cap-mb expects a positive number of MB, got " + *args.get("--bucket-cap-mb");
    o.bucketCapBytes = static_cast<int64_t>(mb * 1024 * 1024);
  }
  if (args.has("--collective-timeout")) {
    if (auto e = number("--collective-timeout", c.collectiveTimeout)) return e;
    if (!(c.collectiveTimeout > 0))
      return "--collective-timeout expects a number of seconds > 0, got " + *args.get("--collective-timeout");
  }
  std::optional<int64_t> evalEvery;
  if (auto e = integer("--eval-every", 1, evalEvery)) return e;
  if (evalEvery && !args.has("--eval")) return "--eval-every needs --eval FILE.npz";
  o.evalEvery = evalEvery.value_or(0);
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Printing

// ---------------------------------------------------------------------------
// Data-parallel jobs (docs/distributed.md)

/// This process's rank and the job's size (1 outside mpirun), and the step
/// it is at, for the message of a rank that mpirun ends.
int gRank = 0, gWorld = 1;
std::atomic<int64_t> gStep{0};

int fail(const Error& e) {
  if (gWorld > 1) {
    // Every rank says what ended it, then the whole job ends: the others
    // may be waiting in a collective.
    reportError(kName, Error("rank " + std::to_string(gRank) + " of " + std::to_string(gWorld) + ": " + e.message(),
                             e.location()));
    std::cerr << std::flush;
    communicator().abort(kExitError);
  }
  reportError(kName, e);
  return kExitError;
}

int run(const ParsedArgs& args) {
  CommandOptions c;
  if (auto problem = parseOptions(args, c)) return usageError(kName, *problem);

  // Under mpirun: one rank of a data-parallel job.
#ifdef KILN_HAVE_MPI
  std::shared_ptr<MpiCommunicator> mpi;
  if (launchedByMpi()) {
    auto initialized = MpiCommunicator::initialize(c.collectiveTimeout);
    if (!initialized) return fail(initialized.takeError());
    mpi = *initialized;
    setProcessCommunicator(mpi);
  }
  struct Detach {
    ~Detach() { setProcessCommunicator(nullptr); }
  } detach;
#endif
  gRank = communicator().rank();
  gWorld = communicator().size();
  const bool lead = gRank == 0;
  // mpirun ends the other ranks (SIGTERM) when one dies: each says where it was.
  if (gWorld > 1) training::reportTerminationOnSigterm("kiln train", gRank, gWorld, gStep, kExitError);
  for (std::string_view option : {"--bucket-cap-mb", "--collective-timeout"})
    if (gWorld == 1 && args.has(option))
      return usageError(kName, std::string(option) + " applies to a data-parallel job (mpirun -np N kiln train ...)");

  DeviceChoice device;
  if (int status = selectDevice(kName, args.get("--device") ? *args.get("--device") : "cpu", device); status != kExitOk)
    return status;
  const std::string sessionDevice =
      device.kind == DeviceChoice::Kind::Cuda ? "cuda:" + std::to_string(device.cuda.index) : std::string("cpu");
  SessionOptions sessionOptions{.device = sessionDevice, .cpu = c.cpu};
  sessionOptions.cuda.run.graphs = !args.has("--no-cuda-graph");
  auto precision = precisionOption(args);
  if (!precision) return usageError(kName, precision.error().message());
  sessionOptions.precision = *precision;
  for (std::string_view cudaOnly : {"--no-cuda-graph", "--memory-stats", "--cuda-memory-limit"})
    if (device.kind != DeviceChoice::Kind::Cuda && args.has(cudaOnly))
      return usageError(kName, std::string(cudaOnly) + " applies to --device cuda");
  if (const std::string* limit = args.get("--cuda-memory-limit")) {
    auto bytes = parseByteSize(*limit, "--cuda-memory-limit");
    if (!bytes) return usageError(kName, bytes.error().message());
    sessionOptions.cudaMemoryLimit = static_cast<size_t>(*bytes);
  }
#ifdef KILN_HAVE_MPI
  // Data-parallel on CUDA: one GPU per rank of a machine (its local rank),
  // NCCL between them.
  if (gWorld > 1 && device.kind == DeviceChoice::Kind::Cuda) {
    const std::string asked = args.get("--device") ? *args.get("--device") : "";
    const cuda::CudaReport report = cuda::probeCuda(cuda::LibrarySearchOptions::fromEnvironment());
    const int gpus = static_cast<int>(report.usableDevices().size());
    auto rankDevice =
        training::rankCudaDevice(asked, !report.emulated.empty(), gpus, mpi->localRank(), mpi->localSize());
    if (!rankDevice) return fail(rankDevice.takeError());
    if (*rankDevice) sessionOptions.device = **rankDevice;
  }
#endif
  auto created = Session::create(sessionOptions);
  if (auto* error = std::get_if<DeviceError>(&created)) return fail(error->error);
  std::unique_ptr<Session> session = std::move(std::get<std::unique_ptr<Session>>(created));
  std::shared_ptr<cuda::NcclCommunicator> nccl;
  if (gWorld > 1 && device.kind == DeviceChoice::Kind::Cuda) {
    auto context = session->cudaContext();
    if (!context) return fail(context.takeError());
    auto joined = cuda::NcclCommunicator::create(communicator(), **context);
    if (!joined) return fail(joined.takeError());
    nccl = *joined;
    cuda::setProcessNccl(nccl);
  }
  struct DetachNccl {
    bool set;
    ~DetachNccl() {
      if (set) cuda::setProcessNccl(nullptr);
    }
  } detachNccl{nccl != nullptr};

  std::optional<training::ProgressLine> progress;  // once the number of steps is known
  auto breakLine = [&] {
    if (progress) progress->breakLine();
  };
  const bool classLoss = c.train.step.loss.kind != LossKind::Mse;
  training::TrainCallbacks callbacks;
  // In a data-parallel job, rank 0 alone reports (the job's loss and
  // samples: every rank's are the same).
  callbacks.notice = [&](const std::string& notice) {
    if (!lead) return;
    breakLine();
    std::cerr << "kiln train: note: " << notice << "\n";
  };
  callbacks.resumed = [&](int64_t step, const std::string& path) {
    progress->setFirst(step);
    if (lead) std::cerr << "kiln train: resuming at step " << step << " from " << path << "\n";
  };
  callbacks.stepDone = [&](const training::StepReport& r) {
    gStep = r.step + 1;
    if (lead) progress->stepDone(r);
  };
  callbacks.epochDone = [&](const training::EpochReport& r) {
    if (!lead) return;
    breakLine();
    std::cout << training::formatEpoch(r) << "\n" << std::flush;
  };
  callbacks.evaluated = [&](const training::EvalReport& r) {
    if (!lead) return;
    breakLine();
    std::cout << training::formatEval(r, classLoss) << "\n" << std::flush;
  };
  if (gWorld > 1 && lead)
    std::cerr << "kiln train: data-parallel over " << gWorld << " ranks (" << communicator().name()
              << (nccl ? ", " + nccl->name() + " on " + session->device().str() : std::string()) << "): batch "
              << c.train.batchSize << " per rank, " << c.train.batchSize * gWorld << " per step\n";

  auto trainer = training::Trainer::create(*session, c.train, callbacks);
  if (!trainer) return fail(trainer.takeError());
  if (auto problem = (*trainer)->scheduleProblem()) return usageError(kName, *problem);
  // Without -o the trained weights are not written anywhere: said before
  // training starts, so that a long run can be stopped and given one.
  if (lead && c.train.outputPath.empty())
    std::cerr << "kiln train: warning: no -o OUT: the trained model will not be written"
              << (c.train.checkpointDir.empty() ? std::string()
                                                : " (only the checkpoints in " + c.train.checkpointDir + " will hold it)")
              << "; give -o OUT" << (c.train.modelPath.ends_with(".onnx") ? ".onnx" : "") << " to keep it\n";
  progress.emplace(std::cerr, isatty(fileno(stderr)) != 0, (*trainer)->totalSteps(), c.logEvery);
  auto summary = (*trainer)->train();
  breakLine();
  if (!summary) return fail(summary.takeError());
  if (!lead) return kExitOk;
  std::cout << training::formatSummary(*summary, classLoss);
  if (args.has("--memory-stats"))
    if (auto context = session->cudaContext()) std::cerr << (*context)->memoryReport();
  if (!c.train.outputPath.empty()) {
    if (Status s = (*trainer)->writeTrainedModel(); !s) return fail(s.takeError());
    std::cout << "wrote " << c.train.outputPath << "\n";
  } else {
    std::cout << "the trained model was not written (no -o OUT)\n";
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
