// The `plan-memory` pass and planMemory: live ranges of the intermediates
// over the kernel sequence, in-place reuse by elementwise kernels,
// largest-first packing into one arena, and donated arguments written in
// place or copied at the end (docs/codegen.md §4).
//
// The plan is an artifact beside the IR, not in it: the pass attaches
// nothing (an `arena_offset` attribute would have to be declared for every
// op in the op table), it only checks that every function can be planned and
// fails with the located error when one cannot. `kiln-opt
// --print-memory-plan` prints the plan; the runtime calls planMemory on the
// function it compiles.
#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ir/ByteSize.h"
#include "ir/ShapeRules.h"
#include "passes/MemoryPlan.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

int64_t alignUp(int64_t n, int64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

/// Bytes of a static tensor type, or nullopt above 2^40 (1 TiB): no device
/// has that much memory, and the bound keeps every sum of sizes and offsets
/// far from int64 overflow.
std::optional<int64_t> byteSize(const TensorType& type) {
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  int64_t bytes = static_cast<int64_t>(dtypeSize(type.dtype));
  for (const Dim& d : type.shape)
    if (__builtin_mul_overflow(bytes, d.size, &bytes) || bytes > kMaxBytes) return std::nullopt;
  return bytes;
}

/// The error of a static value over byteSize's limit.
std::string tooLarge(const Value& v, const std::string& name) {
  return allocationError(tensorByteSize(v.type()), "%" + name, v.type()).message() +
         ": more than 1 TiB (2^40 bytes), the most a value may take";
}

/// Constants (and iota, which depends on nothing either) are stored with the
/// weights; `return` computes nothing. Every other top-level op is a kernel.
/// Bytes of result `v` of a data-dependent op at the most its unknown dim
/// can be (dataDependentBound), when that and its other dims are static.
std::optional<int64_t> boundedByteSize(const Op& op, const Value* v) {
  auto bound = dataDependentBound(op, static_cast<size_t>(v->index()));
  if (!bound) return std::nullopt;
  TensorType type = v->type();
  int unknown = 0;
  for (Dim& d : type.shape) {
    if (d.isStatic()) continue;
    d = Dim::fixed(*bound);
    ++unknown;
  }
  if (unknown != 1) return std::nullopt;
  return byteSize(type);
}

bool isKernel(const Op& op) {
  return op.info().opClass != OpClass::Constant && op.kind() != OpKind::Return && op.kind() != OpKind::Check;
}

/// Kernels that may read an input element only at the index they write: a
/// single-result primitive elementwise op, or a fused group of kind
/// "elementwise". Such a kernel may write its result over an input of the
/// same element count and element size (an input that is not broadcast)
/// that it reads at the written index (readsAtWrittenIndex). The fused op is
/// recognized by name, so this file does not depend on when the op table
/// gains it.
bool mayRunInPlace(const Op& op) {
  if (op.numResults() != 1) return false;
  if (op.info().isElementwise()) return true;
  if (op.name() != "fused") return false;
  const Attribute* kind = op.attr("kind");
  return kind && kind->kind() == AttrKind::String && kind->getString() == "elementwise";
}

/// Whether kernel `op` (mayRunInPlace) reads operand `i`, of the result's
/// element count, only at the element it writes. A fused group's slices
/// (docs/codegen.md §1) read their input at other indices, and so does
/// everything computed from what they read: the operand qualifies when
/// every path from its block argument to the return runs through
/// elementwise ops, reshapes and broadcasts only (which read at the flat
/// index they write, or broadcast an input of fewer elements).
bool readsAtWrittenIndex(const Op& op, size_t i) {
  const Function* region = op.region();
  if (!region) return true;
  std::vector<const Value*> work = {region->argument(i)};
  std::unordered_set<const Value*> seen(work.begin(), work.end());
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    for (const Op* user : v->users()) {
      if (user->kind() == OpKind::Return) continue;
      if (!user->info().isElementwise() && user->kind() != OpKind::Reshape && user->kind() != OpKind::Broadcast)
        return false;
      for (const Value* r : user->results())
        if (seen.insert(r).second) work.push_back(r);
    }
  }
  return true;
}

}  // namespace

bool isView(const Op& op) {
  if (op.numOperands() != 1 || op.numResults() != 1) return false;
  // A fused group of one such op (what split-fused-results leaves of a
  // group whose results are each read elsewhere).
  if (const Function* region = op.region()) {
    const Op* ret = region->returnOp();
    if (region->numArguments() != 1 || region->ops().size() != 2 || !ret || ret->numOperands() != 1) return false;
    const Op& inner = *region->ops().front();
    return inner.numOperands() == 1 && inner.operand(0) == region->argument(0) &&
           ret->operand(0) == inner.result() && !inner.region() && isView(inner);
  }
  const TensorType& in = op.operand(0)->type();
  const TensorType& out = op.result()->type();
  if (in.dtype != out.dtype || !in.isStatic() || !out.isStatic()) return false;
  if (op.kind() == OpKind::Reshape) return true;
  if (op.kind() != OpKind::Transpose) return false;
  // The dims other than those of size 1 keep their order.
  const Attribute* perm = op.attr("perm");
  if (!perm || perm->kind() != AttrKind::Ints) return false;
  int64_t lastMoved = -1;
  for (int64_t d : perm->getInts()) {
    if (d < 0 || d >= static_cast<int64_t>(in.shape.size())) return false;
    if (in.shape[static_cast<size_t>(d)].size == 1) continue;
    if (d < lastMoved) return false;
    lastMoved = d;
  }
  return true;
}

std::optional<int64_t> viewOffset(const Op& op) {
  if (isView(op)) return 0;
  if (op.kind() != OpKind::Slice || op.numOperands() != 1 || op.region()) return std::nullopt;
  const TensorType& in = op.operand(0)->type();
  const TensorType& out = op.result()->type();
  if (in.dtype != out.dtype || !in.isStatic() || !out.isStatic() || in.rank() != out.rank() ||
      numElements(out.shape) == 0)
    return std::nullopt;
  const std::vector<int64_t>& starts = op.getInts("starts");
  const std::vector<int64_t>& steps = op.getInts("steps");
  const size_t rank = in.shape.size();
  if (starts.size() != rank || steps.size() != rank) return std::nullopt;
  // The dims before the first one sliced are 1 and those after it whole:
  // the slice is one run of the input's bytes.
  size_t cut = rank;
  for (size_t d = 0; d < rank && cut == rank; ++d)
    if (out.shape[d].size != in.shape[d].size) cut = d;
  int64_t offset = 0, inner = 1;
  for (size_t d = rank; d-- > 0;) {
    const int64_t size = in.shape[d].size;
    int64_t start = starts[d] < 0 ? starts[d] + size : starts[d];
    start = std::clamp<int64_t>(start, 0, size);
    if (steps[d] != 1) return std::nullopt;
    if (d < cut && size != 1) return std::nullopt;
    if (d > cut && (out.shape[d].size != size || start != 0)) return std::nullopt;
    if (d < cut && start != 0) return std::nullopt;
    if (d == cut) offset = start * inner;
    inner *= size;
  }
  return offset * static_cast<int64_t>(dtypeSize(in.dtype));
}

namespace {

/// Row-major element strides of `dims`.
std::vector<int64_t> rowMajor(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

std::vector<int64_t> staticDims(const TensorType& t) {
  std::vector<int64_t> dims;
  for (const Dim& d : t.shape) dims.push_back(d.size);
  return dims;
}

/// Whether `strides` address `dims` as their own row-major layout does:
/// every dim above size 1 has its row-major stride.
bool isRowMajor(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  const std::vector<int64_t> dense = rowMajor(dims);
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d] > 1 && strides[d] != dense[d]) return false;
  return true;
}

/// Whether `op` is a kernel that code generation lowers (not a library
/// call, a collective or a host check), so that it can read and write
/// buffers at any strides (codegen/Lowering.h BufferStrides). A scatter's
/// kernel indexes its buffers itself.
bool takesStrides(const Op& op) {
  if (!isKernel(op) || op.numResults() != 1 || op.info().opClass == OpClass::Collective ||
      op.info().isControlFlow() || op.info().hasDataDependentShape() || op.kind() == OpKind::ScatterElements)
    return false;
  return !(op.kind() == OpKind::Fused && op.attr("kind") && op.attr("kind")->kind() == AttrKind::String &&
           op.getString("kind") == "library");
}

/// Where a value goes inside a concatenation's buffer.
struct Placement {
  int root = -1;        // the buffer it is in
  int64_t offset = 0;   // bytes from the root's start
  std::vector<int64_t> strides;  // elements, one per dim of the value
};

/// A set of values sharing one place in the arena: a value, those written
/// in place over it one after another, and views of any of them.
struct Group {
  int64_t size = 0;
  int first = 0;
  int last = 0;
  int64_t offset = 0;
};

/// The lowest offset, a multiple of the alignment, where `g` overlaps no
/// placed group whose live range intersects its own.
int64_t lowestFreeOffset(const Group& g, const std::vector<const Group*>& placed) {
  std::vector<const Group*> conflicts;
  for (const Group* p : placed)
    if (p->first <= g.last && g.first <= p->last) conflicts.push_back(p);
  std::sort(conflicts.begin(), conflicts.end(), [](const Group* a, const Group* b) { return a->offset < b->offset; });
  int64_t candidate = 0;
  for (const Group* p : conflicts) {
    if (candidate + g.size <= p->offset) break;  // fits in the gap below p
    candidate = std::max(candidate, alignUp(p->offset + p->size, MemoryPlan::kAlignment));
  }
  return candidate;
}

std::string kernelRef(const Op& op, int index) {
  const std::string& name = op.result()->name();
  return "kernel " + std::to_string(index) + " (" + std::string(op.name()) + (name.empty() ? "" : " %" + name) + ")";
}

}  // namespace

Status checkAliases(const Function& f, const std::vector<ResultAlias>& aliases) {
  const size_t numResults = f.returnOp() ? f.returnOp()->numOperands() : 0;
  std::unordered_set<size_t> results, arguments;
  for (const ResultAlias& a : aliases) {
    const std::string what = "donated argument " + std::to_string(a.argument) + " for result " +
                             std::to_string(a.result) + " of @" + f.name() + ": ";
    if (a.result >= numResults)
      return Error(what + "the function has " + std::to_string(numResults) + " results", f.loc());
    if (a.argument >= f.numArguments())
      return Error(what + "the function has " + std::to_string(f.numArguments()) + " arguments", f.loc());
    if (!results.insert(a.result).second) return Error(what + "the result already has an argument", f.loc());
    if (!arguments.insert(a.argument).second)
      return Error(what + "the argument is already donated to another result", f.loc());
    const TensorType& arg = f.argument(a.argument)->type();
    const TensorType& result = f.returnOp()->operand(a.result)->type();
    if (!(arg == result))
      return Error(
          what + "the argument is " + arg.str() + " but the result is " + result.str() + ", expected the same type",
          f.loc());
  }
  return Status();
}

Expected<MemoryPlan> planMemory(const Function& f, const std::vector<ResultAlias>& given,
                                const ReadsInPlace& readsInPlace) {
  // Without aliases given, the function's own (`-> (T aliases %arg)`).
  std::vector<ResultAlias> aliases = given;
  if (aliases.empty())
    for (size_t r = 0; r < f.resultTypes().size(); ++r)
      if (f.resultAlias(r) >= 0) aliases.push_back({r, static_cast<size_t>(f.resultAlias(r))});
  MemoryPlan plan;
  plan.function = f.name();
  if (Status s = checkAliases(f, aliases); !s.ok()) return s.error();

  // Values returned are the caller's output buffers, even when later
  // kernels also read them; a result that goes into a donated argument is
  // not returned to the caller.
  std::unordered_set<const Value*> returned;
  std::unordered_set<const Value*> readAtEnd;  // arguments a result reads
  const Op* ret = f.returnOp();
  if (ret) {
    for (size_t i = 0; i < ret->numOperands(); ++i) {
      const Value* v = ret->operand(i);
      if (v->isArgument()) readAtEnd.insert(v);
      bool donated = false;
      for (const ResultAlias& a : aliases) donated = donated || a.result == i;
      if (!donated) returned.insert(v);
    }
  }

  // Donated arguments: the result's kernel writes into the argument when no
  // later kernel reads the argument's old value (and it reads the argument
  // itself only elementwise, in place), else the result is copied in after
  // the last kernel.
  std::unordered_map<const Value*, int> kernelOf;
  std::unordered_map<const Value*, std::vector<int>> argumentReaders;
  std::vector<const Op*> kernelOps;
  for (const auto& op : f.ops()) {
    if (!isKernel(*op)) continue;
    const int k = static_cast<int>(kernelOps.size());
    kernelOps.push_back(op.get());
    for (const Value* v : op->results()) kernelOf[v] = k;
    for (const Value* v : op->operands())
      if (v->isArgument()) argumentReaders[v].push_back(k);
  }
  std::unordered_set<const Value*> inPlaceValues;
  for (const ResultAlias& a : aliases) {
    const Value* v = ret->operand(a.result);
    const Value* arg = f.argument(a.argument);
    MemoryPlan::Alias alias{a.result, a.argument, arg->name(), false, ""};
    auto kernel = kernelOf.find(v);
    const std::string argRef = "%" + arg->name();
    if (v == arg) {
      alias.inPlace = true;  // the result is the argument: nothing to write
    } else if (kernel == kernelOf.end()) {
      alias.whyCopied =
          "the result is " + std::string(v->isArgument() ? "an argument" : "a constant") + ", not computed by a kernel";
    } else if (returned.count(v)) {
      alias.whyCopied = "another result returns the same value";
    } else if (inPlaceValues.count(v)) {
      alias.whyCopied = "the same value goes in place into another argument";
    } else if (readAtEnd.count(arg)) {
      alias.whyCopied = "a result returns the old value of " + argRef;
    } else {
      const int writer = kernel->second;
      const Op& def = *kernelOps[writer];
      for (int reader : argumentReaders[arg]) {
        if (reader > writer) {
          alias.whyCopied = kernelRef(*kernelOps[reader], reader) + " reads " + argRef + " after " +
                            kernelRef(def, writer) + " writes the result";
          break;
        }
        bool atWrittenElement = true;
        for (size_t i = 0; i < def.numOperands(); ++i) {
          if (def.operand(i) != arg) continue;
          atWrittenElement =
              atWrittenElement &&
              (readsInPlace ? readsInPlace(def, i)
                            : mayRunInPlace(def) && numElements(arg->type().shape) == numElements(v->type().shape) &&
                                  readsAtWrittenIndex(def, i));
        }
        if (reader == writer && !atWrittenElement) {
          alias.whyCopied = kernelRef(def, writer) + " reads " + argRef + " at other elements than it writes";
          break;
        }
      }
      alias.inPlace = alias.whyCopied.empty();
      if (alias.inPlace) inPlaceValues.insert(v);
    }
    plan.aliases.push_back(std::move(alias));
  }

  // Live ranges: a buffer is born at the kernel that defines it and dies at
  // the last kernel that reads it; one nobody reads still takes memory while
  // its kernel writes it. Arguments and constants are never buffers.
  // Values after an op whose result sizes depend on values have sizes known
  // only at run time: that op's results take their bound, where there is
  // one, and the rest are allocated when they are computed.
  std::unordered_map<const Value*, int> bufferOf;
  std::unordered_set<const Value*> dataDependent;
  std::vector<const Op*> kernels;
  for (const auto& op : f.ops()) {
    if (!isKernel(*op)) continue;
    int k = static_cast<int>(kernels.size());
    kernels.push_back(op.get());
    bool reached = op->info().hasDataDependentShape();
    for (const Value* v : op->operands()) {
      auto it = bufferOf.find(v);
      if (it != bufferOf.end()) plan.buffers[it->second].last = k;
      reached = reached || dataDependent.count(v);
    }
    if (reached)
      for (const Value* v : op->results()) dataDependent.insert(v);
    for (const Value* v : op->results()) {
      // A returned value is allocated by each run rather than in the arena,
      // but is bounded the same: a program that could never run is refused
      // here, where the op's location is known, not when a run fails.
      if (returned.count(v) && v->type().isStatic() && !byteSize(v->type()))
        return op->emitError(
            tooLarge(*v, v->name().empty() ? std::string(op->name()) + "#" + std::to_string(v->index()) : v->name()));
      if (returned.count(v) || inPlaceValues.count(v)) continue;
      MemoryPlan::Buffer b;
      b.value = v;
      b.name = v->name().empty() ? std::string(op->name()) + "#" + std::to_string(v->index()) : v->name();
      // The JIT specializes symbolic dims to the bound inputs before it
      // plans, so a size expression is never needed at run time.
      if (!v->type().isStatic() && !dataDependent.count(v))
        return op->emitError("cannot plan memory for %" + b.name + " of type " + v->type().str() +
                             ": the memory plan needs static shapes (specialize the inputs' shapes first)");
      std::optional<int64_t> size;
      if (v->type().isStatic()) {
        size = byteSize(v->type());
      } else if (op->info().hasDataDependentShape() && (size = boundedByteSize(*op, v))) {
        b.sizing = MemoryPlan::Buffer::Sizing::Bound;
      } else {
        b.sizing = MemoryPlan::Buffer::Sizing::Dynamic;
        size = 0;
      }
      if (!size) return op->emitError(tooLarge(*v, b.name));
      b.size = *size;
      b.first = b.last = k;
      bufferOf[v] = static_cast<int>(plan.buffers.size());
      plan.buffers.push_back(std::move(b));
    }
  }
  plan.numKernels = static_cast<int>(kernels.size());
  // A donated argument's result that is copied in lives to the end.
  for (const MemoryPlan::Alias& a : plan.aliases) {
    if (a.inPlace) continue;
    auto it = bufferOf.find(ret->operand(a.result));
    if (it != bufferOf.end()) plan.buffers[it->second].last = plan.numKernels - 1;
  }

  // Slices of a concatenation: each operand of a concat in the arena goes
  // into its slice of the concat's buffer when its producer can write there
  // (any kernel for a contiguous slice, a generated kernel for a strided
  // one, whose readers are then generated kernels too), so that the concat
  // copies nothing for it. Concats are taken last to first: a concat whose
  // operands are a run of a later one's (DenseNet's concat(x0..xk) before
  // concat(x0..xk+1)), or which is an operand of a later one, goes into
  // that one's buffer first and passes its slice on to its own operands, so
  // that a chain shares one buffer. A value goes into one slice at most;
  // every other concat reading it copies it.
  std::vector<const Op*> concats;
  for (const Op* op : kernels) {
    auto it = bufferOf.find(op->result());
    if (op->kind() == OpKind::Concat && it != bufferOf.end() &&
        plan.buffers[it->second].sizing == MemoryPlan::Buffer::Sizing::Exact)
      concats.push_back(op);
  }
  std::vector<bool> isRoot(plan.buffers.size(), false);
  // Whether value `v` may be placed at `p`.
  auto canPlace = [&](const Value* v, const Placement& p, bool strided) {
    auto it = bufferOf.find(v);
    if (it == bufferOf.end()) return false;  // an argument, a constant, a result
    const MemoryPlan::Buffer& b = plan.buffers[it->second];
    if (b.sizing != MemoryPlan::Buffer::Sizing::Exact || b.sliceOf >= 0 || isRoot[it->second] ||
        p.offset % MemoryPlan::kAlignment != 0)
      return false;
    const Op* def = v->definingOp();
    // A view shares its input's bytes, which are elsewhere.
    if (viewOffset(*def)) {
      auto in = bufferOf.find(def->operand(0));
      if (in != bufferOf.end() && plan.buffers[in->second].sizing == MemoryPlan::Buffer::Sizing::Exact) return false;
    }
    if (!strided) return true;
    if (!takesStrides(*def)) return false;
    for (const Op* user : v->users())
      if (!takesStrides(*user)) return false;
    return true;
  };
  auto place = [&](const Value* v, const Placement& p) {
    MemoryPlan::Buffer& b = plan.buffers[bufferOf.at(v)];
    b.sliceOf = p.root;
    b.sliceOffset = p.offset;
    if (!isRowMajor(staticDims(v->type()), p.strides)) b.strides = p.strides;
    isRoot[static_cast<size_t>(p.root)] = true;
  };
  // The placement of a concat's own buffer: where it was placed, or itself.
  auto placementOf = [&](const Op* c) {
    const int i = bufferOf.at(c->result());
    const MemoryPlan::Buffer& b = plan.buffers[i];
    const std::vector<int64_t> dims = staticDims(c->result()->type());
    if (b.sliceOf < 0) return Placement{i, 0, rowMajor(dims)};
    // Strides in the root: the root's row-major ones (every buffer in a
    // root has its rank, and its dims but along concat axes).
    const std::vector<int64_t> rootDims = staticDims(plan.buffers[b.sliceOf].value->type());
    return Placement{b.sliceOf, b.sliceOffset, rowMajor(rootDims)};
  };
  auto axisOf = [](const Op* c) {
    int64_t axis = c->getInt("axis");
    return axis < 0 ? axis + static_cast<int64_t>(c->result()->type().rank()) : axis;
  };
  // The placement of operand `k` of concat `c` placed at `p`.
  auto operandPlacement = [&](const Op* c, const Placement& p, size_t k) {
    const int64_t axis = axisOf(c);
    int64_t along = 0;
    for (size_t j = 0; j < k; ++j) along += c->operand(j)->type().shape[static_cast<size_t>(axis)].size;
    Placement q = p;
    q.offset += along * p.strides[static_cast<size_t>(axis)] * static_cast<int64_t>(dtypeSize(c->result()->type().dtype));
    return q;
  };
  for (size_t ci = concats.size(); ci-- > 0;) {
    const Op* c = concats[ci];
    const int self = bufferOf.at(c->result());
    const int64_t axis = axisOf(c);
    if (c->result()->type().rank() == 0) continue;
    // A run of the operands of a later concat along the same axis.
    if (plan.buffers[self].sliceOf < 0 && !isRoot[self]) {
      for (size_t di = ci + 1; di < concats.size(); ++di) {
        const Op* d = concats[di];
        if (axisOf(d) != axis || d->numOperands() < c->numOperands() ||
            d->result()->type().dtype != c->result()->type().dtype)
          continue;
        for (size_t start = 0; start + c->numOperands() <= d->numOperands(); ++start) {
          bool run = true;
          for (size_t j = 0; j < c->numOperands() && run; ++j) run = d->operand(start + j) == c->operand(j);
          if (!run) continue;
          const Placement p = operandPlacement(d, placementOf(d), start);
          const bool strided = !isRowMajor(staticDims(c->result()->type()), p.strides);
          if (canPlace(c->result(), p, strided)) place(c->result(), p);
          break;
        }
        if (plan.buffers[self].sliceOf >= 0) break;
      }
    }
    const Placement p = placementOf(c);
    for (size_t k = 0; k < c->numOperands(); ++k) {
      const Value* x = c->operand(k);
      const Placement q = operandPlacement(c, p, k);
      const bool strided = !isRowMajor(staticDims(x->type()), q.strides);
      if (numElements(x->type().shape) > 0 && canPlace(x, q, strided)) place(x, q);
    }
  }
  // What each concat copies, in program order: an operand is in its slice
  // already when placed there, or when an earlier concat sharing the slice
  // copied it there.
  std::map<std::pair<int, int64_t>, const Value*> filled;
  for (const Op* c : concats) {
    MemoryPlan::Buffer& cb = plan.buffers[bufferOf.at(c->result())];
    cb.isConcat = true;
    const Placement p = placementOf(c);
    for (size_t k = 0; k < c->numOperands(); ++k) {
      const Value* x = c->operand(k);
      if (numElements(x->type().shape) == 0) continue;
      const Placement q = operandPlacement(c, p, k);
      auto xb = bufferOf.find(x);
      if (xb != bufferOf.end() && plan.buffers[xb->second].sliceOf == q.root &&
          plan.buffers[xb->second].sliceOffset == q.offset)
        continue;
      auto [slot, fresh] = filled.emplace(std::make_pair(q.root, q.offset), x);
      if (!fresh && slot->second == x) continue;
      slot->second = x;
      cb.copiedOperands.push_back(static_cast<int>(k));
    }
  }

  // A value is read by a concat only when the concat copies it: one that
  // goes into a slice copied there by an earlier concat dies at that copy,
  // not at the last concat of a chain that reads it as an operand.
  if (!concats.empty()) {
    std::unordered_set<const Op*> isConcat(concats.begin(), concats.end());
    for (MemoryPlan::Buffer& b : plan.buffers) b.last = b.first;
    for (size_t k = 0; k < kernels.size(); ++k) {
      const Op* op = kernels[k];
      const MemoryPlan::Buffer* cb = isConcat.count(op) ? &plan.buffers[bufferOf.at(op->result())] : nullptr;
      for (size_t i = 0; i < op->numOperands(); ++i) {
        auto it = bufferOf.find(op->operand(i));
        if (it == bufferOf.end()) continue;
        if (cb && std::find(cb->copiedOperands.begin(), cb->copiedOperands.end(), static_cast<int>(i)) ==
                      cb->copiedOperands.end())
          continue;
        plan.buffers[it->second].last = std::max(plan.buffers[it->second].last, static_cast<int>(k));
      }
    }
    for (const MemoryPlan::Alias& a : plan.aliases) {
      if (a.inPlace) continue;
      auto it = bufferOf.find(ret->operand(a.result));
      if (it != bufferOf.end()) plan.buffers[it->second].last = plan.numKernels - 1;
    }
  }

  // In place: an elementwise kernel writes its result over an input that
  // dies there, when the two have the same element count and size. The
  // result joins the input's group, so a chain of such kernels shares one
  // buffer; the group lives from its first value's birth to its last
  // value's death. A view joins its input's group whether or not the input
  // lives on (the bytes do not change), so a kernel may write over an input
  // only when the input's whole group, views included, dies there.
  // A concat's buffer and the values placed in it form one group, which
  // lives from the first of them to be written to the last read of any
  // (views included); none of them is written in place over another value,
  // nor another over them.
  std::vector<int> groupOf(plan.buffers.size());
  std::vector<int64_t> within(plan.buffers.size(), 0);  // bytes from the group's start
  std::vector<Group> groups;
  std::unordered_map<int, int> groupOfRoot;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    MemoryPlan::Buffer& b = plan.buffers[i];
    const Op* def = b.value->definingOp();
    // A buffer of a size known only at run time shares with nothing.
    const bool sized = b.sizing == MemoryPlan::Buffer::Sizing::Exact;
    const bool shared = b.sliceOf >= 0 || isRoot[i];
    const std::optional<int64_t> view = sized && !shared ? viewOffset(*def) : std::nullopt;
    if (view && *view % MemoryPlan::kAlignment == 0) {
      auto it = bufferOf.find(def->operand(0));
      if (it != bufferOf.end() && plan.buffers[it->second].sizing == MemoryPlan::Buffer::Sizing::Exact &&
          plan.buffers[it->second].strides.empty()) {
        b.viewOf = it->second;
        b.viewOffset = *view;
      }
    }
    if (shared) {
      const int root = b.sliceOf >= 0 ? b.sliceOf : static_cast<int>(i);
      auto [it, fresh] = groupOfRoot.emplace(root, static_cast<int>(groups.size()));
      if (fresh) groups.push_back({plan.buffers[root].size, b.first, b.last, 0});
      groupOf[i] = it->second;
      within[i] = b.sliceOffset;
      Group& g = groups[it->second];
      g.first = std::min(g.first, b.first);
      g.last = std::max(g.last, b.last);
      continue;
    }
    if (sized && b.viewOf < 0 && mayRunInPlace(*def)) {
      const TensorType& out = b.value->type();
      for (size_t k = 0; k < def->numOperands(); ++k) {
        const Value* in = def->operand(k);
        auto it = bufferOf.find(in);
        if (it == bufferOf.end()) continue;
        const MemoryPlan::Buffer& input = plan.buffers[it->second];
        if (input.sizing != MemoryPlan::Buffer::Sizing::Exact || input.sliceOf >= 0 || isRoot[it->second] ||
            input.last != b.first ||
            groups[groupOf[it->second]].last != b.first || numElements(in->type().shape) != numElements(out.shape) ||
            dtypeSize(in->type().dtype) != dtypeSize(out.dtype) || !readsAtWrittenIndex(*def, k))
          continue;
        b.inPlaceOf = it->second;
        break;
      }
    }
    if (b.viewOf >= 0) {
      groupOf[i] = groupOf[b.viewOf];
      within[i] = within[b.viewOf] + b.viewOffset;
      groups[groupOf[i]].last = std::max(groups[groupOf[i]].last, b.last);
    } else if (b.inPlaceOf >= 0) {
      groupOf[i] = groupOf[b.inPlaceOf];
      within[i] = within[b.inPlaceOf];
      groups[groupOf[i]].last = b.last;
    } else {
      groupOf[i] = static_cast<int>(groups.size());
      groups.push_back({b.size, b.first, b.last, 0});
    }
  }

  // Largest first, each at the lowest offset free for its whole lifetime
  // (XLA's global decreasing-size heap simulator). Ties go to the earlier
  // group, so the plan is deterministic.
  std::vector<int> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return groups[a].size > groups[b].size; });
  std::vector<const Group*> placed;
  for (int g : order) {
    groups[g].offset = lowestFreeOffset(groups[g], placed);
    placed.push_back(&groups[g]);
    plan.peak = std::max(plan.peak, alignUp(groups[g].offset + groups[g].size, MemoryPlan::kAlignment));
  }

  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    // A dynamic buffer's group has size 0: it takes no arena space.
    plan.buffers[i].offset = plan.buffers[i].sizing == MemoryPlan::Buffer::Sizing::Dynamic
                                 ? -1
                                 : groups[groupOf[i]].offset + within[i];
    plan.noReuseTotal += alignUp(plan.buffers[i].size, MemoryPlan::kAlignment);
  }
  return plan;
}

/// Checks that every function has a memory plan: each intermediate value
/// has a static shape. Changes nothing; the plan itself is printed by
/// `kiln-opt --print-memory-plan` and computed again by the runtime (at most
/// quadratic in the number of buffers, which is cheap next to codegen).
///
///   %a = exp(%x) : f32[N]
/// fails with
///   error: 'exp' cannot plan memory for %a of type f32[N]: the memory plan
///   needs static shapes (specialize the inputs' shapes first)
class PlanMemoryPass : public Pass {
 public:
  std::string_view name() const override { return "plan-memory"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    for (const auto& f : m.functions()) {
      Expected<MemoryPlan> plan = planMemory(*f);
      if (!plan) return plan.takeError();
    }
    return false;
  }
};

std::unique_ptr<Pass> createPlanMemoryPass() { return std::make_unique<PlanMemoryPass>(); }

}  // namespace kiln
