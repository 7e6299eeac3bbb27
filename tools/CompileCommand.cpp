// `kiln compile`: for now, what the CPU backend makes of a model, for lit
// tests and for reading: --emit=ir prints the optimized Kiln IR, kernel the
// kernel IR of every kernel, llvm the LLVM IR after the O3 pipeline. The
// model's argument types must be static (a .kir written for the purpose,
// or a model exported with fixed shapes). Writing `.kc` executables (-o)
// comes with runtime/Executable.h (docs/codegen.md section 5).
#include <iostream>

#include "codegen/CpuExecutable.h"
#include "frontend/Model.h"
#include "ir/Printer.h"
#include "passes/PassManager.h"
#include "runtime/Interpreter.h"
#include "tools/KilnCommands.h"

namespace kiln::cli {

namespace {

constexpr std::string_view kName = "compile";

constexpr OptionSpec kOptions[] = {
    {"--emit", "ir|kernel|llvm", "print the optimized IR, the kernel IR or the optimized LLVM IR"},
    {"--output", "OUT.kc", "write a compiled executable (not implemented yet)", false, "-o"},
    {"--help", "", "show this help", false, "-h"},
};

int compile(const ParsedArgs& args) {
  const auto& positionals = args.positionals();
  if (positionals.size() != 1)
    return usageError(
        kName, positionals.empty() ? "missing the MODEL to compile" : "unexpected argument '" + positionals[1] + "'");
  if (args.has("--output")) {
    reportError(kName, Error("writing .kc executables is not implemented yet; use --emit=ir|kernel|llvm to see what "
                             "the CPU backend generates, or kiln run to run a model"));
    return kExitError;
  }
  const std::string* emit = args.get("--emit");
  if (!emit) return usageError(kName, "nothing to do: give --emit=ir|kernel|llvm");
  if (*emit != "ir" && *emit != "kernel" && *emit != "llvm")
    return usageError(kName, "unknown --emit '" + *emit + "' (valid: ir, kernel, llvm)");

  auto module = loadVerifiedModel(positionals[0]);
  if (!module) {
    reportError(kName, module.takeError());
    return kExitError;
  }
  if ((*module)->functions().empty()) {
    reportError(kName, Error(positionals[0] + ": the model holds no function to compile"));
    return kExitError;
  }
  const Function& f = *(*module)->functions().front();
  // Kernels are compiled for static shapes; zero tensors of the argument
  // types stand for the inputs.
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const TensorType& type = f.argument(i)->type();
    if (!type.isStatic()) {
      reportError(kName, Error("argument " + std::to_string(i) + " '" + f.argument(i)->name() + "' has type " +
                               type.str() + "; compile needs static argument shapes"));
      return kExitError;
    }
    inputs.emplace_back(type.dtype, staticDims(type.shape));
  }
  if (*emit == "ir") {
    static const InterpreterEvaluator evaluator;
    PassContext ctx;
    ctx.evaluator = &evaluator;
    PassManager pm({}, ctx);
    if (Status s = pm.addOptLevel(2); !s) return reportError(kName, s.takeError()), kExitError;
    if (Status s = pm.run(**module, std::cerr); !s) return reportError(kName, s.takeError()), kExitError;
    std::cout << print(**module);
    return kExitOk;
  }
  // -O2 like --emit=ir above (one kernel per op); `kiln run` compiles at -O3.
  auto executor = codegen::CpuExecutor::create(f, {.optLevel = 2});
  if (!executor) return reportError(kName, executor.takeError()), kExitError;
  auto text = *emit == "kernel" ? (*executor)->kernelIR(inputs) : (*executor)->llvmIR(inputs);
  if (!text) return reportError(kName, text.takeError()), kExitError;
  std::cout << *text;
  return kExitOk;
}

}  // namespace

const Command& compileCommand() {
  static const Command command{
      kName,
      "show what the CPU backend compiles a model to",
      "MODEL --emit=ir|kernel|llvm",
      "Optimizes MODEL (-O2), lowers each op to a kernel and prints the optimized IR, the kernel IR, or the\n"
      "LLVM IR after O3 for this machine's CPU. The model's arguments must have static shapes.",
      kOptions,
      &compile,
  };
  return command;
}

}  // namespace kiln::cli
