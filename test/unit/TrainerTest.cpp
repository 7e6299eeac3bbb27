// The training library (training/): resuming a checkpoint continues the
// same optimization to the bit; an epoch's last, partial batch gets a step
// of its own or is dropped; evaluation's loss, accuracy and confusion
// matrix on known logits; the data checks' messages; a checkpoint of other
// options is refused, naming the option. The models are the small text-IR
// ones of test/lit/tools/Inputs/train; the data is written here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "driver/Session.h"
#include "runtime/Npz.h"
#include "test/unit/TestSupport.h"
#include "training/Checkpoint.h"
#include "training/Data.h"
#include "training/Metrics.h"
#include "training/Trainer.h"

namespace kiln::training {
namespace {

namespace fs = std::filesystem;

const std::string kMlp2 = std::string(KILN_SOURCE_DIR) + "/test/lit/tools/Inputs/train/mlp2.kir";

/// A model whose logits are its input: x @ identity, three classes.
constexpr const char* kIdentityModel = R"(func @identity(%x: f32[N,3],
    %w: f32[3,3] = dense<f32[3,3]>[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]) -> ("logits": f32[N,3]) {
  %logits = matmul(%x, %w) : f32[N,3]
  return %logits
}
)";

class TrainerTest : public testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("kiln-trainer-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// Writes arrays x and y to `name` in the test's folder; returns its path.
  std::string writeData(const std::string& name, const Tensor& x, const Tensor& y) const {
    const std::string file = path(name);
    EXPECT_TRUE(writeNpz(file, {{"x", x}, {"y", y}}).ok());
    return file;
  }

  /// `n` samples of two classes on either side of x0 + x1 = 0.
  std::string writeSeparable(const std::string& name, int64_t n, int seed) const {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-2, 2);
    Tensor x(DType::F32, {n, 2}), y(DType::I64, {n});
    for (int64_t i = 0; i < n; ++i) {
      const double a = u(rng), b = u(rng);
      x.setDouble(2 * i, a);
      x.setDouble(2 * i + 1, b);
      y.setInt(i, a + b > 0);
    }
    return writeData(name, x, y);
  }

  std::string writeText(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
    return path(name);
  }

  /// A CPU session; the kernel cache is ctest's ($KILN_CACHE_DIR), or none.
  static std::unique_ptr<Session> session(bool interpret = false) {
    SessionOptions options;
    options.interpret = interpret;
    if (const char* dir = std::getenv("KILN_CACHE_DIR")) options.cpu.cacheDir = dir;
    return std::move(std::get<std::unique_ptr<Session>>(Session::create(options)));
  }

  /// Options for mlp2.kir on `data`: Adam, lr 0.05, batches of `batch`.
  static TrainOptions mlpOptions(const std::string& data, int64_t batch) {
    TrainOptions o;
    o.modelPath = kMlp2;
    o.dataPath = data;
    o.step.optimizer.kind = OptimizerKind::Adam;
    o.lr = 0.05;
    o.batchSize = batch;
    o.seed = 5;
    return o;
  }

  fs::path dir_;
};

/// Creates a trainer, failing the test on an error.
std::unique_ptr<Trainer> createOk(Session& session, const TrainOptions& o, TrainCallbacks callbacks = {}) {
  auto trainer = Trainer::create(session, o, std::move(callbacks));
  EXPECT_TRUE(trainer.ok()) << (trainer.ok() ? "" : trainer.error().message());
  return trainer.ok() ? std::move(*trainer) : nullptr;
}

/// The message of the error `e` holds, or "" when it holds none.
template <typename T>
std::string errorOf(const Expected<T>& e) {
  return e.ok() ? "" : e.error().message();
}

/// 8 steps straight, and 3 steps then a checkpoint resumed to 8, end with
/// the same parameters and Adam state to the bit. 40 samples in batches of
/// 16 are 3 steps an epoch (the last of 8 samples), so the resumed run
/// crosses two epochs, each in its own shuffled order.
TEST_F(TrainerTest, ResumedRunEqualsStraightRun) {
  const std::string data = writeSeparable("sep.npz", 40, 1);
  auto s = session();

  TrainOptions straight = mlpOptions(data, 16);
  straight.steps = 8;
  std::vector<double> losses;
  TrainCallbacks record;
  record.stepDone = [&](const StepReport& r) { losses.push_back(r.loss); };
  auto a = createOk(*s, straight, record);
  ASSERT_TRUE(a);
  auto summaryA = a->train();
  ASSERT_TRUE(summaryA.ok()) << summaryA.error().message();
  EXPECT_EQ(summaryA->steps(), 8);
  ASSERT_EQ(losses.size(), 8u);
  EXPECT_LT(losses.back(), losses.front()) << "the straight run did not learn";

  TrainOptions first = mlpOptions(data, 16);
  first.steps = 3;
  first.checkpointEvery = 3;
  first.checkpointDir = path("ckpt");
  auto b = createOk(*s, first);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->train().ok());
  ASSERT_TRUE(fs::exists(path("ckpt/step-3.npz")));

  TrainOptions resumed = mlpOptions(data, 16);
  resumed.steps = 8;
  resumed.resumePath = path("ckpt/step-3.npz");
  int64_t resumedAt = -1;
  TrainCallbacks callbacks;
  callbacks.resumed = [&](int64_t step, const std::string&) { resumedAt = step; };
  auto c = createOk(*s, resumed, callbacks);
  ASSERT_TRUE(c);
  auto summaryC = c->train();
  ASSERT_TRUE(summaryC.ok()) << summaryC.error().message();
  EXPECT_EQ(resumedAt, 3);
  EXPECT_EQ(summaryC->firstStep, 3);
  EXPECT_EQ(summaryC->steps(), 5);
  EXPECT_EQ(summaryC->finalLoss, summaryA->finalLoss);

  // Parameters (w1, b1, w2, b2), Adam's moments and its step counter.
  const TrainState& want = a->state();
  const TrainState& got = c->state();
  ASSERT_EQ(got.names, want.names);
  EXPECT_EQ(want.names.size(), 4u + 8u + 1u);
  for (size_t i = 0; i < want.values.size(); ++i) {
    ASSERT_EQ(got.values[i].type(), want.values[i].type()) << want.names[i];
    EXPECT_EQ(std::memcmp(got.values[i].raw(), want.values[i].raw(), want.values[i].numBytes()), 0)
        << want.names[i] << " differs after resuming";
  }
}

/// 10 samples in batches of 4: each epoch is steps of 4, 4 and 2 samples,
/// the last on a step built for 2 samples.
TEST_F(TrainerTest, LastPartialBatchHasAStepOfItsOwn) {
  const std::string data = writeSeparable("ten.npz", 10, 2);
  auto s = session(/*interpret=*/true);  // the batching is tested, not the code
  TrainOptions o = mlpOptions(data, 4);
  o.epochs = 2;
  std::vector<int64_t> sizes, epochSteps;
  TrainCallbacks callbacks;
  callbacks.stepDone = [&](const StepReport& r) { sizes.push_back(r.batchSize); };
  callbacks.epochDone = [&](const EpochReport& r) { epochSteps.push_back(r.steps); };
  auto trainer = createOk(*s, o, callbacks);
  ASSERT_TRUE(trainer);
  EXPECT_EQ(trainer->plan().stepsPerEpoch, 3);
  EXPECT_EQ(trainer->totalSteps(), 6);
  auto summary = trainer->train();
  ASSERT_TRUE(summary.ok()) << summary.error().message();
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2, 4, 4, 2}));
  EXPECT_EQ(epochSteps, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(summary->samples, 20);
  EXPECT_EQ(trainer->stepBatchSizes(), (std::vector<int64_t>{2, 4}));
}

/// With dropLast the same data is 2 steps of 4 an epoch: 8 of the 10
/// samples, and no step is built for 2.
TEST_F(TrainerTest, DropLastDropsThePartialBatch) {
  const std::string data = writeSeparable("ten.npz", 10, 2);
  auto s = session(/*interpret=*/true);
  TrainOptions o = mlpOptions(data, 4);
  o.epochs = 2;
  o.dropLast = true;
  std::vector<int64_t> sizes, epochSteps;
  TrainCallbacks callbacks;
  callbacks.stepDone = [&](const StepReport& r) { sizes.push_back(r.batchSize); };
  callbacks.epochDone = [&](const EpochReport& r) { epochSteps.push_back(r.steps); };
  auto trainer = createOk(*s, o, callbacks);
  ASSERT_TRUE(trainer);
  EXPECT_EQ(trainer->plan().stepsPerEpoch, 2);
  auto summary = trainer->train();
  ASSERT_TRUE(summary.ok()) << summary.error().message();
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(epochSteps, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(summary->samples, 16);
  EXPECT_EQ(trainer->stepBatchSizes(), (std::vector<int64_t>{4}));
}

/// Cross-entropy on known logits: the loss is summed over the counted
/// labels (log-sum-exp minus the label's logit), the accuracy is argmax's,
/// the confusion matrix is [true][predicted], and an ignored label counts
/// nowhere. A second batch adds to the same sums.
TEST(TrainerMetricsTest, CrossEntropyOnKnownLogits) {
  const Tensor logits = test::tensorOf(DType::F32, {4, 3}, {2, 0, 0, 0, 3, 0, 0, 0, 1, 1, 1, 5});
  const Tensor labels = test::tensorOf(DType::I64, {4}, {0, 1, 0, -100});
  EvalResult r;
  accumulateEval(logits, labels, LossConfig{}, /*classesLast=*/false, r);
  const double want =
      (std::log(std::exp(2.0) + 2) - 2) + (std::log(std::exp(3.0) + 2) - 3) + std::log(2 + std::exp(1.0));
  EXPECT_NEAR(r.loss, want, 1e-12);
  EXPECT_EQ(r.counted, 3);
  EXPECT_EQ(r.correct, 2);
  EXPECT_NEAR(r.meanLoss(), want / 3, 1e-12);
  EXPECT_DOUBLE_EQ(r.accuracy(), 2.0 / 3);
  EXPECT_EQ(r.confusion, (std::vector<std::vector<int64_t>>{{1, 0, 1}, {0, 1, 0}, {0, 0, 0}}));
  accumulateEval(logits, labels, LossConfig{}, false, r);
  EXPECT_EQ(r.counted, 6);
  EXPECT_EQ(r.confusion, (std::vector<std::vector<int64_t>>{{2, 0, 2}, {0, 2, 0}, {0, 0, 0}}));
  EXPECT_EQ(formatConfusion(r.confusion),
            "confusion matrix (rows: true class, columns: predicted class):\n"
            "true\\pred   0   1   2\n"
            "        0   2   0   2\n"
            "        1   0   2   0\n"
            "        2   0   0   0\n");
}

/// classesLast: [N, T, C] logits with [N, T] labels are scored per position;
/// MSE sums squared differences over every element and has no classes.
TEST(TrainerMetricsTest, ClassesLastAndMse) {
  EvalResult seq;
  accumulateEval(test::tensorOf(DType::F32, {1, 2, 3}, {0, 5, 0, 4, 0, 0}), test::tensorOf(DType::I64, {1, 2}, {1, 2}),
                 LossConfig{}, /*classesLast=*/true, seq);
  EXPECT_EQ(seq.counted, 2);
  EXPECT_EQ(seq.correct, 1);
  EXPECT_EQ(seq.confusion, (std::vector<std::vector<int64_t>>{{0, 0, 0}, {0, 1, 0}, {1, 0, 0}}));

  EvalResult mse;
  accumulateEval(test::tensorOf(DType::F32, {2, 2}, {1, 2, 3, 4}), test::tensorOf(DType::F32, {2, 2}, {1, 0, 3, 6}),
                 LossConfig{LossKind::Mse}, false, mse);
  EXPECT_EQ(mse.loss, 8.0);
  EXPECT_EQ(mse.counted, 4);
  EXPECT_DOUBLE_EQ(mse.meanLoss(), 2.0);
  EXPECT_TRUE(mse.confusion.empty());
}

/// The trainer's evaluation runs the compiled forward model on the eval
/// data in batches (2, 2, 1 here): on a model whose logits are its input,
/// the accuracy and confusion matrix are those of the input rows.
TEST_F(TrainerTest, EvaluateScoresTheModelsOutput) {
  const std::string model = writeText("identity.kir", kIdentityModel);
  const Tensor x = test::tensorOf(DType::F32, {5, 3}, {3, 0, 0, 0, 2, 0, 0, 0, 1, 1, 0, 0, 0, 4, 0});
  const Tensor y = test::tensorOf(DType::I64, {5}, {0, 1, 0, 0, 2});
  const std::string data = writeData("rows.npz", x, y);
  auto s = session();
  TrainOptions o;
  o.modelPath = model;
  o.dataPath = data;
  o.evalPath = data;
  o.lr = 0.1;
  o.batchSize = 2;
  auto trainer = createOk(*s, o);
  ASSERT_TRUE(trainer);
  auto r = trainer->evaluate();
  ASSERT_TRUE(r.ok()) << r.error().message();
  // Predicted 0, 1, 2, 0, 1.
  EXPECT_EQ(r->counted, 5);
  EXPECT_EQ(r->correct, 3);
  EXPECT_EQ(r->confusion, (std::vector<std::vector<int64_t>>{{2, 0, 1}, {0, 1, 0}, {0, 1, 0}}));
  EvalResult want;
  accumulateEval(x, y, LossConfig{}, false, want);
  EXPECT_NEAR(r->loss, want.loss, 1e-9);
  EXPECT_EQ(trainer->stepBatchSizes(), (std::vector<int64_t>{1, 2}));
}

/// Each data problem is one error naming the file, what is wrong and what
/// was expected; a float64 x is converted with a notice.
TEST_F(TrainerTest, DataChecksNameTheProblem) {
  auto sig = readTrainingSignature(kMlp2, {}, FirstBatch{}, Session::evaluator());
  ASSERT_TRUE(sig.ok()) << sig.error().message();
  const DataSpec spec{.modelPath = kMlp2,
                      .xKey = "x",
                      .yKey = "y",
                      .input = sig->input,
                      .output = sig->output,
                      .inputName = sig->inputName,
                      .outputName = sig->outputName};

  const std::string label =
      writeData("label.npz", test::tensorOf(DType::F32, {3, 2}, {}), test::tensorOf(DType::I64, {3}, {0, 1, 2}));
  EXPECT_EQ(errorOf(loadDataset(label, spec)),
            label +
                ": label y[2] = 2 is outside [0, 2): the model's output 'logits' has 2 classes (and the ignored "
                "label, --ignore-index, is -100)");

  const std::string shape =
      writeData("shape.npz", test::tensorOf(DType::F32, {3, 3}, {}), test::tensorOf(DType::I64, {3}, {0, 1, 0}));
  EXPECT_EQ(errorOf(loadDataset(shape, spec)),
            shape +
                ": 'x' (float32[3,3]) holds samples of shape [3], but the model's input 'x' (f32[N,2]) expects "
                "samples of shape [2]");

  const std::string nan = writeData("nan.npz", test::tensorOf(DType::F32, {3, 2}, {0, 1, NAN, 0}),
                                    test::tensorOf(DType::I64, {3}, {0, 1, 0}));
  EXPECT_EQ(errorOf(loadDataset(nan, spec)),
            nan + ": 'x' holds a non-finite value (nan) at [1, 0]; every input must be finite");

  const std::string wide =
      writeData("f64.npz", test::tensorOf(DType::F64, {3, 2}, {0.5}), test::tensorOf(DType::I32, {3}, {0, 1, 0}));
  std::vector<std::string> notices;
  auto converted = loadDataset(wide, spec, [&](const std::string& n) { notices.push_back(n); });
  ASSERT_TRUE(converted.ok()) << converted.error().message();
  EXPECT_EQ(converted->x.dtype(), DType::F32);
  EXPECT_EQ(converted->x.getDouble(0), 0.5);
  EXPECT_EQ(converted->y.dtype(), DType::I64);  // int32 labels are widened silently
  EXPECT_EQ(notices, (std::vector<std::string>{wide + ": 'x' is float64, converted to the model input's float32"}));
}

/// A checkpoint restores its step and values for the run that wrote it, and
/// is refused, naming the option and both values, by a run with another
/// learning rate, optimizer or batch size, or another model's state.
TEST_F(TrainerTest, CheckpointOfOtherOptionsIsRefused) {
  CheckpointRun run;
  run.seed = 3;
  run.batchSize = 16;
  run.samples = 100;
  run.lr = 0.01;
  run.optimizer.kind = OptimizerKind::AdamW;
  const TrainState written{{"w", "step"},
                           {test::tensorOf(DType::F32, {2}, {1.5, -2}), test::tensorOf(DType::F32, {}, {4})}};
  const std::string file = path("step-4.npz");
  ASSERT_TRUE(writeCheckpoint(file, written, run, 4).ok());

  TrainState state{{"w", "step"}, {Tensor(DType::F32, {2}), Tensor(DType::F32, {})}};
  auto step = readCheckpoint(file, run, state);
  ASSERT_TRUE(step.ok()) << step.error().message();
  EXPECT_EQ(*step, 4);
  EXPECT_EQ(test::elementsOf(state.values[0]), (std::vector<double>{1.5, -2}));
  EXPECT_EQ(test::elementsOf(state.values[1]), (std::vector<double>{4}));

  CheckpointRun otherLr = run;
  otherLr.lr = 0.02;
  EXPECT_EQ(errorOf(readCheckpoint(file, otherLr, state)),
            file +
                ": the checkpoint was written with --lr 0.01, this run has 0.02; resuming needs the same optimizer "
                "and learning rate to continue exactly");
  CheckpointRun otherOptimizer = run;
  otherOptimizer.optimizer.kind = OptimizerKind::Sgd;
  EXPECT_EQ(errorOf(readCheckpoint(file, otherOptimizer, state)),
            file +
                ": the checkpoint was written with --optimizer adamw, this run has sgd; resuming needs the same "
                "optimizer and learning rate to continue exactly");
  CheckpointRun otherBatch = run;
  otherBatch.batchSize = 8;
  EXPECT_EQ(errorOf(readCheckpoint(file, otherBatch, state)),
            file +
                ": the checkpoint was written with --batch-size 16, this run has 8; resuming needs the same data "
                "and batching to continue exactly");
  TrainState otherModel{{"v", "step"}, {Tensor(DType::F32, {2}), Tensor(DType::F32, {})}};
  EXPECT_EQ(errorOf(readCheckpoint(file, run, otherModel)),
            file + ": the checkpoint has no 'v' (written for another model or optimizer?)");
}

/// The trainer checks its own checkpoints the same way: resuming with
/// another learning rate stops before any step.
TEST_F(TrainerTest, ResumeWithOtherLearningRateStops) {
  const std::string data = writeSeparable("sep.npz", 16, 3);
  auto s = session(/*interpret=*/true);
  TrainOptions o = mlpOptions(data, 8);
  o.steps = 2;
  o.checkpointEvery = 2;
  o.checkpointDir = path("ckpt");
  auto first = createOk(*s, o);
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->train().ok());
  o.steps = 4;
  o.checkpointEvery = 0;
  o.lr = 0.1;
  o.resumePath = path("ckpt/step-2.npz");
  int steps = 0;
  TrainCallbacks callbacks;
  callbacks.stepDone = [&](const StepReport&) { ++steps; };
  auto second = createOk(*s, o, callbacks);
  ASSERT_TRUE(second);
  EXPECT_EQ(errorOf(second->train()),
            o.resumePath +
                ": the checkpoint was written with --lr 0.05, this run has 0.1; resuming needs the same "
                "optimizer and learning rate to continue exactly");
  EXPECT_EQ(steps, 0);
}

/// A NaN loss stops training with the step; checkNumerics re-runs the step
/// on the interpreter and names the op that first produced it.
TEST_F(TrainerTest, NonFiniteLossNamesTheOp) {
  const std::string model = std::string(KILN_SOURCE_DIR) + "/test/lit/tools/Inputs/train/log.kir";
  const std::string data =
      writeData("negative.npz", test::tensorOf(DType::F32, {4, 2}, {-1, -1, -2, -1, -1, -3, -2, -2}),
                test::tensorOf(DType::I64, {4}, {0, 1, 0, 1}));
  auto s = session(/*interpret=*/true);
  TrainOptions o;
  o.modelPath = model;
  o.dataPath = data;
  o.lr = 0.1;
  o.batchSize = 4;
  auto plain = createOk(*s, o);
  ASSERT_TRUE(plain);
  EXPECT_EQ(errorOf(plain->train()),
            "step 1 (epoch 1): the loss is nan (--check-numerics names the op that produces it); training stopped");
  o.checkNumerics = true;
  auto checked = createOk(*s, o);
  ASSERT_TRUE(checked);
  EXPECT_EQ(errorOf(checked->train()),
            "step 1 (epoch 1): the loss is nan; first produced by 'log' (%l) at log.kir: node 'take_log' (op 2 of the "
            "training step): nan at [0, 0] of its f32[4,2] result; training stopped");
}

/// Batches handed over (kiln.Trainer's engine): a step whose loss is NaN is
/// an error that leaves the parameters and Adam state as they were (the
/// step skips its update), on the JIT updating in place; the trainer goes
/// on from them, and a refused batch changes nothing either.
TEST_F(TrainerTest, BatchesSurviveANonFiniteLossAndRefusedBatches) {
  const std::string model = std::string(KILN_SOURCE_DIR) + "/test/lit/tools/Inputs/train/log.kir";
  auto s = session();
  TrainOptions o;
  o.modelPath = model;
  o.lr = 0.1;
  o.batchSize = 4;
  o.step.optimizer.kind = OptimizerKind::Adam;
  auto trainer = createOk(*s, o);
  ASSERT_TRUE(trainer);
  const Tensor good = test::tensorOf(DType::F32, {4, 2}, {1, 2, 2, 1, 3, 1, 1, 3});
  const Tensor negative = test::tensorOf(DType::F32, {4, 2}, {-1, -1, -2, -1, -1, -3, -2, -2});
  const Tensor labels = test::tensorOf(DType::I64, {4}, {0, 1, 0, 1});
  ASSERT_TRUE(trainer->trainBatch(good, labels, "batch").ok());
  auto before = trainer->currentState(4);
  ASSERT_TRUE(before.ok());
  const TrainState kept = **before;
  auto expectKept = [&](const std::string& after) {
    auto now = trainer->currentState(4);
    ASSERT_TRUE(now.ok()) << now.error().message();
    ASSERT_EQ((*now)->values.size(), kept.values.size()) << after;
    for (size_t i = 0; i < kept.values.size(); ++i)
      for (int64_t k = 0; k < kept.values[i].numElements(); ++k)
        EXPECT_EQ((*now)->values[i].getDouble(k), kept.values[i].getDouble(k)) << after << ": " << kept.names[i];
  };
  EXPECT_EQ(errorOf(trainer->trainBatch(negative, labels, "batch")),
            "step 2: the loss is nan (--check-numerics names the op that produces it); the step's update was "
            "skipped: the parameters and optimizer state are those before it");
  expectKept("a NaN loss");
  EXPECT_NE(errorOf(trainer->trainBatch(test::tensorOf(DType::F32, {4, 3}, std::vector<double>(12, 1.0)), labels,
                                        "batch")),
            "");
  expectKept("a batch of another sample shape");
  EXPECT_NE(errorOf(trainer->trainBatch(good, test::tensorOf(DType::I64, {4}, {0, 1, 2, 1}), "batch")), "");
  expectKept("a label out of range");
  EXPECT_EQ(trainer->batchesTrained(), 1);
  auto eval = trainer->evaluate(good, labels, "batch");
  ASSERT_TRUE(eval.ok()) << eval.error().message();
  auto next = trainer->trainBatch(good, labels, "batch");
  ASSERT_TRUE(next.ok()) << next.error().message();
  EXPECT_TRUE(std::isfinite(*next));
  EXPECT_EQ(trainer->batchesTrained(), 2);

  // setState: a wrong name or type changes nothing; a right one is what the
  // next step starts from.
  auto now = trainer->currentState(4);
  ASSERT_TRUE(now.ok());
  const TrainState trained = **now;
  const Tensor w = test::tensorOf(DType::F32, {2, 2}, {2, 0, 0, 2});
  Status unknown = trainer->setState({{"w", w}, {"v", w}}, 4);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message().find("no state value named 'v'"), std::string::npos) << unknown.error().message();
  Status wrongType = trainer->setState({{"w", test::tensorOf(DType::F32, {2}, {1, 1})}}, 4);
  ASSERT_FALSE(wrongType.ok());
  EXPECT_EQ(wrongType.error().message(), "'w' is f32[2], the training step's is f32[2,2]");
  auto unchanged = trainer->currentState(4);
  ASSERT_TRUE(unchanged.ok());
  for (size_t i = 0; i < trained.values.size(); ++i)
    for (int64_t k = 0; k < trained.values[i].numElements(); ++k)
      EXPECT_EQ((*unchanged)->values[i].getDouble(k), trained.values[i].getDouble(k)) << trained.names[i];
  ASSERT_TRUE(trainer->setState({{"w", w}}, 4).ok());
  auto loaded = trainer->currentState(4);
  ASSERT_TRUE(loaded.ok());
  const size_t wIndex = std::find(trained.names.begin(), trained.names.end(), "w") - trained.names.begin();
  ASSERT_LT(wIndex, trained.names.size());
  EXPECT_EQ((*loaded)->values[wIndex].getDouble(0), 2.0);
  EXPECT_EQ((*loaded)->values[wIndex].getDouble(1), 0.0);
  ASSERT_TRUE(trainer->trainBatch(good, labels, "batch").ok());
}

}  // namespace
}  // namespace kiln::training
