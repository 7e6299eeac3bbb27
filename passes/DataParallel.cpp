// The `data-parallel` pass (DataParallel.h): the gradient all-reduces of a
// data-parallel training step, in buckets, each right after the op that
// produces its last gradient.
#include "passes/DataParallel.h"

#include <algorithm>
#include <map>

#include "ir/Builder.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

struct Gradient {
  size_t result = 0;  // its index among the function's results
  Value* value = nullptr;
  int64_t position = -1;  // the index of the op producing it; -1 for arguments and before all ops
  int64_t bytes = 0;
};

class DataParallelPass : public Pass {
 public:
  std::string_view name() const override { return "data-parallel"; }
  Expected<bool> run(Module& m, const PassContext& ctx) override {
    bool changed = false;
    DataParallelOptions options;
    options.bucketCapBytes = ctx.bucketCapBytes;
    for (const auto& f : m.functions()) {
      auto buckets = insertGradientAllReduces(*f, options);
      if (!buckets) return buckets.takeError();
      changed |= !buckets->empty();
    }
    return changed;
  }
};

}  // namespace

Expected<std::vector<GradientBucket>> insertGradientAllReduces(Function& f, const DataParallelOptions& options) {
  Op* ret = f.returnOp();
  if (!ret) return Error("function @" + f.name() + " has no return", f.loc());
  std::map<const Op*, int64_t> position;
  int64_t index = 0;
  for (const auto& op : f.ops()) position[op.get()] = index++;

  // The gradients, in the order they are produced.
  std::vector<Gradient> grads;
  for (size_t r = 0; r < ret->numOperands(); ++r) {
    if (!f.resultName(r).starts_with("grad.")) continue;
    Value* v = ret->operand(r);
    const TensorType& type = v->type();
    if (!type.isStatic())
      return Error("data-parallel: gradient '" + f.resultName(r) + "' of @" + f.name() + " is " + type.str() +
                       "; buckets need static shapes (the training step is specialized to its batch size)",
                   f.loc());
    if (!isFloat(type.dtype))
      return Error("data-parallel: gradient '" + f.resultName(r) + "' of @" + f.name() + " is " + type.str() +
                       ", not a float tensor",
                   f.loc());
    Gradient g;
    g.result = r;
    g.value = v;
    g.position = v->isArgument() ? -1 : position.at(v->definingOp());
    g.bytes = numElements(type.shape) * static_cast<int64_t>(dtypeSize(type.dtype));
    grads.push_back(g);
  }
  std::stable_sort(grads.begin(), grads.end(),
                   [](const Gradient& a, const Gradient& b) { return a.position < b.position; });

  // Buckets: consecutive gradients of one dtype up to the cap (a larger
  // gradient is a bucket of its own).
  std::vector<std::vector<Gradient>> buckets;
  std::vector<int64_t> filled;   // bytes, per bucket
  std::map<DType, size_t> open;  // dtype -> its bucket being filled
  for (const Gradient& g : grads) {
    const DType dtype = g.value->type().dtype;
    auto it = open.find(dtype);
    if (it == open.end() || filled[it->second] + g.bytes > options.bucketCapBytes) {
      buckets.emplace_back();
      filled.push_back(0);
      it = open.insert_or_assign(dtype, buckets.size() - 1).first;
    }
    buckets[it->second].push_back(g);
    filled[it->second] += g.bytes;
  }
  // Buckets are issued in the order their last gradient is produced.
  std::stable_sort(buckets.begin(), buckets.end(), [](const auto& a, const auto& b) {
    return a.back().position < b.back().position;
  });

  Builder b(f);
  b.setLocation(f.loc());
  std::vector<GradientBucket> out;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const std::vector<Gradient>& bucket = buckets[k];
    // Right after the op producing the bucket's last gradient.
    Op* after = bucket.back().position >= 0 ? bucket.back().value->definingOp() : nullptr;
    Op* before = nullptr;
    bool next = after == nullptr;
    for (const auto& op : f.ops()) {
      if (next) {
        before = op.get();
        break;
      }
      next = op.get() == after;
    }
    b.setInsertionPoint(before);
    const DType dtype = bucket.front().value->type().dtype;
    const AttrMap attrs = {{"reduction", Attribute(options.reduction)}, {"bucket", Attribute(static_cast<int64_t>(k))}};
    const std::string name = "bucket" + std::to_string(k);
    GradientBucket info;
    std::vector<Value*> reduced;
    if (bucket.size() == 1) {
      KILN_TRY_VALUE(r, b.value(OpKind::AllReduce, {bucket.front().value}, attrs));
      r->setName(name);
      reduced.push_back(r);
    } else {
      // Flattened and packed into one vector, as DDP copies gradients into
      // a bucket's buffer, then split back.
      std::vector<Value*> flat;
      for (const Gradient& g : bucket) {
        const int64_t n = numElements(g.value->type().shape);
        if (g.value->type().rank() == 1) {
          flat.push_back(g.value);
          continue;
        }
        KILN_TRY_VALUE(v, b.value(OpKind::Reshape, {g.value}, {}, {TensorType{dtype, staticShape({n})}}));
        flat.push_back(v);
      }
      KILN_TRY_VALUE(packed, b.value(OpKind::Concat, flat, {{"axis", Attribute(int64_t{0})}}));
      KILN_TRY_VALUE(all, b.value(OpKind::AllReduce, {packed}, attrs));
      all->setName(name);
      // Split back at the end, where the update reads the gradients: a
      // read of the bucket right after it would wait for it there.
      b.setInsertionPoint(ret);
      int64_t offset = 0;
      for (const Gradient& g : bucket) {
        const int64_t n = numElements(g.value->type().shape);
        KILN_TRY_VALUE(part, b.value(OpKind::Slice, {all},
                                     {{"starts", Attribute(std::vector<int64_t>{offset})},
                                      {"ends", Attribute(std::vector<int64_t>{offset + n})},
                                      {"steps", Attribute(std::vector<int64_t>{1})}}));
        if (g.value->type().rank() == 1) {
          reduced.push_back(part);
        } else {
          KILN_TRY_VALUE(shaped, b.value(OpKind::Reshape, {part}, {}, {g.value->type()}));
          reduced.push_back(shaped);
        }
        offset += n;
      }
    }
    for (size_t i = 0; i < bucket.size(); ++i) {
      ret->setOperand(bucket[i].result, reduced[i]);
      info.gradients.push_back(f.resultName(bucket[i].result).substr(5));
      info.bytes += bucket[i].bytes;
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::unique_ptr<Pass> createDataParallelPass() { return std::make_unique<DataParallelPass>(); }

}  // namespace kiln
