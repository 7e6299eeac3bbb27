// Numerical equivalence of the `fuse` pass: each function is parsed twice,
// one copy goes through decompose and canonicalize (like -O2) then fuse, the
// other only through decompose, and both run through the reference
// interpreter on the same fixed-seed random inputs. The fused copy must
// verify, contain fused ops where the case says so, print and parse back to
// the same text, and give the same results (the interpreter runs a fused op
// by interpreting its region, so the results agree to rounding of the
// reordered ops at most). Also: in-memory regions that use an outside value
// are rejected by the verifier, fusing twice changes nothing, cse keeps
// fused ops with different regions, and Function::clone copies regions.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>

#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::parseOk;

Status runPipeline(Module& m, std::string_view pipeline) {
  static const InterpreterEvaluator evaluator;
  PassContext ctx;
  ctx.evaluator = &evaluator;
  PassManager pm({}, ctx);
  KILN_TRY(pm.addPipeline(pipeline));
  std::ostringstream log;
  return pm.run(m, log);
}

/// Uniform floats in [-2, 2] for every argument (all f32 with static shapes).
std::vector<Tensor> randomInputs(const Function& f, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  std::vector<Tensor> inputs;
  for (Value* arg : f.arguments()) {
    Tensor t(arg->type().dtype, staticDims(arg->type().shape));
    for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, dist(rng));
    inputs.push_back(std::move(t));
  }
  return inputs;
}

size_t countFused(const Function& f) {
  size_t n = 0;
  for (const auto& op : f.ops()) n += op->kind() == OpKind::Fused;
  return n;
}

struct FuseCase {
  const char* name;
  const char* ir;
  size_t minFused;  // fused ops expected at least
  size_t maxFused;  // and at most (softmax and layer norm: within two kernels)
};

void expectEquivalent(const FuseCase& c) {
  auto reference = parseOk(c.ir);
  auto fused = parseOk(c.ir);
  ASSERT_TRUE(reference && fused);
  ASSERT_TRUE(runPipeline(*reference, "decompose").ok());
  Status s = runPipeline(*fused, "infer-shapes,canonicalize,decompose,canonicalize,cse,dce,fuse");
  ASSERT_TRUE(s.ok()) << s.error().str();
  ASSERT_TRUE(verify(*fused).ok()) << print(*fused);
  const Function& f = *fused->functions()[0];
  EXPECT_GE(countFused(f), c.minFused) << print(*fused);
  EXPECT_LE(countFused(f), c.maxFused) << print(*fused);

  // The text form round-trips with regions.
  std::string text = print(*fused);
  auto reparsed = parseOk(text);
  ASSERT_TRUE(reparsed);
  EXPECT_TRUE(verify(*reparsed).ok());
  EXPECT_EQ(print(*reparsed), text);

  for (uint32_t seed : {1u, 2u, 3u}) {
    auto inputs = randomInputs(*reference->functions()[0], seed);
    auto want = interpret(*reference->functions()[0], inputs);
    auto got = interpret(f, inputs);
    ASSERT_TRUE(want.ok()) << want.error().str();
    ASSERT_TRUE(got.ok()) << got.error().str();
    ASSERT_EQ(want->size(), got->size());
    for (size_t r = 0; r < want->size(); ++r) {
      ASSERT_EQ((*want)[r].type(), (*got)[r].type());
      for (int64_t i = 0; i < (*want)[r].numElements(); ++i) {
        double w = (*want)[r].getDouble(i), g = (*got)[r].getDouble(i);
        EXPECT_NEAR(g, w, 1e-5 + 1e-5 * std::abs(w)) << c.name << " result " << r << " element " << i;
      }
    }
  }
}

class FuseEquivalence : public testing::TestWithParam<FuseCase> {};

TEST_P(FuseEquivalence, MatchesUnfused) { expectEquivalent(GetParam()); }

const FuseCase kCases[] = {
    {"mlp", R"(
func @mlp(%x: f32[4,16], %w1: f32[16,32], %b1: f32[32], %w2: f32[32,10], %b2: f32[10]) -> f32[4,10] {
  %h = matmul(%x, %w1) : f32[4,32]
  %hb = add(%h, %b1) : f32[4,32]
  %a = relu(%hb) : f32[4,32]
  %o = matmul(%a, %w2) : f32[4,10]
  %ob = add(%o, %b2) : f32[4,10]
  %p = softmax(%ob) : f32[4,10]
  return %p
})",
     2, 3},
    {"softmax", R"(
func @softmax(%x: f32[6,9]) -> f32[6,9] {
  %y = softmax(%x) : f32[6,9]
  return %y
})",
     1, 2},
    {"log_softmax", R"(
func @log_softmax(%x: f32[3,5,7]) -> f32[3,5,7] {
  %y = log_softmax(%x) {axis = 1} : f32[3,5,7]
  return %y
})",
     1, 2},
    {"layer_norm", R"(
func @layer_norm(%x: f32[5,12], %s: f32[12], %b: f32[12]) -> f32[5,12] {
  %y = layer_norm(%x, %s, %b) : f32[5,12]
  return %y
})",
     1, 2},
    {"gelu_chain", R"(
func @gelu_chain(%x: f32[4,8], %v: f32[8]) -> (f32[4,8], f32[4,8]) {
  %a = add(%x, %v) : f32[4,8]
  %g = gelu(%a) : f32[4,8]
  %t = gelu(%g) {approximate = "tanh"} : f32[4,8]
  %s = sigmoid(%t) : f32[4,8]
  return %s, %g
})",
     1, 1},
    {"reshape_chain", R"(
func @reshape_chain(%x: f32[4,6], %y: f32[2,12]) -> f32[2,12] {
  %e = exp(%x) : f32[4,6]
  %r = reshape(%e) : f32[2,12]
  %s = mul(%r, %y) : f32[2,12]
  %t = tanh(%s) : f32[2,12]
  return %t
})",
     1, 1},
    {"shared_and_cycle", R"(
func @shared_and_cycle(%x: f32[4,4], %w: f32[4,4]) -> (f32[4,4], f32[4,4]) {
  %a = exp(%x) : f32[4,4]
  %t = transpose(%a) {perm = [1, 0]} : f32[4,4]
  %b = neg(%a) : f32[4,4]
  %mm = matmul(%b, %w) : f32[4,4]
  %s = add(%mm, %t) : f32[4,4]
  %r = tanh(%s) : f32[4,4]
  return %r, %b
})",
     2, 2},
    // Slices head their readers' groups: an LSTM cell reading its four gates
    // out of one product (one group, two results), and a strided reversal.
    {"slices", R"(
func @slices(%g: f32[2,16], %c: f32[2,4], %v: f32[7]) -> (f32[2,4], f32[2,4], f32[3]) {
  %ig = slice(%g) {ends = [2, 4], starts = [0, 0], steps = [1, 1]} : f32[2,4]
  %i = sigmoid(%ig) : f32[2,4]
  %og = slice(%g) {ends = [2, 8], starts = [0, 4], steps = [1, 1]} : f32[2,4]
  %o = sigmoid(%og) : f32[2,4]
  %fg = slice(%g) {ends = [2, 12], starts = [0, 8], steps = [1, 1]} : f32[2,4]
  %f = sigmoid(%fg) : f32[2,4]
  %cg = slice(%g) {ends = [2, 16], starts = [0, 12], steps = [1, 1]} : f32[2,4]
  %cand = tanh(%cg) : f32[2,4]
  %kept = mul(%f, %c) : f32[2,4]
  %new = mul(%i, %cand) : f32[2,4]
  %c1 = add(%kept, %new) : f32[2,4]
  %tc = tanh(%c1) : f32[2,4]
  %h1 = mul(%o, %tc) : f32[2,4]
  %rev = slice(%v) {ends = [0], starts = [6], steps = [-2]} : f32[3]
  %e = exp(%rev) : f32[3]
  return %h1, %c1, %e
})",
     2, 2},
};

INSTANTIATE_TEST_SUITE_P(Functions, FuseEquivalence, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<FuseCase>& info) { return std::string(info.param.name); });

TEST(FuseTest, FusingTwiceChangesNothing) {
  auto m = parseOk(kCases[0].ir);
  ASSERT_TRUE(m);
  ASSERT_TRUE(runPipeline(*m, "decompose,fuse").ok());
  std::string once = print(*m);
  ASSERT_TRUE(runPipeline(*m, "fuse").ok());
  EXPECT_EQ(print(*m), once);
}

TEST(FuseTest, CloneCopiesRegions) {
  auto m = parseOk(kCases[0].ir);
  ASSERT_TRUE(m);
  ASSERT_TRUE(runPipeline(*m, "decompose,fuse").ok());
  const Function& f = *m->functions()[0];
  std::unique_ptr<Function> copy = f.clone();
  EXPECT_EQ(print(*copy), print(f));
  ASSERT_TRUE(verify(*copy).ok());
  for (const auto& op : copy->ops()) {
    if (op->region()) {
      EXPECT_EQ(op->region()->parentOp(), op.get());
    }
  }
  auto inputs = randomInputs(f, 9);
  auto want = interpret(f, inputs);
  auto got = interpret(*copy, inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  for (int64_t i = 0; i < (*want)[0].numElements(); ++i) EXPECT_EQ((*got)[0].getDouble(i), (*want)[0].getDouble(i));
}

TEST(FuseTest, RegionUsingAnOutsideValueFailsToVerify) {
  auto m = parseOk(R"(
func @f(%x: f32[4]) -> f32[4] {
  %y = fused(%x) {kind = "elementwise"} : f32[4] {
  ^(%a: f32[4]):
    %b = exp(%a) : f32[4]
    return %b
  }
  return %y
})");
  ASSERT_TRUE(m);
  ASSERT_TRUE(verify(*m).ok());
  Function& f = *m->functions()[0];
  Op* inner = f.ops().front()->region()->ops().front().get();
  inner->setOperand(0, f.argument(0));  // the outer %x, not the region's %a
  Status s = verify(*m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("'exp' operand 0 (%x) is defined outside its region"), std::string::npos)
      << s.error().message();
}

TEST(FuseTest, CseKeepsFusedOpsWithDifferentRegions) {
  auto m = parseOk(R"(
func @f(%x: f32[4]) -> (f32[4], f32[4]) {
  %y = fused(%x) {kind = "elementwise"} : f32[4] {
  ^(%a: f32[4]):
    %b = exp(%a) : f32[4]
    %c = neg(%b) : f32[4]
    return %c
  }
  %z = fused(%x) {kind = "elementwise"} : f32[4] {
  ^(%a: f32[4]):
    %b = exp(%a) : f32[4]
    %c = abs(%b) : f32[4]
    return %c
  }
  return %y, %z
})");
  ASSERT_TRUE(m);
  ASSERT_TRUE(runPipeline(*m, "cse,dce").ok());
  EXPECT_EQ(countFused(*m->functions()[0]), 2u);
  auto out = interpret(*m->functions()[0], randomInputs(*m->functions()[0], 5));
  ASSERT_TRUE(out.ok()) << out.error().str();
  for (int64_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ((*out)[0].getDouble(i), -(*out)[1].getDouble(i));
}

}  // namespace
}  // namespace kiln
