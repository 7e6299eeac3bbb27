// oneDNN kernels of DnnlKernels.h. Buffers are described as plain
// row-major (explicit strides); `set_data_handle` binds each run's buffers
// to memory objects made once, and a convolution whose chosen layouts are
// blocked reorders through memory of its own. An epilogue is read as a
// chain from the anchor's result: each op takes the running value as one
// operand and, for a binary op, a region argument (possibly through a
// `broadcast`) or a splat constant as the other; where the running value
// has several readers, the ops computing a known function of it alone
// (GELU, SiLU) are found by evaluating them at sample points. Anything else
// in the region makes create() fail, and the executor falls back to a
// generated kernel.
#include "codegen/DnnlKernels.h"

#include <omp.h>

#include <cmath>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <set>
#include <unordered_map>

namespace kiln::codegen {

namespace {

using dnnl::algorithm;
using dnnl::memory;

std::vector<int64_t> dimsOfValue(const Value* v) { return staticDims(v->type().shape); }

memory::dims rowMajorStrides(const memory::dims& dims) {
  memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(dims[i], 1);
  return strides;
}

memory::desc plainDesc(const memory::dims& dims) {
  return memory::desc(dims, memory::data_type::f32, rowMajorStrides(dims));
}

/// `dims` right-aligned in `rank` dims, padded with leading 1s (NumPy
/// broadcasting), or nullopt when it has more dims than `rank`.
std::optional<memory::dims> alignTo(const std::vector<int64_t>& dims, size_t rank) {
  if (dims.size() > rank) return std::nullopt;
  memory::dims out(rank - dims.size(), 1);
  out.insert(out.end(), dims.begin(), dims.end());
  return out;
}

/// The value of a constant op whose elements are all equal, if `v` is one.
std::optional<double> splatOf(const Value* v) {
  const Op* def = v->definingOp();
  if (!def || def->kind() != OpKind::Constant) return std::nullopt;
  const DenseTensor& t = def->getTensor("value");
  if (t.numElements() == 0) return std::nullopt;
  for (int64_t i = 1; i < t.numElements(); ++i)
    if (t.getDouble(i) != t.getDouble(0)) return std::nullopt;
  return t.getDouble(0);
}

/// One post-op: elementwise (alg, alpha, beta) or binary with the region
/// argument `arg`, whose dims are right-aligned to the result's rank.
struct PostOp {
  bool binary = false;
  algorithm alg = algorithm::undef;
  float alpha = 0, beta = 0;
  int arg = -1;
  memory::dims dims;
  std::string name;
};

/// The value of scalar op `kind` at (a, b), or nullopt for ops that are not
/// elementwise float functions of their operands.
std::optional<double> evaluateScalar(OpKind kind, double a, double b) {
  switch (kind) {
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Max: return std::max(a, b);
    case OpKind::Min: return std::min(a, b);
    case OpKind::Pow: return std::pow(a, b);
    case OpKind::Neg: return -a;
    case OpKind::Abs: return std::fabs(a);
    case OpKind::Exp: return std::exp(a);
    case OpKind::Log: return std::log(a);
    case OpKind::Sqrt: return std::sqrt(a);
    case OpKind::Rsqrt: return 1 / std::sqrt(a);
    case OpKind::Reciprocal: return 1 / a;
    case OpKind::Tanh: return std::tanh(a);
    case OpKind::Erf: return std::erf(a);
    case OpKind::Sigmoid: return 1 / (1 + std::exp(-a));
    case OpKind::Relu: return std::max(a, 0.0);
    default: return std::nullopt;
  }
}

/// A run of epilogue ops that computes one known function of the chain's
/// value x alone (x feeds several of them, as in GELU's x * 0.5 * (1 +
/// erf(x / sqrt 2))): the ops, the value they end in, and the post-op.
struct ScalarSegment {
  std::set<const Op*> ops;
  const Value* result = nullptr;
  algorithm alg = algorithm::undef;
  std::string name;
};

/// Grows a segment from x over the region's ops in order (each op reading
/// only x, segment values and splat constants); after each op, when only
/// its result is used outside the segment, compares the segment as a
/// function of x, at sample points, with the functions oneDNN has.
std::optional<ScalarSegment> readScalarSegment(const Function& region, const Value* x) {
  static const double kSamples[] = {-4.0, -2.5, -1.3, -0.7, -0.2, 0.0, 0.1, 0.5, 1.0, 1.7, 3.0, 5.0};
  struct Known {
    algorithm alg;
    const char* name;
    double (*f)(double);
  };
  static const Known kKnown[] = {
      {algorithm::eltwise_gelu_erf, "gelu_erf", [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
      {algorithm::eltwise_gelu_tanh, "gelu_tanh",
       [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }},
      {algorithm::eltwise_swish, "swish", [](double v) { return v / (1 + std::exp(-v)); }},
  };
  ScalarSegment segment;
  std::vector<const Op*> order;
  std::set<const Value*> values = {x};
  bool started = x->isArgument();
  for (const auto& opPtr : region.ops()) {
    const Op& op = *opPtr;
    if (!started) {
      started = &op == x->definingOp();
      continue;
    }
    if (op.kind() == OpKind::Return || op.kind() == OpKind::Constant || op.numResults() != 1 || op.numOperands() < 1 ||
        op.numOperands() > 2 || !evaluateScalar(op.kind(), 0, 0))
      continue;
    bool readsSegment = false, scalarOnly = true;
    for (const Value* v : op.operands()) {
      if (values.count(v))
        readsSegment = true;
      else if (!splatOf(v))
        scalarOnly = false;
    }
    if (!readsSegment || !scalarOnly) continue;
    order.push_back(&op);
    segment.ops.insert(&op);
    values.insert(op.result());
    // Only this op's result may leave the segment.
    bool closed = true;
    for (const Value* v : values) {
      if (v == op.result()) continue;
      for (const Op* user : v->users())
        if (!segment.ops.count(user)) closed = false;
    }
    if (!closed) continue;
    for (const Known& known : kKnown) {
      bool matches = true;
      for (double sample : kSamples) {
        std::map<const Value*, double> at = {{x, sample}};
        for (const Op* o : order) {
          auto operand = [&](size_t i) {
            return at.count(o->operand(i)) ? at[o->operand(i)] : *splatOf(o->operand(i));
          };
          at[o->result()] = *evaluateScalar(o->kind(), operand(0), o->numOperands() > 1 ? operand(1) : 0.0);
        }
        const double want = known.f(sample), got = at[op.result()];
        if (!(std::fabs(got - want) <= 1e-6 * (1 + std::fabs(want)))) {
          matches = false;
          break;
        }
      }
      if (matches) {
        segment.result = op.result();
        segment.alg = known.alg;
        segment.name = known.name;
        return segment;
      }
    }
  }
  return std::nullopt;
}

/// Reads the epilogue after `anchor` in `region` as post-ops; an error
/// names the first op that does not fit.
Expected<std::vector<PostOp>> readEpilogue(const Function& region, const Op& anchor, size_t rank) {
  std::vector<PostOp> postOps;
  const Value* current = anchor.result();
  std::set<const Op*> consumed;  // ops of scalar segments already read
  for (const auto& opPtr : region.ops()) {
    const Op& op = *opPtr;
    if (&op == &anchor || consumed.count(&op)) continue;
    if (op.kind() == OpKind::Return) {
      if (op.numOperands() != 1 || op.operand(0) != current)
        return Error("the epilogue does not return the end of its chain");
      continue;
    }
    // Splat constants and broadcasts of arguments are read by the chain ops
    // that use them; a broadcast must have no other use.
    if (op.kind() == OpKind::Constant) continue;
    if (op.kind() == OpKind::Broadcast) {
      if (op.result()->users().size() != 1) return Error("a broadcast with several uses");
      continue;
    }
    if (op.numResults() != 1 || op.result()->type().dtype != DType::F32)
      return Error("'" + std::string(op.name()) + "' is not an f32 elementwise op");
    if (current->users().size() != 1) {
      // Several ops read the value: GELU and the like, as one post-op.
      std::optional<ScalarSegment> segment = readScalarSegment(region, current);
      if (!segment || !segment->ops.count(&op)) return Error("an epilogue value is used twice");
      PostOp p;
      p.name = segment->name;
      p.alg = segment->alg;
      p.alpha = segment->alg == algorithm::eltwise_swish ? 1.0f : 0.0f;
      postOps.push_back(std::move(p));
      consumed = segment->ops;
      current = segment->result;
      continue;
    }
    PostOp p;
    p.name = std::string(op.name());
    auto eltwise = [&](algorithm alg, float alpha = 0, float beta = 0) {
      p.alg = alg;
      p.alpha = alpha;
      p.beta = beta;
    };
    if (op.numOperands() == 1) {
      if (op.operand(0) != current) return Error("'" + p.name + "' does not read the chain");
      switch (op.kind()) {
        case OpKind::Relu: eltwise(algorithm::eltwise_relu); break;
        case OpKind::Tanh: eltwise(algorithm::eltwise_tanh); break;
        case OpKind::Sigmoid: eltwise(algorithm::eltwise_logistic); break;
        case OpKind::Exp: eltwise(algorithm::eltwise_exp); break;
        case OpKind::Log: eltwise(algorithm::eltwise_log); break;
        case OpKind::Abs: eltwise(algorithm::eltwise_abs); break;
        case OpKind::Sqrt: eltwise(algorithm::eltwise_sqrt); break;
        case OpKind::Neg: eltwise(algorithm::eltwise_linear, -1, 0); break;
        default: return Error("'" + p.name + "' has no oneDNN post-op");
      }
    } else if (op.numOperands() == 2) {
      const bool left = op.operand(0) == current;
      if (!left && op.operand(1) != current) return Error("'" + p.name + "' does not read the chain");
      if (op.operand(0) == op.operand(1)) return Error("'" + p.name + "' reads the chain twice");
      const Value* other = op.operand(left ? 1 : 0);
      if (std::optional<double> c = splatOf(other)) {
        const float k = static_cast<float>(*c);
        switch (op.kind()) {
          case OpKind::Add: eltwise(algorithm::eltwise_linear, 1, k); break;
          case OpKind::Mul: eltwise(algorithm::eltwise_linear, k, 0); break;
          case OpKind::Sub:
            left ? eltwise(algorithm::eltwise_linear, 1, -k) : eltwise(algorithm::eltwise_linear, -1, k);
            break;
          case OpKind::Div:
            if (!left) return Error("'div' of a constant by the chain has no post-op");
            eltwise(algorithm::eltwise_linear, static_cast<float>(1.0 / *c), 0);
            break;
          case OpKind::Max:
            if (*c != 0) return Error("'max' with a constant other than 0 has no post-op");
            eltwise(algorithm::eltwise_relu);
            break;
          default: return Error("'" + p.name + "' has no oneDNN post-op");
        }
      } else {
        // A tensor operand: a region argument, directly or broadcast.
        const Value* source = other;
        if (const Op* def = other->definingOp(); def && def->kind() == OpKind::Broadcast) source = def->operand(0);
        if (!source->isArgument() || source->type().dtype != DType::F32)
          return Error("'" + p.name + "' reads a computed value");
        auto dims = alignTo(dimsOfValue(source), rank);
        if (!dims) return Error("'" + p.name + "' reads an operand of higher rank");
        p.binary = true;
        p.arg = source->index();
        p.dims = *dims;
        switch (op.kind()) {
          case OpKind::Add: p.alg = algorithm::binary_add; break;
          case OpKind::Mul: p.alg = algorithm::binary_mul; break;
          case OpKind::Max: p.alg = algorithm::binary_max; break;
          case OpKind::Min: p.alg = algorithm::binary_min; break;
          case OpKind::Sub:
            if (!left) return Error("'sub' from a tensor has no post-op");
            p.alg = algorithm::binary_sub;
            break;
          case OpKind::Div:
            if (!left) return Error("'div' of a tensor by the chain has no post-op");
            p.alg = algorithm::binary_div;
            break;
          default: return Error("'" + p.name + "' has no oneDNN post-op");
        }
      }
    } else {
      return Error("'" + p.name + "' has no oneDNN post-op");
    }
    postOps.push_back(std::move(p));
    current = op.result();
  }
  return postOps;
}

std::string dimsText(const memory::dims& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

dnnl::engine& cpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

}  // namespace

/// What oneDNN chose for a convolution or deconvolution.
struct ConvDescs {
  dnnl::memory::desc src, weights, dst;
  std::string impl;
};

struct DnnlKernel::Impl {
  /// A copy between a buffer's plain layout and the blocked layout the
  /// primitive chose, into or out of memory the kernel owns.
  struct Reorder {
    dnnl::reorder primitive;
    memory plain, blocked;
    int buffer = 0;
    /// A constant operand (weights): reordered on the first run only, as
    /// long as it is at the same address.
    bool constant = false;
    const void* reordered = nullptr;
  };
  dnnl::primitive primitive;
  std::unordered_map<int, memory> args;
  /// (oneDNN argument, buffer index) to bind on each run.
  std::vector<std::pair<int, int>> bindings;
  std::vector<Reorder> inputReorders;
  std::vector<Reorder> outputReorders;
  std::string description;
  int64_t work = 0;
};

DnnlKernel::DnnlKernel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DnnlKernel::~DnnlKernel() = default;

const std::string& DnnlKernel::description() const { return impl_->description; }
int64_t DnnlKernel::work() const { return impl_->work; }

Expected<std::unique_ptr<DnnlKernel>> DnnlKernel::create(const Op& op, const std::vector<bool>& constantOperands) {
  // The anchor, and how its operands map to the op's buffers.
  const Op* anchor = &op;
  std::vector<int> operandBuffer;
  std::vector<PostOp> postOps;
  const int resultBuffer = static_cast<int>(op.numOperands());
  if (op.kind() == OpKind::Fused) {
    const Function* region = op.region();
    if (!region || op.numResults() != 1) return Error("not a single-result fused group");
    anchor = nullptr;
    for (const auto& inner : region->ops())
      if (inner->kind() == OpKind::MatMul || inner->kind() == OpKind::Conv) {
        if (anchor) return Error("two contractions in one group");
        anchor = inner.get();
      }
    if (!anchor) return Error("no matmul or conv in the group");
    for (const Value* v : anchor->operands()) {
      if (!v->isArgument()) return Error("the contraction reads a computed value");
      operandBuffer.push_back(v->index());
    }
    auto chain = readEpilogue(*region, *anchor, anchor->result()->type().rank());
    if (!chain) return chain.takeError();
    postOps = std::move(*chain);
  } else {
    for (size_t i = 0; i < op.numOperands(); ++i) operandBuffer.push_back(static_cast<int>(i));
  }
  for (const Value* v : anchor->operands()) {
    if (v->type().dtype != DType::F32 || !v->type().isStatic()) return Error("oneDNN kernels take static f32 operands");
    if (numElements(v->type().shape) == 0) return Error("an empty operand");
  }
  if (anchor->result()->type().dtype != DType::F32) return Error("oneDNN kernels produce f32");

  auto impl = std::make_unique<Impl>();
  dnnl::engine& engine = cpuEngine();
  const memory::dims dstDims = alignTo(dimsOfValue(anchor->result()), anchor->result()->type().rank()).value();
  try {
    dnnl::post_ops ops;
    std::string postText;
    for (const PostOp& p : postOps) {
      if (p.binary)
        ops.append_binary(p.alg, plainDesc(p.dims));
      else
        ops.append_eltwise(1.0f, p.alg, p.alpha, p.beta);
      postText += (postText.empty() ? " + " : ", ") + p.name;
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);

    if (anchor->kind() == OpKind::MatMul) {
      std::vector<int64_t> a = dimsOfValue(anchor->operand(0)), b = dimsOfValue(anchor->operand(1));
      // 1-D operands: a row [1,K] and a column [K,1]; the result's memory is
      // the same with or without the unit dim.
      if (a.size() == 1) a.insert(a.begin(), 1);
      if (b.size() == 1) b.push_back(1);
      const size_t rank = std::max(a.size(), b.size());
      const memory::dims ad = alignTo(a, rank).value(), bd = alignTo(b, rank).value();
      memory::dims cd(rank);
      for (size_t i = 0; i + 2 < rank; ++i) cd[i] = std::max(ad[i], bd[i]);
      cd[rank - 2] = ad[rank - 2];
      cd[rank - 1] = bd[rank - 1];
      // Post-op operands are aligned to the result's own rank; with 1-D
      // operands that differs from the matmul's, so none are allowed then.
      if (!postOps.empty() && cd.size() != dstDims.size()) return Error("post-ops on a matmul of 1-D operands");
      const memory::desc amd = plainDesc(ad), bmd = plainDesc(bd), cmd = plainDesc(cd);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, cmd), attr, engine);
      // Some post-op combinations (binary ops on a batched product) have only
      // oneDNN's reference implementation, slower than its optimized matmul
      // followed by a generated kernel for the epilogue (6 ms against 0.05 ms
      // on the GPT's backward products): refused, the executor splits them.
      if (!postOps.empty() && std::string(pd.impl_info_str()).rfind("ref", 0) == 0)
        return Error("oneDNN has only its reference implementation for this matmul with these post-ops");
      impl->primitive = dnnl::matmul(pd);
      impl->work = numElements(anchor->result()->type().shape) * ad.back();
      impl->args[DNNL_ARG_SRC] = memory(amd, engine, DNNL_MEMORY_NONE);
      impl->args[DNNL_ARG_WEIGHTS] = memory(bmd, engine, DNNL_MEMORY_NONE);
      impl->args[DNNL_ARG_DST] = memory(cmd, engine, DNNL_MEMORY_NONE);
      impl->bindings = {
          {DNNL_ARG_SRC, operandBuffer[0]}, {DNNL_ARG_WEIGHTS, operandBuffer[1]}, {DNNL_ARG_DST, resultBuffer}};
      impl->description =
          "onednn matmul " + dimsText(ad) + "x" + dimsText(bd) + postText + " (" + pd.impl_info_str() + ")";
    } else {
      const std::vector<int64_t> x = dimsOfValue(anchor->operand(0)), w = dimsOfValue(anchor->operand(1));
      const size_t k = x.size() - 2;
      if (k < 1 || k > 3) return Error("oneDNN convolutions are 1-, 2- or 3-d");
      const int64_t groups = anchor->getInt("groups");
      auto intsOr = [&](std::string_view name, int64_t fill, size_t n) {
        const Attribute* attrValue = anchor->attr(name);
        std::vector<int64_t> v = attrValue ? attrValue->getInts() : std::vector<int64_t>{};
        if (v.empty()) v.assign(n, fill);
        return v;
      };
      // conv_transpose (a conv's input gradient) is oneDNN's deconvolution.
      const bool transposed = anchor->kind() == OpKind::ConvTranspose;
      const std::vector<int64_t> strides = intsOr("strides", 1, k), dilations = intsOr("dilations", 1, k);
      const std::vector<int64_t> pads = intsOr("pads", 0, 2 * k);
      const std::vector<int64_t> outputPadding = transposed ? intsOr("output_padding", 0, k) : std::vector<int64_t>(k);
      memory::dims dnnlDilations, padL, padR;
      for (size_t d = 0; d < k; ++d) {
        dnnlDilations.push_back(dilations[d] - 1);
        padL.push_back(pads[d]);
        // A deconvolution's output size counts the end padding less its
        // output_padding (ONNX ConvTranspose's extra rows at the end).
        padR.push_back(pads[k + d] - outputPadding[d]);
      }
      // Groups: conv weights [M, C/g, k...] read as [g, M/g, C/g, k...], the
      // same row-major memory. A deconvolution's weights are [C, M/g, k...]:
      // oneDNN's [M, C, k...] (or [g, M/g, C/g, k...]) with strides that
      // read Kiln's memory.
      const int64_t taps = numElements(anchor->operand(1)->type().shape) / (w[0] * w[1]);
      const int64_t outChannels = transposed ? w[1] * groups : w[0];
      memory::dims wd(w.begin(), w.end());
      memory::desc wmd;
      if (!transposed) {
        if (groups > 1) {
          wd.insert(wd.begin(), groups);
          wd[1] /= groups;
        }
        wmd = plainDesc(wd);
      } else {
        const int64_t groupIn = w[0] / groups, groupOut = w[1];
        wd = {groupOut, groupIn};
        memory::dims wStrides = {taps, groupOut * taps};
        for (size_t d = 0; d < k; ++d) {
          wd.push_back(w[2 + d]);
          int64_t inner = 1;
          for (size_t e = d + 1; e < k; ++e) inner *= w[2 + e];
          wStrides.push_back(inner);
        }
        if (groups > 1) {
          wd.insert(wd.begin(), groups);
          wStrides.insert(wStrides.begin(), groupIn * groupOut * taps);
        } else {
          wd[0] = outChannels;
        }
        wmd = memory::desc(wd, memory::data_type::f32, wStrides);
      }
      const memory::desc xmd = plainDesc(x), ymd = plainDesc(dstDims);
      const bool hasBias = anchor->numOperands() > 2;
      const memory::desc bmd = hasBias ? plainDesc({outChannels}) : memory::desc();
      const memory::dims strideDims(strides.begin(), strides.end());
      const memory::desc anyX(x, memory::data_type::f32, memory::format_tag::any);
      const memory::desc anyW(wd, memory::data_type::f32, memory::format_tag::any);
      const memory::desc anyY(dstDims, memory::data_type::f32, memory::format_tag::any);
      // Layouts of oneDNN's choosing (blocked channels, for its direct
      // convolution kernels), with the input and output reordered, beat the
      // plain layouts (its gemm-based convolution) at batch 1 and 64 on the
      // CNN (docs/matmul.md); the plain ones remain for what it refuses.
      auto choose = [&]<typename Primitive>(auto describe) {
        std::optional<typename Primitive::primitive_desc> pd;
        try {
          pd.emplace(describe(anyX, anyW, anyY), attr, engine);
        } catch (const dnnl::error&) {
          pd.reset();
        }
        if (!pd) pd.emplace(describe(xmd, wmd, ymd), attr, engine);
        impl->primitive = Primitive(*pd);
        return ConvDescs{pd->src_desc(), pd->weights_desc(), pd->dst_desc(), pd->impl_info_str()};
      };
      ConvDescs chosen;
      if (transposed) {
        chosen = choose.template operator()<dnnl::deconvolution_forward>(
            [&](const memory::desc& src, const memory::desc& weights, const memory::desc& dst) {
              return dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                       algorithm::deconvolution_direct, src, weights, bmd, dst,
                                                       strideDims, dnnlDilations, padL, padR);
            });
      } else {
        chosen = choose.template operator()<dnnl::convolution_forward>(
            [&](const memory::desc& src, const memory::desc& weights, const memory::desc& dst) {
              return dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                     algorithm::convolution_direct, src, weights, bmd, dst,
                                                     strideDims, dnnlDilations, padL, padR);
            });
      }
      // Multiply-adds: each input element of a deconvolution meets M/g x taps
      // weights; each output element of a conv, C/g x taps.
      impl->work = transposed ? numElements(anchor->operand(0)->type().shape) * w[1] * taps
                              : numElements(anchor->result()->type().shape) * w[1] * taps;
      // An operand whose chosen layout is not the plain one goes through a
      // reorder into memory of the kernel's own.
      auto bindInput = [&](int arg, const memory::desc& plain, const memory::desc& chosen, int buffer, bool constant) {
        if (chosen == plain) {
          impl->args[arg] = memory(plain, engine, DNNL_MEMORY_NONE);
          impl->bindings.push_back({arg, buffer});
          return;
        }
        Impl::Reorder r;
        r.plain = memory(plain, engine, DNNL_MEMORY_NONE);
        r.blocked = memory(chosen, engine);
        r.primitive = dnnl::reorder(r.plain, r.blocked);
        r.buffer = buffer;
        r.constant = constant;
        impl->args[arg] = r.blocked;
        impl->inputReorders.push_back(std::move(r));
      };
      auto isConstant = [&](size_t operand) {
        const int buffer = operandBuffer[operand];
        return buffer < static_cast<int>(constantOperands.size()) && constantOperands[buffer];
      };
      bindInput(DNNL_ARG_SRC, xmd, chosen.src, operandBuffer[0], isConstant(0));
      bindInput(DNNL_ARG_WEIGHTS, wmd, chosen.weights, operandBuffer[1], isConstant(1));
      if (hasBias) {
        impl->args[DNNL_ARG_BIAS] = memory(bmd, engine, DNNL_MEMORY_NONE);
        impl->bindings.push_back({DNNL_ARG_BIAS, operandBuffer[2]});
      }
      if (chosen.dst == ymd) {
        impl->args[DNNL_ARG_DST] = memory(ymd, engine, DNNL_MEMORY_NONE);
        impl->bindings.push_back({DNNL_ARG_DST, resultBuffer});
      } else {
        Impl::Reorder r;
        r.plain = memory(ymd, engine, DNNL_MEMORY_NONE);
        r.blocked = memory(chosen.dst, engine);
        r.primitive = dnnl::reorder(r.blocked, r.plain);
        r.buffer = resultBuffer;
        impl->args[DNNL_ARG_DST] = r.blocked;
        impl->outputReorders.push_back(std::move(r));
      }
      const std::string layouts = impl->inputReorders.empty() && impl->outputReorders.empty() ? "" : ", blocked";
      impl->description = std::string(transposed ? "onednn deconv " : "onednn conv ") + dimsText(x) + "*" +
                          dimsText(wd) + postText + " (" + chosen.impl + layouts + ")";
    }
    for (size_t i = 0; i < postOps.size(); ++i) {
      if (!postOps[i].binary) continue;
      const int arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i)) | DNNL_ARG_SRC_1;
      impl->args[arg] = memory(plainDesc(postOps[i].dims), engine, DNNL_MEMORY_NONE);
      impl->bindings.push_back({arg, postOps[i].arg});
    }
  } catch (const dnnl::error& e) {
    return Error(std::string("oneDNN refuses it: ") + e.what());
  }
  return std::unique_ptr<DnnlKernel>(new DnnlKernel(std::move(impl)));
}

void DnnlKernel::run(void* const* buffers) const {
  for (const auto& [arg, buffer] : impl_->bindings) impl_->args.at(arg).set_data_handle(buffers[buffer]);
  static thread_local dnnl::stream stream(cpuEngine());
  for (Impl::Reorder& r : impl_->inputReorders) {
    if (r.constant && r.reordered == buffers[r.buffer]) continue;
    r.plain.set_data_handle(buffers[r.buffer]);
    r.primitive.execute(stream, r.plain, r.blocked);
    r.reordered = buffers[r.buffer];
  }
  impl_->primitive.execute(stream, impl_->args);
  for (Impl::Reorder& r : impl_->outputReorders) {
    r.plain.set_data_handle(buffers[r.buffer]);
    r.primitive.execute(stream, r.blocked, r.plain);
  }
  stream.wait();
}

void setDnnlThreads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

}  // namespace kiln::codegen
