// Concatenations without copies (passes/MemoryPlan.h, docs/codegen.md §4
// "Slices of a concatenation"): operands placed in their slices of the
// concat's buffer, contiguous or strided, chained concats sharing one
// buffer, and the copies that remain (an argument, a value also returned, a
// library call that cannot write a strided slice), on the CPU and on the
// emulated GPU against the interpreter, with the plan saying what was placed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaExecutor.h"
#include "passes/MemoryPlan.h"
#include "runtime/Interpreter.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;
using test::parseVerified;
using test::randomF32;

/// DenseNet's pattern at batch `n` along `axis` of a [n, 16, 4, 4] (or
/// channels last [n, 4, 4, 16]) input: each layer concatenates every
/// earlier layer's output again, and reads the concat through an
/// elementwise op.
std::string denseChain(int64_t n, bool channelsLast) {
  const std::string b = std::to_string(n);
  auto type = [&](int c) {
    const std::string ch = std::to_string(c);
    return channelsLast ? "f32[" + b + ",4,4," + ch + "]" : "f32[" + b + "," + ch + ",4,4]";
  };
  const std::string axis = channelsLast ? "3" : "1";
  // The first 16 channels of `v`.
  auto first16 = [&](const std::string& result, const std::string& v) {
    return "  %" + result + " = slice(%" + v + ") {starts = [0, 0, 0, 0], ends = [" + b +
           (channelsLast ? ", 4, 4, 16" : ", 16, 4, 4") + "], steps = [1, 1, 1, 1]} : " + type(16) + "\n";
  };
  return "func @dense(%x: " + type(16) + ") -> " + type(16) + " {\n" +
         "  %x0 = exp(%x) : " + type(16) + "\n" +
         "  %x1 = tanh(%x0) : " + type(16) + "\n" +
         "  %c1 = concat(%x0, %x1) {axis = " + axis + "} : " + type(32) + "\n" +
         "  %r1 = neg(%c1) : " + type(32) + "\n" + first16("p2", "r1") +
         "  %x2 = exp(%p2) : " + type(16) + "\n" +
         "  %c2 = concat(%x0, %x1, %x2) {axis = " + axis + "} : " + type(48) + "\n" +
         "  %r2 = sigmoid(%c2) : " + type(48) + "\n" + first16("p3", "r2") +
         "  %x3 = exp(%p3) : " + type(16) + "\n" +
         "  %c3 = concat(%x0, %x1, %x2, %x3) {axis = " + axis + "} : " + type(64) + "\n" +
         "  %r3 = exp(%c3) : " + type(64) + "\n" + first16("s", "r3") +
         "  %y = add(%s, %x3) : " + type(16) + "\n" +
         "  return %y\n}\n";
}

/// The buffer of the value named `name` in `plan`, or null.
const MemoryPlan::Buffer* bufferNamed(const MemoryPlan& plan, const std::string& name) {
  for (const MemoryPlan::Buffer& b : plan.buffers)
    if (b.name == name) return &b;
  return nullptr;
}

void expectMatch(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].numElements(), want[r].numElements()) << what;
    for (int64_t i = 0; i < want[r].numElements(); ++i)
      ASSERT_NEAR(got[r].getDouble(i), want[r].getDouble(i), 1e-5 + 1e-4 * std::abs(want[r].getDouble(i)))
          << what << ": result " << r << " element " << i;
  }
}

/// Runs `f` on the CPU at -O2 and -O3 twice (the arena reused) and checks
/// it against the interpreter; returns the -O2 plan (its `value` pointers
/// are the executor's, gone with it: the tests read names).
MemoryPlan runOnCpu(const Function& f, const std::vector<Tensor>& in) {
  auto want = interpret(f, in);
  EXPECT_TRUE(want.ok()) << want.error().str();
  MemoryPlan plan;
  for (int optLevel : {3, 2}) {
    auto executor = CpuExecutor::create(f, {.threads = 2, .optLevel = optLevel});
    EXPECT_TRUE(executor.ok()) << executor.error().str();
    if (!executor.ok()) return plan;
    for (int run = 0; run < 2; ++run) {
      auto got = (*executor)->run(in);
      EXPECT_TRUE(got.ok()) << got.error().str();
      if (got.ok()) expectMatch(*got, *want, "-O" + std::to_string(optLevel) + " run " + std::to_string(run));
    }
    auto p = (*executor)->memoryPlan(in);
    EXPECT_TRUE(p.ok()) << p.error().str();
    if (p.ok()) plan = *p;
  }
  return plan;
}

void runOnEmulatedGpu(const Function& f, const std::vector<Tensor>& in) {
  auto want = interpret(f, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  auto executor = codegen::CudaExecutor::create(f, test::emulatorContext());
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  for (int run = 0; run < 2; ++run) {
    auto got = (*executor)->run(in);
    ASSERT_TRUE(got.ok()) << got.error().str();
    expectMatch(*got, *want, "emulated GPU run " + std::to_string(run));
  }
}

TEST(ConcatSlicesTest, ChainedConcatsShareOneBufferAndCopyNothing) {
  // Batch 1 channels first: every slice is contiguous.
  auto m = parseVerified(denseChain(1, false));
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const MemoryPlan plan = runOnCpu(f, {randomF32({1, 16, 4, 4}, 1)});
  const MemoryPlan::Buffer* c3 = bufferNamed(plan, "c3");
  ASSERT_TRUE(c3) << plan.str();
  EXPECT_EQ(c3->sliceOf, -1) << plan.str();
  EXPECT_TRUE(c3->copiedOperands.empty()) << plan.str();
  const int root = static_cast<int>(c3 - plan.buffers.data());
  // The smaller concats are prefixes of the largest, each operand at its
  // channel offset (16 channels of 4x4 f32: 1024 bytes each).
  for (const auto& [name, offset] : std::vector<std::pair<std::string, int64_t>>{
           {"x0", 0}, {"x1", 1024}, {"x2", 2048}, {"x3", 3072}, {"c1", 0}, {"c2", 0}}) {
    const MemoryPlan::Buffer* b = bufferNamed(plan, name);
    ASSERT_TRUE(b) << name << "\n" << plan.str();
    EXPECT_EQ(b->sliceOf, root) << name << "\n" << plan.str();
    EXPECT_EQ(b->sliceOffset, offset) << name << "\n" << plan.str();
    EXPECT_TRUE(b->strides.empty()) << name << "\n" << plan.str();
    EXPECT_EQ(b->offset, c3->offset + offset) << name;
  }
  EXPECT_TRUE(bufferNamed(plan, "c1")->copiedOperands.empty());
  EXPECT_TRUE(bufferNamed(plan, "c2")->copiedOperands.empty());
  // No step runs for the concats nor for the slices (views of their
  // input): 14 ops, 3 concats, 3 slices.
  auto executor = CpuExecutor::create(f, {.threads = 1, .optLevel = 2});
  ASSERT_TRUE(executor.ok());
  EXPECT_EQ((*executor)->numKernels({randomF32({1, 16, 4, 4}, 1)}), 8u);
}

TEST(ConcatSlicesTest, StridedSlicesAtBatchTwoAndChannelsLast) {
  for (const auto& [n, channelsLast] : std::vector<std::pair<int64_t, bool>>{{2, false}, {1, true}, {3, true}}) {
    SCOPED_TRACE("batch " + std::to_string(n) + (channelsLast ? " channels last" : " channels first"));
    auto m = parseVerified(denseChain(n, channelsLast));
    ASSERT_TRUE(m);
    const Function& f = *m->functions().front();
    const std::vector<Tensor> in = {channelsLast ? randomF32({n, 4, 4, 16}, 2) : randomF32({n, 16, 4, 4}, 2)};
    const MemoryPlan plan = runOnCpu(f, in);
    const MemoryPlan::Buffer* x1 = bufferNamed(plan, "x1");
    ASSERT_TRUE(x1) << plan.str();
    EXPECT_GE(x1->sliceOf, 0) << plan.str();
    // Generated kernels write and read the strided slices.
    EXPECT_EQ(x1->strides, channelsLast ? std::vector<int64_t>({1024, 256, 64, 1})
                                        : std::vector<int64_t>({1024, 16, 4, 1}))
        << plan.str();
    EXPECT_TRUE(bufferNamed(plan, "c2")->copiedOperands.empty()) << plan.str();
  }
}

TEST(ConcatSlicesTest, ArgumentsAndReturnedValuesAreCopied) {
  // %x is an argument and %a a result of the function: both keep their own
  // memory and the concat copies them; %b goes into its slice.
  auto m = parseVerified(
      "func @f(%x: f32[16,4]) -> (f32[16,4], f32[48,4]) {\n"
      "  %a = exp(%x) : f32[16,4]\n  %b = neg(%x) : f32[16,4]\n"
      "  %c = concat(%x, %a, %b) {axis = 0} : f32[48,4]\n  %r = tanh(%c) : f32[48,4]\n  return %a, %r\n}\n");
  ASSERT_TRUE(m);
  const MemoryPlan plan = runOnCpu(*m->functions().front(), {randomF32({16, 4}, 3)});
  const MemoryPlan::Buffer* c = bufferNamed(plan, "c");
  ASSERT_TRUE(c) << plan.str();
  EXPECT_EQ(c->copiedOperands, std::vector<int>({0, 1})) << plan.str();
  ASSERT_TRUE(bufferNamed(plan, "b"));
  EXPECT_EQ(bufferNamed(plan, "b")->sliceOffset, 512) << plan.str();
}

TEST(ConcatSlicesTest, AValueInTwoConcatsAtDifferentPlacesIsCopiedIntoOne) {
  auto m = parseVerified(
      "func @f(%x: f32[16,4]) -> (f32[32,4], f32[32,4]) {\n"
      "  %a = exp(%x) : f32[16,4]\n  %b = neg(%x) : f32[16,4]\n"
      "  %c = concat(%a, %b) {axis = 0} : f32[32,4]\n  %d = concat(%b, %a) {axis = 0} : f32[32,4]\n"
      "  %r = tanh(%c) : f32[32,4]\n  %s = sigmoid(%d) : f32[32,4]\n  return %r, %s\n}\n");
  ASSERT_TRUE(m);
  const MemoryPlan plan = runOnCpu(*m->functions().front(), {randomF32({16, 4}, 4)});
  ASSERT_TRUE(bufferNamed(plan, "c") && bufferNamed(plan, "d")) << plan.str();
  EXPECT_EQ(bufferNamed(plan, "c")->copiedOperands.size() + bufferNamed(plan, "d")->copiedOperands.size(), 2u)
      << plan.str();
}

/// Convolutions (oneDNN on the CPU, blocked or channels last as the CPU
/// target chooses) feeding a chain of concats: at batch 1 channels first
/// their outputs go into contiguous slices; channels last or at batch 2 a
/// library call cannot write a strided slice and its output is copied, once.
std::string convChain(int64_t n) {
  const std::string b = std::to_string(n);
  auto t = [&](int c) { return "f32[" + b + "," + std::to_string(c) + ",8,8]"; };
  return "func @conv(%x: " + t(16) + ", %w: f32[16,16,3,3], %v: f32[16,32,3,3]) -> " + t(48) + " {\n" +
         "  %x0 = relu(%x) : " + t(16) + "\n" +
         "  %y1 = conv(%x0, %w) {dilations = [1, 1], groups = 1, pads = [1, 1, 1, 1], strides = [1, 1]} : " + t(16) +
         "\n  %c1 = concat(%x0, %y1) {axis = 1} : " + t(32) + "\n" +
         "  %r1 = relu(%c1) : " + t(32) + "\n" +
         "  %y2 = conv(%r1, %v) {dilations = [1, 1], groups = 1, pads = [1, 1, 1, 1], strides = [1, 1]} : " + t(16) +
         "\n  %c2 = concat(%x0, %y1, %y2) {axis = 1} : " + t(48) + "\n" +
         "  %r2 = sigmoid(%c2) : " + t(48) + "\n  return %r2\n}\n";
}

TEST(ConcatSlicesTest, ConvolutionsWriteIntoTheirSlicesOrAreCopiedOnce) {
  for (int64_t n : {1, 2}) {
    SCOPED_TRACE("batch " + std::to_string(n));
    auto m = parseVerified(convChain(n));
    ASSERT_TRUE(m);
    const Function& f = *m->functions().front();
    const std::vector<Tensor> in = {randomF32({n, 16, 8, 8}, 5), randomF32({16, 16, 3, 3}, 6),
                                    randomF32({16, 32, 3, 3}, 7)};
    const MemoryPlan plan = runOnCpu(f, in);
    // The chain shares one buffer, so no operand is copied twice.
    const MemoryPlan::Buffer* c1 = bufferNamed(plan, "c1");
    const MemoryPlan::Buffer* c2 = bufferNamed(plan, "c2");
    ASSERT_TRUE(c1 && c2) << plan.str();
    EXPECT_EQ(c1->sliceOf, static_cast<int>(c2 - plan.buffers.data())) << plan.str();
    EXPECT_LE(c1->copiedOperands.size() + c2->copiedOperands.size(), 3u) << plan.str();
  }
}

/// 1-d convolutions stay channels first, in the blocked layout oneDNN
/// chooses (nCw16c), reordered into the result's buffer: at batch 1 that
/// buffer is a contiguous slice of the concat's, so nothing is copied.
TEST(ConcatSlicesTest, BlockedConvolutionsWriteIntoContiguousSlices) {
  auto m = parseVerified(
      "func @conv1d(%x: f32[1,16,32], %w: f32[16,16,3], %v: f32[16,32,3]) -> f32[1,48,32] {\n"
      "  %x0 = relu(%x) : f32[1,16,32]\n"
      "  %y1 = conv(%x0, %w) {dilations = [1], groups = 1, pads = [1, 1], strides = [1]} : f32[1,16,32]\n"
      "  %c1 = concat(%x0, %y1) {axis = 1} : f32[1,32,32]\n"
      "  %r1 = relu(%c1) : f32[1,32,32]\n"
      "  %y2 = conv(%r1, %v) {dilations = [1], groups = 1, pads = [1, 1], strides = [1]} : f32[1,16,32]\n"
      "  %c2 = concat(%x0, %y1, %y2) {axis = 1} : f32[1,48,32]\n"
      "  %r2 = sigmoid(%c2) : f32[1,48,32]\n  return %r2\n}\n");
  ASSERT_TRUE(m);
  const std::vector<Tensor> in = {randomF32({1, 16, 32}, 13), randomF32({16, 16, 3}, 14), randomF32({16, 32, 3}, 15)};
  const MemoryPlan plan = runOnCpu(*m->functions().front(), in);
  const MemoryPlan::Buffer* c2 = bufferNamed(plan, "c2");
  ASSERT_TRUE(c2) << plan.str();
  EXPECT_TRUE(c2->copiedOperands.empty()) << plan.str();
  for (const auto& [name, offset] : std::vector<std::pair<std::string, int64_t>>{{"y1", 2048}, {"y2", 4096}}) {
    const MemoryPlan::Buffer* b = bufferNamed(plan, name);
    ASSERT_TRUE(b) << plan.str();
    EXPECT_EQ(b->sliceOf, static_cast<int>(c2 - plan.buffers.data())) << name << "\n" << plan.str();
    EXPECT_EQ(b->sliceOffset, offset) << name;
    EXPECT_TRUE(b->strides.empty()) << name;
  }
}

/// Random DenseNet-like chains along axis 0 (every slice contiguous, at
/// multiples of 64 bytes): each layer concatenates a random run of the
/// features so far, sometimes in another order, and some features are also
/// returned or read again later. The plan's slices never overlap another
/// live value (MemoryPlanTest's checks hold for them), and the CPU runs
/// them as the interpreter does.
TEST(ConcatSlicesTest, RandomChainsMatchTheInterpreter) {
  std::mt19937 rng(28);
  int placed = 0, copied = 0;
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<std::string> features = {"f0"};
    std::string body = "  %f0 = exp(%x) : f32[16]\n", returned = "%f0", types = "f32[16]";
    const int layers = 2 + static_cast<int>(rng() % 5);
    for (int l = 1; l <= layers; ++l) {
      const size_t n = features.size();
      size_t start = rng() % n, count = 1 + rng() % (n - start);
      std::vector<std::string> run(features.begin() + static_cast<std::ptrdiff_t>(start),
                                   features.begin() + static_cast<std::ptrdiff_t>(start + count));
      if (rng() % 4 == 0) std::reverse(run.begin(), run.end());
      const std::string size = std::to_string(16 * run.size()), c = "c" + std::to_string(l);
      body += "  %" + c + " = concat(";
      for (size_t k = 0; k < run.size(); ++k) body += (k ? ", %" : "%") + run[k];
      body += ") {axis = 0} : f32[" + size + "]\n";
      body += "  %r" + std::to_string(l) + " = tanh(%" + c + ") : f32[" + size + "]\n";
      body += "  %s" + std::to_string(l) + " = reduce_sum(%r" + std::to_string(l) +
              ") {axes = [0], keepdims = true} : f32[1]\n";
      const std::string f = "f" + std::to_string(l);
      const std::string from = rng() % 2 ? "%x" : "%" + features[rng() % n];
      body += "  %" + f + " = add(" + from + ", %s" + std::to_string(l) + ") : f32[16]\n";
      features.push_back(f);
      if (rng() % 5 == 0) {
        returned += ", %" + features[rng() % features.size()];
        types += ", f32[16]";
      }
      returned += ", %s" + std::to_string(l);
      types += ", f32[1]";
    }
    const std::string text = "func @f(%x: f32[16]) -> (" + types + ") {\n" + body + "  return " + returned + "\n}\n";
    SCOPED_TRACE(text);
    auto m = parseVerified(text);
    ASSERT_TRUE(m);
    const MemoryPlan plan = runOnCpu(*m->functions().front(), {randomF32({16}, trial)});
    for (const MemoryPlan::Buffer& b : plan.buffers) {
      placed += b.sliceOf >= 0;
      copied += static_cast<int>(b.copiedOperands.size());
      if (b.sliceOf < 0) continue;
      const MemoryPlan::Buffer& root = plan.buffers[static_cast<size_t>(b.sliceOf)];
      EXPECT_EQ(b.offset, root.offset + b.sliceOffset) << b.name << "\n" << plan.str();
      EXPECT_LE(b.sliceOffset + b.size, root.size) << b.name << "\n" << plan.str();
      // Nothing else lives in the concat's bytes while it or a slice does.
      for (const MemoryPlan::Buffer& other : plan.buffers) {
        if (other.sliceOf == b.sliceOf || &other == &root || other.viewOf >= 0 || other.inPlaceOf >= 0) continue;
        const bool overlap = other.offset < root.offset + root.size && root.offset < other.offset + other.size;
        const bool live = other.first <= std::max(root.last, b.last) && b.first <= other.last;
        EXPECT_FALSE(overlap && live) << other.name << " overlaps " << root.name << "\n" << plan.str();
      }
    }
  }
  EXPECT_GT(placed, 10);
  EXPECT_GT(copied, 3);
}

/// A slice that is one run of its input's bytes (an ONNX Split's outputs,
/// channels at batch 1) is a view at an offset; one that is not, or starts
/// off a 64-byte boundary, is computed.
constexpr const char* kSliceViews =
    "func @slice_views(%x: f32[1,32,2,2]) -> (f32[1,16,2,2], f32[1,16,2,2]) {\n"
    "  %a = exp(%x) : f32[1,32,2,2]\n"
    "  %lo = slice(%a) {starts = [0, 0, 0, 0], ends = [1, 16, 2, 2], steps = [1, 1, 1, 1]} : f32[1,16,2,2]\n"
    "  %hi = slice(%a) {starts = [0, 16, 0, 0], ends = [1, 32, 2, 2], steps = [1, 1, 1, 1]} : f32[1,16,2,2]\n"
    "  %odd = slice(%a) {starts = [0, 1, 0, 0], ends = [1, 17, 2, 2], steps = [1, 1, 1, 1]} : f32[1,16,2,2]\n"
    "  %m = mul(%lo, %hi) : f32[1,16,2,2]\n  %n = add(%m, %odd) : f32[1,16,2,2]\n"
    "  %r = tanh(%hi) : f32[1,16,2,2]\n  return %n, %r\n}\n";

TEST(ConcatSlicesTest, ContiguousSlicesAreViews) {
  auto m = parseVerified(kSliceViews);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  const std::vector<Tensor> in = {randomF32({1, 32, 2, 2}, 16)};
  const MemoryPlan plan = runOnCpu(f, in);
  const MemoryPlan::Buffer* hi = bufferNamed(plan, "hi");
  ASSERT_TRUE(hi) << plan.str();
  EXPECT_EQ(hi->viewOffset, 256) << plan.str();
  EXPECT_EQ(hi->offset, bufferNamed(plan, "a")->offset + 256) << plan.str();
  EXPECT_EQ(bufferNamed(plan, "odd")->viewOf, -1) << plan.str();
  auto executor = CpuExecutor::create(f, {.threads = 1, .optLevel = 2});
  ASSERT_TRUE(executor.ok());
  EXPECT_EQ((*executor)->numKernels(in), 5u);  // 7 ops, 2 views
}

TEST(ConcatSlicesTest, EmulatedGpuMatchesTheInterpreter) {
  KILN_REQUIRE_EMULATOR();
  for (const auto& [n, channelsLast] : std::vector<std::pair<int64_t, bool>>{{1, false}, {2, false}, {1, true}}) {
    SCOPED_TRACE("batch " + std::to_string(n) + (channelsLast ? " channels last" : " channels first"));
    auto m = parseVerified(denseChain(n, channelsLast));
    ASSERT_TRUE(m);
    runOnEmulatedGpu(*m->functions().front(),
                     {channelsLast ? randomF32({n, 4, 4, 16}, 8) : randomF32({n, 16, 4, 4}, 8)});
  }
  for (int64_t n : {1, 2}) {
    auto m = parseVerified(convChain(n));
    ASSERT_TRUE(m);
    runOnEmulatedGpu(*m->functions().front(), {randomF32({n, 16, 8, 8}, 9), randomF32({16, 16, 3, 3}, 10),
                                               randomF32({16, 32, 3, 3}, 11)});
  }
  auto m = parseVerified(
      "func @f(%x: f32[16,4]) -> (f32[16,4], f32[48,4]) {\n"
      "  %a = exp(%x) : f32[16,4]\n  %b = neg(%x) : f32[16,4]\n"
      "  %c = concat(%x, %a, %b) {axis = 0} : f32[48,4]\n  %r = tanh(%c) : f32[48,4]\n  return %a, %r\n}\n");
  ASSERT_TRUE(m);
  runOnEmulatedGpu(*m->functions().front(), {randomF32({16, 4}, 12)});
  auto views = parseVerified(kSliceViews);
  ASSERT_TRUE(views);
  runOnEmulatedGpu(*views->functions().front(), {randomF32({1, 32, 2, 2}, 17)});
}

}  // namespace
}  // namespace kiln
