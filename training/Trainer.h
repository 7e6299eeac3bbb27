// The trainer: trains a model's weights on the arrays of a .npz file with
// one compiled training step per batch shape. The weights become the
// parameters of one training-step function (passes/TrainingStep.h: forward,
// loss, backward and optimizer update as graph ops), built for each batch
// size the run meets (the batch size, and the size of an epoch's last,
// partial batch unless dropLast drops it) and compiled through a
// Session (driver/Session.h), which runs it on the JIT (or, for ops the JIT cannot
// lower yet, on the interpreter, with a notice). Each step updates the
// parameters and optimizer state in place (donated arguments,
// CompiledModel::runInPlace) for the next.
//
// Everything that can be checked before training is checked by create():
// the files, the model's signature, the data against the model (Data.h),
// the batch size against the data, the output path. Each problem is one
// error naming the file, what was wrong and what was expected.
//
// Batches: each epoch visits the samples in an order drawn from the seed
// and the epoch number alone, so a checkpoint (Checkpoint.h) needs only the
// step count to resume exactly; the next batch is gathered on a background
// thread while the current step runs (Data.h's BatchPrefetcher).
//
// Data-parallel (docs/distributed.md): under a communicator of several
// ranks (kiln train under mpirun), every rank runs the same trainer on its
// shard of each epoch (BatchPlan); the step all-reduces the gradients in
// buckets, so the parameters stay equal on every rank; rank 0's parameters
// are broadcast at the start. Only rank 0 writes checkpoints (its caller
// writes the trained model).
//
// Numerics (Numerics.h): a non-finite loss stops training with the step
// number, and the step that computed it left the parameters and optimizer
// state as they were (the training step selects the old values when its
// loss is not finite, as GradScaler skips an update); with checkNumerics
// every result of every step is checked, and on the first non-finite value
// the step is run again on the interpreter to name the first op whose
// result is not finite.
//
// The trainer prints nothing: notices, steps, epochs, evaluations and the
// resumed step are reported through TrainCallbacks, errors and the summary
// are returned (tools/TrainCommand.cpp prints them for `kiln train`).
//
//   auto session = std::get<std::unique_ptr<Session>>(Session::create({}));
//   auto trainer = training::Trainer::create(*session, options, callbacks);
//   auto summary = (*trainer)->train();
//   (*trainer)->writeTrainedModel();
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "driver/Session.h"
#include "driver/ThreadChooser.h"
#include "passes/TrainingStep.h"
#include "training/Checkpoint.h"
#include "training/Data.h"
#include "training/Metrics.h"
#include "training/TrainableModel.h"

namespace kiln::training {

/// What to train, on what, and how.
struct TrainOptions {
  std::string modelPath;  // .onnx, .kiln, .kiln.txt or .kir
  std::string dataPath;   // the training data (.npz)
  std::string evalPath;   // evaluation data (.npz), or empty
  /// Where writeTrainedModel() writes; checked before training. May be empty.
  std::string outputPath;
  std::string xKey = "x", yKey = "y";  // the arrays of the .npz files
  /// Without a data file (batches handed over, trainBatch): the shape of
  /// the first batch, with which an ONNX model that imports only
  /// specialized (it computes shapes from its input's) reads its signature.
  /// Empty: such a model is refused with kNeedsFirstBatch.
  std::vector<int64_t> firstBatchShape;
  /// Model inputs besides the one x feeds that take zeros at every step.
  std::vector<std::string> zeroInputs;
  /// Loss, optimizer, schedule (its totalSteps is set from the run) and
  /// batch norms.
  TrainingStepOptions step;
  double lr = 0;  // the base learning rate
  int64_t batchSize = 32;
  /// One of the two: passes over the data, or steps in all (counted from
  /// the start, also when resuming). Neither: one epoch.
  std::optional<int64_t> epochs, steps;
  uint64_t seed = 0;
  bool shuffle = true;
  bool dropLast = false;  // drop each epoch's last, partial batch
  bool overlap = true;    // gather the next batch on a background thread
  /// Check every result of every step, and name the op that first produces
  /// a non-finite value (steps then feed their new state back instead of
  /// updating in place, to keep the old inputs for the re-run).
  bool checkNumerics = false;
  /// How the caller spells checkNumerics, for the error of a non-finite
  /// loss to name ("--check-numerics"; "check_numerics=True" in Python).
  std::string checkNumericsName = "--check-numerics";
  /// Choose between all cores and one by timing the steps
  /// (driver/ThreadChooser.h).
  bool autoThreads = false;
  /// Class losses: the classes are the output's last dim, not dim 1.
  bool classesLast = false;
  /// Write checkpointDir/step-N.npz every this many steps (0: never).
  int64_t checkpointEvery = 0;
  std::string checkpointDir;
  std::string resumePath;  // a checkpoint to continue from, or empty
  /// Also evaluate every this many steps (0: after each epoch only).
  int64_t evalEvery = 0;
  /// In a data-parallel job (the communicator of runtime/Collectives.h has
  /// more than one rank): the most bytes of gradients per all-reduce bucket
  /// (passes/DataParallel.h).
  int64_t bucketCapBytes = int64_t{25} * 1024 * 1024;
};

/// A step done.
struct StepReport {
  int64_t step = 0;       // 0-based, counted from the start of training
  int64_t epoch = 0;      // 0-based
  int64_t batchSize = 0;  // this step's samples
  double loss = 0;
  double lr = 0;        // the rate the schedule gave this step
  double seconds = 0;   // training time of this run so far (no compiling, no evaluation)
  int64_t samples = 0;  // samples trained by this run so far (by the whole job)
  /// fp16's dynamic loss scale after this step (0: no loss scaling, or
  /// not read back from the device).
  double lossScale = 0;
};

/// An epoch done.
struct EpochReport {
  int64_t epoch = 0;  // 0-based
  double meanLoss = 0;
  int64_t steps = 0;  // steps of this epoch run by this run
};

/// An evaluation with the parameters after `step` steps.
struct EvalReport {
  int64_t step = 0;
  /// The epoch (1-based) it follows, or 0 for an evaluation in the middle
  /// of one ("at step S").
  int64_t epoch = 0;
  const EvalResult& result;
};

/// What a training run reports as it goes; each may be left empty.
struct TrainCallbacks {
  /// A notice for the user: an array converted to the model's dtype, the
  /// JIT's notices, the interpreter fallback, --threads auto's choice.
  NoticeFn notice;
  /// Training continues at `step` from the checkpoint at `path`.
  std::function<void(int64_t step, const std::string& path)> resumed;
  std::function<void(const StepReport&)> stepDone;
  std::function<void(const EpochReport&)> epochDone;
  std::function<void(const EvalReport&)> evaluated;
};

/// What train() did.
struct TrainSummary {
  int64_t firstStep = 0;  // the step it started at (a resumed checkpoint's)
  int64_t totalSteps = 0;
  int64_t samples = 0;
  double seconds = 0;    // training time, without compiling and evaluating
  double finalLoss = 0;  // NaN when no step ran
  /// The last evaluation, for its confusion matrix.
  std::optional<EvalResult> lastEval;

  int64_t steps() const { return totalSteps - firstStep; }
  double samplesPerSecond() const;
};

class Trainer {
 public:
  /// Loads the model and the data of `options` and checks them against each
  /// other; compiles nothing yet. Steps compile on `session` (its CPU
  /// options: threads, kernel cache), which must outlive the trainer.
  static Expected<std::unique_ptr<Trainer>> create(Session& session, TrainOptions options,
                                                   TrainCallbacks callbacks = {});
  ~Trainer();

  /// A problem of the options that shows only with the run's step count (a
  /// cosine warm-up as long as the run), for the caller to report as a
  /// usage error; nullopt when there is none.
  std::optional<std::string> scheduleProblem() const;

  /// Runs the training steps (resuming options().resumePath first, writing
  /// checkpoints and evaluating as the options ask), once per trainer. After
  /// an error the state is that of the last step that kept its update: a
  /// step whose loss is not finite skips its update (buildTrainingStep)
  /// and is reported as an error.
  Expected<TrainSummary> train();

  /// Evaluates the current parameters on the evaluation data (which the
  /// options must name).
  Expected<EvalResult> evaluate();

  /// Training on batches the caller hands over (the Python package's
  /// kiln.Trainer) instead of options().dataPath's, which is then empty:
  /// one step on the batch (x, y), checked and converted as a data file's
  /// arrays are (errors name them as x and y of `source`); returns the
  /// step's loss. Steps count on from the last one, and every batch must
  /// have the first one's sample shape. After any error the trainer is
  /// usable and its state is that before the call: a step whose loss is not
  /// finite is an error and skips its update inside the step.
  Expected<double> trainBatch(const Tensor& x, const Tensor& y, const std::string& source);
  /// Evaluates the current parameters on (x, y) in batches of
  /// options().batchSize.
  Expected<EvalResult> evaluate(const Tensor& x, const Tensor& y, const std::string& source);
  /// The state as of the last step (brought back from the device first):
  /// parameters, batch norm running statistics, optimizer state. Before
  /// the first step, the initial state of a step for `batch` samples.
  Expected<const TrainState*> currentState(int64_t batch);
  /// Replaces the named values of the state (currentState(batch)'s names:
  /// parameters, running statistics, optimizer state) with `values`, each
  /// of its value's type; names not given keep theirs. Every name and type
  /// is checked first, so an error changes nothing. The next step, on any
  /// device, starts from them.
  Status setState(const std::map<std::string, Tensor>& values, int64_t batch);
  /// The base learning rate of the steps from now on.
  void setLearningRate(double lr);
  /// Steps run by trainBatch so far.
  int64_t batchesTrained() const { return batchesTrained_; }

  /// The trained values of the model's weights (those the step updates;
  /// batch norms' frozen running statistics are not among them), by name.
  std::map<std::string, DenseTensor> trainedParameters() const;
  /// Writes the model with trainedParameters() to options().outputPath.
  Status writeTrainedModel() const;

  const TrainOptions& options() const { return options_; }
  const ModelSignature& signature() const { return signature_; }
  const BatchPlan& plan() const { return plan_; }
  int64_t totalSteps() const { return totalSteps_; }
  /// The training step's leading arguments, by name: parameters and state.
  const TrainState& state() const { return state_; }
  /// What this run's checkpoints record of it, and resuming checks.
  CheckpointRun checkpointRun() const;
  /// The batch sizes a step was built for so far, ascending.
  std::vector<int64_t> stepBatchSizes() const;

 private:
  struct Program;

  Trainer(Session& session, TrainOptions options, TrainCallbacks callbacks);
  Status loadAndCheck();
  /// Data-parallel: refuses a job whose ranks load other models, data or
  /// options than rank 0.
  Status checkSameRun();
  /// Data-parallel: every rank takes rank 0's parameters and state.
  Status broadcastState();
  Status initializeState(int64_t batch);
  DataSpec dataSpec(const std::string& source) const;
  /// A batch handed over (trainBatch, evaluate), checked and converted; the
  /// first one fixes the sample shape.
  Expected<Dataset> checkBatch(const Tensor& x, const Tensor& y, const std::string& source);
  Expected<EvalResult> evaluateOn(const Dataset& data);
  Expected<Program*> program(int64_t batch);
  Expected<std::unique_ptr<CompiledModel>> compile(const Function& f, const std::vector<Tensor>& inputs, bool donate,
                                                   int threads = 0);
  /// One training step on `batch`. `upcoming`, the next step's batch when
  /// known, is copied to the device while this step runs (on CUDA).
  Expected<std::vector<Tensor>> runStep(Batch batch, std::chrono::steady_clock::duration& compileTime,
                                        const Batch* upcoming = nullptr);
  void notify(const std::string& text) const;

  Session& session_;
  TrainOptions options_;
  TrainCallbacks callbacks_;
  ModelSignature signature_;
  std::optional<Dataset> trainData_, evalData_;
  BatchPlan plan_;
  int64_t totalSteps_ = 0;
  Tensor lr_;
  TrainState state_;
  bool stateReady_ = false;
  std::map<std::string, size_t> stateIndex_;
  std::map<int64_t, std::unique_ptr<Program>> programs_;
  std::optional<ThreadChooser> chooser_;  // autoThreads, once a step runs on the JIT
  /// The step that ran in place last: on CUDA it keeps the parameters and
  /// optimizer state on the device, and they come back to state_ (syncState)
  /// before anything else reads them — an evaluation, a checkpoint, the
  /// trained model, or another step program (another batch size).
  CompiledModel* inPlace_ = nullptr;
  Status syncState();
  bool trained_ = false;
  int64_t batchesTrained_ = 0;
  int rank_ = 0, world_ = 1;  // this rank of the data-parallel job
};

}  // namespace kiln::training
