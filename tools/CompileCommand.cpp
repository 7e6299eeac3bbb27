// `kiln compile`: compiles a model for this CPU into a `.kc` file (-o), or
// prints what the CPU backend makes of it (--emit=ir|kernel|llvm) for lit
// tests and for reading. Kernels are compiled for static shapes: every
// argument's shape must be static in the model or given with
// --input-shape NAME=2x3x8x8. The `.kc` (runtime/KcFile.h) holds the
// compiled program (steps, memory plan, the kernels' shared object,
// weights) and the optimized module, and `kiln run OUT.kc` runs it without
// passes, lowering or LLVM. `--device cuda` prints what the CUDA backend makes of a
// model (codegen/cuda/): its kernels as CUDA C++, or compiled by NVRTC for
// --cuda-arch, which needs no GPU (the e2e-<model>-nvrtc tests).
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "driver/Session.h"
#include "codegen/Backend.h"
#include "codegen/cpu/CpuExecutable.h"
#include "codegen/cuda/CudaBackend.h"
#include "codegen/Stages.h"
#include "codegen/cuda/CudaCompiler.h"
#include "codegen/cuda/CudaExecutor.h"
#include "codegen/cuda/CudaEmitter.h"
#include "codegen/cuda/CudaTarget.h"
#include "codegen/cuda/NvrtcCompiler.h"
#include "codegen/llvm/CpuJit.h"
#include "frontend/Model.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"
#include "passes/MemoryPlan.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "runtime/KcFile.h"
#include "runtime/cuda/CudaDevices.h"
#include "runtime/cuda/CudaLibraries.h"
#include "runtime/cuda/CudaProgram.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "compile";

constexpr OptionSpec kOptions[] = {
    {"--output", "OUT.kc", "write the compiled model to OUT.kc (run it with kiln run OUT.kc)", false, "-o"},
    {"--emit", "ir|kernel|llvm|cuda|ptx|cubin-size",
     "print the optimized IR, the kernel IR, the optimized LLVM IR, the CUDA C++, NVRTC's PTX, or the size of "
     "NVRTC's CUBIN instead"},
    {"--cuda-arch", "sm_80,sm_90a",
     "the GPU architectures NVRTC compiles for with --device cuda (default: the device's, else sm_90); -o stores a "
     "CUBIN for each and PTX for the oldest"},
    {"--input-shape", "NAME=2x3x8", "the static shape of input NAME, for inputs with symbolic or unknown dims", true},
    {"--device", "cpu|cuda|auto",
     "the device to compile for (default: cpu; cuda needs no GPU: -o OUT.kc or --emit=kernel|cuda|ptx|cubin-size)"},
    {"-O0", "", "pass pipeline -O0 (no passes: every type must already be static)"},
    {"-O1", "", "pass pipeline -O1 (composite ops are not decomposed, so they cannot be compiled)"},
    {"-O2", "", "pass pipeline -O2 (one kernel per op; the default of --emit)"},
    {"-O3", "", "pass pipeline -O3 (fusion; the default of -o, as for kiln run)"},
    {"--print-memory-plan", "", "with -o: print the memory plan stored in OUT.kc"},
    {"--threads", "N", "threads that compile kernels (default: all cores)"},
    {"--time-passes", "", "print the time of each pass and code generation phase to stderr"},
    {"--cache-dir", "DIR", "the kernel cache folder (default: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln)"},
    {"--no-cache", "", "neither read nor write the kernel cache"},
    KILN_PRECISION_OPTIONS,
    {"--help", "", "show this help", false, "-h"},
};

/// A zero tensor per argument of `f`, of its static type or of the shape
/// --input-shape gives; every problem is reported, then nullopt returned.
std::optional<std::vector<Tensor>> compileInputs(const Function& f, const ParsedArgs& args) {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> problems;
  for (const std::string& binding : args.all("--input-shape")) {
    const size_t eq = binding.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == binding.size()) {
      problems.push_back("--input-shape expects NAME=DIMS such as x=2x3x8 (or NAME=scalar), got '" + binding + "'");
      continue;
    }
    auto dims = parseShape(binding.substr(0, eq), binding.substr(eq + 1));
    if (!dims) {
      problems.push_back(dims.error().message() + " (in '" + binding + "')");
      continue;
    }
    shapes[binding.substr(0, eq)] = *dims;
  }
  std::vector<Tensor> inputs;
  std::set<std::string> known;
  std::string list;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const std::string& name = f.argument(i)->name();
    const TensorType& type = f.argument(i)->type();
    known.insert(name);
    list += (list.empty() ? "" : ", ") + name + " (" + type.str() + ")";
  }
  for (const auto& [name, dims] : shapes)
    if (!known.count(name))
      problems.push_back("--input-shape names '" + name + "', which is not an input; inputs: " + list);
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const std::string& name = f.argument(i)->name();
    const TensorType& type = f.argument(i)->type();
    auto given = shapes.find(name);
    if (given == shapes.end()) {
      if (!type.isStatic()) {
        problems.push_back("input '" + name + "' has type " + type.str() +
                           "; compiled kernels need static shapes: give one with --input-shape " + name + "=" + [&] {
                             std::string example;
                             for (const Dim& d : type.shape)
                               example += (example.empty() ? "" : "x") + std::to_string(d.isStatic() ? d.size : 1);
                             return example.empty() ? std::string("scalar") : example;
                           }());
        continue;
      }
      if (auto input = Tensor::allocate(type.dtype, staticDims(type.shape), "input '" + name + "'"))
        inputs.push_back(std::move(*input));
      else
        problems.push_back(input.error().message());
      continue;
    }
    const std::vector<int64_t>& dims = given->second;
    bool fits = dims.size() == type.shape.size();
    for (size_t d = 0; fits && d < dims.size(); ++d) fits = !type.shape[d].isStatic() || type.shape[d].size == dims[d];
    if (!fits) {
      problems.push_back("--input-shape " + name + " gives " + shapeStr(staticShape(dims)) + ", which input '" + name +
                         "' of type " + type.str() + " cannot take");
      continue;
    }
    if (auto input = Tensor::allocate(type.dtype, dims, "input '" + name + "'"))
      inputs.push_back(std::move(*input));
    else
      problems.push_back(input.error().message());
  }
  if (problems.empty()) return inputs;
  for (const std::string& p : problems) reportError(kName, Error(p));
  return std::nullopt;
}

/// --device cuda: the kernels of `f` for `inputs`' shapes at `optLevel`
/// (default -O3, what a run executes; matmuls cuBLASLt takes are library
/// calls, conv a generated kernel), printed as steps (kernel IR and library
/// calls) or CUDA C++, or compiled by NVRTC for sm_<arch>: its PTX, or the
/// number of kernels in its CUBIN and the sizes.
int compileForCuda(const Function& f, const std::vector<Tensor>& inputs, const std::string& emit, int arch,
                   int optLevel) {
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  std::unique_ptr<Module> optimized;
  const codegen::Backend& backend = codegen::cudaBackend();
  auto kernels = codegen::lowerToKernels(f, types, backend, optLevel, &optimized);
  if (!kernels) return reportError(kName, kernels.takeError()), kExitError;
  if (emit == "kernel") {
    auto steps = codegen::lowerForBackend(*optimized->functions().front(), backend, "kiln_");
    if (!steps) return reportError(kName, steps.takeError()), kExitError;
    std::cout << codegen::printSteps(*steps,
                                     [&](const LibraryCall& call) { return backend.describeLibraryCall(call); });
    return kExitOk;
  }
  auto source = codegen::emitCudaSource(*kernels);
  if (!source) return reportError(kName, source.takeError()), kExitError;
  if (emit == "cuda") {
    std::cout << source->code;
    return kExitOk;
  }
  auto nvrtc = cuda::loadNvrtc();
  if (!nvrtc) return reportError(kName, nvrtc.takeError()), kExitError;
  auto binary = codegen::compileCudaSource(**nvrtc, source->code, f.name() + ".cu", arch);
  if (!binary) return reportError(kName, binary.takeError()), kExitError;
  if (!binary->log.empty()) std::cerr << "kiln " << kName << ": note: NVRTC says:\n" << binary->log << "\n";
  if (emit == "ptx") {
    std::cout << binary->ptx;
    return kExitOk;
  }
  std::vector<std::string> names;
  for (const codegen::CudaLaunch& launch : source->launches) names.push_back(launch.name);
  const size_t found = codegen::countKernelsInCubin(binary->cubin, names);
  if (found != names.size()) {
    reportError(kName, Error("the CUBIN NVRTC produced defines " + std::to_string(found) + " of the " +
                             std::to_string(names.size()) + " kernels of '" + f.name() + "'"));
    return kExitError;
  }
  std::cout << "compiled " << names.size() << " kernels of '" << f.name() << "' with NVRTC " << binary->nvrtcVersion
            << " for sm_" << arch << ": CUBIN " << binary->cubin.size() << " bytes, PTX " << binary->ptx.size()
            << " bytes\n";
  return kExitOk;
}

/// `-o OUT.kc --device cuda`: the CUDA target's pipeline, then NVRTC for
/// `archs` (and PTX for the oldest, or `ptxArch` alone when `archs` is
/// empty). No GPU is needed.
int compileCudaArtifact(const Function& f, const std::vector<Tensor>& inputs,
                        const std::vector<int>& archs, const std::vector<int>& specificArchs, int ptxArch, int optLevel,
                        const std::string& output, bool printPlan, Precision precision) {
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  const codegen::Backend& backend = codegen::cudaBackend();
  if (codegen::hasHostOps(f)) {
    // Control flow or data-dependent ops: every part compiled into one
    // staged program (codegen/Stages.h compileStagedProgram).
    codegen::CudaCompilerOptions options;
    options.archs = archs;
    options.specificArchs = specificArchs;
    options.ptxArch = ptxArch;
    std::string plans;
    auto bytes = codegen::stagedCudaArtifact(f, types, options, optLevel, nullptr, &plans, precision);
    if (!bytes) return reportError(kName, bytes.takeError()), kExitError;
    if (Status s = writeFileAtomically(output, *bytes); !s) return reportError(kName, s.takeError()), kExitError;
    std::cerr << "kiln " << kName << ": compiled '" << f.name() << "' for CUDA as a program with host steps\n";
    if (printPlan) std::cout << plans;
    return kExitOk;
  }
  auto optimized = codegen::specializeAndOptimize(f, types, {}, backend, optLevel, nullptr);
  if (!optimized) return reportError(kName, optimized.takeError()), kExitError;
  const Function& g = *(*optimized)->functions().front();
  codegen::CudaCompilerOptions options;
  options.archs = archs;
  options.specificArchs = specificArchs;
  options.ptxArch = ptxArch;
  auto compiler = backend.createCompiler(&options);
  if (!compiler) return reportError(kName, compiler.takeError()), kExitError;
  auto compiled = (*compiler)->compile(g, nullptr);
  if (!compiled) return reportError(kName, compiled.takeError()), kExitError;
  if (!compiled->log.empty()) std::cerr << "kiln " << kName << ": note: NVRTC says:\n" << compiled->log << "\n";
  MemoryPlan plan = compiled->plan;
  const auto printedNames = printedValueNames(g);
  for (MemoryPlan::Buffer& b : plan.buffers)
    if (auto it = printedNames.find(b.value); it != printedNames.end()) b.name = it->second;
  auto bytes =
      serializeArtifact(g, *compiled->program, optLevel, plan.str(), compiled->device, compiled->code, precision);
  if (!bytes) return reportError(kName, bytes.takeError()), kExitError;
  cuda::CudaProgram program;
  program.plan = *compiled->program;
  if (Status s = cuda::parseCudaCode(compiled->code, "the compiled program", program); !s)
    return reportError(kName, s.takeError()), kExitError;
  if (Status s = writeFileAtomically(output, *bytes); !s) return reportError(kName, s.takeError()), kExitError;
  std::string images;
  for (const cuda::CudaImage& image : program.cubins) images += (images.empty() ? "" : ", ") + image.name();
  std::cerr << "kiln " << kName << ": compiled " << program.plan.kernelNames.size() << " kernels for CUDA: CUBIN "
            << (images.empty() ? "none" : images) << ", PTX for sm_" << program.ptxArch << "\n";
  if (printPlan) std::cout << "memory plan @" << g.name() << ": " << plan.numKernels << " kernels\n" << plan.str();
  return kExitOk;
}

int compile(const ParsedArgs& args) {
  const auto& positionals = args.positionals();
  if (positionals.size() != 1)
    return usageError(
        kName, positionals.empty() ? "missing the MODEL to compile" : "unexpected argument '" + positionals[1] + "'");
  const std::string* emit = args.get("--emit");
  const std::string* output = args.get("--output");
  if (!emit && !output) return usageError(kName, "nothing to do: give -o OUT.kc or --emit=ir|kernel|llvm");
  if (emit && output) return usageError(kName, "give either -o OUT.kc or --emit, not both");
  if (emit && *emit != "ir" && *emit != "kernel" && *emit != "llvm" && *emit != "cuda" && *emit != "ptx" &&
      *emit != "cubin-size")
    return usageError(kName, "unknown --emit '" + *emit + "' (valid: ir, kernel, llvm, cuda, ptx, cubin-size)");
  // --device: cpu, cuda[:N] (no device is needed to compile for CUDA, so N
  // is only checked for form) or auto (driver/Device.h).
  std::string notice;
  auto resolved = resolveCompileDevice(args.has("--device") ? *args.get("--device") : "cpu", &notice);
  if (auto* problem = std::get_if<DeviceError>(&resolved)) return usageError(kName, problem->error.message());
  if (!notice.empty()) std::cerr << "kiln compile: " << notice << "\n";
  const CompileDevice device = std::get<CompileDevice>(resolved);
  const bool cuda = device.kind == DeviceChoice::Kind::Cuda;
  const bool cudaEmit = emit && (*emit == "cuda" || *emit == "ptx" || *emit == "cubin-size");
  if (cudaEmit && !cuda) return usageError(kName, "--emit=" + *emit + " needs --device cuda");
  if (cuda && emit && *emit == "llvm") return usageError(kName, "--emit=llvm is for --device cpu");
  if (args.has("--cuda-arch") && !cuda) return usageError(kName, "--cuda-arch needs --device cuda");
  int cudaArch = 90;
  // -o with --device cuda: CUBINs for each of --cuda-arch's list, PTX for
  // the oldest; without it, for the device found (see below).
  std::vector<int> cudaArchs, specificArchs;
  int ptxArch = 90;
  std::optional<cuda::CudaDeviceInfo> cudaDevice;
  if (const std::string* arch = args.get("--cuda-arch")) {
    for (size_t begin = 0; begin <= arch->size();) {
      const size_t comma = std::min(arch->find(',', begin), arch->size());
      auto value = codegen::parseCudaArchSpec(arch->substr(begin, comma - begin));
      if (!value) return usageError(kName, value.error().message());
      (value->specific ? specificArchs : cudaArchs).push_back(value->arch);
      begin = comma + 1;
    }
    if (emit && (cudaArchs.size() != 1 || !specificArchs.empty()))
      return usageError(kName, "--emit takes one --cuda-arch, not architecture-specific");
    cudaArch = cudaArchs.empty() ? specificArchs.front() : cudaArchs.front();
  } else if (cuda) {
    // Without --cuda-arch: the architecture of the device named (cuda:N) or
    // of the first usable one, when the driver shows any; else sm_90.
    auto archDevice = compileArchDevice(device, cuda::LibrarySearchOptions::fromEnvironment());
    if (!archDevice) {
      reportError(kName, archDevice.error());
      return kExitError;
    }
    cudaDevice = std::move(*archDevice);
    if (cudaDevice) {
      cudaArch = cudaDevice->computeMajor * 10 + cudaDevice->computeMinor;
      std::cerr << "kiln compile: note: --cuda-arch defaults to sm_" << cudaArch << ", the architecture of cuda:"
                << cudaDevice->index << " (" << cudaDevice->name << ")\n";
    }
  }
  if (output && output->empty()) return usageError(kName, "-o needs a file name");
  if (args.has("--print-memory-plan") && !output)
    return usageError(kName, "--print-memory-plan applies with -o OUT.kc");
  if (args.has("--cache-dir") && args.has("--no-cache"))
    return usageError(kName, "--cache-dir and --no-cache contradict each other");
  codegen::CpuOptions options;
  std::optional<int> optLevel;
  for (int level = 0; level <= 3; ++level) {
    if (!args.has("-O" + std::to_string(level))) continue;
    if (optLevel) return usageError(kName, "give one of -O0, -O1, -O2 and -O3");
    optLevel = level;
  }
  if (const std::string* n = args.get("--threads")) {
    auto value = parseInteger(*n, "--threads", 1, 4096);
    if (!value) return usageError(kName, value.error().message());
    options.threads = static_cast<int>(*value);
  }
  options.cacheDir = kernelCacheDir(args);
  codegen::CompileReport report;
  if (args.has("--time-passes")) options.report = &report;

  // ONNX models are specialized to the given shapes at import, as kiln run
  // does, so shapes computed from a dynamic batch fold.
  LoadOptions loadOptions;
  loadOptions.evaluator = &Session::evaluator();
  loadOptions.gradients = &buildGradients;
  for (const std::string& binding : args.all("--input-shape"))
    if (size_t eq = binding.find('='); eq != std::string::npos)
      if (auto dims = parseShape(binding.substr(0, eq), binding.substr(eq + 1)))
        loadOptions.inputShapes[binding.substr(0, eq)] = *dims;
  auto module = loadModel(positionals[0], loadOptions);
  if (module) {
    if (Status s = verify(**module); !s) module = s.takeError();
  }
  if (!module && positionals[0].ends_with(".onnx")) {
    // A model that imports only specialized: the error names the
    // --input-shape options it needs.
    InputShapes shapes(loadOptions.inputShapes.begin(), loadOptions.inputShapes.end());
    if (auto hinted = loadOnnxWithShapes(positionals[0], shapes, /*allowAssumed=*/false); !hinted)
      module = hinted.takeError();
  }
  if (!module) return reportError(kName, module.takeError()), kExitError;
  if ((*module)->functions().empty()) {
    reportError(kName, Error(positionals[0] + ": the model holds no function to compile"));
    return kExitError;
  }
  // --precision bf16|fp16: the autocast pass, before every pipeline (a
  // CPU without the instructions computes in f32, as kiln run does).
  auto precision = precisionOption(args);
  if (!precision) return usageError(kName, precision.error().message());
  if (!cuda)
    if (std::string notice = cpuPrecisionNotice(*precision); !notice.empty()) {
      std::cerr << "kiln " << kName << ": note: " << notice << "\n";
      precision = Precision::FP32;
    }
  if (Status s = autocastModule(**module, *precision); !s) return reportError(kName, s.takeError()), kExitError;
  options.precision = *precision;
  const Function& f = *(*module)->functions().front();
  auto inputs = compileInputs(f, args);
  if (!inputs) return kExitError;

  if (cuda && emit && *emit != "ir") return compileForCuda(f, *inputs, *emit, cudaArch, optLevel.value_or(3));
  if (cuda && !emit) {
    auto nvrtc = cuda::loadNvrtc();
    if (!nvrtc) return reportError(kName, nvrtc.takeError()), kExitError;
    if (cudaArchs.empty() && specificArchs.empty())
      cudaArchs = cudaDevice ? codegen::defaultCudaArchs(**nvrtc, cudaDevice->computeMajor, cudaDevice->computeMinor, &ptxArch)
                             : std::vector<int>{90};
    return compileCudaArtifact(f, *inputs, cudaArchs, specificArchs, ptxArch, optLevel.value_or(3), *output,
                               args.has("--print-memory-plan"), *precision);
  }
  if (emit && *emit == "ir") {
    PassContext ctx;
    ctx.evaluator = &Session::evaluator();
    PassManager pm({}, ctx);
    if (Status s = pm.addOptLevel(optLevel.value_or(2)); !s) return reportError(kName, s.takeError()), kExitError;
    if (Status s = pm.run(**module, std::cerr); !s) return reportError(kName, s.takeError()), kExitError;
    std::cout << print(**module);
    return kExitOk;
  }
  // --emit shows the -O2 pipeline like --emit=ir above (one kernel per op);
  // a .kc is compiled like `kiln run` compiles (CpuOptions' default, -O3).
  if (optLevel)
    options.optLevel = *optLevel;
  else if (emit)
    options.optLevel = 2;
  auto executor = codegen::CpuExecutor::create(f, options);
  if (!executor) return reportError(kName, executor.takeError()), kExitError;
  auto finish = [&](int status) {
    for (const std::string& notice : (*executor)->takeNotices())
      std::cerr << "kiln " << kName << ": note: " << notice << "\n";
    if (options.report) std::cerr << report.passTimings << codegen::formatCompileReport(report);
    return status;
  };
  if (emit) {
    auto text = *emit == "kernel" ? (*executor)->kernelIR(*inputs) : (*executor)->llvmIR(*inputs);
    if (!text) return reportError(kName, text.takeError()), finish(kExitError);
    std::cout << *text;
    return finish(kExitOk);
  }

  std::string planText;
  auto bytes = (*executor)->artifact(*inputs, &planText);
  if (!bytes) return reportError(kName, bytes.takeError()), finish(kExitError);
  if (Status s = writeFileAtomically(*output, *bytes); !s) return reportError(kName, s.takeError()), finish(kExitError);
  if (args.has("--print-memory-plan"))
    std::cout << planText;
  return finish(kExitOk);
}

}  // namespace

const Command& compileCommand() {
  static const Command command{
      kName,
      "compile a model for this CPU into a .kc file",
      "MODEL (-o OUT.kc | --emit=ir|kernel|llvm | --device cuda --emit=kernel|cuda|ptx|cubin-size) "
      "[--input-shape NAME=2x3x8]... [-O0|-O1|-O2|-O3] [--device cpu|auto]",
      "Optimizes MODEL as kiln run does (-O3: fused kernels, oneDNN steps) and compiles its kernels with LLVM\n"
      "for this machine's CPU. -o writes OUT.kc (the compiled program: its steps, memory plan, machine code and\n"
      "weights, and the optimized module), which kiln run OUT.kc runs without recompiling; --emit prints the optimized IR, the\n"
      "kernel IR, or the LLVM IR after O3 of the -O2 pipeline (one kernel per op) instead. Every input needs\n"
      "a static shape: from the model, or from --input-shape.\n"
      "--device cuda lowers the model (-O3 unless -O says) with every op a generated kernel and prints the kernel IR or\n"
      "the CUDA C++ (--emit=cuda), or compiles it with NVRTC for --cuda-arch (no GPU needed) and prints the\n"
      "PTX (--emit=ptx) or the number of kernels in the CUBIN and its size (--emit=cubin-size).",
      kOptions,
      &compile,
  };
  return command;
}

}  // namespace kiln::cli
