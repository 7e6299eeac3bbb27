// Initializers as graph inputs for training, and writing trained values back
// into the original ONNX file (OnnxTraining.h).
#include "frontend/onnx/OnnxTraining.h"

#include <map>
#include <set>

#include "frontend/Model.h"
#include "onnx.pb.h"

namespace kiln {

namespace {

constexpr int64_t kMaxModelBytes = (int64_t{1} << 31) - 1;

Expected<onnx::ModelProto> parse(std::string_view bytes, std::string_view what) {
  if (static_cast<int64_t>(bytes.size()) > kMaxModelBytes)
    return Error(std::string(what) + ": " + std::to_string(bytes.size()) +
                 " bytes is more than a protobuf message can hold (2 GiB)");
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Error(std::string(what) + ": not a valid ONNX model (the protobuf is truncated or malformed)");
  if (!model.has_graph()) return Error(std::string(what) + ": the ONNX model has no graph");
  return model;
}

bool isTrainableType(int32_t type) { return type == onnx::TensorProto::FLOAT || type == onnx::TensorProto::DOUBLE; }

std::string onnxTypeName(int32_t type) {
  return onnx::TensorProto::DataType_IsValid(type)
             ? onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(type))
             : "type " + std::to_string(type);
}

std::string dimsString(const onnx::TensorProto& t) {
  std::string s = "[";
  for (int i = 0; i < t.dims_size(); ++i) s += (i ? "," : "") + std::to_string(t.dims(i));
  return s + "]";
}

/// Gives each Identity of a float initializer in `graph` an initializer of
/// its own: a copy named like the Identity's output, which replaces the
/// node. torch.onnx.export stores parameters of equal value once and
/// recreates the others as Identity nodes (a fresh model's layer norms and
/// batch norms, every layer of an nn.TransformerEncoder, which copies one);
/// in PyTorch they are separate tensors that training moves apart, so they
/// must be separate here too. (Truly shared weights are one tensor in
/// PyTorch, exported as one initializer read by several nodes, and stay so.)
void untieSharedInitializers(onnx::GraphProto& graph) {
  std::map<std::string, int> initializerIndex;
  for (int i = 0; i < graph.initializer_size(); ++i) initializerIndex[graph.initializer(i).name()] = i;
  std::set<std::string> graphInputs;
  for (const auto& input : graph.input()) graphInputs.insert(input.name());
  // Repeated: an Identity of an Identity is untied once the first is.
  for (bool changed = true; changed;) {
    changed = false;
    for (int n = 0; n < graph.node_size(); ++n) {
      const onnx::NodeProto& node = graph.node(n);
      if (node.op_type() != "Identity" || !node.domain().empty() || node.input_size() != 1 ||
          node.output_size() != 1 || node.output(0).empty() || initializerIndex.count(node.output(0)))
        continue;
      auto it = initializerIndex.find(node.input(0));
      // An initializer that is also a graph input may be fed another value.
      if (it == initializerIndex.end() || graphInputs.count(node.input(0))) continue;
      const onnx::TensorProto& source = graph.initializer(it->second);
      if (!isTrainableType(source.data_type()) || source.dims_size() == 0) continue;
      onnx::TensorProto copy = source;
      copy.set_name(node.output(0));
      *graph.add_initializer() = std::move(copy);
      initializerIndex[node.output(0)] = graph.initializer_size() - 1;
      graph.mutable_node()->DeleteSubrange(n, 1);
      changed = true;
      break;
    }
  }
}

}  // namespace

Expected<std::string> declareFloatInitializersAsInputs(std::string_view bytes, std::string_view what) {
  auto model = parse(bytes, what);
  if (!model) return model.takeError();
  onnx::GraphProto* graph = model->mutable_graph();
  untieSharedInitializers(*graph);
  std::set<std::string> inputs;
  for (const auto& input : graph->input()) inputs.insert(input.name());
  for (const auto& init : graph->initializer()) {
    if (!isTrainableType(init.data_type()) || init.dims_size() == 0 || inputs.count(init.name())) continue;
    onnx::ValueInfoProto* input = graph->add_input();
    input->set_name(init.name());
    auto* tensor = input->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(init.data_type());
    for (int64_t d : init.dims()) tensor->mutable_shape()->add_dim()->set_dim_value(d);
    inputs.insert(init.name());
  }
  std::string out;
  if (!model->SerializeToString(&out)) return Error(std::string(what) + ": the model cannot be serialized again");
  return out;
}

Status writeOnnxWithInitializers(const std::string& path, const std::map<std::string, DenseTensor>& values,
                                 const std::string& outPath) {
  auto bytes = readFileBounded(path, kMaxModelBytes);
  if (!bytes) return bytes.takeError();
  auto model = parse(*bytes, path);
  if (!model) return model.takeError();
  untieSharedInitializers(*model->mutable_graph());  // as declareFloatInitializersAsInputs saw the model
  std::set<std::string> replaced;
  for (auto& init : *model->mutable_graph()->mutable_initializer()) {
    auto it = values.find(init.name());
    if (it == values.end()) continue;
    const DenseTensor& value = it->second;
    const int32_t type = value.type.dtype == DType::F64   ? onnx::TensorProto::DOUBLE
                         : value.type.dtype == DType::F32 ? onnx::TensorProto::FLOAT
                                                          : onnx::TensorProto::UNDEFINED;
    bool sameShape = init.dims_size() == value.type.rank();
    for (int i = 0; sameShape && i < init.dims_size(); ++i)
      sameShape = value.type.shape[i].isStatic() && value.type.shape[i].size == init.dims(i);
    if (type != init.data_type() || !sameShape)
      return Error(path + ": initializer '" + init.name() + "' is " + onnxTypeName(init.data_type()) +
                   dimsString(init) + ", but its trained value is " + value.type.str());
    // Only the values change: every other field (name, dims, doc string)
    // stays; the data moves to raw_data, the one form every reader takes.
    init.clear_float_data();
    init.clear_double_data();
    init.clear_external_data();
    init.clear_data_location();
    init.set_raw_data(std::string(value.bytes.begin(), value.bytes.end()));
    replaced.insert(init.name());
  }
  for (const auto& [name, value] : values)
    if (!replaced.count(name)) return Error(path + ": the model has no initializer named '" + name + "' to update");
  std::string out;
  if (!model->SerializeToString(&out)) return Error(outPath + ": the trained model cannot be serialized");
  return writeFileAtomically(outPath, out);
}

}  // namespace kiln
