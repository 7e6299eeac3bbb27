// runtime/ShapeCache.h, the per-shape cache both executors keep: one
// compile per set of input shapes, the last entry used found again (also
// after others were added), a failed compile keeping nothing, and shapes
// that differ only in rank or in the number of inputs kept apart.
#include "runtime/ShapeCache.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln {
namespace {

struct Entry {
  int id;
};

std::vector<Tensor> inputs(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<Tensor> tensors;
  for (const auto& shape : shapes) tensors.emplace_back(DType::F32, shape);
  return tensors;
}

/// A cache whose compile numbers the entries it makes and counts its calls.
struct Counting {
  ShapeCache<Entry> cache;
  int compiles = 0;
  Entry* get(const std::vector<Tensor>& in) {
    auto entry = cache.getOrCompile(
        in, [&]() -> Expected<std::unique_ptr<Entry>> { return std::make_unique<Entry>(Entry{compiles++}); });
    EXPECT_TRUE(entry) << entry.error().message();
    return entry ? *entry : nullptr;
  }
};

TEST(ShapeCacheTest, CompilesOncePerSetOfShapes) {
  Counting c;
  const auto a = inputs({{2, 3}, {3}});
  const auto b = inputs({{4, 3}, {3}});
  Entry* first = c.get(a);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->id, 0);
  EXPECT_EQ(c.get(a), first);  // the last entry's fast path
  EXPECT_EQ(c.compiles, 1);
  Entry* second = c.get(b);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->id, 1);
  EXPECT_EQ(c.get(a), first);  // found in the map, not the last used
  EXPECT_EQ(c.get(b), second);
  EXPECT_EQ(c.compiles, 2);
  EXPECT_EQ(c.cache.size(), 2u);
}

TEST(ShapeCacheTest, LastIsTheEntryLastFoundOrAdded) {
  Counting c;
  EXPECT_EQ(c.cache.last(), nullptr);
  EXPECT_EQ(c.cache.find(inputs({{1}})), nullptr);
  Entry* one = c.get(inputs({{1}}));
  EXPECT_EQ(c.cache.last(), one);
  // Many entries later (map nodes added around it), the first is still
  // found through the last-used path and through the map.
  for (int n = 2; n < 40; ++n) c.get(inputs({{n}}));
  EXPECT_EQ(c.cache.last()->id, 38);
  EXPECT_EQ(c.cache.find(inputs({{1}})), one);
  EXPECT_EQ(c.cache.last(), one);
  EXPECT_EQ(c.cache.find(inputs({{1}})), one);
  EXPECT_EQ(c.compiles, 39);
}

TEST(ShapeCacheTest, RankAndInputCountArePartOfTheKey) {
  Counting c;
  Entry* scalar = c.get(inputs({{}}));
  Entry* vector1 = c.get(inputs({{1}}));
  Entry* matrix = c.get(inputs({{1, 1}}));
  Entry* two = c.get(inputs({{1}, {1}}));
  Entry* none = c.get({});
  EXPECT_EQ(c.compiles, 5);
  EXPECT_NE(scalar, vector1);
  EXPECT_NE(vector1, matrix);
  EXPECT_NE(vector1, two);
  // The last entry (no inputs) must not answer for one input, nor one
  // input's entry for two.
  EXPECT_EQ(c.get(inputs({{1}})), vector1);
  EXPECT_EQ(c.get(inputs({{1}, {1}})), two);
  EXPECT_EQ(c.get({}), none);
  EXPECT_EQ(c.compiles, 5);
}

TEST(ShapeCacheTest, FailedCompileKeepsNothing) {
  ShapeCache<Entry> cache;
  int calls = 0;
  const auto in = inputs({{5}});
  auto failed = cache.getOrCompile(in, [&]() -> Expected<std::unique_ptr<Entry>> {
    ++calls;
    return Error("op 'foo' cannot be lowered");
  });
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message(), "op 'foo' cannot be lowered");
  EXPECT_TRUE(cache.empty());
  EXPECT_EQ(cache.last(), nullptr);
  // The next call compiles again.
  auto ok = cache.getOrCompile(in, [&]() -> Expected<std::unique_ptr<Entry>> {
    ++calls;
    return std::make_unique<Entry>(Entry{7});
  });
  ASSERT_TRUE(ok);
  EXPECT_EQ((*ok)->id, 7);
  EXPECT_EQ(calls, 2);
}

TEST(ShapeCacheTest, AddKeysByTheShapesGiven) {
  // A stored program is added under its arguments' shapes, not an input's.
  ShapeCache<Entry> cache;
  Entry* stored = cache.add({{2, 2}}, std::make_unique<Entry>(Entry{1}));
  EXPECT_EQ(cache.last(), stored);
  EXPECT_EQ(cache.find(inputs({{2, 2}})), stored);
  EXPECT_EQ(cache.find(inputs({{2, 3}})), nullptr);
  ASSERT_EQ(cache.entries().size(), 1u);
  EXPECT_EQ(cache.entries().begin()->first, (ShapeCache<Entry>::Shapes{{2, 2}}));
  // Adding under the same shapes replaces the entry.
  Entry* replaced = cache.add({{2, 2}}, std::make_unique<Entry>(Entry{2}));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.find(inputs({{2, 2}}))->id, 2);
  EXPECT_EQ(cache.last(), replaced);
}

}  // namespace
}  // namespace kiln
