// The Kiln graph format (frontend/kiln.proto, docs/format.md) to and from
// Kiln IR. The reader treats every file as hostile: sizes are bounded
// before anything is allocated from them, every name is resolved before it
// is used, attributes are checked against the op table, result types come
// from the shape rules, and each failure is one Error naming the file and
// the node. The writer chooses value names exactly as the IR printer does
// and records only what the reader cannot infer, so reading what it wrote
// gives back IR that prints the same.
#include "frontend/KilnFormat.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/text_format.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "frontend/FileIO.h"
#include "frontend/kiln.pb.h"
#include "ir/Builder.h"
#include "ir/Printer.h"
#include "ir/ShapeRules.h"
#include "ir/Verifier.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;
namespace proto = ::kiln::format;

constexpr int64_t kFormatVersion = 1;
/// The IR's bound on a dim and on a type's element count (docs/ir.md).
constexpr int64_t kMaxElements = int64_t{1} << 40;
/// Protobuf parses and serializes at most 2 GiB per message.
constexpr int64_t kMaxProtobufBytes = INT_MAX;
/// All external tensors of one model together; tensors may share bytes, so
/// the files' sizes alone do not bound what a model asks to allocate.
constexpr int64_t kMaxExternalDataBytes = int64_t{64} << 30;
/// Cycles in errors are cut to this many nodes.
constexpr size_t kMaxCycleNodesShown = 8;

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// True for a `.kiln.txt` path, false for `.kiln`, nullopt otherwise.
std::optional<bool> isTextModelPath(std::string_view path) {
  if (endsWith(path, ".kiln.txt")) return true;
  if (endsWith(path, ".kiln")) return false;
  return std::nullopt;
}

std::optional<DType> fromProto(int t) {
  switch (t) {
    case proto::F64:
      return DType::F64;
    case proto::F32:
      return DType::F32;
    case proto::F16:
      return DType::F16;
    case proto::BF16:
      return DType::BF16;
    case proto::I64:
      return DType::I64;
    case proto::I32:
      return DType::I32;
    case proto::I16:
      return DType::I16;
    case proto::I8:
      return DType::I8;
    case proto::U8:
      return DType::U8;
    case proto::U16:
      return DType::U16;
    case proto::U32:
      return DType::U32;
    case proto::U64:
      return DType::U64;
    case proto::BOOL:
      return DType::Bool;
    default:
      return std::nullopt;
  }
}

proto::DataType toProto(DType t) {
  switch (t) {
    case DType::F64:
      return proto::F64;
    case DType::F32:
      return proto::F32;
    case DType::F16:
      return proto::F16;
    case DType::BF16:
      return proto::BF16;
    case DType::I64:
      return proto::I64;
    case DType::I32:
      return proto::I32;
    case DType::I16:
      return proto::I16;
    case DType::I8:
      return proto::I8;
    case DType::U8:
      return proto::U8;
    case DType::U16:
      return proto::U16;
    case DType::U32:
      return proto::U32;
    case DType::U64:
      return proto::U64;
    case DType::Bool:
      return proto::BOOL;
  }
  return proto::DATA_TYPE_UNSPECIFIED;
}

std::string withArticle(AttrKind kind) {
  std::string name(attrKindName(kind));
  return (name[0] == 'i' ? "an " : "a ") + name;
}

std::string inQuotes(std::string_view s) { return "'" + std::string(s) + "'"; }

/// The range of values an integer dtype holds (of u64, the part int64
/// reaches: larger values need raw_data).
std::pair<int64_t, int64_t> intRange(DType t) {
  switch (t) {
    case DType::I32:
      return {INT32_MIN, INT32_MAX};
    case DType::I16:
      return {INT16_MIN, INT16_MAX};
    case DType::I8:
      return {INT8_MIN, INT8_MAX};
    case DType::U8:
      return {0, UINT8_MAX};
    case DType::U16:
      return {0, UINT16_MAX};
    case DType::U32:
      return {0, UINT32_MAX};
    case DType::U64:
      return {0, INT64_MAX};
    case DType::Bool:
      return {0, 1};
    default:
      return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

/// Proto3 requires string fields to be UTF-8: the binary parser enforces it,
/// the text parser does not, so the reader checks text models and the
/// writer checks what it writes.
bool isValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

/// The full name of the first string field of `m` (recursively) that is not
/// valid UTF-8, or nullopt.
std::optional<std::string> findInvalidUtf8(const google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
      for (int i = 0; i < n; ++i) {
        std::string scratch;
        const std::string& s =
            f->is_repeated() ? r->GetRepeatedStringReference(m, f, i, &scratch) : r->GetStringReference(m, f, &scratch);
        if (!isValidUtf8(s)) return f->full_name();
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
      for (int i = 0; i < n; ++i) {
        const google::protobuf::Message& sub = f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f);
        if (auto bad = findInvalidUtf8(sub)) return bad;
      }
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

/// Keeps the first error of the text format parser, with its position.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (!error) error = Error(message, Location::source(file_, std::max(line, 0) + 1, std::max(column, 0) + 1));
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}

  explicit FirstErrorCollector(std::string file) : file_(std::move(file)) {}
  std::optional<Error> error;

 private:
  std::string file_;
};

/// Converts one parsed Model into a Module. Errors about a node carry the
/// node's location (`file: node 'name'`, or `'#index'` for an unnamed node);
/// errors about the graph name the file in the message.
class ModelReader {
 public:
  ModelReader(std::string file, std::string baseDir) : file_(std::move(file)), baseDir_(std::move(baseDir)) {}

  Expected<std::unique_ptr<Module>> read(const proto::Model& model) {
    if (model.format_version() > kFormatVersion)
      return graphError("format_version " + std::to_string(model.format_version()) +
                        " is newer than this Kiln reads (" + std::to_string(kFormatVersion) +
                        "); upgrade Kiln or write the model with format_version " + std::to_string(kFormatVersion));
    if (model.format_version() < 1)
      return graphError("format_version is missing or invalid (" + std::to_string(model.format_version()) +
                        "); expected " + std::to_string(kFormatVersion));
    if (!model.has_graph()) return graphError("the model has no graph");
    const proto::Graph& g = model.graph();
    if (g.name().empty()) return graphError("the graph has no name (it names the function)");

    auto module = std::make_unique<Module>();
    Function& f = *module->addFunction(g.name());
    KILN_TRY(readInputs(g, f));
    KILN_TRY(readConstants(g, f));
    for (int i = 0; i < g.nodes_size(); ++i) KILN_TRY(readNode(g, i, f));
    KILN_TRY(readOutputs(g, f));
    // Everything above was checked as it was read; the verifier is the
    // backstop that keeps the reader from ever handing out invalid IR.
    Status verified = verify(f);
    if (!verified) {
      Error e = verified.takeError();
      return e.location().isUnknown() ? graphError(e.message()) : e;
    }
    return module;
  }

 private:
  Error graphError(const std::string& message) const { return Error(file_ + ": " + message); }

  std::string nodeLabel(const proto::Graph& g, int i) const {
    const std::string& name = g.nodes(i).name();
    return name.empty() ? "#" + std::to_string(i) : name;
  }
  Location nodeLocation(const proto::Graph& g, int i) const { return Location::named(nodeLabel(g, i), file_); }
  Error nodeError(const proto::Graph& g, int i, const std::string& message) const {
    return Error(message, nodeLocation(g, i));
  }

  /// A tensor type with its dims bounded as the IR's text form bounds them.
  Expected<TensorType> readType(const proto::TensorType& t, const std::string& what) const {
    auto dtype = fromProto(t.dtype());
    if (!dtype)
      return Error(what + (t.dtype() == proto::DATA_TYPE_UNSPECIFIED
                               ? " has no dtype"
                               : " has unknown dtype " + std::to_string(t.dtype())));
    TensorType type{*dtype, {}};
    type.shape.reserve(static_cast<size_t>(t.dims_size()));
    int64_t elements = 1;
    for (const proto::Dim& d : t.dims()) {
      switch (d.value_case()) {
        case proto::Dim::kSize:
          if (d.size() < 0 || d.size() > kMaxElements)
            return Error(what + " has dimension " + std::to_string(d.size()) + " (expected 0 to 2^40)");
          if (d.size() != 0 && elements > kMaxElements / d.size()) return Error(what + " has more than 2^40 elements");
          elements *= d.size();
          type.shape.push_back(Dim::fixed(d.size()));
          break;
        case proto::Dim::kSymbol:
          type.shape.push_back(Dim::symbolic(d.symbol()));
          break;
        case proto::Dim::VALUE_NOT_SET:
          type.shape.push_back(Dim::unknown());
          break;
      }
    }
    return type;
  }

  /// The static type of a constant tensor, with the element count bounded.
  Expected<TensorType> readTensorType(const proto::Tensor& t, const std::string& what) const {
    auto dtype = fromProto(t.dtype());
    if (!dtype)
      return Error(what + (t.dtype() == proto::DATA_TYPE_UNSPECIFIED
                               ? " has no dtype"
                               : " has unknown dtype " + std::to_string(t.dtype())));
    std::vector<int64_t> dims;
    int64_t elements = 1;
    for (int64_t d : t.dims()) {
      if (d < 0 || d > kMaxElements)
        return Error(what + " has dimension " + std::to_string(d) + " (expected 0 to 2^40)");
      if (d != 0 && elements > kMaxElements / d) return Error(what + " has more than 2^40 elements");
      elements *= d;
      dims.push_back(d);
    }
    return TensorType{*dtype, staticShape(dims)};
  }

  /// A constant tensor from whichever one of its data fields is set.
  Expected<DenseTensor> readTensor(const proto::Tensor& t, const std::string& what) {
    auto type = readTensorType(t, what);
    if (!type) return type.takeError();
    DType dtype = type->dtype;
    int64_t count = numElements(type->shape);
    int64_t bytes = count * static_cast<int64_t>(dtypeSize(dtype));
    std::string describe =
        std::to_string(count) + " element" + (count == 1 ? "" : "s") + " of " + std::string(dtypeName(dtype));

    int sources = (!t.raw_data().empty() ? 1 : 0) + (t.float_values_size() ? 1 : 0) + (t.double_values_size() ? 1 : 0) +
                  (t.int_values_size() ? 1 : 0) + (t.has_external() ? 1 : 0);
    if (sources > 1)
      return Error(what + " sets more than one of raw_data, float_values, double_values, int_values and external");
    if (sources == 0 && count != 0) return Error(what + " has no data (expected " + describe + ")");

    DenseTensor result;
    result.type = *type;
    auto checkCount = [&](int n, const char* field) -> Status {
      if (n != count) return Error(what + " has " + std::to_string(n) + " " + field + ", expected " + describe);
      return Status::success();
    };
    if (t.float_values_size()) {
      if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
        return Error(what + " is " + std::string(dtypeName(dtype)) + " but has float_values (for f32, f16, bf16)");
      KILN_TRY(checkCount(t.float_values_size(), "float_values"));
      result = DenseTensor::zeros(*type);
      for (int64_t i = 0; i < count; ++i) result.setDouble(i, t.float_values(static_cast<int>(i)));
    } else if (t.double_values_size()) {
      if (dtype != DType::F64)
        return Error(what + " is " + std::string(dtypeName(dtype)) + " but has double_values (for f64)");
      KILN_TRY(checkCount(t.double_values_size(), "double_values"));
      result = DenseTensor::zeros(*type);
      for (int64_t i = 0; i < count; ++i) result.setDouble(i, t.double_values(static_cast<int>(i)));
    } else if (t.int_values_size()) {
      if (isFloat(dtype))
        return Error(what + " is " + std::string(dtypeName(dtype)) + " but has int_values (for integers and bool)");
      KILN_TRY(checkCount(t.int_values_size(), "int_values"));
      auto [low, high] = intRange(dtype);
      result = DenseTensor::zeros(*type);
      for (int64_t i = 0; i < count; ++i) {
        int64_t v = t.int_values(static_cast<int>(i));
        if (v < low || v > high)
          return Error(what + " element " + std::to_string(i) + " is " + std::to_string(v) + ", out of range for " +
                       std::string(dtypeName(dtype)));
        result.setInt(i, v);
      }
    } else {
      std::string_view raw;
      std::vector<uint8_t> external;
      if (t.has_external()) {
        auto data = readExternal(t.external(), bytes, what);
        if (!data) return data.takeError();
        external = std::move(*data);
      } else {
        raw = t.raw_data();
        if (static_cast<int64_t>(raw.size()) != bytes)
          return Error(what + " has " + std::to_string(raw.size()) + " bytes of raw_data, expected " +
                       std::to_string(bytes) + " (" + describe + ")");
      }
      if (t.has_external())
        result.bytes = std::move(external);
      else
        result.bytes.assign(raw.begin(), raw.end());
      if (dtype == DType::Bool)
        for (size_t i = 0; i < result.bytes.size(); ++i)
          if (result.bytes[i] > 1)
            return Error(what + " bool element " + std::to_string(i) + " is " + std::to_string(result.bytes[i]) +
                         " (expected 0 or 1)");
    }
    return result;
  }

  /// The bytes of an external tensor, after checking that its file stays
  /// inside the model's folder and that the range lies inside the file.
  Expected<std::vector<uint8_t>> readExternal(const proto::ExternalData& ext, int64_t bytes, const std::string& what) {
    const std::string& location = ext.location();
    std::string prefix = what + " external data " + inQuotes(location);
    if (baseDir_.empty())
      return Error(what +
                   " uses external data, which a model read from memory cannot have (no folder to read it from)");
    if (location.empty()) return Error(what + " has external data without a location");
    if (location.find('\0') != std::string::npos) return Error(what + " external data location contains a NUL byte");
    fs::path rel(location);
    if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
      return Error(prefix + ": the location must be relative to the model's folder");
    for (const fs::path& part : rel)
      if (part == "..") return Error(prefix + ": the location may not contain '..'");
    std::error_code ec;
    fs::path base = fs::weakly_canonical(fs::path(baseDir_), ec);
    if (ec) return Error(prefix + ": cannot resolve the model's folder: " + ec.message());
    fs::path target = fs::weakly_canonical(base / rel, ec);
    if (ec) return Error(prefix + ": cannot resolve: " + ec.message());
    fs::path inside = target.lexically_relative(base);
    if (inside.empty() || *inside.begin() == "..")
      return Error(prefix + " resolves outside the model's folder (through a symlink)");
    if (!fs::is_regular_file(target, ec)) return Error(prefix + " is not a file beside the model");
    uintmax_t size = fs::file_size(target, ec);
    if (ec) return Error(prefix + ": " + ec.message());
    int64_t fileSize = static_cast<int64_t>(std::min<uintmax_t>(size, std::numeric_limits<int64_t>::max()));
    if (ext.offset() < 0 || ext.length() < 0) return Error(prefix + " has a negative offset or length");
    if (ext.length() != bytes)
      return Error(prefix + " has length " + std::to_string(ext.length()) + ", expected " + std::to_string(bytes) +
                   " bytes");
    if (ext.offset() > fileSize || ext.length() > fileSize - ext.offset())
      return Error(prefix + ": offset " + std::to_string(ext.offset()) + " and length " + std::to_string(ext.length()) +
                   " reach past its end (" + std::to_string(fileSize) + " bytes)");
    if (ext.length() > kMaxExternalDataBytes - externalBytes_)
      return Error(prefix + ": the model's external data exceeds " + std::to_string(kMaxExternalDataBytes >> 30) +
                   " GiB");
    externalBytes_ += ext.length();
    std::ifstream in(target, std::ios::binary);
    std::vector<uint8_t> data(static_cast<size_t>(ext.length()));
    if (!in.seekg(ext.offset()) || !in.read(reinterpret_cast<char*>(data.data()), ext.length()))
      return Error(prefix + ": read failed");
    return data;
  }

  /// Remembers where a name was defined, for duplicate-definition errors.
  Status define(const std::string& name, Value* value, std::string where) {
    auto [it, inserted] = defined_.try_emplace(name, Definition{value, where});
    if (!inserted) return Error(inQuotes(name) + " is defined twice: by " + it->second.where + " and by " + where);
    return Status::success();
  }

  Status readInputs(const proto::Graph& g, Function& f) {
    for (const proto::Tensor& t : g.initializers()) {
      if (t.name().empty()) return graphError("an initializer has no name");
      if (!initializers_.emplace(t.name(), &t).second)
        return graphError("initializer " + inQuotes(t.name()) + " is defined twice");
    }
    for (const proto::ValueInfo& input : g.inputs()) {
      std::string what = "graph input " + inQuotes(input.name());
      if (input.name().empty()) return graphError("a graph input has no name");
      if (!input.has_type()) return graphError(what + " has no type");
      auto type = readType(input.type(), what);
      if (!type) return graphError(type.error().message());
      Value* arg = f.addArgument(*type, input.name());
      if (Status s = define(input.name(), arg, "a graph input"); !s) return graphError(s.error().message());
      auto init = initializers_.find(input.name());
      if (init == initializers_.end()) continue;
      // An initializer named like an input is that input's default value.
      defaults_.insert(input.name());
      auto value = readTensor(*init->second, "initializer " + inQuotes(input.name()));
      if (!value) return graphError(value.error().message());
      if (!typesCompatible(value->type, *type))
        return graphError("initializer " + inQuotes(input.name()) + " of type " + value->type.str() +
                          " does not fit graph input type " + type->str());
      f.setArgumentDefault(f.numArguments() - 1, std::make_shared<const DenseTensor>(std::move(*value)));
    }
    return Status::success();
  }

  /// Initializers that are not input defaults become `constant` ops, in
  /// file order, ahead of the nodes.
  Status readConstants(const proto::Graph& g, Function& f) {
    Builder b(f);
    for (const proto::Tensor& t : g.initializers()) {
      if (defaults_.count(t.name())) continue;
      auto value = readTensor(t, "initializer " + inQuotes(t.name()));
      if (!value) return graphError(value.error().message());
      Value* v = b.constant(std::move(*value));
      v->setName(t.name());
      if (Status s = define(t.name(), v, "an initializer"); !s) return graphError(s.error().message());
    }
    return Status::success();
  }

  /// The error for node `i` using `name` before any definition: a cycle
  /// when the later producer depends on node `i`, otherwise a node order
  /// that is not topological, otherwise an unknown name.
  Error undefinedInput(const proto::Graph& g, int i, const std::string& name) const {
    std::unordered_map<std::string_view, int> producer;
    for (int j = 0; j < g.nodes_size(); ++j)
      for (const std::string& out : g.nodes(j).outputs()) producer.emplace(out, j);
    auto found = producer.find(name);
    if (found == producer.end())
      return nodeError(g, i,
                       "input " + inQuotes(name) +
                           " is not defined (no graph input, initializer or earlier node output "
                           "has that name)");
    int j = found->second;
    // Walk from node j back through the producers of its inputs; reaching
    // node i closes a cycle i -> ... -> j -> i in data-flow order.
    std::vector<int> consumer(static_cast<size_t>(g.nodes_size()), -2);
    consumer[static_cast<size_t>(j)] = -1;
    std::vector<int> stack{j};
    bool cycle = j == i;
    while (!stack.empty() && !cycle) {
      int n = stack.back();
      stack.pop_back();
      for (const std::string& in : g.nodes(n).inputs()) {
        auto p = producer.find(in);
        if (p == producer.end() || consumer[static_cast<size_t>(p->second)] != -2) continue;
        consumer[static_cast<size_t>(p->second)] = n;
        if (p->second == i) {
          cycle = true;
          break;
        }
        stack.push_back(p->second);
      }
    }
    if (!cycle)
      return nodeError(g, i,
                       "input " + inQuotes(name) + " is used before node " + inQuotes(nodeLabel(g, j)) +
                           " defines it (nodes must be in topological order)");
    std::vector<int> path{i};
    if (j != i)
      for (int n = consumer[static_cast<size_t>(i)]; n != -1; n = consumer[static_cast<size_t>(n)]) path.push_back(n);
    path.push_back(i);
    std::string text;
    for (size_t k = 0; k < path.size(); ++k) {
      if (k == kMaxCycleNodesShown && path.size() > kMaxCycleNodesShown + 1) {
        text += " -> ... (" + std::to_string(path.size() - 1 - k) + " more)";
        k = path.size() - 1;
      }
      text += (k ? " -> " : "") + inQuotes(nodeLabel(g, path[k]));
    }
    return nodeError(g, i, "the graph has a cycle through this node: " + text + " (input " + inQuotes(name) + ")");
  }

  Expected<Attribute> readAttribute(const proto::Attribute& a, const AttrSpec& spec, std::string_view op) {
    std::string what = "attribute " + inQuotes(spec.name) + " of " + inQuotes(op);
    std::optional<AttrKind> kind;
    switch (a.value_case()) {
      case proto::Attribute::kI:
        kind = AttrKind::Int;
        break;
      case proto::Attribute::kF:
        kind = AttrKind::Float;
        break;
      case proto::Attribute::kB:
        kind = AttrKind::Bool;
        break;
      case proto::Attribute::kS:
        kind = AttrKind::String;
        break;
      case proto::Attribute::kInts:
        kind = AttrKind::Ints;
        break;
      case proto::Attribute::kFloats:
        kind = AttrKind::Floats;
        break;
      case proto::Attribute::kTensor:
        kind = AttrKind::Tensor;
        break;
      case proto::Attribute::VALUE_NOT_SET:
        break;
    }
    if (!kind) return Error(what + " has no value (expected " + withArticle(spec.kind) + ")");
    if (*kind != spec.kind) return Error(what + " expects " + withArticle(spec.kind) + ", got " + withArticle(*kind));
    switch (*kind) {
      case AttrKind::Int:
        return Attribute(a.i());
      case AttrKind::Float:
        return Attribute(a.f());
      case AttrKind::Bool:
        return Attribute(a.b());
      case AttrKind::String:
        return Attribute(a.s());
      case AttrKind::Ints:
        return Attribute(std::vector<int64_t>(a.ints().values().begin(), a.ints().values().end()));
      case AttrKind::Floats:
        return Attribute(std::vector<double>(a.floats().values().begin(), a.floats().values().end()));
      case AttrKind::Tensor: {
        auto t = readTensor(a.tensor(), what);
        if (!t) return t.takeError();
        return Attribute(std::move(*t));
      }
    }
    return Error(what + " has an unknown kind");
  }

  Status readNode(const proto::Graph& g, int i, Function& f) {
    const proto::Node& node = g.nodes(i);
    auto kind = lookupOp(node.op());
    if (!kind || *kind == OpKind::Return)
      return nodeError(g, i,
                       "unknown op " + inQuotes(node.op()) +
                           (kind ? " (graph outputs are the function's results; 'return' is not a node)"
                                 : " (not in Kiln's op table, ir/Ops.def; docs/ops.md lists the ops)"));
    if (opInfo(*kind).hasRegion())
      return nodeError(g, i,
                       "op " + inQuotes(node.op()) +
                           " has a region, which the Kiln format does not hold (it stores models before fusion)");
    const OpInfo& info = opInfo(*kind);
    std::string op(info.mnemonic);

    int inputs = node.inputs_size();
    if (inputs < info.minOperands || (info.maxOperands >= 0 && inputs > info.maxOperands)) {
      std::string expected = info.maxOperands < 0 ? "at least " + std::to_string(info.minOperands)
                             : info.minOperands == info.maxOperands
                                 ? std::to_string(info.minOperands)
                                 : std::to_string(info.minOperands) + " to " + std::to_string(info.maxOperands);
      return nodeError(g, i,
                       inQuotes(op) + " has " + std::to_string(inputs) + " input" + (inputs == 1 ? "" : "s") +
                           ", expected " + expected);
    }
    if (info.numResults >= 0 && node.outputs_size() != info.numResults)
      return nodeError(g, i,
                       inQuotes(op) + " has " + std::to_string(node.outputs_size()) + " output" +
                           (node.outputs_size() == 1 ? "" : "s") + ", expected " + std::to_string(info.numResults));

    std::vector<Value*> operands;
    std::vector<TensorType> operandTypes;
    for (const std::string& name : node.inputs()) {
      if (name.empty()) return nodeError(g, i, "an input name is empty");
      auto it = defined_.find(name);
      if (it == defined_.end()) return undefinedInput(g, i, name);
      operands.push_back(it->second.value);
      operandTypes.push_back(it->second.value->type());
    }

    // Map order is unspecified in protobuf; sort so the first error
    // reported does not depend on it.
    std::vector<const std::string*> names;
    for (const auto& [name, value] : node.attributes()) names.push_back(&name);
    std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    AttrMap attrs;
    for (const std::string* name : names) {
      const AttrSpec* spec = info.findAttr(*name);
      if (!spec) {
        std::string expected;
        for (const AttrSpec& s : info.attrs) expected += (expected.empty() ? "" : ", ") + std::string(s.name);
        return nodeError(g, i,
                         "unknown attribute " + inQuotes(*name) + " for " + inQuotes(op) +
                             " (expected: " + (expected.empty() ? std::string("none") : expected) + ")");
      }
      auto value = readAttribute(node.attributes().at(*name), *spec, op);
      if (!value) return nodeError(g, i, value.error().message());
      attrs.emplace(*name, std::move(*value));
    }
    for (const AttrSpec& spec : info.attrs)
      if (spec.required && !attrs.count(std::string(spec.name)))
        return nodeError(g, i, "missing required attribute " + inQuotes(spec.name) + " of " + inQuotes(op));

    std::vector<TensorType> declared;
    if (node.output_types_size() != 0 && node.output_types_size() != node.outputs_size())
      return nodeError(g, i,
                       "has " + std::to_string(node.output_types_size()) + " output_types for " +
                           std::to_string(node.outputs_size()) + " outputs");
    for (int k = 0; k < node.output_types_size(); ++k) {
      auto type = readType(node.output_types(k), "output type " + std::to_string(k));
      if (!type) return nodeError(g, i, type.error().message());
      declared.push_back(std::move(*type));
    }
    Location diagnostics = nodeLocation(g, i);
    auto inferred = inferResultTypes(ShapeQuery{*kind, operandTypes, &attrs, declared, diagnostics});
    if (!inferred) return inferred.takeError();
    if (inferred->size() != static_cast<size_t>(node.outputs_size()))
      return nodeError(g, i,
                       "the shape rule of " + inQuotes(op) + " gives " + std::to_string(inferred->size()) +
                           " results for " + std::to_string(node.outputs_size()) + " outputs");
    for (size_t k = 0; k < declared.size(); ++k)
      if (!typesCompatible(declared[k], (*inferred)[k]))
        return nodeError(g, i,
                         "output " + inQuotes(node.outputs(static_cast<int>(k))) + " is declared " + declared[k].str() +
                             " but " + inQuotes(op) + " gives " + (*inferred)[k].str());

    Builder b(f);
    b.setLocation(node.name().empty() ? Location() : Location::named(node.name(), file_));
    Op* created = b.create(*kind, std::move(operands), declared.empty() ? std::move(*inferred) : std::move(declared),
                           std::move(attrs));
    for (int k = 0; k < node.outputs_size(); ++k) {
      const std::string& name = node.outputs(k);
      if (name.empty()) return nodeError(g, i, "output " + std::to_string(k) + " has no name");
      created->result(static_cast<size_t>(k))->setName(name);
      if (Status s = define(name, created->result(static_cast<size_t>(k)), "node " + inQuotes(nodeLabel(g, i))); !s)
        return nodeError(g, i, s.error().message());
    }
    return Status::success();
  }

  Status readOutputs(const proto::Graph& g, Function& f) {
    std::vector<Value*> values;
    std::vector<TensorType> types;
    std::unordered_set<std::string> resultNames;
    for (const proto::ValueInfo& output : g.outputs()) {
      const std::string& valueName = output.value().empty() ? output.name() : output.value();
      std::string what = "graph output " + inQuotes(output.name().empty() ? valueName : output.name());
      if (valueName.empty()) return graphError("a graph output has neither a name nor a value");
      if (!output.name().empty() && !resultNames.insert(output.name()).second)
        return graphError(what + " is listed twice");
      auto it = defined_.find(valueName);
      if (it == defined_.end())
        return graphError(what + " is not produced: no graph input, initializer or node defines " +
                          inQuotes(valueName));
      Value* v = it->second.value;
      TensorType type = v->type();
      if (output.has_type()) {
        auto declared = readType(output.type(), what);
        if (!declared) return graphError(declared.error().message());
        if (!typesCompatible(v->type(), *declared))
          return graphError(what + " is declared " + declared->str() + " but " + inQuotes(valueName) + " is " +
                            v->type().str());
        type = std::move(*declared);
      }
      values.push_back(v);
      types.push_back(std::move(type));
    }
    Builder(f).ret(values);
    f.setResultTypes(std::move(types));
    for (int k = 0; k < g.outputs_size(); ++k) f.setResultName(static_cast<size_t>(k), g.outputs(k).name());
    return Status::success();
  }

  struct Definition {
    Value* value;
    std::string where;
  };

  std::string file_;
  std::string baseDir_;
  std::unordered_map<std::string, const proto::Tensor*> initializers_;
  std::unordered_set<std::string> defaults_;
  std::unordered_map<std::string, Definition> defined_;
  int64_t externalBytes_ = 0;
};

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// The names the IR printer gives the values of a function. Using the same
/// names makes the read-back IR print exactly as the original.
class ValueNames {
 public:
  explicit ValueNames(const Function& f) : names_(printedValueNames(f)) {}
  const std::string& operator()(const Value* v) const { return names_.at(v); }

 private:
  std::unordered_map<const Value*, std::string> names_;
};

/// Where the writer puts large tensors: one data file, 64-byte aligned so
/// that a runtime may map tensors in place.
struct ExternalSink {
  std::string location;  // file name relative to the model's folder
  int64_t threshold = 0;
  std::string data;
};

class ModelWriter {
 public:
  ModelWriter(bool text, ExternalSink* sink) : text_(text), sink_(sink) {}

  Expected<proto::Model> write(const Module& module) {
    if (module.functions().empty()) return Error("the module has no function to write");
    const Function& f = *module.functions().front();
    if (Status s = verify(f); !s) return Error("cannot write invalid IR: " + s.error().str());
    if (f.name().empty()) return Error("cannot write a function without a name (it names the graph)");
    KILN_TRY(checkText(f.name(), "function name"));

    proto::Model model;
    model.set_format_version(kFormatVersion);
    model.set_producer("kiln");
    proto::Graph& g = *model.mutable_graph();
    g.set_name(f.name());
    ValueNames names(f);

    for (size_t i = 0; i < f.numArguments(); ++i) {
      const Value* arg = f.argument(i);
      proto::ValueInfo& input = *g.add_inputs();
      KILN_TRY(checkText(names(arg), "value name"));
      input.set_name(names(arg));
      KILN_TRY(writeType(arg->type(), input.mutable_type()));
      if (const DenseTensor* d = f.argumentDefault(i)) {
        proto::Tensor& t = *g.add_initializers();
        t.set_name(names(arg));
        writeTensor(*d, &t);
      }
    }

    // Constants ahead of every other op that carry no location of their own
    // become initializers, which the reader turns back into the same ops in
    // the same place; any other constant stays a node.
    bool leading = true;
    for (const auto& op : f.ops()) {
      if (op->kind() == OpKind::Return) break;
      if (leading && op->kind() == OpKind::Constant && !op->loc().isPrinted() && op->attrs().size() == 1 &&
          op->attr("value") && op->result(0)->type() == op->getTensor("value").type) {
        proto::Tensor& t = *g.add_initializers();
        KILN_TRY(checkText(names(op->result(0)), "value name"));
        t.set_name(names(op->result(0)));
        writeTensor(op->getTensor("value"), &t);
        continue;
      }
      leading = false;
      // A node has no place for a body; dropping it would lose what the op computes.
      if (op->region())
        return op->emitError("has a region, which the Kiln graph format cannot store; write text IR (.kir) instead");
      KILN_TRY(writeNode(*op, names, g.add_nodes()));
    }

    const Op* ret = f.returnOp();
    for (size_t i = 0; i < ret->numOperands(); ++i) {
      proto::ValueInfo& output = *g.add_outputs();
      const std::string& valueName = names(ret->operand(i));
      KILN_TRY(checkText(f.resultName(i), "result name"));
      output.set_name(f.resultName(i));
      if (valueName != f.resultName(i)) output.set_value(valueName);
      KILN_TRY(writeType(f.resultTypes()[i], output.mutable_type()));
    }
    return model;
  }

 private:
  static Status checkText(const std::string& s, const char* what) {
    if (!isValidUtf8(s))
      return Error("cannot write " + std::string(what) + " " + inQuotes(s) +
                   ": the Kiln format stores names and strings as UTF-8");
    return Status::success();
  }

  Status writeType(const TensorType& type, proto::TensorType* out) {
    out->set_dtype(toProto(type.dtype));
    for (const Dim& d : type.shape) {
      proto::Dim& dim = *out->add_dims();
      if (d.isStatic()) {
        dim.set_size(d.size);
      } else if (d.isSymbolic()) {
        KILN_TRY(checkText(d.symbol, "dimension symbol"));
        dim.set_symbol(d.symbol);
      }
    }
    return Status::success();
  }

  /// True when the text format's float lists carry `t` exactly: every
  /// element reads back to the same bits (NaN payloads do not survive the
  /// text form's `nan`).
  static bool floatListsAreExact(const DenseTensor& t) {
    DenseTensor back = DenseTensor::zeros(t.type);
    for (int64_t i = 0; i < t.numElements(); ++i) {
      double v = t.getDouble(i);
      if (std::isnan(v)) v = std::numeric_limits<double>::quiet_NaN();
      if (t.type.dtype != DType::F64) v = static_cast<float>(v);
      back.setDouble(i, v);
    }
    return back.bytes == t.bytes;
  }

  void writeTensor(const DenseTensor& value, proto::Tensor* out) {
    out->set_dtype(toProto(value.type.dtype));
    for (int64_t d : staticDims(value.type.shape)) out->add_dims(d);
    int64_t n = value.numElements();
    if (n == 0) return;
    if (sink_ && sink_->threshold > 0 && static_cast<int64_t>(value.bytes.size()) >= sink_->threshold) {
      sink_->data.resize((sink_->data.size() + 63) / 64 * 64, '\0');
      proto::ExternalData& ext = *out->mutable_external();
      ext.set_location(sink_->location);
      ext.set_offset(static_cast<int64_t>(sink_->data.size()));
      ext.set_length(static_cast<int64_t>(value.bytes.size()));
      appendBytes(value, &sink_->data);
      return;
    }
    DType dtype = value.type.dtype;
    if (text_ && !isFloat(dtype) && intListIsExact(value)) {
      for (int64_t i = 0; i < n; ++i) out->add_int_values(value.getInt(i));
    } else if (text_ && isFloat(dtype) && floatListsAreExact(value)) {
      for (int64_t i = 0; i < n; ++i) {
        if (dtype == DType::F64)
          out->add_double_values(value.getDouble(i));
        else
          out->add_float_values(static_cast<float>(value.getDouble(i)));
      }
    } else {
      appendBytes(value, out->mutable_raw_data());
    }
  }

  /// Whether int_values can hold every element: all but u64 from 2^63 up.
  static bool intListIsExact(const DenseTensor& value) {
    if (value.type.dtype != DType::U64) return true;
    for (int64_t i = 0; i < value.numElements(); ++i)
      if (value.getInt(i) < 0) return false;
    return true;
  }

  /// The tensor's bytes, with bools normalized to 0/1 as the reader requires.
  static void appendBytes(const DenseTensor& value, std::string* out) {
    size_t start = out->size();
    out->append(value.bytes.begin(), value.bytes.end());
    if (value.type.dtype == DType::Bool)
      for (size_t i = start; i < out->size(); ++i) (*out)[i] = (*out)[i] != 0;
  }

  Status writeAttribute(const Attribute& a, proto::Attribute* out) {
    switch (a.kind()) {
      case AttrKind::Int:
        out->set_i(a.getInt());
        break;
      case AttrKind::Float:
        out->set_f(a.getFloat());
        break;
      case AttrKind::Bool:
        out->set_b(a.getBool());
        break;
      case AttrKind::String:
        KILN_TRY(checkText(a.getString(), "string attribute"));
        out->set_s(a.getString());
        break;
      case AttrKind::Ints:
        out->mutable_ints();  // sets the kind even when the list is empty
        for (int64_t v : a.getInts()) out->mutable_ints()->add_values(v);
        break;
      case AttrKind::Floats:
        out->mutable_floats();
        for (double v : a.getFloats()) out->mutable_floats()->add_values(v);
        break;
      case AttrKind::Tensor:
        writeTensor(a.getTensor(), out->mutable_tensor());
        break;
    }
    return Status::success();
  }

  Status writeNode(const Op& op, const ValueNames& names, proto::Node* node) {
    if (op.loc().kind == Location::Kind::Named) {
      KILN_TRY(checkText(op.loc().name, "node name"));
      node->set_name(op.loc().name);
    }
    node->set_op(std::string(op.name()));
    std::vector<TensorType> operandTypes;
    for (const Value* v : op.operands()) {
      node->add_inputs(names(v));
      operandTypes.push_back(v->type());
    }
    std::vector<TensorType> results;
    for (size_t i = 0; i < op.numResults(); ++i) {
      KILN_TRY(checkText(names(op.result(i)), "value name"));
      node->add_outputs(names(op.result(i)));
      results.push_back(op.result(i)->type());
    }
    for (const auto& [name, value] : op.attrs()) KILN_TRY(writeAttribute(value, &(*node->mutable_attributes())[name]));
    // Result types are written only where the reader could not infer the
    // same ones: ops that take them from the declaration, and results the
    // IR declares more (or less) precisely than the shape rule.
    auto inferred = inferResultTypes(ShapeQuery{op.kind(), operandTypes, &op.attrs(), {}, op.loc()});
    if (!inferred || *inferred != results)
      for (const TensorType& t : results) KILN_TRY(writeType(t, node->add_output_types()));
    return Status::success();
  }

  bool text_;
  ExternalSink* sink_;
};

Expected<std::string> serialize(const proto::Model& model, bool text) {
  if (model.ByteSizeLong() > static_cast<size_t>(kMaxProtobufBytes))
    return Error(
        "the model is larger than protobuf's 2 GiB limit; write it with an external data threshold "
        "(KilnWriteOptions::externalDataThreshold) so the weights go to a separate file");
  std::string out;
  if (text) {
    google::protobuf::TextFormat::Printer printer;
    printer.SetUseShortRepeatedPrimitives(true);
    out = "# Kiln model, text form (docs/format.md)\n";
    std::string body;
    if (!printer.PrintToString(model, &body)) return Error("cannot print the model as text");
    out += body;
  } else if (!model.SerializeToString(&out)) {
    return Error("cannot serialize the model");
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Module>> parseKilnModel(std::string_view bytes, bool text, std::string_view filename,
                                                 const std::string& baseDir) {
  std::string file(filename);
  if (static_cast<int64_t>(bytes.size()) > kMaxModelFileBytes)
    return Error(file + ": the model is " + std::to_string(bytes.size()) + " bytes, more than the limit of " +
                 std::to_string(kMaxModelFileBytes));
  if (static_cast<int64_t>(bytes.size()) > kMaxProtobufBytes)
    return Error(file + ": the model is larger than protobuf's 2 GiB limit; keep large weights in external data");
  proto::Model model;
  if (text) {
    google::protobuf::io::ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()));
    google::protobuf::TextFormat::Parser parser;
    FirstErrorCollector errors(file);
    parser.RecordErrorsTo(&errors);
    parser.SetRecursionLimit(32);
    if (!parser.Parse(&input, &model)) {
      // A model from a newer Kiln may fail only because of fields this
      // version does not know; say that rather than name the field.
      proto::Model lenient;
      google::protobuf::io::ArrayInputStream again(bytes.data(), static_cast<int>(bytes.size()));
      google::protobuf::TextFormat::Parser tolerant;
      FirstErrorCollector ignored(file);
      tolerant.RecordErrorsTo(&ignored);
      tolerant.SetRecursionLimit(32);
      tolerant.AllowUnknownField(true);
      if (tolerant.Parse(&again, &lenient) && lenient.format_version() > kFormatVersion)
        return ModelReader(file, baseDir).read(lenient);
      if (errors.error) return Error("malformed text model: " + errors.error->message(), errors.error->location());
      return Error(file + ": malformed text model");
    }
    if (auto field = findInvalidUtf8(model))
      return Error(file + ": malformed text model: a " + *field + " string is not valid UTF-8");
  } else if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Error(file + ": not a Kiln model (malformed binary protobuf; a text model must be named .kiln.txt)");
  }
  return ModelReader(file, baseDir).read(model);
}

Expected<std::unique_ptr<Module>> readKilnModel(const std::string& path) {
  auto text = isTextModelPath(path);
  if (!text) return Error(path + ": not a Kiln model file name (expected .kiln or .kiln.txt)");
  auto bytes = readFileBounded(path, kMaxModelFileBytes);
  if (!bytes) return bytes.takeError();
  fs::path dir = fs::path(path).parent_path();
  return parseKilnModel(*bytes, *text, path, dir.empty() ? std::string(".") : dir.string());
}

Expected<std::string> serializeKilnModel(const Module& module, bool text) {
  auto model = ModelWriter(text, nullptr).write(module);
  if (!model) return model.takeError();
  return serialize(*model, text);
}

Status writeKilnModel(const Module& module, const std::string& path, const KilnWriteOptions& options) {
  auto text = isTextModelPath(path);
  if (!text) return Error(path + ": not a Kiln model file name (expected .kiln or .kiln.txt)");
  std::string dataPath = path + ".data";
  ExternalSink sink{fs::path(dataPath).filename().string(), options.externalDataThreshold, {}};
  auto model = ModelWriter(*text, &sink).write(module);
  if (!model) return model.takeError();
  auto bytes = serialize(*model, *text);
  if (!bytes) return bytes.takeError();
  if (sink.data.empty()) return writeFileAtomically(path, *bytes);
  return writeFilesAtomically({FileContents{dataPath, sink.data}, FileContents{path, *bytes}});
}

}  // namespace kiln
