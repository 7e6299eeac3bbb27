// What `kiln train` prints and decides outside the trainer, now in the
// training library: the progress line (a line every N steps off a
// terminal, the loss averaged since the previous line), the epoch, eval and
// summary lines, the names of the step's choices, and the GPU each rank of
// a data-parallel job takes (reachable from lit only under mpirun on a
// machine with GPUs).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "training/DataParallel.h"
#include "training/Names.h"
#include "training/Report.h"

namespace kiln::training {
namespace {

StepReport step(int64_t index, double loss) {
  StepReport r;
  r.step = index;
  r.loss = loss;
  r.lr = 0.5;
  r.seconds = static_cast<double>(index + 1);
  r.samples = 10 * (index + 1);
  return r;
}

TEST(TrainReportTest, ProgressLineOffATerminalPrintsEveryNStepsAndTheLast) {
  std::ostringstream out;
  ProgressLine progress(out, /*terminal=*/false, /*total=*/5, /*logEvery=*/2);
  for (int64_t i = 0; i < 5; ++i) progress.stepDone(step(i, static_cast<double>(i)));
  progress.breakLine();  // nothing to erase off a terminal
  EXPECT_EQ(out.str(),
            "step 2/5 epoch 1 loss 0.500000 lr 0.5 samples/s 10.0 eta 3.0s\n"
            "step 4/5 epoch 1 loss 2.500000 lr 0.5 samples/s 10.0 eta 1.0s\n"
            "step 5/5 epoch 1 loss 4.000000 lr 0.5 samples/s 10.0 eta 0.0s\n");
}

TEST(TrainReportTest, ProgressLineOnATerminalIsRedrawnAndErased) {
  std::ostringstream out;
  ProgressLine progress(out, /*terminal=*/true, /*total=*/1, std::nullopt);
  progress.stepDone(step(0, 1.0));
  progress.breakLine();
  EXPECT_EQ(out.str(), "\rstep 1/1 epoch 1 loss 1.000000 lr 0.5 samples/s 10.0 eta 0.0s\033[K\r\033[K");
}

TEST(TrainReportTest, EpochEvalAndSummaryLines) {
  EXPECT_EQ(formatEpoch({.epoch = 1, .meanLoss = 0.25, .steps = 3}), "epoch 2: mean loss 0.250000 over 3 steps");
  EvalResult result;
  result.loss = 3;
  result.correct = 2;
  result.counted = 4;
  EXPECT_EQ(formatEval({.step = 7, .epoch = 0, .result = result}, true),
            "eval at step 7: loss 0.750000 accuracy 0.5000 (2/4)");
  EXPECT_EQ(formatEval({.step = 7, .epoch = 2, .result = result}, false), "eval after epoch 2: loss 0.750000");
  TrainSummary summary;
  summary.totalSteps = 1;
  summary.samples = 4;
  summary.seconds = 2;
  summary.finalLoss = 0.5;
  summary.lastEval = result;
  summary.lastEval->confusion.assign(33, std::vector<int64_t>(33, 0));
  EXPECT_EQ(formatSummary(summary, true),
            "trained 1 step (4 samples) in 2.00 s (not counting compilation and evaluation), 2.0 samples/s; final "
            "loss 0.500000\n(no confusion matrix: 33 classes, more than 32)\n");
}

TEST(TrainReportTest, NamesOfTheStepsChoices) {
  EXPECT_EQ(lossKindNamed("nll"), LossKind::Nll);
  EXPECT_EQ(optimizerKindNamed("adamw"), OptimizerKind::AdamW);
  EXPECT_EQ(lrScheduleKindNamed("cosine"), LrScheduleKind::CosineWarmup);
  EXPECT_EQ(batchNormModeNamed("frozen"), BatchNormMode::Frozen);
  EXPECT_FALSE(lossKindNamed("l1"));
  EXPECT_FALSE(optimizerKindNamed("Adam"));
}

TEST(TrainReportTest, EachRankTakesTheGpuOfItsLocalRank) {
  auto device = rankCudaDevice("cuda", false, 4, 2, 4);
  ASSERT_TRUE(device) << device.error().message();
  EXPECT_EQ(*device, std::optional<std::string>("cuda:2"));
  // The emulated GPU: each process has its own, the device is kept.
  auto emulated = rankCudaDevice("cuda", true, 1, 1, 2);
  ASSERT_TRUE(emulated);
  EXPECT_FALSE(emulated->has_value());
  auto pinned = rankCudaDevice("cuda:1", false, 4, 0, 2);
  ASSERT_FALSE(pinned);
  EXPECT_EQ(pinned.error().message(),
            "--device cuda:1 names one GPU for every rank; under mpirun give --device cuda, and each rank takes the "
            "GPU of its local rank");
  auto tooMany = rankCudaDevice("cuda", false, 1, 0, 2);
  ASSERT_FALSE(tooMany);
  EXPECT_EQ(tooMany.error().message(),
            "2 ranks run on this machine but it has 1 usable GPU: NCCL refuses two ranks on one GPU; start at most 1 "
            "ranks per machine (mpirun --map-by ppr:1:node)");
}

}  // namespace
}  // namespace kiln::training
