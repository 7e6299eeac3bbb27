// The `raise-activations` pass beyond what its lit test shows: every case
// that test/lit/passes/raise-activations.kir raises computes, as the
// composite, what its primitive chain computed (both run on the reference
// interpreter on the same random inputs), and a chain over an integer x,
// which the verifier would reject, is left alone when the pass meets it.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::parseOk;

Expected<bool> runRaiseActivations(Module& m) { return createRaiseActivationsPass()->run(m, PassContext{}); }

/// The `// -----` separated chunks of a lit test.
std::vector<std::string> litChunks(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::vector<std::string> chunks(1);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("// -----"))
      chunks.emplace_back();
    else
      chunks.back() += line + "\n";
  }
  return chunks;
}

/// Random inputs for `f`'s arguments, with every dim that is not static 3.
std::vector<Tensor> randomInputs(const Function& f, std::mt19937& rng) {
  std::vector<Tensor> inputs;
  for (const Value* arg : f.arguments()) {
    TensorType type = arg->type();
    for (Dim& d : type.shape)
      if (!d.isStatic()) d = Dim::fixed(3);
    inputs.push_back(test::randomTensor(type, rng));
  }
  return inputs;
}

TEST(RaiseActivations, RaisedLitCasesComputeWhatTheirChainsDid) {
  int raised = 0;
  std::mt19937 rng(20240611);
  for (const std::string& chunk : litChunks(KILN_SOURCE_DIR "/test/lit/passes/raise-activations.kir")) {
    auto original = parseOk(chunk);
    auto module = parseOk(chunk);
    ASSERT_TRUE(original && module);
    ASSERT_TRUE(verify(*original).ok()) << chunk;
    auto changed = runRaiseActivations(*module);
    ASSERT_TRUE(changed.ok()) << changed.error().str();
    if (!*changed) continue;
    ++raised;
    Status verified = verify(*module);
    ASSERT_TRUE(verified.ok()) << verified.error().str() << "\n" << print(*module);

    const Function& f = *original->functions()[0];
    std::vector<Tensor> inputs = randomInputs(f, rng);
    auto want = interpret(f, inputs);
    auto got = interpret(*module->functions()[0], inputs);
    ASSERT_TRUE(want.ok() && got.ok()) << chunk;
    ASSERT_EQ(got->size(), want->size());
    // The chains hold their constants rounded to x's dtype, and bf16 rounds
    // every intermediate besides.
    const bool bf16 = f.argument(0)->type().dtype == DType::BF16;
    for (size_t r = 0; r < want->size(); ++r)
      test::expectClose((*got)[r], (*want)[r], "@" + f.name() + " result " + std::to_string(r), bf16 ? 2e-2 : 1e-5,
                        bf16 ? 2e-2 : 1e-6);
  }
  EXPECT_GT(raised, 0) << "no case of the lit test was raised";
}

/// SiLU is the one form an integer x could take structurally (GELU's 0.5 has
/// no integer value); only the dtype check stops it.
TEST(RaiseActivations, IntegerInputIsLeftAlone) {
  const std::string ir = R"(func @silu_i32(%x: i32[4]) -> i32[4] {
  %s = sigmoid(%x) : i32[4]
  %y = mul(%x, %s) : i32[4]
  return %y
}
)";
  auto module = parseOk(ir);
  ASSERT_TRUE(module);
  const std::string before = print(*module);
  auto changed = runRaiseActivations(*module);
  ASSERT_TRUE(changed.ok()) << changed.error().str();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(print(*module), before);
}

}  // namespace
}  // namespace kiln
