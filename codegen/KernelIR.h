// The kernel IR (docs/codegen.md section 2): a kernel is a loop nest over
// buffers whose statements store scalar expressions. Both emitters (LLVM for
// the CPU, CUDA C++ later) consume this one description, so every indexing
// decision is made once, here and in the lowerings, never in an emitter.
//
// Shapes are static: the CPU executor specializes a function to the shapes
// of its bound inputs before lowering (and recompiles for a new shape set),
// so extents and strides are constants that LLVM folds. The `sizes` kernel
// argument of docs/codegen.md is kept in the signature for the symbolic-shape
// kernels of `.kc` files; nothing reads it yet.
//
// Expressions are immutable trees shared by pointer: a lowering builds the
// expression of one result element out of its operands' expressions, which
// is what lets a fused group compose its ops' lowerings.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/Types.h"

namespace kiln::kir {

/// Scalar functions of one argument (the float math of the unary ops).
enum class UnaryFn : uint8_t {
  Neg,
  Abs,
  Sign,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Reciprocal,
  Tanh,
  Sigmoid,
  Relu,
  Erf,
  Sin,
  Cos,
  Tan,
  Asin,
  Acos,
  Atan,
  Sinh,
  Cosh,
  Asinh,
  Acosh,
  Atanh,
  Floor,
  Ceil,
  Round,
  Not,
  IsNan,
  IsInf,
};

/// Scalar functions of two arguments. Index arithmetic uses Add..Mod and
/// Min/Max on i64; `Div`/`Rem` truncate on integers, `Mod` has the sign of
/// the divisor (Python %). Integer division by zero yields 0 (no trap).
enum class BinaryFn : uint8_t { Add, Sub, Mul, Div, Rem, Mod, Pow, Max, Min, And, Or, Xor, Eq, Ne, Lt, Le, Gt, Ge };

/// How a reduction combines: its identity and combiner follow from the kind.
enum class ReduceKind : uint8_t { Sum, Prod, Max, Min, ArgMax, ArgMin };

enum class ExprKind : uint8_t { Const, Var, Load, Unary, Binary, Select, Cast, Reduce };

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

/// A scalar or index expression. Index expressions have dtype i64;
/// predicates have dtype bool.
struct Expr {
  ExprKind kind;
  DType type;
  // Const: the value (integers in `intValue`, floats in `floatValue`).
  int64_t intValue = 0;
  double floatValue = 0;
  // Var: loop variable id; Load: buffer number; Reduce: first variable id.
  int id = 0;
  UnaryFn unary = UnaryFn::Neg;
  BinaryFn binary = BinaryFn::Add;
  ReduceKind reduce = ReduceKind::Sum;
  bool selectLast = false;  // ArgMax/ArgMin: ties pick the last index
  // Load: {index}; Unary/Cast: {x}; Binary: {a, b}; Select: {cond, a, b};
  // Reduce: {body}.
  std::vector<ExprPtr> args = {};
  // Reduce: the extent of each reduction variable, ids `id`, `id + 1`, ...
  std::vector<int64_t> extents = {};
};

/// Expression constructors; the index ones fold constants, so that kernels
/// over static shapes print (and emit) without `i * 1 + 0` noise.
ExprPtr index(int64_t value);
ExprPtr constant(DType type, double value);
ExprPtr constantInt(DType type, int64_t value);
ExprPtr var(int id);
ExprPtr load(int buffer, DType type, ExprPtr index);
ExprPtr unary(UnaryFn fn, ExprPtr x);
/// Comparisons yield bool; other functions the operands' dtype.
ExprPtr binary(BinaryFn fn, ExprPtr a, ExprPtr b);
ExprPtr select(ExprPtr cond, ExprPtr a, ExprPtr b);
ExprPtr cast(ExprPtr x, DType to);
/// A reduction of `body` over variables `firstVar..` with `extents`. For
/// ArgMax/ArgMin there must be exactly one variable and the result is i64.
ExprPtr reduce(ReduceKind kind, int firstVar, std::vector<int64_t> extents, ExprPtr body, bool selectLast = false);

/// i64 helpers with folding.
ExprPtr add(ExprPtr a, ExprPtr b);
ExprPtr sub(ExprPtr a, ExprPtr b);
ExprPtr mul(ExprPtr a, ExprPtr b);
ExprPtr div(ExprPtr a, ExprPtr b);
ExprPtr rem(ExprPtr a, ExprPtr b);
ExprPtr min(ExprPtr a, ExprPtr b);
ExprPtr max(ExprPtr a, ExprPtr b);
/// The constant value of an i64 expression, if it is one.
bool isConstant(const ExprPtr& e, int64_t value);

/// A kernel parameter: `buffers[i]` of the kernel signature.
struct Buffer {
  enum class Role : uint8_t { Input, Output };
  std::string name;  // the IR value it holds, for printing
  DType dtype;
  std::vector<int64_t> shape;
  Role role;
};

struct Stmt;
using StmtPtr = std::shared_ptr<const Stmt>;

/// A statement: a counted loop or a store.
struct Stmt {
  enum class Kind : uint8_t { For, Store };
  Kind kind;
  // For: `var` runs over [0, extent); `parallel` marks a loop of
  // independent iterations (the CPU's threads split the outermost; CUDA's
  // grid takes it with the parallel or vectorized loops perfectly nested in
  // it, as the rows of a transpose tile); `vectorize` asks the emitter for
  // SIMD code.
  int var = 0;
  int64_t extent = 0;
  bool parallel = false;
  bool vectorize = false;
  std::vector<StmtPtr> body = {};
  // Store: buffers[buffer][index] = value.
  int buffer = 0;
  ExprPtr index = nullptr;
  ExprPtr value = nullptr;
};

StmtPtr forLoop(int var, int64_t extent, bool parallel, bool vectorize, std::vector<StmtPtr> body);
StmtPtr store(int buffer, ExprPtr index, ExprPtr value);

/// How a target runs one loop. Lowering marks which loops may run in
/// parallel (`parallel`: independent iterations) or in SIMD lanes
/// (`vectorize`: the contiguous innermost loop); a target's scheduler
/// (codegen/Schedule.h) decides which do and on what, and the emitters
/// follow the schedule.
enum class LoopMapping : uint8_t {
  Serial,   // one iteration after another, in one thread
  Threads,  // CPU: one contiguous slice per thread of the OpenMP team
  Vector,   // CPU: SIMD lanes (LLVM's loop vectorizer is asked to)
  Grid,     // CUDA: with the kernel's other Grid loops, one index space
            // that the grid's threads cover grid-stride
  Lanes,    // CUDA: strided over the threads that share a row
            // (Schedule::threadsPerRow), inside the Grid loops
  Tile,     // CPU: the rows of a square tile whose row loop is Vector: the
            // loads that step by one element along the rows and across
            // them by a stride (a transposed operand) are read as vectors
            // along the rows and transposed in registers, once per tile
            // (codegen/Schedule.h tileTransposedLoads)
};

/// A kernel's schedule for one target: the loops not Serial, and for CUDA
/// the threads per block and per row.
struct Schedule {
  std::string target;  // "cpu" or "cuda"; empty before a target schedules it
  std::vector<std::pair<int, LoopMapping>> loops;
  int blockSize = 0;
  /// CUDA: 0 when each thread computes whole result elements alone.
  /// Otherwise the threads that cooperate on one row, an iteration of the
  /// Grid loops (32: a warp per row; blockSize: a block per row): the
  /// reductions of the row's store that its Lanes loop does not change are
  /// computed by all of them, each thread a strided slice, then combined
  /// across the threads (codegen/Schedule.h, rowInvariantReductions).
  int threadsPerRow = 0;
  /// CUDA: 0 when each thread takes one element per step. Otherwise the
  /// consecutive elements each thread takes per step with one vector load
  /// per buffer read and one vector store (4: float4/int4), a scalar loop
  /// taking the last elements (codegen/Schedule.h).
  int vectorWidth = 0;
  LoopMapping of(int var) const;
};

/// One kernel: `void name(void** buffers, const int64_t* sizes, int64_t
/// begin, int64_t end)`, where [begin, end) bounds the loop mapped to
/// threads.
struct Kernel {
  std::string name;
  std::vector<Buffer> buffers;
  std::vector<StmtPtr> body = {};
  int numVars = 0;  // variable ids are 0..numVars-1
  Schedule schedule = {};
  /// The extent of the parallel loop, or 1 when there is none (the kernel
  /// then runs once with [0, 1)).
  int64_t parallelExtent() const;
};

/// The kernel in a readable form, for `kiln compile --emit=kernel` and lit
/// tests: buffers with their roles and types, the loop nest, and its
/// schedule when it has one (`} schedule cpu: %i0 threads, %i1 vector`).
std::string printKernel(const Kernel& kernel);
std::string printExpr(const ExprPtr& e);

}  // namespace kiln::kir
