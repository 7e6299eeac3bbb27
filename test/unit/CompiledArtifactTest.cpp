// `.kc` compiled artifacts (runtime/KcFile.h): a compiled program written
// and read back runs with its stored code and gives the outputs of the
// model; its weights (constants and argument defaults) survive; a
// truncated file, a flipped byte in any section, a wrong magic and another
// format version are clear errors; a file whose target features differ
// from the host's is detected and runs after recompiling from its module;
// a program whose kernels its code does not define is refused; a library
// call reading its operands transposed in place keeps its layout bits, and
// a bit that contradicts the stored buffer fails validation.
#include <gtest/gtest.h>

#include "codegen/cpu/CpuCompiler.h"
#include "codegen/cpu/CpuExecutable.h"
#include "codegen/llvm/CpuJit.h"
#include "ir/Parser.h"
#include "passes/MemoryPlan.h"
#include "runtime/KcFile.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

/// The `.kc` bytes of `artifact` written again (after a test edits it).
std::string reserialize(const CompiledArtifact& artifact) {
  auto module = artifactModule(artifact, "m.kc");
  EXPECT_TRUE(module.ok()) << module.error().str();
  if (!module) return {};
  auto bytes = serializeArtifact(*(*module)->functions().front(), *artifact.program, artifact.optLevel,
                                 artifact.memoryPlan);
  EXPECT_TRUE(bytes.ok()) << bytes.error().str();
  return bytes ? *bytes : std::string();
}

/// A model with a large constant (a weight), a small one and an argument
/// default large enough to go to the weights section.
std::string modelText() {
  std::string w = "dense<f32[8,4]>[";
  for (int i = 0; i < 32; ++i) w += (i ? ", " : "") + std::to_string(0.125 * (i % 9) - 0.5);
  w += "]";
  std::string b = "dense<f32[4]>[0.5, -1.0, 2.0, 0.25]";
  std::string s = "dense<f32[2,4]>[";
  for (int i = 0; i < 8; ++i) s += (i ? ", " : "") + std::to_string(i * 0.75);
  s += "]";
  std::string big = "dense<f32[2,4]>[";
  for (int i = 0; i < 8; ++i) big += (i ? ", " : "") + std::to_string(1.0 + i);
  big += "]";
  return "func @f(%x: f32[2,8], %shift: f32[2,4] = " + big + ") -> (\"y\": f32[2,4]) {\n" +
         "  %w = constant() {value = " + w + "} : f32[8,4]\n" +  //
         "  %b = constant() {value = " + b + "} : f32[4]\n" +    //
         "  %s = constant() {value = " + s + "} : f32[2,4]\n" +  //
         "  %m = matmul(%x, %w) : f32[2,4]\n" +                  //
         "  %a = add(%m, %b) : f32[2,4]\n" +                     //
         "  %c = add(%a, %s) : f32[2,4]\n" +                     //
         "  %d = sub(%c, %shift) : f32[2,4]\n" +                 //
         "  %y = tanh(%d) : f32[2,4]\n" +                        //
         "  return %y\n}\n";
}

std::vector<Tensor> inputs() {
  Tensor x(DType::F32, {2, 8});
  for (int64_t i = 0; i < x.numElements(); ++i) x.setDouble(i, 0.1 * i - 0.7);
  Tensor shift(DType::F32, {2, 4});
  for (int64_t i = 0; i < shift.numElements(); ++i) shift.setDouble(i, 1.0 + static_cast<double>(i));
  return {x, shift};
}

class CompiledArtifactTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = parseModule(modelText(), "test.kir");
    ASSERT_TRUE(m.ok()) << m.error().str();
    module_ = std::move(*m);
    // -O2: one kernel per op, so the kernel list has several entries.
    auto executor = CpuExecutor::create(*module_->functions().front(), {.optLevel = 2});
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    executor_ = std::move(*executor);
    auto out = executor_->run(inputs());
    ASSERT_TRUE(out.ok()) << out.error().str();
    expected_ = (*out)[0];
    auto compiled = executor_->compiledProgram(inputs());
    ASSERT_TRUE(compiled.ok()) << compiled.error().str();
    const Function& optimized = *compiled->first->functions().front();
    auto plan = planMemory(optimized);
    ASSERT_TRUE(plan.ok());
    auto bytes = serializeArtifact(optimized, *compiled->second, 2, plan->str());
    ASSERT_TRUE(bytes.ok()) << bytes.error().str();
    bytes_ = *bytes;
  }

  /// Runs a parsed artifact's program with its stored code, or its module
  /// compiled again.
  void expectRunsLikeTheModel(const CompiledArtifact& artifact, bool useStoredCode) {
    std::unique_ptr<Module> module;
    Expected<std::unique_ptr<CpuExecutor>> executor = Error("not created");
    if (useStoredCode) {
      executor = CpuExecutor::fromProgram(artifact.program);
    } else {
      auto parsed = artifactModule(artifact, "m.kc");
      ASSERT_TRUE(parsed.ok()) << parsed.error().str();
      module = std::move(*parsed);
      // The module's default of %shift is restored from the weights section.
      ASSERT_TRUE(module->functions().front()->argumentDefault(1));
      executor = CpuExecutor::createOptimized(*module->functions().front());
    }
    ASSERT_TRUE(executor.ok()) << executor.error().str();
    // The default of %shift is restored from the weights section.
    const Program::Argument& shift = artifact.program->arguments[1];
    ASSERT_TRUE(shift.hasDefault);
    std::vector<Tensor> in = {inputs()[0], shift.defaultValue};
    auto out = (*executor)->run(in);
    ASSERT_TRUE(out.ok()) << out.error().str();
    ASSERT_EQ(out->size(), 1u);
    ASSERT_EQ((*out)[0].shape(), expected_.shape());
    for (int64_t i = 0; i < expected_.numElements(); ++i)
      EXPECT_EQ((*out)[0].getDouble(i), expected_.getDouble(i)) << "element " << i;
  }

  std::string parseError(const std::string& bytes) {
    auto parsed = parseArtifact(bytes, "m.kc");
    EXPECT_FALSE(parsed.ok());
    return parsed.ok() ? "" : parsed.error().message();
  }

  std::unique_ptr<Module> module_;
  std::unique_ptr<CpuExecutor> executor_;
  Tensor expected_;
  std::string bytes_;
};

TEST_F(CompiledArtifactTest, RoundTripRunsWithStoredCode) {
  EXPECT_EQ(bytes_.substr(0, 6), "KILNKC");
  auto artifact = parseArtifact(bytes_, "m.kc");
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  EXPECT_EQ(codegen::targetMismatch(*artifact->program, codegen::CpuJit::hostTarget()), "");
  EXPECT_EQ(artifact->program->kernelNames.size(), 5u);
  EXPECT_FALSE(artifact->program->sharedObject.empty());
  EXPECT_NE(artifact->memoryPlan.find("peak"), std::string::npos);
  // The weights are not in the module's text: only the 64-byte-or-larger
  // tensors are elided, so the small bias stays inline.
  EXPECT_EQ(bytes_.find("dense<f32[8,4]>["), std::string::npos);
  EXPECT_NE(bytes_.find("dense<f32[4]>[0.5, -1.0, 2.0, 0.25]"), std::string::npos);
  expectRunsLikeTheModel(*artifact, /*useStoredCode=*/true);
}

TEST_F(CompiledArtifactTest, EveryTruncationIsAnError) {
  // Every prefix must fail cleanly; a stride keeps the test quick.
  for (size_t size = 0; size < bytes_.size(); size += (size < 200 ? 1 : 97)) {
    const std::string message = parseError(bytes_.substr(0, size));
    EXPECT_TRUE(message.find("truncated") != std::string::npos || message.find("magic") != std::string::npos)
        << "prefix of " << size << " bytes: " << message;
  }
}

TEST_F(CompiledArtifactTest, FlippedBytesAreCorrupt) {
  // A byte in each section's payload, and in the header fields.
  for (size_t at = 16; at < bytes_.size(); at += bytes_.size() / 40) {
    std::string damaged = bytes_;
    damaged[at] ^= 0x10;
    auto parsed = parseArtifact(damaged, "m.kc");
    EXPECT_FALSE(parsed.ok()) << "flipping byte " << at << " was not detected";
    if (!parsed.ok()) {
      EXPECT_NE(parsed.error().message().find("m.kc"), std::string::npos);
    }
  }
  std::string damaged = bytes_;
  damaged[damaged.size() - 1] ^= 1;
  EXPECT_NE(parseError(damaged).find("corrupt: the checksum of the weights section does not match"), std::string::npos);
}

TEST_F(CompiledArtifactTest, WrongMagicAndNewerVersion) {
  std::string wrong = bytes_;
  wrong[0] = 'X';
  EXPECT_EQ(parseError(wrong), "m.kc: not a Kiln compiled artifact (.kc): it does not start with the magic 'KILNKC'");
  std::string newer = bytes_;
  newer[8] = static_cast<char>(kArtifactVersion + 1);
  EXPECT_NE(parseError(newer).find("format version 6 is not readable by this Kiln, which reads .kc format version 5 "
                                   "(the file was written by a newer Kiln"),
            std::string::npos);
  std::string older = bytes_;
  older[8] = 1;
  EXPECT_NE(parseError(older).find("format version 1 is not readable by this Kiln, which reads .kc format version 5 "
                                   "(the file was written by an older Kiln; compile the model again)"),
            std::string::npos);
  EXPECT_NE(parseError(bytes_ + "x").find("1 unexpected bytes after the last section"), std::string::npos);
}

TEST_F(CompiledArtifactTest, OtherTargetIsDetectedAndRecompiles) {
  auto artifact = parseArtifact(bytes_, "m.kc");
  ASSERT_TRUE(artifact.ok());
  // As if built on a CPU without AVX-512: the features in the header differ.
  artifact->program->machine.features += ",-avx512f";
  const std::string bytes = reserialize(*artifact);
  auto other = parseArtifact(bytes, "other.kc");
  ASSERT_TRUE(other.ok()) << other.error().str();
  EXPECT_EQ(codegen::targetMismatch(*other->program, codegen::CpuJit::hostTarget()),
            "it was built for other CPU features than this CPU's");
  other->program->machine.cpu = "some-other-cpu";
  EXPECT_EQ(codegen::targetMismatch(*other->program, codegen::CpuJit::hostTarget()),
            "it was built for CPU 'some-other-cpu', this CPU is '" + codegen::CpuJit::hostTarget().cpu + "'");
  expectRunsLikeTheModel(*other, /*useStoredCode=*/false);
}

/// The program runs its kernels by name from its code: a program naming a
/// kernel its code does not define, or more kernels than it lists, is
/// refused before anything runs.
TEST_F(CompiledArtifactTest, StoredCodeMustDefineTheProgramsKernels) {
  auto artifact = parseArtifact(bytes_, "m.kc");
  ASSERT_TRUE(artifact.ok());
  auto renamed = std::make_shared<Program>(*artifact->program);
  renamed->kernelNames[1] = "kiln9_other_1";
  auto executor = CpuExecutor::fromProgram(renamed);
  ASSERT_FALSE(executor.ok());
  EXPECT_NE(executor.error().message().find("does not define kernel 1 'kiln9_other_1'"), std::string::npos)
      << executor.error().message();
  auto fewer = std::make_shared<Program>(*artifact->program);
  fewer->kernelNames.pop_back();
  fewer->kernelHashes.pop_back();
  executor = CpuExecutor::fromProgram(fewer);
  ASSERT_FALSE(executor.ok());
  EXPECT_NE(executor.error().message().find("runs kernel 4 of 4"), std::string::npos) << executor.error().message();
}

TEST(CompiledArtifactLibraryTest, FusedKernelsAndLibraryStepsRoundTrip) {
  // At -O3 (the default) the matmul with k = 64 runs on oneDNN with its
  // bias and relu as post-ops, and the exp after it is a generated kernel:
  // the .kc stores one kernel, and the library step as a library call.
  std::string w = "dense<f32[64,8]>[";
  for (int i = 0; i < 512; ++i) w += (i ? ", " : "") + std::to_string(0.01 * (i % 17) - 0.08);
  w += "]";
  auto m =
      parseModule("func @f(%x: f32[4,64]) -> f32[4,8] {\n  %w = constant() {value = " + w +
                      "} : f32[64,8]\n  %b = constant() {value = dense<f32[8]>[1, 2, 3, 4, 5, 6, 7, 8]} : f32[8]\n"
                      "  %m = matmul(%x, %w) : f32[4,8]\n  %a = add(%m, %b) : f32[4,8]\n"
                      "  %r = relu(%a) : f32[4,8]\n  %t = transpose(%r) {perm = [1, 0]} : f32[8,4]\n"
                      "  %e = exp(%t) : f32[8,4]\n  %y = transpose(%e) {perm = [1, 0]} : f32[4,8]\n  return %y\n}\n",
                  "lib.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  Tensor x(DType::F32, {4, 64});
  for (int64_t i = 0; i < x.numElements(); ++i) x.setDouble(i, 0.02 * (i % 11) - 0.1);
  auto executor = CpuExecutor::create(*(*m)->functions().front());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto want = (*executor)->run({x});
  ASSERT_TRUE(want.ok()) << want.error().str();
  auto code = (*executor)->compiledProgram({x});
  ASSERT_TRUE(code.ok()) << code.error().str();
  EXPECT_LT(code->second->kernelNames.size(), (*executor)->numKernels({x}));  // some step is not a kernel
  auto bytes = serializeArtifact(*code->first->functions().front(), *code->second, 3, "");
  ASSERT_TRUE(bytes.ok()) << bytes.error().str();
  auto parsed = parseArtifact(*bytes, "lib.kc");
  ASSERT_TRUE(parsed.ok()) << parsed.error().str();
  auto loaded = CpuExecutor::fromProgram(parsed->program);
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  auto got = (*loaded)->run({x});
  ASSERT_TRUE(got.ok()) << got.error().str();
  for (int64_t i = 0; i < (*want)[0].numElements(); ++i)
    EXPECT_EQ((*got)[0].getDouble(i), (*want)[0].getDouble(i)) << "element " << i;
}

/// A matmul reading both operands in place through transposed strides (a
/// weight's gradient dy^T x with a transposed weight, say) is stored with
/// both layout bits and runs the same from the .kc; a layout bit that does
/// not say how the buffer is stored is refused by validation.
TEST(CompiledArtifactLibraryTest, TransposedOperandsRoundTrip) {
  auto m = parseModule(test::transposedMatmulFunction(true, true, false), "t.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  const Function& f = *(*m)->functions().front();
  std::vector<Tensor> in;
  for (size_t i = 0; i < f.numArguments(); ++i)
    in.push_back(test::randomF32(staticDims(f.argument(i)->type().shape), static_cast<int>(i) + 1));
  auto executor = CpuExecutor::create(f);
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  auto want = (*executor)->run(in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  auto code = (*executor)->compiledProgram(in);
  ASSERT_TRUE(code.ok()) << code.error().str();
  auto bytes = serializeArtifact(*code->first->functions().front(), *code->second, 3, "");
  ASSERT_TRUE(bytes.ok()) << bytes.error().str();
  auto parsed = parseArtifact(*bytes, "t.kc");
  ASSERT_TRUE(parsed.ok()) << parsed.error().str();
  const Program& program = *parsed->program;
  int library = -1;
  for (size_t i = 0; i < program.steps.size(); ++i)
    if (program.steps[i].kind == Program::Step::Kind::Library) library = static_cast<int>(i);
  ASSERT_GE(library, 0) << "no library step";
  EXPECT_TRUE(program.steps[static_cast<size_t>(library)].call.transposedA);
  EXPECT_TRUE(program.steps[static_cast<size_t>(library)].call.transposedB);
  auto loaded = CpuExecutor::fromProgram(parsed->program);
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  auto got = (*loaded)->run(in);
  ASSERT_TRUE(got.ok()) << got.error().str();
  test::expectClose((*got)[0], (*want)[0], "the .kc's result", 1e-5, 1e-5);

  // a is stored [64, 24]: read as a plain [24, 64] it does not fit.
  Program plainA = program;
  plainA.steps[static_cast<size_t>(library)].call.transposedA = false;
  Status s = plainA.validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("library call operand that does not fit its buffers"), std::string::npos)
      << s.error().message();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

/// A program whose constant claims a huge type but carries a few bytes is
/// refused before anything of that type is allocated (the .kc fuzzer found
/// a 5 GB allocation here; fuzz/regressions/kiln-fuzz-kc).
TEST(CpuProgramTest, HugeDeclaredConstantIsRefusedBeforeAllocation) {
  Program program;
  program.name = "p";
  Tensor c(DType::F32, {3});
  program.constants.push_back(c);
  std::string bytes = serializeProgram(program, 64);
  // name (u32 1, "p"), 0 arguments, 1 constant: dtype (u8), rank (u32 1),
  // then its one dim, an i64 at offset 18.
  ASSERT_EQ(bytes[18], 3);
  const uint64_t huge = uint64_t{1} << 40;
  for (int i = 0; i < 8; ++i) bytes[18 + i] = static_cast<char>((huge >> (8 * i)) & 0xff);
  Program parsed;
  Status s = parseProgram(bytes, "p.kc (program section)", parsed);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(), "p.kc (program section): corrupt: a constant of type f32[1099511627776] has 12 bytes");
}

}  // namespace
}  // namespace kiln
