// The `training-step` transform (passes/TrainingStep.h) on a small MLP
// (x[4,3] -> matmul, add, tanh -> matmul, add -> out[4,3]) with MSE,
// cross-entropy (label smoothing, ignore_index) and NLL losses, against an
// independent reference: the loss of the untransformed model on the
// interpreter, its gradients by central finite differences (float64), and
// a hand-written C++ transcription of torch.optim.SGD / Adam / AdamW
// (PyTorch 1.13, single-tensor). One and several steps are compared at
// rtol 1e-5 in f64; the f32 step matches the f64 one at rtol 1e-4; the step
// compiled by the CPU JIT matches the interpreter at rtol 1e-4. Also the
// argument/result layout, the default state and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <string>

#include "codegen/cpu/CpuExecutable.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/TrainingStep.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

const char* kMlp =
    "func @mlp(%x: f64[4,3], %w1: f64[3,5], %b1: f64[5], %w2: f64[5,3], %b2: f64[3]) -> f64[4,3] {\n"
    "  %h = matmul(%x, %w1) : f64[4,5]\n"
    "  %hb = add(%h, %b1) : f64[4,5]\n"
    "  %a = tanh(%hb) : f64[4,5]\n"
    "  %o = matmul(%a, %w2) : f64[4,3]\n"
    "  %out = add(%o, %b2) : f64[4,3]\n"
    "  return %out\n"
    "}\n";

const std::vector<std::string> kParams = {"w1", "b1", "w2", "b2"};

std::string withDType(std::string text, const std::string& dtype) {
  for (size_t pos = 0; (pos = text.find("f64[", pos)) != std::string::npos; pos += 4) text.replace(pos, 3, dtype);
  return text;
}

/// The model followed by the loss, as a function of (x, w1, b1, w2, b2,
/// labels) returning the loss: the reference the step is checked against.
std::string lossFunction(const LossConfig& loss) {
  std::string text = kMlp;
  bool mse = loss.kind == LossKind::Mse;
  text.replace(text.find(") -> f64[4,3]"), 13,
               std::string(", %labels: ") + (mse ? "f64[4,3]" : "i64[4]") + ") -> f64[]");
  std::string op = mse ? "mse_loss" : loss.kind == LossKind::Nll ? "nll_loss" : "cross_entropy";
  std::string attrs = "reduction = \"" + loss.reduction + "\"";
  if (!mse) attrs += ", ignore_index = " + std::to_string(loss.ignoreIndex);
  if (loss.kind == LossKind::CrossEntropy) attrs += ", label_smoothing = " + std::to_string(loss.labelSmoothing);
  std::string input = "%out";
  if (loss.kind == LossKind::Nll) {
    text.replace(text.find("  return %out"), 13, "  %lp = log_softmax(%out) {axis = 1} : f64[4,3]\n  return %out");
    input = "%lp";
  }
  text.replace(text.find("  return %out"), 13,
               "  %l = " + op + "(" + input + ", %labels) {" + attrs + "} : f64[]\n  return %l");
  return text;
}

struct RefState {
  std::vector<std::vector<double>> params, buf, m, v;
  double step = 0;
};

double interpLoss(const Function& lossFn, const std::vector<Tensor>& inputs) {
  auto r = interpret(lossFn, inputs);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().str());
  return r.ok() ? (*r)[0].getDouble(0) : NAN;
}

/// Tensor of `like`'s shape holding `values`.
Tensor tensorOf(const Tensor& like, const std::vector<double>& values) {
  Tensor t(like.dtype(), like.shape());
  for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, values[i]);
  return t;
}

/// One reference step: loss and finite-difference gradients at `s.params`,
/// then torch.optim's update. `inputs` are the loss function's inputs (x,
/// params..., labels); its parameter slots are overwritten.
double referenceStep(const Function& lossFn, std::vector<Tensor> inputs, RefState& s, const OptimizerConfig& o,
                     double lr) {
  for (size_t p = 0; p < s.params.size(); ++p) inputs[1 + p] = tensorOf(inputs[1 + p], s.params[p]);
  double loss = interpLoss(lossFn, inputs);
  std::vector<std::vector<double>> grads(s.params.size());
  for (size_t p = 0; p < s.params.size(); ++p) {
    for (size_t i = 0; i < s.params[p].size(); ++i) {
      std::vector<Tensor> plus = inputs, minus = inputs;
      double x = s.params[p][i], h = 1e-6 * std::max(1.0, std::abs(x));
      plus[1 + p].setDouble(i, x + h);
      minus[1 + p].setDouble(i, x - h);
      grads[p].push_back((interpLoss(lossFn, plus) - interpLoss(lossFn, minus)) / (2 * h));
    }
  }
  const double t = s.step + 1;
  for (size_t p = 0; p < s.params.size(); ++p) {
    std::vector<double>& w = s.params[p];
    for (size_t i = 0; i < w.size(); ++i) {
      double g = grads[p][i];
      if (o.kind == OptimizerKind::Sgd) {
        if (o.weightDecay != 0) g += o.weightDecay * w[i];
        if (o.momentum != 0) {
          double& b = s.buf[p][i];
          b = s.step == 0 ? g : o.momentum * b + (1 - o.dampening) * g;
          g = o.nesterov ? g + o.momentum * b : b;
        }
        w[i] -= lr * g;
      } else {
        if (o.kind == OptimizerKind::AdamW) w[i] *= 1 - lr * o.weightDecay;
        if (o.kind == OptimizerKind::Adam && o.weightDecay != 0) g += o.weightDecay * w[i];
        double& m = s.m[p][i];
        double& v = s.v[p][i];
        m = m * o.beta1 + (1 - o.beta1) * g;
        v = v * o.beta2 + (1 - o.beta2) * g * g;
        double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
        double denom = std::sqrt(v) / std::sqrt(bc2) + o.eps;
        w[i] -= lr / bc1 * m / denom;
      }
    }
  }
  s.step = t;
  return loss;
}

/// The lr of steps 0..steps-1 as torch.optim.lr_scheduler (1.13) sets it
/// with scheduler.step() after each optimizer.step(), transcribed from its
/// recursive get_lr: StepLR multiplies the group's lr by gamma when
/// last_epoch > 0 and last_epoch % step_size == 0; the warm-up + cosine
/// schedule is LambdaLR (lr = base * lambda(last_epoch)) with lambda(t) =
/// t / warmup for t < warmup, else (min_lr + (base - min_lr) * (1 +
/// cos(pi * min(1, (t - warmup) / (total - warmup)))) / 2) / base.
std::vector<double> torchSchedulerLrs(const LrScheduleConfig& s, double base, int64_t steps) {
  std::vector<double> lrs;
  double lr = base;
  for (int64_t t = 0; t < steps; ++t) {
    if (s.kind == LrScheduleKind::Step) {
      if (t > 0 && t % s.stepSize == 0) lr *= s.gamma;
    } else if (s.kind == LrScheduleKind::CosineWarmup) {
      double lambda;
      if (t < s.warmupSteps) {
        lambda = double(t) / double(std::max<int64_t>(1, s.warmupSteps));
      } else {
        double progress = std::min(1.0, double(t - s.warmupSteps) / double(s.totalSteps - s.warmupSteps));
        lambda = (s.minLr + (base - s.minLr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress))) / base;
      }
      lr = base * lambda;
    }
    lrs.push_back(lr);
  }
  return lrs;
}

/// torch.optim.lr_scheduler.CosineAnnealingLR(T_max, eta_min)'s recursive
/// get_lr (1.13) for last_epoch 0..steps-1: the annealing part of the warm-up
/// schedule, checked against the LambdaLR form above.
std::vector<double> torchCosineAnnealingLrs(double base, int64_t tMax, double etaMin, int64_t steps) {
  std::vector<double> lrs;
  double lr = base;
  for (int64_t e = 0; e < steps; ++e) {
    if (e == 0) {
      lr = base;
    } else if ((e - 1 - tMax) % (2 * tMax) == 0) {
      lr = lr + (base - etaMin) * (1 - std::cos(std::numbers::pi / double(tMax))) / 2;
    } else {
      lr = (1 + std::cos(std::numbers::pi * double(e) / double(tMax))) /
               (1 + std::cos(std::numbers::pi * double(e - 1) / double(tMax))) * (lr - etaMin) +
           etaMin;
    }
    lrs.push_back(lr);
  }
  return lrs;
}

/// `text` (kMlp or a variant) made a training step by `options` and
/// verified; null, with a failure, when any of that fails.
std::unique_ptr<Module> buildStep(const TrainingStepOptions& options, const std::string& text = kMlp) {
  auto m = test::parseOk(text, "mlp.kir");
  if (!m) return nullptr;
  Function& f = *m->functions()[0];
  Status s = buildTrainingStep(f, options);
  EXPECT_TRUE(s.ok()) << s.error().str();
  if (!s.ok()) return nullptr;
  Status v = verify(f);
  EXPECT_TRUE(v.ok()) << v.error().str() << "\n" << print(f);
  if (!v.ok()) return nullptr;
  return m;
}

/// The reference's state before the first step: the parameters of the loss
/// function's inputs (x, w1, b1, w2, b2, labels), optimizer buffers zero.
RefState referenceStart(const std::vector<Tensor>& lossInputs) {
  RefState ref;
  for (size_t p = 0; p < 4; ++p) {
    std::vector<double> w;
    for (int64_t i = 0; i < lossInputs[1 + p].numElements(); ++i) w.push_back(lossInputs[1 + p].getDouble(i));
    ref.params.push_back(w);
    ref.buf.push_back(std::vector<double>(w.size(), 0.0));
    ref.m.push_back(std::vector<double>(w.size(), 0.0));
    ref.v.push_back(std::vector<double>(w.size(), 0.0));
  }
  return ref;
}

/// The first step's inputs but the lr: the parameters (from the loss
/// inputs), the optimizer state (its defaults), x and the labels. Empty,
/// with a failure, when a state argument has no default.
std::vector<Tensor> stepInputs(const Function& step, const std::vector<Tensor>& lossInputs) {
  std::vector<Tensor> inputs(lossInputs.begin() + 1, lossInputs.begin() + 5);
  for (size_t i = 4; step.argument(i)->name() != "x"; ++i) {
    const DenseTensor* d = step.argumentDefault(i);
    EXPECT_TRUE(d) << "state argument %" << step.argument(i)->name() << " has no default";
    if (!d) return {};
    inputs.push_back(Tensor::fromDense(*d));
  }
  inputs.push_back(lossInputs[0]);
  inputs.push_back(lossInputs[5]);
  return inputs;
}

void expectNear(double got, double want, double rtol, const std::string& what) {
  EXPECT_NEAR(got, want, rtol * (1e-2 + std::abs(want))) << what;
}

/// A step's loss and new parameters (`got`) against the reference's loss
/// and `ref.params` after the same step, at rtol 1e-5; `at` names the step.
void expectStepMatchesReference(const std::vector<Tensor>& got, double wantLoss, const RefState& ref,
                                const std::string& at) {
  expectNear(got[0].getDouble(0), wantLoss, 1e-5, "loss, " + at);
  for (size_t p = 0; p < 4; ++p)
    for (size_t i = 0; i < ref.params[p].size(); ++i)
      expectNear(got[1 + p].getDouble(i), ref.params[p][i], 1e-5, kParams[p] + "[" + std::to_string(i) + "], " + at);
}

/// Runs `steps` training steps on the interpreter, feeding results back, and
/// compares loss and parameters with the reference after every step.
/// Returns the inputs of the last step (for the JIT and f32 checks).
std::vector<Tensor> expectStepsMatch(const TrainingStepOptions& options, int steps, std::vector<int64_t> labels = {}) {
  std::vector<Tensor> lastInputs;
  auto m = buildStep(options);
  if (!m) return lastInputs;
  const Function& f = *m->functions()[0];
  auto lossModule = test::parseOk(lossFunction(options.loss), "loss.kir");
  if (!lossModule) return lastInputs;
  const Function& lossFn = *lossModule->functions()[0];

  std::mt19937 rng(5);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  auto random = [&](const std::vector<int64_t>& dims) {
    Tensor t(DType::F64, dims);
    for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, uni(rng));
    return t;
  };
  // Loss-function inputs: x, w1, b1, w2, b2, labels.
  std::vector<Tensor> lossInputs = {random({4, 3}), random({3, 5}), random({5}), random({5, 3}), random({3})};
  if (options.loss.kind == LossKind::Mse) {
    lossInputs.push_back(random({4, 3}));
  } else {
    Tensor l(DType::I64, {4});
    if (labels.empty()) labels = {0, 2, 1, 2};
    for (int64_t i = 0; i < 4; ++i) l.setInt(i, labels[i]);
    lossInputs.push_back(l);
  }
  RefState ref = referenceStart(lossInputs);

  // Step inputs: params, state, x, labels, and the lr pushed at step 0.
  std::vector<Tensor> inputs = stepInputs(f, lossInputs);
  if (inputs.empty()) return lastInputs;
  const size_t numState = inputs.size() - 6;
  EXPECT_EQ(f.numArguments(), 4 + numState + 3);
  EXPECT_EQ(f.resultTypes().size(), 1 + 4 + numState);
  const bool scheduled = options.schedule.kind != LrScheduleKind::Constant;
  const std::vector<double> torchLr = torchSchedulerLrs(options.schedule, 0.1, steps);
  for (int step = 0; step < steps; ++step) {
    // A constant schedule: the caller applies one (0.1 / (1 + t)); else the
    // step's graph ops apply `options.schedule` to the base lr 0.1.
    double lr = scheduled ? torchLr[step] : 0.1 / (1 + step);
    Tensor lrT(DType::F64, {});
    lrT.setDouble(0, scheduled ? 0.1 : lr);
    if (step == 0)
      inputs.push_back(lrT);
    else
      inputs.back() = lrT;
    lastInputs = inputs;
    auto got = interpret(f, inputs);
    EXPECT_TRUE(got.ok()) << got.error().str();
    if (!got.ok()) return lastInputs;
    double wantLoss = referenceStep(lossFn, lossInputs, ref, options.optimizer, lr);
    expectStepMatchesReference(*got, wantLoss, ref, "step " + std::to_string(step + 1));
    for (size_t k = 0; k < 4 + numState; ++k) inputs[k] = (*got)[1 + k];
  }
  return lastInputs;
}

/// The step on the CPU JIT (at -O3, fused) and in f32 matches the f64
/// interpreter at 1e-4.
void expectJitAndF32Match(const TrainingStepOptions& options, const std::vector<Tensor>& inputs, int optLevel = 3) {
  auto m = buildStep(options);
  auto m32 = buildStep(options, withDType(kMlp, "f32"));
  ASSERT_TRUE(m && m32);
  const Function& f = *m->functions()[0];
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  auto executor = codegen::CpuExecutor::create(f, {.optLevel = optLevel});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto jit = (*executor)->run(inputs);
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  std::vector<Tensor> in32;
  for (const Tensor& t : inputs) {
    if (t.dtype() != DType::F64) {
      in32.push_back(t);
      continue;
    }
    Tensor c(DType::F32, t.shape());
    for (int64_t i = 0; i < t.numElements(); ++i) c.setDouble(i, t.getDouble(i));
    in32.push_back(c);
  }
  const Function& f32 = *m32->functions()[0];
  auto got32 = interpret(f32, in32);
  ASSERT_TRUE(got32.ok()) << got32.error().str();
  auto exec32 = codegen::CpuExecutor::create(f32, {.optLevel = optLevel});
  ASSERT_TRUE(exec32.ok()) << exec32.error().str();
  auto jit32 = (*exec32)->run(in32);
  ASSERT_TRUE(jit32.ok()) << jit32.error().str();
  ASSERT_EQ(jit->size(), want->size());
  for (size_t r = 0; r < want->size(); ++r)
    for (int64_t i = 0; i < (*want)[r].numElements(); ++i) {
      std::string what = "result " + f.resultName(r) + "[" + std::to_string(i) + "]";
      double w = (*want)[r].getDouble(i);
      expectNear((*jit)[r].getDouble(i), w, 1e-4, "f64 JIT " + what);
      expectNear((*got32)[r].getDouble(i), w, 1e-4, "f32 interpreter " + what);
      expectNear((*jit32)[r].getDouble(i), w, 1e-4, "f32 JIT " + what);
    }
}

TrainingStepOptions opts(LossConfig loss, OptimizerConfig opt, LrScheduleConfig schedule = {}) {
  return TrainingStepOptions{loss, opt, kParams, schedule};
}

LrScheduleConfig stepLr(int64_t stepSize, double gamma) {
  LrScheduleConfig s{LrScheduleKind::Step};
  s.stepSize = stepSize;
  s.gamma = gamma;
  return s;
}

LrScheduleConfig cosineWarmup(int64_t warmup, int64_t total, double minLr) {
  LrScheduleConfig s{LrScheduleKind::CosineWarmup};
  s.warmupSteps = warmup;
  s.totalSteps = total;
  s.minLr = minLr;
  return s;
}

/// The scheduled lr the step's graph ops compute at steps 0..steps-1, read
/// from one plain-SGD step of (x, w) -> mse(x + w, 0) at x = 0.5, w = 0
/// (gradient 1, so the new w is -lr_t), run with "step" = t, base lr `base`,
/// in `dtype` on the interpreter and on the CPU JIT.
void expectScheduledLrs(const LrScheduleConfig& schedule, double base, int64_t steps, const std::string& dtype,
                        double rtol) {
  auto m = parseModule(withDType("func @f(%x: f64[1,1], %w: f64[1,1]) -> f64[1,1] {\n"
                                 "  %y = add(%x, %w) : f64[1,1]\n  return %y\n}\n",
                                 dtype),
                       "lr.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  Function& f = *(*m)->functions()[0];
  TrainingStepOptions o{LossConfig{LossKind::Mse}, OptimizerConfig{}, std::vector<std::string>{"w"}, schedule};
  Status s = buildTrainingStep(f, o);
  ASSERT_TRUE(s.ok()) << s.error().str();
  ASSERT_TRUE(verify(f).ok()) << print(f);
  // Plain SGD has a step counter only when the schedule needs one.
  const bool hasStep = schedule.kind != LrScheduleKind::Constant;
  std::vector<std::string> args;
  for (Value* a : f.arguments()) args.push_back(a->name());
  if (hasStep) {
    ASSERT_EQ(args, (std::vector<std::string>{"w", "step", "x", "labels", "lr"}));
    ASSERT_EQ(f.resultName(2), "step");
    ASSERT_TRUE(f.argumentDefault(1));
    EXPECT_EQ(f.argumentDefault(1)->getDouble(0), 0.0);
  } else {
    ASSERT_EQ(args, (std::vector<std::string>{"w", "x", "labels", "lr"}));
  }
  auto executor = codegen::CpuExecutor::create(f, {.optLevel = 3});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  const DType dt = dtype == "f32" ? DType::F32 : DType::F64;
  auto scalar = [&](std::vector<int64_t> dims, double v) {
    Tensor t(dt, dims);
    t.setDouble(0, v);
    return t;
  };
  const std::vector<double> want = torchSchedulerLrs(schedule, base, steps);
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<Tensor> in = {scalar({1, 1}, 0.0)};
    if (hasStep) in.push_back(scalar({}, double(t)));
    for (Tensor v : {scalar({1, 1}, 0.5), scalar({1, 1}, 0.0), scalar({}, base)}) in.push_back(v);
    auto got = interpret(f, in);
    ASSERT_TRUE(got.ok()) << got.error().str();
    auto jit = (*executor)->run(in);
    ASSERT_TRUE(jit.ok()) << jit.error().str();
    std::string at = dtype + " step " + std::to_string(t);
    const double tol = rtol * (1e-6 * base + want[t]);
    EXPECT_NEAR(-(*got)[1].getDouble(0), want[t], tol) << "interpreter, " << at;
    EXPECT_NEAR(-(*jit)[1].getDouble(0), want[t], tol) << "JIT, " << at;
    EXPECT_NEAR(scheduledLearningRate(schedule, base, t), want[t], 1e-12 * base) << "scheduledLearningRate, " << at;
    if (hasStep) {
      EXPECT_EQ((*got)[2].getDouble(0), double(t + 1)) << "step counter, " << at;
    }
  }
}

LossConfig mse() { return LossConfig{LossKind::Mse}; }
LossConfig ce(double smoothing = 0.0, int64_t ignore = -100) {
  return LossConfig{LossKind::CrossEntropy, "mean", ignore, smoothing};
}

TEST(TrainingStepTest, PlainSgdWithMse) {
  auto o = opts(mse(), OptimizerConfig{OptimizerKind::Sgd});
  expectJitAndF32Match(o, expectStepsMatch(o, 3));
}

TEST(TrainingStepTest, SgdMomentumWeightDecayDampening) {
  OptimizerConfig sgd{OptimizerKind::Sgd, 0.9, 0.1, false, 0.01};
  auto o = opts(mse(), sgd);
  expectJitAndF32Match(o, expectStepsMatch(o, 4));
}

TEST(TrainingStepTest, SgdNesterovWithCrossEntropy) {
  OptimizerConfig sgd{OptimizerKind::Sgd, 0.9, 0.0, true, 0.001};
  auto o = opts(ce(), sgd);
  expectJitAndF32Match(o, expectStepsMatch(o, 4));
}

TEST(TrainingStepTest, AdamWithMseAndCrossEntropy) {
  OptimizerConfig adam{OptimizerKind::Adam};
  adam.weightDecay = 0.01;
  expectStepsMatch(opts(mse(), adam), 1);
  expectJitAndF32Match(opts(mse(), adam), expectStepsMatch(opts(mse(), adam), 2));
  auto o = opts(ce(), adam);
  expectJitAndF32Match(o, expectStepsMatch(o, 4));
}

TEST(TrainingStepTest, AdamWWithLabelSmoothingAndIgnoreIndex) {
  OptimizerConfig adamw{OptimizerKind::AdamW};
  adamw.weightDecay = 0.01;
  adamw.beta1 = 0.8;
  auto o = opts(ce(0.1, 1), adamw);
  // Label 1 is ignored in rows 1 and 3.
  expectJitAndF32Match(o, expectStepsMatch(o, 4, {0, 1, 2, 1}));
  expectStepsMatch(opts(mse(), adamw), 3);
}

TEST(TrainingStepTest, NllLossWithSumReduction) {
  // nll_loss reads log-probabilities: the model's output goes through
  // log_softmax first, in both the step and the reference.
  LossConfig nll{LossKind::Nll, "sum"};
  // The step's model must produce log-probabilities; build it from text.
  std::string text = kMlp;
  text.replace(text.find("  return %out"), 13, "  %lp = log_softmax(%out) {axis = 1} : f64[4,3]\n  return %lp");
  auto lm = buildStep(opts(nll, OptimizerConfig{OptimizerKind::Sgd, 0.5}), text);
  ASSERT_TRUE(lm);
  const Function& f = *lm->functions()[0];
  auto lossModule = test::parseOk(lossFunction(nll), "loss.kir");
  ASSERT_TRUE(lossModule);
  // One step by hand: the loss must equal the reference loss at the
  // starting point, and the first momentum buffer equals the gradient, so
  // the first step is plain SGD.
  std::mt19937 rng(3);
  std::vector<Tensor> lossInputs;
  for (Value* a : lossModule->functions()[0]->arguments()) {
    Tensor t(a->type().dtype, staticDims(a->type().shape));
    for (int64_t i = 0; i < t.numElements(); ++i) {
      if (t.dtype() == DType::I64)
        t.setInt(i, i % 3);
      else
        t.setDouble(i, std::uniform_real_distribution<double>(-1, 1)(rng));
    }
    lossInputs.push_back(t);
  }
  RefState ref = referenceStart(lossInputs);
  std::vector<Tensor> inputs = stepInputs(f, lossInputs);
  ASSERT_EQ(inputs.size(), 11u) << "params, 4 momentum buffers, step, x, labels";
  Tensor lr(DType::F64, {});
  lr.setDouble(0, 0.05);
  inputs.push_back(lr);
  auto got = interpret(f, inputs);
  ASSERT_TRUE(got.ok()) << got.error().str();
  double want = referenceStep(*lossModule->functions()[0], lossInputs, ref, {OptimizerKind::Sgd, 0.5}, 0.05);
  expectStepMatchesReference(*got, want, ref, "the one step");
  EXPECT_EQ((*got)[9].getDouble(0), 1.0) << "step counter";
}

TEST(TrainingStepTest, TorchSchedulerTranscriptionsAgree) {
  // The LambdaLR form of the warm-up + cosine schedule equals torch's
  // recursive CosineAnnealingLR (T_max = total - warmup) from the warm-up's
  // end to total; StepLR's recursive form equals lr * gamma^floor(t / size).
  const std::vector<double> lambda = torchSchedulerLrs(cosineWarmup(5, 25, 0.01), 0.5, 26);
  const std::vector<double> annealing = torchCosineAnnealingLrs(0.5, 20, 0.01, 21);
  for (int64_t t = 5; t <= 25; ++t) EXPECT_NEAR(lambda[t], annealing[t - 5], 1e-12) << "t = " << t;
  EXPECT_EQ(lambda[0], 0.0);
  EXPECT_NEAR(lambda[2], 0.2, 1e-15);
  EXPECT_NEAR(lambda[25], 0.01, 1e-15);
  const std::vector<double> step = torchSchedulerLrs(stepLr(3, 0.5), 2.0, 10);
  EXPECT_EQ(step, (std::vector<double>{2, 2, 2, 1, 1, 1, 0.5, 0.5, 0.5, 0.25}));
}

TEST(TrainingStepTest, SchedulesMatchTorchsSchedulers) {
  // The lr of each step as torch 1.13's schedulers set it (scheduler.step()
  // after each optimizer.step(), base lr 0.1), printed by
  // scripts/print-lr-schedules.py: StepLR(step_size=3, gamma=0.5); LambdaLR
  // with the warm-up + cosine factor (warm-up 4, total 20, min lr 0.001);
  // CosineAnnealingLR(T_max=16, eta_min=0.001) from the warm-up's end.
  const std::vector<double> stepLrTorch = {0.1,   0.1,   0.1,   0.05,   0.05,   0.05,
                                           0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125};
  const std::vector<double> lambdaTorch = {0.0,
                                           0.025,
                                           0.05,
                                           0.07500000000000001,
                                           0.1,
                                           0.09904887137995991,
                                           0.0962320368593087,
                                           0.091657745808976,
                                           0.0855017856687341,
                                           0.07800072653447031,
                                           0.06944282990207196,
                                           0.06015697093979836,
                                           0.0505,
                                           0.04084302906020166,
                                           0.03155717009792806,
                                           0.022999273465529706,
                                           0.0154982143312659,
                                           0.009342254191024007,
                                           0.004767963140691307,
                                           0.0019511286200400938,
                                           0.001,
                                           0.001,
                                           0.001,
                                           0.001,
                                           0.001,
                                           0.001};
  const std::vector<double> cosineTorch = {0.1,
                                           0.09904887137995991,
                                           0.0962320368593087,
                                           0.09165774580897601,
                                           0.0855017856687341,
                                           0.07800072653447031,
                                           0.06944282990207194,
                                           0.060156970939798354,
                                           0.050499999999999996,
                                           0.04084302906020165,
                                           0.03155717009792806,
                                           0.022999273465529702,
                                           0.0154982143312659,
                                           0.009342254191024003,
                                           0.004767963140691305,
                                           0.0019511286200400934,
                                           0.001};
  const LrScheduleConfig step = stepLr(3, 0.5), warm = cosineWarmup(4, 20, 0.001);
  const std::vector<double> stepOurs = torchSchedulerLrs(step, 0.1, 12);
  const std::vector<double> warmOurs = torchSchedulerLrs(warm, 0.1, 26);
  for (int64_t t = 0; t < 12; ++t) {
    EXPECT_NEAR(stepOurs[t], stepLrTorch[t], 1e-15) << "StepLR, t = " << t;
    EXPECT_NEAR(scheduledLearningRate(step, 0.1, t), stepLrTorch[t], 1e-15) << "StepLR, t = " << t;
  }
  for (int64_t t = 0; t < 26; ++t) {
    EXPECT_NEAR(warmOurs[t], lambdaTorch[t], 1e-15) << "LambdaLR, t = " << t;
    EXPECT_NEAR(scheduledLearningRate(warm, 0.1, t), lambdaTorch[t], 1e-15) << "LambdaLR, t = " << t;
  }
  for (int64_t t = 4; t <= 20; ++t)
    EXPECT_NEAR(scheduledLearningRate(warm, 0.1, t), cosineTorch[t - 4], 1e-15) << "CosineAnnealingLR, t = " << t;
  // The graph ops on these configurations: ScheduledLrPerStep compares them
  // with torchSchedulerLrs, which matches torch above.
  expectScheduledLrs(step, 0.1, 12, "f64", 1e-12);
  expectScheduledLrs(warm, 0.1, 26, "f64", 1e-12);
}

TEST(TrainingStepTest, ScheduledLrPerStep) {
  // Every step index from 0, across the warm-up's end, the cosine and the
  // clamp after totalSteps; StepLR across several decays.
  expectScheduledLrs(cosineWarmup(4, 20, 0.001), 0.1, 26, "f64", 1e-12);
  expectScheduledLrs(cosineWarmup(0, 7, 0.0), 0.1, 9, "f64", 1e-12);
  expectScheduledLrs(stepLr(3, 0.5), 0.1, 12, "f64", 1e-12);
  expectScheduledLrs(cosineWarmup(4, 20, 0.001), 0.1, 26, "f32", 1e-5);
  expectScheduledLrs(stepLr(7, 0.9), 0.1, 40, "f32", 1e-5);
  expectScheduledLrs(LrScheduleConfig{}, 0.1, 3, "f64", 1e-12);
}

TEST(TrainingStepTest, ScheduledSgdMomentumAndAdamW) {
  // The whole step with the schedule in the graph, against the reference
  // optimizers fed torch's scheduled lr.
  OptimizerConfig sgd{OptimizerKind::Sgd, 0.9, 0.0, false, 0.01};
  auto o = opts(mse(), sgd, stepLr(2, 0.5));
  expectJitAndF32Match(o, expectStepsMatch(o, 5));
  OptimizerConfig adamw{OptimizerKind::AdamW};
  adamw.weightDecay = 0.01;
  auto a = opts(ce(), adamw, cosineWarmup(2, 5, 0.01));
  expectJitAndF32Match(a, expectStepsMatch(a, 7));
  auto plain = opts(mse(), OptimizerConfig{}, cosineWarmup(1, 3, 0.0));
  expectStepsMatch(plain, 4);
}

/// A step whose loss is NaN or infinite keeps every parameter and state
/// value (the update is selected with the loss's finiteness, as GradScaler
/// skips optimizer.step()): on the interpreter, on the JIT, and on the JIT
/// updating in place (donated arguments); a finite step still updates.
TEST(TrainingStepTest, NonFiniteLossSkipsTheUpdate) {
  auto m = parseModule("func @f(%x: f32[2,2], %w: f32[2,2]) -> f32[2,2] {\n"
                       "  %y = mul(%x, %w) : f32[2,2]\n  return %y\n}\n",
                       "skip.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  Function& f = *(*m)->functions()[0];
  TrainingStepOptions o{LossConfig{LossKind::Mse}, OptimizerConfig{OptimizerKind::Adam}, std::vector<std::string>{"w"}};
  ASSERT_TRUE(buildTrainingStep(f, o).ok());
  ASSERT_TRUE(verify(f).ok()) << print(f);
  // Arguments: w, w.exp_avg, w.exp_avg_sq, step, x, labels, lr.
  auto tensor = [](std::vector<int64_t> shape, std::vector<float> values) {
    Tensor t(DType::F32, shape);
    for (size_t i = 0; i < values.size(); ++i) t.setDouble(static_cast<int64_t>(i), values[i]);
    return t;
  };
  const std::vector<Tensor> state = {tensor({2, 2}, {1, 2, 3, 4}), tensor({2, 2}, {0.1f, 0.2f, 0.3f, 0.4f}),
                                     tensor({2, 2}, {0.01f, 0.02f, 0.03f, 0.04f}), tensor({}, {3})};
  auto inputsWith = [&](float x) {
    std::vector<Tensor> in = state;
    in.push_back(tensor({2, 2}, {x, 1, 1, 1}));
    in.push_back(tensor({2, 2}, {0, 0, 0, 0}));
    in.push_back(tensor({}, {0.1f}));
    return in;
  };
  auto executor = codegen::CpuExecutor::create(f, {.optLevel = 3});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto inPlace = codegen::CpuExecutor::create(f, {.optLevel = 3, .aliases = trainingStepAliases(f)});
  ASSERT_TRUE(inPlace.ok()) << inPlace.error().str();
  for (float x : {NAN, INFINITY, -INFINITY, 1e30f}) {
    const std::string at = "x[0] = " + std::to_string(x);
    auto interpreted = interpret(f, inputsWith(x));
    ASSERT_TRUE(interpreted.ok()) << interpreted.error().str();
    auto jit = (*executor)->run(inputsWith(x));
    ASSERT_TRUE(jit.ok()) << jit.error().str();
    std::vector<Tensor> donated = inputsWith(x);
    auto ran = (*inPlace)->runInPlace(donated);
    ASSERT_TRUE(ran.ok()) << ran.error().str();
    EXPECT_FALSE(std::isfinite((*interpreted)[0].getDouble(0))) << at;
    EXPECT_FALSE(std::isfinite((*jit)[0].getDouble(0))) << at;
    for (size_t r = 0; r < state.size(); ++r)
      for (int64_t i = 0; i < state[r].numElements(); ++i) {
        const std::string what = at + ", " + f.resultName(r + 1) + "[" + std::to_string(i) + "]";
        EXPECT_EQ((*interpreted)[r + 1].getDouble(i), state[r].getDouble(i)) << "interpreter, " << what;
        EXPECT_EQ((*jit)[r + 1].getDouble(i), state[r].getDouble(i)) << "JIT, " << what;
        const Tensor& kept = (*ran)[r + 1].numBytes() ? (*ran)[r + 1] : donated[r];
        EXPECT_EQ(kept.getDouble(i), state[r].getDouble(i)) << "JIT in place, " << what;
      }
  }
  auto finite = (*executor)->run(inputsWith(2));
  ASSERT_TRUE(finite.ok()) << finite.error().str();
  EXPECT_NE((*finite)[1].getDouble(0), 1.0) << "a finite loss updates w";
  EXPECT_EQ((*finite)[4].getDouble(0), 4.0) << "and counts the step";
}

TEST(TrainingStepTest, LayoutNamesAndDefaultParameters) {
  auto m = parseModule(kMlp, "mlp.kir");
  ASSERT_TRUE(m.ok());
  Function& f = *(*m)->functions()[0];
  // Parameters by default: float arguments with defaults.
  for (size_t i = 1; i < f.numArguments(); ++i)
    f.setArgumentDefault(i, std::make_shared<const DenseTensor>(DenseTensor::zeros(f.argument(i)->type())));
  ASSERT_TRUE(buildTrainingStep(f, {ce(), OptimizerConfig{OptimizerKind::Adam}, std::nullopt}).ok());
  std::vector<std::string> args;
  for (Value* a : f.arguments()) args.push_back(a->name());
  EXPECT_EQ(args, (std::vector<std::string>{"w1", "b1", "w2", "b2", "w1.exp_avg", "b1.exp_avg", "w2.exp_avg",
                                            "b2.exp_avg", "w1.exp_avg_sq", "b1.exp_avg_sq", "w2.exp_avg_sq",
                                            "b2.exp_avg_sq", "step", "x", "labels", "lr"}));
  EXPECT_EQ(f.argument(14)->type().str(), "i64[4]");
  EXPECT_EQ(f.argument(15)->type().str(), "f64[]");
  ASSERT_EQ(f.resultTypes().size(), 14u);
  EXPECT_EQ(f.resultName(0), "loss");
  EXPECT_EQ(f.resultName(1), "w1");
  EXPECT_EQ(f.resultName(13), "step");
  EXPECT_TRUE(f.argumentDefault(12)) << "step defaults to 0";
  EXPECT_EQ(f.argumentDefault(12)->getDouble(0), 0.0);
}

/// x[4,2] -> batch_norm(x, g, b, mean, var) -> out: the batch norm's
/// parameters and running statistics all have defaults.
std::unique_ptr<Module> batchNormModel(const std::string& batch = "4", const std::string& attrs = "epsilon = 0.0") {
  auto m = parseModule("func @bn(%x: f64[" + batch +
                           ",2], %g: f64[2], %b: f64[2], %mean: f64[2], %var: f64[2]) -> f64[" + batch +
                           ",2] {\n"
                           "  %y = batch_norm(%x, %g, %b, %mean, %var) {" + attrs + "} : f64[" +
                           batch +
                           ",2]\n"
                           "  return %y\n}\n",
                       "bn.kir");
  EXPECT_TRUE(m.ok()) << m.error().str();
  if (!m.ok()) return nullptr;
  Function& f = *(*m)->functions()[0];
  const double values[4][2] = {{1.0, 1.0}, {0.0, 0.0}, {0.5, -0.5}, {2.0, 3.0}};  // g, b, mean, var
  for (size_t i = 1; i < 5; ++i) {
    DenseTensor t = DenseTensor::zeros(f.argument(i)->type());
    for (int64_t c = 0; c < 2; ++c) t.setDouble(c, values[i - 1][c]);
    f.setArgumentDefault(i, std::make_shared<const DenseTensor>(std::move(t)));
  }
  return std::move(*m);
}

TEST(TrainingStepTest, BatchNormTrainModeUsesBatchStatisticsAndUpdatesTheRunningOnes) {
  auto m = batchNormModel();
  ASSERT_TRUE(m);
  Function& f = *m->functions()[0];
  TrainingStepOptions options{mse(), OptimizerConfig{}, std::nullopt};
  options.batchNorm.momentum = 0.25;
  Status s = buildTrainingStep(f, options);
  ASSERT_TRUE(s.ok()) << s.error().str();
  ASSERT_TRUE(verify(f).ok());
  // Parameters, then the running statistics as state (never trained).
  std::vector<std::string> args;
  for (Value* a : f.arguments()) args.push_back(a->name());
  EXPECT_EQ(args, (std::vector<std::string>{"g", "b", "mean", "var", "x", "labels", "lr"}));
  ASSERT_EQ(f.resultTypes().size(), 5u);
  EXPECT_EQ(f.resultName(3), "mean");
  EXPECT_EQ(f.resultName(4), "var");
  EXPECT_EQ(trainingStepAliases(f).size(), 4u);

  // Channel 0 holds 1, 2, 3, 6 (mean 3, biased variance 3.5, unbiased 14/3),
  // channel 1 holds 5, 7, 5, 7 (mean 6, biased variance 1, unbiased 4/3).
  Tensor x(DType::F64, {4, 2});
  const double xs[8] = {1, 5, 2, 7, 3, 5, 6, 7};
  for (int64_t i = 0; i < 8; ++i) x.setDouble(i, xs[i]);
  Tensor labels(DType::F64, {4, 2});  // zeros: the loss is the mean square of the output
  Tensor lr(DType::F64, {});
  lr.setDouble(0, 0.0);  // no parameter moves, so the output is the normalized batch
  std::vector<Tensor> in;
  for (size_t i = 0; i < 4; ++i) in.push_back(Tensor::fromDense(*f.argumentDefault(i)));
  in.push_back(x);
  in.push_back(labels);
  in.push_back(lr);
  auto out = interpret(f, in);
  ASSERT_TRUE(out.ok()) << out.error().str();
  // Normalized with the batch's statistics each channel has mean square 1
  // (with the running ones it would not): loss = 1.
  EXPECT_NEAR((*out)[0].getDouble(0), 1.0, 1e-12);
  // running * 0.75 + batch * 0.25, the variance's unbiased.
  EXPECT_NEAR((*out)[3].getDouble(0), 0.5 * 0.75 + 3.0 * 0.25, 1e-12);
  EXPECT_NEAR((*out)[3].getDouble(1), -0.5 * 0.75 + 6.0 * 0.25, 1e-12);
  EXPECT_NEAR((*out)[4].getDouble(0), 2.0 * 0.75 + 14.0 / 3.0 * 0.25, 1e-12);
  EXPECT_NEAR((*out)[4].getDouble(1), 3.0 * 0.75 + 4.0 / 3.0 * 0.25, 1e-12);
}

/// The running mean of channel 0 after one train-mode step of
/// batchNormModel(attrs) on the batch 1, 2, 3, 6 (mean 3; running 0.5).
Expected<double> runningMeanAfterOneStep(const std::string& attrs, std::optional<double> momentum) {
  auto m = batchNormModel("4", attrs);
  if (!m) return Error("batchNormModel failed");
  Function& f = *m->functions()[0];
  TrainingStepOptions options{mse(), OptimizerConfig{}, std::nullopt};
  options.batchNorm.momentum = momentum;
  KILN_TRY(buildTrainingStep(f, options));
  Tensor x(DType::F64, {4, 2});
  const double xs[8] = {1, 5, 2, 7, 3, 5, 6, 7};
  for (int64_t i = 0; i < 8; ++i) x.setDouble(i, xs[i]);
  std::vector<Tensor> in;
  for (size_t i = 0; i < 4; ++i) in.push_back(Tensor::fromDense(*f.argumentDefault(i)));
  in.push_back(x);
  in.push_back(Tensor(DType::F64, {4, 2}));
  Tensor lr(DType::F64, {});
  lr.setDouble(0, 0.0);
  in.push_back(lr);
  auto out = interpret(f, in);
  if (!out.ok()) return out.error();
  return (*out)[3].getDouble(0);
}

TEST(TrainingStepTest, BatchNormMomentumComesFromTheOpUnlessOverridden) {
  // No attribute: torch's default 0.1.
  auto dflt = runningMeanAfterOneStep("epsilon = 0.0", std::nullopt);
  ASSERT_TRUE(dflt.ok()) << dflt.error().str();
  EXPECT_NEAR(*dflt, 0.5 * 0.9 + 3.0 * 0.1, 1e-12);
  // The op's own momentum.
  auto own = runningMeanAfterOneStep("epsilon = 0.0, momentum = 0.3", std::nullopt);
  ASSERT_TRUE(own.ok()) << own.error().str();
  EXPECT_NEAR(*own, 0.5 * 0.7 + 3.0 * 0.3, 1e-12);
  // The override wins.
  auto overridden = runningMeanAfterOneStep("epsilon = 0.0, momentum = 0.3", 0.25);
  ASSERT_TRUE(overridden.ok()) << overridden.error().str();
  EXPECT_NEAR(*overridden, 0.5 * 0.75 + 3.0 * 0.25, 1e-12);
  // A model's momentum outside (0, 1] is an error naming it, unless overridden.
  auto bad = runningMeanAfterOneStep("epsilon = 0.0, momentum = 0.0", std::nullopt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("the model's momentum 0.0 is outside (0, 1]"), std::string::npos)
      << bad.error().str();
  auto fixed = runningMeanAfterOneStep("epsilon = 0.0, momentum = 0.0", 0.5);
  ASSERT_TRUE(fixed.ok()) << fixed.error().str();
  EXPECT_NEAR(*fixed, 0.5 * 0.5 + 3.0 * 0.5, 1e-12);
}

TEST(TrainingStepTest, BatchNormFrozenModeKeepsTheRunningStatistics) {
  auto m = batchNormModel();
  ASSERT_TRUE(m);
  Function& f = *m->functions()[0];
  TrainingStepOptions options{mse(), OptimizerConfig{}, std::nullopt};
  options.batchNorm.mode = BatchNormMode::Frozen;
  Status s = buildTrainingStep(f, options);
  ASSERT_TRUE(s.ok()) << s.error().str();
  // The statistics are neither trained nor state: inputs with their defaults.
  std::vector<std::string> results;
  for (size_t r = 0; r < f.resultTypes().size(); ++r) results.push_back(f.resultName(r));
  EXPECT_EQ(results, (std::vector<std::string>{"loss", "g", "b"}));
  std::vector<std::string> args;
  for (Value* a : f.arguments()) args.push_back(a->name());
  EXPECT_EQ(args, (std::vector<std::string>{"g", "b", "x", "mean", "var", "labels", "lr"}));
  EXPECT_EQ(f.argumentDefault(3)->getDouble(0), 0.5);
}

TEST(TrainingStepTest, BatchNormErrors) {
  {
    // A batch of one sample per channel has no variance.
    auto m = batchNormModel("1");
    ASSERT_TRUE(m);
    Status s = buildTrainingStep(*m->functions()[0], {mse(), OptimizerConfig{}, std::nullopt});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().str().find("sees 1 value per channel"), std::string::npos) << s.error().str();
  }
  {
    // Only running statistics named: nothing to train.
    auto m = batchNormModel();
    ASSERT_TRUE(m);
    Status s = buildTrainingStep(*m->functions()[0],
                                 {mse(), OptimizerConfig{}, std::vector<std::string>{"mean", "var"}});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().str().find("no parameters left to train"), std::string::npos) << s.error().str();
  }
  {
    TrainingStepOptions options{mse(), OptimizerConfig{}, std::nullopt};
    options.batchNorm.momentum = 0.0;
    auto m = batchNormModel();
    ASSERT_TRUE(m);
    Status s = buildTrainingStep(*m->functions()[0], options);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().str().find("batch norm momentum 0.000000, expected a value in (0, 1]"), std::string::npos)
        << s.error().str();
  }
}

TEST(TrainingStepTest, LiftsOnnxWeightConstants) {
  auto m = parseModule(
      "func @f(%x: f64[2,3]) -> f64[2,2] {\n"
      "  %w = constant() {value = dense<f64[3,2]>[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]} : f64[3,2]\n"
      "  %y = matmul(%x, %w) : f64[2,2]\n"
      "  return %y\n}\n",
      "c.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  Function& f = *(*m)->functions()[0];
  EXPECT_EQ(liftConstantsToParameters(f), 1u);
  ASSERT_EQ(f.numArguments(), 2u);
  EXPECT_EQ(f.argument(1)->name(), "w");
  ASSERT_TRUE(f.argumentDefault(1));
  EXPECT_EQ(f.argumentDefault(1)->getDouble(5), 6.0);
  Status s = buildTrainingStep(f, {mse(), OptimizerConfig{}, std::nullopt});
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(f.argument(0)->name(), "w");
  EXPECT_EQ(f.resultName(1), "w");
}

TEST(TrainingStepTest, Errors) {
  auto expectError = [](const TrainingStepOptions& o, const std::string& part) {
    auto m = parseModule(kMlp, "mlp.kir");
    ASSERT_TRUE(m.ok());
    Status s = buildTrainingStep(*(*m)->functions()[0], o);
    ASSERT_FALSE(s.ok()) << part;
    EXPECT_NE(s.error().str().find(part), std::string::npos) << s.error().str();
  };
  expectError({mse(), OptimizerConfig{}, std::nullopt}, "no parameters");
  expectError({mse(), OptimizerConfig{}, std::vector<std::string>{"nope"}}, "no argument %nope to train");
  expectError(opts(mse(), {OptimizerKind::Sgd, 0.0, 0.0, true}), "Nesterov momentum requires a momentum > 0");
  expectError(opts(ce(1.5), {}), "label smoothing 1.5");
  expectError(opts(LossConfig{LossKind::Mse, "max"}, {}), "loss reduction 'max'");
  OptimizerConfig adam{OptimizerKind::Adam};
  adam.beta2 = 1.0;
  expectError(opts(mse(), adam), "beta2 1");
  LossConfig out1 = mse();
  out1.outputIndex = 1;
  expectError(opts(out1, {}), "output index 1, but the function has 1 results");
  expectError(opts(mse(), {}, stepLr(0, 0.5)), "lr schedule step size 0, expected >= 1");
  expectError(opts(mse(), {}, stepLr(2, 0.0)), "lr schedule gamma 0.000000, expected a finite value > 0");
  expectError(opts(mse(), {}, cosineWarmup(5, 5, 0.0)), "lr schedule total steps 5, expected more than the warm-up");
  expectError(opts(mse(), {}, cosineWarmup(-1, 5, 0.0)), "lr schedule warm-up steps -1, expected >= 0");
  expectError(opts(mse(), {}, cosineWarmup(1, 5, -0.1)), "lr schedule minimum lr -0.100000");
  auto clash = parseModule(
      "func @f(%x: f64[2,3], %w: f64[3,2], %lr: f64[]) -> f64[2,2] {\n"
      "  %y = matmul(%x, %w) : f64[2,2]\n  return %y\n}\n",
      "clash.kir");
  ASSERT_TRUE(clash.ok());
  Status s = buildTrainingStep(*(*clash)->functions()[0], {mse(), {}, std::vector<std::string>{"w"}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().str().find("already has an argument %lr"), std::string::npos) << s.error().str();
}

}  // namespace
}  // namespace kiln
