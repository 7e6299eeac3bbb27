// kiln: the command-line driver. Each subcommand lives in its own file
// (KilnCommands.h); this file dispatches on the first argument and prints
// the top-level help and version. Exit statuses: 0 success, 1 an error in
// the work itself (a broken model, a wrong input), 2 a usage error.
//
//   kiln run model.onnx --input x=x.npy --output-dir out/
//   kiln check model.onnx
//   kiln convert model.onnx -o model.kiln
//   kiln devices
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "tools/KilnCommands.h"

namespace {

using namespace kiln::cli;

constexpr const char* kVersion = "0.1.0";
/// The backends compiled into every build (docs/cli.md): the CPU JIT, CUDA
/// and the reference interpreter.
constexpr const char* kBackends = "cpu, cuda, interpreter";

const Command* const kCommands[] = {&runCommand(),     &compileCommand(), &checkCommand(),
                                    &convertCommand(), &devicesCommand(), &trainCommand(),
                                    &generateCommand()};

/// Commands of DESIGN.md that later backends bring; named here so that a
/// user trying one learns it is planned rather than mistyped.
constexpr std::string_view kPlannedCommands[] = {"bench"};

std::string commandList() {
  std::string list;
  for (const Command* c : kCommands) list += (list.empty() ? "" : ", ") + std::string(c->name);
  return list;
}

void printTopHelp() {
  std::cout << "usage: kiln <command> [options]\n\n"
               "Kiln compiles and runs neural network models (ONNX, .kiln, .kiln.txt, Kiln IR .kir).\n\n"
               "commands:\n";
  for (const Command* c : kCommands)
    std::cout << "  " << c->name << std::string(10 - c->name.size(), ' ') << c->summary << "\n";
  std::cout << "\noptions:\n"
               "  -h, --help     show this help; `kiln <command> --help` for a command's options\n"
               "  --version      print the version\n\n"
               "exit status: 0 success, 1 error, 2 usage error\n";
}

void printCommandHelp(const Command& c) {
  std::cout << "usage: kiln " << c.name << " " << c.usage << "\n\n" << c.description << "\n\noptions:\n";
  std::cout << formatOptions(c.options);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    printTopHelp();
    return kExitUsage;
  }
  const std::string& first = args[0];
  if (first == "-h" || first == "--help" || first == "help") {
    printTopHelp();
    return kExitOk;
  }
  if (first == "--version") {
    // The backends every build has: CUDA support needs no toolkit at build
    // time (the driver, NVRTC and the libraries are loaded when a command
    // uses them), so nothing is probed here; `kiln devices` says whether
    // CUDA is usable on this machine.
    std::cout << "kiln " << kVersion << " (backends: " << kBackends
              << "; kiln devices says whether CUDA is usable here)\n";
    return kExitOk;
  }
  for (const Command* c : kCommands) {
    if (c->name != first) continue;
    std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const std::string& a : rest) {
      if (a == "--") break;
      if (a == "-h" || a == "--help") {
        printCommandHelp(*c);
        return kExitOk;
      }
    }
    auto parsed = parseArgs("kiln " + std::string(c->name), c->options, rest);
    if (!parsed) return usageError(c->name, parsed.error().message());
    return c->run(*parsed);
  }
  if (first.size() > 1 && first[0] == '-')
    std::cerr << "kiln: error: unknown option '" << first
              << "' (valid options: --help, --version; commands: " << commandList() << ")\n";
  else if (std::find(std::begin(kPlannedCommands), std::end(kPlannedCommands), first) != std::end(kPlannedCommands))
    std::cerr << "kiln: error: 'kiln " << first
              << "' is not available in this build yet (available commands: " << commandList() << ")\n";
  else
    std::cerr << "kiln: error: unknown command '" << first << "' (valid commands: " << commandList()
              << "; see kiln --help)\n";
  return kExitUsage;
}
