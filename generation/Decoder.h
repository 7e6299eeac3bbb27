// The model side of text generation (docs/generate.md): what a
// decoder-only model's inputs and outputs are for (the token ids, the logits,
// and with a key/value cache the position and each past_X/present_X pair),
// read from its file without specializing it, and the programs `kiln
// generate` runs: the model loaded for static input shapes (a prefill and a
// one-token decode program with a cache, one program at the longest length
// without), with the indices of those roles and zeroed inputs. Kiln compiles
// static shapes (codegen/cpu/CpuExecutable.h), so each program is compiled once
// for the shapes it runs at and reused for every step (generation/Generate.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "driver/Session.h"
#include "ir/IR.h"
#include "ir/Support.h"
#include "passes/MemoryPlan.h"
#include "runtime/Tensor.h"

namespace kiln::generation {

/// A graph input or output as the file declares it.
struct Port {
  std::string name;
  TensorType type;
};

/// The model's data inputs (those without a default) and outputs, read
/// without specializing it: an ONNX model that computes shapes from a
/// dynamic length imports only once given static shapes.
struct Signature {
  std::vector<Port> inputs, outputs;
};

/// Reads the signature of the model file at `path` (.onnx, .kiln, .kiln.txt, .kir).
Expected<Signature> readSignature(const std::string& path);

/// How kiln generate feeds a model (docs/generate.md).
struct Decoder {
  std::string ids;  // the token ids input, i64[batch, length]
  TensorType idsType;
  std::string logits;  // the logits output, [batch, length, vocab]
  TensorType logitsType;
  /// With a cache: the position input (the number of tokens already in the
  /// caches), and each cache: past_X in, present_X out.
  std::string position;
  TensorType positionType;
  struct Cache {
    std::string past, present;
    TensorType type;
  };
  std::vector<Cache> caches;
  bool cached() const { return !caches.empty(); }
};

/// The roles of the model's inputs and outputs, or an error naming what does
/// not fit a decoder-only model.
Expected<Decoder> decoderOf(const Signature& s, const std::string& path);

/// The capacity of the caches: the positions they hold, dim 2 of
/// [batch, heads, capacity, head_dim] (the smallest, should they differ).
int64_t cacheCapacity(const Decoder& d);

/// `type` with symbolic dim 0 taken by `batch`.
std::vector<int64_t> withBatch(const TensorType& type, int64_t batch);

/// One program of the model: the model loaded for static input shapes, and
/// its argument and result indices by name.
struct Program {
  std::unique_ptr<Module> module;
  const Function* function = nullptr;
  std::vector<Tensor> inputs;  // one per argument, kept across steps
  size_t ids = 0, position = 0, logits = 0;
  std::vector<ResultAlias> aliases;  // present_X -> past_X
  std::unique_ptr<CompiledModel> compiled;
};

/// Loads `path` specialized to `shapes` and fills `program`'s indices and
/// zeroed inputs; a model whose specialized signature does not fit is an
/// error naming what. Shape inference's diagnostics go to `log`.
Status loadProgram(const std::string& path, const Decoder& d, const std::map<std::string, std::vector<int64_t>>& shapes,
                   Program& program, std::ostream& log);

/// For a model without a cache that loads at `loads` tokens but not at
/// `fails` (whose error is `failure`): the longest length it loads at, found
/// by bisection, and why it does not load at one more. A model with a table
/// of learned positions (GPT's position embedding) takes at most as many
/// tokens as the table has rows; past that, its position Gather fails when
/// the import folds it. Nullopt when it does not load at `loads` either.
std::optional<std::pair<int64_t, std::string>> longestLoadableLength(const std::string& path, const Decoder& d,
                                                                     int64_t batch, int64_t loads, int64_t fails,
                                                                     Error failure, std::ostream& log);

/// The programs that generate `newTokens` tokens after a prompt of
/// `promptLength` tokens in each of `batch` sequences: with a cache, a
/// prefill program specialized to the prompt's length and a decode program
/// specialized to one token (only the latter for a one-token prompt);
/// without, one program at the model's static length or at the longest
/// length the run needs. An error names a prompt and token count the model
/// cannot hold (its cache capacity, its positions).
Expected<std::vector<Program>> loadPrograms(const std::string& modelPath, const Decoder& d, int64_t batch,
                                            int64_t promptLength, int64_t newTokens, std::ostream& log);

/// "1 token", "5 tokens".
std::string count(int64_t n, const std::string& noun);

}  // namespace kiln::generation
