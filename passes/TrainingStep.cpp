#include "passes/TrainingStep.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>

#include "ir/Builder.h"
#include "ir/Printer.h"
#include "passes/Autodiff.h"

namespace kiln {

namespace {

Status checkOptions(const Function& f, const TrainingStepOptions& o) {
  auto bad = [&](const std::string& what) { return Error("training step of @" + f.name() + ": " + what, f.loc()); };
  const OptimizerConfig& opt = o.optimizer;
  if (o.loss.reduction != "mean" && o.loss.reduction != "sum")
    return bad("loss reduction '" + o.loss.reduction + "', expected 'mean' or 'sum'");
  if (!(o.loss.labelSmoothing >= 0.0 && o.loss.labelSmoothing <= 1.0))
    return bad("label smoothing " + std::to_string(o.loss.labelSmoothing) + ", expected a value in [0, 1]");
  if (o.loss.labelSmoothing != 0.0 && o.loss.kind != LossKind::CrossEntropy)
    return bad("label smoothing applies only to the cross-entropy loss");
  if (!(opt.weightDecay >= 0.0)) return bad("weight decay " + std::to_string(opt.weightDecay) + ", expected >= 0");
  if (opt.kind == OptimizerKind::Sgd) {
    if (!(opt.momentum >= 0.0)) return bad("momentum " + std::to_string(opt.momentum) + ", expected >= 0");
    if (opt.nesterov && (opt.momentum <= 0.0 || opt.dampening != 0.0))
      return bad("Nesterov momentum requires a momentum > 0 and zero dampening (as in torch.optim.SGD)");
  } else {
    if (!(opt.beta1 >= 0.0 && opt.beta1 < 1.0)) return bad("beta1 " + std::to_string(opt.beta1) + ", expected [0, 1)");
    if (!(opt.beta2 >= 0.0 && opt.beta2 < 1.0)) return bad("beta2 " + std::to_string(opt.beta2) + ", expected [0, 1)");
    if (!(opt.eps >= 0.0)) return bad("eps " + std::to_string(opt.eps) + ", expected >= 0");
  }
  const LrScheduleConfig& sch = o.schedule;
  if (sch.kind == LrScheduleKind::Step) {
    if (sch.stepSize < 1) return bad("lr schedule step size " + std::to_string(sch.stepSize) + ", expected >= 1");
    if (!(sch.gamma > 0.0 && std::isfinite(sch.gamma)))
      return bad("lr schedule gamma " + std::to_string(sch.gamma) + ", expected a finite value > 0");
  } else if (sch.kind == LrScheduleKind::CosineWarmup) {
    if (sch.warmupSteps < 0)
      return bad("lr schedule warm-up steps " + std::to_string(sch.warmupSteps) + ", expected >= 0");
    if (sch.totalSteps <= sch.warmupSteps)
      return bad("lr schedule total steps " + std::to_string(sch.totalSteps) +
                 ", expected more than the warm-up steps (" + std::to_string(sch.warmupSteps) + ")");
    if (!(sch.minLr >= 0.0 && std::isfinite(sch.minLr)))
      return bad("lr schedule minimum lr " + std::to_string(sch.minLr) + ", expected a finite value >= 0");
  }
  if (o.batchNorm.mode == BatchNormMode::Train && o.batchNorm.momentum &&
      !(*o.batchNorm.momentum > 0.0 && *o.batchNorm.momentum <= 1.0))
    return bad("batch norm momentum " + std::to_string(*o.batchNorm.momentum) + ", expected a value in (0, 1]");
  if (o.loss.outputIndex >= f.resultTypes().size())
    return bad("output index " + std::to_string(o.loss.outputIndex) + ", but the function has " +
               std::to_string(f.resultTypes().size()) + " results");
  return Status();
}

/// A new argument `type` named `name`, defaulting to zeros when static.
Value* stateArgument(Function& f, const TensorType& type, const std::string& name) {
  Value* arg = f.addArgument(type, name);
  if (type.isStatic())
    f.setArgumentDefault(f.numArguments() - 1, std::make_shared<const DenseTensor>(DenseTensor::zeros(type)));
  return arg;
}

/// The learning rate at step `t` (the step counter argument) as graph ops on
/// the base rate `lr`; the formulas are TrainingStep.h's LrScheduleConfig.
Expected<Value*> scheduledLr(Builder& u, const LrScheduleConfig& sch, Value* lr, Value* t) {
  const DType dt = lr->type().dtype;
  auto c = [&](double v) { return u.scalar(dt, v); };
  auto op2 = [&](OpKind k, Value* x, Value* y) { return u.value(k, {x, y}); };
  if (sch.kind == LrScheduleKind::Step) {
    // lr * gamma^floor(t / step_size); t and step_size are whole numbers, so
    // the quotient rounds below the next integer while t < 2^24 in f32.
    KILN_TRY_VALUE(q, op2(OpKind::Div, t, c(static_cast<double>(sch.stepSize))));
    KILN_TRY_VALUE(k, u.value(OpKind::Floor, {q}));
    KILN_TRY_VALUE(factor, op2(OpKind::Pow, c(sch.gamma), k));
    return op2(OpKind::Mul, lr, factor);
  }
  if (sch.kind != LrScheduleKind::CosineWarmup) return lr;
  const double warmup = static_cast<double>(sch.warmupSteps);
  const double span = static_cast<double>(sch.totalSteps - sch.warmupSteps);
  // progress = min((t - warmup) / span, 1): clamps at totalSteps.
  KILN_TRY_VALUE(since, op2(OpKind::Sub, t, c(warmup)));
  KILN_TRY_VALUE(frac, op2(OpKind::Div, since, c(span)));
  KILN_TRY_VALUE(progress, op2(OpKind::Min, frac, c(1.0)));
  KILN_TRY_VALUE(angle, op2(OpKind::Mul, progress, c(std::numbers::pi)));
  KILN_TRY_VALUE(cosine, u.value(OpKind::Cos, {angle}));
  KILN_TRY_VALUE(onePlus, op2(OpKind::Add, cosine, c(1.0)));
  KILN_TRY_VALUE(half, op2(OpKind::Mul, onePlus, c(0.5)));
  KILN_TRY_VALUE(range, op2(OpKind::Sub, lr, c(sch.minLr)));
  KILN_TRY_VALUE(scaled, op2(OpKind::Mul, range, half));
  KILN_TRY_VALUE(annealed, op2(OpKind::Add, scaled, c(sch.minLr)));
  if (sch.warmupSteps == 0) return annealed;
  // Linear warm-up from 0: lr * t / warmup for t < warmup.
  KILN_TRY_VALUE(ramp, op2(OpKind::Div, t, c(warmup)));
  KILN_TRY_VALUE(warm, op2(OpKind::Mul, lr, ramp));
  KILN_TRY_VALUE(inWarmup, op2(OpKind::Lt, t, c(warmup)));
  return u.value(OpKind::Select, {inWarmup, warm, annealed});
}

/// The running statistics of the function's batch_norm ops: each mean or
/// variance operand that is an argument, with the argument moved to the end
/// of the argument list (so that, as state, it follows the parameters) and
/// erased from `paramNames`; with BatchNormMode::Train also the statistic's
/// new value, built after the op.
struct RunningStatistic {
  Value* arg = nullptr;
  Value* updated = nullptr;
};

/// Moves argument `arg` to the end of `f`'s arguments, default kept; returns
/// the new argument, which has taken every use.
Value* moveArgumentToEnd(Function& f, Value* arg) {
  size_t index = 0;
  while (f.argument(index) != arg) ++index;
  std::shared_ptr<const DenseTensor> def;
  if (const DenseTensor* d = f.argumentDefault(index)) def = std::make_shared<const DenseTensor>(*d);
  Value* moved = f.addArgument(arg->type(), arg->name());
  if (def) f.setArgumentDefault(f.numArguments() - 1, def);
  arg->replaceAllUsesWith(moved);
  f.eraseArgument(index);
  return moved;
}

/// Train mode for one batch_norm op x[N, C, d...]: it normalizes with the
/// batch's mean and biased variance over every dim but 1 (new reduce ops
/// before it), and the running statistics it read become
/// running * (1 - momentum) + batch * momentum, the variance's with the
/// unbiased batch variance (torch.nn.functional.batch_norm, training=True).
Status trainBatchNorm(Function& f, Op* bn, const BatchNormConfig& config, std::vector<RunningStatistic>& stats) {
  Value* x = bn->operand(0);
  const TensorType& xType = x->type();
  const std::string where = "training step of @" + f.name() + ": batch_norm of " + xType.str();
  if (xType.rank() < 2) return Error(where + ": expected an input [N, C, ...]", bn->loc());
  const double m = config.momentum ? *config.momentum : bn->getFloat("momentum");
  if (!(m > 0.0 && m <= 1.0))
    return Error(where + ": the model's momentum " + printAttribute(Attribute(m)) +
                     " is outside (0, 1] (torch's convention: running * (1 - momentum) + batch * momentum); "
                     "override it (kiln train --bn-momentum)",
                 bn->loc());
  if (!xType.isStatic())
    return Error(where + " in train mode needs a static input shape (the unbiased variance divides by N - 1)",
                 bn->loc());
  const int64_t count = numElements(xType.shape) / xType.shape[1].size;
  if (count < 2)
    return Error(where + " in train mode sees 1 value per channel, which has no variance (PyTorch refuses it "
                     "too); train with batches of at least 2 samples (kiln train --drop-last drops a last batch of 1)",
                 bn->loc());
  const DType dt = xType.dtype;
  std::vector<int64_t> axes = {0};
  for (int64_t a = 2; a < xType.rank(); ++a) axes.push_back(a);
  const AttrMap reduce = {{"axes", Attribute(axes)}, {"keepdims", Attribute(true)}};
  const TensorType channels{dt, {xType.shape[1]}};
  Builder b(f);
  b.setLocation(bn->loc());
  b.setInsertionPoint(bn);
  KILN_TRY_VALUE(meanKept, b.value(OpKind::ReduceMean, {x}, reduce));
  KILN_TRY_VALUE(centered, b.value(OpKind::Sub, {x, meanKept}));
  KILN_TRY_VALUE(squares, b.value(OpKind::Mul, {centered, centered}));
  KILN_TRY_VALUE(varKept, b.value(OpKind::ReduceMean, {squares}, reduce));
  KILN_TRY_VALUE(mean, b.value(OpKind::Reshape, {meanKept}, {}, {channels}));
  KILN_TRY_VALUE(var, b.value(OpKind::Reshape, {varKept}, {}, {channels}));
  Value* running[2] = {bn->operand(3), bn->operand(4)};
  bn->setOperand(3, mean);
  bn->setOperand(4, var);
  // The updates, after the op.
  Op* next = nullptr;
  for (auto it = f.ops().begin(); it != f.ops().end(); ++it)
    if (it->get() == bn) next = std::next(it)->get();
  b.setInsertionPoint(next);
  const double unbiased = static_cast<double>(count) / static_cast<double>(count - 1);
  for (int k = 0; k < 2; ++k) {
    auto stat = std::find_if(stats.begin(), stats.end(), [&](const RunningStatistic& s) { return s.arg == running[k]; });
    if (stat == stats.end()) continue;  // not an argument: nothing to update
    if (stat->updated)
      return Error(where + ": its running " + (k == 0 ? "mean" : "variance") + " %" + stat->arg->name() +
                       " is also another batch_norm's; train mode updates each running statistic once",
                   bn->loc());
    KILN_TRY_VALUE(kept, b.value(OpKind::Mul, {stat->arg, b.scalar(dt, 1.0 - m)}));
    KILN_TRY_VALUE(batch, b.value(OpKind::Mul, {k == 0 ? mean : var, b.scalar(dt, k == 0 ? m : m * unbiased)}));
    KILN_TRY_VALUE(updated, b.value(OpKind::Add, {kept, batch}));
    stat->updated = updated;
  }
  return Status();
}

/// Takes the batch_norm ops' running statistics out of `paramNames` and,
/// in train mode, rewrites the ops (trainBatchNorm). Returns the running
/// statistics that are state (train mode only), in argument order.
Expected<std::vector<RunningStatistic>> prepareBatchNorms(Function& f, const BatchNormConfig& config,
                                                          std::vector<std::string>& paramNames) {
  std::vector<Op*> bns;
  std::vector<Value*> statArgs;
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::BatchNorm) continue;
    bns.push_back(op.get());
    for (size_t k : {size_t{3}, size_t{4}}) {
      Value* v = op->operand(k);
      if (v->isArgument() && std::find(statArgs.begin(), statArgs.end(), v) == statArgs.end()) statArgs.push_back(v);
    }
  }
  std::vector<RunningStatistic> stats;
  for (Value* a : f.arguments())
    if (std::find(statArgs.begin(), statArgs.end(), a) != statArgs.end()) {
      paramNames.erase(std::remove(paramNames.begin(), paramNames.end(), a->name()), paramNames.end());
      if (config.mode == BatchNormMode::Train) stats.push_back({a, nullptr});
    }
  if (config.mode != BatchNormMode::Train) return stats;
  // Running statistics read by other ops would see their old values there.
  for (RunningStatistic& s : stats)
    for (const Op* user : s.arg->users())
      if (user->kind() != OpKind::BatchNorm)
        return Error("training step of @" + f.name() + ": the running statistic %" + s.arg->name() + " of a batch_norm "
                         "is also read by '" + std::string(opName(user->kind())) +
                         "'; train mode cannot update it (freeze the batch norms instead)",
                     user->loc());
  for (RunningStatistic& s : stats) s.arg = moveArgumentToEnd(f, s.arg);
  for (Op* bn : bns) KILN_TRY(trainBatchNorm(f, bn, config, stats));
  return stats;
}

}  // namespace

Status buildTrainingStep(Function& f, const TrainingStepOptions& options) {
  if (Status s = checkOptions(f, options); !s.ok()) return s;
  Op* ret = f.returnOp();
  if (!ret) return Error("function @" + f.name() + " has no return", f.loc());
  Value* output = ret->operand(options.loss.outputIndex);
  const TensorType outType = output->type();
  if (!isFloat(outType.dtype))
    return Error("training step of @" + f.name() + ": the output (result " + std::to_string(options.loss.outputIndex) +
                     ") is " + outType.str() + ", expected a float tensor",
                 f.loc());
  const bool classLoss = options.loss.kind != LossKind::Mse;
  if (classLoss && outType.rank() < 2)
    return Error("training step of @" + f.name() + ": the output is " + outType.str() +
                     ", expected [N, C, ...] scores for the " +
                     (options.loss.kind == LossKind::Nll ? "NLL" : "cross-entropy") + " loss",
                 f.loc());

  // Which arguments are parameters.
  std::vector<std::string> paramNames;
  if (options.parameters) {
    paramNames = *options.parameters;
  } else {
    for (size_t i = 0; i < f.numArguments(); ++i)
      if (f.argumentDefault(i) && isFloat(f.argument(i)->type().dtype)) paramNames.push_back(f.argument(i)->name());
    if (paramNames.empty())
      return Error("training step of @" + f.name() +
                       ": no parameters (no float argument has a default; name them, or lift ONNX weight constants "
                       "with liftConstantsToParameters)",
                   f.loc());
  }
  auto runningStats = prepareBatchNorms(f, options.batchNorm, paramNames);
  if (!runningStats) return runningStats.takeError();
  if (paramNames.empty())
    return Error("training step of @" + f.name() + ": no parameters left to train (the ones named are batch norms' "
                     "running statistics, which are never trained)",
                 f.loc());
  std::vector<Value*> params;
  for (const std::string& name : paramNames) {
    Value* found = nullptr;
    for (Value* a : f.arguments())
      if (a->name() == name) found = a;
    if (!found) return Error("training step of @" + f.name() + ": no argument %" + name + " to train", f.loc());
    if (found->type().dtype != outType.dtype)
      return Error("training step of @" + f.name() + ": parameter %" + name + " is " + found->type().str() +
                       ", expected the output's dtype " + outType.str(),
                   f.loc());
    params.push_back(found);
  }

  // The new arguments' names must be free.
  std::vector<std::string> newNames = {"labels", "lr", "step", "loss_scale", "loss_scale_growth"};
  for (const std::string& p : paramNames)
    for (const char* suffix : {".momentum_buffer", ".exp_avg", ".exp_avg_sq"}) newNames.push_back(p + suffix);
  for (Value* a : f.arguments())
    if (std::find(newNames.begin(), newNames.end(), a->name()) != newNames.end())
      return Error("training step of @" + f.name() + ": it already has an argument %" + a->name() +
                       ", a name the training step gives to a new argument (labels, lr, step, <param>.momentum_buffer, "
                       "<param>.exp_avg, <param>.exp_avg_sq)",
                   f.loc());

  // The loss on a new "labels" argument; the loss becomes the only result.
  TensorType labelType = outType;
  if (classLoss) {
    labelType.dtype = DType::I64;
    labelType.shape.erase(labelType.shape.begin() + 1);
  }
  Value* labels = f.addArgument(labelType, "labels");
  Value* lr = f.addArgument(TensorType{outType.dtype, {}}, "lr");
  Builder b(f);
  AttrMap lossAttrs = {{"reduction", Attribute(options.loss.reduction)}};
  OpKind lossKind = OpKind::MseLoss;
  if (options.loss.kind == LossKind::CrossEntropy) {
    lossKind = OpKind::CrossEntropy;
    lossAttrs["ignore_index"] = Attribute(options.loss.ignoreIndex);
    lossAttrs["label_smoothing"] = Attribute(options.loss.labelSmoothing);
  } else if (options.loss.kind == LossKind::Nll) {
    lossKind = OpKind::NllLoss;
    lossAttrs["ignore_index"] = Attribute(options.loss.ignoreIndex);
  }
  // Data-parallel with a mean: each rank's loss is its sum over its labels
  // divided by the count of the whole job's (non-ignored) labels, so that
  // the sum over ranks of the losses and of their gradients is the mean
  // over the job's batch, as one process computes it (docs/distributed.md).
  const bool jobMean = options.dataParallel && options.loss.reduction == "mean";
  if (jobMean) lossAttrs["reduction"] = Attribute(std::string("sum"));
  KILN_TRY_VALUE(lossSum, b.value(lossKind, {output, labels}, lossAttrs, {TensorType{outType.dtype, {}}}));
  Value* lossOp = lossSum;
  if (jobMean) {
    const TensorType scalar{outType.dtype, {}};
    Value* count = nullptr;
    if (lossKind == OpKind::MseLoss) {
      count = b.scalar(outType.dtype, static_cast<double>(numElements(outType.shape)));
    } else {
      Value* ignore = b.scalar(DType::I64, static_cast<double>(options.loss.ignoreIndex));
      KILN_TRY_VALUE(counted, b.value(OpKind::Ne, {labels, ignore}));
      KILN_TRY_VALUE(asFloat, b.value(OpKind::Cast, {counted}, {}, {TensorType{outType.dtype, labels->type().shape}}));
      KILN_TRY_VALUE(local, b.value(OpKind::ReduceSum, {asFloat}, {{"axes", Attribute(std::vector<int64_t>{})}}, {scalar}));
      count = local;
    }
    KILN_TRY_VALUE(jobCount, b.value(OpKind::AllReduce, {count}, {{"reduction", Attribute(std::string("sum"))}}));
    jobCount->setName("job_count");
    // No labels at all in the job's batch: a loss of 0, as PyTorch's NaN would stop training.
    KILN_TRY_VALUE(atLeastOne, b.value(OpKind::Max, {jobCount, b.scalar(outType.dtype, 1.0)}));
    KILN_TRY_VALUE(share, b.value(OpKind::Div, {lossSum, atLeastOne}));
    lossOp = share;
  }
  // Loss scaling: the backward pass starts from loss * scale.
  Value* scale = nullptr;
  if (options.lossScale) {
    scale = f.addArgument(TensorType{outType.dtype, {}}, "loss_scale");
    DenseTensor init = DenseTensor::zeros(scale->type());
    init.setDouble(0, options.lossScale->initScale);
    f.setArgumentDefault(f.numArguments() - 1, std::make_shared<const DenseTensor>(std::move(init)));
    KILN_TRY_VALUE(scaled, b.value(OpKind::Mul, {lossOp, scale}));
    lossOp = scaled;
  }
  ret->setOperands({lossOp});
  f.setResultTypes({lossOp->type()});
  f.setResultName(0, "loss");

  if (Status s = differentiateFunction(f, AutodiffOptions{paramNames, 0}); !s.ok()) return s;
  Value* loss = nullptr;
  // Decomposition replaced the composite loss op: read the loss again.
  ret = f.returnOp();
  loss = ret->operand(0);
  if (options.dataParallel) {
    // The gradients summed over the job's ranks, in buckets: each rank's
    // loss is its share of the job's (above).
    DataParallelOptions dp = *options.dataParallel;
    dp.reduction = "sum";
    auto buckets = insertGradientAllReduces(f, dp);
    if (!buckets) return buckets.takeError();
    ret = f.returnOp();
  }
  std::vector<Value*> grads;
  for (size_t i = 0; i < params.size(); ++i) grads.push_back(ret->operand(1 + i));

  // The optimizer update, before the return.
  Builder u(f);
  const DType dt = outType.dtype;
  const OptimizerConfig& opt = options.optimizer;
  auto c = [&](double v) { return u.scalar(dt, v); };
  auto op2 = [&](OpKind k, Value* x, Value* y) { return u.value(k, {x, y}); };
  // Loss scaling: the loss reported and the gradients the optimizer reads
  // are unscaled, and every gradient must be finite for the step to count:
  // sum(g * 0) is 0 for a finite g and NaN for one holding an infinity or
  // a NaN, so their total is 0 exactly when all are finite.
  Value* gradsFinite = nullptr;
  if (scale) {
    KILN_TRY_VALUE(inverse, op2(OpKind::Div, c(1.0), scale));
    KILN_TRY_VALUE(unscaledLoss, op2(OpKind::Mul, loss, inverse));
    loss = unscaledLoss;
    Value* total = nullptr;
    for (Value*& g : grads) {
      KILN_TRY_VALUE(unscaled, op2(OpKind::Mul, g, inverse));
      g = unscaled;
      KILN_TRY_VALUE(zeros, op2(OpKind::Mul, g, c(0.0)));
      KILN_TRY_VALUE(sum, u.value(OpKind::ReduceSum, {zeros}, {{"axes", Attribute(std::vector<int64_t>{})}},
                                  {TensorType{dt, {}}}));
      if (total) {
        KILN_TRY_VALUE(both, op2(OpKind::Add, total, sum));
        total = both;
      } else {
        total = sum;
      }
    }
    KILN_TRY_VALUE(allFinite, op2(OpKind::Eq, total, c(0.0)));
    gradsFinite = allFinite;
  }
  std::vector<Value*> newParams, stateArgs, newState;
  std::vector<std::string> stateNames;

  if (opt.kind == OptimizerKind::Sgd) {
    Value* step = nullptr;
    Value* first = nullptr;
    std::vector<Value*> bufArgs;
    if (opt.momentum != 0.0) {
      for (Value* p : params) bufArgs.push_back(stateArgument(f, p->type(), p->name() + ".momentum_buffer"));
      step = stateArgument(f, TensorType{dt, {}}, "step");
      KILN_TRY_VALUE(isFirst, op2(OpKind::Eq, step, c(0.0)));
      first = isFirst;
    } else if (options.schedule.kind != LrScheduleKind::Constant) {
      step = stateArgument(f, TensorType{dt, {}}, "step");
    }
    if (step) {
      KILN_TRY_VALUE(scheduled, scheduledLr(u, options.schedule, lr, step));
      lr = scheduled;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      Value* p = params[i];
      Value* g = grads[i];
      if (opt.weightDecay != 0.0) {
        KILN_TRY_VALUE(decay, op2(OpKind::Mul, p, c(opt.weightDecay)));
        KILN_TRY_VALUE(gd, op2(OpKind::Add, g, decay));
        g = gd;
      }
      if (opt.momentum != 0.0) {
        // buf = g on the first step, else momentum * buf + (1 - dampening) * g.
        Value* buf = bufArgs[i];
        KILN_TRY_VALUE(mb, op2(OpKind::Mul, buf, c(opt.momentum)));
        KILN_TRY_VALUE(dg, op2(OpKind::Mul, g, c(1.0 - opt.dampening)));
        KILN_TRY_VALUE(later, op2(OpKind::Add, mb, dg));
        KILN_TRY_VALUE(newBuf, u.value(OpKind::Select, {first, g, later}));
        stateArgs.push_back(buf);
        newState.push_back(newBuf);
        stateNames.push_back(buf->name());
        if (opt.nesterov) {
          KILN_TRY_VALUE(mn, op2(OpKind::Mul, newBuf, c(opt.momentum)));
          KILN_TRY_VALUE(gn, op2(OpKind::Add, g, mn));
          g = gn;
        } else {
          g = newBuf;
        }
      }
      KILN_TRY_VALUE(delta, op2(OpKind::Mul, g, lr));
      KILN_TRY_VALUE(np, op2(OpKind::Sub, p, delta));
      newParams.push_back(np);
    }
    if (step) {
      KILN_TRY_VALUE(next, op2(OpKind::Add, step, c(1.0)));
      stateArgs.push_back(step);
      newState.push_back(next);
      stateNames.push_back("step");
    }
  } else {
    // torch.optim.Adam / AdamW (single-tensor form, PyTorch 1.13).
    std::vector<Value*> avgs, sqs;
    for (Value* p : params) avgs.push_back(stateArgument(f, p->type(), p->name() + ".exp_avg"));
    for (Value* p : params) sqs.push_back(stateArgument(f, p->type(), p->name() + ".exp_avg_sq"));
    Value* step = stateArgument(f, TensorType{dt, {}}, "step");
    KILN_TRY_VALUE(scheduled, scheduledLr(u, options.schedule, lr, step));
    lr = scheduled;
    KILN_TRY_VALUE(t, op2(OpKind::Add, step, c(1.0)));
    KILN_TRY_VALUE(b1t, op2(OpKind::Pow, c(opt.beta1), t));
    KILN_TRY_VALUE(b2t, op2(OpKind::Pow, c(opt.beta2), t));
    KILN_TRY_VALUE(bc1, op2(OpKind::Sub, c(1.0), b1t));
    KILN_TRY_VALUE(bc2, op2(OpKind::Sub, c(1.0), b2t));
    KILN_TRY_VALUE(stepSize, op2(OpKind::Div, lr, bc1));
    KILN_TRY_VALUE(bc2Sqrt, u.value(OpKind::Sqrt, {bc2}));
    std::vector<Value*> newAvgs, newSqs;
    for (size_t i = 0; i < params.size(); ++i) {
      Value* p = params[i];
      Value* g = grads[i];
      if (opt.weightDecay != 0.0 && opt.kind == OptimizerKind::Adam) {
        KILN_TRY_VALUE(decay, op2(OpKind::Mul, p, c(opt.weightDecay)));
        KILN_TRY_VALUE(gd, op2(OpKind::Add, g, decay));
        g = gd;
      }
      if (opt.weightDecay != 0.0 && opt.kind == OptimizerKind::AdamW) {
        // param.mul_(1 - lr * weight_decay)
        KILN_TRY_VALUE(lw, op2(OpKind::Mul, lr, c(opt.weightDecay)));
        KILN_TRY_VALUE(keep, op2(OpKind::Sub, c(1.0), lw));
        KILN_TRY_VALUE(pd, op2(OpKind::Mul, p, keep));
        p = pd;
      }
      KILN_TRY_VALUE(m1, op2(OpKind::Mul, avgs[i], c(opt.beta1)));
      KILN_TRY_VALUE(m2, op2(OpKind::Mul, g, c(1.0 - opt.beta1)));
      KILN_TRY_VALUE(m, op2(OpKind::Add, m1, m2));
      KILN_TRY_VALUE(v1, op2(OpKind::Mul, sqs[i], c(opt.beta2)));
      KILN_TRY_VALUE(gg, op2(OpKind::Mul, g, g));
      KILN_TRY_VALUE(v2, op2(OpKind::Mul, gg, c(1.0 - opt.beta2)));
      KILN_TRY_VALUE(v, op2(OpKind::Add, v1, v2));
      // denom = sqrt(v) / sqrt(bc2) + eps; p -= step_size * m / denom.
      KILN_TRY_VALUE(sv, u.value(OpKind::Sqrt, {v}));
      KILN_TRY_VALUE(sd, op2(OpKind::Div, sv, bc2Sqrt));
      KILN_TRY_VALUE(denom, op2(OpKind::Add, sd, c(opt.eps)));
      KILN_TRY_VALUE(ratio, op2(OpKind::Div, m, denom));
      KILN_TRY_VALUE(delta, op2(OpKind::Mul, ratio, stepSize));
      KILN_TRY_VALUE(np, op2(OpKind::Sub, p, delta));
      newParams.push_back(np);
      newAvgs.push_back(m);
      newSqs.push_back(v);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      stateArgs.push_back(avgs[i]);
      newState.push_back(newAvgs[i]);
      stateNames.push_back(avgs[i]->name());
    }
    for (size_t i = 0; i < params.size(); ++i) {
      stateArgs.push_back(sqs[i]);
      newState.push_back(newSqs[i]);
      stateNames.push_back(sqs[i]->name());
    }
    stateArgs.push_back(step);
    newState.push_back(t);
    stateNames.push_back("step");
  }

  if (options.dataParallel) {
    // The job's loss (each rank's is its share), and rank 0's running
    // statistics on every rank.
    KILN_TRY_VALUE(jobLoss, u.value(OpKind::AllReduce, {loss}, {{"reduction", Attribute(std::string("sum"))}}));
    loss = jobLoss;
    for (RunningStatistic& stat : *runningStats) {
      KILN_TRY_VALUE(shared, u.value(OpKind::BroadcastFrom, {stat.updated}, {{"root", Attribute(int64_t{0})}}));
      stat.updated = shared;
    }
  }

  // A step whose loss is not finite (NaN or an infinity) keeps the
  // parameters and state it was given, as torch.cuda.amp.GradScaler skips
  // optimizer.step() on an overflow: each new value is select(finite, new,
  // old), one elementwise op that fuses into the update, so a skipped step
  // copies nothing and the caller still sees the non-finite loss to report.
  // |loss| < inf is false for NaN and for both infinities. Data-parallel,
  // `loss` is the job's, so every rank skips together.
  KILN_TRY_VALUE(lossMagnitude, u.value(OpKind::Abs, {loss}));
  KILN_TRY_VALUE(lossFinite, op2(OpKind::Lt, lossMagnitude, c(std::numeric_limits<double>::infinity())));
  Value* finite = lossFinite;
  finite->setName("loss_is_finite");
  if (gradsFinite) {
    KILN_TRY_VALUE(stepFinite, op2(OpKind::And, lossFinite, gradsFinite));
    stepFinite->setName("step_is_finite");
    finite = stepFinite;
  }
  auto keepUnlessFinite = [&](Value* updated, Value* old) -> Expected<Value*> {
    return u.value(OpKind::Select, {finite, updated, old});
  };
  for (size_t i = 0; i < params.size(); ++i) {
    KILN_TRY_VALUE(guarded, keepUnlessFinite(newParams[i], params[i]));
    newParams[i] = guarded;
  }
  for (RunningStatistic& stat : *runningStats) {
    KILN_TRY_VALUE(guarded, keepUnlessFinite(stat.updated, stat.arg));
    stat.updated = guarded;
  }
  for (size_t i = 0; i < newState.size(); ++i) {
    KILN_TRY_VALUE(guarded, keepUnlessFinite(newState[i], stateArgs[i]));
    newState[i] = guarded;
  }
  if (scale) {
    // GradScaler.update(): back off on a skipped step; grow after
    // growthInterval finite steps in a row. Not guarded: a skipped step is
    // what changes them.
    const LossScaleConfig& ls = *options.lossScale;
    // The scale was added with the loss; it goes after the optimizer's
    // state, as its result does.
    scale = moveArgumentToEnd(f, scale);
    Value* growth = stateArgument(f, TensorType{dt, {}}, "loss_scale_growth");
    KILN_TRY_VALUE(counted, op2(OpKind::Add, growth, c(1.0)));
    KILN_TRY_VALUE(grows, op2(OpKind::Ge, counted, c(static_cast<double>(ls.growthInterval))));
    KILN_TRY_VALUE(grown, op2(OpKind::Mul, scale, c(ls.growthFactor)));
    KILN_TRY_VALUE(backedOff, op2(OpKind::Mul, scale, c(ls.backoffFactor)));
    KILN_TRY_VALUE(kept, u.value(OpKind::Select, {grows, grown, scale}));
    KILN_TRY_VALUE(newScale, u.value(OpKind::Select, {finite, kept, backedOff}));
    KILN_TRY_VALUE(restarted, u.value(OpKind::Select, {grows, c(0.0), counted}));
    KILN_TRY_VALUE(newGrowth, u.value(OpKind::Select, {finite, restarted, c(0.0)}));
    for (auto [arg, updated] : {std::pair{scale, newScale}, std::pair{growth, newGrowth}}) {
      stateArgs.push_back(arg);
      newState.push_back(updated);
      stateNames.push_back(arg->name());
    }
  }

  // Results: loss, new params, new state.
  std::vector<Value*> results = {loss};
  std::vector<TensorType> types = {loss->type()};
  std::vector<std::string> names = {"loss"};
  for (size_t i = 0; i < params.size(); ++i) {
    results.push_back(newParams[i]);
    types.push_back(params[i]->type());
    names.push_back(params[i]->name());
  }
  for (const RunningStatistic& stat : *runningStats) {
    results.push_back(stat.updated);
    types.push_back(stat.arg->type());
    names.push_back(stat.arg->name());
  }
  for (size_t i = 0; i < newState.size(); ++i) {
    results.push_back(newState[i]);
    types.push_back(stateArgs[i]->type());
    names.push_back(stateNames[i]);
  }
  ret->setOperands(results);
  f.setResultTypes(types);
  for (size_t i = 0; i < names.size(); ++i) f.setResultName(i, names[i]);

  // Argument order: params, state, batch, labels, lr. Every argument that is
  // not a parameter or state is moved to the end (a new argument takes its
  // uses and the old one is erased), in its order; state then follows the
  // parameters.
  std::vector<Value*> trailing;
  for (Value* a : f.arguments()) {
    bool isParam = std::find(params.begin(), params.end(), a) != params.end();
    bool isState = std::find(stateArgs.begin(), stateArgs.end(), a) != stateArgs.end() ||
                   std::any_of(runningStats->begin(), runningStats->end(),
                               [&](const RunningStatistic& s) { return s.arg == a; });
    if (!isParam && !isState) trailing.push_back(a);
  }
  // State args were appended after the batch; moving the batch, labels and
  // lr behind them gives the documented order.
  for (Value* old : trailing) moveArgumentToEnd(f, old);
  return Status();
}

double scheduledLearningRate(const LrScheduleConfig& s, double lr, int64_t t) {
  if (s.kind == LrScheduleKind::Step) return lr * std::pow(s.gamma, static_cast<double>(t / s.stepSize));
  if (s.kind != LrScheduleKind::CosineWarmup) return lr;
  if (t < s.warmupSteps) return lr * static_cast<double>(t) / static_cast<double>(s.warmupSteps);
  double progress =
      std::min(1.0, static_cast<double>(t - s.warmupSteps) / static_cast<double>(s.totalSteps - s.warmupSteps));
  return s.minLr + (lr - s.minLr) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
}

std::vector<ResultAlias> trainingStepAliases(const Function& step) {
  std::vector<ResultAlias> aliases;
  const Op* ret = step.returnOp();
  if (!ret) return aliases;
  for (size_t r = 1; r < ret->numOperands() && r - 1 < step.numArguments(); ++r) {
    const Value* arg = step.argument(r - 1);
    if (step.resultName(r) != arg->name() || !(ret->operand(r)->type() == arg->type())) break;
    aliases.push_back({r, r - 1});
  }
  return aliases;
}

size_t liftConstantsToParameters(Function& f) {
  std::vector<Op*> constants;
  for (const auto& op : f.ops())
    if (op->kind() == OpKind::Constant && !op->result()->name().empty() && op->result()->type().rank() > 0 &&
        isFloat(op->result()->type().dtype))
      constants.push_back(op.get());
  for (Op* op : constants) {
    Value* arg = f.addArgument(op->result()->type(), op->result()->name());
    f.setArgumentDefault(f.numArguments() - 1, std::make_shared<const DenseTensor>(op->getTensor("value")));
    op->result()->replaceAllUsesWith(arg);
    f.erase(op);
  }
  return constants.size();
}

#undef KILN_TRY_VALUE

}  // namespace kiln
