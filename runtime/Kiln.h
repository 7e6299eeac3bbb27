// Kiln's embedding API: run a model compiled by `kiln compile -o model.kc`
// from a C++ program. It needs only this library (kiln_runtime, with
// kiln_ir): no LLVM, no protobuf, no compiler.
//
//   auto model = kiln::Model::load("mlp.kc");
//   if (!model) { std::cerr << model.error().str(); return 1; }
//   kiln::Tensor x(kiln::DType::F32, {1, 64});
//   auto outputs = (*model)->run({{"x", x}});      // by name
//   const kiln::Tensor& logits = outputs->at("logits");
//
// A `.kc` holds machine code for the CPU it was compiled on: load() checks
// the file and that this CPU has the instruction-set features the code was
// built for, and refuses it otherwise, naming what is missing (compile the
// model on this machine then). Trust a `.kc` as you would a program from
// the same place: it runs native code.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/Support.h"
#include "ir/Types.h"
#include "runtime/Tensor.h"

namespace kiln {

class LoadedProgram;
struct CpuProgram;

struct ModelOptions {
  /// Threads that split each step; 0: every core this process may use.
  int threads = 0;
};

class Model {
 public:
  /// One input or output: its name (a graph input or output name), type,
  /// and for inputs whether it may be left out (it has a default).
  struct Port {
    std::string name;
    TensorType type;
    bool optional = false;
  };

  /// Loads and checks `path`, a `.kc` file.
  static Expected<std::unique_ptr<Model>> load(const std::string& path, ModelOptions options = {});
  /// The same from a `.kc` file's bytes; `name` names them in errors.
  static Expected<std::unique_ptr<Model>> fromBytes(std::string_view bytes, const std::string& name,
                                                    ModelOptions options = {});
  ~Model();

  const std::vector<Port>& inputs() const { return inputs_; }
  const std::vector<Port>& outputs() const { return outputs_; }

  /// Runs on inputs given by name; inputs with a default may be left out.
  /// An unknown name, a missing input or a tensor of another type than its
  /// port's is an error naming it. Returns the outputs by name.
  Expected<std::map<std::string, Tensor>> run(const std::map<std::string, Tensor>& inputs);
  /// Runs on every input in the order of inputs(); returns the outputs in
  /// the order of outputs().
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);

 private:
  Model() = default;
  std::shared_ptr<const CpuProgram> program_;
  std::unique_ptr<LoadedProgram> runner_;
  std::vector<Port> inputs_, outputs_;
};

}  // namespace kiln
