// The op table: OpKind and the static description of each op, generated
// from Ops.def. Layers that handle every op (shape rules, the interpreter,
// decomposition, codegen) index their own per-op function arrays by OpKind.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "ir/Attributes.h"

namespace kiln {

enum class OpKind : uint16_t {
#define KILN_OP(Enum, ...) Enum,
#include "ir/Ops.def"
};

inline constexpr size_t kNumOpKinds = 0
#define KILN_OP(...) +1
#include "ir/Ops.def"
    ;

/// The broad family an op belongs to; shape rules and kernels are shared
/// within a family.
enum class OpClass : uint8_t {
  Unary,       // elementwise, same type out
  Binary,      // elementwise, broadcasting, same dtype out
  Logical,     // elementwise, broadcasting, bool in and out
  Compare,     // elementwise, broadcasting, bool out
  Select,      // cond ? x : y
  Constant,    // no operands; result type declared
  Cast,        // result dtype declared
  Layout,      // moves data without arithmetic
  Index,       // gather/scatter by integer indices
  Reduce,      // reduce over axes
  ArgReduce,   // index of an extreme along one axis
  Contraction, // matmul, conv
  Pool,        // windowed reductions
  Random,      // samples; result type declared
  Composite,   // decomposes into primitives
  Fused,       // a group of primitives held in the op's region
  Control,     // if and loop: bodies held in regions, run by the op
  Check,       // a run-time check of an operand on the host; no results
  Collective,  // communication between the ranks of a data-parallel job
  DataDependent,  // result sizes depend on operand values (nonzero, unique)
  Terminator,  // return
};

enum OpFlags : uint32_t { kNoFlags = 0, kCommutative = 1 };

inline constexpr bool kRequired = true;
inline constexpr bool kOptional = false;

/// One declared attribute of an op.
struct AttrSpec {
  std::string_view name;
  AttrKind kind;
  bool required;
  Attribute defaultValue;  // used when an optional attribute is absent
};

/// What the op table says about one op kind.
struct OpInfo {
  OpKind kind;
  std::string_view mnemonic;
  OpClass opClass;
  int minOperands;
  int maxOperands;  // -1: unbounded
  int numResults;   // -1: variadic
  uint32_t flags;
  std::string_view summary;
  std::span<const AttrSpec> attrs;

  bool isComposite() const { return opClass == OpClass::Composite; }
  bool isElementwise() const {
    return opClass == OpClass::Unary || opClass == OpClass::Binary || opClass == OpClass::Logical ||
           opClass == OpClass::Compare || opClass == OpClass::Select || opClass == OpClass::Cast;
  }
  /// Ops that own regions (bodies computing their results).
  bool hasRegion() const { return opClass == OpClass::Fused || opClass == OpClass::Control; }
  /// `if` and `loop`, whose regions are whole sub-programs run at the op.
  bool isControlFlow() const { return opClass == OpClass::Control; }
  bool isCommutative() const { return flags & kCommutative; }
  /// Ops whose result sizes depend on their operands' values, not only on
  /// their types: their shape rules give unknown dims there.
  bool hasDataDependentShape() const { return opClass == OpClass::DataDependent; }
  /// Ops whose results may differ between two evaluations, or that matter
  /// without results (CSE, DCE and folding leave them alone). A collective
  /// is one: every rank must run the same collectives in the same order.
  bool hasSideEffects() const {
    return opClass == OpClass::Random || opClass == OpClass::Check || opClass == OpClass::Collective;
  }
  const AttrSpec* findAttr(std::string_view name) const;
};

const OpInfo& opInfo(OpKind kind);
std::string_view opName(OpKind kind);
std::optional<OpKind> lookupOp(std::string_view mnemonic);
/// Every op kind, in table order.
std::span<const OpInfo> allOps();

}  // namespace kiln
