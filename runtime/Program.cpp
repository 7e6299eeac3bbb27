// Serializing, reading and validating Program (Program.h). The bytes
// are a flat sequence of little-endian integers, u32-length-prefixed
// strings and lists, in the order of the struct's fields; a tensor that
// does not fit inline is left for the caller (a `.kc` keeps large tensors
// in its weights section).
#include "runtime/Program.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "ir/OpTable.h"
#include "runtime/ByteIO.h"

namespace kiln {

namespace {

/// Dims and counts beyond these are not programs Kiln wrote.
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int64_t kMaxCount = int64_t{1} << 24;
constexpr int64_t kMaxRank = 64;

void putI64(std::string& out, int64_t v) { putLE(out, static_cast<uint64_t>(v), 8); }
void putI32(std::string& out, int v) { putLE(out, static_cast<uint32_t>(v), 4); }

void putInts(std::string& out, const std::vector<int64_t>& v) {
  putLE(out, v.size(), 4);
  for (int64_t x : v) putI64(out, x);
}

void putType(std::string& out, const TensorType& t) {
  out += static_cast<char>(t.dtype);
  putInts(out, staticDims(t.shape));
}

/// A tensor: its type, then u8 1 and its bytes when it is inline, or u8 0.
void putTensor(std::string& out, const Tensor& t, size_t inlineBelow) {
  putType(out, t.type());
  const bool inlined = t.numBytes() < inlineBelow;
  out += static_cast<char>(inlined ? 1 : 0);
  if (inlined) putString(out, std::string_view(reinterpret_cast<const char*>(t.raw()), t.numBytes()));
}

void putLocation(std::string& out, const Location& loc) {
  out += static_cast<char>(loc.kind);
  putString(out, loc.file);
  putI32(out, loc.line);
  putI32(out, loc.col);
  putString(out, loc.name);
}

/// A type whose dims may be dynamic (-1), as host steps' result types are.
void putShapedType(std::string& out, const TensorType& t) {
  out += static_cast<char>(t.dtype);
  putLE(out, t.shape.size(), 4);
  for (const Dim& d : t.shape) putI64(out, d.isStatic() ? d.size : -1);
}

void putStageValue(std::string& out, const StageValue& v) {
  out += static_cast<char>(v.from);
  putLE(out, v.index, 4);
  putLE(out, v.result, 4);
}

void putStageValues(std::string& out, const std::vector<StageValue>& values) {
  putLE(out, values.size(), 4);
  for (const StageValue& v : values) putStageValue(out, v);
}

void putCollective(std::string& out, const CollectiveCall& call) {
  out += static_cast<char>(call.kind);
  out += static_cast<char>(call.reduction);
  putI64(out, call.root);
  putI64(out, call.axis);
  putI64(out, call.worldSize);
  out += static_cast<char>(call.dtype);
  putInts(out, call.inputDims);
}

void putCall(std::string& out, const LibraryCall& call) {
  out += static_cast<char>(call.kind);
  putLE(out, call.operands.size(), 4);
  for (int b : call.operands) putI32(out, b);
  putLE(out, call.operandDims.size(), 4);
  for (const auto& dims : call.operandDims) putInts(out, dims);
  putInts(out, call.resultDims);
  putI32(out, call.resultBuffer);
  putInts(out, call.strides);
  putInts(out, call.pads);
  putInts(out, call.dilations);
  putInts(out, call.outputPadding);
  putI64(out, call.groups);
  // Layout flags: 1 a convolution stored channels last, 2 a matmul's b
  // stored transposed, 4 a matmul's a stored transposed.
  out += static_cast<char>((call.channelsLast ? 1 : 0) | (call.transposedB ? 2 : 0) | (call.transposedA ? 4 : 0));
  putLE(out, call.postOps.size(), 4);
  for (const PostOp& p : call.postOps) {
    out += static_cast<char>(p.kind);
    uint32_t bits;
    std::memcpy(&bits, &p.alpha, 4);
    putLE(out, bits, 4);
    std::memcpy(&bits, &p.beta, 4);
    putLE(out, bits, 4);
    putI32(out, p.operand);
    putInts(out, p.dims);
    putString(out, p.name);
  }
  out += static_cast<char>(call.srcType);
  out += static_cast<char>(call.dstType);
  putI32(out, call.srcZeroPoint);
  putI32(out, call.dstZeroPoint);
  putLE(out, call.scales.size(), 4);
  for (float scale : call.scales) {
    uint32_t bits;
    std::memcpy(&bits, &scale, 4);
    putLE(out, bits, 4);
  }
}

int64_t bytesOf(const TensorType& t) {
  return numElements(t.shape) * static_cast<int64_t>(dtypeSize(t.dtype));
}

/// Reading, with the bounds of Program.h's fields.
class ProgramReader {
 public:
  ProgramReader(std::string_view bytes, const std::string& what) : r_(bytes, what) {}

  ByteReader& raw() { return r_; }

  Expected<int64_t> i64(std::string_view what) {
    auto v = r_.uint(8, what);
    if (!v) return v.takeError();
    return static_cast<int64_t>(*v);
  }
  Expected<int> i32(std::string_view what) {
    auto v = r_.uint(4, what);
    if (!v) return v.takeError();
    return static_cast<int>(static_cast<int32_t>(static_cast<uint32_t>(*v)));
  }
  Expected<size_t> count(std::string_view what) {
    auto n = r_.bounded(4, kMaxCount, what);
    if (!n) return n.takeError();
    return static_cast<size_t>(*n);
  }
  Expected<std::vector<int64_t>> ints(std::string_view what) {
    auto n = r_.bounded(4, kMaxRank * 4, what);
    if (!n) return n.takeError();
    std::vector<int64_t> v;
    for (int64_t i = 0; i < *n; ++i) {
      auto x = i64(what);
      if (!x) return x.takeError();
      v.push_back(*x);
    }
    return v;
  }
  /// A dtype Kiln knows.
  Expected<DType> dtype(std::string_view what) {
    auto code = r_.uint(1, what);
    if (!code) return code.takeError();
    if (*code > static_cast<uint64_t>(kLastDType) || dtypeName(static_cast<DType>(*code)) == "?")
      return r_.error("corrupt: " + std::string(what) + " has an unknown dtype " + std::to_string(*code));
    return static_cast<DType>(*code);
  }
  /// A type whose dims may be dynamic (putShapedType).
  Expected<TensorType> shapedType(std::string_view what) {
    auto element = dtype(what);
    if (!element) return element.takeError();
    auto rank = r_.bounded(4, kMaxRank, what);
    if (!rank) return rank.takeError();
    Shape shape;
    for (int64_t i = 0; i < *rank; ++i) {
      auto d = i64(what);
      if (!d) return d.takeError();
      if (*d < -1 || *d > kMaxDim) return r_.error("corrupt: " + std::string(what) + " has a dim of " + std::to_string(*d));
      shape.push_back(*d < 0 ? Dim::unknown() : Dim::fixed(*d));
    }
    return TensorType{*element, std::move(shape)};
  }
  Expected<StageValue> stageValue(std::string_view what) {
    auto from = r_.uint(1, what);
    if (!from) return from.takeError();
    if (*from > static_cast<uint64_t>(StageValue::From::Suffix))
      return r_.error("corrupt: " + std::string(what) + " comes from an unknown place " + std::to_string(*from));
    auto index = r_.bounded(4, kMaxCount, what);
    if (!index) return index.takeError();
    auto result = r_.bounded(4, kMaxCount, what);
    if (!result) return result.takeError();
    return StageValue{static_cast<StageValue::From>(*from), static_cast<size_t>(*index), static_cast<size_t>(*result)};
  }
  Expected<std::vector<StageValue>> stageValues(std::string_view what) {
    auto n = count(what);
    if (!n) return n.takeError();
    std::vector<StageValue> values;
    for (size_t i = 0; i < *n; ++i) {
      auto v = stageValue(what);
      if (!v) return v.takeError();
      values.push_back(*v);
    }
    return values;
  }
  Expected<TensorType> type(std::string_view what) {
    auto element = dtype(what);
    if (!element) return element.takeError();
    auto dims = ints(what);
    if (!dims) return dims.takeError();
    if (static_cast<int64_t>(dims->size()) > kMaxRank)
      return r_.error("corrupt: " + std::string(what) + " has rank " + std::to_string(dims->size()));
    int64_t elements = 1;
    for (int64_t d : *dims) {
      if (d < 0 || d > kMaxDim || (elements && d > kMaxDim / elements))
        return r_.error("corrupt: " + std::string(what) + " has a dim of " + std::to_string(d));
      elements *= d;
    }
    return TensorType{*element, staticShape(*dims)};
  }
  /// A tensor; an empty Tensor when its bytes are not inline.
  Expected<Tensor> tensor(std::string_view what) {
    auto t = type(what);
    if (!t) return t.takeError();
    auto inlined = r_.uint(1, what);
    if (!inlined) return inlined.takeError();
    if (*inlined == 0) return Tensor();
    auto bytes = r_.string(what);
    if (!bytes) return bytes.takeError();
    // The size is checked before anything of the declared type is
    // allocated: a corrupt type may claim terabytes.
    if (static_cast<int64_t>(bytes->size()) != bytesOf(*t))
      return r_.error("corrupt: " + std::string(what) + " of type " + t->str() + " has " +
                      std::to_string(bytes->size()) + " bytes");
    return Tensor::fromBytes(t->dtype, staticDims(t->shape), *bytes);
  }
  Expected<Location> location(std::string_view what) {
    auto kind = r_.uint(1, what);
    if (!kind) return kind.takeError();
    if (*kind > static_cast<uint64_t>(Location::Kind::Named)) return r_.error("corrupt: " + std::string(what));
    Location loc;
    loc.kind = static_cast<Location::Kind>(*kind);
    auto file = r_.string(what);
    if (!file) return file.takeError();
    loc.file = std::move(*file);
    auto line = i32(what), col = i32(what);
    if (!line) return line.takeError();
    if (!col) return col.takeError();
    loc.line = *line;
    loc.col = *col;
    auto name = r_.string(what);
    if (!name) return name.takeError();
    loc.name = std::move(*name);
    return loc;
  }
  Expected<CollectiveCall> collective() {
    CollectiveCall c;
    auto kind = r_.uint(1, "a collective's kind");
    if (!kind) return kind.takeError();
    if (*kind > static_cast<uint64_t>(CollectiveCall::Kind::ReduceScatter)) return r_.error("corrupt: a collective");
    c.kind = static_cast<CollectiveCall::Kind>(*kind);
    auto reduction = r_.uint(1, "a collective's reduction");
    if (!reduction) return reduction.takeError();
    if (*reduction > static_cast<uint64_t>(ReduceKind::Mean)) return r_.error("corrupt: a collective's reduction");
    c.reduction = static_cast<ReduceKind>(*reduction);
    for (int64_t* field : {&c.root, &c.axis, &c.worldSize}) {
      auto v = i64("a collective's attributes");
      if (!v) return v.takeError();
      *field = *v;
    }
    auto dtype = r_.uint(1, "a collective's dtype");
    if (!dtype) return dtype.takeError();
    if (*dtype > static_cast<uint64_t>(kLastDType)) return r_.error("corrupt: a collective's dtype");
    c.dtype = static_cast<DType>(*dtype);
    auto dims = ints("a collective's dims");
    if (!dims) return dims.takeError();
    c.inputDims = std::move(*dims);
    return c;
  }
  Expected<LibraryCall> call() {
    LibraryCall c;
    auto kind = r_.uint(1, "a library call's kind");
    if (!kind) return kind.takeError();
    if (*kind > static_cast<uint64_t>(LibraryCall::Kind::ConvWeightGrad)) return r_.error("corrupt: a library call");
    c.kind = static_cast<LibraryCall::Kind>(*kind);
    auto n = count("a library call's operands");
    if (!n) return n.takeError();
    for (size_t i = 0; i < *n; ++i) {
      auto b = i32("a library call's operand");
      if (!b) return b.takeError();
      c.operands.push_back(*b);
    }
    auto nd = count("a library call's operand dims");
    if (!nd) return nd.takeError();
    for (size_t i = 0; i < *nd; ++i) {
      auto d = ints("a library call's operand dims");
      if (!d) return d.takeError();
      c.operandDims.push_back(std::move(*d));
    }
    auto rd = ints("a library call's result dims");
    if (!rd) return rd.takeError();
    c.resultDims = std::move(*rd);
    auto rb = i32("a library call's result buffer");
    if (!rb) return rb.takeError();
    c.resultBuffer = *rb;
    for (auto* field : {&c.strides, &c.pads, &c.dilations, &c.outputPadding}) {
      auto v = ints("a convolution's attributes");
      if (!v) return v.takeError();
      *field = std::move(*v);
    }
    auto groups = i64("a convolution's groups");
    if (!groups) return groups.takeError();
    c.groups = *groups;
    auto layout = r_.uint(1, "a library call's layout");
    if (!layout) return layout.takeError();
    if (*layout > 7) return r_.error("corrupt: a library call's layout");
    c.channelsLast = (*layout & 1) != 0;
    c.transposedB = (*layout & 2) != 0;
    c.transposedA = (*layout & 4) != 0;
    auto np = count("a library call's post-ops");
    if (!np) return np.takeError();
    for (size_t i = 0; i < *np; ++i) {
      PostOp p;
      auto k = r_.uint(1, "a post-op");
      if (!k) return k.takeError();
      if (*k > static_cast<uint64_t>(PostOp::Kind::Clip)) return r_.error("corrupt: a post-op's kind");
      p.kind = static_cast<PostOp::Kind>(*k);
      auto alpha = r_.uint(4, "a post-op"), beta = r_.uint(4, "a post-op");
      if (!alpha) return alpha.takeError();
      if (!beta) return beta.takeError();
      const uint32_t a = static_cast<uint32_t>(*alpha), b = static_cast<uint32_t>(*beta);
      std::memcpy(&p.alpha, &a, 4);
      std::memcpy(&p.beta, &b, 4);
      auto operand = i32("a post-op's operand");
      if (!operand) return operand.takeError();
      p.operand = *operand;
      auto dims = ints("a post-op's dims");
      if (!dims) return dims.takeError();
      p.dims = std::move(*dims);
      auto name = r_.string("a post-op's name");
      if (!name) return name.takeError();
      p.name = std::move(*name);
      c.postOps.push_back(std::move(p));
    }
    for (DType* type : {&c.srcType, &c.dstType}) {
      auto t = r_.uint(1, "a library call's element type");
      if (!t) return t.takeError();
      if (*t != static_cast<uint64_t>(DType::F32) && *t != static_cast<uint64_t>(DType::U8) &&
          *t != static_cast<uint64_t>(DType::I8) && *t != static_cast<uint64_t>(DType::BF16) &&
          *t != static_cast<uint64_t>(DType::F16))
        return r_.error("corrupt: a library call's element type");
      *type = static_cast<DType>(*t);
    }
    for (int32_t* zeroPoint : {&c.srcZeroPoint, &c.dstZeroPoint}) {
      auto z = i32("a library call's zero point");
      if (!z) return z.takeError();
      *zeroPoint = *z;
    }
    auto ns = count("a library call's scales");
    if (!ns) return ns.takeError();
    for (size_t i = 0; i < *ns; ++i) {
      auto bits = r_.uint(4, "a library call's scale");
      if (!bits) return bits.takeError();
      const uint32_t b = static_cast<uint32_t>(*bits);
      float scale;
      std::memcpy(&scale, &b, 4);
      c.scales.push_back(scale);
    }
    return c;
  }

 private:
  ByteReader r_;
};


}  // namespace

std::string serializeProgram(const Program& p, size_t inlineBelow) {
  std::string out;
  putString(out, p.name);
  putLE(out, p.arguments.size(), 4);
  for (const Program::Argument& a : p.arguments) {
    putString(out, a.name);
    putType(out, a.type);
    out += static_cast<char>(a.hasDefault ? 1 : 0);
    if (a.hasDefault) putTensor(out, a.defaultValue, inlineBelow);
  }
  putLE(out, p.constants.size(), 4);
  for (const Tensor& t : p.constants) putTensor(out, t, inlineBelow);
  putLE(out, p.slots.size(), 4);
  for (const Program::Slot& s : p.slots) {
    out += static_cast<char>(s.kind);
    putType(out, s.type);
    putI64(out, s.index);
  }
  putLE(out, p.steps.size(), 4);
  for (const Program::Step& s : p.steps) {
    out += static_cast<char>(s.kind);
    putString(out, s.name);
    putString(out, s.what);
    putI32(out, s.kernel);
    if (s.kind == Program::Step::Kind::Library) putCall(out, s.call);
    if (s.kind == Program::Step::Kind::Collective) putCollective(out, s.collective);
    putLE(out, s.operands.size(), 4);
    for (int o : s.operands) putI32(out, o);
    putI32(out, s.result);
    putLE(out, s.checks.size(), 4);
    for (const Program::SlotCheck& c : s.checks) {
      out += static_cast<char>(c.check.condition);
      putString(out, c.check.of);
      putI64(out, c.check.axis);
      putI64(out, c.check.size);
      putLocation(out, c.check.loc);
      putI32(out, c.slot);
    }
    putI64(out, s.parallelExtent);
    out += static_cast<char>(s.parallel ? 1 : 0);
  }
  putLE(out, p.results.size(), 4);
  for (const Program::Result& r : p.results) {
    putString(out, r.name);
    putI32(out, r.slot);
    putI32(out, r.aliasedArgument);
  }
  putLE(out, p.finalCopies.size(), 4);
  for (const auto& [slot, argument] : p.finalCopies) {
    putI32(out, slot);
    putI32(out, argument);
  }
  putI64(out, p.arenaBytes);
  putLE(out, p.kernelNames.size(), 4);
  for (size_t i = 0; i < p.kernelNames.size(); ++i) {
    putString(out, p.kernelNames[i]);
    putString(out, i < p.kernelHashes.size() ? p.kernelHashes[i] : "");
  }
  putString(out, p.machine.triple);
  putString(out, p.machine.cpu);
  putString(out, p.machine.features);
  putString(out, p.codegenVersion);
  return out;
}

Status parseProgram(std::string_view bytes, const std::string& what, Program& p) {
  ProgramReader r(bytes, what);
  auto str = [&](std::string& out, std::string_view field) -> Status {
    auto s = r.raw().string(field);
    if (!s) return s.takeError();
    out = std::move(*s);
    return {};
  };
  KILN_TRY(str(p.name, "the program's name"));
  auto numArgs = r.count("the arguments");
  if (!numArgs) return numArgs.takeError();
  for (size_t i = 0; i < *numArgs; ++i) {
    Program::Argument a;
    KILN_TRY(str(a.name, "an argument's name"));
    auto type = r.type("an argument's type");
    if (!type) return type.takeError();
    a.type = *type;
    auto has = r.raw().uint(1, "an argument's default");
    if (!has) return has.takeError();
    a.hasDefault = *has != 0;
    if (a.hasDefault) {
      auto t = r.tensor("an argument's default");
      if (!t) return t.takeError();
      a.defaultValue = std::move(*t);
    }
    p.arguments.push_back(std::move(a));
  }
  auto numConstants = r.count("the constants");
  if (!numConstants) return numConstants.takeError();
  for (size_t i = 0; i < *numConstants; ++i) {
    auto t = r.tensor("a constant");
    if (!t) return t.takeError();
    p.constants.push_back(std::move(*t));
  }
  auto numSlots = r.count("the slots");
  if (!numSlots) return numSlots.takeError();
  for (size_t i = 0; i < *numSlots; ++i) {
    Program::Slot s;
    auto kind = r.raw().uint(1, "a slot's kind");
    if (!kind) return kind.takeError();
    if (*kind > static_cast<uint64_t>(Program::SlotKind::InPlace)) return r.raw().error("corrupt: a slot's kind");
    s.kind = static_cast<Program::SlotKind>(*kind);
    auto type = r.type("a slot's type");
    if (!type) return type.takeError();
    s.type = *type;
    auto index = r.i64("a slot's index");
    if (!index) return index.takeError();
    s.index = *index;
    p.slots.push_back(std::move(s));
  }
  auto numSteps = r.count("the steps");
  if (!numSteps) return numSteps.takeError();
  for (size_t i = 0; i < *numSteps; ++i) {
    Program::Step s;
    auto kind = r.raw().uint(1, "a step's kind");
    if (!kind) return kind.takeError();
    if (*kind > static_cast<uint64_t>(Program::Step::Kind::Collective))
      return r.raw().error("corrupt: a step's kind");
    s.kind = static_cast<Program::Step::Kind>(*kind);
    KILN_TRY(str(s.name, "a step's name"));
    KILN_TRY(str(s.what, "a step's description"));
    auto kernel = r.i32("a step's kernel");
    if (!kernel) return kernel.takeError();
    s.kernel = *kernel;
    if (s.kind == Program::Step::Kind::Library) {
      auto call = r.call();
      if (!call) return call.takeError();
      s.call = std::move(*call);
    }
    if (s.kind == Program::Step::Kind::Collective) {
      auto call = r.collective();
      if (!call) return call.takeError();
      s.collective = std::move(*call);
    }
    auto numOperands = r.count("a step's operands");
    if (!numOperands) return numOperands.takeError();
    for (size_t j = 0; j < *numOperands; ++j) {
      auto o = r.i32("a step's operand");
      if (!o) return o.takeError();
      s.operands.push_back(*o);
    }
    auto result = r.i32("a step's result");
    if (!result) return result.takeError();
    s.result = *result;
    auto numChecks = r.count("a step's checks");
    if (!numChecks) return numChecks.takeError();
    for (size_t j = 0; j < *numChecks; ++j) {
      Program::SlotCheck c;
      auto condition = r.raw().uint(1, "a check's condition");
      if (!condition) return condition.takeError();
      if (*condition > static_cast<uint64_t>(HostCheck::Condition::NonNegative))
        return r.raw().error("corrupt: a check's condition");
      c.check.condition = static_cast<HostCheck::Condition>(*condition);
      KILN_TRY(str(c.check.of, "a check's op"));
      auto axis = r.i64("a check's axis"), size = r.i64("a check's size");
      if (!axis) return axis.takeError();
      if (!size) return size.takeError();
      c.check.axis = *axis;
      c.check.size = *size;
      auto loc = r.location("a check's location");
      if (!loc) return loc.takeError();
      c.check.loc = std::move(*loc);
      auto slot = r.i32("a check's slot");
      if (!slot) return slot.takeError();
      c.slot = *slot;
      s.checks.push_back(std::move(c));
    }
    auto extent = r.i64("a step's parallel extent");
    if (!extent) return extent.takeError();
    s.parallelExtent = *extent;
    auto parallel = r.raw().uint(1, "a step's parallel flag");
    if (!parallel) return parallel.takeError();
    s.parallel = *parallel != 0;
    p.steps.push_back(std::move(s));
  }
  auto numResults = r.count("the results");
  if (!numResults) return numResults.takeError();
  for (size_t i = 0; i < *numResults; ++i) {
    Program::Result res;
    KILN_TRY(str(res.name, "a result's name"));
    auto slot = r.i32("a result's slot"), alias = r.i32("a result's alias");
    if (!slot) return slot.takeError();
    if (!alias) return alias.takeError();
    res.slot = *slot;
    res.aliasedArgument = *alias;
    p.results.push_back(std::move(res));
  }
  auto numCopies = r.count("the final copies");
  if (!numCopies) return numCopies.takeError();
  for (size_t i = 0; i < *numCopies; ++i) {
    auto slot = r.i32("a final copy"), argument = r.i32("a final copy");
    if (!slot) return slot.takeError();
    if (!argument) return argument.takeError();
    p.finalCopies.emplace_back(*slot, *argument);
  }
  auto arena = r.i64("the arena size");
  if (!arena) return arena.takeError();
  p.arenaBytes = *arena;
  auto numKernels = r.count("the kernels");
  if (!numKernels) return numKernels.takeError();
  for (size_t i = 0; i < *numKernels; ++i) {
    std::string name, hash;
    KILN_TRY(str(name, "a kernel's name"));
    KILN_TRY(str(hash, "a kernel's hash"));
    p.kernelNames.push_back(std::move(name));
    p.kernelHashes.push_back(std::move(hash));
  }
  KILN_TRY(str(p.machine.triple, "the target triple"));
  KILN_TRY(str(p.machine.cpu, "the target CPU"));
  KILN_TRY(str(p.machine.features, "the target features"));
  KILN_TRY(str(p.codegenVersion, "the code generator"));
  if (r.raw().remaining() != 0)
    return r.raw().error("corrupt: " + std::to_string(r.raw().remaining()) + " unexpected bytes after the program");
  return {};
}

uint64_t Program::stepBytes(const Step& step) const {
  auto slotBytes = [&](int slot) -> uint64_t {
    if (slot < 0 || static_cast<size_t>(slot) >= slots.size()) return 0;
    const TensorType& t = slots[static_cast<size_t>(slot)].type;
    const int64_t elements = numElements(t.shape);
    return elements > 0 ? static_cast<uint64_t>(elements) * dtypeSize(t.dtype) : 0;
  };
  uint64_t bytes = slotBytes(step.result);
  for (int s : step.operands) bytes += slotBytes(s);
  return bytes;
}

Status Program::validate() const {
  auto bad = [&](const std::string& message) { return Error("program '" + name + "': " + message); };
  const int numSlots = static_cast<int>(slots.size());
  auto slotOk = [&](int s) { return s >= 0 && s < numSlots; };
  if (arenaBytes < 0) return bad("a negative arena size");
  for (size_t i = 0; i < arguments.size(); ++i) {
    const Argument& a = arguments[i];
    if (!a.type.isStatic()) return bad("argument " + std::to_string(i) + " is not static");
    if (a.hasDefault && a.defaultValue.type() != a.type)
      return bad("the default of argument '" + a.name + "' is " + a.defaultValue.type().str() + ", expected " +
                 a.type.str());
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    const std::string what = "slot " + std::to_string(i) + " (" + s.type.str() + ")";
    if (!s.type.isStatic()) return bad(what + " is not static");
    switch (s.kind) {
      case SlotKind::Argument:
      case SlotKind::InPlace:
        if (s.index < 0 || s.index >= static_cast<int64_t>(arguments.size()) ||
            arguments[static_cast<size_t>(s.index)].type != s.type)
          return bad(what + " names argument " + std::to_string(s.index) + ", which does not fit it");
        break;
      case SlotKind::Constant:
        if (s.index < 0 || s.index >= static_cast<int64_t>(constants.size()) ||
            constants[static_cast<size_t>(s.index)].type() != s.type ||
            constants[static_cast<size_t>(s.index)].numBytes() != static_cast<size_t>(bytesOf(s.type)))
          return bad(what + " names constant " + std::to_string(s.index) + ", which does not fit it");
        break;
      case SlotKind::Arena:
        if (s.index < 0 || s.index > arenaBytes || bytesOf(s.type) > arenaBytes - s.index)
          return bad(what + " at offset " + std::to_string(s.index) + " does not fit the " +
                     std::to_string(arenaBytes) + "-byte arena");
        break;
      case SlotKind::Output: break;
    }
  }
  std::set<int> written;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const std::string what = "step " + std::to_string(i) + " (%" + s.name + ")";
    for (int o : s.operands)
      if (!slotOk(o)) return bad(what + " reads slot " + std::to_string(o) + ", which does not exist");
    if (!slotOk(s.result) || slots[static_cast<size_t>(s.result)].kind == SlotKind::Argument ||
        slots[static_cast<size_t>(s.result)].kind == SlotKind::Constant || !written.insert(s.result).second)
      return bad(what + " writes slot " + std::to_string(s.result) + ", which it cannot");
    for (const SlotCheck& c : s.checks)
      if (!slotOk(c.slot) || isFloat(slots[static_cast<size_t>(c.slot)].type.dtype))
        return bad(what + " checks slot " + std::to_string(c.slot) + ", which is not an integer tensor");
    if (s.parallelExtent < 0) return bad(what + " has a negative parallel extent");
    if (s.kind == Step::Kind::Kernel) {
      if (s.kernel < 0 || s.kernel >= static_cast<int>(kernelNames.size()))
        return bad(what + " runs kernel " + std::to_string(s.kernel) + " of " + std::to_string(kernelNames.size()));
      continue;
    }
    if (s.kind == Step::Kind::Collective) {
      // A collective reads its operand and writes its result through the
      // dims and dtype it describes: they must be the slots' own.
      const CollectiveCall& c = s.collective;
      const bool fits = s.operands.size() == 1 && c.worldSize >= 1 && c.axis >= 0 && c.root >= 0 &&
                        slots[static_cast<size_t>(s.operands[0])].type == TensorType{c.dtype, staticShape(c.inputDims)} &&
                        (c.kind != CollectiveCall::Kind::AllGather && c.kind != CollectiveCall::Kind::ReduceScatter
                             ? true
                             : static_cast<size_t>(c.axis) < c.inputDims.size()) &&
                        slots[static_cast<size_t>(s.result)].type ==
                            TensorType{c.dtype, staticShape(collectiveResultDims(c))};
      if (!fits) return bad(what + " has a collective that does not fit its buffers");
      continue;
    }
    // A library call reads and writes its buffers through the dims it
    // describes: they must be the slots' own.
    const LibraryCall& c = s.call;
    const int buffers = static_cast<int>(s.operands.size());
    auto dimsOfBuffer = [&](int b) { return staticDims(slots[static_cast<size_t>(b == buffers ? s.result : s.operands[b])].type.shape); };
    if (c.resultBuffer != buffers || c.operands.size() < 2 || c.operands.size() > 3 ||
        c.operandDims.size() != c.operands.size() || c.resultDims != dimsOfBuffer(buffers))
      return bad(what + " has a library call that does not fit its buffers");
    if (c.transposedB && (c.kind != LibraryCall::Kind::MatMul || c.operandDims[1].size() < 2))
      return bad(what + " has a transposed operand that is not a matmul's b of 2 or more dims");
    if (c.transposedA && (c.kind != LibraryCall::Kind::MatMul || c.operandDims[0].size() < 2))
      return bad(what + " has a transposed operand that is not a matmul's a of 2 or more dims");
    for (size_t k = 0; k < c.operands.size(); ++k) {
      // An a or b stored transposed holds its last two dims swapped.
      std::vector<int64_t> stored = c.operandDims[k];
      if ((k == 0 && c.transposedA) || (k == 1 && c.transposedB))
        std::swap(stored[stored.size() - 2], stored[stored.size() - 1]);
      if (c.operands[k] < 0 || c.operands[k] >= buffers || stored != dimsOfBuffer(c.operands[k]))
        return bad(what + " has a library call operand that does not fit its buffers");
    }
    // Element types: a quantized call reads x, w and the bias and writes the
    // result as the types it names (f32 calls, all f32, are checked as
    // ever by their slots' dims).
    auto typeOfBuffer = [&](int b) {
      return slots[static_cast<size_t>(b == buffers ? s.result : s.operands[b])].type.dtype;
    };
    if (c.quantized()) {
      const DType want[] = {c.srcType, DType::I8, DType::I32};
      bool fits = typeOfBuffer(buffers) == c.dstType && c.dstType != DType::F32;
      for (size_t k = 0; k < c.operands.size(); ++k) fits = fits && typeOfBuffer(c.operands[k]) == want[k];
      const int64_t channels = c.resultDims.size() < 2               ? 0
                               : c.kind == LibraryCall::Kind::MatMul ? c.resultDims.back()
                                                                     : c.resultDims[1];
      if (!fits || static_cast<int64_t>(c.scales.size()) != channels)
        return bad(what + " has a quantized library call whose element types or scales do not fit its buffers");
    } else if (c.mixedPrecision() || c.dstType == DType::BF16 || c.dstType == DType::F16) {
      // Every operand of srcType (f32, bf16 or f16), into a result of
      // dstType (f32, bf16 or f16).
      bool fits = c.scales.empty() && typeOfBuffer(buffers) == c.dstType;
      for (int operand : c.operands) fits = fits && typeOfBuffer(operand) == c.srcType;
      if (!fits) return bad(what + " has a mixed-precision library call whose element types do not fit its buffers");
    } else if (c.dstType != DType::F32 || !c.scales.empty()) {
      return bad(what + " has a library call of mixed element types");
    }
    for (const PostOp& p : c.postOps) {
      if (!p.isBinary()) continue;
      if (p.operand < 0 || p.operand >= buffers || p.dims.size() != c.resultDims.size() ||
          numElements(staticShape(p.dims)) != numElements(staticShape(dimsOfBuffer(p.operand))))
        return bad(what + " has a post-op operand that does not fit its buffers");
      for (size_t d = 0; d < p.dims.size(); ++d)
        if (p.dims[d] != 1 && p.dims[d] != c.resultDims[d])
          return bad(what + " has a post-op operand that does not broadcast into the result");
    }
  }
  for (const Result& r : results) {
    if (!slotOk(r.slot)) return bad("a result reads slot " + std::to_string(r.slot) + ", which does not exist");
    if (r.aliasedArgument < -1 || r.aliasedArgument >= static_cast<int>(arguments.size()))
      return bad("a result aliases argument " + std::to_string(r.aliasedArgument) + ", which does not exist");
  }
  for (const auto& [slot, argument] : finalCopies)
    if (!slotOk(slot) || argument < 0 || argument >= static_cast<int>(arguments.size()) ||
        bytesOf(slots[static_cast<size_t>(slot)].type) != bytesOf(arguments[static_cast<size_t>(argument)].type))
      return bad("a final copy from slot " + std::to_string(slot) + " into argument " + std::to_string(argument) +
                 " does not fit");
  if (kernelHashes.size() != kernelNames.size()) return bad("a kernel hash per kernel name is missing");
  return {};
}

Error slotAllocationError(const Program& p, int slot) {
  const TensorType& type = p.slots[static_cast<size_t>(slot)].type;
  std::string value = "a result", origin;
  for (const Program::Step& step : p.steps) {
    if (step.result != slot) continue;
    value = "%" + step.name;
    // "broadcast -> f32[...]": the type is said already.
    origin = step.what.substr(0, step.what.find(" -> "));
  }
  for (const Program::Result& r : p.results)
    if (r.slot == slot && !r.name.empty()) {
      origin += (origin.empty() ? "" : ", ") + std::string("the output '") + r.name + "'";
      break;
    }
  const Error e = allocationError(tensorByteSize(type.dtype, staticDims(type.shape)), value, type, origin);
  return Error("program '" + p.name + "': " + e.message());
}

// Staged programs (Program.h StagedProgram).

Status Stages::validate(const std::function<bool(int)>& isPart,
                        const std::function<size_t(int)>& numResults) const {
  auto bad = [&](const std::string& message) { return Error("the stages of '" + name + "': " + message); };
  if (prefix != -1 && !isPart(prefix)) return bad("its prefix is no sub-program (" + std::to_string(prefix) + ")");
  if (suffix != -1 && !isPart(suffix)) return bad("its suffix is no sub-program (" + std::to_string(suffix) + ")");
  const size_t prefixResults = prefix == -1 ? 0 : numResults(prefix);
  const size_t suffixResults = suffix == -1 ? 0 : numResults(suffix);
  // A value read before host step `hosts` (operands of that step; `hosts`
  // = host.size() for the suffix's inputs and the results).
  auto check = [&](const StageValue& v, size_t hosts, bool suffixAllowed, const std::string& what) -> Status {
    switch (v.from) {
      case StageValue::From::Argument:
        if (v.index < argumentTypes.size()) return {};
        break;
      case StageValue::From::Prefix:
        if (v.index < prefixResults) return {};
        break;
      case StageValue::From::Host:
        if (v.index < hosts && v.result < host[v.index].resultTypes.size()) return {};
        break;
      case StageValue::From::Suffix:
        if (suffixAllowed && v.index < suffixResults) return {};
        break;
    }
    return bad(what + " refers to no value (place " + std::to_string(static_cast<int>(v.from)) + ", index " +
               std::to_string(v.index) + ", result " + std::to_string(v.result) + ")");
  };
  for (size_t h = 0; h < host.size(); ++h) {
    const HostStep& step = host[h];
    const std::string what = "host step " + std::to_string(h) + " ('" + step.name + "')";
    if (step.isControlFlow()) {
      const size_t regions = step.kind == OpKind::If ? 2 : 1;
      if (step.bodies.size() != regions)
        return bad(what + " has " + std::to_string(step.bodies.size()) + " bodies, expected " +
                   std::to_string(regions));
      for (int b : step.bodies)
        if (!isPart(b)) return bad(what + "'s body " + std::to_string(b) + " is no sub-program");
      if (step.numCarried < 0 || static_cast<size_t>(step.numCarried) > step.resultTypes.size())
        return bad(what + " carries " + std::to_string(step.numCarried) + " values for " +
                   std::to_string(step.resultTypes.size()) + " results");
    } else {
      if (step.kind != OpKind::NonZero && step.kind != OpKind::Unique && step.kind != OpKind::NonMaxSuppression)
        return bad(what + " is neither control flow nor an op whose result sizes depend on values");
      if (step.op.kind != step.kind || !step.bodies.empty()) return bad(what + " is inconsistent");
    }
    for (const StageValue& v : step.operands) KILN_TRY(check(v, h, false, what + "'s operand"));
  }
  for (const StageValue& v : suffixInputs) KILN_TRY(check(v, host.size(), false, "a suffix input"));
  if (suffix == -1 && !suffixInputs.empty()) return bad("suffix inputs without a suffix");
  for (const StageValue& v : results) KILN_TRY(check(v, host.size(), true, "a result"));
  return {};
}

size_t StagedProgram::numArguments(size_t part) const {
  if (part >= parts.size()) return 0;
  const Part& p = parts[part];
  if (p.kind == Part::Kind::Program) return p.index < programs.size() ? programs[p.index].arguments.size() : 0;
  return p.index < stages.size() ? stages[p.index].argumentTypes.size() : 0;
}

size_t StagedProgram::numResults(size_t part) const {
  if (part >= parts.size()) return 0;
  const Part& p = parts[part];
  if (p.kind == Part::Kind::Program) return p.index < programs.size() ? programs[p.index].results.size() : 0;
  return p.index < stages.size() ? stages[p.index].results.size() : 0;
}

Status StagedProgram::validate() const {
  auto bad = [&](const std::string& message) { return Error("staged program '" + name + "': " + message); };
  if (parts.empty() || parts[0].kind != Part::Kind::Stages) return bad("its first part is not the staged function");
  if (deviceCode.size() != programs.size())
    return bad(std::to_string(deviceCode.size()) + " code objects for " + std::to_string(programs.size()) +
               " programs");
  if (resultNames.size() != resultTypes.size()) return bad("result names and types differ in number");
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    const size_t limit = p.kind == Part::Kind::Program ? programs.size() : stages.size();
    if (p.index >= limit) return bad("part " + std::to_string(i) + " refers to no program or stages");
  }
  for (const Program& program : programs) KILN_TRY(program.validate());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].kind != Part::Kind::Stages) continue;
    // Only parts after this one: the parts form no cycle.
    auto isPart = [&](int part) { return part > static_cast<int>(i) && static_cast<size_t>(part) < parts.size(); };
    auto results = [&](int part) { return numResults(static_cast<size_t>(part)); };
    const Stages& node = stages[parts[i].index];
    KILN_TRY(node.validate(isPart, results));
    if (node.prefix != -1 && numArguments(static_cast<size_t>(node.prefix)) != node.argumentTypes.size())
      return bad("the prefix of '" + node.name + "' takes another number of arguments than the function");
    if (node.suffix != -1 && numArguments(static_cast<size_t>(node.suffix)) != node.suffixInputs.size())
      return bad("the suffix of '" + node.name + "' takes another number of inputs than it is given");
  }
  // Runs recurse once per nested Stages part (a body's stages, a suffix
  // split again): bounded, so that no file can exhaust the stack.
  std::vector<size_t> depth(parts.size(), 0);
  for (size_t i = parts.size(); i-- > 0;) {
    if (parts[i].kind != Part::Kind::Stages) continue;
    const Stages& node = stages[parts[i].index];
    size_t deepest = 0;
    auto sub = [&](int part) {
      if (part != -1) deepest = std::max(deepest, depth[static_cast<size_t>(part)]);
    };
    sub(node.prefix);
    sub(node.suffix);
    for (const HostStep& step : node.host)
      for (int b : step.bodies) sub(b);
    depth[i] = deepest + 1;
    if (depth[i] > kMaxStageDepth)
      return bad("its stages nest more than " + std::to_string(kMaxStageDepth) + " deep");
  }
  const Stages& entry = stages[parts[0].index];
  if (entry.argumentTypes.size() != arguments.size() || entry.results.size() != resultTypes.size())
    return bad("its signature differs from its function's stages");
  return {};
}

std::string serializeStagedProgram(const StagedProgram& p) {
  std::string out;
  putString(out, p.name);
  putLE(out, p.arguments.size(), 4);
  for (const Program::Argument& a : p.arguments) {
    putString(out, a.name);
    putType(out, a.type);
    out += static_cast<char>(a.hasDefault ? 1 : 0);
    if (a.hasDefault) putTensor(out, a.defaultValue, SIZE_MAX);
  }
  putLE(out, p.resultTypes.size(), 4);
  for (size_t i = 0; i < p.resultTypes.size(); ++i) {
    putString(out, i < p.resultNames.size() ? p.resultNames[i] : "");
    putShapedType(out, p.resultTypes[i]);
  }
  putLE(out, p.parts.size(), 4);
  for (const StagedProgram::Part& part : p.parts) {
    out += static_cast<char>(part.kind);
    putLE(out, part.index, 4);
  }
  putLE(out, p.stages.size(), 4);
  for (const Stages& s : p.stages) {
    putString(out, s.name);
    putLE(out, s.argumentTypes.size(), 4);
    for (const TensorType& t : s.argumentTypes) putShapedType(out, t);
    putI32(out, s.prefix);
    putI32(out, s.suffix);
    putLE(out, s.host.size(), 4);
    for (const HostStep& h : s.host) {
      putString(out, opName(h.kind));
      putString(out, h.name);
      out += static_cast<char>(h.op.axis ? 1 : 0);
      putI64(out, h.op.axis.value_or(0));
      out += static_cast<char>(h.op.sorted ? 1 : 0);
      out += static_cast<char>(h.op.centerPointBox ? 1 : 0);
      putStageValues(out, h.operands);
      putI64(out, h.numCarried);
      putLE(out, h.resultTypes.size(), 4);
      for (const TensorType& t : h.resultTypes) putShapedType(out, t);
      putLE(out, h.bodies.size(), 4);
      for (int b : h.bodies) putI32(out, b);
      putLocation(out, h.loc);
    }
    putStageValues(out, s.suffixInputs);
    putStageValues(out, s.results);
  }
  putLE(out, p.programs.size(), 4);
  for (size_t i = 0; i < p.programs.size(); ++i) {
    putString(out, serializeProgram(p.programs[i], SIZE_MAX));
    putString(out, p.programs[i].sharedObject);
    putString(out, i < p.deviceCode.size() ? std::string_view(p.deviceCode[i]) : std::string_view());
  }
  return out;
}

Status parseStagedProgram(std::string_view bytes, const std::string& what, StagedProgram& p) {
  ProgramReader r(bytes, what);
  auto str = [&](std::string& out, std::string_view field) -> Status {
    auto s = r.raw().string(field);
    if (!s) return s.takeError();
    out = std::move(*s);
    return {};
  };
  auto byte = [&](std::string_view field, uint64_t max) -> Expected<uint64_t> {
    auto v = r.raw().uint(1, field);
    if (!v) return v.takeError();
    if (*v > max) return r.raw().error("corrupt: " + std::string(field) + " is " + std::to_string(*v));
    return *v;
  };
  KILN_TRY(str(p.name, "the staged program's name"));
  auto numArgs = r.count("the arguments");
  if (!numArgs) return numArgs.takeError();
  for (size_t i = 0; i < *numArgs; ++i) {
    Program::Argument a;
    KILN_TRY(str(a.name, "an argument's name"));
    auto type = r.type("an argument's type");
    if (!type) return type.takeError();
    a.type = *type;
    auto hasDefault = byte("an argument's default flag", 1);
    if (!hasDefault) return hasDefault.takeError();
    a.hasDefault = *hasDefault == 1;
    if (a.hasDefault) {
      auto t = r.tensor("an argument's default");
      if (!t) return t.takeError();
      if (t->type() != a.type) return r.raw().error("corrupt: argument '" + a.name + "' has a default of another type");
      a.defaultValue = std::move(*t);
    }
    p.arguments.push_back(std::move(a));
  }
  auto numResults = r.count("the results");
  if (!numResults) return numResults.takeError();
  for (size_t i = 0; i < *numResults; ++i) {
    std::string name;
    KILN_TRY(str(name, "a result's name"));
    auto type = r.shapedType("a result's type");
    if (!type) return type.takeError();
    p.resultNames.push_back(std::move(name));
    p.resultTypes.push_back(*type);
  }
  auto numParts = r.count("the parts");
  if (!numParts) return numParts.takeError();
  for (size_t i = 0; i < *numParts; ++i) {
    auto kind = byte("a part's kind", static_cast<uint64_t>(StagedProgram::Part::Kind::Stages));
    if (!kind) return kind.takeError();
    auto index = r.count("a part's index");
    if (!index) return index.takeError();
    p.parts.push_back({static_cast<StagedProgram::Part::Kind>(*kind), *index});
  }
  auto numStages = r.count("the stages");
  if (!numStages) return numStages.takeError();
  for (size_t i = 0; i < *numStages; ++i) {
    Stages s;
    KILN_TRY(str(s.name, "the stages' name"));
    auto numTypes = r.count("the stages' arguments");
    if (!numTypes) return numTypes.takeError();
    for (size_t a = 0; a < *numTypes; ++a) {
      auto t = r.shapedType("an argument's type");
      if (!t) return t.takeError();
      s.argumentTypes.push_back(*t);
    }
    auto prefix = r.i32("the prefix"), suffix = r.i32("the suffix");
    if (!prefix) return prefix.takeError();
    if (!suffix) return suffix.takeError();
    s.prefix = *prefix;
    s.suffix = *suffix;
    auto numHost = r.count("the host steps");
    if (!numHost) return numHost.takeError();
    for (size_t h = 0; h < *numHost; ++h) {
      HostStep step;
      std::string mnemonic;
      KILN_TRY(str(mnemonic, "a host step's op"));
      const std::optional<OpKind> kind = lookupOp(mnemonic);
      if (!kind) return r.raw().error("corrupt: a host step of unknown op '" + mnemonic + "'");
      step.kind = *kind;
      step.op.kind = *kind;
      KILN_TRY(str(step.name, "a host step's name"));
      auto hasAxis = byte("a host step's axis flag", 1);
      if (!hasAxis) return hasAxis.takeError();
      auto axis = r.i64("a host step's axis");
      if (!axis) return axis.takeError();
      if (*hasAxis) step.op.axis = *axis;
      auto sorted = byte("a host step's sorted flag", 1);
      if (!sorted) return sorted.takeError();
      step.op.sorted = *sorted == 1;
      auto center = byte("a host step's box flag", 1);
      if (!center) return center.takeError();
      step.op.centerPointBox = *center == 1;
      auto operands = r.stageValues("a host step's operands");
      if (!operands) return operands.takeError();
      step.operands = std::move(*operands);
      auto carried = r.i64("a host step's carried count");
      if (!carried) return carried.takeError();
      step.numCarried = *carried;
      auto numTypes = r.count("a host step's results");
      if (!numTypes) return numTypes.takeError();
      for (size_t t = 0; t < *numTypes; ++t) {
        auto type = r.shapedType("a host step's result type");
        if (!type) return type.takeError();
        step.resultTypes.push_back(*type);
      }
      auto numBodies = r.count("a host step's bodies");
      if (!numBodies) return numBodies.takeError();
      for (size_t b = 0; b < *numBodies; ++b) {
        auto body = r.i32("a host step's body");
        if (!body) return body.takeError();
        step.bodies.push_back(*body);
      }
      auto loc = r.location("a host step's location");
      if (!loc) return loc.takeError();
      step.loc = *loc;
      step.op.loc = step.loc;
      s.host.push_back(std::move(step));
    }
    auto inputs = r.stageValues("the suffix's inputs");
    if (!inputs) return inputs.takeError();
    s.suffixInputs = std::move(*inputs);
    auto results = r.stageValues("the results");
    if (!results) return results.takeError();
    s.results = std::move(*results);
    p.stages.push_back(std::move(s));
  }
  auto numPrograms = r.count("the programs");
  if (!numPrograms) return numPrograms.takeError();
  for (size_t i = 0; i < *numPrograms; ++i) {
    std::string bytes, code;
    Program program;
    KILN_TRY(str(bytes, "a program"));
    KILN_TRY(parseProgram(bytes, what + " (program " + std::to_string(i) + ")", program));
    KILN_TRY(str(program.sharedObject, "a program's shared object"));
    KILN_TRY(str(code, "a program's device code"));
    p.programs.push_back(std::move(program));
    p.deviceCode.push_back(std::move(code));
  }
  if (r.raw().remaining() != 0)
    return r.raw().error("corrupt: " + std::to_string(r.raw().remaining()) + " unexpected bytes after the stages");
  return {};
}

}  // namespace kiln
