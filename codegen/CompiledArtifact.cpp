// Writing and reading `.kc` files (format in CompiledArtifact.h). The
// reader is a bounds-checked cursor over the bytes: every length, count and
// index is checked against what remains before it is used, so a truncated
// or corrupt file becomes an error naming the file and the section.
#include "codegen/CompiledArtifact.h"

#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "codegen/KernelCache.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace kiln::codegen {
namespace {

enum class Section : uint32_t { Target = 1, Module, Kernels, Plan, Objects, Weights };
constexpr Section kSectionOrder[] = {Section::Target, Section::Module,  Section::Kernels,
                                     Section::Plan,   Section::Objects, Section::Weights};
constexpr size_t kHashBytes = 32;

std::string_view sectionName(Section s) {
  switch (s) {
    case Section::Target: return "target";
    case Section::Module: return "module";
    case Section::Kernels: return "kernels";
    case Section::Plan: return "plan";
    case Section::Objects: return "objects";
    case Section::Weights: return "weights";
  }
  return "?";
}

/// Tensors of at least this many bytes go to the weights section.
constexpr size_t kElideBytes = 64;
/// Dims and element counts beyond this are not tensors Kiln wrote.
constexpr int64_t kMaxDim = int64_t{1} << 40;

void putLE(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

std::string hashOf(std::string_view payload) {
  // contentHash gives hex; the file stores the 32 raw bytes.
  const std::string hex = contentHash(payload);
  std::string raw;
  for (size_t i = 0; i < hex.size(); i += 2) raw += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return raw;
}

void putSection(std::string& out, Section kind, std::string_view payload) {
  putLE(out, static_cast<uint32_t>(kind), 4);
  putLE(out, 0, 4);
  putLE(out, payload.size(), 8);
  out += hashOf(payload);
  out.append(payload);
}

/// A bounds-checked cursor; errors name the file and what was being read.
class Reader {
 public:
  Reader(std::string_view bytes, std::string where) : bytes_(bytes), where_(std::move(where)) {}

  size_t remaining() const { return bytes_.size() - pos_; }
  Error error(const std::string& message) const { return Error(where_ + ": " + message); }

  Expected<uint64_t> uint(int bytes, std::string_view what) {
    if (remaining() < static_cast<size_t>(bytes))
      return error("truncated: " + std::string(what) + " needs " + std::to_string(bytes) + " bytes, " +
                   std::to_string(remaining()) + " remain");
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(bytes_[pos_ + i])} << (8 * i);
    pos_ += bytes;
    return v;
  }

  Expected<std::string_view> take(uint64_t n, std::string_view what) {
    if (n > remaining())
      return error("truncated: " + std::string(what) + " has " + std::to_string(n) + " bytes, " +
                   std::to_string(remaining()) + " remain");
    std::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  std::string_view bytes_;
  std::string where_;
  size_t pos_ = 0;
};

/// `key=value` lines.
std::map<std::string, std::string> parseKeyValues(std::string_view text) {
  std::map<std::string, std::string> values;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return values;
}

/// A zero-element tensor of `dtype`: the placeholder of an elided value.
std::shared_ptr<const DenseTensor> placeholder(DType dtype) {
  return std::make_shared<const DenseTensor>(DenseTensor{TensorType{dtype, staticShape({0})}, {}});
}

bool isPlaceholder(const DenseTensor& t, const TensorType& expected) {
  return t.bytes.empty() && t.type.shape == staticShape({0}) && expected.shape != t.type.shape;
}

void putTensor(std::string& out, uint8_t place, uint64_t index, const DenseTensor& t) {
  out += static_cast<char>(place);
  putLE(out, index, 8);
  const std::string_view name = dtypeName(t.type.dtype);
  out += static_cast<char>(name.size());
  out.append(name);
  putLE(out, t.type.shape.size(), 4);
  for (const Dim& d : t.type.shape) putLE(out, static_cast<uint64_t>(d.size), 8);
  putLE(out, t.bytes.size(), 8);
  out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

Expected<DenseTensor> readTensor(Reader& r) {
  auto nameSize = r.uint(1, "a weight's dtype");
  if (!nameSize) return nameSize.takeError();
  auto name = r.take(*nameSize, "a weight's dtype");
  if (!name) return name.takeError();
  const std::optional<DType> dtype = parseDType(*name);
  if (!dtype) return r.error("weights: unknown dtype '" + std::string(*name) + "'");
  auto rank = r.uint(4, "a weight's rank");
  if (!rank) return rank.takeError();
  if (*rank > 64) return r.error("weights: rank " + std::to_string(*rank) + " is more than 64");
  DenseTensor t;
  t.type.dtype = *dtype;
  int64_t elements = 1;
  for (uint64_t i = 0; i < *rank; ++i) {
    auto dim = r.uint(8, "a weight's dims");
    if (!dim) return dim.takeError();
    if (*dim > static_cast<uint64_t>(kMaxDim) || (elements && static_cast<int64_t>(*dim) > kMaxDim / elements))
      return r.error("weights: a tensor of more than 2^40 elements");
    elements *= static_cast<int64_t>(*dim);
    t.type.shape.push_back(Dim::fixed(static_cast<int64_t>(*dim)));
  }
  auto size = r.uint(8, "a weight's size");
  if (!size) return size.takeError();
  if (*size != static_cast<uint64_t>(elements) * dtypeSize(*dtype))
    return r.error("weights: a " + t.type.str() + " tensor with " + std::to_string(*size) + " bytes");
  auto bytes = r.take(*size, "a weight's data");
  if (!bytes) return bytes.takeError();
  t.bytes.assign(bytes->begin(), bytes->end());
  return t;
}

}  // namespace

std::string targetMismatch(const CompiledArtifact& artifact, const CpuMachine& host) {
  if (artifact.codegenVersion != kCpuCodegenVersion)
    return "its code generator is '" + artifact.codegenVersion + "', this Kiln's is '" +
           std::string(kCpuCodegenVersion) + "'";
  if (artifact.target.triple != host.triple)
    return "it was built for '" + artifact.target.triple + "', this machine is '" + host.triple + "'";
  if (artifact.target.cpu != host.cpu)
    return "it was built for CPU '" + artifact.target.cpu + "', this CPU is '" + host.cpu + "'";
  if (artifact.target.features != host.features) return "it was built for other CPU features than this CPU's";
  return "";
}

Expected<std::string> serializeArtifact(const CompiledArtifact& artifact) {
  if (!artifact.module || artifact.module->functions().size() != 1)
    return Error("a .kc holds a module of exactly one function");
  if (artifact.code.names.size() != artifact.code.hashes.size())
    return Error("a .kc needs a kernel IR hash per kernel");

  // The module without its large tensors, which go to the weights section.
  std::unique_ptr<Function> stripped = artifact.module->functions().front()->clone();
  Function& f = *stripped;
  std::string weights;
  uint32_t numWeights = 0;
  std::string weightEntries;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const DenseTensor* d = f.argumentDefault(i);
    if (!d || d->bytes.size() < kElideBytes) continue;
    putTensor(weightEntries, 1, i, *d);
    ++numWeights;
    f.setArgumentDefault(i, placeholder(d->type.dtype));
  }
  uint64_t constantIndex = 0;
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Constant) continue;
    const DenseTensor& d = op->getTensor("value");
    if (d.bytes.size() >= kElideBytes) {
      putTensor(weightEntries, 0, constantIndex, d);
      ++numWeights;
      op->setAttr("value", Attribute(DenseTensor(*placeholder(d.type.dtype))));
    }
    ++constantIndex;
  }
  putLE(weights, numWeights, 4);
  weights += weightEntries;

  std::string target = "triple=" + artifact.target.triple + "\ncpu=" + artifact.target.cpu +
                       "\nfeatures=" + artifact.target.features + "\ncodegen=" + artifact.codegenVersion +
                       "\nopt-level=" + std::to_string(artifact.optLevel) + "\n";
  std::string kernels;
  for (size_t i = 0; i < artifact.code.names.size(); ++i)
    kernels += artifact.code.names[i] + " " + artifact.code.hashes[i] + "\n";
  std::string objects;
  putLE(objects, artifact.code.objects.size(), 4);
  for (const std::string& o : artifact.code.objects) {
    putLE(objects, o.size(), 8);
    objects += o;
  }

  std::string out(kArtifactMagic);
  putLE(out, kArtifactVersion, 4);
  putLE(out, std::size(kSectionOrder), 4);
  putSection(out, Section::Target, target);
  putSection(out, Section::Module, print(*stripped));
  putSection(out, Section::Kernels, kernels);
  putSection(out, Section::Plan, artifact.memoryPlan);
  putSection(out, Section::Objects, objects);
  putSection(out, Section::Weights, weights);
  return out;
}

Expected<CompiledArtifact> parseArtifact(std::string_view bytes, const std::string& filename) {
  Reader file(bytes, filename);
  if (bytes.size() < kArtifactMagic.size() || bytes.substr(0, kArtifactMagic.size()) != kArtifactMagic)
    return file.error("not a Kiln compiled artifact (.kc): it does not start with the magic 'KILNKC'");
  if (auto magic = file.take(kArtifactMagic.size(), "the magic"); !magic) return magic.takeError();
  auto version = file.uint(4, "the format version");
  if (!version) return version.takeError();
  if (*version > kArtifactVersion || *version == 0)
    return file.error(
        "format version " + std::to_string(*version) + " is not readable by this Kiln, which reads .kc " +
        "format version " + std::to_string(kArtifactVersion) +
        (*version > kArtifactVersion ? " (the file was written by a newer Kiln; recompile the model)" : ""));
  auto count = file.uint(4, "the section count");
  if (!count) return count.takeError();
  if (*count != std::size(kSectionOrder))
    return file.error("has " + std::to_string(*count) + " sections, expected " +
                      std::to_string(std::size(kSectionOrder)));

  std::map<Section, std::string_view> sections;
  for (Section expected : kSectionOrder) {
    const std::string what = "the " + std::string(sectionName(expected)) + " section";
    auto kind = file.uint(4, what);
    if (!kind) return kind.takeError();
    if (*kind != static_cast<uint32_t>(expected))
      return file.error("corrupt: found section kind " + std::to_string(*kind) + " where " + what + " belongs");
    auto reserved = file.uint(4, what);
    if (!reserved) return reserved.takeError();
    auto size = file.uint(8, what);
    if (!size) return size.takeError();
    auto hash = file.take(kHashBytes, what + "'s checksum");
    if (!hash) return hash.takeError();
    auto payload = file.take(*size, what);
    if (!payload) return payload.takeError();
    if (*reserved != 0 || hashOf(*payload) != *hash)
      return file.error("corrupt: the checksum of " + what + " does not match its contents");
    sections[expected] = *payload;
  }
  if (file.remaining() != 0)
    return file.error("corrupt: " + std::to_string(file.remaining()) + " unexpected bytes after the last section");

  CompiledArtifact artifact;
  auto target = parseKeyValues(sections[Section::Target]);
  for (const char* key : {"triple", "cpu", "features", "codegen", "opt-level"})
    if (!target.count(key)) return file.error("the target section has no '" + std::string(key) + "'");
  artifact.target = {target["triple"], target["cpu"], target["features"]};
  artifact.codegenVersion = target["codegen"];
  const std::string& level = target["opt-level"];
  if (level.size() != 1 || level[0] < '0' || level[0] > '3')
    return file.error("the target section's opt-level '" + level + "' is not 0, 1, 2 or 3");
  artifact.optLevel = level[0] - '0';

  auto module = parseModule(sections[Section::Module], filename + " (module section)");
  if (!module) return module.takeError();
  if ((*module)->functions().size() != 1) return file.error("the module section must hold exactly one function");
  Function& f = *(*module)->functions().front();

  // Put the weights back where they were elided.
  Reader weights(sections[Section::Weights], filename + " (weights section)");
  auto numWeights = weights.uint(4, "the weight count");
  if (!numWeights) return numWeights.takeError();
  std::vector<Op*> constants;
  for (const auto& op : f.ops())
    if (op->kind() == OpKind::Constant) constants.push_back(op.get());
  for (uint64_t w = 0; w < *numWeights; ++w) {
    auto place = weights.uint(1, "a weight's place");
    if (!place) return place.takeError();
    auto index = weights.uint(8, "a weight's index");
    if (!index) return index.takeError();
    auto tensor = readTensor(weights);
    if (!tensor) return tensor.takeError();
    if (*place == 0) {
      if (*index >= constants.size() ||
          !isPlaceholder(constants[*index]->getTensor("value"), constants[*index]->result()->type()) ||
          constants[*index]->result()->type() != tensor->type)
        return weights.error("weight " + std::to_string(w) + " (" + tensor->type.str() + ") does not fit constant " +
                             std::to_string(*index) + " of the module");
      constants[*index]->setAttr("value", Attribute(std::move(*tensor)));
    } else if (*place == 1) {
      const DenseTensor* d = *index < f.numArguments() ? f.argumentDefault(*index) : nullptr;
      if (!d || !isPlaceholder(*d, tensor->type) || d->type.dtype != tensor->type.dtype)
        return weights.error("weight " + std::to_string(w) + " does not fit argument " + std::to_string(*index));
      f.setArgumentDefault(*index, std::make_shared<const DenseTensor>(std::move(*tensor)));
    } else {
      return weights.error("weight " + std::to_string(w) + " has an unknown place " + std::to_string(*place));
    }
  }
  if (weights.remaining() != 0) return weights.error("unexpected bytes after the last weight");
  KILN_TRY(verify(**module));
  artifact.module = std::move(*module);

  std::istringstream kernels{std::string(sections[Section::Kernels])};
  for (std::string line; std::getline(kernels, line);) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) return file.error("the kernels section has a line without a hash: '" + line + "'");
    artifact.code.names.push_back(line.substr(0, space));
    artifact.code.hashes.push_back(line.substr(space + 1));
  }
  artifact.memoryPlan = std::string(sections[Section::Plan]);

  Reader objects(sections[Section::Objects], filename + " (objects section)");
  auto numObjects = objects.uint(4, "the object count");
  if (!numObjects) return numObjects.takeError();
  for (uint64_t i = 0; i < *numObjects; ++i) {
    auto size = objects.uint(8, "an object's size");
    if (!size) return size.takeError();
    auto object = objects.take(*size, "an object");
    if (!object) return object.takeError();
    artifact.code.objects.emplace_back(*object);
  }
  if (objects.remaining() != 0) return objects.error("unexpected bytes after the last object");
  return artifact;
}

}  // namespace kiln::codegen
