// The contract between the ONNX importer's core (OnnxImporter.cpp: reading
// the model, opsets, initializers, graph inputs and outputs, topological
// order, import-time constant folding) and the per-op converters (one table
// per file: MathOps.cpp, TensorOps.cpp, NNOps.cpp, VisionOps.cpp,
// SignalOps.cpp, RandomOps.cpp, SequenceOps.cpp, ...). A converter turns one NodeProto into Kiln IR
// through its NodeContext, following the semantics of the node's opset
// (ctx.opset()), and never silently drops an attribute or input it does not
// handle: it returns ctx.error(...) naming it instead.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/Model.h"
#include "ir/Builder.h"
#include "ir/IR.h"

namespace onnx {
class NodeProto;
class AttributeProto;
}  // namespace onnx

namespace kiln::onnx_import {

/// A subgraph converted into a region body: the graph's inputs are its first
/// arguments, then one argument per outer value it reads (`captures`, which
/// the op passes as its trailing operands); its `return` gives the graph's
/// outputs.
struct ImportedBody {
  std::unique_ptr<Function> body;
  std::vector<Value*> captures;
};

/// A value of the ONNX graph as the importer holds it. Kiln IR has tensors
/// only, so a sequence is resolved at import into the list of its elements
/// (a "static sequence", SequenceOps.cpp) and an optional into whether it
/// holds a value and which (OptionalOps in SequenceOps.cpp).
struct ImportValue {
  ValueKind kind = ValueKind::Tensor;
  Value* tensor = nullptr;       // Tensor, OptionalTensor
  std::vector<Value*> elements;  // Sequence, OptionalSequence

  static ImportValue ofTensor(Value* v) { return {ValueKind::Tensor, v, {}}; }
  static ImportValue ofSequence(std::vector<Value*> elements) {
    return {ValueKind::Sequence, nullptr, std::move(elements)};
  }
  static ImportValue none() { return {ValueKind::OptionalNone, nullptr, {}}; }
  bool isOptional() const {
    return kind == ValueKind::OptionalNone || kind == ValueKind::OptionalTensor || kind == ValueKind::OptionalSequence;
  }
  bool isSequence() const { return kind == ValueKind::Sequence || kind == ValueKind::OptionalSequence; }
  /// An optional holding this tensor or sequence (an optional as it is).
  ImportValue wrapped() const {
    if (isOptional()) return *this;
    return {kind == ValueKind::Tensor ? ValueKind::OptionalTensor : ValueKind::OptionalSequence, tensor, elements};
  }
  /// What an optional holds (none for an absent one: check first); a tensor
  /// or sequence as it is.
  ImportValue contents() const {
    if (kind == ValueKind::OptionalTensor) return ofTensor(tensor);
    if (kind == ValueKind::OptionalSequence) return ofSequence(elements);
    return *this;
  }
  /// Its tensors in order: the one tensor, or the elements.
  std::vector<Value*> tensors() const {
    if (isSequence()) return elements;
    if (tensor) return {tensor};
    return {};
  }
};

class NodeContext {
 public:
  virtual ~NodeContext() = default;

  virtual const onnx::NodeProto& node() const = 0;
  /// The model's opset version for the node's domain.
  virtual int64_t opset() const = 0;

  /// Inputs as written; optional inputs may be absent (out of range or
  /// named ""), which hasInput() tells.
  virtual size_t numInputs() const = 0;
  virtual bool hasInput(size_t i) const = 0;
  /// The value of input `i`; an error naming the node when it is absent.
  virtual Expected<Value*> input(size_t i) = 0;
  /// The value of input `i` when it is known at import time (an initializer
  /// that is not also a graph input, a Constant node, or a folded
  /// computation), else null. Converters use it for inputs that Kiln takes
  /// as attributes (Reshape's shape, Slice's starts, Pad's pads, ...).
  virtual const DenseTensor* constantInput(size_t i) = 0;

  /// Input `i` as a static sequence: the import-time list of values an ONNX
  /// sequence is resolved to (SequenceOps.cpp). An error naming the node
  /// when it is absent, a tensor, or a sequence of an enclosing graph.
  virtual Expected<std::vector<Value*>> sequenceInput(size_t i) = 0;
  /// Input `i` whatever it is: a tensor, a static sequence, or an optional.
  /// An error naming the node when it is absent or undefined.
  virtual Expected<ImportValue> anyInput(size_t i) = 0;

  /// Outputs as written; an output named "" is not requested.
  virtual size_t numOutputs() const = 0;
  virtual bool hasOutput(size_t i) const = 0;
  /// Binds output `i` to `v` (renaming `v` to the ONNX output name).
  virtual void setOutput(size_t i, Value* v) = 0;
  /// Binds output `i` to a static sequence of `elements`.
  virtual void setSequenceOutput(size_t i, std::vector<Value*> elements) = 0;
  /// Binds output `i` to a value of any kind.
  virtual void setAnyOutput(size_t i, ImportValue value) = 0;

  /// The attribute `name`, or null when the node does not have it.
  virtual const onnx::AttributeProto* attribute(std::string_view name) const = 0;
  /// Typed attribute access: the default when absent, an error when present
  /// with another type.
  virtual Expected<int64_t> intAttr(std::string_view name, int64_t dflt) const = 0;
  virtual Expected<double> floatAttr(std::string_view name, double dflt) const = 0;
  virtual Expected<std::string> stringAttr(std::string_view name, std::string dflt) const = 0;
  virtual Expected<std::vector<int64_t>> intsAttr(std::string_view name, std::vector<int64_t> dflt) const = 0;
  virtual Expected<std::vector<double>> floatsAttr(std::string_view name, std::vector<double> dflt) const = 0;
  virtual Expected<DenseTensor> tensorAttr(std::string_view name) const = 0;

  /// Creates an op at the end of the graph with the node's location; result
  /// types come from the shape rules (`declared` for ops that take them from
  /// the declaration). When every operand is a constant and the result is
  /// small, the op is evaluated at once and a constant returned instead.
  virtual Expected<Value*> emit(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {},
                                std::vector<TensorType> declared = {}) = 0;
  /// Multi-result form of emit().
  virtual Expected<std::vector<Value*>> emitMulti(OpKind kind, std::vector<Value*> operands, AttrMap attrs = {},
                                                  std::vector<TensorType> declared = {}) = 0;
  virtual Value* constant(DenseTensor value) = 0;
  virtual Value* scalar(DType dtype, double value) = 0;

  /// The builder of the graph being imported, at its end, with the node's
  /// location: for ops that emit() cannot build (those with regions), which
  /// are never folded.
  virtual Builder& builder() = 0;

  /// Imports the subgraph attribute `attrName` (If's branches, Loop's and
  /// Scan's body) as a body whose graph inputs take `formalTypes`. The
  /// `sharedCaptures` (another branch's captures) become its first captured
  /// arguments, in that order, whether it reads them or not.
  virtual Expected<ImportedBody> importBody(std::string_view attrName, std::span<const TensorType> formalTypes,
                                            std::span<Value* const> sharedCaptures = {}) = 0;

  /// Converts the subgraph attribute `attrName` into the graph being
  /// imported, its inputs bound to `inputs` (an unrolled loop's iteration,
  /// the branch an If takes, a SequenceMap's element), and returns its
  /// outputs; the names it binds get `nameSuffix`. Sequences and optionals
  /// flow in and out, and the subgraph reads those of the enclosing graph.
  virtual Expected<std::vector<ImportValue>> inlineBody(std::string_view attrName, std::span<const ImportValue> inputs,
                                                        const std::string& nameSuffix) = 0;

  /// An error located at the node: "node 'NAME' (OpType, opset N): message".
  virtual Error error(const std::string& message) const = 0;
};

/// The newest ai.onnx opset whose semantics the converters know; tables use
/// it as the maxOpset of open-ended entries.
inline constexpr int64_t kNewestOnnxOpset = 18;

using ConvertFn = Status (*)(NodeContext& ctx);

/// One ONNX op type and the opset versions its converter implements.
struct OpConverter {
  std::string_view domain;  // "" for ai.onnx
  std::string_view opType;
  int64_t minOpset;  // first opset version handled
  int64_t maxOpset;  // last opset version handled (the newest known when open-ended)
  ConvertFn convert;
};

/// The converter tables, one per file.
std::span<const OpConverter> mathConverters();    // MathOps.cpp: elementwise, comparison, logic, cast, reductions, matmul/gemm
std::span<const OpConverter> tensorConverters();  // TensorOps.cpp: shape, layout, indexing, constants, control-free utilities
std::span<const OpConverter> nnConverters();      // NNOps.cpp: conv, pooling, normalization, activations, dropout, rnn/lstm/gru, resize, losses
std::span<const OpConverter> visionConverters();  // VisionOps.cpp: GridSample, RoiAlign, MaxUnpool
std::span<const OpConverter> signalConverters();  // SignalOps.cpp: DFT, STFT, MelWeightMatrix, TfIdfVectorizer
std::span<const OpConverter> randomConverters();  // RandomOps.cpp: RandomUniform/Normal(Like), Bernoulli
std::span<const OpConverter> dataDependentConverters();  // DataDependentOps.cpp: NonZero, Unique, NonMaxSuppression
std::span<const OpConverter> controlFlowConverters();  // ControlFlowOps.cpp: If, Loop, Scan
std::span<const OpConverter> sequenceConverters();     // SequenceOps.cpp: Sequence*, SequenceMap, Optional*

/// The converter for `opType` in `domain` at `opset`, or null.
const OpConverter* findConverter(std::string_view domain, std::string_view opType, int64_t opset);

}  // namespace kiln::onnx_import
