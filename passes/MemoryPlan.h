// The memory plan of one function: where each intermediate tensor lives in a
// single arena, and for which kernels. It is plain data, computed by
// planMemory (passes/PlanMemory.cpp, algorithm in docs/codegen.md §4), read
// by the runtime to bind kernel buffers, and printed by
// `kiln-opt --print-memory-plan` for lit tests.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace kiln {

/// A donated argument (XLA's input_output_alias, JAX's donate_argnums):
/// result `result` of the function is to end up in the memory of argument
/// `argument`, whose old value the caller gives up. The two must have the
/// same type. A training step donates each parameter and state argument to
/// the result that replaces it, so parameters stay in one buffer across
/// steps (docs/training.md).
struct ResultAlias {
  size_t result = 0;
  size_t argument = 0;
};

/// Where the intermediates of one function live in one arena.
struct MemoryPlan {
  /// Every offset is a multiple of this (a cache line, and the widest vector
  /// load of AVX-512), so kernels may use aligned vector accesses.
  static constexpr int64_t kAlignment = 64;

  /// One intermediate value and its place in the arena.
  struct Buffer {
    const Value* value = nullptr;
    /// The value's name hint, printed as `%name`.
    std::string name;
    int64_t size = 0;  // bytes
    /// How `size` was found. Exact: from a static type. Bound: the value
    /// is a result of an op whose result sizes depend on values
    /// (non_max_suppression, nonzero, unique) and `size` is the most it can
    /// take (ir/ShapeRules.h dataDependentBound); the run uses a prefix.
    /// Dynamic: no bound is known (a value computed from such a result):
    /// it takes no arena space (`size` 0, `offset` -1) and is allocated
    /// when its kernel runs.
    enum class Sizing : uint8_t { Exact, Bound, Dynamic };
    Sizing sizing = Sizing::Exact;
    int64_t alignment = kAlignment;
    int64_t offset = 0;  // bytes from the arena's start
    /// The kernels (indices into the function's kernel sequence) that write
    /// it first and read it last; it occupies memory for all of [first, last].
    int first = 0;
    int last = 0;
    /// Index in `buffers` of the input whose memory this value overwrites
    /// in place, or -1.
    int inPlaceOf = -1;
    /// Index in `buffers` of the input this value is a view of, or -1: the
    /// same bytes read as another shape (a reshape, or a transpose that
    /// moves only dims of size 1), or a run of them (a contiguous slice, at
    /// viewOffset, a multiple of kAlignment), so no kernel needs to compute it. The two
    /// share memory while either is live (isView).
    int viewOf = -1;
    /// Bytes from viewOf's first byte to this value's: 0 but for a slice
    /// that is one run of its input's bytes (viewOffset).
    int64_t viewOffset = 0;
    /// Index in `buffers` of the concatenation whose buffer this value is
    /// placed in, or -1: its producer writes it straight into its slice of
    /// that buffer, so no concat copies it (docs/codegen.md §4, "Slices of
    /// a concatenation"). Always the outermost such buffer (a concat placed
    /// in a larger one passes its operands on), which is itself in no
    /// other. The two share memory while either is live.
    int sliceOf = -1;
    /// Bytes from the start of sliceOf's buffer to this value's first
    /// element; a multiple of kAlignment.
    int64_t sliceOffset = 0;
    /// The value's element strides inside sliceOf's buffer, one per dim,
    /// when they are not its own row-major strides (a slice along a dim
    /// that follows a dim of size above 1, e.g. channels of a channels-last
    /// batch); empty when the slice is contiguous. Only generated kernels
    /// write or read a strided value (codegen/Lowering.h BufferStrides).
    std::vector<int64_t> strides;
    /// For a `concat` in the arena: the operands (by position) its step
    /// copies into its slices, those neither placed there nor copied there
    /// by an earlier concat that shares the slice. None: the concat runs no
    /// step.
    std::vector<int> copiedOperands;
    /// Whether the value is a `concat`'s result (kept here because the plan
    /// outlives the function it was made for: a staged program's parts
    /// print their plans after their functions are gone).
    bool isConcat = false;
  };

  /// How a donated argument receives its result.
  struct Alias {
    size_t result = 0;
    size_t argument = 0;
    std::string argumentName;
    /// True: the kernel computing the result writes it straight into the
    /// argument's memory (no kernel after it, nor the function's results,
    /// reads the argument's old value; the kernel itself reads it only at
    /// the element it writes, see ReadsInPlace), or the result is the
    /// argument itself.
    /// False: the result is computed elsewhere (an arena buffer live to the
    /// end, or a caller's output when another result returns it too) and
    /// copied into the argument after the last kernel.
    bool inPlace = false;
    /// Why not in place: e.g. "kernel 7 reads %w after kernel 5 writes it".
    std::string whyCopied;
  };

  std::string function;  // the function's name
  /// In order of definition.
  std::vector<Buffer> buffers;
  /// The donated arguments planMemory was given, in their order.
  std::vector<Alias> aliases;
  /// The number of kernels: top-level ops other than constants and `return`.
  int numKernels = 0;
  /// The arena size: the end of the highest buffer, rounded to kAlignment.
  int64_t peak = 0;
  /// The arena size if nothing were reused: every buffer rounded to
  /// kAlignment, one after another.
  int64_t noReuseTotal = 0;

  /// The buffer of `v`, or null when `v` is not in the arena.
  const Buffer* find(const Value* v) const;
  /// The element strides of `v` in memory when they are not its row-major
  /// ones (Buffer::strides), else an empty vector.
  std::vector<int64_t> stridesOf(const Value* v) const;
  /// The operands (by position) that the step of concat `op` copies: the
  /// plan's copiedOperands for a concat in the arena, every operand for one
  /// outside it (a result the caller receives).
  std::vector<int> concatCopies(const Op& op) const;
  /// The alias of result `result`, or null when it has none.
  const Alias* aliasOfResult(size_t result) const;
  /// One line per buffer (`%name: offset O, size S, live [a, b]`, plus `, in
  /// place of %x`, `, view of %x`, `, slice of %c at +B` with `strides [..]`
  /// when strided, and for a concat `, copies operands [..]` or `, no
  /// step`; `size at most S` for a bound, `dynamic size` for a
  /// buffer outside the arena), one per alias (`result R -> argument %a: in place` or
  /// `: copied after the last kernel (why)`), then `peak P bytes, no reuse
  /// T bytes`.
  std::string str() const;
};

/// Whether kernel `op` reads its operand `operand` only at the element it
/// writes, when it writes it, so that its result may go into that operand's
/// memory. The code generator knows its kernels' loops and may answer; by
/// default a kernel that mayRunInPlace (an elementwise op or group) does,
/// for an operand of the result's element count.
using ReadsInPlace = std::function<bool(const Op& op, size_t operand)>;

/// Whether `op` computes a view of its operand: the same elements in the
/// same order, so its result may share the operand's memory. Reshapes, and
/// transposes whose permutation moves only dims of size 1.
bool isView(const Op& op);

/// The byte offset in its operand at which `op`'s result lies when the
/// result is a view of it: 0 for isView, the start of a `slice` whose
/// result is one run of its input's bytes (every dim before the sliced one
/// of size 1, every dim after it whole, steps 1: a channel range at batch
/// 1, rows of a matrix, an ONNX Split's outputs); nullopt otherwise.
std::optional<int64_t> viewOffset(const Op& op);

/// Plans the arena of `f`: each top-level op other than a constant or the
/// `return` is one kernel, in order. An error names the first value whose
/// shape is not static, unless an op with data-dependent result sizes gave
/// it (Buffer::Sizing). With `aliases`, each donated argument receives its
/// result in place where that is safe, else by a copy after the last kernel
/// (MemoryPlan::Alias); an error names a bad alias (an index out of range,
/// an argument or result named twice, types that differ). Without
/// `aliases`, the function's own result aliases are used. `check` ops are
/// not kernels: each reads a value its next kernel reads too.
Expected<MemoryPlan> planMemory(const Function& f, const std::vector<ResultAlias>& aliases = {},
                                const ReadsInPlace& readsInPlace = nullptr);

/// Whether `aliases` fit `f`: results and arguments that exist, each used
/// once, of equal types; the error names the first that does not.
Status checkAliases(const Function& f, const std::vector<ResultAlias>& aliases);

}  // namespace kiln
