// The `autodiff` pass on the end-to-end models of test/e2e: each ONNX model
// is imported with static input shapes, optimized by the -O2 pipeline
// (decompose included), converted to float64 (every f32 type and constant
// becomes f64 in the printed IR, which is parsed again), given the loss
// sum(proj * output) for a random `proj`, and differentiated with respect to
// its initializers. Sampled elements of every gradient are compared with
// central finite differences on the reference interpreter.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include "ir/Builder.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"
#include "passes/PassManager.h"
#include "passes/TrainingStep.h"
#include "runtime/Interpreter.h"
#include "training/TrainableModel.h"

namespace kiln {
namespace {

/// `text` with every f32 type written f64.
std::string toF64(std::string text) {
  for (size_t pos = 0; (pos = text.find("f32[", pos)) != std::string::npos; pos += 4) text.replace(pos, 4, "f64[");
  return text;
}

/// The e2e model `name` at -O2 in f64, with its first output projected to
/// a scalar loss by a new argument %proj; null (with a failure) on error.
std::unique_ptr<Module> modelWithLoss(const std::string& name,
                                      const std::map<std::string, std::vector<int64_t>>& shapes) {
  InterpreterEvaluator evaluator;
  auto m = training::loadTrainableModel(std::string(KILN_SOURCE_DIR) + "/test/e2e/" + name + "/model.onnx", shapes,
                                        evaluator);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().str());
  if (!m.ok()) return nullptr;
  PassManager pm({}, PassContext{&evaluator});
  Status added = pm.addOptLevel(2);
  EXPECT_TRUE(added.ok());
  std::ostringstream log;
  Status ran = pm.run(**m, log);
  EXPECT_TRUE(ran.ok()) << (ran.ok() ? "" : ran.error().str());
  auto f64 = parseModule(toF64(print(**m)), name + ".kir");
  EXPECT_TRUE(f64.ok()) << (f64.ok() ? "" : f64.error().str());
  if (!f64.ok()) return nullptr;
  Function& f = *(*f64)->functions()[0];
  Value* out = f.returnOp()->operand(0);
  Value* proj = f.addArgument(out->type(), "proj");
  Builder b(f);
  auto prod = b.value(OpKind::Mul, {out, proj});
  EXPECT_TRUE(prod.ok());
  auto loss = b.value(OpKind::ReduceSum, {*prod}, {{"axes", Attribute(std::vector<int64_t>{})}});
  EXPECT_TRUE(loss.ok());
  f.returnOp()->setOperands({*loss});
  f.setResultTypes({(*loss)->type()});
  f.setResultName(0, "loss");
  Status v = verify(f);
  EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.error().str());
  return std::move(*f64);
}

/// Inputs for every argument: defaults where given, else random (integer
/// arguments in [0, intMax)).
std::vector<Tensor> modelInputs(const Function& f, std::mt19937& rng, int64_t intMax) {
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    if (const DenseTensor* d = f.argumentDefault(i)) {
      inputs.push_back(Tensor::fromDense(*d));
      continue;
    }
    Tensor t(f.argument(i)->type().dtype, staticDims(f.argument(i)->type().shape));
    for (int64_t e = 0; e < t.numElements(); ++e) {
      if (isInteger(t.dtype()))
        t.setInt(e, std::uniform_int_distribution<int64_t>(0, intMax - 1)(rng));
      else
        t.setDouble(e, std::uniform_real_distribution<double>(-1.0, 1.0)(rng));
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

/// Differentiates `m`'s function and checks `samples` random elements of
/// each gradient against central differences.
void expectModelGradients(Module& m, int64_t intMax, int samples) {
  auto original = parseModule(print(m), "copy.kir");
  ASSERT_TRUE(original.ok());
  const Function& f = *(*original)->functions()[0];
  Function& g = *m.functions()[0];
  Status s = differentiateFunction(g);
  ASSERT_TRUE(s.ok()) << s.error().str();
  Status v = verify(g);
  ASSERT_TRUE(v.ok()) << v.error().str();
  std::mt19937 rng(11);
  std::vector<Tensor> inputs = modelInputs(f, rng, intMax);
  auto results = interpret(g, inputs);
  ASSERT_TRUE(results.ok()) << results.error().str();
  size_t r = 1, checked = 0;
  for (size_t arg = 0; arg < f.numArguments(); ++arg) {
    if (!f.argumentDefault(arg) || !isFloat(f.argument(arg)->type().dtype)) continue;
    ASSERT_LT(r, results->size());
    EXPECT_EQ(g.resultName(r), "grad." + f.argument(arg)->name());
    const Tensor& grad = (*results)[r++];
    for (int k = 0; k < samples; ++k) {
      int64_t i = std::uniform_int_distribution<int64_t>(0, grad.numElements() - 1)(rng);
      std::vector<Tensor> plus = inputs, minus = inputs;
      double x = inputs[arg].getDouble(i), h = 1e-6 * std::max(1.0, std::abs(x));
      plus[arg].setDouble(i, x + h);
      minus[arg].setDouble(i, x - h);
      auto lp = interpret(f, plus), lm = interpret(f, minus);
      ASSERT_TRUE(lp.ok() && lm.ok());
      double fd = ((*lp)[0].getDouble(0) - (*lm)[0].getDouble(0)) / (2 * h);
      EXPECT_NEAR(grad.getDouble(i), fd, 1e-5 * (0.1 + std::abs(fd)))
          << "d loss / d " << f.argument(arg)->name() << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

TEST(AutodiffModelTest, MlpGradientsMatchFiniteDifferences) {
  auto m = modelWithLoss("mlp", {{"x", {4, 64}}});
  ASSERT_TRUE(m);
  expectModelGradients(*m, 0, 8);
}

TEST(AutodiffModelTest, GptGradientsMatchFiniteDifferences) {
  auto m = modelWithLoss("gpt", {{"idx", {2, 8}}});
  ASSERT_TRUE(m);
  expectModelGradients(*m, 64, 4);
}

TEST(AutodiffModelTest, LstmGradientsMatchFiniteDifferences) {
  auto m = modelWithLoss("lstm", {{"x", {2, 5, 8}}, {"h0", {2, 2, 16}}, {"c0", {2, 2, 16}}});
  ASSERT_TRUE(m);
  expectModelGradients(*m, 0, 4);
}

TEST(AutodiffModelTest, CnnGradientsMatchFiniteDifferences) {
  auto m = modelWithLoss("cnn", {{"x", {1, 3, 28, 28}}});
  ASSERT_TRUE(m);
  expectModelGradients(*m, 0, 3);
}

}  // namespace
}  // namespace kiln
