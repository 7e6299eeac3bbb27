// kiln-kc-retarget: rewrites the target section of a .kc as if it had been
// built on another CPU (or renames its first stored kernel, as if a
// different Kiln had lowered it), for tests of what `kiln run` does with
// such a file (a note, then the kernels compiled again from the stored
// module). The file is read and written with codegen/CompiledArtifact.h, so
// its checksums stay valid: only what is asked for differs.
//
//   kiln-kc-retarget IN.kc OUT.kc (--features F | --cpu NAME | --codegen V | --kernel-name N)
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "codegen/CompiledArtifact.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: kiln-kc-retarget IN.kc OUT.kc (--features F | --cpu NAME | --codegen V | --kernel-name N)\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  auto artifact = kiln::codegen::parseArtifact(bytes.str(), argv[1]);
  if (!artifact) {
    std::cerr << "kiln-kc-retarget: " << artifact.error().message() << "\n";
    return 1;
  }
  const std::string option = argv[3], value = argv[4];
  if (option == "--features") {
    artifact->target.features = value;
  } else if (option == "--cpu") {
    artifact->target.cpu = value;
  } else if (option == "--codegen") {
    artifact->codegenVersion = value;
  } else if (option == "--kernel-name" && !artifact->code.names.empty()) {
    artifact->code.names[0] = value;
  } else {
    std::cerr << "kiln-kc-retarget: unknown option '" << option << "'\n";
    return 2;
  }
  auto out = kiln::codegen::serializeArtifact(*artifact);
  if (!out) {
    std::cerr << "kiln-kc-retarget: " << out.error().message() << "\n";
    return 1;
  }
  std::ofstream(argv[2], std::ios::binary | std::ios::trunc) << *out;
  return 0;
}
