// kiln-opt's library entry point (KilnOpt.h): parse Kiln text IR, verify
// it, run a pass pipeline, print it. The tool behind the lit tests of every
// pass:
//
//   kiln-opt in.kir --passes=infer-shapes,cse --print-after-all
//   kiln-opt in.kir -O2
//   kiln-opt in.kir --split-input-file --verify-diagnostics
//   kiln-opt in.kir -O2 --print-memory-plan
//   kiln-opt model.onnx --target cpu -O3 --print-after-all --print-kernels
//
// `--target NAME` takes any registered backend (codegen/Backend.h): its
// Target answers select-library, its pipeline is what -O runs, and after
// the pipeline --print-after-all prints the kernel-level steps the backend
// takes next (lowering to kernel IR, scheduling, the memory plan).
#include "tools/KilnOpt.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "codegen/Backend.h"
#include "driver/Session.h"
#include "frontend/Model.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/MemoryPlan.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "tools/DiagnosticVerifier.h"

namespace {

using namespace kiln;

constexpr const char* kUsage = R"(usage: kiln-opt [options] [FILE.kir | -]

Parses Kiln text IR (or a model: .onnx, .kiln, .kiln.txt), verifies it, runs a
pass pipeline and prints the result.

options:
  --passes=A,B,C         run these passes in order (see --list-passes)
  -O0 .. -O3             run a standard pipeline (after --passes, if both);
                         with --target, the target's pipeline to its kernels
  --target=NAME          compile for this backend (see the list below): its
                         pipeline at -O, its library choices in select-library
  --print-kernels        with --target: after the IR, print the final kernel
                         list (host checks, library calls, kernel IR) as '//'
                         comments; --print-after-all ends with the kernels
                         lowered, then scheduled, then the memory plan
  -o FILE                write the output to FILE instead of stdout
  --split-input-file     process each '// -----' separated chunk on its own
  --verify-diagnostics   check errors against '// expected-error@+N {{...}}'
  --verify-each          run the verifier after every pass
  --print-after-all      print the IR after every pass (to stderr)
  --print-after=NAME     print the IR after each run of pass NAME (to stderr)
  --time-passes          print per-pass wall times (to stderr)
  --bucket-cap-mb=N      data-parallel: the most MB of gradients in one
                         all-reduce bucket (default 25)
  --precision=P          autocast: fp32 (default), tf32, bf16 or fp16
                         (docs/precision.md)
  --print-memory-plan    after the IR, print each function's memory plan as
                         '//' comments (offsets, sizes, live kernels, peak)
  --list-passes          list the registered passes and exit
  -h, --help             show this help
)";

struct Options {
  std::string input = "-";
  std::string output;
  std::string pipeline;
  int optLevel = -1;
  bool splitInputFile = false;
  bool verifyDiagnostics = false;
  bool printMemoryPlan = false;
  bool printKernels = false;
  int64_t bucketCapBytes = int64_t{25} * 1024 * 1024;
  Precision precision = Precision::FP32;
  const codegen::Backend* backend = nullptr;
  PassManagerOptions pm;
};

/// Parses the command line; returns false after printing an error.
bool parseArgs(int argc, char** argv, Options& o, bool& exitEarly) {
  bool sawInput = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> std::optional<std::string> {
      std::string f = flag;
      if (a.rfind(f + "=", 0) == 0) return a.substr(f.size() + 1);
      if (a == f && i + 1 < argc) return std::string(argv[++i]);
      return std::nullopt;
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage << "\nbackends (--target):\n";
      for (const codegen::Backend* b : codegen::registeredBackends())
        std::cout << "  " << b->name() << "  " << b->description() << "\n";
      exitEarly = true;
      return true;
    } else if (a == "--list-passes") {
      for (const PassInfo& p : registeredPasses()) std::cout << p.name << "  " << p.summary << "\n";
      exitEarly = true;
      return true;
    } else if (a.rfind("--passes", 0) == 0) {
      auto v = value("--passes");
      if (!v) { std::cerr << "kiln-opt: error: --passes needs a value, e.g. --passes=cse,dce\n"; return false; }
      o.pipeline += (o.pipeline.empty() ? "" : ",") + *v;
    } else if (a.size() == 3 && a[0] == '-' && a[1] == 'O' && a[2] >= '0' && a[2] <= '3') {
      o.optLevel = a[2] - '0';
    } else if (a == "-o") {
      if (i + 1 >= argc) { std::cerr << "kiln-opt: error: -o needs a file name\n"; return false; }
      o.output = argv[++i];
    } else if (a == "--split-input-file") {
      o.splitInputFile = true;
    } else if (a == "--verify-diagnostics") {
      o.verifyDiagnostics = true;
    } else if (a == "--verify-each") {
      o.pm.verifyEach = true;
    } else if (a == "--print-after-all") {
      o.pm.printAfterAll = true;
    } else if (a.rfind("--print-after", 0) == 0) {
      auto v = value("--print-after");
      if (!v || !lookupPass(*v)) {
        std::cerr << "kiln-opt: error: --print-after needs the name of a pass (see --list-passes)\n";
        return false;
      }
      o.pm.printAfter.insert(*v);
    } else if (a.rfind("--target", 0) == 0) {
      auto v = value("--target");
      if (!v) {
        std::cerr << "kiln-opt: error: --target needs a backend (" << codegen::backendNames() << ")\n";
        return false;
      }
      auto backend = codegen::findBackend(*v);
      if (!backend) {
        std::cerr << "kiln-opt: error: --target: " << backend.error().message() << "\n";
        return false;
      }
      o.backend = *backend;
    } else if (a == "--print-kernels") {
      o.printKernels = true;
    } else if (a.rfind("--bucket-cap-mb", 0) == 0) {
      auto v = value("--bucket-cap-mb");
      char* end = nullptr;
      const double mb = v ? std::strtod(v->c_str(), &end) : 0;
      if (!v || v->empty() || *end != 0 || !(mb > 0) || mb > 1e6) {
        std::cerr << "kiln-opt: error: --bucket-cap-mb needs a positive number of MB, e.g. --bucket-cap-mb=25\n";
        return false;
      }
      o.bucketCapBytes = static_cast<int64_t>(mb * 1024 * 1024);
    } else if (a.rfind("--precision", 0) == 0) {
      auto v = value("--precision");
      auto p = v ? parsePrecision(*v) : Expected<Precision>(Error("--precision needs a value"));
      if (!p) {
        std::cerr << "kiln-opt: error: --precision: " << p.error().message() << "\n";
        return false;
      }
      o.precision = *p;
    } else if (a == "--print-memory-plan") {
      o.printMemoryPlan = true;
    } else if (a == "--time-passes") {
      o.pm.timePasses = true;
    } else if (a != "-" && a.size() > 1 && a[0] == '-') {
      std::cerr << "kiln-opt: error: unknown option '" << a << "' (see --help)\n";
      return false;
    } else {
      if (sawInput) { std::cerr << "kiln-opt: error: more than one input file\n"; return false; }
      o.input = a;
      sawInput = true;
    }
  }
  if (o.printKernels && !o.backend) {
    std::cerr << "kiln-opt: error: --print-kernels needs a target (--target " << codegen::backendNames() << ")\n";
    return false;
  }
  return true;
}

/// A piece of the input and the line it starts on.
struct Chunk {
  std::string text;
  int firstLine;
};

std::vector<Chunk> splitInput(const std::string& text, bool split) {
  if (!split) return {{text, 1}};
  std::vector<Chunk> chunks{{"", 1}};
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    std::string_view l = line;
    while (!l.empty() && (l.front() == ' ' || l.front() == '\t')) l.remove_prefix(1);
    if (l.rfind("// -----", 0) == 0) {
      chunks.push_back({"", lineNo + 1});
      continue;
    }
    chunks.back().text += line + "\n";
  }
  return chunks;
}

/// The memory plan of every function of `m`, as comment lines so that the
/// output still parses. Values are named as the printed IR names them,
/// including those the printer had to number.
std::optional<std::string> printMemoryPlans(const Module& m, const DiagnosticHandler& report) {
  std::string out;
  for (const auto& f : m.functions()) {
    Expected<MemoryPlan> plan = planMemory(*f);
    if (!plan) {
      report(plan.error());
      return std::nullopt;
    }
    const auto printedNames = printedValueNames(*f);
    for (MemoryPlan::Buffer& b : plan->buffers)
      if (auto it = printedNames.find(b.value); it != printedNames.end()) b.name = it->second;
    out += "// memory plan @" + f->name() + ": " + std::to_string(plan->numKernels) + " kernels\n";
    std::istringstream lines(plan->str());
    for (std::string line; std::getline(lines, line);) out += "//   " + line + "\n";
  }
  return out;
}

/// The kernel-level steps a backend takes after its pipeline, each printed
/// as --print-after-all prints a pass: every function's steps as lowered
/// (kernel IR before any schedule), then as the backend schedules them,
/// then the memory plan. Nullopt after reporting why `m` cannot be lowered.
std::optional<std::string> kernelLevelDumps(const Module& m, const codegen::Backend& backend,
                                            const DiagnosticHandler& report) {
  std::string lowered;
  for (const auto& f : m.functions()) {
    auto steps = codegen::lowerToSteps(*f, "kiln_");
    if (!steps) {
      report(steps.error());
      return std::nullopt;
    }
    lowered += "kernels of @" + f->name() + " before scheduling:\n" +
               codegen::printSteps(*steps, [&](const LibraryCall& c) { return backend.describeLibraryCall(c); });
  }
  auto scheduled = codegen::printBackendSteps(m, backend);
  if (!scheduled) {
    report(scheduled.error());
    return std::nullopt;
  }
  std::optional<std::string> plans = printMemoryPlans(m, report);
  if (!plans) return std::nullopt;
  return "// -----// Kernels After lower-to-kernels //----- //\n" + lowered +
         "\n// -----// Kernels After schedule-kernels //----- //\n" + *scheduled +
         "\n// -----// Memory Plan After plan-memory //----- //\n" + *plans;
}

/// Each line of `text` as a `//` comment, so that the output still parses.
std::string commentLines(const std::string& text) {
  std::string out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out += line.empty() ? "//\n" : "// " + line + "\n";
  return out;
}

/// Parses one chunk of text IR, or loads the model file `filename` (any
/// format `kiln` reads) when the input is not text IR.
Expected<std::unique_ptr<Module>> loadChunk(const Chunk& chunk, const std::string& filename) {
  if (auto format = modelFormatOf(filename); format && *format != ModelFormat::KilnIR) {
    LoadOptions options;
    options.evaluator = &Session::evaluator();
    return loadModel(filename, options);
  }
  return parseModule(chunk.text, filename, chunk.firstLine);
}

/// Parses, verifies and transforms one chunk. Every diagnostic goes to
/// `report`; returns the printed module, or nullopt on failure.
std::optional<std::string> processChunk(const Chunk& chunk, const std::string& filename, const Options& o,
                                        const DiagnosticHandler& report) {
  auto module = loadChunk(chunk, filename);
  if (!module) {
    report(module.error());
    return std::nullopt;
  }
  if (!verify(**module, report)) return std::nullopt;

  PassContext ctx;
  ctx.evaluator = &Session::evaluator();
  ctx.target = o.backend ? &o.backend->target() : nullptr;
  ctx.bucketCapBytes = o.bucketCapBytes;
  ctx.precision = o.precision;
  PassManager pm(o.pm, ctx);
  if (Status s = pm.addPipeline(o.pipeline); !s) {
    report(s.error());
    return std::nullopt;
  }
  // With a target, -O is the backend's pipeline; without, the graph passes'.
  if (o.optLevel >= 0) {
    if (Status s = o.backend ? pm.addPipeline(o.backend->pipeline(o.optLevel)) : pm.addOptLevel(o.optLevel); !s) {
      report(s.error());
      return std::nullopt;
    }
  }
  if (Status s = pm.run(**module, std::cerr); !s) {
    report(s.error());
    return std::nullopt;
  }
  if (Status s = verify(**module, report); !s) return std::nullopt;
  std::string printed = print(**module);
  if (o.backend && o.pm.printAfterAll) {
    std::optional<std::string> dumps = kernelLevelDumps(**module, *o.backend, report);
    if (!dumps) return std::nullopt;
    std::cerr << *dumps << "\n";
  }
  if (o.backend && o.printKernels) {
    auto kernels = codegen::printBackendSteps(**module, *o.backend);
    if (!kernels) {
      report(kernels.error());
      return std::nullopt;
    }
    printed += commentLines(*kernels);
  }
  if (o.printMemoryPlan) {
    std::optional<std::string> plans = printMemoryPlans(**module, report);
    if (!plans) return std::nullopt;
    printed += *plans;
  }
  return printed;
}

int run(const Options& o) {
  std::string text;
  std::string filename = o.input == "-" ? "<stdin>" : o.input;
  if (o.input == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    std::ifstream in(o.input, std::ios::binary);
    if (!in) {
      std::cerr << "kiln-opt: error: cannot open '" << o.input << "': " << std::strerror(errno) << "\n";
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }

  bool failed = false;
  std::string out;
  std::vector<Chunk> chunks = splitInput(text, o.splitInputFile);
  for (size_t i = 0; i < chunks.size(); ++i) {
    std::optional<std::string> printed;
    if (o.verifyDiagnostics) {
      DiagnosticVerifier verifier(chunks[i].text, filename, chunks[i].firstLine);
      printed = processChunk(chunks[i], filename, o, [&](const Error& e) { verifier.handle(e); });
      for (const std::string& problem : verifier.check()) {
        std::cerr << problem << "\n";
        failed = true;
      }
    } else {
      printed = processChunk(chunks[i], filename, o, [](const Error& e) { std::cerr << e.str() << "\n"; });
      if (!printed) failed = true;
    }
    if (i) out += "// -----\n";
    if (printed) out += *printed;
  }

  if (o.output.empty()) {
    std::cout << out;
  } else if (!failed || o.verifyDiagnostics) {
    // Write to a temporary file and rename, so a failure never leaves a
    // half-written output behind.
    std::string tmp = o.output + ".tmp";
    std::ofstream f(tmp, std::ios::binary);
    if (!(f << out) || !(f.close(), f)) {
      std::cerr << "kiln-opt: error: cannot write '" << o.output << "': " << std::strerror(errno) << "\n";
      std::remove(tmp.c_str());
      return 1;
    }
    if (std::rename(tmp.c_str(), o.output.c_str()) != 0) {
      std::cerr << "kiln-opt: error: cannot write '" << o.output << "': " << std::strerror(errno) << "\n";
      std::remove(tmp.c_str());
      return 1;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace

namespace kiln {

int kilnOptMain(int argc, char** argv) {
  Options o;
  bool exitEarly = false;
  if (!parseArgs(argc, argv, o, exitEarly)) return 2;
  if (exitEarly) return 0;
  return run(o);
}

}  // namespace kiln
