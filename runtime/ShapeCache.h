// The per-shape cache of compilations: one entry per set of input shapes,
// what both executors keep (codegen/cpu/CpuExecutable.h CpuExecutor and
// codegen/cuda/CudaExecutor.h CudaExecutor: a compiled program with its
// runner per shape set) instead of a copy each.
//
// Runs mostly repeat the shapes of the run before, so the entry used last
// is tried first, its shapes compared with the inputs' in place, without
// building a key; only a different set of shapes builds one and looks it
// up. `getOrCompile` compiles on a miss and keeps the result:
//
//   ShapeCache<Compiled> cache;
//   auto c = cache.getOrCompile(inputs, [&]() -> Expected<std::unique_ptr<Compiled>> { ... });
//
// It lives in runtime/ rather than in driver/ with the compiled model
// because the executors that use it are in codegen/, which must not depend
// on driver/ (driver/README.md); it needs nothing but Tensor. Not thread
// safe: like the executors, it serves one call at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "ir/Support.h"
#include "runtime/Tensor.h"

namespace kiln {

template <typename T>
class ShapeCache {
 public:
  /// One shape per input: the key of an entry.
  using Shapes = std::vector<std::vector<int64_t>>;
  using Entries = std::map<Shapes, std::unique_ptr<T>>;

  /// The shapes of `inputs`, as a key.
  static Shapes shapesOf(const std::vector<Tensor>& inputs) {
    Shapes shapes;
    shapes.reserve(inputs.size());
    for (const Tensor& t : inputs) shapes.push_back(t.shape());
    return shapes;
  }

  /// The entry of `inputs`' shapes, or null. A hit becomes the last used.
  T* find(const std::vector<Tensor>& inputs) {
    if (last_ && sameShapes(inputs, last_->first)) return last_->second.get();
    auto it = entries_.find(shapesOf(inputs));
    if (it == entries_.end()) return nullptr;
    last_ = &*it;
    return it->second.get();
  }

  /// Keeps `entry` under `shapes` and makes it the last used; returns it.
  /// An entry already under `shapes` is replaced (a caller compiles only on
  /// a miss, so none is).
  T* add(Shapes shapes, std::unique_ptr<T> entry) {
    auto [it, inserted] = entries_.try_emplace(std::move(shapes));
    it->second = std::move(entry);
    last_ = &*it;
    return it->second.get();
  }

  /// The entry of `inputs`' shapes; on a miss, `compile()` (returning
  /// Expected<std::unique_ptr<T>>) makes it and it is kept. A failed
  /// compile keeps nothing and returns its error.
  template <typename Compile>
  Expected<T*> getOrCompile(const std::vector<Tensor>& inputs, Compile&& compile) {
    if (T* found = find(inputs)) return found;
    auto entry = compile();
    if (!entry) return entry.takeError();
    return add(shapesOf(inputs), std::move(*entry));
  }

  /// The entry the last find, add or getOrCompile gave, or null.
  T* last() const { return last_ ? last_->second.get() : nullptr; }
  /// Every entry by its shapes, in the order of the shapes.
  const Entries& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  static bool sameShapes(const std::vector<Tensor>& inputs, const Shapes& shapes) {
    if (inputs.size() != shapes.size()) return false;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].shape() != shapes[i]) return false;
    return true;
  }

  Entries entries_;
  // Map nodes stay put as others are added, so the last entry is kept as a
  // pointer to its node: its shapes and its value.
  typename Entries::value_type* last_ = nullptr;
};

}  // namespace kiln
