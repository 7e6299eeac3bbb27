// The trainer (Trainer.h): its checks before training, the per-batch-size
// programs, the step loop with its thread choice, checkpoints, numerics
// guard and evaluation.
#include "training/Trainer.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "codegen/Stages.h"
#include "frontend/Model.h"
#include "runtime/Blake3.h"
#include "runtime/Collectives.h"
#include "training/Numerics.h"
#include "training/Step.h"

namespace kiln::training {

using Clock = std::chrono::steady_clock;

/// The model and its training step for one batch size, and what each was
/// compiled to on first use.
struct Trainer::Program {
  std::unique_ptr<Module> forward;  // the model specialized to the batch size
  std::unique_ptr<Module> step;     // its training step
  std::unique_ptr<CompiledModel> compiledStep, compiledForward;
  /// The step compiled for one thread, when the thread chooser asks for it:
  /// oneDNN plans each primitive's split for the threads current when it is
  /// created, so fewer threads need primitives of their own.
  std::unique_ptr<CompiledModel> compiledStepOne;
  int64_t stepRuns = 0;  // full-size steps on the JIT, for the thread chooser
};

double TrainSummary::samplesPerSecond() const { return static_cast<double>(samples) / std::max(seconds, 1e-9); }

Trainer::Trainer(Session& session, TrainOptions options, TrainCallbacks callbacks)
    : session_(session), options_(std::move(options)), callbacks_(std::move(callbacks)) {}
Trainer::~Trainer() = default;

void Trainer::notify(const std::string& text) const {
  if (callbacks_.notice) callbacks_.notice(text);
}

Expected<std::unique_ptr<Trainer>> Trainer::create(Session& session, TrainOptions options, TrainCallbacks callbacks) {
  std::unique_ptr<Trainer> trainer(new Trainer(session, std::move(options), std::move(callbacks)));
  KILN_TRY(trainer->loadAndCheck());
  return trainer;
}

Status Trainer::loadAndCheck() {
  TrainOptions& o = options_;
  // Output paths are checked before anything runs.
  if (!o.outputPath.empty()) KILN_TRY(checkTrainedModelPath(o.modelPath, o.outputPath));
  auto sig = readTrainingSignature(o.modelPath, o.zeroInputs, FirstBatch{o.dataPath, o.xKey, o.batchSize, o.firstBatchShape},
                                   Session::evaluator());
  if (!sig) return sig.takeError();
  signature_ = std::move(*sig);

  lr_ = learningRateTensor(signature_.output.dtype, o.lr);
  const Communicator& comm = communicator();
  rank_ = comm.rank();
  world_ = comm.size();
  if (world_ > 1) o.step.dataParallel = DataParallelOptions{.bucketCapBytes = o.bucketCapBytes};
  // fp16 trains with dynamic loss scaling, as torch.cuda.amp does with a
  // GradScaler (where the session computes in fp16: not on a CPU without
  // f16 instructions, which computes in f32).
  if (session_.effectivePrecision() == Precision::FP16 && !o.step.lossScale) o.step.lossScale = LossScaleConfig{};
  // Batches handed over one at a time (trainBatch) are checked as they come.
  if (o.dataPath.empty()) {
    totalSteps_ = o.steps.value_or(0);
    o.step.schedule.totalSteps = totalSteps_;
    return Status();
  }
  // The data, checked against the model's input.
  const DataSpec spec = dataSpec(o.modelPath);
  auto trainData = loadDataset(o.dataPath, spec, callbacks_.notice);
  if (!trainData) return trainData.takeError();
  trainData_ = std::move(*trainData);
  const Dataset& data = *trainData_;
  signature_.sampleShape.assign(data.x.shape().begin() + 1, data.x.shape().end());
  const Dim& batchDim = signature_.input.shape[0];
  if (batchDim.isStatic() && batchDim.size != o.batchSize)
    return Error(o.modelPath + ": the model's input '" + signature_.inputName + "' (" + signature_.input.str() +
                 ") has a fixed batch size of " + std::to_string(batchDim.size) + "; pass --batch-size " +
                 std::to_string(batchDim.size) + " (or export the model with a dynamic batch dim)");
  if (o.dropLast && o.batchSize > data.size)
    return Error(o.dataPath + ": --batch-size " + std::to_string(o.batchSize) +
                 " with --drop-last leaves no batch: the data holds " + std::to_string(data.size) + " samples");
  plan_ = BatchPlan::of(data.size, o.batchSize, o.shuffle, o.dropLast, o.seed, rank_, world_);
  const int64_t remainder = plan_.shardSize() % o.batchSize;
  if (batchDim.isStatic() && !o.dropLast && remainder != 0)
    return Error(o.modelPath + ": the model's input '" + signature_.inputName + "' has a fixed batch size of " +
                 std::to_string(batchDim.size) + ", and " + o.dataPath + " holds " + std::to_string(data.size) +
                 " samples" + (world_ > 1 ? ", " + std::to_string(plan_.shardSize()) + " for each of " + std::to_string(world_) + " ranks," : std::string(",")) +
                 " which leaves a last batch of " + std::to_string(remainder) + "; pass --drop-last");
  if (!o.evalPath.empty()) {
    auto loaded = loadDataset(o.evalPath, spec, callbacks_.notice);
    if (!loaded) return loaded.takeError();
    const std::vector<int64_t> evalSample(loaded->x.shape().begin() + 1, loaded->x.shape().end());
    if (evalSample != signature_.sampleShape)
      return Error(o.evalPath + ": '" + o.xKey + "' holds samples of shape " + shapeString(loaded->x.shape(), 1) +
                   ", the training data samples of shape " + shapeString(data.x.shape(), 1) +
                   "; the model is compiled for one sample shape");
    if (batchDim.isStatic() && loaded->size % batchDim.size != 0)
      return Error(o.evalPath + ": " + std::to_string(loaded->size) + " samples do not split into batches of " +
                   std::to_string(batchDim.size) + ", the model's fixed batch size");
    evalData_ = std::move(*loaded);
  }
  totalSteps_ = o.steps ? *o.steps : o.epochs.value_or(1) * plan_.stepsPerEpoch;
  o.step.schedule.totalSteps = totalSteps_;
  if (world_ > 1) KILN_TRY(checkSameRun());
  return Status();
}

Status Trainer::checkSameRun() {
  const TrainOptions& o = options_;
  // What every rank must share, as three digests: the model, the data's
  // shape, and the options that shape the step and the batches.
  auto model = readFileBounded(o.modelPath, int64_t{1} << 36);
  if (!model) return model.takeError();
  const std::string data = std::to_string(trainData_->size) + " " + trainData_->x.type().str() + " " +
                           trainData_->y.type().str();
  const std::string run = std::to_string(o.batchSize) + " " + std::to_string(o.seed) + " " +
                          std::to_string(o.shuffle) + std::to_string(o.dropLast) + " " + std::to_string(totalSteps_) +
                          " " + shortest(o.lr) + " " + std::to_string(static_cast<int>(o.step.optimizer.kind)) + " " +
                          std::to_string(static_cast<int>(o.step.loss.kind)) + " " + o.step.loss.reduction + " " +
                          std::to_string(o.bucketCapBytes) + " " + shortest(o.step.optimizer.momentum) + " " +
                          shortest(o.step.optimizer.weightDecay) + " " +
                          std::to_string(static_cast<int>(o.step.batchNorm.mode));
  std::vector<uint8_t> mine;
  for (const std::string* part : std::initializer_list<const std::string*>{&*model, &data, &run}) {
    const auto digest = blake3(*part);
    mine.insert(mine.end(), digest.begin(), digest.end());
  }
  Communicator& comm = communicator();
  std::vector<uint8_t> all(mine.size() * static_cast<size_t>(world_));
  auto gathered = comm.startAllGather(mine.data(), all.data(), static_cast<int64_t>(mine.size()),
                                      "the check that every rank runs the same training");
  if (!gathered) return gathered.takeError();
  KILN_TRY((*gathered)->wait());
  const char* const parts[] = {"model file", "training data (its samples or shapes)", "set of options"};
  for (int r = 1; r < world_; ++r)
    for (size_t k = 0; k < std::size(parts); ++k)
      if (std::memcmp(all.data() + k * 32, all.data() + static_cast<size_t>(r) * mine.size() + k * 32, 32) != 0)
        return Error("rank " + std::to_string(r) + " was started with another " + std::string(parts[k]) +
                     " than rank 0; every rank of a data-parallel job must run the same kiln train command");
  return Status();
}

Status Trainer::broadcastState() {
  if (world_ <= 1) return Status();
  Communicator& comm = communicator();
  for (size_t i = 0; i < state_.values.size(); ++i) {
    Tensor& t = state_.values[i];
    KILN_TRY(comm.broadcast(t.raw(), static_cast<int64_t>(t.numBytes()), 0,
                            "the broadcast of rank 0's initial '" + state_.names[i] + "'"));
  }
  return Status();
}

DataSpec Trainer::dataSpec(const std::string& source) const {
  const TrainOptions& o = options_;
  return DataSpec{.modelPath = source,
                  .xKey = o.xKey,
                  .yKey = o.yKey,
                  .input = signature_.input,
                  .output = signature_.output,
                  .inputName = signature_.inputName,
                  .outputName = signature_.outputName,
                  .loss = o.step.loss.kind,
                  .classesLast = o.classesLast,
                  .ignoreIndex = o.step.loss.ignoreIndex};
}

void Trainer::setLearningRate(double lr) {
  options_.lr = lr;
  lr_ = learningRateTensor(signature_.output.dtype, lr);
}

std::optional<std::string> Trainer::scheduleProblem() const {
  const LrScheduleConfig& schedule = options_.step.schedule;
  if (schedule.kind == LrScheduleKind::CosineWarmup && schedule.warmupSteps >= totalSteps_)
    return "--warmup-steps " + std::to_string(schedule.warmupSteps) + " leaves no cosine part: this run has " +
           std::to_string(totalSteps_) + " steps";
  return std::nullopt;
}

CheckpointRun Trainer::checkpointRun() const {
  const TrainOptions& o = options_;
  return CheckpointRun{.seed = o.seed,
                       .batchSize = o.batchSize,
                       .shuffle = o.shuffle,
                       .dropLast = o.dropLast,
                       .samples = trainData_->size,
                       .lr = o.lr,
                       .optimizer = o.step.optimizer,
                       .schedule = o.step.schedule};
}

std::vector<int64_t> Trainer::stepBatchSizes() const {
  std::vector<int64_t> sizes;
  for (const auto& [size, program] : programs_) sizes.push_back(size);
  return sizes;
}

Expected<Trainer::Program*> Trainer::program(int64_t batch) {
  auto it = programs_.find(batch);
  if (it != programs_.end()) return it->second.get();
  auto p = std::make_unique<Program>();
  std::vector<int64_t> shape = {batch};
  shape.insert(shape.end(), signature_.sampleShape.begin(), signature_.sampleShape.end());
  std::map<std::string, std::vector<int64_t>> shapes = {{signature_.inputName, shape}};
  for (const auto& [name, type] : signature_.zeroInputs) shapes[name] = signature_.zeroShape(name, batch);
  auto forward = loadTrainableModel(options_.modelPath, shapes, Session::evaluator());
  if (!forward) return forward.takeError();
  p->forward = std::move(*forward);
  p->step = std::make_unique<Module>();
  p->step->addFunction(p->forward->functions().front()->clone());
  TrainingStepOptions stepOptions = options_.step;
  stepOptions.parameters = signature_.params;
  KILN_TRY(makeTrainingStep(*p->step->functions().front(), stepOptions, options_.classesLast));
  return programs_.emplace(batch, std::move(p)).first->second.get();
}

Expected<std::unique_ptr<CompiledModel>> Trainer::compile(const Function& f, const std::vector<Tensor>& inputs,
                                                          bool donate, int threads) {
  CompileOptions compileOptions;
  if (donate) compileOptions.aliases = trainingStepAliases(f);
  compileOptions.keepDonatedOnDevice = donate;
  compileOptions.threads = threads;
  auto model = session_.compile(f, compileOptions);
  if (!model) return model.takeError();
  Status prepared = (*model)->prepare(inputs);
  for (const std::string& notice : session_.takeNotices()) notify(notice);
  if (!prepared) return prepared.takeError();
  return model;
}

Status Trainer::initializeState(int64_t batch) {
  if (stateReady_) return Status();
  // The step of the first batch size; its leading arguments are the state.
  auto first = program(batch);
  if (!first) return first.takeError();
  state_ = initialState(*(*first)->step->functions().front());
  // The state by name: the step names each parameter (and batch norm
  // running statistic) like the model's weight.
  for (size_t i = 0; i < state_.names.size(); ++i) stateIndex_[state_.names[i]] = i;
  stateReady_ = true;
  return Status();
}

std::map<std::string, DenseTensor> Trainer::trainedParameters() const {
  // What the step updates goes to the trained model; frozen running
  // statistics are not state and stay as they are.
  std::map<std::string, DenseTensor> params;
  for (const std::string& name : signature_.params)
    if (auto it = stateIndex_.find(name); it != stateIndex_.end()) params[name] = state_.values[it->second].toDense();
  return params;
}

Status Trainer::writeTrainedModel() const {
  return training::writeTrainedModel(options_.modelPath, trainedParameters(), options_.outputPath,
                                     Session::evaluator());
}

Status Trainer::syncState() {
  if (!inPlace_) return Status::success();
  CompiledModel* model = std::exchange(inPlace_, nullptr);
  return model->syncDonated();
}

Expected<EvalResult> Trainer::evaluate() {
  if (!evalData_) return Error("no evaluation data: the options name no eval file");
  KILN_TRY(initializeState(std::min(options_.batchSize, trainData_->size)));
  return evaluateOn(*evalData_);
}

Expected<Dataset> Trainer::checkBatch(const Tensor& x, const Tensor& y, const std::string& source) {
  auto data = checkDataset(source, x, y, dataSpec(source), callbacks_.notice);
  if (!data) return data.takeError();
  const std::vector<int64_t> sample(data->x.shape().begin() + 1, data->x.shape().end());
  if (signature_.sampleShape.empty()) signature_.sampleShape = sample;
  if (sample != signature_.sampleShape)
    return Error(source + ": '" + options_.xKey + "' holds samples of shape " + shapeString(data->x.shape(), 1) +
                 ", the first batch samples of shape " + shapeString(signature_.sampleShape) +
                 "; the model is compiled for one sample shape");
  return data;
}

Expected<EvalResult> Trainer::evaluate(const Tensor& x, const Tensor& y, const std::string& source) {
  auto data = checkBatch(x, y, source);
  if (!data) return data.takeError();
  KILN_TRY(initializeState(std::min(options_.batchSize, data->size)));
  return evaluateOn(*data);
}

Expected<EvalResult> Trainer::evaluateOn(const Dataset& data) {
  KILN_TRY(syncState());
  EvalResult r;
  const BatchPlan plan = BatchPlan::of(data.size, options_.batchSize, false, false, 0);
  BatchGatherer gatherer(data, plan);
  for (int64_t k = 0; k < plan.stepsPerEpoch; ++k) {
    Batch batch = gatherer.gather(k);
    const int64_t size = plan.sizeOf(k);
    auto p = program(size);
    if (!p) return p.takeError();
    const Function& f = *(*p)->forward->functions().front();
    std::vector<Tensor> in;
    for (size_t i = 0; i < f.numArguments(); ++i) {
      const std::string& name = f.argument(i)->name();
      if (i == signature_.dataArg)
        in.push_back(batch.x);
      else if (signature_.zeroInputs.count(name))
        in.push_back(Tensor(f.argument(i)->type().dtype, signature_.zeroShape(name, size)));
      else if (auto it = stateIndex_.find(name); it != stateIndex_.end())
        in.push_back(state_.values[it->second]);
      else
        in.push_back(Tensor::fromDense(*f.argumentDefault(i)));
    }
    if (!(*p)->compiledForward) {
      auto compiled = compile(f, in, /*donate=*/false);
      if (!compiled) return compiled.takeError();
      (*p)->compiledForward = std::move(*compiled);
    }
    auto out = (*p)->compiledForward->run(in);
    if (!out) return out.takeError();
    accumulateEval((*out)[0], batch.y, options_.step.loss, options_.classesLast, r);
  }
  return r;
}

Expected<std::vector<Tensor>> Trainer::runStep(Batch batch, Clock::duration& compileTime, const Batch* upcoming) {
  const TrainOptions& o = options_;
  const int64_t size = batch.x.shape()[0];
  const auto compileStart = Clock::now();
  auto p = program(size);
  if (!p) return p.takeError();
  Program& program = **p;
  const Function& f = *program.step->functions().front();
  StepFeed feed;
  feed.inputs[signature_.inputName] = std::move(batch.x);
  for (const auto& [name, type] : signature_.zeroInputs)
    feed.inputs[name] = Tensor(type.dtype, signature_.zeroShape(name, size));
  feed.labels = std::move(batch.y);
  feed.lr = lr_;
  // bindStepInputs takes the state only when it binds; from then on every
  // error gives it back to state_ (from `in`, or from the results of a step
  // that ran), so that the trainer stays usable after any error.
  auto bound = bindStepInputs(f, std::move(state_.values), std::move(feed));
  if (!bound) return bound.takeError();
  std::vector<Tensor>& in = *bound;
  const size_t numState = state_.names.size();
  struct GiveBack {
    std::vector<Tensor>* from;
    std::vector<Tensor>& to;
    size_t count;
    ~GiveBack() {
      if (from) to.assign(std::make_move_iterator(from->begin()), std::make_move_iterator(from->begin() + count));
    }
  } giveBack{&in, state_.values, numState};
  // In place, except with checkNumerics, which re-runs a failing step from
  // its old inputs, and for a step with control flow or data-dependent ops,
  // which runs in stages that cannot take donated arguments.
  const bool donate = !o.checkNumerics && !codegen::hasHostOps(f);
  if (!program.compiledStep) {
    auto compiled = compile(f, in, donate);
    if (!compiled) return compiled.takeError();
    program.compiledStep = std::move(*compiled);
  }
  // With autoThreads, the step's thread count follows what the steps of the
  // full batch size measure (driver/ThreadChooser.h): all cores, or one on
  // a machine other programs keep busy. Not the default: oneDNN may sum in
  // another order on another thread count, so results could differ in the
  // last bits from a run that chose otherwise.
  const bool jit = !program.compiledStep->interpreted();
  if (!chooser_ && o.autoThreads && jit) chooser_.emplace(codegen::defaultThreads());
  const bool timed = chooser_ && jit && size == o.batchSize && program.stepRuns++ > 0;
  const bool oneThread =
      chooser_ && jit && chooser_->many() > 1 && (timed ? chooser_->next() : chooser_->current()) == 1;
  if (oneThread && !program.compiledStepOne) {
    auto compiled = compile(f, in, donate, 1);
    if (!compiled) return compiled.takeError();
    program.compiledStepOne = std::move(*compiled);
  }
  compileTime += Clock::now() - compileStart;
  const auto runStart = Clock::now();
  CompiledModel& model = oneThread ? *program.compiledStepOne : *program.compiledStep;
  if (inPlace_ && inPlace_ != &model) {
    // `in` holds the state's tensors, which the other program has left stale.
    if (Status synced = inPlace_->syncDonated(); !synced) return synced.takeError();
    inPlace_ = nullptr;
  }
  // The next step's data and labels, for the device to copy while this step
  // runs: the same tensors will be bound then (moved, not copied).
  std::vector<const Tensor*> next;
  if (upcoming && donate && upcoming->x.shape()[0] == size)
    for (size_t i = 0; i < f.numArguments(); ++i) {
      const std::string& name = f.argument(i)->name();
      next.push_back(name == "labels" ? &upcoming->y : name == signature_.inputName ? &upcoming->x : nullptr);
    }
  auto out = donate ? model.runInPlace(in, next.empty() ? nullptr : &next) : model.run(in);
  if (!out) return out.takeError();
  if (donate) inPlace_ = &model;
  giveBack.from = nullptr;
  if (timed)
    if (auto note = chooser_->record(std::chrono::duration<double>(Clock::now() - runStart).count())) notify(*note);
  // Results donated to their arguments (empty in `out`) are in `in`.
  for (size_t i = 1; i < out->size(); ++i)
    if ((*out)[i].numBytes() == 0) (*out)[i] = std::move(in[i - 1]);
  const int64_t epoch = plan_.epochOf(batch.step);
  if (std::string bad = describeNonFiniteResult(f, *out, o.checkNumerics); !bad.empty()) {
    std::string message = "step " + std::to_string(batch.step + 1) +
                          (trainData_ ? " (epoch " + std::to_string(epoch + 1) + ")" : std::string()) + ": " + bad;
    if (o.checkNumerics)
      message += "; " + findNonFiniteOp(f, in);
    else
      message += " (" + o.checkNumericsName + " names the op that produces it)";
    // A step whose loss is not finite kept its parameters and state
    // (buildTrainingStep selects the old values), which are its results.
    const bool skipped = firstNonFinite((*out)[0]) >= 0;
    state_.values.assign(std::make_move_iterator(out->begin() + 1), std::make_move_iterator(out->end()));
    // Batches handed over (kiln.Trainer): the caller goes on after the
    // error, so it says what state it goes on from.
    if (!trainData_)
      return Error(message + (skipped ? "; the step's update was skipped: the parameters and optimizer state are "
                                        "those before it"
                                      : ""));
    return Error(message + "; training stopped" + (o.outputPath.empty() ? "" : ", nothing written"));
  }
  return out;
}

Expected<TrainSummary> Trainer::train() {
  if (trained_) return Error("this trainer has trained already");
  trained_ = true;
  const TrainOptions& o = options_;
  if (!trainData_) return Error("no training data: the options name no data file");
  KILN_TRY(initializeState(std::min(options_.batchSize, trainData_->size)));
  TrainSummary summary;
  summary.totalSteps = totalSteps_;
  summary.finalLoss = NAN;
  if (!o.resumePath.empty()) {
    auto resumed = readCheckpoint(o.resumePath, checkpointRun(), state_);
    if (!resumed) return resumed.takeError();
    summary.firstStep = *resumed;
    if (summary.firstStep > totalSteps_)
      return Error(o.resumePath + ": the checkpoint is at step " + std::to_string(summary.firstStep) + ", past the " +
                   std::to_string(totalSteps_) + " steps this run asks for");
    if (callbacks_.resumed) callbacks_.resumed(summary.firstStep, o.resumePath);
  }
  KILN_TRY(broadcastState());
  if (o.checkpointEvery && rank_ == 0) {
    std::error_code ec;
    std::filesystem::create_directories(o.checkpointDir, ec);
    if (ec || !std::filesystem::is_directory(o.checkpointDir))
      return Error("--checkpoint-dir " + o.checkpointDir +
                   ": cannot create the folder: " + (ec ? ec.message() : std::string("a file of that name exists")));
  }
  const CheckpointRun run = checkpointRun();

  const auto start = Clock::now();
  Clock::duration excluded{};  // compiling and evaluating
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start - excluded).count(); };
  // One evaluation, not counted in the training time, reported and kept
  // for the confusion matrix at the end.
  auto evaluateAndReport = [&](int64_t step, int64_t epoch) -> Status {
    const auto evalStart = Clock::now();
    auto r = evaluate();
    excluded += Clock::now() - evalStart;
    if (!r) return r.takeError();
    summary.lastEval = std::move(*r);
    if (callbacks_.evaluated) callbacks_.evaluated(EvalReport{step, epoch, *summary.lastEval});
    return Status();
  };

  BatchPrefetcher batches(*trainData_, plan_, o.overlap, summary.firstStep, totalSteps_);
  double epochLoss = 0;
  int64_t epochSteps = 0;
  // On CUDA the next batch is taken one step early, so that its copy to the
  // device overlaps the current step.
  const bool stageAhead = session_.device().kind == DeviceChoice::Kind::Cuda;
  std::optional<Batch> upcoming;
  for (int64_t k = summary.firstStep; k < totalSteps_; ++k) {
    Batch batch = upcoming ? std::move(*upcoming) : batches.next();
    upcoming.reset();
    if (stageAhead && k + 1 < totalSteps_) upcoming = batches.next();
    const int64_t size = batch.x.shape()[0];
    auto out = runStep(std::move(batch), excluded, upcoming ? &*upcoming : nullptr);
    if (!out && world_ > 1 && !out.error().message().starts_with("step "))
      return Error("step " + std::to_string(k + 1) + ": " + out.error().message());
    if (!out) return out.takeError();
    const double loss = (*out)[0].getDouble(0);
    state_.values.assign(std::make_move_iterator(out->begin() + 1), std::make_move_iterator(out->end()));
    summary.finalLoss = loss;
    summary.samples += size * world_;  // every rank's batch is as large
    epochLoss += loss;
    ++epochSteps;
    const int64_t epoch = plan_.epochOf(k);
    if (callbacks_.stepDone) {
      StepReport report{k, epoch, size, loss, scheduledLearningRate(o.step.schedule, o.lr, k), seconds(),
                        summary.samples};
      // The loss scale, where the state is in host memory (on CUDA it stays
      // on the device between steps).
      if (auto it = stateIndex_.find("loss_scale");
          it != stateIndex_.end() && session_.device().kind != DeviceChoice::Kind::Cuda &&
          state_.values[it->second].numElements() == 1)
        report.lossScale = state_.values[it->second].getDouble(0);
      callbacks_.stepDone(report);
    }

    if (o.checkpointEvery && (k + 1) % o.checkpointEvery == 0 && rank_ == 0) {
      const std::string path =
          (std::filesystem::path(o.checkpointDir) / ("step-" + std::to_string(k + 1) + ".npz")).string();
      KILN_TRY(syncState());
      KILN_TRY(writeCheckpoint(path, state_, run, k + 1));
    }
    const bool epochEnd = (k + 1) % plan_.stepsPerEpoch == 0 || k + 1 == totalSteps_;
    // evalEvery: a step that ends an epoch is evaluated once, after it.
    if (evalData_ && o.evalEvery && (k + 1) % o.evalEvery == 0 && !epochEnd) KILN_TRY(evaluateAndReport(k + 1, 0));
    if (epochEnd) {
      if (callbacks_.epochDone)
        callbacks_.epochDone(EpochReport{epoch, epochLoss / std::max<int64_t>(1, epochSteps), epochSteps});
      epochLoss = 0;
      epochSteps = 0;
      if (evalData_) KILN_TRY(evaluateAndReport(k + 1, epoch + 1));
    }
  }
  if (evalData_ && !summary.lastEval)  // resumed at the end: nothing trained
    KILN_TRY(evaluateAndReport(totalSteps_, 0));
  summary.seconds = seconds();
  KILN_TRY(syncState());
  return summary;
}

Expected<double> Trainer::trainBatch(const Tensor& x, const Tensor& y, const std::string& source) {
  if (trainData_) return Error("this trainer trains on its data file; it takes no batches");
  auto data = checkBatch(x, y, source);
  if (!data) return data.takeError();
  const Dim& batchDim = signature_.input.shape[0];
  if (batchDim.isStatic() && batchDim.size != data->size)
    return Error(source + ": a batch of " + std::to_string(data->size) + " samples, but the model's input '" +
                 signature_.inputName + "' (" + signature_.input.str() + ") has a fixed batch size of " +
                 std::to_string(batchDim.size));
  KILN_TRY(initializeState(data->size));
  Clock::duration compileTime{};
  auto out = runStep(Batch{batchesTrained_, std::move(data->x), std::move(data->y)}, compileTime);
  if (!out) return out.takeError();
  const double loss = (*out)[0].getDouble(0);
  state_.values.assign(std::make_move_iterator(out->begin() + 1), std::make_move_iterator(out->end()));
  ++batchesTrained_;
  return loss;
}

Status Trainer::setState(const std::map<std::string, Tensor>& values, int64_t batch) {
  KILN_TRY(initializeState(batch));
  for (const auto& [name, value] : values) {
    auto it = stateIndex_.find(name);
    if (it == stateIndex_.end()) {
      std::string names;
      for (const std::string& n : state_.names) names += (names.empty() ? "" : ", ") + n;
      return Error("no state value named '" + name + "' (the training step's state: " + names + ")");
    }
    const Tensor& current = state_.values[it->second];
    if (value.type() != current.type())
      return Error("'" + name + "' is " + value.type().str() + ", the training step's is " + current.type().str());
  }
  // The device's copies (CUDA, updated in place) come back first; the next
  // step uploads what is written here.
  KILN_TRY(syncState());
  for (const auto& [name, value] : values) {
    Tensor& current = state_.values[stateIndex_.at(name)];
    std::memcpy(current.raw(), value.raw(), current.numBytes());
  }
  return Status();
}

Expected<const TrainState*> Trainer::currentState(int64_t batch) {
  KILN_TRY(initializeState(batch));
  KILN_TRY(syncState());
  return &state_;
}

}  // namespace kiln::training
