// `kiln generate`: text generation with a decoder-only model (token ids
// i64[batch, length] in, logits [batch, length, vocab] out), greedy or
// sampled with a temperature and top-k from a seeded generator. Kiln
// compiles static shapes (codegen/cpu/CpuExecutable.h), so each program here is
// compiled once for the shapes it runs at and reused for every step:
//
// - A model exported with its key/value cache (docs/generate.md: inputs
//   input_ids, position and past_* caches of a fixed capacity, outputs
//   logits and the matching present_*) runs as two programs of the same
//   model: a prefill specialized to the prompt's length and a decode
//   specialized to one token. Each cache is donated (passes/MemoryPlan.h
//   ResultAlias): its new value is written into the cache's own buffer, in
//   place where the memory plan finds that safe.
// - A model without a cache is compiled once at the longest length the run
//   needs and recomputes the whole sequence each step, the positions after
//   the current one holding padding: in a causal model they cannot change
//   the logits before them. The first step checks that, by running twice
//   with different padding, and refuses a model whose logits depend on
//   later tokens.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <utility>

#include "driver/Session.h"
#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "ir/Verifier.h"
#include "passes/PassManager.h"
#include "runtime/InputCheck.h"
#include "runtime/Npy.h"
#include "tools/DeviceSelection.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "generate";

constexpr OptionSpec kOptions[] = {
    {"--prompt", "FILE.npy", "the prompt's token ids, i64[batch, length]"},
    {"--max-new-tokens", "N", "the number of tokens to generate for each sequence"},
    {"--temperature", "T", "sample from softmax(logits / T); 0 or absent: greedy (the most likely token)"},
    {"--top-k", "K", "with --temperature: sample among the K most likely tokens only"},
    {"--seed", "S", "with --temperature: the seed of the sampler (default: 0); the same seed gives the same tokens"},
    {"--output", "OUT.npy", "write the prompt followed by the new tokens, i64[batch, length + N]"},
    {"--step-logits", "FILE.npy", "write the logits each new token was chosen from, f32[batch, N, vocab]"},
    {"--device", "cpu|cuda[:N]|auto",
     "where to run (default: cpu); cuda never falls back to the CPU, auto takes CUDA when usable"},
    {"--interpret", "", "run on the reference interpreter instead of the CPU JIT"},
    {"--threads", "N", "CPU JIT: threads that split each kernel (default: all cores)"},
    {"--no-fallback", "", "CPU JIT: fail when an op cannot be compiled instead of using the interpreter"},
    {"--cache-dir", "DIR", "CPU JIT: the kernel cache folder (default: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln)"},
    {"--no-cache", "", "CPU JIT: neither read nor write the kernel cache"},
    {"--help", "", "show this help", false, "-h"},
};

/// A graph input or output as the file declares it.
struct Port {
  std::string name;
  TensorType type;
};

/// The model's data inputs (those without a default) and outputs, read
/// without specializing it: an ONNX model that computes shapes from a
/// dynamic length imports only once given static shapes.
struct Signature {
  std::vector<Port> inputs, outputs;
};

Expected<Signature> readSignature(const std::string& path) {
  Signature signature;
  if (path.ends_with(".onnx")) {
    auto onnx = readOnnxSignature(path);
    if (!onnx) return onnx.takeError();
    for (auto& [name, type] : onnx->inputs) signature.inputs.push_back({name, type});
    for (auto& [name, type] : onnx->outputs) signature.outputs.push_back({name, type});
    return signature;
  }
  auto module = loadVerifiedModel(path);
  if (!module) return module.takeError();
  if ((*module)->functions().empty()) return Error(path + ": the model holds no function to run");
  const Function& f = *(*module)->functions().front();
  for (size_t i = 0; i < f.numArguments(); ++i)
    if (!f.argumentDefault(i)) signature.inputs.push_back({f.argument(i)->name(), f.argument(i)->type()});
  for (size_t i = 0; i < f.resultTypes().size(); ++i)
    signature.outputs.push_back({f.resultName(i), f.resultTypes()[i]});
  return signature;
}

/// How kiln generate feeds a model (docs/generate.md).
struct Decoder {
  std::string ids;  // the token ids input, i64[batch, length]
  TensorType idsType;
  std::string logits;  // the logits output, [batch, length, vocab]
  TensorType logitsType;
  /// With a cache: the position input (the number of tokens already in the
  /// caches), and each cache: past_X in, present_X out.
  std::string position;
  TensorType positionType;
  struct Cache {
    std::string past, present;
    TensorType type;
  };
  std::vector<Cache> caches;
  bool cached() const { return !caches.empty(); }
};

/// The roles of the model's inputs and outputs, or an error naming what does
/// not fit a decoder-only model.
Expected<Decoder> decoderOf(const Signature& s, const std::string& path) {
  const std::string where = path + ": ";
  Decoder d;
  std::map<std::string, TensorType> outputs;
  for (const Port& p : s.outputs) outputs.emplace(p.name, p.type);
  // The token ids: the input named input_ids, else the one integer matrix.
  std::vector<const Port*> ids;
  for (const Port& p : s.inputs)
    if (p.name == "input_ids") ids = {&p};
  if (ids.empty())
    for (const Port& p : s.inputs)
      if (isInteger(p.type.dtype) && p.type.rank() == 2 && !p.name.starts_with("past_")) ids.push_back(&p);
  if (ids.size() != 1)
    return Error(where + (ids.empty() ? "no input takes token ids" : "several inputs could take the token ids") +
                 " (an integer input [batch, length], or one named input_ids); kiln generate runs decoder-only "
                 "models (docs/generate.md)");
  d.ids = ids[0]->name;
  d.idsType = ids[0]->type;
  if (d.idsType.dtype != DType::I64 || d.idsType.rank() != 2)
    return Error(where + "input '" + d.ids + "' is " + d.idsType.str() +
                 "; kiln generate feeds token ids as i64[batch, length]");
  // The logits: the output named logits, else the first.
  if (s.outputs.empty()) return Error(where + "the model has no output");
  const Port* logits = &s.outputs.front();
  for (const Port& p : s.outputs)
    if (p.name == "logits") logits = &p;
  d.logits = logits->name;
  d.logitsType = logits->type;
  if (!isFloat(d.logitsType.dtype) || d.logitsType.rank() != 3)
    return Error(where + "output '" + d.logits + "' is " + d.logitsType.str() +
                 "; kiln generate expects logits, a float tensor [batch, length, vocab]");

  for (const Port& p : s.inputs) {
    if (p.name == d.ids) continue;
    if (p.name.starts_with("past_")) {
      const std::string present = "present_" + p.name.substr(5);
      auto out = outputs.find(present);
      if (out == outputs.end())
        return Error(where + "cache input '" + p.name + "' has no output '" + present +
                     "' to take its new value from (docs/generate.md)");
      if (p.type.rank() != 4)
        return Error(where + "cache input '" + p.name + "' is " + p.type.str() +
                     "; kiln generate expects caches [batch, heads, capacity, head_dim] (docs/generate.md)");
      for (size_t k = 1; k < 4; ++k)
        if (!p.type.shape[k].isStatic())
          return Error(where + "cache input '" + p.name + "' is " + p.type.str() + ": dim " + std::to_string(k) +
                       " is not fixed; export the cache with a fixed capacity, only its batch (dim 0) may vary");
      bool sameType = out->second.dtype == p.type.dtype && out->second.rank() == 4;
      // Output dims the export left unknown are checked once specialized.
      for (size_t k = 1; sameType && k < 4; ++k)
        sameType = !out->second.shape[k].isStatic() || out->second.shape[k].size == p.type.shape[k].size;
      if (!sameType)
        return Error(where + "cache output '" + present + "' is " + out->second.str() + ", its input '" + p.name +
                     "' " + p.type.str() + "; they must have the same type");
      d.caches.push_back({p.name, present, p.type});
    } else if (p.name == "position") {
      d.position = p.name;
      d.positionType = p.type;
    } else {
      return Error(where + "input '" + p.name + "' (" + p.type.str() +
                   ") is neither the token ids, 'position' nor a cache 'past_*'; kiln generate feeds only those "
                   "(docs/generate.md)");
    }
  }
  if (d.cached() && d.position.empty())
    return Error(where + "the model has cache inputs (" + d.caches.front().past +
                 ", ...) but no input 'position' saying how many tokens the caches hold (docs/generate.md)");
  if (!d.cached() && !d.position.empty())
    return Error(where + "the model has an input 'position' but no cache inputs 'past_*' (docs/generate.md)");
  if (!d.position.empty() &&
      (!isInteger(d.positionType.dtype) ||
       !(d.positionType.rank() == 0 || (d.positionType.rank() == 1 && d.positionType.shape[0].size == 1))))
    return Error(where + "input 'position' is " + d.positionType.str() +
                 "; kiln generate expects an integer scalar (or one-element vector)");
  return d;
}

/// The capacity of the caches: the positions they hold, dim 2 of
/// [batch, heads, capacity, head_dim] (the smallest, should they differ).
int64_t cacheCapacity(const Decoder& d) {
  int64_t capacity = std::numeric_limits<int64_t>::max();
  for (const Decoder::Cache& c : d.caches) capacity = std::min(capacity, c.type.shape[2].size);
  return capacity;
}

/// `type` with symbolic dim 0 taken by `batch`.
std::vector<int64_t> withBatch(const TensorType& type, int64_t batch) {
  std::vector<int64_t> dims;
  for (size_t k = 0; k < type.shape.size(); ++k)
    dims.push_back(k == 0 && !type.shape[0].isStatic() ? batch : type.shape[k].size);
  return dims;
}

/// One program of the model: the model loaded for static input shapes, and
/// its argument and result indices by name.
struct Program {
  std::unique_ptr<Module> module;
  const Function* function = nullptr;
  std::vector<Tensor> inputs;  // one per argument, kept across steps
  size_t ids = 0, position = 0, logits = 0;
  std::vector<ResultAlias> aliases;  // present_X -> past_X
  std::unique_ptr<CompiledModel> compiled;
};

/// Loads `path` specialized to `shapes` and fills `program`'s indices and
/// zeroed inputs; a model whose specialized signature does not fit is an
/// error naming what.
Status loadProgram(const std::string& path, const Decoder& d, const std::map<std::string, std::vector<int64_t>>& shapes,
                   Program& program) {
  LoadOptions options;
  options.evaluator = &Session::evaluator();
  options.inputShapes = shapes;
  auto module = loadModel(path, options);
  if (!module) return module.takeError();
  if ((*module)->functions().empty()) return Error(path + ": the model holds no function to run");
  KILN_TRY(verify(**module));
  PassContext ctx;
  ctx.evaluator = &Session::evaluator();
  PassManager pm({}, ctx);
  KILN_TRY(pm.addPipeline("infer-shapes"));
  KILN_TRY(pm.run(**module, std::cerr));
  program.module = std::move(*module);
  const Function& f = *program.module->functions().front();
  program.function = &f;

  std::map<std::string, size_t> arguments, results;
  for (size_t i = 0; i < f.numArguments(); ++i) arguments[f.argument(i)->name()] = i;
  for (size_t i = 0; i < f.resultTypes().size(); ++i) results[f.resultName(i)] = i;
  // Each role's index by name; an import that renamed one is an error.
  std::string missing;
  auto index = [&](const std::map<std::string, size_t>& names, const std::string& name, const char* kind) {
    auto it = names.find(name);
    if (it != names.end()) return it->second;
    if (missing.empty()) missing = path + ": " + kind + " '" + name + "' is gone after import";
    return size_t{0};
  };
  program.ids = index(arguments, d.ids, "input");
  program.logits = index(results, d.logits, "output");
  if (d.cached()) {
    program.position = index(arguments, d.position, "input");
    for (const Decoder::Cache& c : d.caches)
      program.aliases.push_back({index(results, c.present, "output"), index(arguments, c.past, "input")});
  }
  if (!missing.empty()) return Error(missing);
  // Every input zeroed at its shape (arguments with a default take it);
  // each is checked against the specialized signature, so that a prompt
  // whose batch or length the model does not take is named here.
  SymbolBindings symbols;
  program.inputs.resize(f.numArguments());
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const std::string& name = f.argument(i)->name();
    if (const DenseTensor* dflt = f.argumentDefault(i); dflt && !shapes.count(name)) {
      program.inputs[i] = Tensor::fromDense(*dflt);
      continue;
    }
    auto shape = shapes.find(name);
    if (shape == shapes.end()) return Error(path + ": input '" + name + "' has no value");
    const DType dtype = name == d.ids ? DType::I64 : f.argument(i)->type().dtype;
    program.inputs[i] = Tensor(dtype, shape->second);
    if (auto problem = checkInput(name, f.argument(i)->type(), program.inputs[i], "from kiln generate", symbols))
      return Error(path + ": " + *problem);
  }
  const TensorType& logitsType = f.resultTypes()[program.logits];
  const std::vector<int64_t>& idsShape = shapes.at(d.ids);
  if (logitsType.rank() != 3 || !logitsType.isStatic() || logitsType.shape[0].size != idsShape[0] ||
      logitsType.shape[1].size != idsShape[1])
    return Error(path + ": output '" + d.logits + "' is " + logitsType.str() + " for input '" + d.ids + "' i64[" +
                 std::to_string(idsShape[0]) + "," + std::to_string(idsShape[1]) +
                 "]; kiln generate expects logits [batch, length, vocab] of the same batch and length");
  return Status::success();
}

/// For a model without a cache that loads at `loads` tokens but not at
/// `fails` (whose error is `failure`): the longest length it loads at, found
/// by bisection, and why it does not load at one more. A model with a table
/// of learned positions (GPT's position embedding) takes at most as many
/// tokens as the table has rows; past that, its position Gather fails when
/// the import folds it. Nullopt when it does not load at `loads` either.
std::optional<std::pair<int64_t, std::string>> longestLoadableLength(const std::string& path, const Decoder& d,
                                                                     int64_t batch, int64_t loads, int64_t fails,
                                                                     Error failure) {
  auto tryLength = [&](int64_t length) {
    Program probe;
    return loadProgram(path, d, {{d.ids, {batch, length}}}, probe);
  };
  if (!tryLength(loads)) return std::nullopt;
  while (fails - loads > 1) {
    const int64_t middle = loads + (fails - loads) / 2;
    if (Status s = tryLength(middle); s) {
      loads = middle;
    } else {
      fails = middle;
      failure = s.takeError();
    }
  }
  std::string why = failure.location().isUnknown() ? failure.message() : failure.str();
  // The reason without the file name the message starts with.
  if (why.starts_with(path + ": ")) why = why.substr(path.size() + 2);
  return std::pair{loads, why};
}

/// Picks the next token from one row of logits: the most likely (the first
/// of equals, as torch.argmax), or a sample of softmax(logits / temperature)
/// among the top-k.
class Sampler {
 public:
  Sampler(double temperature, int64_t topK, uint64_t seed) : temperature_(temperature), topK_(topK), rng_(seed) {}

  int64_t choose(const std::vector<double>& logits) {
    const int64_t vocab = static_cast<int64_t>(logits.size());
    if (temperature_ <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
    std::vector<int64_t> order(logits.size());
    for (int64_t i = 0; i < vocab; ++i) order[i] = i;
    const int64_t k = topK_ > 0 ? std::min(topK_, vocab) : vocab;
    // The k most likely, most likely first; equal logits in index order.
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    std::vector<double> weights(k);
    double total = 0;
    for (int64_t i = 0; i < k; ++i)
      total += weights[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature_);
    // A uniform double in [0, total) from 53 random bits, the same on every
    // standard library (std::uniform_real_distribution is not specified).
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double cumulative = 0;
    for (int64_t i = 0; i < k; ++i)
      if (u < (cumulative += weights[i])) return order[i];
    return order[k - 1];
  }

 private:
  double temperature_;
  int64_t topK_;
  std::mt19937_64 rng_;
};

/// Row `t` of batch `b` of logits [batch, length, vocab], as doubles.
std::vector<double> logitsRow(const Tensor& logits, int64_t b, int64_t t) {
  const int64_t length = logits.shape()[1], vocab = logits.shape()[2];
  std::vector<double> row(vocab);
  const int64_t base = (b * length + t) * vocab;
  for (int64_t v = 0; v < vocab; ++v) row[v] = logits.getDouble(base + v);
  return row;
}

/// "1 token", "5 tokens".
std::string count(int64_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

/// A message on stderr, `kiln generate: MESSAGE`.
void note(const std::string& message) { std::cerr << "kiln " << kName << ": " << message << "\n"; }

void printNotices(Session& session) {
  for (const std::string& notice : session.takeNotices()) std::cerr << "kiln " << kName << ": note: " << notice << "\n";
}

/// How each donated cache receives its new value in `program` (JIT only).
std::string cacheUpdates(Program& program) {
  codegen::CpuExecutor* executor = program.compiled->executor();
  if (!executor) return "";
  auto plan = executor->memoryPlan(program.inputs);
  if (!plan) return "";
  size_t inPlace = 0;
  std::string copied;
  for (const MemoryPlan::Alias& a : plan->aliases) {
    if (a.inPlace)
      ++inPlace;
    else if (copied.empty())
      copied = "; " + a.argumentName + " copied: " + a.whyCopied;
  }
  return std::to_string(inPlace) + " of " + std::to_string(plan->aliases.size()) + " caches updated in place" + copied;
}

int run(const ParsedArgs& args) {
  const auto& positionals = args.positionals();
  if (positionals.empty()) return usageError(kName, "missing the MODEL to generate with");
  if (positionals.size() > 1)
    return usageError(kName,
                      "unexpected argument '" + positionals[1] + "'; the prompt is given with --prompt FILE.npy");
  const std::string& modelPath = positionals[0];
  if (modelPath.ends_with(".kc"))
    return usageError(kName, "'" + modelPath +
                                 "' is a compiled program for one set of input shapes; kiln generate compiles its "
                                 "programs from the model itself (.onnx, .kiln, .kiln.txt, .kir)");
  const std::string* promptPath = args.get("--prompt");
  if (!promptPath) return usageError(kName, "missing --prompt FILE.npy (the token ids, i64[batch, length])");
  const std::string* maxNew = args.get("--max-new-tokens");
  if (!maxNew) return usageError(kName, "missing --max-new-tokens N");
  auto newTokens = parseInteger(*maxNew, "--max-new-tokens", 0, 1 << 20);
  if (!newTokens) return usageError(kName, newTokens.error().message());
  double temperature = 0;
  if (const std::string* t = args.get("--temperature")) {
    char* end = nullptr;
    temperature = std::strtod(t->c_str(), &end);
    if (t->empty() || *end || !std::isfinite(temperature) || temperature < 0)
      return usageError(kName, "--temperature expects a number >= 0 (0: greedy), got '" + *t + "'");
  }
  int64_t topK = 0;
  if (const std::string* k = args.get("--top-k")) {
    auto value = parseInteger(*k, "--top-k", 1, int64_t{1} << 40);
    if (!value) return usageError(kName, value.error().message());
    topK = *value;
  }
  uint64_t seed = 0;
  if (const std::string* s = args.get("--seed")) {
    auto value = parseInteger(*s, "--seed", 0, std::numeric_limits<int64_t>::max());
    if (!value) return usageError(kName, value.error().message());
    seed = static_cast<uint64_t>(*value);
  }
  for (std::string_view samplingOnly : {"--top-k", "--seed"})
    if (args.has(samplingOnly) && temperature <= 0)
      return usageError(kName, std::string(samplingOnly) + " applies to sampling: give --temperature T > 0 too");
  const bool interpretOnly = args.has("--interpret");
  codegen::CpuOptions cpuOptions;
  if (const std::string* n = args.get("--threads")) {
    if (interpretOnly) return usageError(kName, "--threads applies to the CPU JIT, not to --interpret");
    auto value = parseInteger(*n, "--threads", 1, 4096);
    if (!value) return usageError(kName, value.error().message());
    cpuOptions.threads = static_cast<int>(*value);
  }
  for (std::string_view jitOnly : {"--no-fallback", "--cache-dir", "--no-cache"})
    if (interpretOnly && args.has(jitOnly))
      return usageError(kName, std::string(jitOnly) + " applies to the CPU JIT, not to --interpret");
  if (args.has("--cache-dir") && args.has("--no-cache"))
    return usageError(kName, "--cache-dir and --no-cache contradict each other");
  cpuOptions.cacheDir = kernelCacheDir(args);
  for (std::string_view file : {"--output", "--step-logits"})
    if (const std::string* path = args.get(file); path && path->empty())
      return usageError(kName, std::string(file) + " needs a file name");
  DeviceChoice device;
  if (int status = selectDevice(kName, args.get("--device") ? *args.get("--device") : "cpu", device); status != kExitOk)
    return status;
  const bool onCuda = device.kind == DeviceChoice::Kind::Cuda;
  if (onCuda && interpretOnly) return usageError(kName, "--interpret runs on the CPU, not on --device cuda");

  auto fail = [](const Error& error) {
    reportError(kName, error);
    return kExitError;
  };
  // The prompt.
  auto prompt = readNpy(*promptPath);
  if (!prompt) return fail(Error("--prompt '" + *promptPath + "': " + prompt.error().message()));
  if (prompt->dtype() != DType::I64)
    return fail(Error("--prompt '" + *promptPath + "' holds " + std::string(dtypeName(prompt->dtype())) +
                      " values; token ids are i64 (convert with .astype(numpy.int64))"));
  if (prompt->rank() != 2)
    return fail(Error("--prompt '" + *promptPath + "' is " + prompt->type().str() +
                      "; token ids are a matrix [batch, length] (one sequence: ids[None, :])"));
  const int64_t batch = prompt->shape()[0], promptLength = prompt->shape()[1];
  if (batch == 0 || promptLength == 0)
    return fail(Error("--prompt '" + *promptPath + "' is " + prompt->type().str() +
                      "; it needs at least one sequence of at least one token"));
  const int64_t total = promptLength + *newTokens;

  // The model: what feeds it, then its programs.
  auto signature = readSignature(modelPath);
  if (!signature) return fail(signature.error());
  auto decoder = decoderOf(*signature, modelPath);
  if (!decoder) return fail(decoder.error());
  const Decoder& d = *decoder;
  // The longest sequence the model is run on: the last new token is chosen,
  // never fed.
  const int64_t longest = std::max(promptLength, total - 1);
  std::vector<Program> programs(1);
  if (d.cached()) {
    const int64_t capacity = cacheCapacity(d);
    if (longest > capacity)
      return fail(Error(modelPath + ": the prompt (" + count(promptLength, "token") + ") and " +
                        count(*newTokens, "new token") + " need " + std::to_string(longest) +
                        " positions of the cache, which holds " + std::to_string(capacity) + " ('" +
                        d.caches.front().past + "' is " + d.caches.front().type.str() +
                        "); export the model with a larger cache, or ask for fewer tokens"));
    // The prefill program takes the prompt, the decode program one token
    // (a one-token prompt needs only the latter).
    std::vector<int64_t> lengths = {promptLength};
    if (promptLength != 1) lengths.push_back(1);
    programs.resize(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) {
      std::map<std::string, std::vector<int64_t>> shapes{{d.ids, {batch, lengths[i]}}};
      shapes[d.position] = withBatch(d.positionType, batch);
      for (const Decoder::Cache& c : d.caches) shapes[c.past] = withBatch(c.type, batch);
      if (Status s = loadProgram(modelPath, d, shapes, programs[i]); !s) return fail(s.error());
    }
  } else {
    // Static length: the model's own; symbolic: the longest needed.
    const Dim& length = d.idsType.shape[1];
    if (length.isStatic() && longest > length.size)
      return fail(Error(modelPath + ": input '" + d.ids + "' is " + d.idsType.str() + ": the prompt (" +
                        count(promptLength, "token") + ") and " + count(*newTokens, "new token") + " need " +
                        std::to_string(longest) + " positions"));
    const int64_t runLength = length.isStatic() ? length.size : longest;
    if (Status s = loadProgram(modelPath, d, {{d.ids, {batch, runLength}}}, programs[0]); !s) {
      if (length.isStatic() || runLength <= promptLength) return fail(s.error());
      auto longestTaken = longestLoadableLength(modelPath, d, batch, promptLength, runLength, s.error());
      if (!longestTaken) return fail(s.error());
      return fail(Error(modelPath + ": the prompt (" + count(promptLength, "token") + ") and " +
                        count(*newTokens, "new token") + " need " + std::to_string(longest) +
                        " positions, and the model takes at most " + std::to_string(longestTaken->first) + " (at " +
                        std::to_string(longestTaken->first + 1) + ": " + longestTaken->second +
                        "); export the model with more positions, or ask for fewer tokens"));
    }
  }
  const int64_t vocab = programs[0].function->resultTypes()[programs[0].logits].shape[2].size;
  for (int64_t i = 0; i < prompt->numElements(); ++i)
    if (int64_t id = prompt->getInt(i); id < 0 || id >= vocab)
      return fail(Error("--prompt '" + *promptPath + "': token id " + std::to_string(id) + " at [" +
                        std::to_string(i / promptLength) + ", " + std::to_string(i % promptLength) +
                        "] is outside the model's vocabulary of " + std::to_string(vocab)));

  // The session and the programs, each compiled once.
  SessionOptions sessionOptions;
  sessionOptions.interpret = interpretOnly;
  sessionOptions.allowFallback = !args.has("--no-fallback");
  sessionOptions.cpu = cpuOptions;
  if (onCuda) sessionOptions.device = "cuda:" + std::to_string(device.cuda.index);
  auto created = Session::create(sessionOptions);
  if (auto* error = std::get_if<DeviceError>(&created)) return fail(error->error);
  std::unique_ptr<Session> session = std::move(std::get<std::unique_ptr<Session>>(created));
  const auto compileStart = std::chrono::steady_clock::now();
  for (Program& program : programs) {
    CompileOptions options;
    options.aliases = program.aliases;
    // On CUDA the caches stay on the device between decode steps.
    options.keepDonatedOnDevice = onCuda && !program.aliases.empty();
    auto compiled = session->compile(*program.function, options);
    if (!compiled) return fail(compiled.error());
    program.compiled = std::move(*compiled);
    if (*newTokens == 0) continue;
    Status prepared = program.compiled->prepare(program.inputs);
    printNotices(*session);
    if (!prepared) return fail(prepared.error());
  }
  const double compileSeconds = seconds(std::chrono::steady_clock::now() - compileStart);

  Sampler sampler(temperature, topK, seed);
  Tensor sequence(DType::I64, {batch, total});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < promptLength; ++t) sequence.setInt(b * total + t, prompt->getInt(b * promptLength + t));
  Tensor stepLogits(DType::F32, {batch, *newTokens, vocab});
  // Chooses token `step` of every sequence from row `row` of `logits`.
  auto choose = [&](const Tensor& logits, int64_t row, int64_t step) {
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<double> values = logitsRow(logits, b, row);
      for (int64_t v = 0; v < vocab; ++v) stepLogits.setDouble((b * *newTokens + step) * vocab + v, values[v]);
      sequence.setInt(b * total + promptLength + step, sampler.choose(values));
    }
  };
  auto runStep = [&](Program& program) -> Expected<Tensor> {
    // Every step runs a program compiled before the loop; one that would
    // compile again (its shapes changed) is a bug here, not a slow step.
    if (codegen::CpuExecutor* executor = program.compiled->executor();
        executor && !executor->isCompiled(program.inputs))
      return Error("internal error: a step of kiln generate would compile its program again");
    auto outputs = program.compiled->runInPlace(program.inputs);
    if (!outputs) return outputs.takeError();
    return std::move((*outputs)[program.logits]);
  };

  double prefillSeconds = 0, decodeSeconds = 0;
  std::string updates;  // how the caches were updated, for the report
  if (*newTokens > 0 && d.cached()) {
    Program& prefill = programs[0];
    Program& decode = programs.back();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < promptLength; ++t)
        prefill.inputs[prefill.ids].setInt(b * promptLength + t, prompt->getInt(b * promptLength + t));
    prefill.inputs[prefill.position].setInt(0, 0);
    auto start = std::chrono::steady_clock::now();
    auto logits = runStep(prefill);
    if (!logits) return fail(logits.error());
    choose(*logits, promptLength - 1, 0);
    if (Status s = prefill.compiled->syncDonated(); !s) return fail(s.error());
    prefillSeconds = seconds(std::chrono::steady_clock::now() - start);
    if (&decode != &prefill)
      for (const ResultAlias& a : prefill.aliases) {
        const std::string& name = prefill.function->argument(a.argument)->name();
        for (size_t i = 0; i < decode.function->numArguments(); ++i)
          if (decode.function->argument(i)->name() == name) decode.inputs[i] = std::move(prefill.inputs[a.argument]);
      }
    start = std::chrono::steady_clock::now();
    for (int64_t step = 1; step < *newTokens; ++step) {
      const int64_t position = promptLength + step - 1;
      for (int64_t b = 0; b < batch; ++b) decode.inputs[decode.ids].setInt(b, sequence.getInt(b * total + position));
      decode.inputs[decode.position].setInt(0, position);
      auto next = runStep(decode);
      if (!next) return fail(next.error());
      choose(*next, 0, step);
    }
    decodeSeconds = seconds(std::chrono::steady_clock::now() - start);
    updates = cacheUpdates(decode);
  } else if (*newTokens > 0) {
    Program& program = programs[0];
    const int64_t runLength = program.inputs[program.ids].shape()[1];
    // Fills the ids input with the first `length` tokens and `pad` after.
    auto feed = [&](int64_t length, int64_t pad) {
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t t = 0; t < runLength; ++t)
          program.inputs[program.ids].setInt(b * runLength + t, t < length ? sequence.getInt(b * total + t) : pad);
    };
    for (int64_t step = 0; step < *newTokens; ++step) {
      const int64_t length = promptLength + step;
      feed(length, 0);
      auto start = std::chrono::steady_clock::now();
      auto logits = runStep(program);
      if (!logits) return fail(logits.error());
      (step == 0 ? prefillSeconds : decodeSeconds) += seconds(std::chrono::steady_clock::now() - start);
      if (step == 0 && length < runLength) {
        // The padding must not reach the logits of the tokens before it.
        feed(length, vocab - 1);
        auto other = runStep(program);
        if (!other) return fail(other.error());
        for (int64_t b = 0; b < batch; ++b) {
          std::vector<double> x = logitsRow(*logits, b, length - 1), y = logitsRow(*other, b, length - 1);
          for (int64_t v = 0; v < vocab; ++v)
            if (!(std::abs(x[v] - y[v]) <= 1e-5 + 1e-4 * std::abs(x[v])))
              return fail(Error(modelPath + ": the logits at position " + std::to_string(length - 1) +
                                " change with the tokens after it (" + std::to_string(x[v]) + " and " +
                                std::to_string(y[v]) + " for token " + std::to_string(v) +
                                "); kiln generate needs a causal, decoder-only model"));
        }
      }
      choose(*logits, length - 1, step);
    }
  }
  printNotices(*session);

  // The new tokens, one line per sequence.
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t step = 0; step < *newTokens; ++step)
      std::cout << (step ? " " : "") << sequence.getInt(b * total + promptLength + step);
    std::cout << "\n";
  }
  if (*newTokens > 0) {
    const int64_t decodeSteps = *newTokens - 1;
    std::string stats = "compiled " + std::to_string(programs.size()) +
                        (programs.size() == 1 ? " program" : " programs (prefill, decode)") + " in " +
                        fixed(compileSeconds, 2) + " s; prefill " + count(promptLength, "token") + " x " +
                        std::to_string(batch) + " in " + fixed(prefillSeconds * 1e3, 2) + " ms";
    if (decodeSteps > 0)
      stats += "; decode " + count(decodeSteps, "step") + " in " + fixed(decodeSeconds * 1e3, 2) + " ms, " +
               fixed(static_cast<double>(batch * decodeSteps) / decodeSeconds, 1) + " tokens/s";
    if (!d.cached())
      stats += " (no cache: every step recomputes " + std::to_string(programs[0].inputs[programs[0].ids].shape()[1]) +
               " positions)";
    note(stats);
  }
  if (!updates.empty()) note(updates);
  for (const auto& [option, tensor] : {std::pair{"--output", &sequence}, std::pair{"--step-logits", &stepLogits}})
    if (const std::string* path = args.get(option))
      if (Status s = writeNpy(*path, *tensor); !s) return fail(s.error());
  return kExitOk;
}

}  // namespace

const Command& generateCommand() {
  static const Command command{
      kName,
      "generate tokens with a decoder-only model",
      "MODEL --prompt IDS.npy --max-new-tokens N [--temperature T [--top-k K] [--seed S]] [--output OUT.npy] "
      "[--device cpu|cuda[:N]|auto]",
      "Generates N tokens after each prompt in IDS.npy (i64[batch, length]) with MODEL, a decoder-only model\n"
      "(token ids i64[batch, length] in, logits [batch, length, vocab] out; docs/generate.md): greedy, or sampled\n"
      "from softmax(logits / T) among the top K with a seeded generator. Prints the new tokens, one line per\n"
      "sequence, and on stderr what was compiled and the tokens/s. A model exported with its key/value cache\n"
      "(inputs input_ids, position, past_*; outputs logits, present_*) runs as a prefill program and a one-token\n"
      "decode program, each compiled once, the caches updated in place; a model without one is compiled once at\n"
      "the longest length and recomputes the whole sequence each step.",
      kOptions,
      &run,
  };
  return command;
}

}  // namespace kiln::cli
