// Building a difffuzz case into IR and back, widening it to f64, and
// dropping dead nodes (Case.h).
#include "fuzz/difffuzz/Case.h"

#include <unordered_map>

#include "ir/Builder.h"
#include "ir/Verifier.h"

namespace kiln::difffuzz {

Expected<BuiltCase> build(const Case& c) {
  BuiltCase out;
  out.module = std::make_unique<Module>();
  Function* f = out.module->addFunction("main");
  std::vector<Value*> values;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    values.push_back(f->addArgument(c.inputs[i].type(), "x" + std::to_string(i)));
  Builder b(*f);
  for (const Node& n : c.nodes) {
    std::vector<Value*> operands;
    for (int v : n.operands) {
      if (v < 0 || v >= static_cast<int>(values.size())) return Error("a node reads value " + std::to_string(v) + ", not defined before it");
      operands.push_back(values[static_cast<size_t>(v)]);
    }
    if (n.kind == OpKind::Constant) {
      auto it = n.attrs.find("value");
      if (it == n.attrs.end() || it->second.kind() != AttrKind::Tensor) return Error("a constant node has no value");
      values.push_back(b.constant(it->second.getTensor()));
    } else {
      auto op = b.build(n.kind, std::move(operands), n.attrs, n.declared);
      if (!op) return op.takeError();
      if ((*op)->numResults() != 1) return Error("difffuzz nodes have one result");
      values.push_back((*op)->result(0));
    }
    out.ops.push_back(values.back()->definingOp());
  }
  std::vector<Value*> results;
  for (int v : c.outputs) {
    if (v < 0 || v >= static_cast<int>(values.size())) return Error("an output names value " + std::to_string(v) + ", which does not exist");
    results.push_back(values[static_cast<size_t>(v)]);
  }
  if (results.empty()) return Error("a case needs an output");
  b.ret(results);
  Status ok = verify(*out.module);
  if (!ok) return ok.takeError();
  return out;
}

Expected<Case> fromFunction(const Function& f, std::vector<Tensor> inputs) {
  if (inputs.size() != f.numArguments())
    return Error("the function takes " + std::to_string(f.numArguments()) + " inputs, " +
                 std::to_string(inputs.size()) + " given");
  Case c;
  c.inputs = std::move(inputs);
  c.pattern = "replay";
  std::unordered_map<const Value*, int> number;
  for (size_t i = 0; i < f.numArguments(); ++i) number[f.argument(i)] = static_cast<int>(i);
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Return) {
      for (Value* v : op->operands()) c.outputs.push_back(number.at(v));
      continue;
    }
    if (op->numResults() != 1 || op->numRegions() != 0)
      return op->emitError("is not a single-result op without regions, which difffuzz cases are made of");
    Node n{op->kind(), {}, op->attrs(), {}};
    for (Value* v : op->operands()) n.operands.push_back(number.at(v));
    // Ops whose result comes from the declaration keep it.
    if (op->kind() == OpKind::Broadcast || op->kind() == OpKind::Reshape || op->kind() == OpKind::Cast)
      n.declared = {op->result()->type()};
    number[op->result()] = c.numValues();
    c.nodes.push_back(std::move(n));
  }
  return c;
}

namespace {

Tensor widen(const Tensor& t) {
  if (t.dtype() != DType::F32) return t;
  Tensor w(DType::F64, t.shape());
  for (int64_t i = 0; i < t.numElements(); ++i) w.setDouble(i, t.getDouble(i));
  return w;
}

}  // namespace

Case widenToF64(const Case& c) {
  Case w = c;
  for (Tensor& t : w.inputs) t = widen(t);
  for (Node& n : w.nodes) {
    for (TensorType& t : n.declared)
      if (t.dtype == DType::F32) t.dtype = DType::F64;
    auto it = n.attrs.find("value");
    if (n.kind == OpKind::Constant && it != n.attrs.end())
      it->second = Attribute(widen(Tensor::fromDense(it->second.getTensor())).toDense());
  }
  return w;
}

void removeDeadNodes(Case& c) {
  const int numInputs = static_cast<int>(c.inputs.size());
  std::vector<bool> live(static_cast<size_t>(c.numValues()), false);
  for (int v : c.outputs) live[static_cast<size_t>(v)] = true;
  for (size_t i = c.nodes.size(); i-- > 0;)
    if (live[static_cast<size_t>(c.nodeValue(i))])
      for (int v : c.nodes[i].operands) live[static_cast<size_t>(v)] = true;
  // Unused inputs go too.
  std::vector<int> renumber(live.size(), -1);
  Case out;
  out.pattern = c.pattern;
  for (int i = 0; i < numInputs; ++i)
    if (live[static_cast<size_t>(i)]) {
      renumber[static_cast<size_t>(i)] = static_cast<int>(out.inputs.size());
      out.inputs.push_back(c.inputs[static_cast<size_t>(i)]);
    }
  std::vector<Node> nodes;
  for (size_t i = 0; i < c.nodes.size(); ++i)
    if (live[static_cast<size_t>(c.nodeValue(i))]) nodes.push_back(c.nodes[i]);
  int next = static_cast<int>(out.inputs.size());
  for (size_t i = 0; i < c.nodes.size(); ++i)
    if (live[static_cast<size_t>(c.nodeValue(i))]) renumber[static_cast<size_t>(c.nodeValue(i))] = next++;
  for (Node& n : nodes)
    for (int& v : n.operands) v = renumber[static_cast<size_t>(v)];
  out.nodes = std::move(nodes);
  for (int v : c.outputs) out.outputs.push_back(renumber[static_cast<size_t>(v)]);
  c = std::move(out);
}

}  // namespace kiln::difffuzz
