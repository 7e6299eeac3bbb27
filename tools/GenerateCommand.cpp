// `kiln generate`: text generation with a decoder-only model (token ids
// i64[batch, length] in, logits [batch, length, vocab] out), greedy or
// sampled with a temperature and top-k from a seeded generator. This file
// parses the options, reads and checks the prompt, compiles the programs
// in a Session and prints the new tokens and what the steps took; the
// model's roles, its programs (a prefill and a decode with a key/value
// cache, one at the longest length without) and the generate loop are the
// generation library's (generation/README.md, docs/generate.md).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <utility>

#include "driver/Session.h"
#include "generation/Decoder.h"
#include "generation/Generate.h"
#include "runtime/Npy.h"
#include "tools/DeviceSelection.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

using namespace generation;

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
    KILN_PRECISION_OPTIONS,
    {"--help", "", "show this help", false, "-h"},
};

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
  auto loaded = loadPrograms(modelPath, d, batch, promptLength, *newTokens, std::cerr);
  if (!loaded) return fail(loaded.error());
  std::vector<generation::Program>& programs = *loaded;
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
  auto precision = precisionOption(args);
  if (!precision) return usageError(kName, precision.error().message());
  sessionOptions.precision = *precision;
  if (onCuda) sessionOptions.device = "cuda:" + std::to_string(device.cuda.index);
  auto created = Session::create(sessionOptions);
  if (auto* error = std::get_if<DeviceError>(&created)) return fail(error->error);
  std::unique_ptr<Session> session = std::move(std::get<std::unique_ptr<Session>>(created));
  const auto compileStart = std::chrono::steady_clock::now();
  for (generation::Program& program : programs) {
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

  GenerateOptions options{
      .newTokens = *newTokens, .temperature = temperature, .topK = topK, .seed = seed, .modelPath = modelPath};
  auto generated = generate(programs, d, *prompt, options);
  if (!generated) return fail(generated.error());
  const Tensor& sequence = generated->sequence;
  const Tensor& stepLogits = generated->stepLogits;
  const double prefillSeconds = generated->prefillSeconds, decodeSeconds = generated->decodeSeconds;
  const std::string& updates = generated->cacheUpdates;
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