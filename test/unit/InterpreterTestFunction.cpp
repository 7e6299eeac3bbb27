// Tests of the interpreter at the function level: input checking against
// the signature (count, dtype, rank, static dims, consistent symbols),
// symbolic dims resolved at run time (reshape with `?`, iota and broadcast
// with declared symbolic dims), run-time errors carrying the op's location,
// the OpEvaluator used by constant folding, and a smoke run of the every-op
// module test/lit/ir/roundtrip.kir, which must contain every op kind.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "ir/Parser.h"
#include "test/unit/InterpreterTestSupport.h"

namespace kiln::test {
namespace {

/// Parses `text` and returns its only (or named) function; the module is
/// kept alive in `module`.
const Function* parseFunction(std::unique_ptr<Module>& module, std::string_view text, std::string_view name = {}) {
  auto parsed = parseModule(text, "test.kir");
  if (!parsed) {
    ADD_FAILURE() << parsed.error().str();
    return nullptr;
  }
  module = std::move(*parsed);
  if (!name.empty()) return module->lookup(name);
  return module->functions().empty() ? nullptr : module->functions().front().get();
}

constexpr std::string_view kMlp = R"(
func @mlp(%x: f32[N,2], %w: f32[2,3], %b: f32[3]) -> f32[N,3] {
  %m = matmul(%x, %w) : f32[N,3]
  %s = add(%m, %b) : f32[N,3]
  %r = relu(%s) : f32[N,3]
  return %r
}
)";

TEST(InterpreterFunctionTest, RunsAFunctionForAnyBatchSize) {
  std::unique_ptr<Module> module;
  const Function* f = parseFunction(module, kMlp);
  ASSERT_TRUE(f);
  Tensor w = f32({2, 3}, {1, 0, -1, 0, 1, -1});
  Tensor b = f32({3}, {0, 0, 0.5});
  auto out = interpret(*f, {f32({2, 2}, {1, 2, 3, -4}), w, b});
  ASSERT_TRUE(out) << out.error().str();
  expectTensor((*out)[0], {2, 3}, {1, 2, 0, 3, 0, 1.5});
  auto empty = interpret(*f, {f32({0, 2}, {}), w, b});
  ASSERT_TRUE(empty) << empty.error().str();
  expectTensor((*empty)[0], {0, 3}, {});
}

TEST(InterpreterFunctionTest, InputsAreCheckedAgainstTheSignature) {
  std::unique_ptr<Module> module;
  const Function* f = parseFunction(module, kMlp);
  ASSERT_TRUE(f);
  Tensor w = f32({2, 3}, std::vector<double>(6, 0));
  Tensor b = f32({3}, {0, 0, 0});
  auto count = interpret(*f, {w, b});
  ASSERT_FALSE(count);
  EXPECT_NE(count.error().message().find("takes 3 arguments, got 2 inputs"), std::string::npos) << count.error().str();

  auto dims = interpret(*f, {f32({2, 3}, std::vector<double>(6, 0)), w, b});
  ASSERT_FALSE(dims);
  EXPECT_NE(dims.error().message().find("argument 0 (%x): expected f32[N,2], got f32[2,3]"), std::string::npos)
      << dims.error().str();

  auto dtype = interpret(*f, {f32({2, 2}, {1, 2, 3, 4}), ints(DType::I32, {2, 3}, {0, 0, 0, 0, 0, 0}), b});
  ASSERT_FALSE(dtype);
  EXPECT_NE(dtype.error().message().find("argument 1 (%w): expected f32[2,3], got i32[2,3]"), std::string::npos)
      << dtype.error().str();

  auto rank = interpret(*f, {f32({2, 2}, {1, 2, 3, 4}), w, f32({1, 3}, {0, 0, 0})});
  ASSERT_FALSE(rank);
  EXPECT_NE(rank.error().message().find("argument 2 (%b): expected f32[3], got f32[1,3]"), std::string::npos)
      << rank.error().str();
}

TEST(InterpreterFunctionTest, SymbolsMustBindConsistently) {
  std::unique_ptr<Module> module;
  const Function* f = parseFunction(module, R"(
func @pair(%a: f32[N], %b: f32[N]) -> f32[N] {
  %s = add(%a, %b) : f32[N]
  return %s
}
)");
  ASSERT_TRUE(f);
  auto bad = interpret(*f, {f32({2}, {1, 2}), f32({3}, {1, 2, 3})});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("argument 1 (%b): expected f32[N], got f32[3] (N is 2 in argument 0 (%a))"),
            std::string::npos)
      << bad.error().str();
  auto good = interpret(*f, {f32({2}, {1, 2}), f32({2}, {3, 4})});
  ASSERT_TRUE(good) << good.error().str();
  expectTensor((*good)[0], {2}, {4, 6});
}

TEST(InterpreterFunctionTest, DeclaredDimsResolveAtRunTime) {
  std::unique_ptr<Module> module;
  const Function* f = parseFunction(module, R"(
func @declared(%x: f32[N,4]) -> (f32[?,2], f32[N,2,2], i64[N], f32[2,?]) {
  %flat = reshape(%x) : f32[?,2]
  %split = reshape(%x) : f32[N,2,2]
  %i = iota() {axis = 0} : i64[N]
  %row = reduce_sum(%x) {axes = [0]} : f32[4]
  %b = broadcast(%row) : f32[2,?]
  return %flat, %split, %i, %b
}
)");
  ASSERT_TRUE(f);
  std::vector<double> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  auto out = interpret(*f, {f32({3, 4}, x)});
  ASSERT_TRUE(out) << out.error().str();
  expectTensor((*out)[0], {6, 2}, x);
  expectTensor((*out)[1], {3, 2, 2}, x);
  expectInts((*out)[2], {3}, {0, 1, 2});
  expectTensor((*out)[3], {2, 4}, {12, 15, 18, 21, 12, 15, 18, 21});
}

TEST(InterpreterFunctionTest, UnresolvableDeclaredDimIsAnError) {
  std::unique_ptr<Module> module;
  const Function* f = parseFunction(module, R"(
func @noise() -> f32[?] {
  %r = random_uniform() : f32[?]
  return %r
}
)");
  ASSERT_TRUE(f);
  auto out = interpret(*f, {});
  ASSERT_FALSE(out);
  EXPECT_NE(out.error().message().find("cannot determine dim 0"), std::string::npos) << out.error().str();
}

TEST(InterpreterFunctionTest, RunTimeErrorsCarryTheOpsLocation) {
  std::unique_ptr<Module> module;
  const Function* f = parseFunction(module, R"(
func @divide(%a: i32[2], %b: i32[2]) -> i32[2] {
  %d = div(%a, %b) : i32[2] loc("model.onnx":"Div_3")
  return %d
}
)");
  ASSERT_TRUE(f);
  auto out = interpret(*f, {ints(DType::I32, {2}, {4, 5}), ints(DType::I32, {2}, {2, 0})});
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().location().name, "Div_3");
  EXPECT_NE(out.error().str().find("Div_3"), std::string::npos) << out.error().str();
  EXPECT_NE(out.error().message().find("'div' integer division by zero"), std::string::npos) << out.error().str();
}

TEST(InterpreterFunctionTest, ArgumentsAndValuesMayBeReturnedAndUsedRepeatedly) {
  std::unique_ptr<Module> module;
  const Function* f = parseFunction(module, R"(
func @reuse(%x: f32[2]) -> (f32[2], f32[2], f32[2]) {
  %sq = mul(%x, %x) : f32[2]
  %y = add(%sq, %sq) : f32[2]
  return %x, %y, %y
}
)");
  ASSERT_TRUE(f);
  auto out = interpret(*f, {f32({2}, {2, -3})});
  ASSERT_TRUE(out) << out.error().str();
  ASSERT_EQ(out->size(), 3u);
  expectTensor((*out)[0], {2}, {2, -3});
  expectTensor((*out)[1], {2}, {8, 18});
  expectTensor((*out)[2], {2}, {8, 18});
}

TEST(InterpreterFunctionTest, InterpretOpBindsSymbolsFromItsOperands) {
  Function f("op");
  Value* x = f.addArgument(TensorType{DType::F32, {Dim::symbolic("N"), Dim::fixed(4)}}, "x");
  Builder b(f);
  Op* reshape =
      b.create(OpKind::Reshape, {x}, {TensorType{DType::F32, {Dim::symbolic("N"), Dim::fixed(2), Dim::fixed(2)}}});
  Tensor input = f32({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  const Tensor* operands[] = {&input};
  auto out = interpretOp(*reshape, operands);
  ASSERT_TRUE(out) << out.error().str();
  expectTensor((*out)[0], {2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});

  const Tensor* none[] = {};
  auto arity = interpretOp(*reshape, std::span<const Tensor* const>(none, 0));
  ASSERT_FALSE(arity);
  EXPECT_NE(arity.error().message().find("got 0 operands, expected 1"), std::string::npos) << arity.error().str();
}

TEST(InterpreterFunctionTest, EvaluatorFoldsConstants) {
  Function f("fold");
  Builder b(f);
  DenseTensor lhs = f32({2}, {1, 2}).toDense();
  DenseTensor rhs = f32({2}, {10, 20}).toDense();
  Value* a = b.constant(lhs);
  Value* c = b.constant(rhs);
  auto add = b.build(OpKind::Add, {a, c});
  ASSERT_TRUE(add) << add.error().str();
  InterpreterEvaluator evaluator;
  const DenseTensor* operands[] = {&lhs, &rhs};
  auto folded = evaluator.evaluate(**add, operands);
  ASSERT_TRUE(folded) << folded.error().str();
  ASSERT_EQ(folded->size(), 1u);
  EXPECT_EQ((*folded)[0].type.str(), "f32[2]");
  EXPECT_EQ((*folded)[0].getDouble(0), 11);
  EXPECT_EQ((*folded)[0].getDouble(1), 22);

  DenseTensor zero = ints(DType::I64, {}, {0}).toDense();
  Value* z = b.constant(zero);
  auto div = b.build(OpKind::Div, {z, z});
  ASSERT_TRUE(div) << div.error().str();
  const DenseTensor* zeros[] = {&zero, &zero};
  auto error = evaluator.evaluate(**div, zeros);
  ASSERT_FALSE(error);
  EXPECT_NE(error.error().message().find("division by zero"), std::string::npos);

  DenseTensor truncated = zero;
  truncated.bytes.pop_back();
  const DenseTensor* bad[] = {&truncated, &zero};
  EXPECT_FALSE(evaluator.evaluate(**div, bad));
}

/// A deterministic, valid input for an argument of `type`: floats in
/// (0, 1) that vary by element, integers 0 (a valid index and label),
/// bools alternating; symbolic and unknown dims get size 2.
Tensor smokeInput(const TensorType& type) {
  std::vector<int64_t> dims;
  for (const Dim& d : type.shape) dims.push_back(d.isStatic() ? d.size : 2);
  Tensor t(type.dtype, dims);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    if (isFloat(type.dtype))
      t.setDouble(i, 0.25 + 0.5 * ((i * 37) % 11) / 11.0);
    else if (type.dtype == DType::Bool)
      t.setInt(i, i % 2);
  }
  return t;
}

TEST(InterpreterFunctionTest, EveryOpOfTheRoundTripModuleRuns) {
  const std::filesystem::path path = std::filesystem::path(KILN_SOURCE_DIR) / "test" / "lit" / "ir" / "roundtrip.kir";
  std::ifstream file(path);
  ASSERT_TRUE(file) << "cannot read " << path;
  std::stringstream text;
  text << file.rdbuf();
  auto module = parseModule(text.str(), path.string());
  ASSERT_TRUE(module) << module.error().str();

  std::set<OpKind> seen;
  for (const auto& f : (*module)->functions()) {
    std::vector<Tensor> inputs;
    for (Value* arg : f->arguments()) inputs.push_back(smokeInput(arg->type()));
    auto out = interpret(*f, std::move(inputs));
    EXPECT_TRUE(out) << "@" << f->name() << ": " << (out ? "" : out.error().str());
    for (const auto& op : f->ops()) seen.insert(op->kind());
  }
  // The module is the one place that exercises every op together; an op
  // added to Ops.def must be added there too.
  for (const OpInfo& info : allOps()) EXPECT_TRUE(seen.count(info.kind)) << info.mnemonic << " is not in " << path;
}

}  // namespace
}  // namespace kiln::test
