// Donated arguments (passes/MemoryPlan.h ResultAlias, CpuOptions::aliases,
// CpuExecutor::runInPlace): the memory plan writes a result into its
// argument's memory only when no later kernel and no result reads the
// argument's old value, and copies it in after the last kernel otherwise;
// every case gives the results of the interpreter, and of run() without
// donation. Training steps (passes/TrainingStep.h trainingStepAliases) run
// many steps in place and match steps fed back through run() bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "codegen/cpu/CpuExecutable.h"
#include "passes/MemoryPlan.h"
#include "passes/TrainingStep.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;
using codegen::CpuOptions;

using test::parseOk;
using test::randomF32;

bool sameBytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.numBytes() == b.numBytes() &&
         std::memcmp(a.raw(), b.raw(), a.numBytes()) == 0;
}

/// Runs `text` with `aliases` on random inputs by runInPlace, and checks:
/// the donated arguments now hold their results and every other result is
/// the interpreter's (at rtol 1e-5); run() with donation gives the same and
/// leaves its inputs alone. Returns the plan's alias lines.
std::string expectDonationMatches(const std::string& text, const std::vector<ResultAlias>& aliases, int optLevel) {
  auto m = parseOk(text);
  if (!m) return "";
  const Function& f = *m->functions()[0];
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i)
    inputs.push_back(randomF32(staticDims(f.argument(i)->type().shape), static_cast<int>(7 + i)));
  auto want = interpret(f, inputs);
  EXPECT_TRUE(want.ok()) << want.error().str();
  if (!want.ok()) return "";
  CpuOptions options;
  options.optLevel = optLevel;
  options.aliases = aliases;
  auto executor = CpuExecutor::create(f, options);
  EXPECT_TRUE(executor.ok()) << executor.error().str();
  if (!executor.ok()) return "";

  const std::vector<Tensor> original = inputs;
  auto copied = (*executor)->run(inputs);
  EXPECT_TRUE(copied.ok()) << copied.error().str();
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_TRUE(sameBytes(inputs[i], original[i])) << "run() wrote input " << i;

  auto got = (*executor)->runInPlace(inputs);
  EXPECT_TRUE(got.ok()) << got.error().str();
  if (!got.ok() || !copied.ok()) return "";
  for (size_t r = 0; r < want->size(); ++r) {
    const ResultAlias* alias = nullptr;
    for (const ResultAlias& a : aliases)
      if (a.result == r) alias = &a;
    const Tensor& value = alias ? inputs[alias->argument] : (*got)[r];
    if (alias) {
      EXPECT_EQ((*got)[r].numBytes(), 0u) << "a donated result is returned empty";
    }
    for (int64_t i = 0; i < (*want)[r].numElements(); ++i)
      EXPECT_NEAR(value.getDouble(i), (*want)[r].getDouble(i), 1e-5 * (1 + std::abs((*want)[r].getDouble(i))))
          << "result " << r << " [" << i << "]";
    EXPECT_TRUE(sameBytes((*copied)[r], value)) << "run() and runInPlace() differ in result " << r;
  }
  auto plan = (*executor)->memoryPlan(original);
  EXPECT_TRUE(plan.ok());
  if (!plan.ok()) return "";
  std::string lines;
  for (const MemoryPlan::Alias& a : plan->aliases)
    lines +=
        "result " + std::to_string(a.result) + ": " + (a.inPlace ? "in place" : "copied (" + a.whyCopied + ")") + "\n";
  return lines;
}

TEST(DonatedArgumentsTest, UpdateWritesInPlace) {
  // The usual parameter update: the last reader of %w computes its result.
  const char* text =
      "func @f(%w: f32[64], %g: f32[64], %x: f32[64]) -> (f32[], f32[64]) {\n"
      "  %wx = mul(%w, %x) : f32[64]\n"
      "  %loss = reduce_sum(%wx) {axes = [0]} : f32[]\n"
      "  %d = mul(%g, %x) : f32[64]\n"
      "  %nw = sub(%w, %d) : f32[64]\n"
      "  return %loss, %nw\n"
      "}\n";
  for (int opt : {2, 3}) {
    std::string plan = expectDonationMatches(text, {{1, 0}}, opt);
    EXPECT_EQ(plan, "result 1: in place\n") << "-O" << opt;
  }
}

TEST(DonatedArgumentsTest, OldValueReadAfterTheNewOneIsWrittenIsCopied) {
  // %nw is computed first, and a later kernel still reads the old %w: the
  // result must wait in the arena and be copied in at the end.
  const char* text =
      "func @f(%w: f32[64], %g: f32[64]) -> (f32[64], f32[64]) {\n"
      "  %nw = sub(%w, %g) : f32[64]\n"
      "  %e = exp(%nw) : f32[64]\n"
      "  %r = reduce_sum(%w) {axes = [0]} : f32[]\n"
      "  %y = mul(%e, %r) : f32[64]\n"
      "  return %nw, %y\n"
      "}\n";
  std::string plan = expectDonationMatches(text, {{0, 0}}, 2);
  EXPECT_NE(plan.find("result 0: copied (kernel 2 (reduce_sum %r) reads %w after kernel 0 (sub %nw) writes"),
            std::string::npos)
      << plan;
}

TEST(DonatedArgumentsTest, ExecutorMovesTheWriterAfterAnIndependentReader) {
  // %r reads the old %w after %nw is computed but does not need %nw: the
  // plan alone must copy, the executor moves %nw's kernel after %r's and
  // writes it in place.
  const char* text =
      "func @f(%w: f32[64], %g: f32[64]) -> (f32[64], f32[64]) {\n"
      "  %nw = sub(%w, %g) : f32[64]\n"
      "  %r = mul(%w, %g) : f32[64]\n"
      "  return %nw, %r\n"
      "}\n";
  auto m = parseOk(text);
  ASSERT_TRUE(m);
  auto plan = planMemory(*m->functions()[0], {{0, 0}});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->aliases.size(), 1u);
  EXPECT_FALSE(plan->aliases[0].inPlace);
  EXPECT_EQ(plan->aliases[0].whyCopied, "kernel 1 (mul %r) reads %w after kernel 0 (sub %nw) writes the result");
  EXPECT_EQ(expectDonationMatches(text, {{0, 0}}, 2), "result 0: in place\n");
}

TEST(DonatedArgumentsTest, KernelReadingTheArgumentOtherThanElementwiseIsCopied) {
  // A matmul reads all of %w for each element it writes.
  const char* text =
      "func @f(%w: f32[8,8], %a: f32[8,8]) -> f32[8,8] {\n"
      "  %p = matmul(%w, %a) : f32[8,8]\n"
      "  return %p\n"
      "}\n";
  std::string plan = expectDonationMatches(text, {{0, 0}}, 2);
  EXPECT_NE(plan.find("kernel 0 (matmul %p) reads %w at other elements than it writes"), std::string::npos) << plan;
}

TEST(DonatedArgumentsTest, ResultsReturningArgumentsSwapAndKeepOldValues) {
  // Two donated arguments swapping values (staged copies), and a result
  // returning the old value of an argument that another result replaces.
  const char* swap =
      "func @f(%a: f32[16], %b: f32[16]) -> (f32[16], f32[16]) {\n"
      "  return %b, %a\n"
      "}\n";
  std::string plan = expectDonationMatches(swap, {{0, 0}, {1, 1}}, 2);
  EXPECT_EQ(plan,
            "result 0: copied (the result is an argument, not computed by a kernel)\n"
            "result 1: copied (the result is an argument, not computed by a kernel)\n");
  const char* keepOld =
      "func @f(%w: f32[16], %g: f32[16]) -> (f32[16], f32[16]) {\n"
      "  %nw = sub(%w, %g) : f32[16]\n"
      "  return %nw, %w\n"
      "}\n";
  plan = expectDonationMatches(keepOld, {{0, 0}}, 2);
  EXPECT_EQ(plan, "result 0: copied (a result returns the old value of %w)\n");
  // The same value into two arguments: one in place, one copied.
  const char* twice =
      "func @f(%a: f32[16], %b: f32[16]) -> (f32[16], f32[16]) {\n"
      "  %s = add(%a, %b) : f32[16]\n"
      "  return %s, %s\n"
      "}\n";
  plan = expectDonationMatches(twice, {{0, 0}, {1, 1}}, 2);
  EXPECT_EQ(plan, "result 0: in place\nresult 1: copied (the same value goes in place into another argument)\n");
}

TEST(DonatedArgumentsTest, BadAliasesAreErrors) {
  auto m = parseOk(
      "func @f(%a: f32[16], %b: f32[8]) -> (f32[16], f32[16]) {\n"
      "  %s = exp(%a) : f32[16]\n"
      "  return %s, %s\n"
      "}\n");
  ASSERT_TRUE(m);
  const Function& f = *m->functions()[0];
  auto expectError = [&](const std::vector<ResultAlias>& aliases, const std::string& part) {
    auto plan = planMemory(f, aliases);
    ASSERT_FALSE(plan.ok()) << part;
    EXPECT_NE(plan.error().str().find(part), std::string::npos) << plan.error().str();
  };
  expectError({{2, 0}}, "donated argument 0 for result 2 of @f: the function has 2 results");
  expectError({{0, 5}}, "the function has 2 arguments");
  expectError({{0, 0}, {1, 0}}, "the argument is already donated to another result");
  expectError({{0, 0}, {0, 1}}, "the result already has an argument");
  expectError({{0, 1}}, "the argument is f32[8] but the result is f32[16], expected the same type");
  // The executor reports the plan's error.
  CpuOptions options;
  options.aliases = {{0, 1}};
  auto executor = CpuExecutor::create(f, options);
  ASSERT_TRUE(executor.ok());
  std::vector<Tensor> inputs = {randomF32({16}, 1), randomF32({8}, 2)};
  auto r = (*executor)->runInPlace(inputs);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().str().find("expected the same type"), std::string::npos) << r.error().str();
}

const char* kMlp =
    "func @mlp(%x: f32[16,12], %w1: f32[12,32], %b1: f32[32], %w2: f32[32,10], %b2: f32[10]) -> f32[16,10] {\n"
    "  %h = matmul(%x, %w1) : f32[16,32]\n"
    "  %hb = add(%h, %b1) : f32[16,32]\n"
    "  %a = tanh(%hb) : f32[16,32]\n"
    "  %o = matmul(%a, %w2) : f32[16,10]\n"
    "  %out = add(%o, %b2) : f32[16,10]\n"
    "  return %out\n"
    "}\n";

/// `steps` training steps fed back through run() and the same steps by
/// runInPlace on donated parameters and state: identical bytes after every
/// step, the parameters' memory never moves, and every update is written
/// in place (the executor orders the kernels of an update so that the new
/// state is written after the new parameter reads the old state). Returns
/// how many aliases the plan writes in place.
int expectTrainingInPlaceMatches(const OptimizerConfig& optimizer, int steps) {
  auto m = parseOk(kMlp);
  if (!m) return -1;
  Function& f = *m->functions()[0];
  TrainingStepOptions options{LossConfig{LossKind::CrossEntropy}, optimizer, std::nullopt};
  options.parameters = std::vector<std::string>{"w1", "b1", "w2", "b2"};
  Status built = buildTrainingStep(f, options);
  EXPECT_TRUE(built.ok()) << built.error().str();
  if (!built.ok()) return -1;
  const std::vector<ResultAlias> aliases = trainingStepAliases(f);
  const size_t numUpdated = f.resultTypes().size() - 1;
  EXPECT_EQ(aliases.size(), numUpdated) << "every parameter and state result is donated";

  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const std::string& name = f.argument(i)->name();
    if (const DenseTensor* d = f.argumentDefault(i)) {
      inputs.push_back(Tensor::fromDense(*d));
    } else if (name == "labels") {
      Tensor l(DType::I64, {16});
      for (int64_t k = 0; k < 16; ++k) l.setInt(k, (k * 7) % 10);
      inputs.push_back(l);
    } else if (name == "lr") {
      Tensor lr(DType::F32, {});
      lr.setDouble(0, 0.05);
      inputs.push_back(lr);
    } else {
      inputs.push_back(randomF32(staticDims(f.argument(i)->type().shape), static_cast<int>(i)));
    }
  }
  for (size_t p = 0; p < 4; ++p) inputs[p] = randomF32(staticDims(f.argument(p)->type().shape), 40 + p);

  auto plain = CpuExecutor::create(f, {.optLevel = 3});
  CpuOptions donating;
  donating.aliases = aliases;
  auto inPlace = CpuExecutor::create(f, donating);
  EXPECT_TRUE(plain.ok() && inPlace.ok());
  if (!plain.ok() || !inPlace.ok()) return -1;
  std::vector<Tensor> fedBack = inputs, persistent = inputs;
  // The parameters' memory stays where it is across steps.
  std::vector<const uint8_t*> where;
  for (size_t k = 0; k < numUpdated; ++k) where.push_back(persistent[k].raw());
  for (int step = 0; step < steps; ++step) {
    auto a = (*plain)->run(fedBack);
    auto b = (*inPlace)->runInPlace(persistent);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return -1;
    EXPECT_TRUE(sameBytes((*a)[0], (*b)[0])) << "loss, step " << step;
    for (size_t k = 0; k < numUpdated; ++k) {
      fedBack[k] = std::move((*a)[1 + k]);
      EXPECT_TRUE(sameBytes(fedBack[k], persistent[k])) << f.argument(k)->name() << ", step " << step;
      EXPECT_EQ(persistent[k].raw(), where[k]) << f.argument(k)->name() << " moved";
    }
  }
  auto plan = (*inPlace)->memoryPlan(persistent);
  EXPECT_TRUE(plan.ok());
  int inPlaceCount = 0;
  for (const MemoryPlan::Alias& a : plan->aliases) {
    inPlaceCount += a.inPlace;
    EXPECT_TRUE(a.inPlace) << a.argumentName << " copied: " << a.whyCopied;
  }
  return inPlaceCount;
}

TEST(DonatedArgumentsTest, TrainingStepsInPlaceMatchStepsFedBack) {
  // Plain SGD: 4 parameters; momentum: and 4 buffers and the step counter;
  // AdamW: 4 parameters, 8 moments and the step counter.
  EXPECT_EQ(expectTrainingInPlaceMatches(OptimizerConfig{OptimizerKind::Sgd}, 4), 4);
  OptimizerConfig momentum{OptimizerKind::Sgd, 0.9};
  EXPECT_EQ(expectTrainingInPlaceMatches(momentum, 4), 9);
  OptimizerConfig adamw{OptimizerKind::AdamW};
  adamw.weightDecay = 0.01;
  EXPECT_EQ(expectTrainingInPlaceMatches(adamw, 4), 13);
}

}  // namespace
}  // namespace kiln
