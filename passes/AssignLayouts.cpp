// The `assign-layouts` pass: picks one layout for the activations of a
// convolutional net as a whole. The convolutions that the target computes
// faster channels last (oneDNN's brgemm convolutions read and write
// [N, H, W, C] without reordering) become `conv {channels_last}`, and the
// values between them stay channels last through the ops that do not care
// where the channel dim is: elementwise ops (a per-channel operand is
// transposed with them, a constant folds), reductions (their axes renamed),
// concatenations (their axis renamed), slices and pads (their per-dim
// lists permuted), pooling (`channels_last` too), and channel shuffles
// (ShuffleNet's reshape [N,C,H,W] -> [N,g,C/g,H,W], transpose of the two
// channel dims, reshape back: channels last, the same split, swap and
// merge of the last dim). A batch_norm (inference form) is expanded into
// its elementwise ops first (as `decompose` would later), so it is carried
// too. Transposes are left only where a value crosses into or out of that
// region: the net's input, an op the pass does not carry through (another
// reshape), and the results.
// ONNX Runtime's NCHWc transformer and XLA's layout assignment do the same
// for their layouts.
//
//   %y = conv(%x, %w, %b) : f32[1,64,56,56]
//   %r = relu(%y) : f32[1,64,56,56]
//   %z = conv(%r, %w2) : f32[1,64,56,56]
//   %s = add(%z, %y) : f32[1,64,56,56]
//   %m = reduce_mean(%s) {axes = [2, 3]} : f32[1,64]
// becomes
//   %xt = transpose(%x) {perm = [0, 2, 3, 1]} : f32[1,56,56,64]
//   %y' = conv(%xt, %w, %b) {channels_last = true} : f32[1,56,56,64]
//   %r' = relu(%y') : f32[1,56,56,64]
//   %z' = conv(%r', %w2) {channels_last = true} : f32[1,56,56,64]
//   %s' = add(%z', %y') : f32[1,56,56,64]
//   %m' = reduce_mean(%s') {axes = [1, 2]} : f32[1,64]
//
// Only 2-d convolutions (rank-4 values) are assigned. A function holding a
// conv_transpose or a conv_weight_grad (a training step's backward pass,
// whose convolutions read the forward values channels first) is left as it
// is; conv_weight_grad marks the steps whose only convolutions read the
// net's input, which need no conv_transpose for dx.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "ir/Builder.h"
#include "passes/Decompose.h"
#include "passes/Pass.h"
#include "passes/Target.h"

namespace kiln {

namespace {

/// [N, C, H, W] -> [N, H, W, C], and back.
const std::vector<int64_t> kToChannelsLast = {0, 2, 3, 1};
const std::vector<int64_t> kToChannelsFirst = {0, 3, 1, 2};

/// Where channels-first dim `axis` of a rank-4 value is once channels last.
int64_t channelsLastAxis(int64_t axis) { return axis == 0 ? 0 : axis == 1 ? 3 : axis - 1; }

bool isRank4Static(const Value* v) { return v->type().isStatic() && v->type().rank() == 4; }

/// Composites that act on each element alone, as unary ops do.
bool isElementwiseComposite(OpKind k) {
  return k == OpKind::Gelu || k == OpKind::Silu || k == OpKind::LeakyRelu || k == OpKind::Elu ||
         k == OpKind::Softplus;
}

bool isElementwise(const Op& op) { return op.info().isElementwise() || isElementwiseComposite(op.kind()); }

class Assigner {
 public:
  Assigner(Function& f, const Target& target) : f_(f), target_(target), b_(f) {}

  Expected<bool> run() {
    bool assigns = false;
    for (const auto& op : f_.ops()) {
      if (op->kind() == OpKind::ConvTranspose || op->kind() == OpKind::ConvWeightGrad) return false;
      assigns = assigns || (op->kind() == OpKind::Conv && !op->getBool("channels_last") &&
                            isRank4Static(op->operand(0)) && isRank4Static(op->result()) &&
                            target_.prefersChannelsLast(*op));
    }
    if (!assigns) return false;
    // A batch norm (inference form) becomes its elementwise ops here rather
    // than in `decompose`, later: those are carried channels last, with the
    // per-channel operands folded, where the batch norm would need a
    // transpose on each side (DenseNet's BN-ReLU after each concat, before
    // the layer's conv); after a conv they become its post-ops.
    std::vector<Op*> norms;
    for (const auto& op : f_.ops())
      if (op->kind() == OpKind::BatchNorm && isRank4Static(op->operand(0))) norms.push_back(op.get());
    for (Op* norm : norms)
      if (Status s = decomposeOp(*norm); !s) return s.takeError();
    std::vector<Op*> ops;
    for (const auto& op : f_.ops()) ops.push_back(op.get());
    for (Op* op : ops) {
      if (shuffleInner_.count(op)) {  // built with the shuffle's first reshape
        replaced_.push_back(op);
        continue;
      }
      auto converted = convert(*op);
      if (!converted) return converted.takeError();
      if (*converted) {
        replaced_.push_back(op);
        continue;
      }
      // An op that stays channels first reads the channels-first form.
      for (size_t i = 0; i < op->numOperands(); ++i)
        if (channelsLast_.count(op->operand(i))) {
          auto first = channelsFirst(op->operand(i), op);
          if (!first) return first.takeError();
          op->setOperand(i, *first);
        }
    }
    // The replaced ops now feed only each other: erase them last to first.
    for (auto it = replaced_.rbegin(); it != replaced_.rend(); ++it)
      if (!(*it)->hasUses()) f_.erase(*it);
    return !replaced_.empty();
  }

 private:
  /// Builds `op`'s channels-last form when it has one here; true when built
  /// (the old op then has a channels-last twin in channelsLast_).
  Expected<bool> convert(Op& op) {
    // A reduction's result may have fewer dims than its operand.
    if (op.info().opClass == OpClass::Reduce) return convertReduce(op);
    if (op.kind() == OpKind::Reshape) return convertShuffle(op);
    if (op.numResults() != 1 || !isRank4Static(op.result())) return false;
    if (op.kind() == OpKind::Conv && !op.getBool("channels_last") && isRank4Static(op.operand(0)) &&
        target_.prefersChannelsLast(op)) {
      auto x = channelsLastForm(op.operand(0), &op);
      if (!x) return x.takeError();
      std::vector<Value*> operands(op.operands().begin(), op.operands().end());
      operands[0] = *x;
      AttrMap attrs = op.attrs();
      attrs["channels_last"] = Attribute(true);
      return rebuild(op, std::move(operands), std::move(attrs));
    }
    const bool readsChannelsLast = std::any_of(op.operands().begin(), op.operands().end(),
                                               [&](Value* v) { return channelsLast_.count(v) > 0; });
    if (!readsChannelsLast) return false;
    if (!std::all_of(op.operands().begin(), op.operands().end(), [&](Value* v) { return canTakeChannelsLast(v); }))
      return false;
    if (isElementwise(op)) {
      std::vector<Value*> operands;
      for (Value* v : op.operands()) {
        auto form = channelsLastForm(v, &op);
        if (!form) return form.takeError();
        operands.push_back(*form);
      }
      return rebuild(op, std::move(operands), op.attrs());
    }
    if ((op.kind() == OpKind::MaxPool || op.kind() == OpKind::AvgPool) && !op.getBool("channels_last")) {
      AttrMap attrs = op.attrs();
      attrs["channels_last"] = Attribute(true);
      return rebuild(op, {channelsLast_.at(op.operand(0))}, std::move(attrs));
    }
    if (op.kind() == OpKind::Slice) {
      AttrMap attrs = op.attrs();
      for (const char* list : {"starts", "ends", "steps"})
        attrs[list] = Attribute(permutedInts(op.getInts(list), kToChannelsLast));
      return rebuild(op, {channelsLast_.at(op.operand(0))}, std::move(attrs));
    }
    if (op.kind() == OpKind::Pad) {
      // pads = the 4 begins, then the 4 ends.
      const std::vector<int64_t> pads = op.getInts("pads");
      if (pads.size() != 8) return false;
      std::vector<int64_t> renamed = permutedInts({pads.begin(), pads.begin() + 4}, kToChannelsLast);
      const std::vector<int64_t> ends = permutedInts({pads.begin() + 4, pads.end()}, kToChannelsLast);
      renamed.insert(renamed.end(), ends.begin(), ends.end());
      std::vector<Value*> operands = {channelsLast_.at(op.operand(0))};
      for (size_t i = 1; i < op.numOperands(); ++i) operands.push_back(op.operand(i));  // the pad value
      AttrMap attrs = op.attrs();
      attrs["pads"] = Attribute(renamed);
      return rebuild(op, std::move(operands), std::move(attrs));
    }
    if (op.kind() == OpKind::Concat) {
      std::vector<Value*> operands;
      for (Value* v : op.operands()) {
        auto form = channelsLastForm(v, &op);
        if (!form) return form.takeError();
        operands.push_back(*form);
      }
      int64_t axis = op.getInt("axis");
      if (axis < 0) axis += 4;
      AttrMap attrs = op.attrs();
      attrs["axis"] = Attribute(channelsLastAxis(axis));
      return rebuild(op, std::move(operands), std::move(attrs));
    }
    return false;
  }

  /// A channel shuffle of a channels-last value, from its first reshape:
  ///   %s = reshape(%x) : [N, G, C/G, H, W]
  ///   %t = transpose(%s) {perm = [0, 2, 1, 3, 4]} : [N, C/G, G, H, W]
  ///   %y = reshape(%t) : [N, C, H, W]
  /// becomes, channels last, reshape [N, H, W, G, C/G], transpose {perm =
  /// [0, 1, 2, 4, 3]}, reshape [N, H, W, C]: the twin of %y. The middle
  /// values must have no other readers.
  Expected<bool> convertShuffle(Op& split) {
    if (!channelsLast_.count(split.operand(0))) return false;
    const Value* x = split.operand(0);
    const TensorType& xt = x->type();
    const TensorType& st = split.result()->type();
    if (!st.isStatic() || st.rank() != 5 || split.result()->users().size() != 1) return false;
    Op* swap = split.result()->users().front();
    if (swap->kind() != OpKind::Transpose || swap->getInts("perm") != std::vector<int64_t>{0, 2, 1, 3, 4} ||
        swap->result()->users().size() != 1)
      return false;
    Op* merge = swap->result()->users().front();
    if (merge->kind() != OpKind::Reshape || merge->result()->type() != xt) return false;
    const Shape& d = st.shape;  // [N, G, C/G, H, W]
    if (d[0] != xt.shape[0] || d[3] != xt.shape[2] || d[4] != xt.shape[3] ||
        d[1].size * d[2].size != xt.shape[1].size)
      return false;
    b_.setInsertionPoint(merge);
    b_.setLocation(split.loc());
    TensorType grouped = st;
    grouped.shape = {d[0], d[3], d[4], d[1], d[2]};
    auto s = b_.value(OpKind::Reshape, {channelsLast_.at(split.operand(0))}, {}, {grouped});
    if (!s) return s.takeError();
    b_.setLocation(swap->loc());
    auto t = b_.value(OpKind::Transpose, {*s}, {{"perm", Attribute(std::vector<int64_t>{0, 1, 2, 4, 3})}});
    if (!t) return t.takeError();
    TensorType merged = xt;
    merged.shape = permuted(xt.shape, kToChannelsLast);
    b_.setLocation(merge->loc());
    auto y = b_.value(OpKind::Reshape, {*t}, {}, {merged});
    if (!y) return y.takeError();
    (*s)->setName(split.result()->name());
    (*t)->setName(swap->result()->name());
    (*y)->setName(merge->result()->name());
    channelsLast_[merge->result()] = *y;
    shuffleInner_.insert(swap);
    shuffleInner_.insert(merge);
    return true;
  }

  /// A reduction of a channels-last value: its axes renamed. With keepdims
  /// the result is channels last too; without, it is the old result itself
  /// when the dims left keep their order (always so once the spatial dims
  /// are reduced), and otherwise the op stays channels first.
  Expected<bool> convertReduce(Op& op) {
    if (!channelsLast_.count(op.operand(0))) return false;
    std::vector<int64_t> axes = op.getInts("axes");
    if (axes.empty()) return false;  // every dim: handled as it is
    std::vector<int64_t> renamed;
    for (int64_t a : axes) renamed.push_back(channelsLastAxis(a < 0 ? a + 4 : a));
    std::sort(renamed.begin(), renamed.end());
    const bool keepdims = op.getBool("keepdims");
    if (!keepdims) {
      // The channels-first dims left, in the order the channels-last result has them.
      std::vector<int64_t> left;
      for (int64_t d : kToChannelsLast)
        if (std::find(renamed.begin(), renamed.end(), channelsLastAxis(d)) == renamed.end()) left.push_back(d);
      if (!std::is_sorted(left.begin(), left.end())) return false;
    }
    AttrMap attrs = op.attrs();
    attrs["axes"] = Attribute(renamed);
    b_.setInsertionPoint(&op);
    b_.setLocation(op.loc());
    auto built = b_.value(op.kind(), {channelsLast_.at(op.operand(0))}, std::move(attrs));
    if (!built) return built.takeError();
    (*built)->setName(op.result()->name());
    if (keepdims)
      channelsLast_[op.result()] = *built;
    else
      op.result()->replaceAllUsesWith(*built);
    return true;
  }

  /// Builds `op` again before itself with `operands` and `attrs`; its
  /// result is the channels-last twin of `op`'s.
  Expected<bool> rebuild(Op& op, std::vector<Value*> operands, AttrMap attrs) {
    b_.setInsertionPoint(&op);
    b_.setLocation(op.loc());
    std::vector<TensorType> declared;
    // A cast's result type, and a mixed-precision contraction's f32 result
    // from bf16 or f16 operands, come from the declaration.
    if (op.info().opClass == OpClass::Cast || op.info().opClass == OpClass::Contraction) {
      TensorType t = op.result()->type();
      t.shape = permuted(t.shape, kToChannelsLast);
      declared.push_back(t);
    }
    auto built = b_.value(op.kind(), std::move(operands), std::move(attrs), std::move(declared));
    if (!built) return built.takeError();
    (*built)->setName(op.result()->name());
    channelsLast_[op.result()] = *built;
    return true;
  }

  /// Whether channelsLastForm can give `v`.
  bool canTakeChannelsLast(const Value* v) const {
    return channelsLast_.count(const_cast<Value*>(v)) > 0 || (v->type().isStatic() && v->type().rank() <= 4);
  }

  /// `v` channels last, for `user`: its twin, a scalar as it is, or a
  /// transpose before `user` (a lower-rank operand broadcast into rank 4
  /// first reshaped to rank 4).
  Expected<Value*> channelsLastForm(Value* v, Op* user) {
    if (auto it = channelsLast_.find(v); it != channelsLast_.end()) return it->second;
    if (auto it = transposed_.find(v); it != transposed_.end()) return it->second;
    const TensorType& t = v->type();
    if (t.isStatic() && numElements(t.shape) == 1 && t.rank() <= 1) return v;
    if (!canTakeChannelsLast(v)) return Error("assign-layouts: an operand of unexpected rank");
    b_.setInsertionPoint(user);
    b_.setLocation(user->loc());
    Value* full = v;
    if (t.rank() < 4) {
      TensorType aligned = t;
      aligned.shape.insert(aligned.shape.begin(), 4 - t.rank(), Dim::fixed(1));
      auto reshaped = b_.value(OpKind::Reshape, {v}, {}, {aligned});
      if (!reshaped) return reshaped.takeError();
      full = *reshaped;
    }
    auto last = b_.value(OpKind::Transpose, {full}, {{"perm", Attribute(kToChannelsLast)}});
    if (!last) return last.takeError();
    transposed_[v] = *last;
    return *last;
  }

  /// The channels-first form of `old` (a value with a channels-last twin),
  /// made once, before its first reader that stays channels first.
  Expected<Value*> channelsFirst(Value* old, Op* user) {
    if (auto it = channelsFirst_.find(old); it != channelsFirst_.end()) return it->second;
    b_.setInsertionPoint(user);
    b_.setLocation(user->loc());
    auto back = b_.value(OpKind::Transpose, {channelsLast_.at(old)}, {{"perm", Attribute(kToChannelsFirst)}});
    if (!back) return back.takeError();
    channelsFirst_[old] = *back;
    return *back;
  }

  static std::vector<int64_t> permutedInts(const std::vector<int64_t>& list, const std::vector<int64_t>& perm) {
    std::vector<int64_t> out;
    for (int64_t p : perm) out.push_back(list[static_cast<size_t>(p)]);
    return out;
  }

  static Shape permuted(const Shape& shape, const std::vector<int64_t>& perm) {
    Shape out;
    for (int64_t p : perm) out.push_back(shape[static_cast<size_t>(p)]);
    return out;
  }

  Function& f_;
  const Target& target_;
  Builder b_;
  /// Values of the original function -> their channels-last twins.
  std::map<Value*, Value*> channelsLast_;
  /// Values without a twin -> their transpose to channels last, made once
  /// before the first reader that needs it.
  std::map<Value*, Value*> transposed_;
  /// Values with a twin -> the transpose back, for readers that stay.
  std::map<Value*, Value*> channelsFirst_;
  /// Ops with a twin, in program order.
  std::vector<Op*> replaced_;
  /// The transpose and the second reshape of each channel shuffle built
  /// channels last (convertShuffle), which the walk skips.
  std::set<Op*> shuffleInner_;
};

}  // namespace

class AssignLayoutsPass : public Pass {
 public:
  std::string_view name() const override { return "assign-layouts"; }

  Expected<bool> run(Module& m, const PassContext& ctx) override {
    if (!ctx.target) return Error("assign-layouts needs a target (kiln-opt --target cpu|cuda)");
    bool changed = false;
    for (const auto& f : m.functions()) {
      auto c = Assigner(*f, *ctx.target).run();
      if (!c) return c.takeError();
      changed |= *c;
    }
    return changed;
  }
};

std::unique_ptr<Pass> createAssignLayoutsPass() { return std::make_unique<AssignLayoutsPass>(); }

}  // namespace kiln
