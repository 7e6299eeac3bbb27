// `kiln run`: loads a model, binds its inputs by name from .npy files, runs
// it with the CPU JIT (codegen/cpu/CpuExecutable.h) or, with --interpret, on the
// reference interpreter, and writes or prints its outputs; with --bench it
// times repeated runs instead. When the JIT cannot lower some op yet, the
// whole model runs on the interpreter and a notice on stderr names the ops
// (--no-fallback makes that an error); any other JIT failure is an error. Every input is checked against
// the model's signature before anything runs, and all problems with the
// inputs are reported together, each naming the input and the type it
// expects, because a user fixing one mistake at a time would otherwise run
// the tool once per input.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "codegen/cpu/CpuCompiler.h"
#include "codegen/cpu/CpuExecutable.h"
#include "driver/Session.h"
#include "codegen/llvm/CpuJit.h"
#include "frontend/Model.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"
#include "passes/PassManager.h"
#include "runtime/InputCheck.h"
#include "runtime/Interpreter.h"
#include "runtime/KcFile.h"
#include "runtime/Npy.h"
#include "codegen/cuda/CudaExecutor.h"
#include "runtime/cuda/CudaProgram.h"
#include "runtime/openmp/OpenMpWaitPolicy.h"
#include "tools/DeviceSelection.h"
#include "tools/KilnCommands.h"
#include "tools/TensorPrinter.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "run";

constexpr OptionSpec kOptions[] = {
    {"--input", "NAME=FILE.npy", "bind the model input NAME to the array in FILE.npy", true},
    {"--output-dir", "DIR", "write each output to DIR/<output name>.npy instead of printing it"},
    {"--device", "cpu|cuda[:N]|auto",
     "where to run (default: cpu); cuda never falls back to the CPU, auto takes CUDA when usable"},
    {"--bench", "N", "after warm-up runs, time N runs and print the median, min and max in ms"},
    {"--warmup", "N", "untimed runs before the timed ones of --bench (default: 1)"},
    {"--json", "", "with --bench: print the timings as one JSON object (on CUDA with device_ms, copy_in_ms, copy_out_ms and staging_ms, medians of the parts of a run)"},
    {"--interpret", "", "run on the reference interpreter instead of the CPU JIT"},
    {"--threads", "N", "CPU JIT: threads that split each kernel (default: all cores)"},
    {"--no-fallback", "", "CPU JIT: fail when an op cannot be compiled instead of using the interpreter"},
    {"--time-passes", "", "CPU JIT: print the time of each pass and code generation phase to stderr"},
    {"--profile", "", "after the runs (with --bench, the timed ones), print each kernel's and library call's time (and GFLOP/s) to stderr; on CUDA timed with CUDA events, with graph replay off"},
    {"--profile-rows", "N", "with --profile: the number of steps listed, largest first (default: 40; 0: all)"},
    {"--cache-dir", "DIR", "CPU JIT: the kernel cache folder (default: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln)"},
    {"--no-cache", "", "CPU JIT: neither read nor write the kernel cache"},
    {"--recompile", "", ".kc: ignore its machine code and compile its stored program for this machine"},
    {"--no-cuda-graph", "", "CUDA: launch every step each run instead of replaying a captured CUDA graph"},
    KILN_PRECISION_OPTIONS,
    {"--memory-stats", "", "print the memory statistics at the end: on CUDA the device's (allocated, reserved, peaks, cache hits), on the CPU the compiled programs' (arena, constants, results, peaks)"},
    {"--cuda-memory-limit", "BYTES", "CUDA: the most device memory Kiln may reserve, e.g. 2GiB or 512MiB"},
    {"--help", "", "show this help", false, "-h"},
};

/// The name a caller knows argument `i` of `f` by.
std::string inputName(const Function& f, size_t i) {
  const std::string& name = f.argument(i)->name();
  return name.empty() ? "#" + std::to_string(i) : name;
}

/// The name result `i` of `f` is written and printed under.
std::string outputName(const Function& f, size_t i) {
  const std::string& name = f.resultName(i);
  return name.empty() ? "output_" + std::to_string(i) : name;
}

std::string describeInputs(const Function& f) {
  std::string list;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    list += (i ? ", " : "") + inputName(f, i) + " (" + f.argument(i)->type().str() +
            (f.argumentDefault(i) ? ", optional" : "") + ")";
  }
  return list.empty() ? "none" : list;
}

/// The tensor read from each --input file (or why it could not be read).
using ReadInputs = std::map<std::string, Expected<Tensor>, std::less<>>;

/// One tensor per argument of `f`, from the --input files (already read into
/// `read`, whose tensors are moved out) and the arguments' defaults; every
/// problem is printed, then nullopt returned.
std::optional<std::vector<Tensor>> bindInputs(const Function& f,
                                              const std::vector<std::pair<std::string, std::string>>& given,
                                              ReadInputs& read) {
  std::vector<std::string> problems;
  std::map<std::string, std::string, std::less<>> files(given.begin(), given.end());
  std::set<std::string, std::less<>> known;
  for (size_t i = 0; i < f.numArguments(); ++i) known.insert(inputName(f, i));
  for (const auto& [name, file] : given)
    if (!known.count(name))
      problems.push_back("unknown input '" + name + "'; the model's inputs are: " + describeInputs(f));

  std::vector<Tensor> inputs(f.numArguments());
  SymbolBindings symbols;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const std::string name = inputName(f, i);
    const TensorType& expected = f.argument(i)->type();
    std::string source;
    if (auto it = files.find(name); it != files.end()) {
      Expected<Tensor>& tensor = read.at(name);
      if (!tensor) {
        problems.push_back("input '" + name + "': " + tensor.error().message());
        continue;
      }
      inputs[i] = std::move(*tensor);
      source = "from '" + it->second + "'";
    } else if (const DenseTensor* dflt = f.argumentDefault(i)) {
      auto value = Tensor::copyOf(*dflt, "the default of input '" + name + "'");
      if (!value) {
        problems.push_back(value.error().message());
        continue;
      }
      inputs[i] = std::move(*value);
      source = "from its default";
    } else {
      problems.push_back("missing input '" + name + "' (expects " + expected.str() + "); pass --input " + name +
                         "=FILE.npy");
      continue;
    }
    if (auto problem = checkInput(name, expected, inputs[i], source, symbols)) problems.push_back(*problem);
  }
  if (problems.empty()) return inputs;
  for (const std::string& p : problems) reportError(kName, Error(p));
  return std::nullopt;
}

/// The file name for output `name`: path separators and control characters
/// become '_', so that an output can never be written outside DIR.
Expected<std::string> outputFileName(const std::string& name) {
  if (name == "." || name == "..")
    return Error("output '" + name + "' is refused as a file name: '.' and '..' name folders, not outputs");
  if (name.size() > 200) return Error("output name '" + name.substr(0, 40) + "...' is too long for a file name");
  std::string file;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    file += (c == '/' || c == '\\' || u < 0x20 || u == 0x7f) ? '_' : c;
  }
  return file + ".npy";
}

/// Writes every output to `dir`. All files are serialized and named first,
/// so that a problem with any output (a bf16 tensor, two names mapping to
/// one file) writes nothing; each file is then written atomically.
int writeOutputs(const Function& f, const std::vector<Tensor>& outputs, const std::string& dir) {
  std::vector<std::pair<std::filesystem::path, std::string>> files;
  std::map<std::string, std::string> owner;  // file name -> output name
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string name = outputName(f, i);
    auto file = outputFileName(name);
    if (!file) {
      reportError(kName, file.takeError());
      return kExitError;
    }
    if (auto [it, inserted] = owner.emplace(*file, name); !inserted) {
      reportError(kName,
                  Error("outputs '" + it->second + "' and '" + name + "' would both be written to '" + *file + "'"));
      return kExitError;
    }
    if (*file != name + ".npy")
      std::cerr << "kiln run: note: output '" << name << "' is written to '" << *file << "'\n";
    auto bytes = serializeNpy(outputs[i]);
    if (!bytes) {
      reportError(kName, Error("output '" + name + "': " + bytes.error().message()));
      return kExitError;
    }
    files.emplace_back(std::filesystem::path(dir) / *file, std::move(*bytes));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    reportError(kName, Error("cannot create the output folder '" + dir +
                             "': " + (ec ? ec.message() : std::string("a file of that name exists"))));
    return kExitError;
  }
  for (const auto& [path, bytes] : files) {
    if (Status s = writeFileAtomically(path.string(), bytes); !s) {
      reportError(kName, s.takeError());
      return kExitError;
    }
  }
  return kExitOk;
}

void printOutputs(const Function& f, const std::vector<Tensor>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i) std::cout << "\n";
    std::cout << outputName(f, i) << ": " << outputs[i].type().str() << "\n" << formatTensor(outputs[i]) << "\n";
  }
}

/// Runs the model once on its inputs: the JIT's kernels or the interpreter.
/// The inputs are taken by value because the interpreter consumes them.
using Runner = std::function<Expected<std::vector<Tensor>>(std::vector<Tensor>)>;

/// The last run's copies and device times on CUDA (cuda::CudaRunStats), or
/// null (the CPU, or a CUDA model run in stages).
using RunStats = std::function<const cuda::CudaRunStats*()>;

/// Runs `runner` `warmup` times untimed, then `runs` times timed; prints the
/// statistics. `last` receives the outputs of the final run; `profile`, when
/// given, keeps the step times of the timed runs only. On CUDA (`stats`),
/// each run's time is also split into the device's steps, its copies in and
/// out, and the host's staging copies, each reported as a median.
int bench(const Runner& runner, const std::vector<Tensor>& inputs, int64_t warmup, int64_t runs, bool json,
          const std::string& model, const std::string& device, std::vector<Tensor>& last,
          codegen::StepProfile* profile, const RunStats& stats) {
  std::vector<double> times, deviceMs, copyInMs, copyOutMs, stagingMs;
  for (int64_t k = 0; k < warmup + runs; ++k) {
    if (k == warmup && profile) profile->entries.clear();  // only the timed runs
    std::vector<Tensor> copy = inputs;  // copying is not timed
    auto start = std::chrono::steady_clock::now();
    auto outputs = runner(std::move(copy));
    auto stop = std::chrono::steady_clock::now();
    if (!outputs) {
      reportError(kName, outputs.takeError());
      return kExitError;
    }
    if (k >= warmup) {
      times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
      if (const cuda::CudaRunStats* s = stats ? stats() : nullptr; s && s->timed) {
        deviceMs.push_back(s->deviceMs);
        copyInMs.push_back(s->copyInMs);
        copyOutMs.push_back(s->copyOutMs);
        stagingMs.push_back(s->stagingMs);
      }
    }
    last = std::move(*outputs);
  }
  const size_t n = times.size();
  const auto [fastest, slowest] = std::minmax_element(times.begin(), times.end());
  const std::string runMs = millis(median(times)), minMs = millis(*fastest), maxMs = millis(*slowest);
  const bool split = deviceMs.size() == n;
  const std::string onDevice = split ? millis(median(deviceMs)) : "", copyIn = split ? millis(median(copyInMs)) : "",
                    copyOut = split ? millis(median(copyOutMs)) : "", staging = split ? millis(median(stagingMs)) : "";
  if (json) {
    std::cout << "{\"model\": " << jsonString(model) << ", \"device\": " << jsonString(device) << ", \"runs\": " << n
              << ", \"median_ms\": " << runMs << ", \"min_ms\": " << minMs << ", \"max_ms\": " << maxMs;
    if (split)
      std::cout << ", \"device_ms\": " << onDevice << ", \"copy_in_ms\": " << copyIn << ", \"copy_out_ms\": " << copyOut
                << ", \"staging_ms\": " << staging;
    std::cout << "}\n";
  } else {
    std::cout << "median " << runMs << " ms, min " << minMs << " ms, max " << maxMs << " ms (" << n << " runs)\n";
    if (split)
      std::cout << "of which (medians): on the device " << onDevice << " ms, copies to it " << copyIn << " ms and back "
                << copyOut << " ms; host copies into and out of pinned staging " << staging << " ms\n";
  }
  return kExitOk;
}

/// The session's notices (kernel cache problems, the interpreter fallback)
/// on stderr.
void printNotices(Session& session) {
  for (const std::string& notice : session.takeNotices()) std::cerr << "kiln " << kName << ": note: " << notice << "\n";
}

/// The session's notices and, with --time-passes, the compile time report, on stderr.
void printCompileNotices(Session& session, const codegen::CompileReport* report) {
  printNotices(session);
  if (report) std::cerr << report->passTimings << codegen::formatCompileReport(*report);
}

/// Loads `modelPath` specialized to the inputs read from `given`'s files
/// (their shapes, and for ONNX models that compute shapes from input values,
/// those values; such inputs are dropped from `given` with a note), verified
/// and with shapes inferred.
Expected<std::unique_ptr<Module>> loadSpecialized(const std::string& modelPath,
                                                  std::vector<std::pair<std::string, std::string>>& given,
                                                  const ReadInputs& read) {
  LoadOptions loadOptions;
  loadOptions.evaluator = &Session::evaluator();
  loadOptions.gradients = &buildGradients;
  std::map<std::string, DenseTensor> givenTensors;
  for (const auto& [name, tensor] : read)
    if (tensor) givenTensors[name] = tensor->toDense();
  // A sequence input is bound element by element (--input NAME.0=...), an
  // optional one by its name or not at all (frontend/Model.h).
  auto values = groupGraphValues(modelPath, givenTensors);
  if (!values) return values.takeError();
  auto specialized = loadModelForInputs(modelPath, loadOptions, *values);
  if (!specialized) return specialized.takeError();
  auto module = std::move(specialized->module);
  for (const std::string& name : specialized->frozenInputs) {
    std::cerr << "kiln run: note: input '" << name << "' is fixed at import time (the model computes shapes from it)\n";
    std::erase_if(given, [&](const auto& g) { return g.first == name; });
  }
  if (module->functions().empty()) return Error(modelPath + ": the model holds no function to run");
  // Shapes are refined once before running, so that the interpreter sees
  // the same types every later backend will compile.
  PassContext ctx;
  ctx.evaluator = &Session::evaluator();
  PassManager pm({}, ctx);
  KILN_TRY(verify(*module));
  KILN_TRY(pm.addPipeline("infer-shapes"));
  KILN_TRY(pm.run(*module, std::cerr));
  return module;
}

/// Reads a `.kc` file written by kiln compile.
Expected<CompiledArtifact> readArtifact(const std::string& path) {
  auto bytes = readFileBounded(path, int64_t{1} << 36);
  if (!bytes) return bytes.takeError();
  return parseArtifact(*bytes, path);
}

/// A function with the signature of `artifact`'s program (one program or
/// one with host steps) and no body: its arguments (names, types,
/// defaults) bind the inputs and its result names name the outputs,
/// without parsing the `.kc`'s module.
std::unique_ptr<Function> signatureFunction(const CompiledArtifact& artifact) {
  const ArtifactSignature signature = signatureOf(artifact);
  auto f = std::make_unique<Function>(signature.name);
  for (size_t i = 0; i < signature.arguments.size(); ++i) {
    const Program::Argument& a = signature.arguments[i];
    f->addArgument(a.type, a.name);
    if (a.hasDefault) f->setArgumentDefault(i, std::make_shared<const DenseTensor>(a.defaultValue.toDense()));
  }
  f->setResultTypes(signature.resultTypes);
  for (size_t i = 0; i < signature.resultNames.size(); ++i) f->setResultName(i, signature.resultNames[i]);
  return f;
}

/// The executor of a `.kc`: its stored program as it is; or, when its code
/// was built for another machine or code generator, does not load, or
/// `recompile` asks for it, the program compiled again from its stored
/// module (with a notice unless asked). `module` receives that module.
Expected<std::unique_ptr<codegen::CpuExecutor>> artifactExecutor(const std::string& path,
                                                                 const CompiledArtifact& artifact,
                                                                 const codegen::CpuOptions& options, bool recompile,
                                                                 std::unique_ptr<Module>& module) {
  std::string mismatch;
  if (artifact.staged) {
    // A program with host steps: its parts run as stored, the stages by the
    // runtime's stage driver; compiled again, it is the function with its
    // control flow the module section holds, compiled as it runs.
    if (!recompile) {
      for (const Program& part : artifact.staged->programs)
        if (mismatch.empty()) mismatch = codegen::targetMismatch(part, codegen::CpuJit::hostTarget());
      if (mismatch.empty()) {
        auto stored = codegen::CpuExecutor::fromStaged(artifact.staged, options);
        if (stored) return stored;
        mismatch = stored.error().message();
      }
      std::cerr << "kiln run: note: '" << path << "' cannot use its compiled code here (" << mismatch
                << "); compiling its stored module again\n";
    }
    auto parsed = artifactModule(artifact, path);
    if (!parsed) return parsed.takeError();
    module = std::move(*parsed);
    return codegen::CpuExecutor::create(*module->functions().front(), options);
  }
  if (!recompile) {
    mismatch = codegen::targetMismatch(*artifact.program, codegen::CpuJit::hostTarget());
    if (mismatch.empty()) {
      auto stored = codegen::CpuExecutor::fromProgram(artifact.program, options);
      if (stored) return stored;
      mismatch = stored.error().message();
    }
    std::cerr << "kiln run: note: '" << path << "' cannot use its compiled code here (" << mismatch
              << "); recompiling its kernels from the stored module\n";
  }
  auto parsed = artifactModule(artifact, path);
  if (!parsed) return parsed.takeError();
  module = std::move(*parsed);
  return codegen::CpuExecutor::createOptimized(*module->functions().front(), options);
}

int run(const ParsedArgs& args) {
  const auto& positionals = args.positionals();
  if (positionals.empty()) return usageError(kName, "missing the MODEL to run");
  if (positionals.size() > 1)
    return usageError(
        kName, "unexpected argument '" + positionals[1] + "': inputs are bound by name, with --input NAME=FILE.npy");
  const std::string& modelPath = positionals[0];
  if (args.has("--recompile") && !modelPath.ends_with(".kc"))
    return usageError(kName, "--recompile applies to .kc files, which hold compiled code");

  DeviceChoice device;
  if (int status = selectDevice(kName, args.get("--device") ? *args.get("--device") : "cpu", device); status != kExitOk)
    return status;
  bool onCuda = device.kind == DeviceChoice::Kind::Cuda;
  std::optional<size_t> memoryLimit;
  if (const std::string* limit = args.get("--cuda-memory-limit")) {
    auto bytes = parseByteSize(*limit, "--cuda-memory-limit");
    if (!bytes) return usageError(kName, bytes.error().message());
    memoryLimit = static_cast<size_t>(*bytes);
  }

  std::optional<int64_t> benchRuns;
  int64_t warmup = 1;
  if (const std::string* n = args.get("--bench")) {
    auto value = parseInteger(*n, "--bench", 1, 1000000);
    if (!value) return usageError(kName, value.error().message());
    benchRuns = *value;
  }
  if (const std::string* n = args.get("--warmup")) {
    if (!benchRuns) return usageError(kName, "--warmup only applies with --bench N");
    auto value = parseInteger(*n, "--warmup", 0, 1000000);
    if (!value) return usageError(kName, value.error().message());
    warmup = *value;
  }
  if (args.has("--json") && !benchRuns) return usageError(kName, "--json only applies with --bench N");
  auto precision = precisionOption(args);
  if (!precision) return usageError(kName, precision.error().message());
  const bool interpretOnly = args.has("--interpret");
  codegen::CpuOptions cpuOptions;
  if (const std::string* n = args.get("--threads")) {
    if (interpretOnly) return usageError(kName, "--threads applies to the CPU JIT, not to --interpret");
    auto value = parseInteger(*n, "--threads", 1, 4096);
    if (!value) return usageError(kName, value.error().message());
    cpuOptions.threads = static_cast<int>(*value);
  }
  for (std::string_view jitOnly :
       {"--no-fallback", "--time-passes", "--profile", "--cache-dir", "--no-cache", "--recompile", "--memory-stats"})
    if (interpretOnly && args.has(jitOnly))
      return usageError(kName, std::string(jitOnly) + " applies to the CPU JIT, not to --interpret");
  if (args.has("--cache-dir") && args.has("--no-cache"))
    return usageError(kName, "--cache-dir and --no-cache contradict each other");
  if (const std::string* dir = args.get("--cache-dir"); dir && dir->empty())
    return usageError(kName, "--cache-dir needs a folder name");
  cpuOptions.cacheDir = kernelCacheDir(args);
  codegen::CompileReport report;
  if (args.has("--time-passes")) cpuOptions.report = &report;
  codegen::StepProfile profile;
  if (args.has("--profile")) cpuOptions.profile = &profile;
  CpuMemoryStats cpuMemory;
  if (args.has("--memory-stats")) cpuOptions.memory = &cpuMemory;
  // The profile, on stderr, once the runs are done (whatever they returned).
  size_t profileRows = 40;
  if (const std::string* n = args.get("--profile-rows")) {
    if (!args.has("--profile")) return usageError(kName, "--profile-rows applies with --profile");
    auto value = parseInteger(*n, "--profile-rows", 0, 1 << 30);
    if (!value) return usageError(kName, value.error().message());
    profileRows = *value == 0 ? SIZE_MAX : static_cast<size_t>(*value);
  }
  struct ProfilePrinter {
    const codegen::StepProfile* profile;
    size_t rows;
    ~ProfilePrinter() {
      if (profile && !profile->entries.empty())
        std::cerr << profile->format(rows) << "OpenMP wait policy (oneDNN's threads): " << kiln_openmp_wait_policy()
                  << "\n";
    }
  } profilePrinter{args.has("--profile") ? &profile : nullptr, profileRows};
  if (const std::string* dir = args.get("--output-dir"); dir && dir->empty())
    return usageError(kName, "--output-dir needs a folder name");

  std::vector<std::pair<std::string, std::string>> given;
  for (const std::string& binding : args.all("--input")) {
    const size_t eq = binding.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == binding.size())
      return usageError(kName, "--input expects NAME=FILE.npy, got '" + binding + "'");
    std::string name = binding.substr(0, eq);
    for (const auto& g : given)
      if (g.first == name) return usageError(kName, "input '" + name + "' is given more than once");
    given.emplace_back(std::move(name), binding.substr(eq + 1));
  }

  // The model is specialized to the inputs it runs on (docs/cli.md). Files
  // that do not read are reported by bindInputs below.
  ReadInputs read;
  for (const auto& [name, file] : given) read.emplace(name, readNpy(file));
  std::unique_ptr<Module> module;
  std::optional<CompiledArtifact> artifact;
  if (modelPath.ends_with(".kc")) {
    auto loaded = readArtifact(modelPath);
    if (!loaded) {
      reportError(kName, loaded.takeError());
      return kExitError;
    }
    artifact = std::move(*loaded);
  } else {
    auto loaded = loadSpecialized(modelPath, given, read);
    if (!loaded) {
      reportError(kName, loaded.takeError());
      return kExitError;
    }
    module = std::move(*loaded);
  }
  // A .kc's module is parsed only to interpret it or compile it again.
  if (artifact && interpretOnly) {
    auto parsed = artifactModule(*artifact, modelPath);
    if (!parsed) {
      reportError(kName, parsed.takeError());
      return kExitError;
    }
    module = std::move(*parsed);
  }
  // A .kc compiled for CUDA runs there: on the device --device names, or
  // the first usable one; never on the CPU.
  if (artifact && artifact->device == cuda::kCudaDevice && !onCuda) {
    if (args.get("--device") && *args.get("--device") != "auto") {
      reportError(kName, Error("'" + modelPath + "' was compiled for CUDA and cannot run on " + device.str() +
                               "; run it with --device cuda, or compile the model for the CPU"));
      return kExitError;
    }
    if (int status = selectDevice(kName, "cuda", device); status != kExitOk) return status;
    onCuda = true;
  } else if (artifact && artifact->device == kHostDevice && onCuda) {
    reportError(kName, Error("'" + modelPath + "' was compiled for the CPU and cannot run on " + device.str() +
                             "; compile the model with --device cuda, or run it with --device cpu"));
    return kExitError;
  }
  std::unique_ptr<Function> signature = artifact ? signatureFunction(*artifact) : nullptr;
  const Function& f = module ? *module->functions().front() : *signature;

  auto inputs = bindInputs(f, given, read);
  if (!inputs) return kExitError;

  SessionOptions sessionOptions;
  sessionOptions.interpret = interpretOnly;
  sessionOptions.allowFallback = !args.has("--no-fallback");
  sessionOptions.cpu = cpuOptions;
  sessionOptions.cuda.report = cpuOptions.report;
  sessionOptions.cuda.run.graphs = !args.has("--no-cuda-graph");
  sessionOptions.cuda.run.timeRuns = benchRuns.has_value();
  sessionOptions.cudaMemoryLimit = memoryLimit;
  if (artifact) {
    // A .kc holds its precision's casts and weights: it runs as compiled.
    const bool given = args.has("--precision") || args.has("--allow-tf32");
    if (given && *precision != artifact->precision)
      return usageError(kName, "'" + modelPath + "' was compiled with --precision " +
                                   std::string(precisionName(artifact->precision)) +
                                   "; run it without --precision, or compile the model again with --precision " +
                                   std::string(precisionName(*precision)));
    precision = artifact->precision;
  }
  sessionOptions.precision = *precision;
  for (std::string_view cudaOnly : {"--no-cuda-graph", "--cuda-memory-limit"})
    if (!onCuda && args.has(cudaOnly)) return usageError(kName, std::string(cudaOnly) + " applies to --device cuda");
  if (onCuda && args.has("--profile")) {
    // Timed per step with CUDA events, which a replayed graph would not
    // let the host place between its nodes: every step is launched.
    sessionOptions.cuda.run.profile = &profile;
    if (!args.has("--no-cuda-graph"))
      std::cerr << "kiln run: note: --profile times each step with CUDA events and launches every step (no CUDA graph "
                   "replay)\n";
  }
  if (onCuda) sessionOptions.device = "cuda:" + std::to_string(device.cuda.index);
  auto created = Session::create(sessionOptions);
  if (auto* error = std::get_if<DeviceError>(&created)) {
    reportError(kName, error->error);
    return kExitError;
  }
  std::unique_ptr<Session> session = std::move(std::get<std::unique_ptr<Session>>(created));
  std::unique_ptr<CompiledModel> model;
  std::unique_ptr<Module> recompiled;
  if (artifact && !interpretOnly && onCuda && artifact->staged) {
    // A program with host steps compiled for CUDA: its parts on the device.
    auto context = session->cudaContext();
    auto executor = context ? codegen::CudaExecutor::fromStaged(artifact->staged, *context, session->options().cuda)
                            : Expected<std::unique_ptr<codegen::CudaExecutor>>(context.takeError());
    if (!executor) {
      reportError(kName, executor.takeError());
      return kExitError;
    }
    model = session->adopt(f, std::move(*executor));
  } else if (artifact && !interpretOnly && onCuda) {
    auto program = cuda::cudaProgramOf(*artifact, modelPath);
    auto context = program ? session->cudaContext() : Expected<std::shared_ptr<cuda::CudaContext>>(program.takeError());
    if (!context) {
      reportError(kName, context.takeError());
      return kExitError;
    }
    auto executor = codegen::CudaExecutor::fromProgram(*program, *context, session->options().cuda);
    if (!executor) {
      reportError(kName, executor.takeError());
      return kExitError;
    }
    model = session->adopt(f, std::move(*executor));
  } else if (artifact && !interpretOnly) {
    auto executor = artifactExecutor(modelPath, *artifact, cpuOptions, args.has("--recompile"), recompiled);
    if (!executor) {
      reportError(kName, executor.takeError());
      return kExitError;
    }
    model = session->adopt(f, std::move(*executor));
  } else {
    auto compiled = session->compile(f);
    if (!compiled) {
      reportError(kName, compiled.takeError());
      return kExitError;
    }
    model = std::move(*compiled);
  }
  Status prepared = model->prepare(*inputs);
  printCompileNotices(*session, cpuOptions.report);
  if (!prepared) {
    reportError(kName, prepared.takeError());
    return kExitError;
  }
  // A function run in stages compiles some parts during its runs, which
  // may move it to the interpreter then (with a notice).
  Runner runner = [&model, &session](std::vector<Tensor> in) {
    auto results = model->run(in);
    printNotices(*session);
    return results;
  };
  // --memory-stats: the device's memory once the run is over, or on the
  // CPU the compiled programs' (still alive: `model` outlives this).
  struct MemoryStatsAtExit {
    Session* session = nullptr;
    const CompiledModel* model = nullptr;
    const CpuMemoryStats* cpu = nullptr;
    ~MemoryStatsAtExit() {
      if (!session) return;
      if (session->device().kind == DeviceChoice::Kind::Cuda) {
        if (auto context = session->cudaContext()) std::cerr << (*context)->memoryReport();
      } else if (model->interpreted()) {
        std::cerr << "kiln run: note: no CPU memory statistics: the model ran on the reference interpreter\n";
      } else {
        std::cerr << cpu->format();
      }
    }
  } memoryStats{args.has("--memory-stats") ? session.get() : nullptr, model.get(), &cpuMemory};

  std::vector<Tensor> outputs;
  if (benchRuns) {
    if (int rc = bench(runner, *inputs, warmup, *benchRuns, args.has("--json"), modelPath,
                       onCuda ? "cuda:" + std::to_string(device.cuda.index) : "cpu", outputs,
                       args.has("--profile") ? &profile : nullptr, [&model]() -> const cuda::CudaRunStats* {
                         const codegen::CudaExecutor* cuda = model->cudaExecutor();
                         const cuda::CudaRunner* runner = cuda ? cuda->lastRunner() : nullptr;
                         return runner ? &runner->lastRunStats() : nullptr;
                       }))
      return rc;
    const std::string* dir = args.get("--output-dir");
    return dir ? writeOutputs(f, outputs, *dir) : kExitOk;
  }
  auto result = runner(std::move(*inputs));
  if (!result) {
    reportError(kName, result.takeError());
    return kExitError;
  }
  if (const std::string* dir = args.get("--output-dir")) return writeOutputs(f, *result, *dir);
  printOutputs(f, *result);
  return kExitOk;
}

}  // namespace

const Command& runCommand() {
  static const Command command{
      kName,
      "run a model on inputs from .npy files",
      "MODEL [--input NAME=FILE.npy]... [--output-dir DIR] [--device cpu|cuda[:N]|auto] [--bench N [--json]]",
      "Runs MODEL (.onnx, .kiln, .kiln.txt, .kir, or .kc from kiln compile) with the CPU JIT, or on the reference "
      "interpreter with\n"
      "--interpret; a model with ops the JIT cannot compile yet runs on the interpreter, with a notice on\n"
      "stderr naming them. Inputs are bound by name;\n"
      "inputs that have a default (ONNX initializers) may be left out. Without --output-dir each output is\n"
      "printed like NumPy prints arrays; with it, written to DIR/<output name>.npy. --bench N prints\n"
      "`median X ms, min Y ms, max Z ms (N runs)` instead of the outputs.",
      kOptions,
      &run,
  };
  return command;
}

}  // namespace kiln::cli
