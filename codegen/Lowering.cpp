// The lowering dispatch and what lowerOpToKernel builds around one op or a
// fused group. The lowerings themselves live with their op family in
// codegen/Lowering<Family>.cpp (Elementwise, Layout, Reduce, Contraction,
// Random; the families of runtime/*Kernels.cpp), each registering one entry
// per op in `lowerings::<Enum>`; the families without element functions
// register theirs below. Every lowering maps a result multi-index to the
// scalar expression of that element; operands are read through the
// LoweringContext with indices that are always in bounds (broadcast dims
// read index 0, concat and pad clamp the index of the operand they do not
// select, gathers clamp their indices), because the emitters evaluate both
// sides of a select.
#include "codegen/Lowering.h"

#include "codegen/Schedule.h"

#include "codegen/LoweringSupport.h"
#include "ir/ConstantValue.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>

namespace kiln::codegen {

namespace lower {

std::vector<int64_t> dimsOf(const Value* v) { return staticDims(v->type().shape); }

Index broadcastIndex(const Index& index, const std::vector<int64_t>& shape) {
  Index out;
  const size_t lead = index.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) out.push_back(shape[d] == 1 ? kir::index(0) : index[lead + d]);
  return out;
}

bool indexConstant(const ExprPtr& e, int64_t& out) {
  if (e->kind != kir::ExprKind::Const || e->type != DType::I64) return false;
  out = e->intValue;
  return true;
}

bool sameExpr(const ExprPtr& a, const ExprPtr& b) {
  if (a == b) return true;
  if (a->kind != b->kind || a->type != b->type || a->intValue != b->intValue || a->floatValue != b->floatValue ||
      a->id != b->id || a->unary != b->unary || a->binary != b->binary || a->reduce != b->reduce ||
      a->selectLast != b->selectLast || a->extents != b->extents || a->args.size() != b->args.size())
    return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!sameExpr(a->args[i], b->args[i])) return false;
  return true;
}

ExprPtr unraveledOffset(const Index& index, const std::vector<int64_t>& shape) {
  if (index.size() != shape.size() || shape.empty()) return nullptr;
  ExprPtr linear;
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0 && !linear;) {
    if (shape[d] != 1 || d == 0) {
      ExprPtr q = index[d];
      if (d > 0) {
        int64_t size = 0;
        if (q->kind != kir::ExprKind::Binary || q->binary != kir::BinaryFn::Rem || !indexConstant(q->args[1], size) ||
            size != shape[d])
          return nullptr;
        q = q->args[0];
      }
      if (stride == 1) {
        linear = q;
      } else {
        int64_t by = 0;
        if (q->kind != kir::ExprKind::Binary || q->binary != kir::BinaryFn::Div || !indexConstant(q->args[1], by) ||
            by != stride)
          return nullptr;
        linear = q->args[0];
      }
    }
    stride *= shape[d];
  }
  const Index expected = unravel(linear, shape);
  for (size_t d = 0; d < shape.size(); ++d)
    if (!sameExpr(index[d], expected[d])) return nullptr;
  return linear;
}

ExprPtr linearize(const Index& index, const std::vector<int64_t>& shape) {
  ExprPtr offset = kir::index(0);
  for (size_t a = 0; a < shape.size();) {
    size_t b = shape.size();
    ExprPtr run;
    for (; b > a + 1; --b) {
      run = unraveledOffset(Index(index.begin() + static_cast<std::ptrdiff_t>(a),
                                  index.begin() + static_cast<std::ptrdiff_t>(b)),
                            std::vector<int64_t>(shape.begin() + static_cast<std::ptrdiff_t>(a),
                                                 shape.begin() + static_cast<std::ptrdiff_t>(b)));
      if (run) break;
    }
    if (!run) {
      run = index[a];
      b = a + 1;
    }
    int64_t size = 1;
    for (size_t d = a; d < b; ++d) size *= shape[d];
    offset = kir::add(kir::mul(offset, kir::index(size)), run);
    a = b;
  }
  return offset;
}

ExprPtr stridedOffset(const Index& index, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  ExprPtr offset = kir::index(0);
  for (size_t a = 0; a < shape.size();) {
    size_t b = a + 1;
    ExprPtr run = index[a];
    for (size_t e = shape.size(); e > a + 1; --e) {
      bool rowMajor = true;
      for (size_t d = a; d + 1 < e; ++d) rowMajor = rowMajor && strides[d] == strides[d + 1] * shape[d + 1];
      if (!rowMajor) continue;
      ExprPtr r = unraveledOffset(Index(index.begin() + static_cast<std::ptrdiff_t>(a),
                                        index.begin() + static_cast<std::ptrdiff_t>(e)),
                                  std::vector<int64_t>(shape.begin() + static_cast<std::ptrdiff_t>(a),
                                                       shape.begin() + static_cast<std::ptrdiff_t>(e)));
      if (!r) continue;
      run = r;
      b = e;
      break;
    }
    offset = kir::add(offset, kir::mul(run, kir::index(strides[b - 1])));
    a = b;
  }
  return offset;
}

Index unravel(const ExprPtr& linear, const std::vector<int64_t>& shape) {
  Index out(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    ExprPtr q = kir::div(linear, kir::index(stride));
    // The first dim needs no modulo: the offset is below the element count.
    out[d] = d == 0 ? q : kir::rem(q, kir::index(shape[d]));
    stride *= shape[d];
  }
  return out;
}

ExprPtr clampIndex(const ExprPtr& i, int64_t size) {
  return kir::max(kir::min(i, kir::index(std::max<int64_t>(size - 1, 0))), kir::index(0));
}

ExprPtr literal(DType t, int64_t value) {
  return isFloat(t) ? kir::constant(t, static_cast<double>(value)) : kir::constantInt(t, value);
}

ExprPtr lowestOf(DType t) {
  if (isFloat(t)) return kir::constant(t, -std::numeric_limits<double>::infinity());
  switch (t) {
    case DType::I64: return kir::constantInt(t, std::numeric_limits<int64_t>::min());
    case DType::I32: return kir::constantInt(t, std::numeric_limits<int32_t>::min());
    case DType::I16: return kir::constantInt(t, std::numeric_limits<int16_t>::min());
    case DType::I8: return kir::constantInt(t, std::numeric_limits<int8_t>::min());
    default: return kir::constantInt(t, 0);  // unsigned, bool
  }
}

ExprPtr highestOf(DType t) {
  if (isFloat(t)) return kir::constant(t, std::numeric_limits<double>::infinity());
  switch (t) {
    case DType::I64: return kir::constantInt(t, std::numeric_limits<int64_t>::max());
    case DType::I32: return kir::constantInt(t, std::numeric_limits<int32_t>::max());
    case DType::I16: return kir::constantInt(t, std::numeric_limits<int16_t>::max());
    case DType::I8: return kir::constantInt(t, std::numeric_limits<int8_t>::max());
    case DType::U8: return kir::constantInt(t, std::numeric_limits<uint8_t>::max());
    case DType::U16: return kir::constantInt(t, std::numeric_limits<uint16_t>::max());
    case DType::U32: return kir::constantInt(t, std::numeric_limits<uint32_t>::max());
    case DType::U64: return kir::constantInt(t, -1);  // the bits of 2^64 - 1
    default: return kir::constantInt(t, 1);  // bool
  }
}

ExprPtr inRange(const ExprPtr& i, int64_t size) {
  return kir::binary(kir::BinaryFn::And, kir::binary(kir::BinaryFn::Ge, i, kir::index(0)),
                     kir::binary(kir::BinaryFn::Lt, i, kir::index(size)));
}

bool isSplat(const DenseTensor& t) {
  for (int64_t i = 1; i < t.numElements(); ++i)
    if (t.getDouble(i) != t.getDouble(0) || t.getInt(i) != t.getInt(0)) return false;
  return true;
}

}  // namespace lower

using namespace lower;

// The ops of the families that have no element function: composites are
// decomposed, and the others run as steps of their own.
namespace lowerings {
using kir::BinaryFn;
using kir::ReduceKind;
using kir::UnaryFn;
// Composites are decomposed (-O2) before lowering.
const LowerFn Softmax = nullptr;
const LowerFn LogSoftmax = nullptr;
const LowerFn LayerNorm = nullptr;
const LowerFn BatchNorm = nullptr;
const LowerFn Gelu = nullptr;
const LowerFn Silu = nullptr;
const LowerFn LeakyRelu = nullptr;
const LowerFn Elu = nullptr;
const LowerFn Softplus = nullptr;
const LowerFn Attention = nullptr;
const LowerFn CrossEntropy = nullptr;
const LowerFn NllLoss = nullptr;
const LowerFn MseLoss = nullptr;
const LowerFn Quantize = nullptr;
const LowerFn Dequantize = nullptr;
const LowerFn Rnn = nullptr;
const LowerFn Lstm = nullptr;
const LowerFn Gru = nullptr;
// Collectives are steps of their own that the runtime runs on the
// communicator (LowerToKernels.cpp, runtime/Collectives.h).
const LowerFn AllReduce = nullptr;
const LowerFn BroadcastFrom = nullptr;
const LowerFn ReduceTo = nullptr;
const LowerFn AllGather = nullptr;
const LowerFn ReduceScatter = nullptr;
// Ops whose result sizes depend on values run on the host between the CPU
// executor's compiled stages (CpuExecutable.cpp); the CUDA path refuses them.
const LowerFn NonZero = nullptr;
const LowerFn Unique = nullptr;
const LowerFn NonMaxSuppression = nullptr;
// `if` and `loop` are steps of their own that run their bodies as
// sub-programs (LowerToKernels.cpp).
const LowerFn If = nullptr;
const LowerFn Loop = nullptr;
// A check runs on the host before the step that reads its operand.
const LowerFn Check = nullptr;
// A `fused` op is not one element function but a group: lowerOpToKernel
// composes its region's ops through a FusedContext.
const LowerFn Fused = nullptr;
const LowerFn Return = nullptr;
}  // namespace lowerings

namespace {
// One lowering per op kind, in Ops.def order (an op without an entry fails to link).
constexpr const LowerFn* kLowerings[] = {
#define KILN_OP(Enum, ...) &lowerings::Enum,
#include "ir/Ops.def"
#undef KILN_OP
};
static_assert(std::size(kLowerings) == kNumOpKinds);

}  // namespace

LowerFn loweringFor(OpKind kind) { return *kLowerings[static_cast<size_t>(kind)]; }

std::string whyNotLowerable(const Op& op) {
  if (op.kind() == OpKind::Fused) {
    // A group lowers when each of its ops does; its constants must be
    // splats (literals), since a region has no buffers of its own.
    if (!op.region() || op.numResults() != 1) return "'fused' with more than one result (not lowered yet)";
    for (const auto& inner : op.region()->ops()) {
      if (inner->kind() == OpKind::Return) continue;
      if (std::string why = whyNotLowerable(*inner); !why.empty()) return why + " inside 'fused'";
      if (inner->kind() == OpKind::Constant && !isSplat(inner->getTensor("value")))
        return "a non-splat constant inside 'fused'";
    }
    return {};
  }
  if (op.kind() == OpKind::QConv || op.kind() == OpKind::QMatMul)
    return "'" + std::string(op.name()) +
           "' (int8) is computed only by a library call (oneDNN on the CPU), which this target did not take";
  if (!loweringFor(op.kind())) return "no CPU lowering for '" + std::string(op.name()) + "' yet";
  auto check = [&](const Value* v) -> std::string {
    if (!v->type().isStatic()) return "'" + std::string(op.name()) + "' with a non-static type " + v->type().str();
    return {};
  };
  for (const Value* v : op.operands())
    if (std::string why = check(v); !why.empty()) return why;
  for (const Value* v : op.results())
    if (std::string why = check(v); !why.empty()) return why;
  const OpKind k = op.kind();
  // An integer conv (ONNX ConvInteger's exact int32 sum) wraps as integer
  // arithmetic does everywhere; the others are lowered for floats only.
  if ((k == OpKind::ConvTranspose || k == OpKind::ConvWeightGrad || k == OpKind::AvgPool) &&
      !isFloat(op.result()->type().dtype))
    return "'" + std::string(op.name()) + "' on " + std::string(dtypeName(op.result()->type().dtype)) +
           " (transposed convolutions, their weight gradients and average pooling are lowered for floats only)";
  if (k == OpKind::Conv && op.result()->type().dtype == DType::Bool) return "'conv' on bool";
  return {};
}

namespace {

/// The load of buffer `buffer` (holding `v`) at `index`, at its strides
/// when `strides` gives them.
ExprPtr loadAt(int buffer, const Value* v, const Index& index, const BufferStrides& strides) {
  const size_t b = static_cast<size_t>(buffer);
  if (b < strides.size() && !strides[b].empty())
    return kir::load(buffer, v->type().dtype, stridedOffset(index, dimsOf(v), strides[b]));
  return kir::load(buffer, v->type().dtype, linearize(index, dimsOf(v)));
}

/// Answers operand reads of a one-op kernel with loads from its buffers.
class SingleOpContext : public LoweringContext {
 public:
  SingleOpContext(const Op& op, int firstFreeVar, const BufferStrides& strides)
      : op_(op), nextVar_(firstFreeVar), strides_(strides) {}
  Expected<ExprPtr> operand(size_t i, const Index& index) override {
    return loadAt(static_cast<int>(i), op_.operand(i), index, strides_);
  }
  int newVars(int count) override {
    nextVar_ += count;
    return nextVar_ - count;
  }
  int numVars() const { return nextVar_; }

 private:
  const Op& op_;
  int nextVar_;
  const BufferStrides& strides_;
};

/// Answers operand reads inside a `fused` op's region: a region argument is
/// a load from the kernel buffer of the matching operand; any other value is
/// computed in place by its defining op's lowering at the same index, which
/// is how a group composes its ops' lowerings into one expression.
class FusedContext : public LoweringContext {
 public:
  FusedContext(const Op& op, const Function& region, int& nextVar, const BufferStrides& strides)
      : op_(op), region_(region), nextVar_(nextVar), strides_(strides) {}
  Expected<ExprPtr> operand(size_t i, const Index& index) override { return valueAt(op_.operand(i), index); }
  int newVars(int count) override {
    nextVar_ += count;
    return nextVar_ - count;
  }

  Expected<ExprPtr> valueAt(const Value* v, const Index& index) {
    if (v->isArgument()) return loadAt(static_cast<int>(v->index()), v, index, strides_);
    const Op& def = *v->definingOp();
    FusedContext inner(def, region_, nextVar_, strides_);
    return loweringFor(def.kind())(def, inner, index);
  }

 private:
  const Op& op_;
  const Function& region_;
  int& nextVar_;
  const BufferStrides& strides_;
};

/// The expression of result `index` of a `fused` op: its region's returned
/// value, composed from the region's ops.
Expected<ExprPtr> lowerFusedResult(const Op& op, int& nextVar, const Index& index, const BufferStrides& strides) {
  const Function& region = *op.region();
  FusedContext ctx(*region.returnOp(), region, nextVar, strides);
  return ctx.valueAt(region.returnOp()->operand(0), index);
}

}  // namespace

/// scatter_elements as a scatter, not as the element function of
/// lowerScatterElements (which gathers every update along the axis for
/// each result element: O(result x updates along the axis); an embedding's
/// gradient, [4096,256] from 1024 tokens, took 1.1 s of a GPT's training
/// step). Each iteration of the parallel loop owns a run of adjacent lines
/// of the result along the axis (every other coordinate fixed): it copies
/// those lines of data, then applies, in order, the updates whose other
/// coordinates are a line's. Lines never share an element, so threads
/// never write the same one, and the updates apply in the interpreter's
/// order (the last write wins for reduction "none").
void lowerScatterKernel(const Op& op, kir::Kernel& kernel) {
  const std::vector<int64_t> data = dimsOf(op.operand(0)), indices = dimsOf(op.operand(1));
  const size_t rank = data.size();
  const int64_t raw = op.getInt("axis");
  const size_t axis = static_cast<size_t>(raw < 0 ? raw + static_cast<int64_t>(rank) : raw);
  const std::string& reduction = op.getString("reduction");
  const DType t = op.result()->type().dtype;
  const DType indexType = op.operand(1)->type().dtype;
  const int out = 3;
  std::vector<int64_t> lineDims;
  for (size_t d = 0; d < rank; ++d)
    if (d != axis) lineDims.push_back(data[d]);
  const int64_t lines = std::accumulate(lineDims.begin(), lineDims.end(), int64_t{1}, std::multiplies<>());
  // Lines next to each other in memory (along the last dim, when it is not
  // the axis) go to one iteration in runs of `run`, walked by an inner loop
  // (variable 3) inside each loop over the axis, so that copying data and
  // applying an update read and write consecutive elements: one line at a
  // time strides by the last dim on every element (an embedding gradient's
  // 256 features: 1 KiB).
  const int64_t last = axis + 1 == rank ? 1 : data[rank - 1];
  int64_t run = 1;
  for (int64_t c = std::min<int64_t>(last, 64); c > 1; --c)
    if (last % c == 0) {
      run = c;
      break;
    }
  Index line;
  if (run == 1) {
    line = unravel(kir::var(0), lineDims);
  } else {
    std::vector<int64_t> outerDims(lineDims.begin(), lineDims.end() - 1);
    outerDims.push_back(last / run);
    line = unravel(kir::var(0), outerDims);
    line.back() = kir::add(kir::mul(line.back(), kir::index(run)), kir::var(3));
  }
  // The index of the line's element `along` the axis, in a tensor of `dims`
  // (data's, or indices' with the line's other coordinates clamped to them).
  auto at = [&](const ExprPtr& along, const std::vector<int64_t>& dims) {
    Index ix;
    for (size_t d = 0, l = 0; d < rank; ++d)
      ix.push_back(d == axis ? along : dims[d] < data[d] ? clampIndex(line[l++], dims[d]) : line[l++]);
    return linearize(ix, dims);
  };
  const ExprPtr copyAt = at(kir::var(1), data);
  // Data that is one value (the zeros of a gather's gradient) is stored,
  // not read.
  const std::optional<double> splat = splatValue(op.operand(0));
  const ExprPtr initial = splat ? kir::constant(t, *splat) : kir::load(0, t, copyAt);
  auto alongRun = [&](std::vector<kir::StmtPtr> statements) { return kir::forLoop(3, run, false, false, std::move(statements)); };
  std::vector<kir::StmtPtr> body = {
      kir::forLoop(1, data[axis], false, false, {alongRun({kir::store(out, copyAt, initial)})})};
  bool empty = false;
  for (int64_t extent : indices) empty = empty || extent == 0;
  if (!empty) {
    // Lines beyond indices' shape take no updates.
    ExprPtr covered;
    for (size_t d = 0, l = 0; d < rank; ++d) {
      if (d == axis) continue;
      const ExprPtr& coordinate = line[l++];
      if (indices[d] >= data[d]) continue;
      ExprPtr ok = kir::binary(kir::BinaryFn::Lt, coordinate, kir::index(indices[d]));
      covered = covered ? kir::binary(kir::BinaryFn::And, covered, ok) : ok;
    }
    const ExprPtr updateAt = at(kir::var(2), indices);
    ExprPtr target = kir::cast(kir::load(1, indexType, updateAt), DType::I64);
    target = kir::select(kir::binary(kir::BinaryFn::Lt, target, kir::index(0)), kir::add(target, kir::index(data[axis])),
                         target);
    if (covered) target = kir::select(covered, target, kir::index(0));
    const ExprPtr targetAt = at(target, data);
    const ExprPtr current = kir::load(out, t, targetAt), update = kir::load(2, t, updateAt);
    ExprPtr value = update;
    if (reduction == "add") value = kir::binary(kir::BinaryFn::Add, current, update);
    if (reduction == "mul") value = kir::binary(kir::BinaryFn::Mul, current, update);
    if (reduction == "max") value = kir::binary(kir::BinaryFn::Max, current, update);
    if (reduction == "min") value = kir::binary(kir::BinaryFn::Min, current, update);
    if (covered) value = kir::select(covered, value, current);
    body.push_back(kir::forLoop(2, indices[axis], false, false, {alongRun({kir::store(out, targetAt, value)})}));
  }
  kernel.body.push_back(kir::forLoop(0, lines / run, true, false, std::move(body)));
  kernel.numVars = 4;
}

Expected<kir::Kernel> lowerConcatKernel(const Op& op, std::string name, const std::vector<int>& copied,
                                        const BufferStrides& strides) {
  if (std::string why = whyNotLowerable(op); !why.empty()) return op.emitError(why);
  const std::vector<int64_t> shape = dimsOf(op.result());
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t rawAxis = op.getInt("axis");
  const int64_t axis = rawAxis < 0 ? rawAxis + rank : rawAxis;
  if (axis < 0 || axis >= rank) return op.emitError("concat axis " + std::to_string(rawAxis) + " out of range");
  kir::Kernel kernel;
  kernel.name = std::move(name);
  for (const Value* v : op.operands())
    kernel.buffers.push_back({v->name(), v->type().dtype, dimsOf(v), kir::Buffer::Role::Input});
  kernel.buffers.push_back({op.result()->name(), op.result()->type().dtype, shape, kir::Buffer::Role::Output});
  const int out = static_cast<int>(op.numOperands());
  auto stridesOf = [&](size_t buffer, const std::vector<int64_t>& dims) {
    if (buffer < strides.size() && !strides[buffer].empty()) return strides[buffer];
    std::vector<int64_t> dense(dims.size(), 1);
    for (size_t d = dims.size(); d-- > 1;) dense[d - 1] = dense[d] * dims[d];
    return dense;
  };
  const std::vector<int64_t> outStrides = stridesOf(static_cast<size_t>(out), shape);
  const std::vector<int64_t> outerDims(shape.begin(), shape.begin() + axis);
  const int64_t outer = std::accumulate(outerDims.begin(), outerDims.end(), int64_t{1}, std::multiplies<>());
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (const Value* v : op.operands()) {
    starts.push_back(start);
    start += dimsOf(v)[static_cast<size_t>(axis)];
  }
  // Each copied operand's row (its elements along the axis and after it,
  // under one index of the dims before) is cut into `chunks` equal runs of
  // at least kMinRun elements, so that a concat with few rows (batch 1
  // channels first: one) still spreads over threads (and CUDA blocks).
  constexpr int64_t kMinRun = 512, kMaxTasks = int64_t{1} << 16;
  auto rowOf = [&](int k) {
    const std::vector<int64_t> dims = dimsOf(op.operand(static_cast<size_t>(k)));
    return std::accumulate(dims.begin() + axis, dims.end(), int64_t{1}, std::multiplies<>());
  };
  int64_t common = 0, shortest = std::numeric_limits<int64_t>::max();
  for (int k : copied)
    if (const int64_t row = rowOf(k); row > 0) {
      common = std::gcd(common, row);
      shortest = std::min(shortest, row);
    }
  int64_t chunks = 1;
  while (common > 0 && common % (chunks * 2) == 0 && shortest / (chunks * 2) >= kMinRun &&
         outer * chunks * 2 <= kMaxTasks)
    chunks *= 2;
  const ExprPtr task = kir::var(0);
  const Index outerIndex = unravel(kir::div(task, kir::index(chunks)), outerDims);
  const ExprPtr chunk = kir::rem(task, kir::index(chunks));
  std::vector<kir::StmtPtr> copies;
  int nextVar = 1;
  for (int k : copied) {
    const std::vector<int64_t> dims = dimsOf(op.operand(static_cast<size_t>(k)));
    const std::vector<int64_t> rowDims(dims.begin() + axis, dims.end());
    const int64_t row = rowOf(k);
    if (row == 0) continue;
    const int j = nextVar++;
    const int64_t run = row / chunks;
    Index index = outerIndex;
    const Index inRow = unravel(kir::add(kir::mul(chunk, kir::index(run)), kir::var(j)), rowDims);
    index.insert(index.end(), inRow.begin(), inRow.end());
    const ExprPtr from = stridedOffset(index, dims, stridesOf(static_cast<size_t>(k), dims));
    const ExprPtr to = kir::add(stridedOffset(index, dims, outStrides),
                                kir::index(starts[static_cast<size_t>(k)] * outStrides[static_cast<size_t>(axis)]));
    copies.push_back(kir::forLoop(j, run, false, true,
                                  {kir::store(out, to, kir::load(k, op.operand(static_cast<size_t>(k))->type().dtype, from))}));
  }
  if (!copies.empty()) kernel.body.push_back(kir::forLoop(0, outer * chunks, true, false, std::move(copies)));
  kernel.numVars = nextVar;
  return kernel;
}

namespace {

/// Whether `e` holds a reduction.
bool hasReduction(const ExprPtr& e) {
  if (e->kind == kir::ExprKind::Reduce) return true;
  for (const ExprPtr& a : e->args)
    if (hasReduction(a)) return true;
  return false;
}

/// Calls `visit` on each load of `e`.
void forEachLoad(const ExprPtr& e, const std::function<void(const kir::Expr&)>& visit) {
  if (e->kind == kir::ExprKind::Load) visit(*e);
  for (const ExprPtr& a : e->args) forEachLoad(a, visit);
}

}  // namespace

std::optional<TransposeTiling> transposeTiling(const ExprPtr& value, const std::vector<int64_t>& shape,
                                               const std::vector<int64_t>& outStrides) {
  const size_t rank = shape.size();
  if (rank < 2 || shape.back() < 2 || hasReduction(value)) return std::nullopt;
  const int b = static_cast<int>(rank) - 1;
  if (!outStrides.empty() && outStrides.back() != 1) return std::nullopt;
  std::optional<size_t> across;
  size_t widest = 0;  // bytes of the widest transposed element
  forEachLoad(value, [&](const kir::Expr& load) {
    const std::optional<int64_t> inner = strideIn(*load.args[0], b);
    if (!inner || *inner == 0 || *inner == 1) return;
    for (size_t d = 0; d + 1 < rank; ++d)
      if (shape[d] > 1 && strideIn(*load.args[0], static_cast<int>(d)) == 1) {
        if (!across) across = d;
        if (across == d) widest = std::max(widest, dtypeSize(load.type));
        break;
      }
  });
  if (!across) return std::nullopt;
  // Tiles of 16 x 16 read and write whole 64-byte lines of f32 (16 vectors
  // of 16 lanes transposed in registers); measured on [1024,1024] f32 here,
  // 0.28 against 0.43 ms for tiles of 8. Wider elements keep 8 (16 x 16
  // f64 would not fit the registers).
  if (widest <= 4 && shape[*across] % kWideTransposeTile == 0 && shape.back() % kWideTransposeTile == 0)
    return TransposeTiling{*across, kWideTransposeTile, kWideTransposeTile};
  return TransposeTiling{*across, transposeTile(shape[*across]), transposeTile(shape.back())};
}

int64_t transposeTile(int64_t extent) {
  if (extent <= kTransposeTile) return extent;
  // The smallest divisor from the tile up to four times it, else the
  // largest from half the tile; a dim with neither (a prime: ViT's 197
  // tokens) is one tile when its lines fit in L1 (a tile of 197 x 8 f32
  // reads 197 lines and writes 197 half lines, 25 KB), else it is cut in
  // its largest divisor below the tile (perhaps 1: the untiled order).
  for (int64_t t = kTransposeTile; t <= 4 * kTransposeTile; ++t)
    if (extent % t == 0) return t;
  for (int64_t t = kTransposeTile - 1; t >= kTransposeTile / 2; --t)
    if (extent % t == 0) return t;
  if (extent <= 32 * kTransposeTile) return extent;
  for (int64_t t = kTransposeTile / 2 - 1; t > 1; --t)
    if (extent % t == 0) return t;
  return 1;
}

int64_t rowRun(int64_t outer, int64_t row) {
  if (outer != 1 || row < 2 * kMinRowRun) return row;
  // The shortest run of at least kMinRowRun and an eighth of the row that
  // divides it, a whole number of 16-lane vectors where one does.
  const int64_t least = std::max(kMinRowRun, (row + kRowRuns - 1) / kRowRuns);
  for (const bool whole : {true, false})
    for (int64_t run = least; run <= std::min(row / 2, least * kRowRuns); ++run)
      if (row % run == 0 && (!whole || run % 16 == 0)) return run;
  return row;
}

Expected<kir::Kernel> lowerOpToKernel(const Op& op, std::string name, const BufferStrides& strides) {
  if (std::string why = whyNotLowerable(op); !why.empty()) return op.emitError(why);
  if (op.kind() == OpKind::Concat) {
    std::vector<int> all(op.numOperands());
    std::iota(all.begin(), all.end(), 0);
    return lowerConcatKernel(op, std::move(name), all, strides);
  }
  kir::Kernel kernel;
  kernel.name = std::move(name);
  for (const Value* v : op.operands())
    kernel.buffers.push_back({v->name(), v->type().dtype, dimsOf(v), kir::Buffer::Role::Input});
  const Value* result = op.result();
  const std::vector<int64_t> shape = dimsOf(result);
  kernel.buffers.push_back({result->name(), result->type().dtype, shape, kir::Buffer::Role::Output});
  const int out = static_cast<int>(op.numOperands());
  if (op.kind() == OpKind::ScatterElements) {
    lowerScatterKernel(op, kernel);
    return kernel;
  }

  // Variables 0 and 1: the flattened outer dims (parallel) and the last dim
  // (vectorized). A scalar result has neither loop.
  SingleOpContext ctx(op, 2, strides);
  int fusedVars = 2;
  auto lowerResult = [&](const Index& index) -> Expected<ExprPtr> {
    if (op.kind() == OpKind::Fused) return lowerFusedResult(op, fusedVars, index, strides);
    return loweringFor(op.kind())(op, ctx, index);
  };
  if (shape.empty()) {
    auto value = lowerResult({});
    if (!value) return value.takeError();
    kernel.body.push_back(kir::store(out, kir::index(0), *value));
    kernel.numVars = std::max(ctx.numVars(), fusedVars);
    return kernel;
  }
  const size_t outBuffer = static_cast<size_t>(out);
  const std::vector<int64_t> outStrides =
      outBuffer < strides.size() ? strides[outBuffer] : std::vector<int64_t>{};
  if (shape.size() >= 2) {
    // Probe: the element at index (%i0, %i1, ...) tells which loads read
    // across the result's rows.
    Index probe;
    for (size_t d = 0; d < shape.size(); ++d) probe.push_back(kir::var(static_cast<int>(d)));
    SingleOpContext probeCtx(op, static_cast<int>(shape.size()), strides);
    int probeVars = static_cast<int>(shape.size());
    auto probed = op.kind() == OpKind::Fused ? lowerFusedResult(op, probeVars, probe, strides)
                                             : loweringFor(op.kind())(op, probeCtx, probe);
    if (!probed) return probed.takeError();
    if (const std::optional<TransposeTiling> tiling = transposeTiling(*probed, shape, outStrides)) {
      // Tiles of tileA x tileB elements of dims `a` and the last: %i0 the
      // tile (the other dims' indices and the tile's position along a and
      // b, row-major), %i2 the row in the tile, %i1 the element in the row.
      const size_t a = tiling->dim, last = shape.size() - 1;
      std::vector<int64_t> grid = shape;
      grid[a] /= tiling->tileA;
      grid[last] /= tiling->tileB;
      const int64_t tiles = std::accumulate(grid.begin(), grid.end(), int64_t{1}, std::multiplies<>());
      Index index = unravel(kir::var(0), grid);
      index[a] = kir::add(kir::mul(index[a], kir::index(tiling->tileA)), kir::var(2));
      index[last] = kir::add(kir::mul(index[last], kir::index(tiling->tileB)), kir::var(1));
      SingleOpContext tiledCtx(op, 3, strides);
      int tiledVars = 3;
      auto value = op.kind() == OpKind::Fused ? lowerFusedResult(op, tiledVars, index, strides)
                                              : loweringFor(op.kind())(op, tiledCtx, index);
      if (!value) return value.takeError();
      const ExprPtr offset =
          outStrides.empty() ? linearize(index, shape) : stridedOffset(index, shape, outStrides);
      auto row = kir::forLoop(1, tiling->tileB, false, true, {kir::store(out, offset, *value)});
      // The rows of a tile are independent too: CUDA's grid takes them
      // (codegen/Schedule.h); the CPU runs them in order.
      auto rows = kir::forLoop(2, tiling->tileA, true, false, {row});
      kernel.body.push_back(kir::forLoop(0, tiles, true, false, {rows}));
      kernel.numVars = std::max(tiledCtx.numVars(), tiledVars);
      return kernel;
    }
  }
  const std::vector<int64_t> outerShape(shape.begin(), shape.end() - 1);
  int64_t outer = std::accumulate(outerShape.begin(), outerShape.end(), int64_t{1}, std::multiplies<>());
  int64_t inner = shape.back();
  Index index = unravel(kir::var(0), outerShape);
  index.push_back(kir::var(1));
  // A result of one row (a bias gradient's column sums, a loss's per-token
  // terms) would give the threads one iteration to share: its row is cut
  // into runs the parallel loop takes instead.
  if (const int64_t run = rowRun(outer, inner); run != inner) {
    // Every leading dim has size 1 (outer is 1): its index is 0, not the
    // run's number, which var 0 now counts.
    for (size_t d = 0; d + 1 < index.size(); ++d) index[d] = kir::index(0);
    index.back() = kir::add(kir::mul(kir::var(0), kir::index(run)), kir::var(1));
    outer = inner / run;
    inner = run;
  }
  auto value = lowerResult(index);
  if (!value) return value.takeError();
  const ExprPtr offset = !outStrides.empty()
                             ? stridedOffset(index, shape, outStrides)
                             : kir::add(kir::mul(kir::var(0), kir::index(inner)), kir::var(1));
  auto innerLoop = kir::forLoop(1, inner, false, true, {kir::store(out, offset, *value)});
  kernel.body.push_back(kir::forLoop(0, outer, true, false, {innerLoop}));
  kernel.numVars = std::max(ctx.numVars(), fusedVars);
  return kernel;
}

}  // namespace kiln::codegen
