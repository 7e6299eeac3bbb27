// scheduleForCpu and scheduleForCuda (Schedule.h), with the analysis that
// CUDA's row schedule and the CUDA emitter share: which reductions of a
// store are the same for every element of a row.
#include "codegen/Schedule.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_set>

#include "codegen/cpu/CpuTarget.h"
#include "codegen/cuda/CudaTarget.h"

namespace kiln::codegen {
namespace {

using kir::Expr;
using kir::ExprKind;
using kir::ExprPtr;

/// Threads per block of every CUDA kernel.
constexpr int kCudaBlockSize = 256;
constexpr int kWarpSize = 32;
/// Elements per step of a vectorized CUDA kernel: 16 bytes of a 4-byte dtype.
constexpr int kCudaVectorWidth = 4;

bool usesVar(const Expr& e, int var) {
  if (e.kind == ExprKind::Var) return e.id == var;
  for (const ExprPtr& arg : e.args)
    if (usesVar(*arg, var)) return true;
  return false;
}

/// Whether every variable of `e` that `e` does not bind itself is in `allowed`.
bool freeVarsWithin(const Expr& e, const std::set<int>& allowed, std::set<int>& bound) {
  if (e.kind == ExprKind::Var) return bound.count(e.id) || allowed.count(e.id);
  std::vector<int> added;
  if (e.kind == ExprKind::Reduce)
    for (size_t k = 0; k < e.extents.size(); ++k)
      if (bound.insert(e.id + static_cast<int>(k)).second) added.push_back(e.id + static_cast<int>(k));
  bool within = true;
  for (const ExprPtr& arg : e.args) within = within && freeVarsWithin(*arg, allowed, bound);
  for (int v : added) bound.erase(v);
  return within;
}

/// Whether `reduction` walks memory contiguously: every load its innermost
/// variable moves steps one element per iteration, so that the consecutive
/// iterations a warp's lanes take read consecutive addresses (a row, not a
/// column: a matmul's right operand or a conv's input would be read with a
/// stride, which one thread per element reads better).
bool isContiguous(const Expr& reduction) {
  const int inner = reduction.id + static_cast<int>(reduction.extents.size()) - 1;
  std::function<bool(const Expr&)> visit = [&](const Expr& e) {
    if (e.kind == ExprKind::Load && usesVar(*e.args[0], inner) && strideIn(*e.args[0], inner) != 1) return false;
    for (const ExprPtr& arg : e.args)
      if (!visit(*arg)) return false;
    return true;
  };
  return visit(*reduction.args[0]);
}


void appendKey(const Expr& e, std::map<int, std::string>& bound, int depth, std::string& key) {
  key += std::to_string(static_cast<int>(e.kind)) + ":" + std::to_string(static_cast<int>(e.type));
  switch (e.kind) {
    case ExprKind::Const: {
      uint64_t bits;
      std::memcpy(&bits, &e.floatValue, sizeof bits);
      key += "=" + std::to_string(e.intValue) + "/" + std::to_string(bits);
      break;
    }
    case ExprKind::Var: {
      const auto it = bound.find(e.id);
      key += it != bound.end() ? it->second : "i" + std::to_string(e.id);
      break;
    }
    case ExprKind::Load: key += "b" + std::to_string(e.id); break;
    case ExprKind::Unary: key += "u" + std::to_string(static_cast<int>(e.unary)); break;
    case ExprKind::Binary: key += "f" + std::to_string(static_cast<int>(e.binary)); break;
    case ExprKind::Select:
    case ExprKind::Cast: break;
    case ExprKind::Reduce:
      key += "r" + std::to_string(static_cast<int>(e.reduce)) + (e.selectLast ? "last" : "");
      for (size_t k = 0; k < e.extents.size(); ++k) {
        key += "<" + std::to_string(e.extents[k]);
        bound[e.id + static_cast<int>(k)] = "$" + std::to_string(depth) + "." + std::to_string(k);
      }
      ++depth;
      break;
  }
  key += "(";
  for (const ExprPtr& arg : e.args) {
    appendKey(*arg, bound, depth, key);
    key += ",";
  }
  key += ")";
  if (e.kind == ExprKind::Reduce)
    for (size_t k = 0; k < e.extents.size(); ++k) bound.erase(e.id + static_cast<int>(k));
}

/// Makes `kernel` a row schedule if its shape has one that pays: its
/// `grid` loops (outermost first, perfectly nested) hold one store, and
/// the reductions that are the same across a row are long enough
/// (CudaScheduleOptions) and read rows, not columns. Two candidates, in
/// order: the rows are the grid loops but the innermost, whose iterations
/// (a fused softmax's elements, each of which would recompute the row's
/// max and sum) the row's threads then write strided; or the rows are all
/// of them (a reduce op, a layer norm's mean), written by one thread.
void scheduleRows(kir::Kernel& kernel, const std::vector<const kir::Stmt*>& grid, const CudaScheduleOptions& options) {
  const std::vector<kir::StmtPtr>& body = grid.empty() ? kernel.body : grid.back()->body;
  if (body.size() != 1 || body[0]->kind != kir::Stmt::Kind::Store) return;
  const kir::Stmt& store = *body[0];
  for (const bool lanes : {true, false}) {
    if (lanes && (grid.empty() || grid.back()->extent <= 1)) continue;
    std::vector<int> rowVars;
    for (size_t k = 0; k + (lanes ? 1 : 0) < grid.size(); ++k) rowVars.push_back(grid[k]->var);
    int64_t longest = 0;
    bool rows = true;
    for (const ExprPtr& r : rowInvariantReductions(store, rowVars)) {
      longest = std::max(longest, iterations(*r));
      rows = rows && isContiguous(*r);
    }
    const int64_t repeats = lanes ? grid.back()->extent : 1;
    // Rows read across memory (a softmax over a transposed operand) are
    // shared by the row's threads all the same when each of the row's
    // elements would otherwise recompute a long reduction: strided loads
    // by a warp cost less than the row's reductions once per element.
    const bool recomputed = repeats > 16 && longest > 16;
    if ((!rows && !recomputed) || longest == 0 || longest * repeats < options.warpRowMin) continue;
    kir::Schedule& schedule = kernel.schedule;
    schedule.loops.clear();
    for (int v : rowVars) schedule.loops.emplace_back(v, kir::LoopMapping::Grid);
    if (lanes) schedule.loops.emplace_back(grid.back()->var, kir::LoopMapping::Lanes);
    schedule.threadsPerRow = longest >= options.blockRowMin ? schedule.blockSize : kWarpSize;
    return;
  }
}

/// The value of i64 index `e` with every variable 0, if `e` is built of
/// constants, variables, + - and * only.
std::optional<int64_t> valueAtZero(const Expr& e) {
  if (e.kind == ExprKind::Const) return e.intValue;
  if (e.kind == ExprKind::Var) return 0;
  if (e.kind != ExprKind::Binary) return std::nullopt;
  const auto a = valueAtZero(*e.args[0]), b = valueAtZero(*e.args[1]);
  if (!a || !b) return std::nullopt;
  switch (e.binary) {
    case kir::BinaryFn::Add: return *a + *b;
    case kir::BinaryFn::Sub: return *a - *b;
    case kir::BinaryFn::Mul: return *a * *b;
    default: return std::nullopt;
  }
}

/// Whether index `e` is exactly the flat element index of the `grid` loops
/// (row-major, the innermost fastest): affine in their variables only, each
/// with its row-major stride (any for a loop of one iteration), offset 0.
bool isFlatIndex(const Expr& e, const std::vector<const kir::Stmt*>& grid) {
  std::set<int> vars, bound;
  for (const kir::Stmt* loop : grid) vars.insert(loop->var);
  if (!freeVarsWithin(e, vars, bound)) return false;
  int64_t stride = 1;
  for (size_t k = grid.size(); k-- > 0;) {
    if (grid[k]->extent != 1 && strideIn(e, grid[k]->var) != stride) return false;
    stride *= grid[k]->extent;
  }
  return valueAtZero(e) == 0;
}

bool isFourBytes(DType t) { return t == DType::F32 || t == DType::I32; }

/// Whether the `grid` loops of `kernel` hold one store that a thread can do
/// for consecutive elements with vector loads and stores: the store and
/// every load index their buffer at the flat element index, all of 4-byte
/// dtypes, and the value reads nothing else (no loop variable outside a
/// load's index, no reduction).
bool isVectorElementwise(const kir::Kernel& kernel, const std::vector<const kir::Stmt*>& grid) {
  if (grid.empty() || grid.back()->body.size() != 1 || grid.back()->body[0]->kind != kir::Stmt::Kind::Store)
    return false;
  int64_t total = 1;
  for (const kir::Stmt* loop : grid) total *= loop->extent;
  const kir::Stmt& store = *grid.back()->body[0];
  if (total < 1 || !isFourBytes(kernel.buffers[store.buffer].dtype) || !isFlatIndex(*store.index, grid)) return false;
  std::function<bool(const Expr&)> elementwise = [&](const Expr& e) {
    if (e.kind == ExprKind::Var || e.kind == ExprKind::Reduce) return false;
    if (e.kind == ExprKind::Load) return isFourBytes(kernel.buffers[e.id].dtype) && isFlatIndex(*e.args[0], grid);
    for (const ExprPtr& arg : e.args)
      if (!elementwise(*arg)) return false;
    return true;
  };
  return elementwise(*store.value);
}

}  // namespace

std::optional<int64_t> strideIn(const Expr& e, int var) {
  if (!usesVar(e, var)) return 0;
  if (e.kind == ExprKind::Var) return 1;
  if (e.kind != ExprKind::Binary) return std::nullopt;
  const Expr &a = *e.args[0], &b = *e.args[1];
  switch (e.binary) {
    case kir::BinaryFn::Add:
    case kir::BinaryFn::Sub: {
      const auto sa = strideIn(a, var), sb = strideIn(b, var);
      if (!sa || !sb) return std::nullopt;
      return e.binary == kir::BinaryFn::Add ? *sa + *sb : *sa - *sb;
    }
    case kir::BinaryFn::Mul:
      if (a.kind == ExprKind::Const)
        if (const auto sb = strideIn(b, var)) return a.intValue * *sb;
      if (b.kind == ExprKind::Const)
        if (const auto sa = strideIn(a, var)) return *sa * b.intValue;
      return std::nullopt;
    default: return std::nullopt;
  }
}

int64_t iterations(const Expr& reduction) {
  int64_t n = 1;
  for (int64_t extent : reduction.extents) n *= extent;
  return n;
}

std::optional<SumBlocking> sumBlocking(const Expr& reduction, int64_t block) {
  if (reduction.kind != ExprKind::Reduce || reduction.reduce != kir::ReduceKind::Sum || !isFloat(reduction.type) ||
      reduction.extents.empty() || block < 1)
    return std::nullopt;
  const int64_t total = iterations(reduction);
  if (total <= block) return std::nullopt;
  // The outermost level whose inner levels fit in a block is split.
  SumBlocking b;
  int64_t inner = 1;
  b.level = reduction.extents.size() - 1;
  while (b.level > 0 && inner * reduction.extents[b.level] <= block) inner *= reduction.extents[b.level--];
  b.chunk = std::max<int64_t>(1, block / inner);
  const int64_t extent = reduction.extents[b.level];
  b.chunks = (extent + b.chunk - 1) / b.chunk;
  b.blocks = b.chunks;
  for (size_t l = 0; l < b.level; ++l) b.blocks *= reduction.extents[l];
  b.levels = static_cast<int>(std::bit_width(static_cast<uint64_t>(b.blocks)));
  return b;
}

std::vector<ExprPtr> tileTransposedLoads(const kir::Stmt& store, int rowVar, int colVar) {
  std::vector<ExprPtr> found;
  std::set<std::string> seen;
  std::function<void(const ExprPtr&)> visit = [&](const ExprPtr& e) {
    for (const ExprPtr& arg : e->args) visit(arg);
    if (e->kind != ExprKind::Load) return;
    const std::optional<int64_t> along = strideIn(*e->args[0], rowVar), across = strideIn(*e->args[0], colVar);
    if (along == 1 && across && *across != 0 && *across != 1 && seen.insert(kir::printExpr(e)).second)
      found.push_back(e);
  };
  if (store.kind == kir::Stmt::Kind::Store) visit(store.value);
  return found;
}

namespace {

/// Whether loop `s` is the rows of a tile that the CPU transposes in
/// registers (scheduleForCpu).
bool isRegisterTile(const kir::Stmt& s) {
  if (!isRegisterTileSide(s.extent) || s.body.size() != 1 || s.body[0]->kind != kir::Stmt::Kind::For) return false;
  const kir::Stmt& row = *s.body[0];
  if (!row.vectorize || row.extent != s.extent || row.body.size() != 1 ||
      row.body[0]->kind != kir::Stmt::Kind::Store)
    return false;
  const kir::Stmt& store = *row.body[0];
  std::function<bool(const Expr&)> plain = [&](const Expr& e) {
    if (e.kind == ExprKind::Reduce) return false;
    for (const ExprPtr& arg : e.args)
      if (!plain(*arg)) return false;
    return true;
  };
  return plain(*store.value) && !tileTransposedLoads(store, s.var, row.var).empty();
}

}  // namespace

void scheduleForCpu(kir::Kernel& kernel) {
  kir::Schedule schedule;
  schedule.target = std::string(kCpuTargetName);
  bool threads = false;
  std::function<void(const std::vector<kir::StmtPtr>&)> visit = [&](const std::vector<kir::StmtPtr>& body) {
    for (const kir::StmtPtr& s : body) {
      if (s->kind != kir::Stmt::Kind::For) continue;
      if (s->parallel && !threads) {
        schedule.loops.emplace_back(s->var, kir::LoopMapping::Threads);
        threads = true;
      } else if (isRegisterTile(*s)) {
        schedule.loops.emplace_back(s->var, kir::LoopMapping::Tile);
      } else if (s->vectorize) {
        schedule.loops.emplace_back(s->var, kir::LoopMapping::Vector);
      }
      visit(s->body);
    }
  };
  visit(kernel.body);
  kernel.schedule = std::move(schedule);
}

void scheduleForCuda(kir::Kernel& kernel, const CudaScheduleOptions& options) {
  kir::Schedule schedule;
  schedule.target = std::string(kCudaTargetName);
  schedule.blockSize = kCudaBlockSize;
  // The kernel's one parallel loop, and the loops perfectly nested in it
  // that are independent too.
  std::vector<const kir::Stmt*> grid;
  for (const kir::StmtPtr& s : kernel.body) {
    if (s->kind != kir::Stmt::Kind::For || !s->parallel) continue;
    grid.push_back(s.get());
    while (grid.back()->body.size() == 1 && grid.back()->body[0]->kind == kir::Stmt::Kind::For &&
           (grid.back()->body[0]->parallel || grid.back()->body[0]->vectorize))
      grid.push_back(grid.back()->body[0].get());
    break;
  }
  for (const kir::Stmt* loop : grid) schedule.loops.emplace_back(loop->var, kir::LoopMapping::Grid);
  kernel.schedule = std::move(schedule);
  // A parallel loop beside other statements stays as it is (the emitter
  // refuses it); so does a body of several statements.
  if (options.cooperativeRows && kernel.body.size() == 1) scheduleRows(kernel, grid, options);
  if (kernel.schedule.threadsPerRow == 0 && kernel.body.size() == 1 && isVectorElementwise(kernel, grid))
    kernel.schedule.vectorWidth = kCudaVectorWidth;
}

std::vector<ExprPtr> rowInvariantReductions(const kir::Stmt& store, const std::vector<int>& rowVars) {
  const std::set<int> rows(rowVars.begin(), rowVars.end());
  std::vector<ExprPtr> found;
  std::set<std::string> keys;
  std::unordered_set<const Expr*> seen;
  std::function<void(const ExprPtr&)> visit = [&](const ExprPtr& e) {
    if (!seen.insert(e.get()).second) return;
    std::set<int> bound;
    if (e->kind == ExprKind::Reduce && freeVarsWithin(*e, rows, bound)) {
      visit(e->args[0]);  // the ones its body uses first
      if (keys.insert(reductionKey(*e)).second) found.push_back(e);
      return;
    }
    for (const ExprPtr& arg : e->args) visit(arg);
  };
  visit(store.index);
  visit(store.value);
  return found;
}

std::string reductionKey(const Expr& reduction) {
  std::map<int, std::string> bound;
  std::string key;
  appendKey(reduction, bound, 0, key);
  return key;
}

}  // namespace kiln::codegen
