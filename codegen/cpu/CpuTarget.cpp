// The CPU target of CpuTarget.h, and the reading of a matmul or
// convolution with its epilogue ops as one library call. Each epilogue op
// is read as what it is (`gelu` is GELU): nothing is recognized from values.
#include "codegen/cpu/CpuTarget.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "ir/ConstantValue.h"
#include "runtime/DnnlKernels.h"

namespace kiln::codegen {

namespace {

/// A matmul below this many multiply-adds stays a generated loop nest unless
/// its k reaches kLibraryMinK: oneDNN's fixed cost per call (about 0.5 us)
/// exceeds the loop's time on the small products of the e2e models, while
/// the loop nest's scalar sum over k falls far behind once k is long
/// (docs/matmul.md has the measurements).
constexpr int64_t kLibraryMinWork = 1 << 16;
constexpr int64_t kLibraryMinK = 64;

/// Whether oneDNN is worth calling for `anchor`. Convolutions always go to
/// oneDNN, whose kernels beat the generated loop nest at every size of the
/// e2e models.
bool prefersLibrary(const Op& anchor) {
  if (anchor.kind() != OpKind::MatMul) return true;  // qmatmul has no other lowering
  const std::vector<int64_t> a = staticDims(anchor.operand(0)->type().shape);
  const int64_t k = a.empty() ? 0 : a.back();
  return k >= kLibraryMinK || numElements(anchor.result()->type().shape) * k > kLibraryMinWork;
}

/// `dims` right-aligned in `rank` dims, padded with leading 1s.
std::optional<std::vector<int64_t>> alignTo(const std::vector<int64_t>& dims, size_t rank) {
  if (dims.size() > rank) return std::nullopt;
  std::vector<int64_t> out(rank - dims.size(), 1);
  out.insert(out.end(), dims.begin(), dims.end());
  return out;
}

/// `op`'s integer list attribute, or `fill` repeated `n` times when absent.
std::vector<int64_t> intsOr(const Op& op, std::string_view name, int64_t fill, size_t n) {
  const Attribute* a = op.attr(name);
  std::vector<int64_t> v = a ? a->getInts() : std::vector<int64_t>{};
  if (v.empty()) v.assign(n, fill);
  return v;
}

/// The post-op of `op`, which reads the running value `current` once; the
/// buffer of a tensor operand comes from `bufferOf`.
Expected<PostOp> postOpOf(const Op& op, const Value* current, size_t rank,
                          const std::function<int(const Value*)>& bufferOf) {
  PostOp p;
  p.name = std::string(op.name());
  auto eltwise = [&](PostOp::Kind kind, float alpha = 0, float beta = 0) -> Expected<PostOp> {
    p.kind = kind;
    p.alpha = alpha;
    p.beta = beta;
    return p;
  };
  const DType dtype = current->type().dtype;
  if (op.result()->type().dtype != dtype) return Error("'" + p.name + "' changes the dtype");
  if (op.numOperands() == 1) {
    if (op.operand(0) != current) return Error("'" + p.name + "' does not read the chain");
    switch (op.kind()) {
      case OpKind::Relu: return eltwise(PostOp::Kind::Relu);
      case OpKind::Tanh: return eltwise(PostOp::Kind::Tanh);
      case OpKind::Sigmoid: return eltwise(PostOp::Kind::Sigmoid);
      case OpKind::Exp: return eltwise(PostOp::Kind::Exp);
      case OpKind::Log: return eltwise(PostOp::Kind::Log);
      case OpKind::Abs: return eltwise(PostOp::Kind::Abs);
      case OpKind::Sqrt: return eltwise(PostOp::Kind::Sqrt);
      // A product is alpha * x - 0 (see DnnlKernel::exactPostOp): adding -0
      // keeps every product's sign, where + 0 would turn -0 into +0.
      case OpKind::Neg: return eltwise(PostOp::Kind::Linear, -1, -0.0f);
      case OpKind::Silu: p.name = "swish"; return eltwise(PostOp::Kind::Swish, 1, 0);
      case OpKind::Gelu:
        if (op.getString("approximate") == "tanh") {
          p.name = "gelu_tanh";
          return eltwise(PostOp::Kind::GeluTanh);
        }
        p.name = "gelu_erf";
        return eltwise(PostOp::Kind::GeluErf);
      default: return Error("'" + p.name + "' has no oneDNN post-op");
    }
  }
  if (op.numOperands() != 2) return Error("'" + p.name + "' has no oneDNN post-op");
  const bool left = op.operand(0) == current;
  if (!left && op.operand(1) != current) return Error("'" + p.name + "' does not read the chain");
  if (op.operand(0) == op.operand(1)) return Error("'" + p.name + "' reads the chain twice");
  const Value* other = op.operand(left ? 1 : 0);
  if (std::optional<double> c = constantScalar(other)) {
    const float k = static_cast<float>(*c);
    switch (op.kind()) {
      case OpKind::Add: return eltwise(PostOp::Kind::Linear, 1, k);
      case OpKind::Mul: return eltwise(PostOp::Kind::Linear, k, -0.0f);
      case OpKind::Sub: return left ? eltwise(PostOp::Kind::Linear, 1, -k) : eltwise(PostOp::Kind::Linear, -1, k);
      case OpKind::Div: {
        if (!left) return Error("'div' of a constant by the chain has no post-op");
        // x / k is x * (1 / k) only where 1 / k is exact (a power of two
        // whose reciprocal is a float, or 0, inf, NaN): else the product
        // rounds twice, and 1 / k may overflow where x / k does not.
        const float reciprocal = 1.0f / k;
        if (std::isfinite(k) && k != 0 && static_cast<double>(reciprocal) * k != 1.0)
          return Error("'div' by " + std::to_string(k) + " is not a product by an exact reciprocal");
        return eltwise(PostOp::Kind::Linear, reciprocal, -0.0f);
      }
      // max(x, +0) is relu; max(+0, x) is not (max gives the second of
      // equal values: max(+0, -0) is -0), nor is max(x, -0). Other bounds
      // are clips, whose max and min give the bound of equal values as
      // oneDNN's do: so a bound of 0 before the chain (max(0, x), whose
      // -0 for x = -0 a clip would make +0) stays outside. A clip runs only
      // where its guard proves no NaN reaches it (DnnlKernel::exactCall).
      case OpKind::Max:
        if (left && *c == 0 && !std::signbit(*c)) return eltwise(PostOp::Kind::Relu);
        if (!left && *c == 0) return Error("'max' of a zero and the chain has no post-op");
        return eltwise(PostOp::Kind::Clip, k, std::numeric_limits<float>::infinity());
      case OpKind::Min:
        if (!left && *c == 0) return Error("'min' of a zero and the chain has no post-op");
        return eltwise(PostOp::Kind::Clip, -std::numeric_limits<float>::infinity(), k);
      default: return Error("'" + p.name + "' has no oneDNN post-op");
    }
  }
  // A tensor operand of the call, broadcast into the result by the library.
  if (other->type().dtype != dtype || !other->type().isStatic())
    return Error("'" + p.name + "' reads an operand that is not static " + std::string(dtypeName(dtype)));
  auto dims = alignTo(staticDims(other->type().shape), rank);
  if (!dims) return Error("'" + p.name + "' reads an operand of higher rank");
  p.operand = bufferOf(other);
  p.dims = *dims;
  switch (op.kind()) {
    case OpKind::Add: p.kind = PostOp::Kind::Add; return p;
    case OpKind::Mul: p.kind = PostOp::Kind::Mul; return p;
    case OpKind::Max: p.kind = PostOp::Kind::Max; return p;
    case OpKind::Min: p.kind = PostOp::Kind::Min; return p;
    case OpKind::Sub:
      if (!left) return Error("'sub' from a tensor has no post-op");
      p.kind = PostOp::Kind::Sub;
      return p;
    case OpKind::Div:
      if (!left) return Error("'div' of a tensor by the chain has no post-op");
      p.kind = PostOp::Kind::Div;
      return p;
    default: return Error("'" + p.name + "' has no oneDNN post-op");
  }
}

/// Folds eltwise post-op `next` into `last` where one post-op computes
/// both exactly: clip after an overlapping clip, relu after relu. Two
/// linears are not folded: (x * a) * b is not x * (a * b) when x * a
/// overflows, nor (x + a) + b x + (a + b), and a product then a sum round
/// twice where one fma rounds once.
bool mergeEltwise(PostOp& last, const PostOp& next) {
  if (last.isBinary() || next.isBinary() || last.kind != next.kind) return false;
  switch (next.kind) {
    case PostOp::Kind::Clip: {
      const float lo = std::max(last.alpha, next.alpha), hi = std::min(last.beta, next.beta);
      if (lo > hi) return false;
      last.alpha = lo;
      last.beta = hi;
      break;
    }
    case PostOp::Kind::Relu: break;
    default: return false;
  }
  last.name += "+" + next.name;
  return true;
}

/// The int8 call of a qconv or qmatmul (ir/Ops.def): x, w and the bias as
/// buffers, the scales (a constant, from `constantOf`) and zero points as
/// numbers, relu as a post-op.
Expected<LibraryCall> describeQuantized(const Op& anchor, std::span<const Op* const> epilogue,
                                        const std::function<int(const Value*)>& bufferOf,
                                        const std::function<const DenseTensor*(const Value*)>& constantOf) {
  LibraryCall call;
  call.kind = anchor.kind() == OpKind::QConv ? LibraryCall::Kind::Conv : LibraryCall::Kind::MatMul;
  if (!epilogue.empty()) return Error("int8 library calls take no epilogue");
  const TensorType& result = anchor.result()->type();
  if (!result.isStatic()) return Error("library calls produce static results");
  for (size_t i = 0; i < anchor.numOperands(); ++i) {
    const Value* v = anchor.operand(i);
    if (!v->type().isStatic()) return Error("library calls take static operands");
    // The scales are numbers of the call. They are numbered as a buffer
    // all the same, as the group has them for an argument, unless a single
    // one, which select-library copies into the group.
    const bool scalar = i == 2 && constantScalar(v).has_value();
    const int buffer = scalar ? -1 : bufferOf(v);
    if (i == 2) continue;
    call.operands.push_back(buffer);
    call.operandDims.push_back(staticDims(v->type().shape));
  }
  const DenseTensor* scales = constantOf(anchor.operand(2));
  if (!scales) return Error("the scales of an int8 library call must be a constant");
  for (int64_t i = 0; i < scales->numElements(); ++i) call.scales.push_back(static_cast<float>(scales->getDouble(i)));
  call.resultDims = staticDims(result.shape);
  call.srcType = anchor.operand(0)->type().dtype;
  call.dstType = result.dtype;
  call.srcZeroPoint = static_cast<int32_t>(anchor.getInt("x_zero_point"));
  call.dstZeroPoint = static_cast<int32_t>(anchor.getInt("y_zero_point"));
  if (anchor.getBool("relu")) {
    PostOp relu;
    relu.name = "relu";
    call.postOps.push_back(std::move(relu));
  }
  if (call.kind == LibraryCall::Kind::Conv) {
    const size_t k = call.operandDims[0].size() < 2 ? 0 : call.operandDims[0].size() - 2;
    call.strides = intsOr(anchor, "strides", 1, k);
    call.pads = intsOr(anchor, "pads", 0, 2 * k);
    call.dilations = intsOr(anchor, "dilations", 1, k);
    call.groups = anchor.getInt("groups");
  }
  return call;
}

/// The library call of `anchor` and `epilogue`, with buffers from `bufferOf`:
/// static operands and result of one floating-point dtype, which the
/// target checks, or a quantized contraction's.
Expected<LibraryCall> describe(const Op& anchor, std::span<const Op* const> epilogue,
                               const std::function<int(const Value*)>& bufferOf,
                               const std::function<const DenseTensor*(const Value*)>& constantOf) {
  if (anchor.kind() == OpKind::QConv || anchor.kind() == OpKind::QMatMul)
    return describeQuantized(anchor, epilogue, bufferOf, constantOf);
  LibraryCall call;
  switch (anchor.kind()) {
    case OpKind::MatMul: call.kind = LibraryCall::Kind::MatMul; break;
    case OpKind::Conv: call.kind = LibraryCall::Kind::Conv; break;
    case OpKind::ConvTranspose: call.kind = LibraryCall::Kind::ConvTranspose; break;
    case OpKind::ConvWeightGrad: call.kind = LibraryCall::Kind::ConvWeightGrad; break;
    default: return anchor.emitError("is not a matmul or convolution");
  }
  const TensorType& result = anchor.result()->type();
  if ((result.dtype != DType::F32 && result.dtype != DType::F16 && result.dtype != DType::BF16) || !result.isStatic())
    return Error("library calls produce static f32, f16 or bf16 results");
  // A matmul's transposed a or b is read in place, through transposed strides.
  const Op* transposed[2] = {transposeReadInPlace(anchor, 0), transposeReadInPlace(anchor, 1)};
  // A mixed-precision contraction (autocast's) reads bf16 or f16 operands
  // into its f32 result.
  const DType operandType = anchor.operand(0)->type().dtype;
  const bool mixed = result.dtype == DType::F32 && (operandType == DType::BF16 || operandType == DType::F16);
  if (mixed) call.srcType = operandType;
  for (size_t i = 0; i < anchor.numOperands(); ++i) {
    const Value* v = anchor.operand(i);
    if (v->type().dtype != (mixed ? operandType : result.dtype) || !v->type().isStatic())
      return Error("library calls take static operands of their result's dtype, or all bf16 or f16 for an f32 result");
    call.operands.push_back(bufferOf(i < 2 && transposed[i] ? transposed[i]->operand(0) : v));
    call.operandDims.push_back(staticDims(v->type().shape));
  }
  call.transposedA = transposed[0] != nullptr;
  call.transposedB = transposed[1] != nullptr;
  call.resultDims = staticDims(result.shape);
  if (call.kind != LibraryCall::Kind::MatMul) {
    const size_t k = call.operandDims[0].size() < 2 ? 0 : call.operandDims[0].size() - 2;
    call.strides = intsOr(anchor, "strides", 1, k);
    call.pads = intsOr(anchor, "pads", 0, 2 * k);
    call.dilations = intsOr(anchor, "dilations", 1, k);
    call.groups = anchor.getInt("groups");
    call.channelsLast = call.kind == LibraryCall::Kind::Conv && anchor.getBool("channels_last");
    if (call.kind == LibraryCall::Kind::ConvTranspose) call.outputPadding = intsOr(anchor, "output_padding", 0, k);
  }
  const Value* current = anchor.result();
  for (const Op* op : epilogue) {
    // A cast to bf16 or f16 at the end: the call stores its result so
    // (rounded to nearest even, as the cast).
    if (op->kind() == OpKind::Cast) {
      const DType to = op->result()->type().dtype;
      if (op != epilogue.back() || current->type().dtype != DType::F32 || (to != DType::BF16 && to != DType::F16))
        return Error("a library call casts its f32 result to bf16 or f16 as its last step only");
      call.dstType = to;
      current = op->result();
      continue;
    }
    auto p = postOpOf(*op, current, call.resultDims.size(), bufferOf);
    if (!p) return p.takeError();
    current = op->result();
    if (!call.postOps.empty() && mergeEltwise(call.postOps.back(), *p)) continue;
    // oneDNN 2.6 gives every eltwise post-op of one algorithm the
    // parameters of the first (a conv + mul 0.5 + add 3 computed y * 0.25;
    // ReLU6's clips lost their upper bound behind another clip), so an
    // algorithm may recur only with the same parameters.
    if (!p->isBinary())
      for (const PostOp& q : call.postOps)
        if (!q.isBinary() && q.kind == p->kind && (q.alpha != p->alpha || q.beta != p->beta))
          return Error("a second '" + p->name + "' post-op with other parameters than '" + q.name + "'");
    call.postOps.push_back(std::move(*p));
  }
  return call;
}

}  // namespace

bool CpuTarget::acceptsLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) const {
  // An int8 contraction has no other lowering: whatever oneDNN implements
  // it with, it is taken.
  if (anchor.kind() == OpKind::QConv || anchor.kind() == OpKind::QMatMul) {
    auto call = describeLibraryCall(anchor, epilogue);
    return call && DnnlKernel::implementation(*call).ok();
  }
  if (anchor.result()->type().dtype != DType::F32 || !prefersLibrary(anchor)) return false;
  // oneDNN's deconvolution with a post-op falls off its fast path without
  // saying so (its implementation is still "jit:avx512_core"): on the CNN's
  // training step the input gradient with a `div` post-op took 4.98 ms,
  // against 0.35 ms without it plus a generated kernel for the division
  // (kiln-train-bench --profile). So a conv_transpose takes no epilogue.
  if (anchor.kind() == OpKind::ConvTranspose && !epilogue.empty()) return false;
  if (anchor.kind() == OpKind::ConvWeightGrad && !epilogue.empty()) return false;
  auto call = describeLibraryCall(anchor, epilogue);
  if (!call) return false;
  // A post-op oneDNN computes otherwise than the op is defined on NaN, inf
  // or a signed zero (its exp, log, erf GELU, binary max and min) stays
  // outside the group: `fuse` gives it to a generated kernel with the ops
  // after it. Clips are guarded (DnnlKernel::exactCall).
  if (!DnnlKernel::exactCall(*call).ok()) return false;
  auto impl = DnnlKernel::implementation(*call);
  if (!impl) return false;
  // Low-precision data on oneDNN's reference kernels (a CPU without BF16
  // instructions) is far slower than generated kernels.
  const bool reference = impl->rfind("ref", 0) == 0;
  if (reference && (call->mixedPrecision() || call->dstType != DType::F32)) return false;
  return call->postOps.empty() || !reference;
}

bool CpuTarget::prefersChannelsLast(const Op& conv) const {
  if (conv.kind() != OpKind::Conv || conv.result()->type().dtype != DType::F32 ||
      conv.operand(0)->type().rank() != 4)
    return false;
  auto call = describeLibraryCall(conv, {});
  if (!call) return false;
  call->channelsLast = true;
  for (std::vector<int64_t>* dims : {&call->operandDims[0], &call->resultDims})
    std::rotate(dims->begin() + 1, dims->begin() + 2, dims->end());
  auto impl = DnnlKernel::implementation(*call);
  // brgconv, brgconv_1x1, brdgmm_dw (depthwise) and the jit_* kernels.
  return impl && (impl->rfind("br", 0) == 0 || impl->rfind("jit", 0) == 0);
}

Expected<LibraryCall> describeLibraryCall(const Op& anchor, std::span<const Op* const> epilogue) {
  // Buffers are numbered in order of first use, as the group will have them.
  std::vector<const Value*> buffers;
  auto bufferOf = [&](const Value* v) {
    for (size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i] == v) return static_cast<int>(i);
    buffers.push_back(v);
    return static_cast<int>(buffers.size() - 1);
  };
  auto call = describe(anchor, epilogue, bufferOf, constantTensor);
  if (!call) return call.takeError();
  call->resultBuffer = static_cast<int>(buffers.size());
  return call;
}

Expected<LibraryCall> describeLibraryCall(const Op& group) {
  const Function* region = group.region();
  if (group.kind() != OpKind::Fused || !region || group.getString("kind") != "library" || group.numResults() != 1)
    return group.emitError("is not a library group");
  // A region argument's constant is the group operand's.
  auto constantOf = [&group](const Value* v) -> const DenseTensor* {
    const Value* outer = v->isArgument() && v->index() < static_cast<int>(group.numOperands())
                             ? group.operand(static_cast<size_t>(v->index()))
                             : v;
    return constantTensor(outer);
  };
  const Op* anchor = nullptr;
  std::vector<const Op*> epilogue;
  std::vector<const Op*> prologue;  // the transposes the anchor reads in place
  for (const auto& op : region->ops()) {
    if (op->kind() == OpKind::Constant || op->kind() == OpKind::Return) continue;
    if (!anchor && prologue.size() < 2 && op->kind() == OpKind::Transpose) {
      prologue.push_back(op.get());
      continue;
    }
    if (!anchor)
      anchor = op.get();
    else
      epilogue.push_back(op.get());
  }
  if (!anchor) return group.emitError("has an empty library group");
  for (const Op* t : prologue)
    if (transposeReadInPlace(*anchor, 0) != t && transposeReadInPlace(*anchor, 1) != t)
      return group.emitError("is not a library call: its transpose is not one the call reads in place");
  auto bufferOf = [](const Value* v) { return v->isArgument() ? v->index() : -1; };
  auto call = describe(*anchor, epilogue, bufferOf, constantOf);
  if (!call) return group.emitError("is not a library call: " + call.error().message());
  for (int b : call->operands)
    if (b < 0) return group.emitError("is not a library call: its contraction reads a value computed in the group");
  for (const PostOp& p : call->postOps)
    if (p.isBinary() && p.operand < 0)
      return group.emitError("is not a library call: a post-op reads a value computed in the group");
  call->resultBuffer = static_cast<int>(group.numOperands());
  return call;
}

std::string describeLibraryCallText(const LibraryCall& call) {
  auto text = DnnlKernel::describe(call);
  return text ? *text : "a call oneDNN refuses: " + text.error().message();
}

}  // namespace kiln::codegen
