// kiln-kc-retarget: rewrites the target section of a .kc as if it had been
// built on another CPU (or renames its program's first kernel, as if its
// code came from elsewhere), for tests of what `kiln run` does with such a
// file (a note, then the kernels compiled again from the stored module).
// The file is read and written with runtime/KcFile.h, so its checksums stay
// valid: only what is asked for differs.
//
//   kiln-kc-retarget IN.kc OUT.kc (--features F | --cpu NAME | --codegen V | --kernel-name N)
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "runtime/KcFile.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: kiln-kc-retarget IN.kc OUT.kc (--features F | --cpu NAME | --codegen V | --kernel-name N)\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  auto artifact = kiln::parseArtifact(bytes.str(), argv[1]);
  if (!artifact) {
    std::cerr << "kiln-kc-retarget: " << artifact.error().message() << "\n";
    return 1;
  }
  if (!artifact->program) {
    std::cerr << "kiln-kc-retarget: " << argv[1] << " holds a program with host steps, which this tool does not edit\n";
    return 1;
  }
  const std::string option = argv[3], value = argv[4];
  kiln::Program& program = *artifact->program;
  if (option == "--features") {
    program.machine.features = value;
  } else if (option == "--cpu") {
    program.machine.cpu = value;
  } else if (option == "--codegen") {
    program.codegenVersion = value;
  } else if (option == "--kernel-name" && !program.kernelNames.empty()) {
    program.kernelNames[0] = value;
  } else {
    std::cerr << "kiln-kc-retarget: unknown option '" << option << "'\n";
    return 2;
  }
  auto module = kiln::artifactModule(*artifact, argv[1]);
  if (!module) {
    std::cerr << "kiln-kc-retarget: " << module.error().message() << "\n";
    return 1;
  }
  auto out = kiln::serializeArtifact(*(*module)->functions().front(), program, artifact->optLevel,
                                     artifact->memoryPlan);
  if (!out) {
    std::cerr << "kiln-kc-retarget: " << out.error().message() << "\n";
    return 1;
  }
  std::ofstream(argv[2], std::ios::binary | std::ios::trunc) << *out;
  return 0;
}
