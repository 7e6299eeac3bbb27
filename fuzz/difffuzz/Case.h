// The differential fuzzer's test case (fuzz/difffuzz/README.md): a small
// graph held as a list of nodes over numbered values, with the input
// tensors it runs on. Values 0..inputs-1 are the function's arguments and
// value inputs+i is node i's result, so the shrinker can drop a node, turn
// one into an argument, or cut an input's dims by editing lists and
// building the Function again with the Builder (whose shape rules refuse
// what no longer fits). A case converts to and from a `.kir` function.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "runtime/Tensor.h"

namespace kiln::difffuzz {

/// One op of a case: single-result ops only.
struct Node {
  OpKind kind;
  std::vector<int> operands;  // value numbers
  AttrMap attrs;
  /// The result type, for ops that take it from the declaration (broadcast,
  /// reshape, cast); empty otherwise.
  std::vector<TensorType> declared;
};

struct Case {
  std::vector<Tensor> inputs;
  std::vector<Node> nodes;
  std::vector<int> outputs;  // value numbers
  std::string pattern;       // what the generator meant to exercise

  int numValues() const { return static_cast<int>(inputs.size() + nodes.size()); }
  int nodeValue(size_t node) const { return static_cast<int>(inputs.size() + node); }
};

/// A case built into a module (function `main`), verified; `ops[i]` is node
/// i's op.
struct BuiltCase {
  std::unique_ptr<Module> module;
  std::vector<const Op*> ops;
  const Function& function() const { return *module->functions().front(); }
};

/// Builds `c` with the Builder (result types from the shape rules) and
/// verifies it; an error when a shape rule or the verifier refuses it.
Expected<BuiltCase> build(const Case& c);

/// The case of a parsed function: its ops (single-result, no regions) become
/// nodes and `inputs` its arguments' values.
Expected<Case> fromFunction(const Function& f, std::vector<Tensor> inputs);

/// A copy of `c` computed in f64: f32 inputs, constants and declared types
/// widened (the conditioning reference of the tolerance rule).
Case widenToF64(const Case& c);

/// Removes nodes no output depends on, renumbering values.
void removeDeadNodes(Case& c);

/// Total number of ops of the case.
inline size_t numOps(const Case& c) { return c.nodes.size(); }

}  // namespace kiln::difffuzz
