// VJP rules of the Elementwise family: unary math, the broadcasting binary ops, select and cast;
// each returns dx for y = f(x), reusing y where the derivative is a
// function of it.
// The Grad builder and the entry types are in passes/VjpSupport.h; the
// table at the end declares how each op of this family is differentiated.
#include "passes/VjpSupport.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <set>

namespace kiln::vjp {
namespace {

// --- Elementwise unary ------------------------------------------------------------
// Each returns dx for y = f(x); `y` is reused where the derivative is a
// function of it (exp, tanh, sigmoid, sqrt).

Grads vjpNeg(Grad& g, const Op&, Value* dy) { return {g.neg(dy)}; }

Grads vjpAbs(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Sign, x0(op)))}; }

Grads vjpExp(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, y0(op))}; }

Grads vjpLog(Grad& g, const Op& op, Value* dy) { return {g.div(dy, x0(op))}; }

Grads vjpSqrt(Grad& g, const Op& op, Value* dy) { return {g.div(g.mul(dy, 0.5), y0(op))}; }

/// d x^-1/2 = -1/2 x^-3/2 = -1/2 y / x.
Grads vjpRsqrt(Grad& g, const Op& op, Value* dy) { return {g.div(g.mul(g.mul(dy, -0.5), y0(op)), x0(op))}; }

Grads vjpReciprocal(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.neg(g.mul(dy, g.mul(y, y)))};
}

Grads vjpTanh(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.mul(dy, g.rsub(1.0, g.mul(y, y)))};
}

Grads vjpSigmoid(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.mul(dy, g.mul(y, g.rsub(1.0, y)))};
}

/// relu'(x) = [x > 0] = [relu(x) > 0], read from the output: then the
/// backward needs no pre-activation, so a conv or matmul with a relu
/// epilogue (one oneDNN call with a post-op) stays one call in a training
/// step instead of also running without the relu for the backward's mask.
Grads vjpRelu(Grad& g, const Op& op, Value* dy) {
  return {g.where(g.cmp(OpKind::Gt, y0(op), g.like(y0(op), 0.0)), dy)};
}

/// erf'(x) = 2/sqrt(pi) e^(-x^2).
Grads vjpErf(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  Value* e = g.unary(OpKind::Exp, g.neg(g.mul(x, x)));
  return {g.mul(dy, g.mul(e, 2.0 / std::sqrt(std::numbers::pi)))};
}

Grads vjpSin(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Cos, x0(op)))}; }

Grads vjpCos(Grad& g, const Op& op, Value* dy) { return {g.neg(g.mul(dy, g.unary(OpKind::Sin, x0(op))))}; }

Grads vjpTan(Grad& g, const Op& op, Value* dy) {
  Value* y = y0(op);
  return {g.mul(dy, g.add(g.mul(y, y), 1.0))};
}

Grads vjpAsin(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.mul(dy, g.unary(OpKind::Rsqrt, g.rsub(1.0, g.mul(x, x))))};
}

Grads vjpAcos(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.neg(g.mul(dy, g.unary(OpKind::Rsqrt, g.rsub(1.0, g.mul(x, x)))))};
}

Grads vjpAtan(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.div(dy, g.add(g.mul(x, x), 1.0))};
}

/// PyTorch's hardswish_backward: 0 for x <= -3, dy * (x / 3 + 1/2) inside
/// (-3, 3), dy from 3 up (NaN x falls through to dy, as there).
Grads vjpHardSwish(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  Value* inside = g.mul(dy, g.add(g.div(x, g.like(x, 3.0)), 0.5));
  Value* upper = g.select(g.cmp(OpKind::Lt, x, g.like(x, 3.0)), inside, dy);
  Value* zero = g.like(dy, 0.0);
  return {g.select(g.cmp(OpKind::Le, x, g.like(x, -3.0)), zero, upper)};
}
Grads vjpSinh(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Cosh, x0(op)))}; }

Grads vjpCosh(Grad& g, const Op& op, Value* dy) { return {g.mul(dy, g.unary(OpKind::Sinh, x0(op)))}; }

Grads vjpAsinh(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.mul(dy, g.unary(OpKind::Rsqrt, g.add(g.mul(x, x), 1.0)))};
}

Grads vjpAcosh(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.mul(dy, g.unary(OpKind::Rsqrt, g.add(g.mul(x, x), -1.0)))};
}

Grads vjpAtanh(Grad& g, const Op& op, Value* dy) {
  Value* x = x0(op);
  return {g.div(dy, g.rsub(1.0, g.mul(x, x)))};
}

// --- Elementwise binary and select -------------------------------------------------
// Each computes the full-shape gradient and then sums it back over the dims
// the operand was broadcast along.

Grads binary(Grad& g, const Op& op, Value* da, Value* db) {
  return {g.unbroadcastTo(da, op.operand(0)->type()), g.unbroadcastTo(db, op.operand(1)->type())};
}

Grads vjpAdd(Grad& g, const Op& op, Value* dy) { return binary(g, op, dy, dy); }

Grads vjpSub(Grad& g, const Op& op, Value* dy) { return binary(g, op, dy, g.neg(dy)); }

Grads vjpMul(Grad& g, const Op& op, Value* dy) {
  // Named in order (db first, as gcc numbered them): the ops a rule creates
  // must not depend on how the compiler orders a call's arguments.
  Value* db = g.mul(dy, op.operand(0));
  Value* da = g.mul(dy, op.operand(1));
  return binary(g, op, da, db);
}

/// d(a/b) = da/b - a/b^2 db = (da - y db) / b.
Grads vjpDiv(Grad& g, const Op& op, Value* dy) {
  Value* da = g.div(dy, op.operand(1));
  return binary(g, op, da, g.neg(g.mul(da, y0(op))));
}

/// d(a^b) = b a^(b-1) da + a^b log(a) db; the second term is 0 where a <= 0.
Grads vjpPow(Grad& g, const Op& op, Value* dy) {
  Value *a = op.operand(0), *b = op.operand(1);
  Value* da = g.mul(dy, g.mul(b, g.emit(OpKind::Pow, {a, g.add(b, -1.0)})));
  Value* positive = g.cmp(OpKind::Gt, a, g.like(a, 0.0));
  Value* safeA = g.select(positive, a, g.like(a, 1.0));
  Value* db = g.where(positive, g.mul(dy, g.mul(y0(op), g.unary(OpKind::Log, safeA))));
  return binary(g, op, da, db);
}

/// The gradient goes to the operand that was chosen; ties go to `a`.
Grads vjpMax(Grad& g, const Op& op, Value* dy) {
  Value* takeA = g.cmp(OpKind::Ge, op.operand(0), op.operand(1));
  Value* db = g.select(takeA, g.like(dy, 0.0), dy);
  return binary(g, op, g.where(takeA, dy), db);
}

Grads vjpMin(Grad& g, const Op& op, Value* dy) {
  Value* takeA = g.cmp(OpKind::Le, op.operand(0), op.operand(1));
  Value* db = g.select(takeA, g.like(dy, 0.0), dy);
  return binary(g, op, g.where(takeA, dy), db);
}

/// mod(a, b) = a - b floor(a/b): da = dy, db = -floor(a/b) dy.
Grads vjpMod(Grad& g, const Op& op, Value* dy) {
  Value* q = g.unary(OpKind::Floor, g.div(op.operand(0), op.operand(1)));
  return binary(g, op, dy, g.neg(g.mul(dy, q)));
}

/// rem(a, b) = a - b trunc(a/b).
Grads vjpRem(Grad& g, const Op& op, Value* dy) {
  Value* q = g.div(op.operand(0), op.operand(1));
  Value* down = g.unary(OpKind::Floor, q);
  Value* up = g.unary(OpKind::Ceil, q);
  Value* trunc = g.select(g.cmp(OpKind::Lt, q, g.like(q, 0.0)), up, down);
  return binary(g, op, dy, g.neg(g.mul(dy, trunc)));
}

Grads vjpSelect(Grad& g, const Op& op, Value* dy) {
  Value* c = op.operand(0);
  Value* zero = g.like(dy, 0.0);
  return {nullptr, g.unbroadcastTo(g.select(c, dy, zero), op.operand(1)->type()),
          g.unbroadcastTo(g.select(c, zero, dy), op.operand(2)->type())};
}

// --- Casts and data movement --------------------------------------------------------

/// Float to float casts pass the gradient back in the operand's dtype.
Grads vjpCast(Grad& g, const Op& op, Value* dy) {
  if (!isFloat(y0(op)->type().dtype)) return {nullptr};
  return {g.cast(dy, x0(op)->type().dtype)};
}

}  // namespace

// --- Registration -------------------------------------------------------------

namespace entries {
const VjpEntry Neg = rule(vjpNeg);
const VjpEntry Abs = rule(vjpAbs);
const VjpEntry Sign = kNone;
const VjpEntry Exp = rule(vjpExp);
const VjpEntry Log = rule(vjpLog);
const VjpEntry Sqrt = rule(vjpSqrt);
const VjpEntry Rsqrt = rule(vjpRsqrt);
const VjpEntry Reciprocal = rule(vjpReciprocal);
const VjpEntry Tanh = rule(vjpTanh);
const VjpEntry Sigmoid = rule(vjpSigmoid);
const VjpEntry Relu = rule(vjpRelu);
const VjpEntry Erf = rule(vjpErf);
const VjpEntry Sin = rule(vjpSin);
const VjpEntry Cos = rule(vjpCos);
const VjpEntry Tan = rule(vjpTan);
const VjpEntry Asin = rule(vjpAsin);
const VjpEntry Acos = rule(vjpAcos);
const VjpEntry Atan = rule(vjpAtan);
const VjpEntry Sinh = rule(vjpSinh);
const VjpEntry Cosh = rule(vjpCosh);
const VjpEntry Asinh = rule(vjpAsinh);
const VjpEntry Acosh = rule(vjpAcosh);
const VjpEntry Atanh = rule(vjpAtanh);
const VjpEntry HardSwish = rule(vjpHardSwish);
const VjpEntry Floor = kNone;
const VjpEntry Ceil = kNone;
const VjpEntry Round = kNone;
const VjpEntry Not = kNone;
const VjpEntry IsNan = kNone;
const VjpEntry IsInf = kNone;
const VjpEntry Add = rule(vjpAdd);
const VjpEntry Sub = rule(vjpSub);
const VjpEntry Mul = rule(vjpMul);
const VjpEntry Div = rule(vjpDiv);
const VjpEntry Pow = rule(vjpPow);
const VjpEntry Max = rule(vjpMax);
const VjpEntry Min = rule(vjpMin);
const VjpEntry Mod = rule(vjpMod);
const VjpEntry Rem = rule(vjpRem);
const VjpEntry And = kNone;
const VjpEntry Or = kNone;
const VjpEntry Xor = kNone;
const VjpEntry Eq = kNone;
const VjpEntry Ne = kNone;
const VjpEntry Lt = kNone;
const VjpEntry Le = kNone;
const VjpEntry Gt = kNone;
const VjpEntry Ge = kNone;
const VjpEntry Select = rule(vjpSelect);
const VjpEntry Cast = rule(vjpCast);
}  // namespace entries

}  // namespace kiln::vjp
