// The roles of a decoder-only model's inputs and outputs and the programs
// text generation runs (generation/Decoder.h, docs/generate.md).
//
// A model without a cache is compiled once at the longest length the run
// needs (the positions after the current one hold padding: in a causal
// model they cannot change the logits before them; generation/Generate.cpp
// checks that). A model whose import fails at that length may have a table
// of learned positions: the longest length it takes is then found by
// bisection, so that the error can name it.
#include "generation/Decoder.h"

#include <algorithm>
#include <limits>

#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "ir/Verifier.h"
#include "passes/PassManager.h"
#include "runtime/InputCheck.h"

namespace kiln::generation {

std::string count(int64_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

Expected<Signature> readSignature(const std::string& path) {
  Signature signature;
  if (path.ends_with(".onnx")) {
    auto onnx = readOnnxSignature(path);
    if (!onnx) return onnx.takeError();
    for (auto& [name, type] : onnx->inputs) signature.inputs.push_back({name, type});
    for (auto& [name, type] : onnx->outputs) signature.outputs.push_back({name, type});
    return signature;
  }
  LoadOptions options;
  options.evaluator = &Session::evaluator();
  auto module = loadModel(path, options);
  if (!module) return module.takeError();
  KILN_TRY(verify(**module));
  if ((*module)->functions().empty()) return Error(path + ": the model holds no function to run");
  const Function& f = *(*module)->functions().front();
  for (size_t i = 0; i < f.numArguments(); ++i)
    if (!f.argumentDefault(i)) signature.inputs.push_back({f.argument(i)->name(), f.argument(i)->type()});
  for (size_t i = 0; i < f.resultTypes().size(); ++i)
    signature.outputs.push_back({f.resultName(i), f.resultTypes()[i]});
  return signature;
}

Expected<Decoder> decoderOf(const Signature& s, const std::string& path) {
  const std::string where = path + ": ";
  Decoder d;
  std::map<std::string, TensorType> outputs;
  for (const Port& p : s.outputs) outputs.emplace(p.name, p.type);
  // The token ids: the input named input_ids, else the one integer matrix.
  std::vector<const Port*> ids;
  for (const Port& p : s.inputs)
    if (p.name == "input_ids") ids = {&p};
  if (ids.empty())
    for (const Port& p : s.inputs)
      if (isInteger(p.type.dtype) && p.type.rank() == 2 && !p.name.starts_with("past_")) ids.push_back(&p);
  if (ids.size() != 1)
    return Error(where + (ids.empty() ? "no input takes token ids" : "several inputs could take the token ids") +
                 " (an integer input [batch, length], or one named input_ids); kiln generate runs decoder-only "
                 "models (docs/generate.md)");
  d.ids = ids[0]->name;
  d.idsType = ids[0]->type;
  if (d.idsType.dtype != DType::I64 || d.idsType.rank() != 2)
    return Error(where + "input '" + d.ids + "' is " + d.idsType.str() +
                 "; kiln generate feeds token ids as i64[batch, length]");
  // The logits: the output named logits, else the first.
  if (s.outputs.empty()) return Error(where + "the model has no output");
  const Port* logits = &s.outputs.front();
  for (const Port& p : s.outputs)
    if (p.name == "logits") logits = &p;
  d.logits = logits->name;
  d.logitsType = logits->type;
  if (!isFloat(d.logitsType.dtype) || d.logitsType.rank() != 3)
    return Error(where + "output '" + d.logits + "' is " + d.logitsType.str() +
                 "; kiln generate expects logits, a float tensor [batch, length, vocab]");

  for (const Port& p : s.inputs) {
    if (p.name == d.ids) continue;
    if (p.name.starts_with("past_")) {
      const std::string present = "present_" + p.name.substr(5);
      auto out = outputs.find(present);
      if (out == outputs.end())
        return Error(where + "cache input '" + p.name + "' has no output '" + present +
                     "' to take its new value from (docs/generate.md)");
      if (p.type.rank() != 4)
        return Error(where + "cache input '" + p.name + "' is " + p.type.str() +
                     "; kiln generate expects caches [batch, heads, capacity, head_dim] (docs/generate.md)");
      for (size_t k = 1; k < 4; ++k)
        if (!p.type.shape[k].isStatic())
          return Error(where + "cache input '" + p.name + "' is " + p.type.str() + ": dim " + std::to_string(k) +
                       " is not fixed; export the cache with a fixed capacity, only its batch (dim 0) may vary");
      bool sameType = out->second.dtype == p.type.dtype && out->second.rank() == 4;
      // Output dims the export left unknown are checked once specialized.
      for (size_t k = 1; sameType && k < 4; ++k)
        sameType = !out->second.shape[k].isStatic() || out->second.shape[k].size == p.type.shape[k].size;
      if (!sameType)
        return Error(where + "cache output '" + present + "' is " + out->second.str() + ", its input '" + p.name +
                     "' " + p.type.str() + "; they must have the same type");
      d.caches.push_back({p.name, present, p.type});
    } else if (p.name == "position") {
      d.position = p.name;
      d.positionType = p.type;
    } else {
      return Error(where + "input '" + p.name + "' (" + p.type.str() +
                   ") is neither the token ids, 'position' nor a cache 'past_*'; kiln generate feeds only those "
                   "(docs/generate.md)");
    }
  }
  if (d.cached() && d.position.empty())
    return Error(where + "the model has cache inputs (" + d.caches.front().past +
                 ", ...) but no input 'position' saying how many tokens the caches hold (docs/generate.md)");
  if (!d.cached() && !d.position.empty())
    return Error(where + "the model has an input 'position' but no cache inputs 'past_*' (docs/generate.md)");
  if (!d.position.empty() &&
      (!isInteger(d.positionType.dtype) ||
       !(d.positionType.rank() == 0 || (d.positionType.rank() == 1 && d.positionType.shape[0].size == 1))))
    return Error(where + "input 'position' is " + d.positionType.str() +
                 "; kiln generate expects an integer scalar (or one-element vector)");
  return d;
}

int64_t cacheCapacity(const Decoder& d) {
  int64_t capacity = std::numeric_limits<int64_t>::max();
  for (const Decoder::Cache& c : d.caches) capacity = std::min(capacity, c.type.shape[2].size);
  return capacity;
}

/// `type` with symbolic dim 0 taken by `batch`.
std::vector<int64_t> withBatch(const TensorType& type, int64_t batch) {
  std::vector<int64_t> dims;
  for (size_t k = 0; k < type.shape.size(); ++k)
    dims.push_back(k == 0 && !type.shape[0].isStatic() ? batch : type.shape[k].size);
  return dims;
}

Status loadProgram(const std::string& path, const Decoder& d, const std::map<std::string, std::vector<int64_t>>& shapes,
                   Program& program, std::ostream& log) {
  LoadOptions options;
  options.evaluator = &Session::evaluator();
  options.inputShapes = shapes;
  auto module = loadModel(path, options);
  if (!module) return module.takeError();
  if ((*module)->functions().empty()) return Error(path + ": the model holds no function to run");
  KILN_TRY(verify(**module));
  PassContext ctx;
  ctx.evaluator = &Session::evaluator();
  PassManager pm({}, ctx);
  KILN_TRY(pm.addPipeline("infer-shapes"));
  KILN_TRY(pm.run(**module, log));
  program.module = std::move(*module);
  const Function& f = *program.module->functions().front();
  program.function = &f;

  std::map<std::string, size_t> arguments, results;
  for (size_t i = 0; i < f.numArguments(); ++i) arguments[f.argument(i)->name()] = i;
  for (size_t i = 0; i < f.resultTypes().size(); ++i) results[f.resultName(i)] = i;
  // Each role's index by name; an import that renamed one is an error.
  std::string missing;
  auto index = [&](const std::map<std::string, size_t>& names, const std::string& name, const char* kind) {
    auto it = names.find(name);
    if (it != names.end()) return it->second;
    if (missing.empty()) missing = path + ": " + kind + " '" + name + "' is gone after import";
    return size_t{0};
  };
  program.ids = index(arguments, d.ids, "input");
  program.logits = index(results, d.logits, "output");
  if (d.cached()) {
    program.position = index(arguments, d.position, "input");
    for (const Decoder::Cache& c : d.caches)
      program.aliases.push_back({index(results, c.present, "output"), index(arguments, c.past, "input")});
  }
  if (!missing.empty()) return Error(missing);
  // Every input zeroed at its shape (arguments with a default take it);
  // each is checked against the specialized signature, so that a prompt
  // whose batch or length the model does not take is named here.
  SymbolBindings symbols;
  program.inputs.resize(f.numArguments());
  for (size_t i = 0; i < f.numArguments(); ++i) {
    const std::string& name = f.argument(i)->name();
    if (const DenseTensor* dflt = f.argumentDefault(i); dflt && !shapes.count(name)) {
      program.inputs[i] = Tensor::fromDense(*dflt);
      continue;
    }
    auto shape = shapes.find(name);
    if (shape == shapes.end()) return Error(path + ": input '" + name + "' has no value");
    const DType dtype = name == d.ids ? DType::I64 : f.argument(i)->type().dtype;
    program.inputs[i] = Tensor(dtype, shape->second);
    if (auto problem = checkInput(name, f.argument(i)->type(), program.inputs[i], "from kiln generate", symbols))
      return Error(path + ": " + *problem);
  }
  const TensorType& logitsType = f.resultTypes()[program.logits];
  const std::vector<int64_t>& idsShape = shapes.at(d.ids);
  if (logitsType.rank() != 3 || !logitsType.isStatic() || logitsType.shape[0].size != idsShape[0] ||
      logitsType.shape[1].size != idsShape[1])
    return Error(path + ": output '" + d.logits + "' is " + logitsType.str() + " for input '" + d.ids + "' i64[" +
                 std::to_string(idsShape[0]) + "," + std::to_string(idsShape[1]) +
                 "]; kiln generate expects logits [batch, length, vocab] of the same batch and length");
  return Status::success();
}

std::optional<std::pair<int64_t, std::string>> longestLoadableLength(const std::string& path, const Decoder& d,
                                                                     int64_t batch, int64_t loads, int64_t fails,
                                                                     Error failure, std::ostream& log) {
  auto tryLength = [&](int64_t length) {
    Program probe;
    return loadProgram(path, d, {{d.ids, {batch, length}}}, probe, log);
  };
  if (!tryLength(loads)) return std::nullopt;
  while (fails - loads > 1) {
    const int64_t middle = loads + (fails - loads) / 2;
    if (Status s = tryLength(middle); s) {
      loads = middle;
    } else {
      fails = middle;
      failure = s.takeError();
    }
  }
  std::string why = failure.location().isUnknown() ? failure.message() : failure.str();
  // The reason without the file name the message starts with.
  if (why.starts_with(path + ": ")) why = why.substr(path.size() + 2);
  return std::pair{loads, why};
}

Expected<std::vector<Program>> loadPrograms(const std::string& modelPath, const Decoder& d, int64_t batch,
                                            int64_t promptLength, int64_t newTokens, std::ostream& log) {
  // The longest sequence the model is run on: the last new token is chosen,
  // never fed.
  const int64_t longest = std::max(promptLength, promptLength + newTokens - 1);
  std::vector<Program> programs(1);
  if (d.cached()) {
    const int64_t capacity = cacheCapacity(d);
    if (longest > capacity)
      return Error(modelPath + ": the prompt (" + count(promptLength, "token") + ") and " +
                   count(newTokens, "new token") + " need " + std::to_string(longest) +
                   " positions of the cache, which holds " + std::to_string(capacity) + " ('" + d.caches.front().past +
                   "' is " + d.caches.front().type.str() +
                   "); export the model with a larger cache, or ask for fewer tokens");
    // The prefill program takes the prompt, the decode program one token
    // (a one-token prompt needs only the latter).
    std::vector<int64_t> lengths = {promptLength};
    if (promptLength != 1) lengths.push_back(1);
    programs.resize(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) {
      std::map<std::string, std::vector<int64_t>> shapes{{d.ids, {batch, lengths[i]}}};
      shapes[d.position] = withBatch(d.positionType, batch);
      for (const Decoder::Cache& c : d.caches) shapes[c.past] = withBatch(c.type, batch);
      if (Status s = loadProgram(modelPath, d, shapes, programs[i], log); !s) return s.error();
    }
  } else {
    // Static length: the model's own; symbolic: the longest needed.
    const Dim& length = d.idsType.shape[1];
    if (length.isStatic() && longest > length.size)
      return Error(modelPath + ": input '" + d.ids + "' is " + d.idsType.str() + ": the prompt (" +
                   count(promptLength, "token") + ") and " + count(newTokens, "new token") + " need " +
                   std::to_string(longest) + " positions");
    const int64_t runLength = length.isStatic() ? length.size : longest;
    if (Status s = loadProgram(modelPath, d, {{d.ids, {batch, runLength}}}, programs[0], log); !s) {
      if (length.isStatic() || runLength <= promptLength) return s.error();
      auto longestTaken = longestLoadableLength(modelPath, d, batch, promptLength, runLength, s.error(), log);
      if (!longestTaken) return s.error();
      return Error(modelPath + ": the prompt (" + count(promptLength, "token") + ") and " +
                   count(newTokens, "new token") + " need " + std::to_string(longest) +
                   " positions, and the model takes at most " + std::to_string(longestTaken->first) + " (at " +
                   std::to_string(longestTaken->first + 1) + ": " + longestTaken->second +
                   "); export the model with more positions, or ask for fewer tokens");
    }
  }
  return programs;
}

}  // namespace kiln::generation
