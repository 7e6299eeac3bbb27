// The reference interpreter: checks a function's inputs against its
// signature, binds symbolic dims to sizes, then runs the ops in order,
// sizing each result with the shape rules on the concrete operand types and
// dispatching to the op's kernel through a table generated from Ops.def.
// Ops whose result type is declared (reshape, broadcast, cast, iota,
// random_*) get their declared dims resolved first: symbols from the
// bindings, reshape's one unknown dim from the element count, broadcast's
// from the operand. Tensors are freed after their last use. A `fused` op is
// run by interpreting its region on its operands, so fusion never changes
// what the interpreter computes; `if` and `loop` interpret their bodies
// (runtime/ControlFlow.h says which and how often).
#include "runtime/Interpreter.h"

#include <iterator>
#include <map>
#include <new>
#include <span>
#include <unordered_map>

#include "ir/ByteSize.h"
#include "ir/ShapeRules.h"
#include "runtime/ControlFlow.h"
#include "runtime/Kernels.h"

namespace kiln {

namespace {

/// The results of an op with a region: its region interpreted on copies of
/// the operands. Result sizes come from running the region, not from the
/// declared types, which may hold dims only the region's ops determine.
Expected<std::vector<Tensor>> runRegion(const Op& op, std::span<const Tensor* const> operands) {
  const Function* region = op.region();
  if (!region) return op.emitError("has no region to run");
  std::vector<Tensor> inputs;
  for (const Tensor* t : operands) inputs.push_back(*t);
  auto outputs = interpret(*region, std::move(inputs));
  if (!outputs) return outputs.takeError();
  if (outputs->size() != op.numResults())
    return op.emitError("region returned " + std::to_string(outputs->size()) + " values for " +
                        std::to_string(op.numResults()) + " results");
  return outputs;
}

/// The results of `if` or `loop`: its bodies interpreted as ControlFlow.h
/// directs. Result sizes come from the bodies, as for a region.
Expected<std::vector<Tensor>> runControlFlow(const Op& op, std::span<const Tensor* const> operands) {
  BodyRunner runBody = [&op](size_t index, std::vector<Tensor> inputs) -> Expected<std::vector<Tensor>> {
    const Function* body = op.region(index);
    if (!body) return op.emitError("has no region " + std::to_string(index) + " to run");
    return interpret(*body, std::move(inputs));
  };
  if (op.kind() == OpKind::If) return runIf(operands, op.numResults(), runBody, op.loc());
  std::vector<TensorType> declared;
  for (const Value* r : op.results()) declared.push_back(r->type());
  return runLoop(operands, op.getInt("num_carried"), declared, runBody, op.loc());
}

/// Moves `outputs` into results already sized by a caller of the kernel table.
Status moveIntoResults(const KernelCall& call, std::vector<Tensor> outputs) {
  if (outputs.size() != call.results.size())
    return call.op.emitError("region returned " + std::to_string(outputs.size()) + " values for " +
                             std::to_string(call.results.size()) + " results");
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].type() != call.results[i].type())
      return call.op.emitError("region result " + std::to_string(i) + " is " + outputs[i].type().str() +
                               ", expected " + call.results[i].type().str());
    call.results[i] = std::move(outputs[i]);
  }
  return {};
}

}  // namespace

namespace kernels {

// The interpreter calls runRegion itself (results cannot be sized before the
// region runs); this entry serves callers of the kernel table with results
// already sized.
Status Fused(const KernelCall& call) {
  auto outputs = runRegion(call.op, call.operands);
  if (!outputs) return outputs.takeError();
  return moveIntoResults(call, std::move(*outputs));
}

Status If(const KernelCall& call) {
  auto outputs = runControlFlow(call.op, call.operands);
  if (!outputs) return outputs.takeError();
  return moveIntoResults(call, std::move(*outputs));
}

Status Loop(const KernelCall& call) { return If(call); }

}  // namespace kernels

namespace {

/// One kernel per op kind, in OpKind order. An op in Ops.def without a
/// `kernels::<Enum>` function is a compile error here.
constexpr Kernel kKernels[] = {
#define KILN_OP(Enum, ...) &kernels::Enum,
#include "ir/Ops.def"
};
static_assert(std::size(kKernels) == kNumOpKinds, "one kernel per op kind");

/// Sizes of the symbolic dims seen so far, by symbol.
using SymbolSizes = std::map<std::string, int64_t, std::less<>>;

/// The largest tensor the interpreter allocates, in elements; larger
/// results (from corrupt attributes or inputs) are errors, not crashes.
constexpr int64_t kMaxElements = int64_t{1} << 36;

/// Whether the result type of `kind` comes from its declaration rather than
/// from its operands.
bool hasDeclaredType(OpKind kind) {
  switch (kind) {
    case OpKind::Iota:
    case OpKind::Cast:
    case OpKind::Broadcast:
    case OpKind::Reshape:
    case OpKind::RandomUniform:
    case OpKind::RandomNormal: return true;
    default: return false;
  }
}

std::string dimsStr(const std::vector<int64_t>& dims) { return shapeStr(staticShape(dims)); }

/// The declared type of result `r` of `op` with every dim made static.
Expected<TensorType> resolveDeclaredType(const Op& op, size_t r, std::span<const Tensor* const> operands,
                                         const SymbolSizes& symbols) {
  TensorType type = op.result(r)->type();
  if (op.kind() == OpKind::Cast && !operands.empty()) {
    // Only the dtype is declared; the shape is the operand's.
    type.shape = staticShape(operands[0]->shape());
    return type;
  }
  int64_t unknownDim = -1;
  for (size_t d = 0; d < type.shape.size(); ++d) {
    Dim& dim = type.shape[d];
    if (dim.isStatic()) continue;
    if (dim.isSymbolic()) {
      if (auto it = symbols.find(dim.symbol); it != symbols.end()) {
        dim = Dim::fixed(it->second);
        continue;
      }
    }
    if (op.kind() == OpKind::Broadcast && !operands.empty()) {
      // A broadcast result dim equals the aligned operand dim unless that is 1.
      const std::vector<int64_t>& in = operands[0]->shape();
      const int64_t aligned = static_cast<int64_t>(d) - (type.rank() - static_cast<int64_t>(in.size()));
      if (aligned >= 0 && in[aligned] != 1) {
        dim = Dim::fixed(in[aligned]);
        continue;
      }
    }
    if (op.kind() == OpKind::Reshape && unknownDim < 0) {
      unknownDim = static_cast<int64_t>(d);
      continue;
    }
    return op.emitError(
        "cannot determine dim " + std::to_string(d) + " of the declared result type " + op.result(r)->type().str() +
        (dim.isSymbolic() ? ": symbol " + dim.symbol + " is not bound" : ": it is not a function of the operands"));
  }
  if (op.kind() == OpKind::Reshape && !operands.empty()) {
    const int64_t count = operands[0]->numElements();
    int64_t known = 1;
    for (const Dim& dim : type.shape)
      if (dim.isStatic()) known *= dim.size;
    if (unknownDim >= 0) {
      if (known == 0 || count % known != 0)
        return op.emitError("cannot reshape " + dimsStr(operands[0]->shape()) + " (" + std::to_string(count) +
                            " elements) to " + op.result(r)->type().str());
      type.shape[unknownDim] = Dim::fixed(count / known);
    } else if (known != count) {
      return op.emitError("cannot reshape " + dimsStr(operands[0]->shape()) + " (" + std::to_string(count) +
                          " elements) to " + type.str());
    }
  }
  return type;
}

/// True when a static `actual` type may be a value of `declared`.
bool fitsType(const TensorType& declared, const TensorType& actual) {
  if (declared.dtype != actual.dtype || declared.rank() != actual.rank()) return false;
  for (int64_t d = 0; d < declared.rank(); ++d)
    if (!dimsCompatible(declared.shape[d], actual.shape[d])) return false;
  return true;
}

/// `%name` of result `r` of `op`, for messages.
std::string resultName(const Op& op, size_t r) {
  const std::string& name = op.result(r)->name();
  return "%" + (name.empty() ? std::string(op.name()) + "#" + std::to_string(r) : name);
}

/// Checks that a static type is small enough to allocate.
Status checkAllocatable(const Op& op, size_t r, const TensorType& type) {
  int64_t n = 1;
  for (const Dim& d : type.shape) {
    if (d.size < 0) return op.emitError("result type " + type.str() + " has a negative dim");
    if (d.size != 0 && n > kMaxElements / d.size)
      return op.emitError(allocationError(tensorByteSize(type), resultName(op, r), type).message() +
                          ": more than 2^36 elements, the most the interpreter takes");
    n *= d.size;
  }
  return {};
}

/// The error of `op`'s kernel running out of memory (std::bad_alloc from a
/// result or a buffer of its own), naming its results.
Error outOfMemory(const Op& op, std::span<const TensorType> resultTypes) {
  uint64_t total = 0;
  bool known = true;
  std::string names, types;
  for (size_t r = 0; r < resultTypes.size(); ++r) {
    const auto bytes = tensorByteSize(resultTypes[r]);
    known = known && bytes && !__builtin_add_overflow(total, *bytes, &total);
    names += (r ? ", " : "") + resultName(op, r);
    types += (r ? ", " : "") + resultTypes[r].str();
  }
  if (resultTypes.size() == 1 && known) return op.emitError(allocationError(total, names, resultTypes[0]).message());
  return op.emitError("out of memory computing " + names + ": " + types +
                      (known ? " (" + formatBytes(total) + ")" : std::string()));
}

/// Runs `op` on `operands`; `symbols` resolves symbolic declared dims.
Expected<std::vector<Tensor>> runOp(const Op& op, std::span<const Tensor* const> operands, const SymbolSizes& symbols) {
  if (op.info().isControlFlow()) return runControlFlow(op, operands);
  if (op.region()) return runRegion(op, operands);
  const OpInfo& info = op.info();
  const int count = static_cast<int>(operands.size());
  if (count < info.minOperands || (info.maxOperands >= 0 && count > info.maxOperands))
    return op.emitError("got " + std::to_string(count) + " operands, expected " + std::to_string(info.minOperands) +
                        (info.maxOperands == info.minOperands ? ""
                         : info.maxOperands < 0               ? " or more"
                                                              : " to " + std::to_string(info.maxOperands)));

  std::vector<TensorType> operandTypes;
  for (const Tensor* t : operands) operandTypes.push_back(t->type());
  std::vector<TensorType> declared;
  for (size_t r = 0; r < op.numResults(); ++r) {
    if (!hasDeclaredType(op.kind())) {
      declared.push_back(op.result(r)->type());
      continue;
    }
    auto type = resolveDeclaredType(op, r, operands, symbols);
    if (!type) return type.takeError();
    declared.push_back(std::move(*type));
  }

  ShapeQuery query{op.kind(), operandTypes, &op.attrs(), declared, op.loc()};
  auto resultTypes = inferResultTypes(query);
  if (!resultTypes) return resultTypes.takeError();
  if (resultTypes->size() != op.numResults())
    return op.emitError("shape rule gave " + std::to_string(resultTypes->size()) + " result types for " +
                        std::to_string(op.numResults()) + " results");
  std::vector<Tensor> results;
  if (info.hasDataDependentShape()) {
    // The kernel sizes the results from the values; they must still be
    // what the shape rule and the declared types allow.
    results.resize(resultTypes->size());
    try {
      KILN_TRY(kKernels[static_cast<size_t>(op.kind())](KernelCall{op, operands, results}));
    } catch (const std::bad_alloc&) {
      return outOfMemory(op, *resultTypes);
    }
    for (size_t r = 0; r < results.size(); ++r)
      if (!fitsType((*resultTypes)[r], results[r].type()) || !fitsType(op.result(r)->type(), results[r].type()))
        return op.emitError("result " + std::to_string(r) + " is " + results[r].type().str() + ", but its type is " +
                            op.result(r)->type().str());
    return results;
  }
  for (size_t r = 0; r < resultTypes->size(); ++r) {
    const TensorType& type = (*resultTypes)[r];
    if (!type.isStatic()) return op.emitError("cannot determine the result type " + type.str() + " at run time");
    KILN_TRY(checkAllocatable(op, r, type));
  }
  // The results and whatever the kernel allocates for itself: memory that
  // runs out is this op's error.
  try {
    for (const TensorType& type : *resultTypes) results.emplace_back(type.dtype, staticDims(type.shape));
    KILN_TRY(kKernels[static_cast<size_t>(op.kind())](KernelCall{op, operands, results}));
  } catch (const std::bad_alloc&) {
    return outOfMemory(op, *resultTypes);
  }
  return results;
}

/// `argument 0 (%x)`, or `argument 0` for an unnamed argument.
std::string describeArgument(const Function& f, size_t i) {
  const std::string& name = f.argument(i)->name();
  return "argument " + std::to_string(i) + (name.empty() ? "" : " (%" + name + ")");
}

/// Binds the symbolic dims of `type` to the sizes in `dims`; returns the
/// first symbol whose size differs from an earlier binding.
std::optional<std::string> bindSymbols(const TensorType& type, const std::vector<int64_t>& dims, SymbolSizes& symbols) {
  for (size_t d = 0; d < type.shape.size() && d < dims.size(); ++d) {
    const Dim& dim = type.shape[d];
    if (!dim.isSymbolic()) continue;
    auto [it, inserted] = symbols.emplace(dim.symbol, dims[d]);
    if (!inserted && it->second != dims[d]) return dim.symbol;
  }
  return std::nullopt;
}

/// Checks every input against its argument's type and binds the symbols.
Status bindArguments(const Function& f, const std::vector<Tensor>& inputs, SymbolSizes& symbols) {
  if (inputs.size() != f.numArguments())
    return Error("function @" + f.name() + " takes " + std::to_string(f.numArguments()) + " arguments, got " +
                     std::to_string(inputs.size()) + " inputs",
                 f.loc());
  std::map<std::string, size_t, std::less<>> boundBy;  // symbol -> argument that bound it
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& expected = f.argument(i)->type();
    const Tensor& input = inputs[i];
    bool matches = input.dtype() == expected.dtype && input.rank() == expected.rank();
    for (int64_t d = 0; matches && d < expected.rank(); ++d)
      matches = !expected.shape[d].isStatic() || expected.shape[d].size == input.shape()[d];
    if (!matches)
      return Error(describeArgument(f, i) + ": expected " + expected.str() + ", got " + input.type().str(), f.loc());
    for (int64_t d = 0; d < expected.rank(); ++d) {
      const Dim& dim = expected.shape[d];
      if (!dim.isSymbolic()) continue;
      auto [it, inserted] = symbols.emplace(dim.symbol, input.shape()[d]);
      if (inserted) {
        boundBy[dim.symbol] = i;
      } else if (it->second != input.shape()[d]) {
        return Error(describeArgument(f, i) + ": expected " + expected.str() + ", got " + input.type().str() + " (" +
                         dim.symbol + " is " + std::to_string(it->second) + " in " +
                         describeArgument(f, boundBy[dim.symbol]) + ")",
                     f.loc());
      }
    }
  }
  return {};
}

}  // namespace

Expected<std::vector<Tensor>> interpretOp(const Op& op, std::span<const Tensor* const> operands) {
  // Symbols of the operands' declared types bind to the operands' sizes, so
  // that a declared result such as `f32[N,4]` can be resolved.
  SymbolSizes symbols;
  for (size_t i = 0; i < op.numOperands() && i < operands.size(); ++i)
    (void)bindSymbols(op.operand(i)->type(), operands[i]->shape(), symbols);
  return runOp(op, operands, symbols);
}

Expected<std::vector<Tensor>> interpret(const Function& f, std::vector<Tensor> inputs) {
  return interpret(f, std::move(inputs), OpObserver());
}

Expected<std::vector<Tensor>> interpret(const Function& f, std::vector<Tensor> inputs, const OpObserver& observer) {
  SymbolSizes symbols;
  KILN_TRY(bindArguments(f, inputs, symbols));

  // Each live value's tensor and the number of uses it has left; a tensor is
  // dropped after its last use.
  std::unordered_map<const Value*, Tensor> values;
  std::unordered_map<const Value*, size_t> usesLeft;
  auto define = [&](const Value* v, Tensor t) {
    if (!v->hasUses()) return;
    usesLeft[v] = v->users().size();
    values[v] = std::move(t);
  };
  for (size_t i = 0; i < inputs.size(); ++i) define(f.argument(i), std::move(inputs[i]));

  for (const auto& opPtr : f.ops()) {
    const Op& op = *opPtr;
    std::vector<const Tensor*> operands;
    for (Value* v : op.operands()) {
      auto it = values.find(v);
      if (it == values.end()) return op.emitError("uses a value that is not defined before it");
      operands.push_back(&it->second);
    }

    if (op.kind() == OpKind::Return) {
      const std::vector<TensorType>& resultTypes = f.resultTypes();
      std::vector<Tensor> results;
      for (size_t i = 0; i < operands.size(); ++i) {
        if (i < resultTypes.size() && !fitsType(resultTypes[i], operands[i]->type()))
          return op.emitError("result " + std::to_string(i) + " is " + operands[i]->type().str() + ", but @" +
                              f.name() + " returns " + resultTypes[i].str());
        results.push_back(*operands[i]);
      }
      return results;
    }

    auto results = runOp(op, operands, symbols);
    if (!results) return results.takeError();
    for (size_t r = 0; r < results->size(); ++r) {
      const Tensor& t = (*results)[r];
      if (auto symbol = bindSymbols(op.result(r)->type(), t.shape(), symbols))
        return op.emitError("result " + std::to_string(r) + " is " + t.type().str() + ", but its declared type " +
                            op.result(r)->type().str() + " needs " + *symbol + " = " +
                            std::to_string(symbols.at(*symbol)));
    }
    if (observer) KILN_TRY(observer(op, *results));
    for (Value* v : op.operands())
      if (--usesLeft[v] == 0) values.erase(v);
    for (size_t r = 0; r < results->size(); ++r) define(op.result(r), std::move((*results)[r]));
  }
  return Error("function @" + f.name() + " has no return", f.loc());
}

Expected<std::vector<DenseTensor>> InterpreterEvaluator::evaluate(const Op& op,
                                                                  std::span<const DenseTensor* const> operands) const {
  std::vector<Tensor> tensors;
  for (const DenseTensor* t : operands) {
    if (!t->type.isStatic() || t->bytes.size() != static_cast<size_t>(t->numElements()) * dtypeSize(t->type.dtype))
      return op.emitError("constant operand of type " + t->type.str() + " does not hold its elements");
    tensors.push_back(Tensor::fromDense(*t));
  }
  std::vector<const Tensor*> pointers;
  for (const Tensor& t : tensors) pointers.push_back(&t);
  auto results = interpretOp(op, pointers);
  if (!results) return results.takeError();
  std::vector<DenseTensor> dense;
  for (const Tensor& t : *results) dense.push_back(t.toDense());
  return dense;
}

const OpEvaluator& interpreterEvaluator() {
  static const InterpreterEvaluator evaluator;
  return evaluator;
}

}  // namespace kiln
