// kiln-embed-run: a program that embeds Kiln the way a user's program
// would, through runtime/Kiln.h alone — it links kiln_runtime and kiln_ir,
// no LLVM and no protobuf (ctest `embed-links-no-compiler` checks its
// dynamic dependencies). It loads a `.kc`, runs it on inputs from `.npy`
// files, and compares every output with the reference interpreter run on
// the `.kc`'s own stored module (runtime/Interpreter.h), and with an
// expected `.npy` where one is given. It registers the CUDA loader
// (runtime/cuda/CudaProgramLoader.h, which links no compiler either), so a
// `.kc` compiled for CUDA runs on the first usable GPU (KILN_CUDA_DRIVER
// names the driver, as for kiln).
//
//   kiln-embed-run MODEL.kc [NAME=INPUT.npy]... [--expect NAME=EXPECTED.npy]...
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "runtime/Interpreter.h"
#include "runtime/KcFile.h"
#include "runtime/Kiln.h"
#include "runtime/Npy.h"
#include "runtime/cuda/CudaProgramLoader.h"

namespace {

/// The largest |got - want| / (atol + rtol |want|) over the elements, or an
/// error for different types; at most 1 passes.
double worstRatio(const kiln::Tensor& got, const kiln::Tensor& want, double rtol, double atol) {
  double worst = 0;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    const double g = got.getDouble(i), w = want.getDouble(i);
    if (std::isnan(w) && std::isnan(g)) continue;
    const double ratio = std::fabs(g - w) / (atol + rtol * std::fabs(w));
    if (!(ratio <= worst)) worst = std::isnan(ratio) ? INFINITY : ratio;
  }
  return worst;
}

bool compare(const std::string& what, const kiln::Tensor& got, const kiln::Tensor& want, double rtol, double atol) {
  if (got.type() != want.type()) {
    std::cerr << what << ": " << got.type().str() << ", expected " << want.type().str() << "\n";
    return false;
  }
  const double worst = worstRatio(got, want, rtol, atol);
  if (worst > 1) {
    std::cerr << what << ": differs (worst element at " << worst << " times the tolerance)\n";
    return false;
  }
  std::cout << what << ": matches " << got.type().str() << "\n";
  return true;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kiln-embed-run MODEL.kc [NAME=INPUT.npy]... [--expect NAME=EXPECTED.npy]...\n";
    return 2;
  }
  const std::string path = argv[1];
  std::map<std::string, kiln::Tensor> inputs, expected;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    std::map<std::string, kiln::Tensor>* into = &inputs;
    if (arg == "--expect" && i + 1 < argc) {
      into = &expected;
      arg = argv[++i];
    }
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      std::cerr << "kiln-embed-run: expected NAME=FILE.npy, got '" << arg << "'\n";
      return 2;
    }
    auto tensor = kiln::readNpy(arg.substr(eq + 1));
    if (!tensor) {
      std::cerr << "kiln-embed-run: " << tensor.error().str() << "\n";
      return 1;
    }
    (*into)[arg.substr(0, eq)] = std::move(*tensor);
  }

  if (kiln::Status s = kiln::cuda::registerCudaProgramLoader(kiln::cuda::LibrarySearchOptions::fromEnvironment()); !s) {
    std::cerr << "kiln-embed-run: " << s.error().str() << "\n";
    return 1;
  }
  auto model = kiln::Model::load(path);
  if (!model) {
    std::cerr << "kiln-embed-run: " << model.error().str() << "\n";
    return 1;
  }
  auto outputs = (*model)->run(inputs);
  if (!outputs) {
    std::cerr << "kiln-embed-run: " << outputs.error().str() << "\n";
    return 1;
  }

  // The oracle: the interpreter on the optimized module the .kc stores.
  auto artifact = kiln::parseArtifact(readFile(path), path);
  auto module = artifact ? kiln::artifactModule(*artifact, path) : kiln::Expected<std::unique_ptr<kiln::Module>>(
                                                                      artifact.takeError());
  if (!module) {
    std::cerr << "kiln-embed-run: " << module.error().str() << "\n";
    return 1;
  }
  std::vector<kiln::Tensor> ordered;
  const kiln::ArtifactSignature signature = kiln::signatureOf(*artifact);
  for (const kiln::Model::Port& p : (*model)->inputs()) {
    auto it = inputs.find(p.name);
    size_t index = ordered.size();
    ordered.push_back(it != inputs.end() ? it->second : signature.arguments[index].defaultValue);
  }
  auto reference = kiln::interpret(*(*module)->functions().front(), ordered);
  if (!reference) {
    std::cerr << "kiln-embed-run: the interpreter: " << reference.error().str() << "\n";
    return 1;
  }
  bool ok = true;
  for (size_t r = 0; r < (*model)->outputs().size(); ++r) {
    const std::string& name = (*model)->outputs()[r].name;
    ok = compare(name + " against the interpreter", outputs->at(name), (*reference)[r], 1e-4, 1e-5) && ok;
    if (auto it = expected.find(name); it != expected.end())
      ok = compare(name + " against " + name + "'s expected values", outputs->at(name), it->second, 1e-4, 1e-5) && ok;
  }
  for (const auto& [name, tensor] : expected)
    if (!outputs->count(name)) {
      std::cerr << "kiln-embed-run: the model has no output '" << name << "'\n";
      ok = false;
    }
  return ok ? 0 : 1;
}
