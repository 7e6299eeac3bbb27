// Kernel IR constructors (with the index folding that keeps static-shape
// kernels small) and the printer used by `kiln compile --emit=kernel`.
#include "codegen/KernelIR.h"

#include <cassert>
#include <cstdio>
#include <sstream>

namespace kiln::kir {
namespace {

ExprPtr make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }

bool isComparison(BinaryFn fn) {
  return fn == BinaryFn::Eq || fn == BinaryFn::Ne || fn == BinaryFn::Lt || fn == BinaryFn::Le || fn == BinaryFn::Gt ||
         fn == BinaryFn::Ge;
}

bool constValue(const ExprPtr& e, int64_t& out) {
  if (e->kind != ExprKind::Const || e->type != DType::I64) return false;
  out = e->intValue;
  return true;
}

}  // namespace

ExprPtr index(int64_t value) { return constantInt(DType::I64, value); }

ExprPtr constant(DType type, double value) {
  if (!isFloat(type)) return constantInt(type, static_cast<int64_t>(value));
  Expr e{ExprKind::Const, type};
  e.floatValue = value;
  return make(std::move(e));
}

ExprPtr constantInt(DType type, int64_t value) {
  Expr e{ExprKind::Const, type};
  if (isFloat(type))
    e.floatValue = static_cast<double>(value);
  else
    e.intValue = type == DType::Bool ? value != 0 : value;
  return make(std::move(e));
}

ExprPtr var(int id) {
  Expr e{ExprKind::Var, DType::I64};
  e.id = id;
  return make(std::move(e));
}

ExprPtr load(int buffer, DType type, ExprPtr idx) {
  Expr e{ExprKind::Load, type};
  e.id = buffer;
  e.args = {std::move(idx)};
  return make(std::move(e));
}

ExprPtr unary(UnaryFn fn, ExprPtr x) {
  const bool predicate = fn == UnaryFn::IsNan || fn == UnaryFn::IsInf;
  Expr e{ExprKind::Unary, predicate ? DType::Bool : x->type};
  e.unary = fn;
  e.args = {std::move(x)};
  return make(std::move(e));
}

ExprPtr binary(BinaryFn fn, ExprPtr a, ExprPtr b) {
  Expr e{ExprKind::Binary, isComparison(fn) ? DType::Bool : a->type};
  e.binary = fn;
  e.args = {std::move(a), std::move(b)};
  return make(std::move(e));
}

ExprPtr select(ExprPtr cond, ExprPtr a, ExprPtr b) {
  Expr e{ExprKind::Select, a->type};
  e.args = {std::move(cond), std::move(a), std::move(b)};
  return make(std::move(e));
}

ExprPtr cast(ExprPtr x, DType to) {
  if (x->type == to) return x;
  Expr e{ExprKind::Cast, to};
  e.args = {std::move(x)};
  return make(std::move(e));
}

ExprPtr reduce(ReduceKind kind, int firstVar, std::vector<int64_t> extents, ExprPtr body, bool selectLast) {
  const bool arg = kind == ReduceKind::ArgMax || kind == ReduceKind::ArgMin;
  assert(!arg || extents.size() == 1);
  Expr e{ExprKind::Reduce, arg ? DType::I64 : body->type};
  e.reduce = kind;
  e.id = firstVar;
  e.selectLast = selectLast;
  e.extents = std::move(extents);
  e.args = {std::move(body)};
  return make(std::move(e));
}

ExprPtr add(ExprPtr a, ExprPtr b) {
  int64_t x, y;
  const bool ca = constValue(a, x), cb = constValue(b, y);
  if (ca && cb) return index(x + y);
  if (ca && x == 0) return b;
  if (cb && y == 0) return a;
  // (v / c) * c + rem(v, c) is v: an offset unravelled and linearized
  // again (a reshape that keeps a run of dims).
  if (a->kind == ExprKind::Binary && a->binary == BinaryFn::Mul && b->kind == ExprKind::Binary &&
      b->binary == BinaryFn::Rem) {
    const ExprPtr& q = a->args[0];
    int64_t m, c, r;
    if (q->kind == ExprKind::Binary && q->binary == BinaryFn::Div && constValue(a->args[1], m) &&
        constValue(q->args[1], c) && constValue(b->args[1], r) && m == c && c == r && q->args[0] == b->args[0] &&
        q->args[0]->type == DType::I64)
      return q->args[0];
  }
  return binary(BinaryFn::Add, std::move(a), std::move(b));
}

ExprPtr sub(ExprPtr a, ExprPtr b) {
  int64_t x, y;
  const bool ca = constValue(a, x), cb = constValue(b, y);
  if (ca && cb) return index(x - y);
  if (cb && y == 0) return a;
  return binary(BinaryFn::Sub, std::move(a), std::move(b));
}

ExprPtr mul(ExprPtr a, ExprPtr b) {
  int64_t x, y;
  const bool ca = constValue(a, x), cb = constValue(b, y);
  if (ca && cb) return index(x * y);
  if ((ca && x == 0) || (cb && y == 0)) return index(0);
  if (ca && x == 1) return b;
  if (cb && y == 1) return a;
  return binary(BinaryFn::Mul, std::move(a), std::move(b));
}

ExprPtr div(ExprPtr a, ExprPtr b) {
  int64_t x, y;
  const bool ca = constValue(a, x), cb = constValue(b, y);
  if (ca && cb && y != 0) return index(x / y);
  if (ca && x == 0) return a;
  if (cb && y == 1) return a;
  return binary(BinaryFn::Div, std::move(a), std::move(b));
}

ExprPtr rem(ExprPtr a, ExprPtr b) {
  int64_t x, y;
  const bool ca = constValue(a, x), cb = constValue(b, y);
  if (ca && cb && y != 0) return index(x % y);
  if ((ca && x == 0) || (cb && y == 1)) return index(0);
  return binary(BinaryFn::Rem, std::move(a), std::move(b));
}

ExprPtr min(ExprPtr a, ExprPtr b) {
  int64_t x, y;
  if (constValue(a, x) && constValue(b, y)) return index(std::min(x, y));
  return binary(BinaryFn::Min, std::move(a), std::move(b));
}

ExprPtr max(ExprPtr a, ExprPtr b) {
  int64_t x, y;
  if (constValue(a, x) && constValue(b, y)) return index(std::max(x, y));
  return binary(BinaryFn::Max, std::move(a), std::move(b));
}

bool isConstant(const ExprPtr& e, int64_t value) {
  int64_t x;
  return constValue(e, x) && x == value;
}

StmtPtr forLoop(int v, int64_t extent, bool parallel, bool vectorize, std::vector<StmtPtr> body) {
  Stmt s{Stmt::Kind::For};
  s.var = v;
  s.extent = extent;
  s.parallel = parallel;
  s.vectorize = vectorize;
  s.body = std::move(body);
  return std::make_shared<const Stmt>(std::move(s));
}

StmtPtr store(int buffer, ExprPtr idx, ExprPtr value) {
  Stmt s{Stmt::Kind::Store};
  s.buffer = buffer;
  s.index = std::move(idx);
  s.value = std::move(value);
  return std::make_shared<const Stmt>(std::move(s));
}

int64_t Kernel::parallelExtent() const {
  for (const StmtPtr& s : body)
    if (s->kind == Stmt::Kind::For && s->parallel) return s->extent;
  return 1;
}

// --- Printing ------------------------------------------------------------------

namespace {

const char* unaryName(UnaryFn fn) {
  static const char* const kNames[] = {"neg",  "abs",     "sign", "exp",   "log",   "sqrt",  "rsqrt", "reciprocal",
                                       "tanh", "sigmoid", "relu", "erf",   "sin",   "cos",   "tan",   "asin",
                                       "acos", "atan",    "sinh", "cosh",  "asinh", "acosh", "atanh", "floor",
                                       "ceil", "round",   "not",  "isnan", "isinf"};
  return kNames[static_cast<int>(fn)];
}

const char* binaryName(BinaryFn fn) {
  static const char* const kNames[] = {"+",   "-",  "*",   "/",  "rem", "mod", "pow", "max", "min",
                                       "and", "or", "xor", "==", "!=",  "<",   "<=",  ">",   ">="};
  return kNames[static_cast<int>(fn)];
}

const char* reduceName(ReduceKind k) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "argmax", "argmin"};
  return kNames[static_cast<int>(k)];
}

bool isInfix(BinaryFn fn) {
  return fn == BinaryFn::Add || fn == BinaryFn::Sub || fn == BinaryFn::Mul || fn == BinaryFn::Div || fn >= BinaryFn::Eq;
}

void printExprTo(std::ostream& os, const Expr& e) {
  switch (e.kind) {
    case ExprKind::Const:
      if (isFloat(e.type)) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", e.floatValue);
        os << buf << ":" << dtypeName(e.type);
      } else if (e.type == DType::I64) {
        os << e.intValue;
      } else {
        os << e.intValue << ":" << dtypeName(e.type);
      }
      return;
    case ExprKind::Var:
      os << "%i" << e.id;
      return;
    case ExprKind::Load:
      os << "%b" << e.id << "[";
      printExprTo(os, *e.args[0]);
      os << "]";
      return;
    case ExprKind::Unary:
      os << unaryName(e.unary) << "(";
      printExprTo(os, *e.args[0]);
      os << ")";
      return;
    case ExprKind::Binary:
      if (isInfix(e.binary)) {
        os << "(";
        printExprTo(os, *e.args[0]);
        os << " " << binaryName(e.binary) << " ";
        printExprTo(os, *e.args[1]);
        os << ")";
      } else {
        os << binaryName(e.binary) << "(";
        printExprTo(os, *e.args[0]);
        os << ", ";
        printExprTo(os, *e.args[1]);
        os << ")";
      }
      return;
    case ExprKind::Select:
      os << "select(";
      printExprTo(os, *e.args[0]);
      os << ", ";
      printExprTo(os, *e.args[1]);
      os << ", ";
      printExprTo(os, *e.args[2]);
      os << ")";
      return;
    case ExprKind::Cast:
      os << "cast<" << dtypeName(e.type) << ">(";
      printExprTo(os, *e.args[0]);
      os << ")";
      return;
    case ExprKind::Reduce:
      os << reduceName(e.reduce) << (e.selectLast ? "_last" : "") << "(";
      for (size_t k = 0; k < e.extents.size(); ++k) os << "%i" << e.id + k << " < " << e.extents[k] << ", ";
      printExprTo(os, *e.args[0]);
      os << ")";
      return;
  }
}

void printStmt(std::ostream& os, const Stmt& s, int depth) {
  const std::string indent(2 * depth, ' ');
  if (s.kind == Stmt::Kind::Store) {
    os << indent << "%b" << s.buffer << "[";
    printExprTo(os, *s.index);
    os << "] = ";
    printExprTo(os, *s.value);
    os << "\n";
    return;
  }
  os << indent << "for %i" << s.var << " in 0.." << s.extent;
  if (s.parallel) os << " parallel";
  if (s.vectorize) os << " vectorize";
  os << " {\n";
  for (const StmtPtr& b : s.body) printStmt(os, *b, depth + 1);
  os << indent << "}\n";
}

}  // namespace

std::string printExpr(const ExprPtr& e) {
  std::ostringstream os;
  printExprTo(os, *e);
  return os.str();
}

std::string printKernel(const Kernel& kernel) {
  std::ostringstream os;
  os << "kernel @" << kernel.name << "(";
  for (size_t i = 0; i < kernel.buffers.size(); ++i) {
    const Buffer& b = kernel.buffers[i];
    os << (i ? ", " : "") << (b.role == Buffer::Role::Input ? "in" : "out") << " %b" << i << ": "
       << TensorType{b.dtype, staticShape(b.shape)}.str();
    if (!b.name.empty()) os << " \"" << b.name << "\"";
  }
  os << ") {\n";
  for (const StmtPtr& s : kernel.body) printStmt(os, *s, 1);
  os << "}";
  const Schedule& schedule = kernel.schedule;
  if (!schedule.target.empty()) {
    os << " schedule " << schedule.target << ":";
    if (schedule.loops.empty()) os << (schedule.threadsPerRow > 0 ? " one row" : " serial");
    for (size_t i = 0; i < schedule.loops.size(); ++i) {
      static const char* const kNames[] = {"serial", "threads", "vector", "grid", "lanes", "tile"};
      os << (i ? ", " : " ") << "%i" << schedule.loops[i].first << " "
         << kNames[static_cast<size_t>(schedule.loops[i].second)];
    }
    if (schedule.blockSize > 0) {
      os << " (" << schedule.blockSize << " threads per block";
      if (schedule.threadsPerRow > 0) os << ", " << schedule.threadsPerRow << " per row";
      if (schedule.vectorWidth > 0) os << ", vector " << schedule.vectorWidth;
      os << ")";
    }
  }
  os << "\n";
  return os.str();
}

LoopMapping Schedule::of(int var) const {
  for (const auto& [v, mapping] : loops)
    if (v == var) return mapping;
  return LoopMapping::Serial;
}

}  // namespace kiln::kir
