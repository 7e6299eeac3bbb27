// Tests of the verifier (ir/Verifier.cpp) on IR built through the API,
// including the invariants the text parser never lets through (duplicate
// names, values used before their definition or from another function,
// unknown or mistyped attributes, null operands), and of the infer-shapes
// pass's "did it change?" contract and its errors.
#include <gtest/gtest.h>

#include "ir/Builder.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"

namespace kiln {
namespace {

TensorType f32(std::vector<Dim> dims) { return {DType::F32, std::move(dims)}; }
Dim d(int64_t n) { return Dim::fixed(n); }
const Dim kAny = Dim::unknown();

/// Every message the verifier reports for `m`, in order.
std::vector<std::string> diagnostics(const Module& m) {
  std::vector<std::string> messages;
  Status s = verify(m, [&](const Error& e) { messages.push_back(e.message()); });
  EXPECT_EQ(s.ok(), messages.empty());
  if (!s.ok() && !messages.empty()) {
    EXPECT_EQ(s.error().message(), messages.front());
  }
  return messages;
}

using Messages = std::vector<std::string>;

TEST(VerifierTest, AcceptsWellFormedFunction) {
  Module m;
  Function* f = m.addFunction("mlp");
  Value* x = f->addArgument(f32({Dim::symbolic("N"), d(4)}), "x");
  Value* w = f->addArgument(f32({d(4), d(2)}), "w");
  Builder b(*f);
  auto mm = b.value(OpKind::MatMul, {x, w});
  ASSERT_TRUE(mm.ok());
  auto r = b.value(OpKind::Relu, {*mm});
  ASSERT_TRUE(r.ok());
  b.ret({*r});
  EXPECT_EQ(diagnostics(m), Messages{});
}

TEST(VerifierTest, ReportsEveryProblemWithItsLocation) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({d(2)}), "x");
  Builder b(*f);
  b.setLocation(Location::named("Relu_3", "model.onnx"));
  Value* bad1 = b.create(OpKind::Relu, {x}, {f32({d(3)})})->result();
  b.setLocation(Location::named("Add_4", "model.onnx"));
  b.create(OpKind::Add, {x}, {f32({d(2)})});
  b.ret({bad1});
  std::vector<Error> errors;
  Status s = verify(m, [&](const Error& e) { errors.push_back(e); });
  ASSERT_FALSE(s.ok());
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].message(), "'relu' result 0 type f32[3] does not match inferred f32[2]");
  EXPECT_EQ(errors[0].location().name, "Relu_3");
  EXPECT_EQ(errors[1].message(), "'add' has 1 operand, expected 2");
  EXPECT_EQ(errors[1].location().name, "Add_4");
  EXPECT_EQ(s.error().message(), errors[0].message());
}

TEST(VerifierTest, RejectsDuplicateFunctionNames) {
  Module m;
  for (int i = 0; i < 2; ++i) {
    Function* f = m.addFunction("f");
    Builder(*f).ret({});
  }
  // Module::addFunction does not check; the verifier does.
  EXPECT_EQ(diagnostics(m), Messages{"function @f is already defined in this module"});
}

TEST(VerifierTest, RejectsDuplicateValueNames) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({d(2)}), "x");
  Builder b(*f);
  Value* y = b.create(OpKind::Neg, {x}, {f32({d(2)})})->result();
  y->setName("x");
  b.ret({y});
  EXPECT_EQ(diagnostics(m), Messages{"'neg' result %x redefines a value name already used in @f"});
}

TEST(VerifierTest, RejectsUseBeforeDefinition) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({d(2)}), "x");
  Builder b(*f);
  Op* later = b.create(OpKind::Relu, {x}, {f32({d(2)})});
  later->result()->setName("later");
  b.setInsertionPoint(later);
  Value* early = b.create(OpKind::Neg, {later->result()}, {f32({d(2)})})->result();
  b.setInsertionPoint(nullptr);
  b.ret({early});
  EXPECT_EQ(diagnostics(m), Messages{"'neg' use of value %later before its definition"});
}

TEST(VerifierTest, RejectsValuesOfAnotherFunction) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({d(2)}), "x");
  Builder(*f).ret({x});
  Function* g = m.addFunction("g");
  Builder b(*g);
  b.ret({b.create(OpKind::Neg, {x}, {f32({d(2)})})->result()});
  g->setResultTypes({f32({d(2)})});
  EXPECT_EQ(diagnostics(m), Messages{"'neg' operand 0 (%x) is defined in another function"});
}

TEST(VerifierTest, RejectsNullOperands) {
  Module m;
  Function* f = m.addFunction("f");
  Builder b(*f);
  b.ret({b.create(OpKind::Neg, {nullptr}, {f32({d(2)})})->result()});
  EXPECT_EQ(diagnostics(m), Messages{"'neg' operand 0 is null"});
}

TEST(VerifierTest, ChecksAttributesAgainstTheOpTable) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({d(2)}), "x");
  Builder b(*f);
  b.create(OpKind::Softmax, {x}, {f32({d(2)})}, {{"axes", Attribute(std::vector<int64_t>{0})}});
  b.create(OpKind::Relu, {x}, {f32({d(2)})}, {{"alpha", Attribute(0.5)}});
  b.create(OpKind::Softmax, {x}, {f32({d(2)})}, {{"axis", Attribute(0.5)}});
  b.create(OpKind::ReduceSum, {x}, {f32({})});
  b.ret({x});
  EXPECT_EQ(diagnostics(m),
            (Messages{"'softmax' has unknown attribute 'axes'; valid attributes: 'axis'",
                      "'relu' has unknown attribute 'alpha' (it takes no attributes)",
                      "'softmax' attribute 'axis' must be int, got float", "'reduce_sum' requires attribute 'axes'"}));
}

TEST(VerifierTest, ChecksTheReturn) {
  Module m;
  Function* empty = m.addFunction("empty");
  (void)empty;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({d(2)}), "x");
  Builder b(*f);
  b.ret({x});
  f->setResultTypes({f32({d(2)}), f32({d(2)})});
  EXPECT_EQ(diagnostics(m), (Messages{"function @empty does not end with 'return'",
                                      "'return' returns 1 value, but @f declares 2 results"}));
}

// --- infer-shapes ------------------------------------------------------------------

TEST(InferShapesTest, RefinesOnceThenReportsNoChange) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({Dim::symbolic("N"), d(3)}), "x");
  Value* bias = f->addArgument(f32({d(3)}), "b");
  Builder b(*f);
  Value* sum = b.create(OpKind::Add, {x, bias}, {f32({kAny, kAny})})->result();
  Value* out = b.create(OpKind::Relu, {sum}, {f32({kAny, kAny})})->result();
  b.ret({out});
  ASSERT_TRUE(verify(m).ok());

  auto pass = createInferShapesPass();
  EXPECT_EQ(pass->name(), "infer-shapes");
  auto changed = pass->run(m, PassContext{});
  ASSERT_TRUE(changed.ok()) << changed.error().str();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(sum->type().str(), "f32[N,3]");
  EXPECT_EQ(out->type().str(), "f32[N,3]");
  EXPECT_EQ(f->resultTypes()[0].str(), "f32[N,3]");
  EXPECT_TRUE(verify(m).ok());

  auto again = pass->run(m, PassContext{});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

TEST(InferShapesTest, ReportsConflictsAtTheOp) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument(f32({d(2)}), "x");
  Builder b(*f);
  Value* open = b.create(OpKind::Relu, {x}, {f32({kAny})})->result();
  b.setLocation(Location::fileLineCol("m.kir", 7, 3));
  Value* fixed = b.create(OpKind::Neg, {open}, {f32({d(3)})})->result();
  b.ret({fixed});
  ASSERT_TRUE(verify(m).ok());  // `?` is compatible with 3 until refined to 2
  auto changed = createInferShapesPass()->run(m, PassContext{});
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.error().message(), "'neg' result 0 is declared f32[3] but inferred f32[2]");
  EXPECT_EQ(changed.error().location().line, 7);
}

}  // namespace
}  // namespace kiln
