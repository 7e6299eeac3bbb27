// The ONNX importer's core: reads a ModelProto with bounded sizes, resolves
// opset imports, turns initializers (raw, typed or external data) into
// constants or argument defaults, graph inputs into arguments and graph
// outputs into named results, sorts nodes topologically, refuses models with
// unsupported ops (all of them listed in one error), and runs each node's
// converter (MathOps.cpp, TensorOps.cpp, NNOps.cpp, ControlFlowOps.cpp)
// through a NodeContext that folds ops on constants at import time with the
// injected evaluator. A subgraph (the body of If, Loop or Scan) is imported
// the same way into a region in a scope of its own: a name it does not
// define is looked up in the enclosing scopes, and an outer value found there
// becomes a trailing argument of the body ("captured": the op passes it as an
// operand), or a copy when it is a small constant, so that shape computations
// on it still fold. Sequence and optional graph inputs and outputs are
// specialized to the values they take (LoadOptions::inputForms; a sequence
// is one argument or result per element, frontend/Model.h), and the value
// files that hold such values are read by readOnnxValue. Every count, index,
// rank and size read from the file is checked before use.
#include "frontend/onnx/OnnxImporter.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "frontend/onnx/ConverterSupport.h"
#include "frontend/onnx/OnnxOps.h"
#include "ir/ByteSize.h"
#include "onnx.pb.h"
#include "onnx_values.pb.h"

namespace kiln {
namespace {

static_assert(std::endian::native == std::endian::little, "tensor bytes are copied as little-endian");

namespace fs = std::filesystem;
using onnx_import::ImportValue;
using onnx_import::NodeContext;

/// Protobuf cannot parse a message of 2 GiB or more; larger models keep
/// their weights in external data files.
constexpr int64_t kMaxModelBytes = INT_MAX;
/// The largest external data blob one tensor may read.
constexpr int64_t kMaxExternalBytes = int64_t{4} << 30;
/// Bounds on dims and element counts of tensors read from a file (as the
/// text IR's).
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int64_t kMaxElements = int64_t{1} << 40;
/// Ops on constants whose results are larger are left in the graph.
constexpr int64_t kMaxFoldedElements = int64_t{1} << 20;
/// ... and so are ops whose constant operands hold more elements in all.
constexpr int64_t kMaxFoldedOperandElements = int64_t{1} << 22;
/// The most multiply-adds (or window taps) an op folded at import may cost:
/// about a tenth of a second on the interpreter.
constexpr int64_t kMaxFoldedWork = int64_t{1} << 26;
/// The most Kiln ops one ONNX node may expand to (an LSTM unrolled over a
/// few thousand steps stays far below).
constexpr int64_t kMaxOpsPerNode = int64_t{1} << 18;

std::string inQuotes(std::string_view s) { return "'" + std::string(s) + "'"; }

/// What evaluating `op` on `constants` costs, roughly: the result's elements
/// times the terms each sums (contractions, pooling windows, the composites'
/// recurrences and attention, bounded by their operands), else the elements
/// read and written. Saturates instead of overflowing.
int64_t foldWork(const Op& op, const std::vector<const DenseTensor*>& constants) {
  auto mul = [](int64_t a, int64_t b) {
    return b != 0 && a > std::numeric_limits<int64_t>::max() / b ? std::numeric_limits<int64_t>::max() : a * b;
  };
  int64_t results = 0, operands = 0, largest = 1;
  for (const Value* r : op.results())
    if (r->type().isStatic()) results += numElements(r->type().shape);
  for (const DenseTensor* t : constants) {
    operands += t->numElements();
    largest = std::max(largest, t->numElements());
  }
  const OpInfo& info = opInfo(op.kind());
  switch (op.kind()) {
    case OpKind::MatMul: {
      const TensorType& a = constants[0]->type;
      return mul(results, a.rank() > 0 && a.shape.back().isStatic() ? a.shape.back().size : largest);
    }
    case OpKind::Conv:
    case OpKind::ConvTranspose: {
      // Each output (conv) or input (conv_transpose) element meets one
      // filter of weight[K, ...]: its elements over K.
      const TensorType& w = constants[1]->type;
      const int64_t perFilter =
          w.rank() > 0 && w.shape[0].isStatic() && w.shape[0].size > 0 ? constants[1]->numElements() / w.shape[0].size
                                                                         : constants[1]->numElements();
      return mul(op.kind() == OpKind::Conv ? results : constants[0]->numElements(), perFilter);
    }
    case OpKind::MaxPool:
    case OpKind::AvgPool: {
      int64_t window = 1;
      for (int64_t k : op.getInts("kernel")) window = mul(window, std::max<int64_t>(k, 1));
      return mul(results, window);
    }
    default:
      break;
  }
  if (info.isComposite()) return mul(operands + results, largest);
  return operands + results;
}

std::string onnxTypeName(int32_t type) {
  if (onnx::TensorProto::DataType_IsValid(type))
    return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(type));
  return "data type " + std::to_string(type);
}

Expected<DType> requireDType(int32_t type, const std::string& what) {
  if (auto dtype = onnx_import::dtypeFromOnnx(type)) return *dtype;
  return Error(what + " has element type " + onnxTypeName(type) +
               ", which Kiln does not support (expected FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT64, INT32, INT16, INT8, "
               "UINT64, UINT32, UINT16, UINT8 or BOOL)");
}

/// Reads at most `maxBytes` of a regular file.
Expected<std::string> readWholeFile(const std::string& path, int64_t maxBytes, const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return Error("cannot read " + what + " '" + path + "': not a regular file");
  const auto size = fs::file_size(path, ec);
  if (ec) return Error("cannot read " + what + " '" + path + "': " + ec.message());
  if (size > static_cast<uintmax_t>(maxBytes))
    return Error(what + " '" + path + "' has " + std::to_string(size) + " bytes; the limit is " +
                 std::to_string(maxBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("cannot open " + what + " '" + path + "'");
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return Error("cannot read " + what + " '" + path + "': cannot allocate " + formatBytes(size) + " to hold it");
  }
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) return Error("cannot read " + what + " '" + path + "'");
  return bytes;
}

/// The static shape of a TensorProto, checked against the bounds.
Expected<Shape> tensorShape(const onnx::TensorProto& t, const std::string& what) {
  Shape shape;
  int64_t count = 1;
  for (int i = 0; i < t.dims_size(); ++i) {
    const int64_t d = t.dims(i);
    if (d < 0 || d > kMaxDim)
      return Error(what + ": dim " + std::to_string(i) + " is " + std::to_string(d) + " (expected 0 to 2^40)");
    if (d != 0 && count > kMaxElements / d) return Error(what + ": more than 2^40 elements");
    count *= d;
    shape.push_back(Dim::fixed(d));
  }
  return shape;
}

/// True when `path` is inside `folder` (both canonical).
bool isInside(const fs::path& path, const fs::path& folder) {
  auto [f, p] = std::mismatch(folder.begin(), folder.end(), path.begin(), path.end());
  return f == folder.end() && p != path.end();
}

/// Reads the external data of `t` from a file under `baseDir`.
Expected<std::vector<uint8_t>> readExternalData(const onnx::TensorProto& t, size_t expectedBytes,
                                                const std::string& baseDir, const std::string& what) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& entry : t.external_data()) {
    auto parseInt = [&](const std::string& s) -> Expected<int64_t> {
      if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return Error(what + ": external data " + entry.key() + " '" + s + "' is not a non-negative integer");
      return std::stoll(s);
    };
    if (entry.key() == "location") {
      location = entry.value();
    } else if (entry.key() == "offset") {
      auto v = parseInt(entry.value());
      if (!v) return v.takeError();
      offset = *v;
    } else if (entry.key() == "length") {
      auto v = parseInt(entry.value());
      if (!v) return v.takeError();
      length = *v;
    }
  }
  if (location.empty()) return Error(what + ": external data has no location");
  if (baseDir.empty())
    return Error(what + ": external data '" + location + "' cannot be read: the model has no folder");
  const fs::path relative(location);
  if (relative.is_absolute() || relative.has_root_name() || relative.has_root_directory())
    return Error(what + ": external data location '" + location +
                 "' is absolute (expected a path inside the model's folder)");
  for (const auto& part : relative)
    if (part == "..")
      return Error(what + ": external data location '" + location +
                   "' contains '..' (expected a path inside the model's folder)");
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(fs::path(baseDir), ec);
  if (ec) return Error(what + ": cannot resolve the model's folder '" + baseDir + "': " + ec.message());
  const fs::path file = fs::weakly_canonical(folder / relative, ec);
  if (ec) return Error(what + ": cannot resolve external data '" + location + "': " + ec.message());
  // weakly_canonical resolves symlinks, so a link pointing out of the folder
  // is caught here.
  if (!isInside(file, folder))
    return Error(what + ": external data '" + location + "' resolves to '" + file.string() +
                 "', outside the model's folder");
  if (!fs::is_regular_file(file, ec)) return Error(what + ": external data '" + location + "' is not a regular file");
  const auto fileSize = static_cast<int64_t>(fs::file_size(file, ec));
  if (ec) return Error(what + ": cannot read external data '" + location + "': " + ec.message());
  if (length >= 0 && static_cast<size_t>(length) != expectedBytes)
    return Error(what + ": external data length is " + std::to_string(length) + " bytes, but the tensor needs " +
                 std::to_string(expectedBytes));
  if (static_cast<int64_t>(expectedBytes) > kMaxExternalBytes)
    return Error(what + ": external data of " + std::to_string(expectedBytes) + " bytes exceeds the 4 GiB limit");
  if (offset > fileSize || fileSize - offset < static_cast<int64_t>(expectedBytes))
    return Error(what + ": external data '" + location + "' has " + std::to_string(fileSize) + " bytes, too few for " +
                 std::to_string(expectedBytes) + " bytes at offset " + std::to_string(offset));
  std::ifstream in(file, std::ios::binary);
  if (!in) return Error(what + ": cannot open external data '" + location + "'");
  in.seekg(offset);
  // Read straight into the tensor's buffer: one copy of a weight in memory.
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(expectedBytes);
  } catch (const std::bad_alloc&) {
    return Error(what + ": cannot allocate " + formatBytes(expectedBytes) + " for its external data '" + location +
                 "'");
  }
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(expectedBytes));
  if (in.gcount() != static_cast<std::streamsize>(expectedBytes))
    return Error(what + ": cannot read external data '" + location + "'");
  return bytes;
}

/// The typed field that holds the values of a `dtype` tensor without
/// raw_data: its length and name.
std::pair<int64_t, const char*> typedField(const onnx::TensorProto& t, DType dtype) {
  switch (dtype) {
    case DType::F32: return {t.float_data_size(), "float_data"};
    case DType::F64: return {t.double_data_size(), "double_data"};
    case DType::I64: return {t.int64_data_size(), "int64_data"};
    // ONNX keeps these two in uint64_data (uint8 and uint16 in int32_data).
    case DType::U32:
    case DType::U64: return {t.uint64_data_size(), "uint64_data"};
    // 16-bit floats as their bit patterns, the other integers and bools.
    default: return {t.int32_data_size(), "int32_data"};
  }
}

/// Copies typed field values into `out` (of `field.size()` elements, checked
/// by the caller), converting each with `store`.
template <typename Field, typename Store>
void copyTyped(const Field& field, Store store) {
  for (int i = 0; i < field.size(); ++i) store(i, field.Get(i));
}

/// A TensorProto as a DenseTensor.
Expected<DenseTensor> tensorFromProto(const onnx::TensorProto& t, const std::string& what, const std::string& baseDir) {
  if (t.data_type() == onnx::TensorProto::STRING) return Error(what + " holds strings, which Kiln does not support");
  auto dtype = requireDType(t.data_type(), what);
  if (!dtype) return dtype.takeError();
  auto shape = tensorShape(t, what);
  if (!shape) return shape.takeError();
  const int64_t count = numElements(*shape);
  const size_t elementSize = dtypeSize(*dtype);
  if (count > kMaxExternalBytes / static_cast<int64_t>(elementSize))
    return Error(what + ": " + std::to_string(count) + " elements exceed the 4 GiB limit of one tensor");
  const size_t bytes = static_cast<size_t>(count) * elementSize;
  TensorType type{*dtype, std::move(*shape)};

  if (t.has_data_location() && t.data_location() == onnx::TensorProto::EXTERNAL) {
    auto data = readExternalData(t, bytes, baseDir, what);
    if (!data) return data.takeError();
    return DenseTensor{std::move(type), std::move(*data)};
  }
  if (t.has_raw_data()) {
    if (t.raw_data().size() != bytes)
      return Error(what + ": raw_data has " + std::to_string(t.raw_data().size()) + " bytes, but " + type.str() +
                   " needs " + std::to_string(bytes));
    try {
      return DenseTensor{type, std::vector<uint8_t>(t.raw_data().begin(), t.raw_data().end())};
    } catch (const std::bad_alloc&) {
      return allocationError(bytes, what, type);
    }
  }
  // Checked before allocating, so that a shape with no values behind it
  // costs an error, not its size in memory.
  if (auto [size, field] = typedField(t, *dtype); size != count)
    return Error(what + ": " + field + " has " + std::to_string(size) + " values, but the shape " +
                 shapeStr(type.shape) + " needs " + std::to_string(count));
  DenseTensor out;
  try {
    out = DenseTensor::zeros(type);
  } catch (const std::bad_alloc&) {
    return allocationError(bytes, what, type);
  }
  if (count == 0) return out;
  auto storeBits16 = [&](int64_t i, int32_t v) {
    const auto bits = static_cast<uint16_t>(v);
    std::memcpy(out.bytes.data() + i * 2, &bits, 2);
  };
  switch (*dtype) {
    case DType::F32:
      copyTyped(t.float_data(), [&](int64_t i, float v) { std::memcpy(out.bytes.data() + i * 4, &v, 4); });
      break;
    case DType::F64:
      copyTyped(t.double_data(), [&](int64_t i, double v) { std::memcpy(out.bytes.data() + i * 8, &v, 8); });
      break;
    case DType::F16:
    case DType::BF16:
      copyTyped(t.int32_data(), storeBits16);
      break;
    case DType::I64:
      copyTyped(t.int64_data(), [&](int64_t i, int64_t v) { out.setInt(i, v); });
      break;
    case DType::U32:
    case DType::U64:
      copyTyped(t.uint64_data(), [&](int64_t i, uint64_t v) { out.setInt(i, static_cast<int64_t>(v)); });
      break;
    default:
      copyTyped(t.int32_data(), [&](int64_t i, int32_t v) { out.setInt(i, v); });
      break;
  }
  return out;
}

/// A graph input or output type as a Kiln tensor type.
Expected<TensorType> typeFromValueInfo(const onnx::ValueInfoProto& info, const std::string& what) {
  if (!info.has_type()) return Error(what + " has no type");
  const onnx::TypeProto& type = info.type();
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType: break;
    case onnx::TypeProto::kSequenceType: return Error(what + " is a sequence; Kiln supports tensors only");
    case onnx::TypeProto::kMapType: return Error(what + " is a map; Kiln supports tensors only");
    case onnx::TypeProto::kOptionalType: return Error(what + " is an optional; Kiln supports tensors only");
    case onnx::TypeProto::kSparseTensorType:
      return Error(what + " is a sparse tensor; Kiln supports dense tensors only");
    default: return Error(what + " has no type");
  }
  const auto& tensor = type.tensor_type();
  if (tensor.elem_type() == onnx::TensorProto::STRING)
    return Error(what + " holds strings, which Kiln does not support");
  auto dtype = requireDType(tensor.elem_type(), what);
  if (!dtype) return dtype.takeError();
  if (!tensor.has_shape()) return Error(what + " has no shape (Kiln needs every tensor's rank)");
  TensorType result{*dtype, {}};
  for (int i = 0; i < tensor.shape().dim_size(); ++i) {
    const auto& dim = tensor.shape().dim(i);
    if (dim.has_dim_value()) {
      if (dim.dim_value() < 0 || dim.dim_value() > kMaxDim)
        return Error(what + ": dim " + std::to_string(i) + " is " + std::to_string(dim.dim_value()) +
                     " (expected 0 to 2^40)");
      result.shape.push_back(Dim::fixed(dim.dim_value()));
    } else if (dim.has_dim_param() && !dim.dim_param().empty()) {
      result.shape.push_back(Dim::symbolic(dim.dim_param()));
    } else {
      result.shape.push_back(Dim::unknown());
    }
  }
  return result;
}

std::string normalizeDomain(std::string_view domain) {
  return domain == "ai.onnx" ? std::string() : std::string(domain);
}

std::string nodeLabel(const onnx::NodeProto& node, size_t index) {
  return node.name().empty() ? "#" + std::to_string(index) : node.name();
}

/// The opset version a model declares per domain ("" for ai.onnx).
using OpsetMap = std::map<std::string, int64_t, std::less<>>;

Expected<OpsetMap> readOpsets(const onnx::ModelProto& model) {
  OpsetMap opsets;
  for (const auto& entry : model.opset_import()) {
    if (entry.version() < 1)
      return Error("opset import of domain '" + entry.domain() + "' has version " + std::to_string(entry.version()) +
                   " (expected 1 or more)");
    int64_t& v = opsets[normalizeDomain(entry.domain())];
    v = std::max(v, entry.version());
  }
  // Models of IR version 1 and 2 predate opset_import and mean opset 1.
  if (model.opset_import_size() == 0) opsets[""] = 1;
  return opsets;
}

/// The largest depth of nested subgraphs the importer follows.
constexpr int kMaxSubgraphDepth = 32;

/// Calls `visit` on every subgraph attribute of `node`.
template <typename Visit>
void forEachSubgraph(const onnx::NodeProto& node, Visit&& visit) {
  for (const auto& a : node.attribute()) {
    if (a.has_g()) visit(a.g());
    for (const auto& g : a.graphs()) visit(g);
  }
}

void collectUnsupportedInto(const onnx::GraphProto& graph, const OpsetMap& opsets, std::vector<UnsupportedOnnxOp>& result,
                            std::map<std::pair<std::string, std::string>, size_t>& index, int depth) {
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    if (depth < kMaxSubgraphDepth)
      forEachSubgraph(node, [&](const onnx::GraphProto& g) { collectUnsupportedInto(g, opsets, result, index, depth + 1); });
    const std::string domain = normalizeDomain(node.domain());
    auto it = opsets.find(domain);
    const int64_t opset = it == opsets.end() ? 0 : it->second;
    if (opset > 0 && onnx_import::findConverter(domain, node.op_type(), opset)) continue;
    auto [pos, inserted] = index.emplace(std::make_pair(domain, node.op_type()), result.size());
    if (inserted) result.push_back({domain, node.op_type(), opset, {}});
    result[pos->second].nodes.push_back(nodeLabel(node, static_cast<size_t>(i)));
  }
}

/// The unsupported ops of a graph and its subgraphs, in order of first use.
std::vector<UnsupportedOnnxOp> collectUnsupported(const onnx::GraphProto& graph, const OpsetMap& opsets) {
  std::vector<UnsupportedOnnxOp> result;
  std::map<std::pair<std::string, std::string>, size_t> index;
  collectUnsupportedInto(graph, opsets, result, index, 0);
  return result;
}

/// The names the nodes of `graph` (and of their subgraphs) read but do not
/// define: the values a subgraph takes from the scopes around it.
void collectFreeNames(const onnx::GraphProto& graph, std::set<std::string>& out, int depth) {
  std::set<std::string> defined;
  for (const auto& input : graph.input()) defined.insert(input.name());
  for (const auto& init : graph.initializer()) defined.insert(init.name());
  for (const auto& node : graph.node())
    for (const std::string& o : node.output()) defined.insert(o);
  std::set<std::string> read;
  for (const auto& node : graph.node()) {
    for (const std::string& in : node.input())
      if (!in.empty()) read.insert(in);
    if (depth < kMaxSubgraphDepth)
      forEachSubgraph(node, [&](const onnx::GraphProto& g) { collectFreeNames(g, read, depth + 1); });
  }
  for (const auto& o : graph.output()) read.insert(o.name());
  for (const std::string& name : read)
    if (!defined.count(name)) out.insert(name);
}

std::string describeUnsupported(const std::vector<UnsupportedOnnxOp>& ops) {
  size_t nodes = 0;
  for (const auto& op : ops) nodes += op.nodes.size();
  std::string message = std::to_string(ops.size()) + " unsupported ONNX op" + (ops.size() == 1 ? "" : "s") + " (" +
                        std::to_string(nodes) + " node" + (nodes == 1 ? "" : "s") + "):";
  for (const auto& op : ops) {
    message += "\n  " + (op.domain.empty() ? std::string() : op.domain + ".") + op.opType;
    message += op.opset > 0 ? " (opset " + std::to_string(op.opset) + ")"
                            : " (domain '" + op.domain + "' is not imported by the model)";
    message += ": " + std::to_string(op.nodes.size()) + " node" + (op.nodes.size() == 1 ? "" : "s") + ": ";
    for (size_t i = 0; i < op.nodes.size() && i < 10; ++i) message += (i ? ", " : "") + op.nodes[i];
    if (op.nodes.size() > 10) message += ", ...";
  }
  return message;
}

Expected<onnx::ModelProto> parseModel(std::string_view bytes, std::string_view filename) {
  if (static_cast<int64_t>(bytes.size()) > kMaxModelBytes)
    return Error(std::string(filename) + ": " + std::to_string(bytes.size()) +
                 " bytes is more than a protobuf message can hold (2 GiB); keep weights in external data");
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Error(std::string(filename) + ": not a valid ONNX model (the protobuf is truncated or malformed)");
  if (!model.has_graph()) return Error(std::string(filename) + ": the ONNX model has no graph");
  return model;
}

class Importer;

/// The NodeContext of one node being converted.
class NodeContextImpl final : public NodeContext {
 public:
  NodeContextImpl(Importer& importer, const onnx::NodeProto& node, size_t index, int64_t opset)
      : importer_(importer), node_(node), index_(index), opset_(opset) {}

  const onnx::NodeProto& node() const override { return node_; }
  int64_t opset() const override { return opset_; }
  size_t numInputs() const override { return static_cast<size_t>(node_.input_size()); }
  bool hasInput(size_t i) const override { return i < numInputs() && !node_.input(static_cast<int>(i)).empty(); }
  Expected<Value*> input(size_t i) override;
  const DenseTensor* constantInput(size_t i) override;
  size_t numOutputs() const override { return static_cast<size_t>(node_.output_size()); }
  bool hasOutput(size_t i) const override { return i < numOutputs() && !node_.output(static_cast<int>(i)).empty(); }
  void setOutput(size_t i, Value* v) override;
  Expected<std::vector<Value*>> sequenceInput(size_t i) override;
  Expected<ImportValue> anyInput(size_t i) override;
  void setSequenceOutput(size_t i, std::vector<Value*> elements) override;
  void setAnyOutput(size_t i, ImportValue value) override;

  const onnx::AttributeProto* attribute(std::string_view name) const override {
    for (const auto& a : node_.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  Expected<int64_t> intAttr(std::string_view name, int64_t dflt) const override {
    const auto* a = attribute(name);
    if (!a) return dflt;
    KILN_TRY(expectKind(*a, onnx::AttributeProto::INT, a->has_i()));
    return a->i();
  }
  Expected<double> floatAttr(std::string_view name, double dflt) const override {
    const auto* a = attribute(name);
    if (!a) return dflt;
    KILN_TRY(expectKind(*a, onnx::AttributeProto::FLOAT, a->has_f()));
    return static_cast<double>(a->f());
  }
  Expected<std::string> stringAttr(std::string_view name, std::string dflt) const override {
    const auto* a = attribute(name);
    if (!a) return dflt;
    KILN_TRY(expectKind(*a, onnx::AttributeProto::STRING, a->has_s()));
    return a->s();
  }
  Expected<std::vector<int64_t>> intsAttr(std::string_view name, std::vector<int64_t> dflt) const override {
    const auto* a = attribute(name);
    if (!a) return dflt;
    KILN_TRY(expectKind(*a, onnx::AttributeProto::INTS, a->ints_size() > 0));
    return std::vector<int64_t>(a->ints().begin(), a->ints().end());
  }
  Expected<std::vector<double>> floatsAttr(std::string_view name, std::vector<double> dflt) const override {
    const auto* a = attribute(name);
    if (!a) return dflt;
    KILN_TRY(expectKind(*a, onnx::AttributeProto::FLOATS, a->floats_size() > 0));
    return std::vector<double>(a->floats().begin(), a->floats().end());
  }
  Expected<DenseTensor> tensorAttr(std::string_view name) const override;

  Expected<Value*> emit(OpKind kind, std::vector<Value*> operands, AttrMap attrs,
                        std::vector<TensorType> declared) override {
    auto results = emitMulti(kind, std::move(operands), std::move(attrs), std::move(declared));
    if (!results) return results.takeError();
    if (results->size() != 1)
      return error("internal: emit() of '" + std::string(opName(kind)) + "' with " + std::to_string(results->size()) +
                   " results");
    return (*results)[0];
  }
  Expected<std::vector<Value*>> emitMulti(OpKind kind, std::vector<Value*> operands, AttrMap attrs,
                                          std::vector<TensorType> declared) override;
  Value* constant(DenseTensor value) override;
  Value* scalar(DType dtype, double value) override;
  Expected<onnx_import::ImportedBody> importBody(std::string_view attrName, std::span<const TensorType> formalTypes,
                                                 std::span<Value* const> sharedCaptures) override;
  Builder& builder() override;
  Expected<std::vector<ImportValue>> inlineBody(std::string_view attrName, std::span<const ImportValue> inputs,
                                                const std::string& nameSuffix) override;
  Value* tensorNamed(const std::string& name) override;
  Expected<std::vector<Value*>> gradients(Value* y, std::span<Value* const> xs, std::span<Value* const> zs) override;

  Error error(const std::string& message) const override {
    return Error("node '" + nodeLabel(node_, index_) + "' (" + opTypeLabel() + ", opset " + std::to_string(opset_) +
                 "): " + message);
  }

 private:
  std::string opTypeLabel() const {
    const std::string domain = normalizeDomain(node_.domain());
    return (domain.empty() ? "" : domain + ".") + node_.op_type();
  }
  Status expectKind(const onnx::AttributeProto& a, onnx::AttributeProto::AttributeType want, bool hasField) const {
    // IR version 1 attributes may lack the type discriminator.
    if (a.type() == want || (a.type() == onnx::AttributeProto::UNDEFINED && hasField)) return {};
    auto name = [](int t) {
      return onnx::AttributeProto::AttributeType_IsValid(t)
                 ? onnx::AttributeProto::AttributeType_Name(static_cast<onnx::AttributeProto::AttributeType>(t))
                 : "type " + std::to_string(t);
    };
    return error("attribute '" + a.name() + "' is " + name(a.type()) + ", expected " + name(want));
  }

  Importer& importer_;
  const onnx::NodeProto& node_;
  size_t index_;
  int64_t opset_;
  int64_t emitted_ = 0;  // ops this node has built so far, against kMaxOpsPerNode
};

/// Imports one ModelProto into a Module.
class Importer {
 public:
  Importer(const onnx::ModelProto& model, std::string filename, std::string baseDir, const LoadOptions& options,
           const std::map<std::string, DenseTensor>& frozenInputs, std::vector<GraphOutputForm>* outputForms)
      : model_(model),
        filename_(std::move(filename)),
        baseDir_(std::move(baseDir)),
        options_(options),
        frozen_(frozenInputs),
        outputForms_(outputForms) {}

  Expected<std::unique_ptr<Module>> run();

 private:
  friend class NodeContextImpl;

  /// The graph being imported (the model's, or a subgraph) and the function
  /// it becomes, with the values its names are bound to. A subgraph's scope
  /// has the enclosing one as its parent and records the outer values its
  /// body captured, one per trailing argument.
  struct Scope {
    Function* f = nullptr;
    std::optional<Builder> builder;
    std::unordered_map<std::string, Value*> values;
    /// Names bound to sequences and optionals (ImportValue, never of kind
    /// Tensor): the import-time lists and presence of this scope's values.
    /// A subgraph inlined here reads them; one that becomes a region cannot.
    std::unordered_map<std::string, ImportValue> structured;
    Scope* parent = nullptr;
    int depth = 0;
    /// A subgraph inlined into its parent's function (an unrolled loop's
    /// iteration): outer values are used as they are, and the names it binds
    /// get `nameSuffix` so that each copy's are distinct.
    bool inlined = false;
    std::string nameSuffix;
    std::vector<Value*> captures;
    std::unordered_map<Value*, Value*> captured;  // outer value -> its value in this scope
  };

  Status importInitializers();
  Status importInputs();
  Expected<std::vector<size_t>> topologicalOrder(const onnx::GraphProto& graph);
  Status convertNode(const onnx::NodeProto& node, size_t index);
  Status importOutputs();
  void removeUnusedConstants(Function& f);
  Status convertGraphNodes(const onnx::GraphProto& graph);
  Expected<onnx_import::ImportedBody> importBody(const onnx::GraphProto& graph, std::span<const TensorType> formalTypes,
                                                 std::span<Value* const> sharedCaptures, const std::string& what);
  Expected<std::vector<ImportValue>> inlineSubgraph(const onnx::GraphProto& graph, std::span<const ImportValue> inputs,
                                                    const std::string& nameSuffix, const std::string& what);
  /// Converts the initializers, nodes and outputs of a subgraph in the
  /// current scope; returns the values of its outputs.
  Expected<std::vector<ImportValue>> convertSubgraph(const onnx::GraphProto& graph, const std::string& what);
  /// A sequence or optional graph input as the arguments of its form
  /// (LoadOptions::inputForms).
  Status importStructuredInput(const onnx::ValueInfoProto& input, const std::string& what);

  Function& f() const { return *scope_->f; }
  Builder& builder() const { return *scope_->builder; }
  /// The value `name` is bound to in `scope`, captured from the scopes
  /// around it where it is defined there; null when no scope defines it.
  Value* lookup(Scope& scope, const std::string& name);
  Value* lookup(const std::string& name) { return lookup(*scope_, name); }
  /// True when `name` is bound in the current scope or one around it.
  bool isDefined(const std::string& name) const {
    for (const Scope* s = scope_; s; s = s->parent)
      if (s->values.count(name) || s->structured.count(name)) return true;
    return false;
  }
  /// The sequence or optional `name` is bound to in this scope, or in the
  /// scopes around it that this one is inlined into; else null.
  const ImportValue* findStructured(const std::string& name) const {
    for (const Scope* s = scope_; s; s = s->parent) {
      if (auto it = s->structured.find(name); it != s->structured.end()) return &it->second;
      if (!s->inlined) break;
    }
    return nullptr;
  }
  /// Where `name` is bound to a sequence or optional: "" when it is not,
  /// else a phrase for the error of reading it as a tensor.
  std::string sequenceBinding(const std::string& name) const {
    if (const ImportValue* v = findStructured(name)) return std::string(valueKindName(v->kind));
    for (const Scope* s = scope_->parent; s; s = s->parent)
      if (auto it = s->structured.find(name); it != s->structured.end())
        return std::string(valueKindName(it->second.kind)) + " of an enclosing graph";
    return "";
  }

  /// Names `v` after the ONNX tensor `name` and binds the name to it.
  void bind(const std::string& name, Value* v) {
    if (!onnxNamed_.count(v)) {
      v->setName(name + scope_->nameSuffix);
      onnxNamed_.insert(v);
    }
    scope_->values[name] = v;
  }
  Value* addConstant(DenseTensor t, Location loc) {
    builder().setLocation(std::move(loc));
    return builder().constant(std::move(t));
  }

  const onnx::ModelProto& model_;
  std::string filename_;
  std::string baseDir_;
  const LoadOptions& options_;
  const std::map<std::string, DenseTensor>& frozen_;
  std::vector<GraphOutputForm>* outputForms_;
  OpsetMap opsets_;
  std::unique_ptr<Module> module_;
  Scope root_;
  Scope* scope_ = &root_;
  std::unordered_set<const Value*> onnxNamed_;
  std::map<std::string, std::shared_ptr<DenseTensor>> initializers_;
  std::set<std::string> graphInputs_;
};

Expected<Value*> NodeContextImpl::input(size_t i) {
  if (!hasInput(i)) return error("input " + std::to_string(i) + " is required but absent");
  const std::string& name = node_.input(static_cast<int>(i));
  Value* v = importer_.lookup(name);
  if (!v) {
    const std::string sequence = importer_.sequenceBinding(name);
    if (!sequence.empty())
      return error("input " + std::to_string(i) + " " + inQuotes(name) + " is " + sequence +
                   ", expected a tensor (Kiln resolves sequences and optionals at import: only the Sequence and "
                   "Optional ops, SplitToSequence, ConcatFromSequence, SequenceMap, Identity, and an If or Loop "
                   "resolved at import can read one)");
    return error("input " + std::to_string(i) + " " + inQuotes(name) +
                 " is not defined by any node, initializer or graph input");
  }
  return v;
}

Expected<std::vector<Value*>> NodeContextImpl::sequenceInput(size_t i) {
  if (!hasInput(i)) return error("input " + std::to_string(i) + " is required but absent");
  const std::string& name = node_.input(static_cast<int>(i));
  const std::string what = "input " + std::to_string(i) + " " + inQuotes(name);
  if (const ImportValue* v = importer_.findStructured(name)) {
    if (v->kind == ValueKind::Sequence) return v->elements;
    return error(what + " is " + std::string(valueKindName(v->kind)) +
                 ", expected a sequence (OptionalGetElement takes a sequence out of an optional)");
  }
  if (!importer_.sequenceBinding(name).empty())
    return error(what + " is " + importer_.sequenceBinding(name) +
                 "; Kiln resolves sequences at import and cannot pass one into an If, Loop or Scan body that is not "
                 "resolved at import (an If with a condition, a Loop with a trip count known at import)");
  if (importer_.isDefined(name)) return error(what + " is a tensor, expected a sequence");
  return error(what + " is not defined by any node, initializer or graph input");
}

Expected<ImportValue> NodeContextImpl::anyInput(size_t i) {
  if (!hasInput(i)) return error("input " + std::to_string(i) + " is required but absent");
  if (const ImportValue* v = importer_.findStructured(node_.input(static_cast<int>(i)))) return *v;
  auto tensor = input(i);
  if (!tensor) return tensor.takeError();
  return ImportValue::ofTensor(*tensor);
}

void NodeContextImpl::setSequenceOutput(size_t i, std::vector<Value*> elements) {
  setAnyOutput(i, ImportValue::ofSequence(std::move(elements)));
}

void NodeContextImpl::setAnyOutput(size_t i, ImportValue value) {
  if (!hasOutput(i)) return;
  if (value.kind == ValueKind::Tensor) {
    setOutput(i, value.tensor);
    return;
  }
  importer_.scope_->structured[node_.output(static_cast<int>(i))] = std::move(value);
}

const DenseTensor* NodeContextImpl::constantInput(size_t i) {
  if (!hasInput(i)) return nullptr;
  Value* v = importer_.lookup(node_.input(static_cast<int>(i)));
  if (!v) return nullptr;
  const Op* def = v->definingOp();
  if (!def || def->kind() != OpKind::Constant) return nullptr;
  return &def->getTensor("value");
}

void NodeContextImpl::setOutput(size_t i, Value* v) {
  if (!hasOutput(i) || !v) return;
  importer_.bind(node_.output(static_cast<int>(i)), v);
}

Expected<DenseTensor> NodeContextImpl::tensorAttr(std::string_view name) const {
  const auto* a = attribute(name);
  if (!a) return error("attribute '" + std::string(name) + "' is required but absent");
  KILN_TRY(expectKind(*a, onnx::AttributeProto::TENSOR, a->has_t()));
  auto t = tensorFromProto(a->t(), "attribute '" + std::string(name) + "'", importer_.baseDir_);
  if (!t) return error(t.error().message());
  return t;
}

Value* NodeContextImpl::constant(DenseTensor value) {
  return importer_.addConstant(std::move(value), Location::named(nodeLabel(node_, index_), importer_.filename_));
}

Value* NodeContextImpl::scalar(DType dtype, double value) {
  DenseTensor t = DenseTensor::zeros(TensorType{dtype, {}});
  t.setDouble(0, value);
  return constant(std::move(t));
}

Expected<std::vector<Value*>> NodeContextImpl::emitMulti(OpKind kind, std::vector<Value*> operands, AttrMap attrs,
                                                         std::vector<TensorType> declared) {
  // Shape rules assume the arity and attribute kinds are right (the
  // verifier checks them for parsed IR); a converter's mistake must become
  // an error here, not an out-of-range access there.
  const OpInfo& info = opInfo(kind);
  const int count = static_cast<int>(operands.size());
  if (count < info.minOperands || (info.maxOperands >= 0 && count > info.maxOperands))
    return error("internal: '" + std::string(info.mnemonic) + "' built with " + std::to_string(count) + " operands");
  for (Value* v : operands)
    if (!v) return error("internal: '" + std::string(info.mnemonic) + "' built with a null operand");
  for (const auto& [name, value] : attrs) {
    const AttrSpec* spec = info.findAttr(name);
    if (!spec || spec->kind != value.kind())
      return error("internal: bad attribute '" + name + "' for '" + std::string(info.mnemonic) + "'");
  }
  for (const AttrSpec& spec : info.attrs)
    if (spec.required && !attrs.count(std::string(spec.name)))
      return error("internal: '" + std::string(info.mnemonic) + "' needs attribute '" + std::string(spec.name) + "'");

  // A converter that unrolls or expands (recurrences, windows, resizes) is
  // bounded by what the node asks for; a malformed node must not make it
  // build ops without end.
  if (++emitted_ > kMaxOpsPerNode)
    return error("expands to more than " + std::to_string(kMaxOpsPerNode) +
                 " Kiln ops; its attributes or input shapes are too large to import");
  Builder& b = importer_.builder();
  b.setLocation(Location::named(nodeLabel(node_, index_), importer_.filename_));
  auto built = b.build(kind, operands, std::move(attrs), std::move(declared));
  if (!built) return error(built.error().message());
  Op* op = *built;

  // Import-time constant folding: shape computations (Shape -> Gather ->
  // Concat -> Reshape) must become constants because Kiln takes shapes as
  // attributes and declared types.
  const OpEvaluator* evaluator = importer_.options_.evaluator;
  // A dequantize of constant weights stays: `fold-qdq` reads the integer
  // weights through it (canonicalize folds those it leaves).
  bool foldable = evaluator && !info.hasSideEffects() && kind != OpKind::Constant && kind != OpKind::Dequantize;
  std::vector<const DenseTensor*> constants;
  for (Value* v : operands) {
    if (!foldable) break;
    const Op* def = v->definingOp();
    if (!def || def->kind() != OpKind::Constant) {
      foldable = false;
      break;
    }
    constants.push_back(&def->getTensor("value"));
  }
  // Bound the work too: a contraction of large constants may have a small
  // result but cost far more than an import should.
  int64_t operandElements = 0;
  for (const DenseTensor* t : constants) operandElements += t->numElements();
  if (operandElements > kMaxFoldedOperandElements) foldable = false;
  if (foldable && foldWork(*op, constants) > kMaxFoldedWork) foldable = false;
  for (size_t r = 0; foldable && r < op->numResults(); ++r) {
    const TensorType& t = op->result(r)->type();
    // Overflow-safe: a shape of 2^80 elements must not count as small.
    if (t.isStatic() && tensorByteSize(t).value_or(UINT64_MAX) / dtypeSize(t.dtype) > uint64_t{kMaxFoldedElements})
      foldable = false;
  }
  if (!foldable) return op->results();

  auto folded = evaluator->evaluate(*op, constants);
  if (!folded) return error("evaluating on constants: " + folded.error().message());
  if (folded->size() != op->numResults()) return error("internal: the evaluator gave the wrong number of results");
  for (const DenseTensor& t : *folded)
    if (t.numElements() > kMaxFoldedElements) return op->results();
  std::vector<Value*> results;
  for (DenseTensor& t : *folded) results.push_back(b.constant(std::move(t)));
  importer_.f().erase(op);
  return results;
}

Status Importer::importInitializers() {
  const onnx::GraphProto& graph = model_.graph();
  for (int i = 0; i < graph.initializer_size(); ++i) {
    const onnx::TensorProto& t = graph.initializer(i);
    const std::string what = "initializer " + std::to_string(i) + " " + inQuotes(t.name());
    if (t.name().empty()) return Error("initializer " + std::to_string(i) + " has no name");
    auto dense = tensorFromProto(t, what, baseDir_);
    if (!dense) return dense.takeError();
    if (!initializers_.emplace(t.name(), std::make_shared<DenseTensor>(std::move(*dense))).second)
      return Error("initializer " + inQuotes(t.name()) + " is defined twice");
  }
  if (graph.sparse_initializer_size() > 0)
    return Error("sparse initializers are not supported (" + inQuotes(graph.sparse_initializer(0).values().name()) +
                 ")");
  return {};
}

Status Importer::importInputs() {
  const onnx::GraphProto& graph = model_.graph();
  for (int i = 0; i < graph.input_size(); ++i) {
    const onnx::ValueInfoProto& input = graph.input(i);
    const std::string what = "graph input " + std::to_string(i) + " " + inQuotes(input.name());
    if (input.name().empty()) return Error("graph input " + std::to_string(i) + " has no name");
    if (!graphInputs_.insert(input.name()).second) return Error(what + " is declared twice");
    auto init = initializers_.find(input.name());
    auto frozen = frozen_.find(input.name());
    if (frozen != frozen_.end()) {
      // Fixed at import time by the caller: a constant, not an argument.
      bind(input.name(), addConstant(frozen->second, Location::named(input.name(), filename_)));
      continue;
    }
    if (options_.freezeUnboundDefaults && init != initializers_.end() && !options_.inputShapes.count(input.name())) {
      // Not bound by the caller: its default, as a constant.
      bind(input.name(), addConstant(*init->second, Location::named(input.name(), filename_)));
      continue;
    }
    if (input.has_type() && (input.type().has_sequence_type() || input.type().has_optional_type())) {
      KILN_TRY(importStructuredInput(input, what));
      continue;
    }
    auto type = typeFromValueInfo(input, what);
    if (!type) {
      // An initializer gives the type of an input that does not declare one.
      if (init == initializers_.end()) return type.takeError();
      type = init->second->type;
    }
    if (auto shape = options_.inputShapes.find(input.name()); shape != options_.inputShapes.end()) {
      // Specialized to the tensor the caller will bind, where it fits.
      TensorType bound{type->dtype, staticShape(shape->second)};
      if (typesCompatible(bound, *type)) type = bound;
    }
    Value* arg = f().addArgument(*type, input.name());
    onnxNamed_.insert(arg);
    scope_->values[input.name()] = arg;
    if (init != initializers_.end()) {
      if (!typesCompatible(init->second->type, *type))
        return Error(what + " is declared " + type->str() + ", but its initializer is " + init->second->type.str());
      f().setArgumentDefault(f().numArguments() - 1, init->second);
    }
  }
  // Initializers that are not inputs are the model's weights: constants.
  for (auto& [name, tensor] : initializers_) {
    if (graphInputs_.count(name)) continue;
    bind(name, addConstant(std::move(*tensor), Location::named(name, filename_)));
    tensor.reset();
  }
  return {};
}

/// The tensor type a sequence or optional type declares for its tensors (an
/// optional's, a sequence's elements', an optional sequence's elements'); an
/// error for maps, sparse tensors, nested sequences and optionals of
/// optionals.
Expected<const onnx::TypeProto_Tensor*> structuredTensorType(const onnx::TypeProto& type, const std::string& what) {
  const onnx::TypeProto* inner = &type;
  if (inner->has_optional_type()) {
    if (!inner->optional_type().has_elem_type()) return Error(what + " is an optional with no element type");
    inner = &inner->optional_type().elem_type();
  }
  if (inner->has_sequence_type()) {
    if (!inner->sequence_type().has_elem_type()) return Error(what + " is a sequence with no element type");
    inner = &inner->sequence_type().elem_type();
  }
  if (!inner->has_tensor_type())
    return Error(what + " holds " +
                 (inner->has_sequence_type()   ? "sequences of sequences"
                  : inner->has_map_type()      ? "maps"
                  : inner->has_optional_type() ? "optionals"
                                               : "values other than tensors") +
                 "; Kiln's sequences and optionals hold tensors");
  return &inner->tensor_type();
}

Status Importer::importStructuredInput(const onnx::ValueInfoProto& input, const std::string& what) {
  const onnx::TypeProto& type = input.type();
  const bool optional = type.has_optional_type();
  const bool holdsSequence = optional ? type.optional_type().elem_type().has_sequence_type() : type.has_sequence_type();
  auto tensorType = structuredTensorType(type, what);
  if (!tensorType) return tensorType.takeError();
  auto form = options_.inputForms.find(input.name());
  if (form == options_.inputForms.end())
    return Error(what + " is " + (optional ? "an optional" : "a sequence") +
                 "; Kiln specializes such an input to the value it will take: give its form (LoadOptions::inputForms, "
                 "or loadModelForInputs with the value)");
  const ValueKind kind = form->second.kind;
  const std::vector<std::vector<int64_t>>& shapes = form->second.shapes;
  const bool fits = optional ? (kind == ValueKind::OptionalNone ||
                                kind == (holdsSequence ? ValueKind::OptionalSequence : ValueKind::OptionalTensor))
                             : kind == ValueKind::Sequence;
  if (!fits)
    return Error(
        what + " is declared " +
        (optional ? std::string("an optional ") + (holdsSequence ? "sequence" : "tensor") : std::string("a sequence")) +
        ", but is given " + std::string(valueKindName(kind)));
  const size_t expected = kind == ValueKind::OptionalNone ? 0 : kind == ValueKind::OptionalTensor ? 1 : shapes.size();
  if (shapes.size() != expected)
    return Error(what + " is given " + std::string(valueKindName(kind)) + " with " + std::to_string(shapes.size()) +
                 " shapes, expected " + std::to_string(expected));
  if ((*tensorType)->elem_type() == onnx::TensorProto::STRING)
    return Error(what + " holds strings, which Kiln does not support");
  auto dtype = requireDType((*tensorType)->elem_type(), what);
  if (!dtype) return dtype.takeError();
  ImportValue value;
  value.kind = kind;
  for (size_t i = 0; i < shapes.size(); ++i) {
    TensorType bound{*dtype, staticShape(shapes[i])};
    if ((*tensorType)->has_shape()) {
      // The declared element shape, where there is one, must admit it.
      onnx::ValueInfoProto element;
      *element.mutable_type()->mutable_tensor_type() = *(*tensorType);
      auto declared = typeFromValueInfo(element, what);
      if (!declared) return declared.takeError();
      if (!typesCompatible(bound, *declared))
        return Error(what + (kind == ValueKind::OptionalTensor ? std::string() : " element " + std::to_string(i)) +
                     " is given " + bound.str() + ", but is declared " + declared->str());
    }
    const std::string name = value.isSequence() ? elementName(input.name(), i) : input.name();
    if (graphInputs_.count(name) && name != input.name())
      return Error(what + ": its element " + std::to_string(i) + " would be argument " + inQuotes(name) +
                   ", the name of another graph input");
    Value* arg = f().addArgument(bound, name);
    onnxNamed_.insert(arg);
    if (value.isSequence())
      value.elements.push_back(arg);
    else
      value.tensor = arg;
  }
  scope_->structured[input.name()] = std::move(value);
  return {};
}

Expected<std::vector<size_t>> Importer::topologicalOrder(const onnx::GraphProto& graph) {
  const size_t n = static_cast<size_t>(graph.node_size());
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i) {
    const onnx::NodeProto& node = graph.node(static_cast<int>(i));
    for (const std::string& out : node.output()) {
      if (out.empty()) continue;
      if ((scope_ == &root_ && graphInputs_.count(out)) || scope_->values.count(out))
        return Error("node " + inQuotes(nodeLabel(node, i)) + " (" + node.op_type() + ") writes " + inQuotes(out) +
                     ", which is already a graph input or initializer");
      auto [it, inserted] = producer.emplace(out, i);
      if (!inserted)
        return Error("tensor " + inQuotes(out) + " is written by node " +
                     inQuotes(nodeLabel(graph.node(static_cast<int>(it->second)), it->second)) + " and by node " +
                     inQuotes(nodeLabel(node, i)));
    }
  }
  std::vector<std::vector<size_t>> users(n);
  std::vector<std::vector<size_t>> deps(n);
  std::vector<size_t> pending(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const onnx::NodeProto& node = graph.node(static_cast<int>(i));
    for (const std::string& in : node.input()) {
      if (in.empty() || scope_->values.count(in)) continue;
      auto it = producer.find(in);
      if (it == producer.end()) {
        if (isDefined(in)) continue;  // from a scope around this subgraph
        return Error("node " + inQuotes(nodeLabel(node, i)) + " (" + node.op_type() + ") reads " + inQuotes(in) +
                     ", which no node, initializer or graph input defines");
      }
      users[it->second].push_back(i);
      deps[i].push_back(it->second);
      ++pending[i];
    }
    // A node's subgraphs may read values of this graph, and ONNX's Gradient
    // names the tensor it differentiates in its attribute `y`: it comes
    // after their producers too.
    std::set<std::string> free;
    forEachSubgraph(node, [&](const onnx::GraphProto& g) { collectFreeNames(g, free, 1); });
    if (node.op_type() == "Gradient" && normalizeDomain(node.domain()) == "ai.onnx.preview.training")
      for (const auto& a : node.attribute())
        if (a.name() == "y") free.insert(a.s());
    for (const std::string& in : free) {
      auto it = producer.find(in);
      if (it == producer.end() || it->second == i) continue;
      users[it->second].push_back(i);
      deps[i].push_back(it->second);
      ++pending[i];
    }
  }
  // Kahn's algorithm, always taking the earliest ready node, so a sorted
  // graph keeps its order.
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push(i);
  std::vector<size_t> order;
  std::vector<bool> done(n, false);
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    done[i] = true;
    for (size_t u : users[i])
      if (--pending[u] == 0) ready.push(u);
  }
  if (order.size() == n) return order;
  // Walk unfinished dependencies from an unfinished node until one repeats:
  // that node is on a cycle.
  size_t at = 0;
  while (done[at]) ++at;
  std::vector<bool> seen(n, false);
  while (!seen[at]) {
    seen[at] = true;
    for (size_t d : deps[at])
      if (!done[d]) {
        at = d;
        break;
      }
  }
  const onnx::NodeProto& node = graph.node(static_cast<int>(at));
  return Error("the graph has a cycle through node " + inQuotes(nodeLabel(node, at)) + " (" + node.op_type() + ")");
}

Status Importer::convertNode(const onnx::NodeProto& node, size_t index) {
  const std::string domain = normalizeDomain(node.domain());
  const int64_t opset = opsets_.at(domain);  // checked by collectUnsupported
  const onnx_import::OpConverter* converter = onnx_import::findConverter(domain, node.op_type(), opset);
  NodeContextImpl ctx(*this, node, index, opset);
  if (!converter) return ctx.error("no converter");  // unreachable after the unsupported-op check
  for (const auto& a : node.attribute())
    if (!a.ref_attr_name().empty()) return ctx.error("attribute '" + a.name() + "' refers to a function attribute");
  KILN_TRY(converter->convert(ctx));
  for (size_t i = 0; i < ctx.numOutputs(); ++i)
    if (ctx.hasOutput(i) && !scope_->values.count(node.output(static_cast<int>(i))) &&
        !scope_->structured.count(node.output(static_cast<int>(i))))
      return ctx.error("output " + std::to_string(i) + " " + inQuotes(node.output(static_cast<int>(i))) +
                       " is not supported by the converter");
  return {};
}

Status Importer::importOutputs() {
  const onnx::GraphProto& graph = model_.graph();
  std::vector<Value*> results;
  std::vector<std::string> names;
  std::vector<GraphOutputForm> forms;
  std::set<std::string> seen;
  for (int i = 0; i < graph.output_size(); ++i) {
    const onnx::ValueInfoProto& output = graph.output(i);
    const std::string what = "graph output " + std::to_string(i) + " " + inQuotes(output.name());
    if (output.has_type() && output.type().value_case() != onnx::TypeProto::kTensorType &&
        output.type().value_case() != onnx::TypeProto::kSequenceType &&
        output.type().value_case() != onnx::TypeProto::kOptionalType &&
        output.type().value_case() != onnx::TypeProto::VALUE_NOT_SET) {
      auto type = typeFromValueInfo(output, what);  // names the kind
      if (!type) return type.takeError();
    }
    if (!seen.insert(output.name()).second) return Error(what + " is declared twice");
    ImportValue value;
    if (const ImportValue* structured = findStructured(output.name())) {
      value = *structured;
    } else {
      auto it = scope_->values.find(output.name());
      if (it == scope_->values.end()) return Error(what + " is not produced by any node, initializer or graph input");
      value = ImportValue::ofTensor(it->second);
    }
    // The declared kind decides what the caller reads: a value given where
    // an optional is declared is a present optional, and a present optional
    // where its contents are declared is those.
    const bool declaresOptional = output.has_type() && output.type().has_optional_type();
    const bool declaresSequence = output.has_type() && output.type().has_sequence_type();
    const bool declaresTensor = output.has_type() && output.type().has_tensor_type();
    if (declaresOptional) value = value.wrapped();
    if ((declaresSequence || declaresTensor) && value.isOptional()) {
      if (value.kind == ValueKind::OptionalNone)
        return Error(what + " is declared " + (declaresSequence ? "a sequence" : "a tensor") +
                     ", but the graph gives an absent optional");
      value = value.contents();
    }
    if (declaresSequence && !value.isSequence())
      return Error(what + " is declared a sequence, but the graph computes " + std::string(valueKindName(value.kind)));
    if (declaresTensor && value.kind != ValueKind::Tensor)
      return Error(what + " is declared a tensor, but the graph computes " + std::string(valueKindName(value.kind)));
    if (output.has_type() && output.type().value_case() != onnx::TypeProto::VALUE_NOT_SET) {
      const onnx::TypeProto_Tensor* tensorType = nullptr;
      if (declaresTensor) {
        tensorType = &output.type().tensor_type();
      } else {
        auto inner = structuredTensorType(output.type(), what);
        if (!inner) return inner.takeError();
        tensorType = *inner;
      }
      if (tensorType->elem_type() != 0)
        if (auto dtype = onnx_import::dtypeFromOnnx(tensorType->elem_type()))
          for (Value* v : value.tensors())
            if (*dtype != v->type().dtype)
              return Error(what + " is declared " + std::string(dtypeName(*dtype)) + ", but the graph computes " +
                           v->type().str());
    }
    const std::vector<Value*> tensors = value.tensors();
    GraphOutputForm form{output.name(), value.kind, results.size(), tensors.size()};
    for (size_t k = 0; k < tensors.size(); ++k) {
      results.push_back(tensors[k]);
      names.push_back(value.isSequence() ? elementName(output.name(), k) : output.name());
    }
    forms.push_back(std::move(form));
  }
  builder().setLocation(Location::named("return", filename_));
  builder().ret(results);
  for (size_t i = 0; i < names.size(); ++i) f().setResultName(i, names[i]);
  if (outputForms_) *outputForms_ = std::move(forms);
  return {};
}

void Importer::removeUnusedConstants(Function& f) {
  // Folding leaves the constants it consumed behind, and models often carry
  // initializers no node reads.
  std::vector<Op*> dead;
  for (const auto& op : f.ops())
    if (op->kind() == OpKind::Constant && !op->hasUses()) dead.push_back(op.get());
  for (Op* op : dead) f.erase(op);
}

Status Importer::convertGraphNodes(const onnx::GraphProto& graph) {
  auto order = topologicalOrder(graph);
  if (!order) return order.takeError();
  for (size_t i : *order) KILN_TRY(convertNode(graph.node(static_cast<int>(i)), i));
  return {};
}

Value* Importer::lookup(Scope& scope, const std::string& name) {
  if (auto it = scope.values.find(name); it != scope.values.end()) return it->second;
  if (!scope.parent) return nullptr;
  Value* outer = lookup(*scope.parent, name);
  if (!outer) return nullptr;
  if (scope.inlined) return scope.values[name] = outer;
  if (auto it = scope.captured.find(outer); it != scope.captured.end()) return it->second;
  Value* local;
  const Op* def = outer->definingOp();
  if (def && def->kind() == OpKind::Constant && def->getTensor("value").numElements() <= kMaxFoldedElements) {
    // A copy of a small constant, so that what the body computes from it
    // folds (shapes, axes and indices Kiln takes as attributes).
    Builder& b = *scope.builder;
    b.setLocation(def->loc());
    local = b.constant(def->getTensor("value"));
  } else {
    local = scope.f->addArgument(outer->type(), scope.values.count(outer->name()) ? std::string() : outer->name());
    scope.captures.push_back(outer);
  }
  scope.captured[outer] = local;
  scope.values[name] = local;
  return local;
}

Expected<onnx_import::ImportedBody> Importer::importBody(const onnx::GraphProto& graph,
                                                         std::span<const TensorType> formalTypes,
                                                         std::span<Value* const> sharedCaptures,
                                                         const std::string& what) {
  if (scope_->depth + 1 > kMaxSubgraphDepth)
    return Error(what + " nests subgraphs more than " + std::to_string(kMaxSubgraphDepth) + " deep");
  if (static_cast<size_t>(graph.input_size()) != formalTypes.size())
    return Error(what + " has " + std::to_string(graph.input_size()) + " inputs, expected " +
                 std::to_string(formalTypes.size()));
  if (graph.sparse_initializer_size() > 0) return Error(what + " has sparse initializers, which are not supported");
  auto body = std::make_unique<Function>("");
  body->setLoc(Location::named(graph.name(), filename_));
  Scope scope;
  scope.f = body.get();
  scope.builder.emplace(*body);
  scope.parent = scope_;
  scope.depth = scope_->depth + 1;
  std::set<std::string> names;
  for (int i = 0; i < graph.input_size(); ++i) {
    const std::string& name = graph.input(i).name();
    if (name.empty() || !names.insert(name).second)
      return Error(what + ": input " + std::to_string(i) + " has no name or the name of another input");
    Value* arg = body->addArgument(formalTypes[static_cast<size_t>(i)], name);
    onnxNamed_.insert(arg);
    scope.values[name] = arg;
  }
  // The captures another branch took already come first, in its order.
  for (Value* outer : sharedCaptures) {
    Value* arg = body->addArgument(outer->type());
    scope.captures.push_back(outer);
    scope.captured[outer] = arg;
  }
  Scope* saved = scope_;
  scope_ = &scope;
  auto results = convertSubgraph(graph, what);
  std::vector<Value*> tensors;
  std::optional<Error> structuredResult;
  for (size_t i = 0; results && i < results->size() && !structuredResult; ++i) {
    const ImportValue& v = (*results)[i];
    if (v.kind == ValueKind::Tensor) {
      tensors.push_back(v.tensor);
      continue;
    }
    structuredResult =
        Error(what + ": output " + std::to_string(i) + " " + inQuotes(graph.output(static_cast<int>(i)).name()) +
              " is " + std::string(valueKindName(v.kind)) +
              "; Kiln resolves sequences and optionals at import and cannot return one from an If, "
              "Loop or Scan body that is not resolved at import (an If whose condition, or a Loop "
              "whose trip count, is known at import)");
  }
  if (results && !structuredResult) {
    builder().setLocation(Location::named("return", filename_));
    builder().ret(tensors);
  }
  scope_ = saved;
  if (!results) return results.takeError();
  if (structuredResult) return std::move(*structuredResult);
  removeUnusedConstants(*body);
  return onnx_import::ImportedBody{std::move(body), std::move(scope.captures)};
}

Expected<std::vector<ImportValue>> Importer::convertSubgraph(const onnx::GraphProto& graph, const std::string& what) {
  for (int i = 0; i < graph.initializer_size(); ++i) {
    const onnx::TensorProto& t = graph.initializer(i);
    auto dense = tensorFromProto(t, what + ": initializer " + inQuotes(t.name()), baseDir_);
    if (!dense) return dense.takeError();
    bind(t.name(), addConstant(std::move(*dense), Location::named(t.name(), filename_)));
  }
  KILN_TRY(convertGraphNodes(graph));
  std::vector<ImportValue> results;
  for (int i = 0; i < graph.output_size(); ++i) {
    const std::string& name = graph.output(i).name();
    if (const ImportValue* structured = findStructured(name)) {
      results.push_back(*structured);
      continue;
    }
    Value* v = lookup(name);
    if (!v && !sequenceBinding(name).empty())
      return Error(what + ": output " + std::to_string(i) + " " + inQuotes(name) + " is " + sequenceBinding(name) +
                   "; Kiln resolves sequences and optionals at import and cannot return one from an If, Loop or "
                   "Scan body that is not resolved at import");
    if (!v)
      return Error(what + ": output " + std::to_string(i) + " " + inQuotes(name) +
                   " is not produced by any node or input");
    results.push_back(ImportValue::ofTensor(v));
  }
  return results;
}

Expected<std::vector<ImportValue>> Importer::inlineSubgraph(const onnx::GraphProto& graph,
                                                            std::span<const ImportValue> inputs,
                                                            const std::string& nameSuffix, const std::string& what) {
  if (scope_->depth + 1 > kMaxSubgraphDepth)
    return Error(what + " nests subgraphs more than " + std::to_string(kMaxSubgraphDepth) + " deep");
  if (static_cast<size_t>(graph.input_size()) != inputs.size())
    return Error(what + " has " + std::to_string(graph.input_size()) + " inputs, expected " +
                 std::to_string(inputs.size()));
  if (graph.sparse_initializer_size() > 0) return Error(what + " has sparse initializers, which are not supported");
  Scope scope;
  scope.f = scope_->f;
  scope.builder.emplace(*scope_->f);
  scope.parent = scope_;
  scope.depth = scope_->depth + 1;
  scope.inlined = true;
  scope.nameSuffix = scope_->nameSuffix + nameSuffix;
  for (int i = 0; i < graph.input_size(); ++i) {
    const ImportValue& input = inputs[static_cast<size_t>(i)];
    if (input.kind == ValueKind::Tensor)
      scope.values[graph.input(i).name()] = input.tensor;
    else
      scope.structured[graph.input(i).name()] = input;
  }
  Scope* saved = scope_;
  scope_ = &scope;
  auto results = convertSubgraph(graph, what);
  scope_ = saved;
  return results;
}

Builder& NodeContextImpl::builder() {
  Builder& b = importer_.builder();
  b.setLocation(Location::named(nodeLabel(node_, index_), importer_.filename_));
  return b;
}

Value* NodeContextImpl::tensorNamed(const std::string& name) { return importer_.lookup(name); }

Expected<std::vector<Value*>> NodeContextImpl::gradients(Value* y, std::span<Value* const> xs,
                                                         std::span<Value* const> zs) {
  GradientBuilder build = importer_.options_.gradients;
  if (!build)
    return error("this program loads models without Kiln's autodiff (LoadOptions::gradients), which the op needs");
  auto results = build(builder(), y, xs, zs);
  if (!results) return error(results.error().message());
  return results;
}

Expected<std::vector<ImportValue>> NodeContextImpl::inlineBody(std::string_view attrName,
                                                               std::span<const ImportValue> inputs,
                                                               const std::string& nameSuffix) {
  const auto* a = attribute(attrName);
  if (!a) return error("attribute '" + std::string(attrName) + "' (a subgraph) is required but absent");
  KILN_TRY(expectKind(*a, onnx::AttributeProto::GRAPH, a->has_g()));
  auto results = importer_.inlineSubgraph(a->g(), inputs, nameSuffix, "subgraph '" + std::string(attrName) + "'");
  if (!results) return error(results.error().message());
  return results;
}

Expected<onnx_import::ImportedBody> NodeContextImpl::importBody(std::string_view attrName,
                                                                std::span<const TensorType> formalTypes,
                                                                std::span<Value* const> sharedCaptures) {
  const auto* a = attribute(attrName);
  if (!a) return error("attribute '" + std::string(attrName) + "' (a subgraph) is required but absent");
  KILN_TRY(expectKind(*a, onnx::AttributeProto::GRAPH, a->has_g()));
  auto body = importer_.importBody(a->g(), formalTypes, sharedCaptures, "subgraph '" + std::string(attrName) + "'");
  if (!body) return error(body.error().message());
  return body;
}

Expected<std::unique_ptr<Module>> Importer::run() {
  auto opsets = readOpsets(model_);
  if (!opsets) return opsets.takeError();
  opsets_ = std::move(*opsets);
  const onnx::GraphProto& graph = model_.graph();

  auto unsupported = collectUnsupported(graph, opsets_);
  if (!unsupported.empty()) return Error(describeUnsupported(unsupported));

  module_ = std::make_unique<Module>();
  root_.f = module_->addFunction(graph.name().empty() ? "main" : graph.name());
  root_.f->setLoc(Location::named(graph.name(), filename_));
  root_.builder.emplace(*root_.f);

  KILN_TRY(importInitializers());
  KILN_TRY(importInputs());
  KILN_TRY(convertGraphNodes(graph));
  KILN_TRY(importOutputs());
  removeUnusedConstants(*root_.f);
  return std::move(module_);
}

Expected<std::unique_ptr<Module>> importModel(const onnx::ModelProto& model, std::string_view filename,
                                              const std::string& baseDir, const LoadOptions& options,
                                              const std::map<std::string, DenseTensor>& frozenInputs,
                                              std::vector<GraphOutputForm>* outputs) {
  Importer importer(model, std::string(filename), baseDir, options, frozenInputs, outputs);
  auto module = importer.run();
  // Errors without a location (structure, tensors, node errors) get the
  // file name so that every message says where it comes from.
  if (!module && module.error().location().isUnknown())
    return Error(std::string(filename) + ": " + module.error().message());
  return module;
}

std::string folderOf(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

Expected<std::unique_ptr<Module>> importOnnxBytes(std::string_view bytes, std::string_view filename,
                                                  const std::string& baseDir, const LoadOptions& options) {
  return importOnnxBytes(bytes, filename, baseDir, options, {});
}

Expected<std::unique_ptr<Module>> importOnnxBytes(std::string_view bytes, std::string_view filename,
                                                  const std::string& baseDir, const LoadOptions& options,
                                                  const std::map<std::string, DenseTensor>& frozenInputs,
                                                  std::vector<GraphOutputForm>* outputs) {
  auto model = parseModel(bytes, filename);
  if (!model) return model.takeError();
  return importModel(*model, filename, baseDir, options, frozenInputs, outputs);
}

Expected<std::unique_ptr<Module>> importOnnx(const std::string& path, const LoadOptions& options) {
  return importOnnx(path, options, {});
}

Expected<std::unique_ptr<Module>> importOnnx(const std::string& path, const LoadOptions& options,
                                             const std::map<std::string, DenseTensor>& frozenInputs,
                                             std::vector<GraphOutputForm>* outputs) {
  auto bytes = readWholeFile(path, kMaxModelBytes, "ONNX model");
  if (!bytes) return bytes.takeError();
  return importOnnxBytes(*bytes, path, folderOf(path), options, frozenInputs, outputs);
}

Expected<std::vector<UnsupportedOnnxOp>> findUnsupportedOnnxOps(const std::string& path) {
  auto bytes = readWholeFile(path, kMaxModelBytes, "ONNX model");
  if (!bytes) return bytes.takeError();
  auto model = parseModel(*bytes, path);
  if (!model) return model.takeError();
  auto opsets = readOpsets(*model);
  if (!opsets) return Error(path + ": " + opsets.error().message());
  return collectUnsupported(model->graph(), *opsets);
}

Expected<std::map<std::string, ValueKind>> readOnnxStructuredInputs(const std::string& path) {
  auto bytes = readWholeFile(path, kMaxModelBytes, "ONNX model");
  if (!bytes) return bytes.takeError();
  auto model = parseModel(*bytes, path);
  if (!model) return model.takeError();
  std::map<std::string, ValueKind> structured;
  for (const onnx::ValueInfoProto& input : model->graph().input()) {
    const onnx::TypeProto& type = input.type();
    if (type.has_sequence_type())
      structured[input.name()] = ValueKind::Sequence;
    else if (type.has_optional_type())
      structured[input.name()] = type.optional_type().elem_type().has_sequence_type() ? ValueKind::OptionalSequence
                                                                                      : ValueKind::OptionalTensor;
  }
  return structured;
}

Expected<OnnxSignature> readOnnxSignature(const std::string& path) {
  auto bytes = readWholeFile(path, kMaxModelBytes, "ONNX model");
  if (!bytes) return bytes.takeError();
  auto model = parseModel(*bytes, path);
  if (!model) return model.takeError();
  std::set<std::string> initialized;
  for (const onnx::TensorProto& t : model->graph().initializer()) initialized.insert(t.name());
  OnnxSignature signature;
  for (int i = 0; i < model->graph().input_size(); ++i) {
    const onnx::ValueInfoProto& input = model->graph().input(i);
    if (initialized.count(input.name())) continue;
    auto type = typeFromValueInfo(input, "graph input " + std::to_string(i) + " " + inQuotes(input.name()));
    if (!type) return Error(path + ": " + type.error().message());
    signature.inputs.emplace_back(input.name(), *type);
  }
  for (int i = 0; i < model->graph().output_size(); ++i) {
    const onnx::ValueInfoProto& output = model->graph().output(i);
    auto type = typeFromValueInfo(output, "graph output " + std::to_string(i) + " " + inQuotes(output.name()));
    if (!type) return Error(path + ": " + type.error().message());
    signature.outputs.emplace_back(output.name(), *type);
  }
  return signature;
}

Expected<std::vector<std::pair<std::string, TensorType>>> readOnnxDataInputs(const std::string& path) {
  auto signature = readOnnxSignature(path);
  if (!signature) return signature.takeError();
  return std::move(signature->inputs);
}

Expected<DenseTensor> parseOnnxTensor(std::string_view bytes, std::string_view what) {
  if (static_cast<int64_t>(bytes.size()) > kMaxModelBytes)
    return Error(std::string(what) + ": too large for a protobuf message (2 GiB)");
  onnx::TensorProto t;
  if (!t.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Error(std::string(what) + ": not a valid ONNX TensorProto (truncated or malformed)");
  // A tensor file has no folder for external data of its own.
  return tensorFromProto(t, std::string(what), "");
}

Expected<DenseTensor> readOnnxTensor(const std::string& path) {
  auto bytes = readWholeFile(path, kMaxModelBytes, "ONNX tensor");
  if (!bytes) return bytes.takeError();
  return parseOnnxTensor(*bytes, path);
}

namespace {

/// The tensors of a SequenceProto (SequenceProto::TENSOR elements only).
Expected<std::vector<DenseTensor>> sequenceTensors(const onnx::SequenceProto& sequence, const std::string& what) {
  constexpr int32_t kTensorElements = 1;
  if (sequence.sequence_values_size() > 0 || sequence.optional_values_size() > 0 ||
      (sequence.elem_type() != kTensorElements && sequence.tensor_values_size() > 0) ||
      (sequence.elem_type() > kTensorElements && sequence.tensor_values_size() == 0))
    return Error(what + ": a sequence of element type " + std::to_string(sequence.elem_type()) +
                 ", expected tensors (1); Kiln's sequences hold tensors only");
  std::vector<DenseTensor> tensors;
  for (int i = 0; i < sequence.tensor_values_size(); ++i) {
    auto t = tensorFromProto(sequence.tensor_values(i), what + ": element " + std::to_string(i), "");
    if (!t) return t.takeError();
    if (!tensors.empty() && t->type.dtype != tensors.front().type.dtype)
      return Error(what + ": element " + std::to_string(i) + " is " + t->type.str() + ", but element 0 is " +
                   tensors.front().type.str() + " (a sequence has one element type)");
    tensors.push_back(std::move(*t));
  }
  return tensors;
}

}  // namespace

Expected<GraphValue> parseOnnxValue(std::string_view bytes, OnnxValueFile kind, std::string_view what) {
  const std::string name(what);
  if (static_cast<int64_t>(bytes.size()) > kMaxModelBytes)
    return Error(name + ": too large for a protobuf message (2 GiB)");
  const int size = static_cast<int>(bytes.size());
  switch (kind) {
    case OnnxValueFile::Tensor: {
      auto t = parseOnnxTensor(bytes, what);
      if (!t) return t.takeError();
      GraphValue value{ValueKind::Tensor, {}};
      value.tensors.push_back(std::move(*t));
      return value;
    }
    case OnnxValueFile::Sequence: {
      onnx::SequenceProto sequence;
      if (!sequence.ParseFromArray(bytes.data(), size))
        return Error(name + ": not a valid ONNX SequenceProto (truncated or malformed)");
      auto tensors = sequenceTensors(sequence, name);
      if (!tensors) return tensors.takeError();
      return GraphValue{ValueKind::Sequence, std::move(*tensors)};
    }
    case OnnxValueFile::Optional: {
      onnx::OptionalProto optional;
      if (!optional.ParseFromArray(bytes.data(), size))
        return Error(name + ": not a valid ONNX OptionalProto (truncated or malformed)");
      if (optional.has_tensor_value()) {
        auto t = tensorFromProto(optional.tensor_value(), name, "");
        if (!t) return t.takeError();
        GraphValue value{ValueKind::OptionalTensor, {}};
        value.tensors.push_back(std::move(*t));
        return value;
      }
      if (optional.has_sequence_value()) {
        auto tensors = sequenceTensors(optional.sequence_value(), name);
        if (!tensors) return tensors.takeError();
        return GraphValue{ValueKind::OptionalSequence, std::move(*tensors)};
      }
      if (optional.has_optional_value())
        return Error(name + ": an optional of an optional; Kiln's optionals hold a tensor or a sequence");
      // elem_type may name what an absent optional would hold (ONNX writes
      // it for the empty optionals of its tests); a map or sparse tensor
      // there is still absent, so there is nothing to refuse.
      return GraphValue{ValueKind::OptionalNone, {}};
    }
  }
  return Error(name + ": unknown value file kind");
}

Expected<GraphValue> readOnnxValue(const std::string& path, OnnxValueFile kind) {
  auto bytes = readWholeFile(path, kMaxModelBytes, "ONNX value");
  if (!bytes) return bytes.takeError();
  return parseOnnxValue(*bytes, kind, path);
}

namespace onnx_import {

const OpConverter* findConverter(std::string_view domain, std::string_view opType, int64_t opset) {
  const std::string normalized = normalizeDomain(domain);
  for (auto table : {mathConverters(), tensorConverters(), nnConverters(), visionConverters(), signalConverters(),
                     randomConverters(), dataDependentConverters(), controlFlowConverters(), sequenceConverters()})
    for (const OpConverter& c : table)
      if (c.domain == normalized && c.opType == opType && c.minOpset <= opset && opset <= c.maxOpset) return &c;
  return nullptr;
}

}  // namespace onnx_import
}  // namespace kiln
