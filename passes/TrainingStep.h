// The `training-step` transform: turns a function computing a model's output
// into ONE function that runs a whole optimizer step as graph ops,
//
//   (params..., optimizer state..., batch inputs..., labels, lr)
//     -> (loss, new params..., new state...)
//
// built from the forward ops, a loss op (cross_entropy, nll_loss or
// mse_loss, the composites of ir/Ops.def), the backward graph of the
// `autodiff` pass (passes/Autodiff.h) and the optimizer's update ops, which
// follow torch.optim.SGD / Adam / AdamW (PyTorch 1.13) formula for formula.
// The learning rate is a scalar argument, the BASE learning rate; a
// non-constant schedule (LrScheduleConfig) computes the lr used at step t
// from the "step" state argument as graph ops, so the caller passes the same
// lr every step. The optimizer state arguments default to zeros, so a first
// step needs no state from the caller; feeding each step's new params and
// state back as the next step's arguments continues training.
// docs/training.md describes the design and what is not done.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "passes/DataParallel.h"
#include "passes/MemoryPlan.h"

namespace kiln {

enum class LossKind { CrossEntropy, Nll, Mse };

struct LossConfig {
  LossKind kind = LossKind::CrossEntropy;
  /// "mean", "sum" (the composites' attribute).
  std::string reduction = "mean";
  /// cross_entropy and nll_loss: labels equal to this contribute nothing.
  int64_t ignoreIndex = -100;
  /// cross_entropy only, in [0, 1].
  double labelSmoothing = 0.0;
  /// Which result of the function is the model output the loss reads.
  size_t outputIndex = 0;
};

enum class OptimizerKind { Sgd, Adam, AdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Sgd;
  /// SGD: torch.optim.SGD's momentum, dampening and nesterov.
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  /// SGD and Adam: L2 added to the gradient; AdamW: decoupled decay
  /// (p *= 1 - lr * weightDecay). PyTorch's AdamW default is 0.01.
  double weightDecay = 0.0;
  /// Adam and AdamW.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

enum class LrScheduleKind { Constant, Step, CosineWarmup };

/// The learning rate used at step t (0-based: t = the "step" argument, the
/// number of steps already taken), with `lr` the base learning rate argument:
///  - Constant:     lr.
///  - Step:         lr * gamma^floor(t / stepSize); torch.optim.lr_scheduler
///                  .StepLR(step_size, gamma) with scheduler.step() called
///                  after each optimizer.step().
///  - CosineWarmup: lr * t / warmupSteps for t < warmupSteps, then
///                  minLr + (lr - minLr) * (1 + cos(pi * (t - warmupSteps) /
///                  (totalSteps - warmupSteps))) / 2, and minLr for
///                  t >= totalSteps; torch LambdaLR with that factor (so the
///                  first warm-up step uses lr 0, as transformers'
///                  get_cosine_schedule_with_warmup); after the warm-up it is
///                  CosineAnnealingLR's closed form (T_max = totalSteps -
///                  warmupSteps, eta_min = minLr).
struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::Constant;
  /// Step: >= 1.
  int64_t stepSize = 1;
  /// Step: finite, > 0.
  double gamma = 0.1;
  /// CosineWarmup: 0 <= warmupSteps < totalSteps.
  int64_t warmupSteps = 0;
  int64_t totalSteps = 0;
  /// CosineWarmup: finite, >= 0.
  double minLr = 0.0;
};

/// How batch_norm ops train. Their running mean and variance (operands 3
/// and 4) are never trained by gradient:
///  - Train (PyTorch's model.train()): each batch is normalized with its own
///    mean and biased variance over every dim but 1, and the running
///    statistics, when they are arguments, become state updated as
///    running * (1 - momentum) + batch * momentum, with the unbiased batch
///    variance (torch.nn.BatchNorm's momentum). The momentum is each op's
///    own `momentum` attribute (torch's convention; 0.1 when absent; the ONNX
///    importer sets it from BatchNormalization's momentum, which is 1 - that)
///    unless BatchNormConfig::momentum overrides it for every op.
///  - Frozen (model.eval() for the batch norms, as when fine-tuning): the
///    running statistics normalize, and stay as they are.
enum class BatchNormMode { Train, Frozen };

struct BatchNormConfig {
  BatchNormMode mode = BatchNormMode::Train;
  /// Train: overrides every op's `momentum` attribute when set; in (0, 1].
  /// The effective momentum of each op must be in (0, 1].
  std::optional<double> momentum;
};

/// Dynamic loss scaling with torch.cuda.amp.GradScaler's semantics, for
/// fp16 training (docs/precision.md): the backward pass starts from loss *
/// scale, so that small gradients survive f16's range; the gradients are
/// unscaled (times 1 / scale, exact for a power of two) before the
/// optimizer. A step with a non-finite gradient (an f16 overflow) or loss
/// is skipped — parameters and optimizer state kept — and the scale
/// multiplied by backoffFactor; after growthInterval finite steps in a row
/// it is multiplied by growthFactor. The scale and the count of finite
/// steps are state: arguments "loss_scale" (default initScale) and
/// "loss_scale_growth" (default 0), scalars of the output's float type,
/// after the optimizer's state.
struct LossScaleConfig {
  double initScale = 65536.0;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
};

struct TrainingStepOptions {
  LossConfig loss;
  OptimizerConfig optimizer;
  /// The arguments to train, by name. When unset: every float argument with
  /// a default value (see liftConstantsToParameters for ONNX weights).
  std::optional<std::vector<std::string>> parameters;
  /// The learning-rate schedule (graph ops on the "step" argument). Last, so
  /// that aggregate initializers {loss, optimizer, parameters} keep working.
  LrScheduleConfig schedule = {};
  /// batch_norm ops (see BatchNormConfig).
  BatchNormConfig batchNorm = {};
  /// A data-parallel step (passes/DataParallel.h): the gradients are
  /// all-reduced over the job's ranks in buckets before the update, the
  /// loss returned is the job's mean, and batch norms' running statistics
  /// are rank 0's (broadcast from it at every step, as DDP does).
  std::optional<DataParallelOptions> dataParallel = {};
  /// Dynamic loss scaling (fp16 training); none by default.
  std::optional<LossScaleConfig> lossScale = {};
};

/// Rewrites `f` into its training step. Arguments, in order: the parameters
/// (in their original order, defaults kept; a batch_norm's running
/// statistics are never among them, even when named), the batch
/// normalization state (with BatchNormMode::Train, each running mean and
/// variance argument of a batch_norm, in argument order, defaults kept), the
/// optimizer state (defaults
/// zeros; SGD with momentum: "<p>.momentum_buffer" each and a step counter
/// "step"; Adam/AdamW: "<p>.exp_avg", "<p>.exp_avg_sq" each and "step"; plain
/// SGD: "step" alone when the schedule is not constant, else none; "step" is a
/// scalar of the output's float type counting the steps taken, 0 at first),
/// the other original arguments (the batch), "labels" (i64 of the output's
/// shape without dim 1 for cross-entropy and NLL, the output's type for MSE)
/// and "lr" (a scalar of the output's float type: the base learning rate the
/// schedule scales). Results:
/// "loss", then each new parameter and each new state value (batch
/// normalization, then optimizer), named like the argument it replaces. Errors name what was wrong (an output index out of
/// range, a non-float output, a bad option value, no or unknown
/// parameters) leave `f` unchanged; an error from autodiff (an op without a
/// VJP rule) leaves it with the loss op added.
Status buildTrainingStep(Function& f, const TrainingStepOptions& options);

/// The learning rate `schedule` gives at step `t` (0-based) for base rate
/// `lr`, in double precision: what the step's graph ops compute, for a caller
/// that reports the current lr.
double scheduledLearningRate(const LrScheduleConfig& schedule, double lr, int64_t t);

/// The donated arguments of a training step built by buildTrainingStep:
/// each new parameter and state result (1..) into the argument it replaces
/// (0..), found by name and type, for CpuOptions::aliases
/// (codegen/cpu/CpuExecutable.h) so that parameters and state are updated in
/// place across steps.
std::vector<ResultAlias> trainingStepAliases(const Function& step);

/// Makes each named float constant with at least one dim (an ONNX weight
/// the importer turned into a constant because it is not a graph input) an
/// argument with that value as its default, so that the default parameter
/// choice finds it. Returns how many were lifted.
size_t liftConstantsToParameters(Function& f);

}  // namespace kiln
