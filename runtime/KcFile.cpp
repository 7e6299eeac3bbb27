// Writing and reading `.kc` files (format in KcFile.h). Every length, count
// and index is checked against what remains before it is used
// (runtime/ByteIO.h), so a truncated or corrupt file becomes an error naming
// the file and the section.
#include "runtime/KcFile.h"

#include <cstring>
#include <map>
#include <new>
#include <set>
#include <sstream>

#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "runtime/Blake3.h"
#include "runtime/ByteIO.h"

namespace kiln {
namespace {

enum class Section : uint32_t { Target = 1, Module = 2, Plan = 4, Weights = 6, Program = 7, Code = 8, Stages = 9 };
constexpr Section kSectionOrder[] = {Section::Target, Section::Module, Section::Program, Section::Plan,
                                     Section::Code,   Section::Stages, Section::Weights};
constexpr size_t kHashBytes = 32;

std::string_view sectionName(Section s) {
  switch (s) {
    case Section::Target: return "target";
    case Section::Module: return "module";
    case Section::Program: return "program";
    case Section::Plan: return "plan";
    case Section::Code: return "code";
    case Section::Weights: return "weights";
    case Section::Stages: return "stages";
  }
  return "?";
}

/// Tensors of at least this many bytes go to the weights section.
constexpr size_t kElideBytes = 64;
/// Dims and element counts beyond this are not tensors Kiln wrote.
constexpr int64_t kMaxDim = int64_t{1} << 40;

std::string hashOf(std::string_view payload) {
  const std::array<uint8_t, 32> h = blake3(payload);
  return std::string(reinterpret_cast<const char*>(h.data()), h.size());
}

void putSection(std::string& out, Section kind, std::string_view payload) {
  putLE(out, static_cast<uint32_t>(kind), 4);
  putLE(out, 0, 4);
  putLE(out, payload.size(), 8);
  out += hashOf(payload);
  out.append(payload);
}

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

void putWeight(std::string& out, uint8_t place, uint64_t index, const Tensor& t) {
  out += static_cast<char>(place);
  putLE(out, index, 8);
  const std::string_view name = dtypeName(t.dtype());
  out += static_cast<char>(name.size());
  out.append(name);
  putLE(out, t.shape().size(), 4);
  for (int64_t d : t.shape()) putLE(out, static_cast<uint64_t>(d), 8);
  putLE(out, t.numBytes(), 8);
  out.append(reinterpret_cast<const char*>(t.raw()), t.numBytes());
}

/// A weight's header and its bytes, as the file holds them.
struct WeightEntry {
  DType dtype = DType::F32;
  std::vector<int64_t> dims;
  std::string_view bytes;
};

Expected<WeightEntry> readWeight(ByteReader& r) {
  auto nameSize = r.uint(1, "a weight's dtype");
  if (!nameSize) return nameSize.takeError();
  auto name = r.take(*nameSize, "a weight's dtype");
  if (!name) return name.takeError();
  const std::optional<DType> dtype = parseDType(*name);
  if (!dtype) return r.error("weights: unknown dtype '" + std::string(*name) + "'");
  auto rank = r.uint(4, "a weight's rank");
  if (!rank) return rank.takeError();
  if (*rank > 64) return r.error("weights: rank " + std::to_string(*rank) + " is more than 64");
  std::vector<int64_t> dims;
  int64_t elements = 1;
  for (uint64_t i = 0; i < *rank; ++i) {
    auto dim = r.uint(8, "a weight's dims");
    if (!dim) return dim.takeError();
    if (*dim > static_cast<uint64_t>(kMaxDim) || (elements && static_cast<int64_t>(*dim) > kMaxDim / elements))
      return r.error("weights: a tensor of more than 2^40 elements");
    elements *= static_cast<int64_t>(*dim);
    dims.push_back(static_cast<int64_t>(*dim));
  }
  auto size = r.uint(8, "a weight's size");
  if (!size) return size.takeError();
  if (*size != static_cast<uint64_t>(elements) * dtypeSize(*dtype))
    return r.error("weights: a " + TensorType{*dtype, staticShape(dims)}.str() + " tensor with " +
                   std::to_string(*size) + " bytes");
  auto bytes = r.take(*size, "a weight's data");
  if (!bytes) return bytes.takeError();
  return WeightEntry{*dtype, std::move(dims), *bytes};
}

/// Whether `name` can be a device's name: a plain word, as backends are
/// named (codegen/Backend.h).
bool isDeviceName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return false;
  return true;
}

/// Reads `.kc` bytes, with the weights copied into the program when
/// `copyWeights`; without, it only checks what a read would (for the writer,
/// which must never write a file its reader refuses).
Expected<CompiledArtifact> readArtifact(std::string_view bytes, const std::string& filename, bool copyWeights);

/// The target section: the host machine's triple, CPU and features, or
/// another device's name; the code generator's version, the optimization
/// level, and the precision unless fp32 (which older files, without the
/// key, are).
std::string targetSection(bool host, const CpuMachine& machine, std::string_view device,
                          const std::string& codegenVersion, int optLevel, Precision precision) {
  return (host ? "triple=" + machine.triple + "\ncpu=" + machine.cpu + "\nfeatures=" + machine.features
               : "device=" + std::string(device)) +
         "\ncodegen=" + codegenVersion + "\nopt-level=" + std::to_string(optLevel) + "\n" +
         (precision == Precision::FP32 ? "" : "precision=" + std::string(precisionName(precision)) + "\n");
}

}  // namespace

Expected<std::string> serializeArtifact(const Function& optimized, const Program& program, int optLevel,
                                        const std::string& memoryPlan, std::string_view device,
                                        std::string_view deviceCode, Precision precision) {
  if (!isDeviceName(device))
    return Error("a .kc's device is a plain word naming a backend (letters, digits, '-', '_'), not '" +
                 std::string(device) + "'");
  const bool host = device == kHostDevice;
  KILN_TRY(program.validate());
  // The module without its large tensors, which go to the weights section
  // (from the program, which holds the same values).
  std::unique_ptr<Function> stripped = optimized.clone();
  Function& f = *stripped;
  std::string weightEntries;
  uint32_t numWeights = 0;
  if (f.numArguments() != program.arguments.size())
    return Error("the program has " + std::to_string(program.arguments.size()) + " arguments, the module " +
                 std::to_string(f.numArguments()));
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const DenseTensor* d = f.argumentDefault(i);
    if (!d || d->bytes.size() < kElideBytes) continue;
    putWeight(weightEntries, 1, i, program.arguments[i].defaultValue);
    ++numWeights;
    f.setArgumentDefault(i, placeholder(d->type.dtype));
  }
  size_t constantIndex = 0;
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Constant) continue;
    if (constantIndex >= program.constants.size())
      return Error("the module has more constants than the program (" + std::to_string(program.constants.size()) + ")");
    const DenseTensor& d = op->getTensor("value");
    if (d.bytes.size() >= kElideBytes) {
      putWeight(weightEntries, 0, constantIndex, program.constants[constantIndex]);
      ++numWeights;
      op->setAttr("value", Attribute(DenseTensor(*placeholder(d.type.dtype))));
    }
    ++constantIndex;
  }
  if (constantIndex != program.constants.size())
    return Error("the module has " + std::to_string(constantIndex) + " constants, the program " +
                 std::to_string(program.constants.size()));
  std::string weights;
  putLE(weights, numWeights, 4);
  weights += weightEntries;

  const std::string target =
      targetSection(host, program.machine, device, program.codegenVersion, optLevel, precision);
  std::string out(kArtifactMagic);
  putLE(out, kArtifactVersion, 4);
  putLE(out, std::size(kSectionOrder), 4);
  putSection(out, Section::Target, target);
  putSection(out, Section::Module, print(*stripped));
  putSection(out, Section::Program, serializeProgram(program, kElideBytes));
  putSection(out, Section::Plan, memoryPlan);
  putSection(out, Section::Code, host ? std::string_view(program.sharedObject) : deviceCode);
  putSection(out, Section::Stages, "");
  putSection(out, Section::Weights, weights);
  // What was written must read back: the reader bounds dims, counts and
  // sizes, and a program over them (a result of 2^50 elements) is refused
  // now with the reader's words rather than written as a file that cannot
  // be run. The weights are checked, not copied.
  const std::string what = "the .kc of '" + optimized.name() + "'";
  auto check = readArtifact(out, what, false);
  if (check) {
    auto module = parseModule(check->moduleText, what + " (module section)");
    if (!module) check = module.takeError();
  }
  if (!check)
    return Error("cannot write a .kc that Kiln can read back: " +
                 (check.error().location().isUnknown() ? check.error().message() : check.error().str()));
  return out;
}

Expected<std::string> serializeStagedArtifact(const Function& source, const StagedProgram& staged, int optLevel,
                                              const std::string& plans, std::string_view device,
                                              const CpuMachine& machine, const std::string& codegenVersion,
                                              Precision precision) {
  if (!isDeviceName(device))
    return Error("a .kc's device is a plain word naming a backend (letters, digits, '-', '_'), not '" +
                 std::string(device) + "'");
  KILN_TRY(staged.validate());
  const bool host = device == kHostDevice;
  const std::string target = targetSection(host, machine, device, codegenVersion, optLevel, precision);
  std::string weights;
  putLE(weights, 0, 4);
  std::string out(kArtifactMagic);
  putLE(out, kArtifactVersion, 4);
  putLE(out, std::size(kSectionOrder), 4);
  putSection(out, Section::Target, target);
  putSection(out, Section::Module, print(source));
  putSection(out, Section::Program, "");
  putSection(out, Section::Plan, plans);
  putSection(out, Section::Code, "");
  putSection(out, Section::Stages, serializeStagedProgram(staged));
  putSection(out, Section::Weights, weights);
  // What was written must read back, as serializeArtifact checks.
  const std::string what = "the .kc of '" + source.name() + "'";
  auto check = readArtifact(out, what, true);
  if (check) {
    auto module = artifactModule(*check, what);
    if (!module) check = module.takeError();
  }
  if (!check)
    return Error("cannot write a .kc that Kiln can read back: " +
                 (check.error().location().isUnknown() ? check.error().message() : check.error().str()));
  return out;
}

Expected<CompiledArtifact> parseArtifact(std::string_view bytes, const std::string& filename) {
  return readArtifact(bytes, filename, true);
}

ArtifactSignature signatureOf(const CompiledArtifact& artifact) {
  ArtifactSignature s;
  if (artifact.staged) {
    const StagedProgram& p = *artifact.staged;
    s.name = p.name;
    s.arguments = p.arguments;
    s.resultNames = p.resultNames;
    s.resultTypes = p.resultTypes;
    return s;
  }
  const Program& p = *artifact.program;
  s.name = p.name;
  s.arguments = p.arguments;
  for (const Program::Result& r : p.results) {
    s.resultNames.push_back(r.name);
    s.resultTypes.push_back(p.slots[static_cast<size_t>(r.slot)].type);
  }
  return s;
}

namespace {

Expected<CompiledArtifact> readArtifact(std::string_view bytes, const std::string& filename, bool copyWeights) {
  ByteReader file(bytes, filename);
  if (bytes.size() < kArtifactMagic.size() || bytes.substr(0, kArtifactMagic.size()) != kArtifactMagic)
    return file.error("not a Kiln compiled artifact (.kc): it does not start with the magic 'KILNKC'");
  if (auto magic = file.take(kArtifactMagic.size(), "the magic"); !magic) return magic.takeError();
  auto version = file.uint(4, "the format version");
  if (!version) return version.takeError();
  if (*version != kArtifactVersion)
    return file.error(
        "format version " + std::to_string(*version) + " is not readable by this Kiln, which reads .kc " +
        "format version " + std::to_string(kArtifactVersion) +
        (*version > kArtifactVersion ? " (the file was written by a newer Kiln; recompile the model)"
                                     : " (the file was written by an older Kiln; compile the model again)"));
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

  auto target = parseKeyValues(sections[Section::Target]);
  CompiledArtifact artifact;
  // A program for the host names its machine; one for another device
  // names the device, whose backend reads the code section.
  artifact.device = std::string(kHostDevice);
  if (target.count("device")) {
    if (!isDeviceName(target["device"]) || target["device"] == kHostDevice)
      return file.error("the target section's device '" + target["device"] +
                        "' is not the name of a device other than the host's");
    artifact.device = target["device"];
  }
  const bool host = artifact.device == kHostDevice;
  for (const char* key : {"triple", "cpu", "features", "codegen", "opt-level"})
    if (!target.count(key) && (host || std::string_view(key) == "codegen" || std::string_view(key) == "opt-level"))
      return file.error("the target section has no '" + std::string(key) + "'");
  const std::string& level = target["opt-level"];
  if (level.size() != 1 || level[0] < '0' || level[0] > '3')
    return file.error("the target section's opt-level '" + level + "' is not 0, 1, 2 or 3");
  artifact.optLevel = level[0] - '0';
  if (target.count("precision")) {
    auto precision = parsePrecision(target["precision"]);
    if (!precision) return file.error("the target section's precision: " + precision.error().message());
    artifact.precision = *precision;
  }

  artifact.moduleText = std::string(sections[Section::Module]);
  artifact.memoryPlan = std::string(sections[Section::Plan]);
  if (!sections[Section::Stages].empty()) {
    // A program with host steps: its parts hold everything.
    if (!sections[Section::Program].empty() || !sections[Section::Code].empty() ||
        sections[Section::Weights] != std::string_view("\0\0\0\0", 4))
      return file.error("corrupt: a program with host steps has a program, code or weights section");
    artifact.staged = std::make_shared<StagedProgram>();
    StagedProgram& staged = *artifact.staged;
    KILN_TRY(parseStagedProgram(sections[Section::Stages], filename + " (stages section)", staged));
    // The target section is the truth, as for one program.
    for (Program& part : staged.programs) {
      part.machine = {target["triple"], target["cpu"], target["features"]};
      part.codegenVersion = target["codegen"];
      if (!host) part.sharedObject.clear();
    }
    if (Status s = staged.validate(); !s) return file.error("corrupt: " + s.error().message());
    return artifact;
  }
  artifact.program = std::make_shared<Program>();
  Program& program = *artifact.program;
  KILN_TRY(parseProgram(sections[Section::Program], filename + " (program section)", program));
  // The target section is what a reader of the file sees; it is the truth.
  program.machine = {target["triple"], target["cpu"], target["features"]};
  program.codegenVersion = target["codegen"];
  if (host)
    program.sharedObject = std::string(sections[Section::Code]);
  else
    artifact.deviceCode = std::string(sections[Section::Code]);

  // The large tensors, into the program.
  ByteReader weights(sections[Section::Weights], filename + " (weights section)");
  auto numWeights = weights.uint(4, "the weight count");
  if (!numWeights) return numWeights.takeError();
  std::set<std::pair<uint64_t, uint64_t>> filled;  // (place, index) when not copying
  for (uint64_t w = 0; w < *numWeights; ++w) {
    auto place = weights.uint(1, "a weight's place");
    if (!place) return place.takeError();
    auto index = weights.uint(8, "a weight's index");
    if (!index) return index.takeError();
    auto entry = readWeight(weights);
    if (!entry) return entry.takeError();
    const TensorType type{entry->dtype, staticShape(entry->dims)};
    Tensor* slot = nullptr;
    if (*place == 0 && *index < program.constants.size())
      slot = &program.constants[*index];
    else if (*place == 1 && *index < program.arguments.size() && program.arguments[*index].hasDefault)
      slot = &program.arguments[*index].defaultValue;
    else if (*place > 1)
      return weights.error("weight " + std::to_string(w) + " has an unknown place " + std::to_string(*place));
    if (!slot || slot->numBytes() != 0 || !filled.emplace(*place, *index).second)
      return weights.error("weight " + std::to_string(w) + " (" + type.str() + ") fills no elided " +
                           (*place == 0 ? "constant " : "argument default ") + std::to_string(*index));
    if (!copyWeights) continue;
    // A weight is as large as the model makes it: running out of memory
    // is an error naming it.
    try {
      *slot = Tensor::fromBytes(entry->dtype, std::move(entry->dims), entry->bytes);
    } catch (const std::bad_alloc&) {
      return Error(filename + ": " +
                   allocationError(entry->bytes.size(),
                                   *place == 0 ? "constant " + std::to_string(*index)
                                               : "the default of argument '" + program.arguments[*index].name + "'",
                                   type)
                       .message());
    }
  }
  if (weights.remaining() != 0) return weights.error("unexpected bytes after the last weight");
  // Without the weights, the program's constants are incomplete; the writer
  // validated the program it was given.
  if (!copyWeights) return artifact;
  if (Status s = program.validate(); !s) return file.error("corrupt: " + s.error().message());
  return artifact;
}

}  // namespace

Expected<std::unique_ptr<Module>> artifactModule(const CompiledArtifact& artifact, const std::string& filename) {
  auto module = parseModule(artifact.moduleText, filename + " (module section)");
  if (!module) return module.takeError();
  if ((*module)->functions().size() != 1)
    return Error(filename + ": the module section must hold exactly one function");
  Function& f = *(*module)->functions().front();
  const std::string where = filename + " (module section): ";
  if (artifact.staged) {
    // Stored whole: the function with its control flow.
    if (f.numArguments() != artifact.staged->arguments.size())
      return Error(where + "its function has " + std::to_string(f.numArguments()) + " arguments, the program " +
                   std::to_string(artifact.staged->arguments.size()));
    KILN_TRY(verify(**module));
    return module;
  }
  const Program& program = *artifact.program;
  if (f.numArguments() != program.arguments.size())
    return Error(where + "its function has " + std::to_string(f.numArguments()) + " arguments, the program " +
                 std::to_string(program.arguments.size()));
  // The elided tensors come back from the program, which holds them.
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const DenseTensor* d = f.argumentDefault(i);
    if (!d || !isPlaceholder(*d, f.argument(i)->type())) continue;
    const Program::Argument& a = program.arguments[i];
    if (!a.hasDefault || a.defaultValue.dtype() != d->type.dtype)
      return Error(where + "argument " + std::to_string(i) + "'s default is not in the program");
    f.setArgumentDefault(i, std::make_shared<const DenseTensor>(a.defaultValue.toDense()));
  }
  size_t constantIndex = 0;
  for (const auto& op : f.ops()) {
    if (op->kind() != OpKind::Constant) continue;
    if (constantIndex >= program.constants.size())
      return Error(where + "it has more constants than the program (" + std::to_string(program.constants.size()) + ")");
    const Tensor& value = program.constants[constantIndex++];
    if (isPlaceholder(op->getTensor("value"), op->result()->type())) {
      if (value.type() != op->result()->type())
        return Error(where + "constant " + std::to_string(constantIndex - 1) + " is " + op->result()->type().str() +
                     ", the program's is " + value.type().str());
      op->setAttr("value", Attribute(value.toDense()));
    }
  }
  if (constantIndex != program.constants.size())
    return Error(where + "it has " + std::to_string(constantIndex) + " constants, the program " +
                 std::to_string(program.constants.size()));
  KILN_TRY(verify(**module));
  return module;
}

}  // namespace kiln
