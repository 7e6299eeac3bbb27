// planMemory on randomized functions (elementwise chains that may run in
// place, concats that grow buffers, reductions that shrink them, casts that
// change the element size, constants, values returned midway): every plan
// is checked against live ranges computed here from the values' users, and
// must never let two buffers that are live at the same kernel share memory,
// except a result written in place over the input that dies there. Also:
// the printed form, and the error for a symbolic shape.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "passes/MemoryPlan.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::parseOk;

int64_t alignUp(int64_t n) {
  return (n + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
}

/// A random function of 1-D tensors as text IR, with `numOps` ops.
std::string randomFunction(std::mt19937& rng, int numOps) {
  struct Entry {
    std::string name;
    std::string dtype;
    int64_t n;
  };
  auto pick = [&](int64_t bound) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(bound)); };
  std::vector<Entry> pool;
  std::string signature, body;
  for (int i = 0; i < 3; ++i) {
    Entry e{"x" + std::to_string(i), "f32", 1 + pick(48)};
    signature += (i ? ", %" : "%") + e.name + ": f32[" + std::to_string(e.n) + "]";
    pool.push_back(e);
  }
  auto type = [](const Entry& e) { return e.dtype + "[" + std::to_string(e.n) + "]"; };
  for (int i = 0; i < numOps; ++i) {
    // Recent values are picked more often, so that chains form and die.
    auto any = [&]() -> const Entry& {
      int64_t window = std::min<int64_t>(static_cast<int64_t>(pool.size()), 6);
      return rng() % 3 ? pool[pool.size() - 1 - pick(window)] : pool[pick(static_cast<int64_t>(pool.size()))];
    };
    Entry a = any();
    Entry out{"v" + std::to_string(i), a.dtype, a.n};
    std::string line;
    switch (pick(7)) {
      case 0:
      case 1:
        line = "exp(%" + a.name + ")";
        break;
      case 2: {  // add of two values of one type; the same value twice when no other matches
        Entry b = a;
        for (int tries = 0; tries < 8; ++tries) {
          const Entry& c = any();
          if (c.dtype == a.dtype && c.n == a.n) b = c;
        }
        line = "add(%" + a.name + ", %" + b.name + ")";
        break;
      }
      case 3: {
        Entry b = any();
        if (b.dtype != a.dtype) b = a;
        out.n = a.n + b.n;
        line = "concat(%" + a.name + ", %" + b.name + ") {axis = 0}";
        break;
      }
      case 4:
        out.n = 1;
        line = "reduce_sum(%" + a.name + ") {axes = [0], keepdims = true}";
        break;
      case 5:
        out.dtype = a.dtype == "f32" ? "f16" : "f32";
        line = "cast(%" + a.name + ")";
        break;
      case 6:
        out.dtype = "f32";
        out.n = 1 + pick(32);
        line = "constant() {value = dense<f32[" + std::to_string(out.n) + "]>[";
        for (int64_t k = 0; k < out.n; ++k) line += k ? ", 1.0" : "1.0";
        line += "]}";
        break;
    }
    body += "  %" + out.name + " = " + line + " : " + type(out) + "\n";
    pool.push_back(out);
  }
  // The last value and a few random ones are returned.
  std::vector<Entry> results{pool.back()};
  for (int64_t k = pick(3); k > 0; --k) results.push_back(pool[3 + pick(numOps)]);
  std::string resultTypes, returned;
  for (size_t i = 0; i < results.size(); ++i) {
    resultTypes += (i ? ", " : "") + type(results[i]);
    returned += (i ? ", %" : "%") + results[i].name;
  }
  return "func @f(" + signature + ") -> (" + resultTypes + ") {\n" + body + "  return " + returned + "\n}\n";
}

/// Checks `plan` of `f` against what the function says directly.
void checkPlan(const Function& f, const MemoryPlan& plan, const std::string& text) {
  SCOPED_TRACE(text + plan.str());
  // Kernel indices and live ranges from the values' users.
  std::unordered_map<const Op*, int> kernelIndex;
  std::set<const Value*> returned(f.returnOp()->operands().begin(), f.returnOp()->operands().end());
  std::set<const Value*> expected;
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return || op->kind() == OpKind::Constant) continue;
    kernelIndex[op.get()] = static_cast<int>(kernelIndex.size());
    for (const Value* v : op->results())
      if (!returned.count(v)) expected.insert(v);
  }
  EXPECT_EQ(plan.numKernels, static_cast<int>(kernelIndex.size()));
  ASSERT_EQ(plan.buffers.size(), expected.size());

  int64_t total = 0;
  for (const MemoryPlan::Buffer& b : plan.buffers) {
    EXPECT_TRUE(expected.count(b.value)) << b.name;
    const TensorType& t = b.value->type();
    EXPECT_EQ(b.size, numElements(t.shape) * static_cast<int64_t>(dtypeSize(t.dtype))) << b.name;
    EXPECT_EQ(b.first, kernelIndex.at(b.value->definingOp())) << b.name;
    int last = b.first;
    for (const Op* user : b.value->users()) {
      if (user->kind() == OpKind::Return) continue;
      // A concat reads the operands it copies (the others are in their
      // slices already).
      if (const MemoryPlan::Buffer* c = user->kind() == OpKind::Concat ? plan.find(user->result()) : nullptr) {
        bool copies = false;
        for (int k : c->copiedOperands) copies = copies || user->operand(static_cast<size_t>(k)) == b.value;
        if (!copies) continue;
      }
      last = std::max(last, kernelIndex.at(user));
    }
    EXPECT_EQ(b.last, last) << b.name;
    EXPECT_EQ(b.alignment, MemoryPlan::kAlignment);
    EXPECT_EQ(b.offset % MemoryPlan::kAlignment, 0) << b.name;
    EXPECT_LE(b.offset + b.size, plan.peak) << b.name;
    total += alignUp(b.size);
    if (b.inPlaceOf >= 0) {
      const MemoryPlan::Buffer& in = plan.buffers[b.inPlaceOf];
      EXPECT_TRUE(b.value->definingOp()->info().isElementwise()) << b.name;
      EXPECT_EQ(in.last, b.first) << b.name << " in place of " << in.name << ", which is read later";
      EXPECT_EQ(in.size, b.size) << b.name;
      EXPECT_EQ(in.offset, b.offset) << b.name;
    }
  }
  EXPECT_EQ(plan.noReuseTotal, total);
  EXPECT_LE(plan.peak, plan.noReuseTotal);
  EXPECT_EQ(plan.peak % MemoryPlan::kAlignment, 0);

  // A value in a slice of a concat's buffer lies inside it, and the
  // concat's operands in their slices never overlap each other.
  auto rootOf = [&](size_t i) { return plan.buffers[i].sliceOf >= 0 ? plan.buffers[i].sliceOf : static_cast<int>(i); };
  auto isConcat = [&](const MemoryPlan::Buffer& b) { return b.value->definingOp()->kind() == OpKind::Concat; };
  for (const MemoryPlan::Buffer& b : plan.buffers) {
    if (b.sliceOf < 0) continue;
    const MemoryPlan::Buffer& root = plan.buffers[b.sliceOf];
    EXPECT_EQ(root.sliceOf, -1) << b.name;
    EXPECT_TRUE(isConcat(root)) << b.name;
    EXPECT_EQ(b.offset, root.offset + b.sliceOffset) << b.name;
    EXPECT_TRUE(b.strides.empty()) << b.name << ": a slice along axis 0 is contiguous";
    EXPECT_LE(b.sliceOffset + b.size, root.size) << b.name;
    // Live while the root group is: its first writer to its last reader.
    EXPECT_TRUE(b.first <= root.first) << b.name << " is written after the concat reads it";
  }
  // A slice's bytes must hold from its writer until the concat's buffer's
  // last reader, and the concat's whole buffer from its first slice's writer.
  std::vector<int> first(plan.buffers.size()), last(plan.buffers.size());
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    first[i] = plan.buffers[i].first;
    last[i] = plan.buffers[i].last;
  }
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const int root = plan.buffers[i].sliceOf;
    if (root < 0) continue;
    last[i] = std::max(last[i], plan.buffers[root].last);
    first[root] = std::min(first[root], plan.buffers[i].first);
  }
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    for (size_t j = i + 1; j < plan.buffers.size(); ++j) {
      const MemoryPlan::Buffer& a = plan.buffers[i];
      const MemoryPlan::Buffer& b = plan.buffers[j];
      bool liveTogether = first[i] <= last[j] && first[j] <= last[i];
      bool overlap = a.offset < b.offset + b.size && b.offset < a.offset + a.size;
      bool inPlace = b.inPlaceOf == static_cast<int>(i);
      // A concat shares bytes with the values in its slices (and a chained
      // concat with the larger one it is a prefix of).
      bool sliced = rootOf(i) == rootOf(j) && (isConcat(a) || isConcat(b));
      EXPECT_FALSE(liveTogether && overlap && !inPlace && !sliced)
          << a.name << " and " << b.name << " are live together and overlap in memory";
    }
  }
}

TEST(MemoryPlanTest, RandomFunctionsNeverOverlapLiveBuffers) {
  std::mt19937 rng(20261123);
  int inPlace = 0, reused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string text = randomFunction(rng, 4 + static_cast<int>(rng() % 40));
    auto m = parseOk(text);
    ASSERT_TRUE(m);
    const Function& f = *m->functions()[0];
    Expected<MemoryPlan> plan = planMemory(f);
    ASSERT_TRUE(plan.ok()) << plan.error().str() << "\n" << text;
    checkPlan(f, *plan, text);
    for (const MemoryPlan::Buffer& b : plan->buffers) inPlace += b.inPlaceOf >= 0;
    reused += plan->peak < plan->noReuseTotal;
  }
  // The generator exercises both kinds of reuse, not only the trivial plans.
  EXPECT_GT(inPlace, 100);
  EXPECT_GT(reused, 150);
}

TEST(MemoryPlanTest, PrintsOneLinePerBuffer) {
  auto m = parseOk(R"(func @f(%x: f32[16]) -> f32[1] {
  %a = concat(%x, %x) {axis = 0} : f32[32]
  %b = exp(%a) : f32[32]
  %"c/d" = reduce_sum(%b) {axes = [0], keepdims = true} : f32[1]
  %e = neg(%"c/d") : f32[1]
  %s = reduce_sum(%e) {axes = [0], keepdims = true} : f32[1]
  return %s
}
)");
  ASSERT_TRUE(m);
  Expected<MemoryPlan> plan = planMemory(*m->functions()[0]);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->str(),
            "%a: offset 0, size 128, live [0, 1], copies operands [0, 1]\n"
            "%b: offset 0, size 128, live [1, 2], in place of %a\n"
            "%\"c/d\": offset 128, size 4, live [2, 3]\n"
            "%e: offset 128, size 4, live [3, 4], in place of %\"c/d\"\n"
            "peak 192 bytes, no reuse 384 bytes\n");
  EXPECT_EQ(plan->find(m->functions()[0]->argument(0)), nullptr);
}

TEST(MemoryPlanTest, SymbolicShapeIsAnErrorNamingTheValue) {
  const char* text = R"(func @f(%x: f32[N]) -> f32[N] {
  %a = exp(%x) : f32[N]
  %b = neg(%a) : f32[N]
  return %b
}
)";
  auto m = parseOk(text, "memory-plan-test.kir");
  ASSERT_TRUE(m);
  Expected<MemoryPlan> plan = planMemory(*m->functions()[0]);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().str(),
            "memory-plan-test.kir:2:3: error: 'exp' cannot plan memory for %a of type f32[N]: the memory plan needs "
            "static shapes (specialize the inputs' shapes first)");
}

}  // namespace
}  // namespace kiln
