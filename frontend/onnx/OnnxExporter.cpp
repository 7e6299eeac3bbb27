// ONNX export (see OnnxExporter.h). One OnnxWriter per export names every
// value once (graph input, output and initializer names first, then the
// values' own name hints, then fresh `kiln_N` names) and appends nodes in
// the function's order, which is already topological. Each Kiln op has one
// case in exportOp: a primitive maps onto the ONNX op of the same meaning
// at opset 17 (attributes that ONNX takes as inputs become int64
// initializers), a composite onto the ONNX op where ONNX has one and onto
// its formula otherwise.
#include "frontend/onnx/OnnxExporter.h"

#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <set>

#include "frontend/Model.h"
#include "onnx.pb.h"

namespace kiln {

namespace {

constexpr int64_t kOpset = 17;
constexpr int64_t kIrVersion = 8;

int onnxTypeOf(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return onnx::TensorProto::DOUBLE;
    case DType::F32:
      return onnx::TensorProto::FLOAT;
    case DType::F16:
      return onnx::TensorProto::FLOAT16;
    case DType::BF16:
      return onnx::TensorProto::BFLOAT16;
    case DType::I64:
      return onnx::TensorProto::INT64;
    case DType::I32:
      return onnx::TensorProto::INT32;
    case DType::I16:
      return onnx::TensorProto::INT16;
    case DType::I8:
      return onnx::TensorProto::INT8;
    case DType::U8:
      return onnx::TensorProto::UINT8;
    case DType::U16:
      return onnx::TensorProto::UINT16;
    case DType::U32:
      return onnx::TensorProto::UINT32;
    case DType::U64:
      return onnx::TensorProto::UINT64;
    case DType::Bool:
      return onnx::TensorProto::BOOL;
  }
  return onnx::TensorProto::UNDEFINED;
}

void setType(onnx::ValueInfoProto* info, const TensorType& type) {
  auto* tensor = info->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnxTypeOf(type.dtype));
  auto* shape = tensor->mutable_shape();
  for (const Dim& d : type.shape) {
    auto* dim = shape->add_dim();
    if (d.isStatic()) dim->set_dim_value(d.size);
    if (d.isSymbolic()) dim->set_dim_param(d.symbol);
  }
}

void fillTensor(onnx::TensorProto* t, const std::string& name, const DenseTensor& value) {
  t->set_name(name);
  t->set_data_type(onnxTypeOf(value.type.dtype));
  for (const Dim& d : value.type.shape) t->add_dims(d.size);
  t->set_raw_data(std::string(value.bytes.begin(), value.bytes.end()));
}

/// Builds the GraphProto of one function.
class OnnxWriter {
 public:
  OnnxWriter(const Function& f, onnx::GraphProto& graph) : f_(f), graph_(graph) {}

  /// The ONNX name of `v`.
  const std::string& name(const Value* v) {
    auto it = names_.find(v);
    if (it != names_.end()) return it->second;
    return names_[v] = unique(v->name().empty() ? "kiln" : v->name());
  }
  /// Gives `v` the name `n` (which must be free).
  void bind(const Value* v, const std::string& n) {
    used_.insert(n);
    names_[v] = n;
  }
  bool isFree(const std::string& n) const { return !used_.count(n); }
  bool hasName(const Value* v) const { return names_.count(v) != 0; }
  /// A name not used yet, `base` itself when free.
  std::string unique(const std::string& base) {
    std::string n = base;
    while (used_.count(n)) n = base + "_" + std::to_string(counter_++);
    used_.insert(n);
    return n;
  }
  std::string temp() { return unique("kiln_" + std::to_string(counter_++)); }

  onnx::NodeProto* node(const std::string& opType, std::vector<std::string> inputs, std::vector<std::string> outputs) {
    onnx::NodeProto* n = graph_.add_node();
    n->set_op_type(opType);
    std::string base = nodeName_.empty() ? opType : nodeName_;
    std::string name = base;
    while (!nodeNames_.insert(name).second) name = base + "_" + std::to_string(counter_++);
    n->set_name(name);
    for (auto& i : inputs) n->add_input(i);
    for (auto& o : outputs) n->add_output(o);
    return n;
  }
  /// A one-output node writing to a fresh name, which it returns.
  std::string value(const std::string& opType, std::vector<std::string> inputs) {
    std::string out = temp();
    node(opType, std::move(inputs), {out});
    return out;
  }
  void setNodeName(std::string n) { nodeName_ = std::move(n); }

  std::string initializer(const DenseTensor& t, const std::string& base) {
    std::string n = unique(base);
    fillTensor(graph_.add_initializer(), n, t);
    return n;
  }
  std::string ints(const std::vector<int64_t>& v) {
    DenseTensor t = DenseTensor::zeros(TensorType{DType::I64, staticShape({static_cast<int64_t>(v.size())})});
    for (size_t i = 0; i < v.size(); ++i) t.setInt(static_cast<int64_t>(i), v[i]);
    return initializer(t, "kiln_ints");
  }
  std::string scalar(DType dtype, double v) {
    DenseTensor t = DenseTensor::zeros(TensorType{dtype, {}});
    t.setDouble(0, v);
    return initializer(t, "kiln_scalar");
  }

  const Function& function() const { return f_; }

 private:
  const Function& f_;
  onnx::GraphProto& graph_;
  std::map<const Value*, std::string> names_;
  std::set<std::string> used_;
  int64_t counter_ = 0;
  std::string nodeName_;
  std::set<std::string> nodeNames_;
};

void attrInt(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void attrFloat(onnx::NodeProto* n, const std::string& name, double v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(static_cast<float>(v));
}

void attrString(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

void attrStrings(onnx::NodeProto* n, const std::string& name, const std::vector<std::string>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRINGS);
  for (auto& s : v) a->add_strings(s);
}

/// An int list attribute, left out when empty (ONNX's default then applies,
/// as Kiln's does).
void attrInts(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  if (v.empty()) return;
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

/// The ONNX op of each elementwise Kiln op that has one of the same meaning.
const char* directOnnxOp(OpKind kind) {
  switch (kind) {
    case OpKind::Neg:
      return "Neg";
    case OpKind::Abs:
      return "Abs";
    case OpKind::Sign:
      return "Sign";
    case OpKind::Exp:
      return "Exp";
    case OpKind::Log:
      return "Log";
    case OpKind::Sqrt:
      return "Sqrt";
    case OpKind::Reciprocal:
      return "Reciprocal";
    case OpKind::Tanh:
      return "Tanh";
    case OpKind::Sigmoid:
      return "Sigmoid";
    case OpKind::Relu:
      return "Relu";
    case OpKind::Erf:
      return "Erf";
    case OpKind::Sin:
      return "Sin";
    case OpKind::Cos:
      return "Cos";
    case OpKind::Tan:
      return "Tan";
    case OpKind::Asin:
      return "Asin";
    case OpKind::Acos:
      return "Acos";
    case OpKind::Atan:
      return "Atan";
    case OpKind::Sinh:
      return "Sinh";
    case OpKind::Cosh:
      return "Cosh";
    case OpKind::Asinh:
      return "Asinh";
    case OpKind::Acosh:
      return "Acosh";
    case OpKind::Atanh:
      return "Atanh";
    case OpKind::HardSwish:
      return "HardSwish";
    case OpKind::Floor:
      return "Floor";
    case OpKind::Ceil:
      return "Ceil";
    case OpKind::Round:
      return "Round";
    case OpKind::Not:
      return "Not";
    case OpKind::IsNan:
      return "IsNaN";
    case OpKind::IsInf:
      return "IsInf";
    case OpKind::Add:
      return "Add";
    case OpKind::Sub:
      return "Sub";
    case OpKind::Mul:
      return "Mul";
    case OpKind::Div:
      return "Div";
    case OpKind::Pow:
      return "Pow";
    case OpKind::Max:
      return "Max";
    case OpKind::Min:
      return "Min";
    case OpKind::And:
      return "And";
    case OpKind::Or:
      return "Or";
    case OpKind::Xor:
      return "Xor";
    case OpKind::Eq:
      return "Equal";
    case OpKind::Lt:
      return "Less";
    case OpKind::Le:
      return "LessOrEqual";
    case OpKind::Gt:
      return "Greater";
    case OpKind::Ge:
      return "GreaterOrEqual";
    case OpKind::Select:
      return "Where";
    case OpKind::MatMul:
      return "MatMul";
    case OpKind::Softplus:
      return "Softplus";
    default:
      return nullptr;
  }
}

/// The dims of a static type, or an error naming the op that needs them.
Expected<std::vector<int64_t>> staticDimsOf(const Op& op, const TensorType& type, const std::string& why) {
  if (!type.isStatic())
    return op.emitError("cannot be exported to ONNX: " + why + " needs a static shape, but it is " + type.str());
  return staticDims(type.shape);
}

/// The `shape` input of an ONNX Reshape producing `to` from `from`: static
/// dims as they are, a dim equal to the operand's dim at the same position
/// as 0 (copy), and one remaining dim as -1.
Expected<std::vector<int64_t>> reshapeTarget(const Op& op, const Shape& from, const Shape& to) {
  std::vector<int64_t> target;
  int64_t inferred = 0;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i].isStatic()) {
      target.push_back(to[i].size);
      // Reshape reads 0 as "copy the input dim" (allowzero = 0); a real 0 is only safe for an empty result.
      if (to[i].size == 0) return op.emitError("cannot be exported to ONNX: a reshape to a 0 dim");
    } else if (i < from.size() && to[i].isSymbolic() && from[i] == to[i]) {
      target.push_back(0);
    } else {
      target.push_back(-1);
      ++inferred;
    }
  }
  if (inferred > 1)
    return op.emitError("cannot be exported to ONNX: reshape to " + TensorType{DType::F32, to}.str() +
                        " has more than one dim that is neither static nor copied from the operand");
  return target;
}

/// The ONNX activation name of a Kiln rnn activation.
std::string onnxActivation(const std::string& name) {
  if (name == "tanh") return "Tanh";
  if (name == "relu") return "Relu";
  return "Sigmoid";
}

Status exportOp(OnnxWriter& w, const Op& op) {
  std::vector<std::string> in;
  for (Value* v : op.operands()) in.push_back(w.name(v));
  std::vector<std::string> out;
  for (size_t i = 0; i < op.numResults(); ++i) out.push_back(w.name(op.result(i)));
  const TensorType* resultType = op.numResults() ? &op.result(0)->type() : nullptr;
  OpKind kind = op.kind();

  if (const char* direct = directOnnxOp(kind)) {
    w.node(direct, in, out);
    return Status::success();
  }
  switch (kind) {
    case OpKind::Rsqrt:
      w.node("Reciprocal", {w.value("Sqrt", {in[0]})}, out);
      return Status::success();
    case OpKind::Ne:
      w.node("Not", {w.value("Equal", in)}, out);
      return Status::success();
    case OpKind::Rem:
      attrInt(w.node("Mod", in, out), "fmod", 1);
      return Status::success();
    case OpKind::Mod:
      if (!isFloat(op.operand(0)->type().dtype)) {
        attrInt(w.node("Mod", in, out), "fmod", 0);
      } else {
        // ONNX's Mod takes floats only as fmod; Python's % is x - floor(x / y) * y.
        std::string quotient = w.value("Floor", {w.value("Div", in)});
        w.node("Sub", {in[0], w.value("Mul", {quotient, in[1]})}, out);
      }
      return Status::success();
    case OpKind::Constant:
      // Emitted as an initializer by the caller.
      return Status::success();
    case OpKind::Iota: {
      auto dims = staticDimsOf(op, *resultType, "iota");
      if (!dims) return dims.takeError();
      DenseTensor t = DenseTensor::zeros(*resultType);
      int64_t axis = op.getInt("axis");
      if (axis < 0) axis += resultType->rank();
      int64_t inner = 1;
      for (size_t d = static_cast<size_t>(axis) + 1; d < dims->size(); ++d) inner *= (*dims)[d];
      for (int64_t i = 0; i < t.numElements(); ++i) t.setInt(i, (i / inner) % (*dims)[static_cast<size_t>(axis)]);
      w.node("Identity", {w.initializer(t, "kiln_iota")}, out);
      return Status::success();
    }
    case OpKind::Cast:
      attrInt(w.node("Cast", in, out), "to", onnxTypeOf(resultType->dtype));
      return Status::success();
    case OpKind::Broadcast: {
      // Expand broadcasts both ways, so a dim of 1 keeps the operand's dim.
      const Shape& from = op.operand(0)->type().shape;
      std::vector<int64_t> shape;
      for (size_t d = 0; d < resultType->shape.size(); ++d) {
        const Dim& dim = resultType->shape[d];
        int64_t aligned = static_cast<int64_t>(d) - (resultType->rank() - static_cast<int64_t>(from.size()));
        if (dim.isStatic()) {
          shape.push_back(dim.size);
        } else if (aligned >= 0 && from[static_cast<size_t>(aligned)] == dim) {
          shape.push_back(1);
        } else {
          return op.emitError("cannot be exported to ONNX: broadcast to " + resultType->str() +
                              " has a dim that is neither static nor the operand's");
        }
      }
      w.node("Expand", {in[0], w.ints(shape)}, out);
      return Status::success();
    }
    case OpKind::Reshape: {
      auto target = reshapeTarget(op, op.operand(0)->type().shape, resultType->shape);
      if (!target) return target.takeError();
      w.node("Reshape", {in[0], w.ints(*target)}, out);
      return Status::success();
    }
    case OpKind::Transpose:
      attrInts(w.node("Transpose", in, out), "perm", op.getInts("perm"));
      return Status::success();
    case OpKind::Slice: {
      std::vector<int64_t> axes;
      for (size_t i = 0; i < op.getInts("starts").size(); ++i) axes.push_back(static_cast<int64_t>(i));
      w.node(
          "Slice",
          {in[0], w.ints(op.getInts("starts")), w.ints(op.getInts("ends")), w.ints(axes), w.ints(op.getInts("steps"))},
          out);
      return Status::success();
    }
    case OpKind::Concat:
      attrInt(w.node("Concat", in, out), "axis", op.getInt("axis"));
      return Status::success();
    case OpKind::Pad: {
      std::string value = w.scalar(resultType->dtype, op.getFloat("value"));
      attrString(w.node("Pad", {in[0], w.ints(op.getInts("pads")), value}, out), "mode", op.getString("mode"));
      return Status::success();
    }
    case OpKind::Gather:
      attrInt(w.node("Gather", in, out), "axis", op.getInt("axis"));
      return Status::success();
    case OpKind::GatherElements:
      attrInt(w.node("GatherElements", in, out), "axis", op.getInt("axis"));
      return Status::success();
    case OpKind::ScatterElements: {
      const std::string& reduction = op.getString("reduction");
      if (reduction == "max" || reduction == "min")
        return op.emitError("cannot be exported to ONNX opset 17: scatter_elements with reduction \"" + reduction +
                            "\" needs opset 18");
      auto* n = w.node("ScatterElements", in, out);
      attrInt(n, "axis", op.getInt("axis"));
      attrString(n, "reduction", reduction);
      return Status::success();
    }
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::ReduceProd: {
      static const std::map<OpKind, const char*> kNames = {{OpKind::ReduceSum, "ReduceSum"},
                                                           {OpKind::ReduceMean, "ReduceMean"},
                                                           {OpKind::ReduceMax, "ReduceMax"},
                                                           {OpKind::ReduceMin, "ReduceMin"},
                                                           {OpKind::ReduceProd, "ReduceProd"}};
      const std::vector<int64_t>& axes = op.getInts("axes");
      onnx::NodeProto* n;
      // From opset 13 ReduceSum takes its axes as an input (empty: all); the others still as an attribute.
      if (kind == OpKind::ReduceSum)
        n = w.node("ReduceSum", axes.empty() ? std::vector<std::string>{in[0]} : std::vector{in[0], w.ints(axes)}, out);
      else {
        n = w.node(kNames.at(kind), in, out);
        attrInts(n, "axes", axes);
      }
      attrInt(n, "keepdims", op.getBool("keepdims") ? 1 : 0);
      return Status::success();
    }
    case OpKind::ArgMax:
    case OpKind::ArgMin: {
      auto* n = w.node(kind == OpKind::ArgMax ? "ArgMax" : "ArgMin", in, out);
      attrInt(n, "axis", op.getInt("axis"));
      attrInt(n, "keepdims", op.getBool("keepdims") ? 1 : 0);
      attrInt(n, "select_last_index", op.getBool("select_last_index") ? 1 : 0);
      return Status::success();
    }
    case OpKind::Conv:
    case OpKind::ConvTranspose: {
      if (kind == OpKind::Conv && op.getBool("channels_last"))
        return op.emitError("cannot be exported to ONNX opset 17: ONNX's Conv is channels first (drop channels_last)");
      auto* n = w.node(kind == OpKind::Conv ? "Conv" : "ConvTranspose", in, out);
      attrInts(n, "strides", op.getInts("strides"));
      attrInts(n, "pads", op.getInts("pads"));
      attrInts(n, "dilations", op.getInts("dilations"));
      if (kind == OpKind::ConvTranspose) attrInts(n, "output_padding", op.getInts("output_padding"));
      attrInt(n, "group", op.getInt("groups"));
      return Status::success();
    }
    case OpKind::ConvWeightGrad:
      return op.emitError("cannot be exported to ONNX opset 17: ONNX has no convolution weight gradient op");
    case OpKind::Quantize:
    case OpKind::Dequantize:
      attrInt(w.node(kind == OpKind::Quantize ? "QuantizeLinear" : "DequantizeLinear", in, out), "axis",
              op.getInt("axis"));
      return Status::success();
    case OpKind::QConv:
    case OpKind::QMatMul:
      return op.emitError(
          "cannot be exported to ONNX: an int8 contraction of fold-qdq; export the model before that pass (its "
          "QuantizeLinear/DequantizeLinear form)");
    case OpKind::MaxPool:
    case OpKind::AvgPool: {
      if (op.getBool("channels_last"))
        return op.emitError("cannot be exported to ONNX opset 17: ONNX's pools are channels first (drop channels_last)");
      auto* n = w.node(kind == OpKind::MaxPool ? "MaxPool" : "AveragePool", in, out);
      attrInts(n, "kernel_shape", op.getInts("kernel"));
      attrInts(n, "strides", op.getInts("strides"));
      attrInts(n, "pads", op.getInts("pads"));
      if (kind == OpKind::MaxPool) attrInts(n, "dilations", op.getInts("dilations"));
      attrInt(n, "ceil_mode", op.getBool("ceil_mode") ? 1 : 0);
      if (kind == OpKind::AvgPool) attrInt(n, "count_include_pad", op.getBool("count_include_pad") ? 1 : 0);
      return Status::success();
    }
    case OpKind::RandomUniform:
    case OpKind::RandomNormal: {
      // Same distribution; ONNX runtimes draw other samples for a seed.
      auto dims = staticDimsOf(op, *resultType, "a random op");
      if (!dims) return dims.takeError();
      bool uniform = kind == OpKind::RandomUniform;
      auto* n = w.node(uniform ? "RandomUniform" : "RandomNormal", {}, out);
      attrInt(n, "dtype", onnxTypeOf(resultType->dtype));
      attrInts(n, "shape", *dims);
      attrFloat(n, uniform ? "low" : "mean", op.getFloat(uniform ? "low" : "mean"));
      attrFloat(n, uniform ? "high" : "scale", op.getFloat(uniform ? "high" : "std"));
      attrFloat(n, "seed", static_cast<double>(op.getInt("seed")));
      return Status::success();
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      attrInt(w.node(kind == OpKind::Softmax ? "Softmax" : "LogSoftmax", in, out), "axis", op.getInt("axis"));
      return Status::success();
    case OpKind::LayerNorm: {
      const TensorType& x = op.operand(0)->type();
      int64_t axis = op.getInt("axis");
      if (axis < 0) axis += x.rank();
      std::vector<std::string> inputs = in;
      if (inputs.size() < 2) {
        // ONNX requires Scale: ones over the normalized dims.
        auto dims = staticDimsOf(op, TensorType{x.dtype, Shape(x.shape.begin() + axis, x.shape.end())},
                                 "layer_norm without a scale");
        if (!dims) return dims.takeError();
        DenseTensor ones = DenseTensor::zeros(TensorType{x.dtype, staticShape(*dims)});
        for (int64_t i = 0; i < ones.numElements(); ++i) ones.setDouble(i, 1.0);
        inputs.push_back(w.initializer(ones, "kiln_ones"));
      }
      auto* n = w.node("LayerNormalization", inputs, out);
      attrInt(n, "axis", axis);
      attrFloat(n, "epsilon", op.getFloat("epsilon"));
      return Status::success();
    }
    case OpKind::BatchNorm: {
      onnx::NodeProto* n = w.node("BatchNormalization", in, out);
      attrFloat(n, "epsilon", op.getFloat("epsilon"));
      // ONNX's momentum is 1 - torch's (the op's); written when set.
      if (op.attrs().count("momentum")) attrFloat(n, "momentum", 1.0 - op.getFloat("momentum"));
      return Status::success();
    }
    case OpKind::Gelu: {
      DType dtype = resultType->dtype;
      std::string inner;
      if (op.getString("approximate") == "tanh") {
        std::string cube = w.value("Mul", {w.value("Mul", {in[0], in[0]}), in[0]});
        std::string cubic = w.value("Add", {in[0], w.value("Mul", {cube, w.scalar(dtype, 0.044715)})});
        inner = w.value("Tanh", {w.value("Mul", {cubic, w.scalar(dtype, std::sqrt(2.0 / std::numbers::pi))})});
      } else {
        inner = w.value("Erf", {w.value("Mul", {in[0], w.scalar(dtype, 1.0 / std::numbers::sqrt2)})});
      }
      std::string half = w.value("Mul", {in[0], w.scalar(dtype, 0.5)});
      w.node("Mul", {half, w.value("Add", {inner, w.scalar(dtype, 1.0)})}, out);
      return Status::success();
    }
    case OpKind::Silu:
      w.node("Mul", {in[0], w.value("Sigmoid", in)}, out);
      return Status::success();
    case OpKind::LeakyRelu:
      attrFloat(w.node("LeakyRelu", in, out), "alpha", op.getFloat("alpha"));
      return Status::success();
    case OpKind::Elu:
      attrFloat(w.node("Elu", in, out), "alpha", op.getFloat("alpha"));
      return Status::success();
    case OpKind::Rnn:
    case OpKind::Lstm:
    case OpKind::Gru: {
      // Kiln's recurrent ops have ONNX's layout and gate orders (iofc, zrh); sequence_lens is left out.
      std::vector<std::string> inputs{in[0], in[1], in[2], in[3], "", in[4]};
      if (kind == OpKind::Lstm) inputs.push_back(in[5]);
      const char* name = kind == OpKind::Rnn ? "RNN" : kind == OpKind::Lstm ? "LSTM" : "GRU";
      auto* n = w.node(name, inputs, out);
      attrInt(n, "hidden_size", op.getInt("hidden_size"));
      const std::string& direction = op.getString("direction");
      attrString(n, "direction", direction);
      if (kind == OpKind::Rnn) {
        std::string act = onnxActivation(op.getString("activation"));
        attrStrings(n, "activations", direction == "bidirectional" ? std::vector{act, act} : std::vector{act});
      }
      if (kind == OpKind::Gru) attrInt(n, "linear_before_reset", op.getBool("linear_before_reset") ? 1 : 0);
      return Status::success();
    }
    case OpKind::Attention: {
      const TensorType& q = op.operand(0)->type();
      const TensorType& k = op.operand(1)->type();
      int64_t rank = k.rank();
      std::vector<int64_t> perm;
      for (int64_t i = 0; i < rank - 2; ++i) perm.push_back(i);
      perm.push_back(rank - 1);
      perm.push_back(rank - 2);
      double scale = op.getFloat("scale");
      if (scale == 0.0) {
        if (!q.shape.back().isStatic())
          return op.emitError("cannot be exported to ONNX: scale 0 means 1/sqrt(D), which needs a static D; q is " +
                              q.str());
        scale = 1.0 / std::sqrt(static_cast<double>(q.shape.back().size));
      }
      std::string kT = w.temp();
      attrInts(w.node("Transpose", {in[1]}, {kT}), "perm", perm);
      std::string scores = w.value("Mul", {w.value("MatMul", {in[0], kT}), w.scalar(q.dtype, scale)});
      std::string minusInf = w.scalar(q.dtype, -std::numeric_limits<double>::infinity());
      if (in.size() > 3) {
        if (op.operand(3)->type().dtype == DType::Bool)
          scores = w.value("Where", {in[3], scores, minusInf});
        else
          scores = w.value("Add", {scores, in[3]});
      }
      if (op.getBool("causal")) {
        const Dim& lq = q.shape[q.shape.size() - 2];
        const Dim& lk = k.shape[k.shape.size() - 2];
        if (!lq.isStatic() || !lk.isStatic())
          return op.emitError("cannot be exported to ONNX: a causal mask needs static query and key lengths; q is " +
                              q.str() + " and k is " + k.str());
        DenseTensor keep = DenseTensor::zeros(TensorType{DType::Bool, staticShape({lq.size, lk.size})});
        for (int64_t i = 0; i < lq.size; ++i)
          for (int64_t j = 0; j <= std::min(i, lk.size - 1); ++j) keep.setInt(i * lk.size + j, 1);
        scores = w.value("Where", {w.initializer(keep, "kiln_causal"), scores, minusInf});
      }
      std::string probabilities = w.temp();
      attrInt(w.node("Softmax", {scores}, {probabilities}), "axis", -1);
      w.node("MatMul", {probabilities, in[2]}, out);
      return Status::success();
    }
    case OpKind::CrossEntropy:
    case OpKind::NllLoss: {
      if (kind == OpKind::CrossEntropy && op.getFloat("label_smoothing") != 0.0)
        return op.emitError("cannot be exported to ONNX: SoftmaxCrossEntropyLoss has no label smoothing");
      auto* n = w.node(kind == OpKind::CrossEntropy ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss", in, out);
      attrString(n, "reduction", op.getString("reduction"));
      attrInt(n, "ignore_index", op.getInt("ignore_index"));
      return Status::success();
    }
    case OpKind::MseLoss: {
      std::string diff = w.value("Sub", in);
      const std::string& reduction = op.getString("reduction");
      if (reduction == "none") {
        w.node("Mul", {diff, diff}, out);
      } else {
        attrInt(w.node(reduction == "sum" ? "ReduceSum" : "ReduceMean", {w.value("Mul", {diff, diff})}, out),
                "keepdims", 0);
      }
      return Status::success();
    }
    case OpKind::NonZero:
      w.node("NonZero", in, out);
      return Status::success();
    case OpKind::Unique: {
      auto* n = w.node("Unique", in, out);
      attrInt(n, "sorted", op.getBool("sorted") ? 1 : 0);
      if (!op.getInts("axis").empty()) attrInt(n, "axis", op.getInts("axis").front());
      return Status::success();
    }
    case OpKind::NonMaxSuppression:
      attrInt(w.node("NonMaxSuppression", in, out), "center_point_box", op.getBool("center_point_box") ? 1 : 0);
      return Status::success();
    default:
      break;
  }
  return op.emitError("has no ONNX equivalent that Kiln can export");
}

/// Names the graph inputs and outputs first, so that they keep their names.
void nameInterface(OnnxWriter& w, const Function& f) {
  for (size_t i = 0; i < f.numArguments(); ++i) {
    Value* arg = f.argument(i);
    w.bind(arg, w.unique(arg->name().empty() ? "input_" + std::to_string(i) : arg->name()));
  }
}

Status exportFunction(const Function& f, onnx::GraphProto& graph) {
  OnnxWriter w(f, graph);
  graph.set_name(f.name());
  nameInterface(w, f);
  Op* ret = f.returnOp();
  if (!ret) return Error("function @" + f.name() + " has no return; it cannot be exported to ONNX");
  // The output names: the result names, else the returned values' names.
  std::vector<std::string> outputNames;
  for (size_t i = 0; i < ret->numOperands(); ++i) {
    std::string wanted = i < f.resultTypes().size() ? f.resultName(i) : "";
    if (wanted.empty())
      wanted = ret->operand(i)->name().empty() ? "output_" + std::to_string(i) : ret->operand(i)->name();
    Value* v = ret->operand(i);
    // A returned op result takes the output name itself when it can; an
    // argument, or a value returned twice, is renamed by an Identity.
    if (!v->isArgument() && v->definingOp()->kind() != OpKind::Constant && !w.hasName(v) && w.isFree(wanted)) {
      w.bind(v, wanted);
      outputNames.push_back(wanted);
    } else {
      outputNames.push_back(w.unique(wanted));
    }
  }

  for (size_t i = 0; i < f.numArguments(); ++i) {
    Value* arg = f.argument(i);
    setType(graph.add_input(), arg->type());
    graph.mutable_input()->rbegin()->set_name(w.name(arg));
    if (const DenseTensor* dflt = f.argumentDefault(i)) fillTensor(graph.add_initializer(), w.name(arg), *dflt);
  }
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return) continue;
    if (op->kind() == OpKind::Constant) {
      fillTensor(graph.add_initializer(), w.name(op->result(0)), op->getTensor("value"));
      continue;
    }
    w.setNodeName(op->loc().kind == Location::Kind::Named ? op->loc().name : "");
    KILN_TRY(exportOp(w, *op));
  }
  w.setNodeName("");
  for (size_t i = 0; i < ret->numOperands(); ++i) {
    Value* v = ret->operand(i);
    if (w.name(v) != outputNames[i]) w.node("Identity", {w.name(v)}, {outputNames[i]});
    auto* output = graph.add_output();
    output->set_name(outputNames[i]);
    setType(output, v->type());
  }
  return Status::success();
}

}  // namespace

Expected<std::string> exportOnnx(const Module& module) {
  if (module.functions().empty()) return Error("cannot export to ONNX: the module holds no function");
  onnx::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name("kiln");
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  KILN_TRY(exportFunction(*module.functions().front(), *model.mutable_graph()));
  std::string bytes;
  if (!model.SerializeToString(&bytes))
    return Error("cannot export to ONNX: the model does not serialize (over 2 GiB?)");
  return bytes;
}

Status writeOnnxModel(const Module& module, const std::string& path) {
  auto bytes = exportOnnx(module);
  if (!bytes) return Error(path + ": " + bytes.error().str());
  return writeFileAtomically(path, *bytes);
}

}  // namespace kiln
