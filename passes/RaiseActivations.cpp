// The `raise-activations` pass: finds the primitive subgraphs that ONNX
// exporters write for GELU and SiLU (PyTorch 1.13 has no Gelu node, so
// `nn.GELU` arrives as an Erf chain and `nn.SiLU` as x * Sigmoid(x)) and
// replaces each by the composite op, `gelu` or `silu`, so that the backends
// see the activation as the op it is. Recognition is structural only: op
// kinds, how the operands connect, and the values of scalar or splat
// constants; the chain is never evaluated.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <optional>
#include <vector>

#include "ir/Builder.h"
#include "ir/ConstantValue.h"
#include "passes/Pass.h"

namespace kiln {

namespace {

/// An activation found ending at a `mul`: its input x, the composite that
/// computes the same, and what the pattern is made of.
struct Match {
  Value* x = nullptr;
  OpKind activation = OpKind::Gelu;
  AttrMap attrs;
  /// The pattern's ops, the root first and each op after its one user, so
  /// that erasing them in this order always erases an unused op.
  std::vector<Op*> ops;
  /// The constants the pattern reads; other ops may read them too.
  std::vector<Op*> constants;
};

// --- Constants -----------------------------------------------------------------

/// How far (relatively) a constant may be from the value it stands for:
/// the rounding of its dtype, and at least 1e-6, so that the f32 1.4142135
/// of an export counts as sqrt 2 and the f16 0.798 as sqrt(2/pi).
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F16: return 0x1p-11;
    case DType::BF16: return 0x1p-8;
    default: return 1e-6;
  }
}

/// True when `v` is a splat constant of `expected`; records its op.
bool matchConstant(Value* v, double expected, Match& m) {
  std::optional<double> splat = splatValue(v);
  if (!splat || !(std::abs(*splat - expected) <= tolerance(v->type().dtype) * std::abs(expected))) return false;
  m.constants.push_back(v->definingOp());
  return true;
}

// --- Intermediates and products -------------------------------------------------

/// The op of `kind` defining `v` when `v` has exactly one user, the pattern
/// op that led here (so no op outside the pattern reads it); records it.
Op* matchIntermediate(Value* v, OpKind kind, Match& m) {
  Op* def = v->definingOp();
  if (!def || def->kind() != kind || v->users().size() != 1) return nullptr;
  m.ops.push_back(def);
  return def;
}

/// The most factors a product of these patterns has: 0.044715 * x * x * x.
constexpr int kMaxFactors = 4;

/// Appends the factors of the product `mul` computes: its operands, each
/// operand that is a mul read only here replaced by its own factors, while
/// `mulsLeft` allows. A longer product matches no pattern, and the bound
/// keeps the walk short on long chains of muls.
void collectFactors(const Op& mul, std::vector<Value*>& factors, Match& m, int& mulsLeft) {
  for (Value* operand : mul.operands()) {
    Op* inner = mulsLeft > 0 ? matchIntermediate(operand, OpKind::Mul, m) : nullptr;
    if (!inner) {
      factors.push_back(operand);
      continue;
    }
    --mulsLeft;
    collectFactors(*inner, factors, m, mulsLeft);
  }
}

/// The factors of the product `mul` computes, when it has at most
/// kMaxFactors: (0.5 * x) * y, 0.5 * (x * y) and y * (x * 0.5) all give 0.5,
/// x and y. The muls walked besides `mul` are recorded.
std::vector<Value*> productFactors(const Op& mul, Match& m) {
  std::vector<Value*> factors;
  int mulsLeft = kMaxFactors - 2;  // a product of n factors has n - 1 muls
  collectFactors(mul, factors, m, mulsLeft);
  return factors;
}

/// The factors of `v` when it is a mul read only by the pattern, else `v`.
std::vector<Value*> factorsOf(Value* v, Match& m) {
  if (Op* mul = matchIntermediate(v, OpKind::Mul, m)) return productFactors(*mul, m);
  return {v};
}

/// Removes one splat constant of `expected` from `factors`, if there is one.
bool takeConstant(std::vector<Value*>& factors, double expected, Match& m) {
  for (auto it = factors.begin(); it != factors.end(); ++it) {
    if (!matchConstant(*it, expected, m)) continue;
    factors.erase(it);
    return true;
  }
  return false;
}

// --- The forms ------------------------------------------------------------------

/// The u of `v` = add(1, u) or add(u, 1), an add read only by the pattern.
Value* matchOnePlus(Value* v, Match& m) {
  Op* add = matchIntermediate(v, OpKind::Add, m);
  if (!add) return nullptr;
  if (matchConstant(add->operand(1), 1.0, m)) return add->operand(0);
  if (matchConstant(add->operand(0), 1.0, m)) return add->operand(1);
  return nullptr;
}

/// x / sqrt 2: div(x, 1.4142135), or x times 0.70710677.
bool matchErfArgument(Value* v, Match& m) {
  if (Op* div = matchIntermediate(v, OpKind::Div, m))
    return div->operand(0) == m.x && matchConstant(div->operand(1), std::numbers::sqrt2, m);
  std::vector<Value*> factors = factorsOf(v, m);
  return takeConstant(factors, 1 / std::numbers::sqrt2, m) && factors == std::vector<Value*>{m.x};
}

/// 0.044715 x^3, with x^3 as x * x * x (grouped any way) or pow(x, 3).
bool matchCubicTerm(Value* v, Match& m) {
  std::vector<Value*> factors = factorsOf(v, m);
  if (!takeConstant(factors, 0.044715, m)) return false;
  if (factors.size() == 3) return factors == std::vector<Value*>{m.x, m.x, m.x};
  if (factors.size() != 1) return false;
  Op* pow = matchIntermediate(factors[0], OpKind::Pow, m);
  return pow && pow->operand(0) == m.x && matchConstant(pow->operand(1), 3.0, m);
}

/// sqrt(2/pi) (x + 0.044715 x^3).
bool matchTanhArgument(Value* v, Match& m) {
  std::vector<Value*> factors = factorsOf(v, m);
  if (!takeConstant(factors, std::sqrt(2 / std::numbers::pi), m) || factors.size() != 1) return false;
  Op* add = matchIntermediate(factors[0], OpKind::Add, m);
  if (!add) return false;
  if (add->operand(0) == m.x) return matchCubicTerm(add->operand(1), m);
  if (add->operand(1) == m.x) return matchCubicTerm(add->operand(0), m);
  return false;
}

/// GELU ending at `root`: 0.5, x and 1 + erf(x / sqrt 2) multiplied in any
/// order and grouping, or the same with 1 + tanh(sqrt(2/pi) (x + 0.044715
/// x^3)) for approximate = "tanh".
std::optional<Match> matchGelu(Op& root) {
  Match m;
  m.ops.push_back(&root);
  std::vector<Value*> factors = productFactors(root, m);
  if (!takeConstant(factors, 0.5, m) || factors.size() != 2) return std::nullopt;
  // One factor is x, the other the 1 + ... that reads it.
  for (size_t i = 0; i < 2; ++i) {
    Match attempt = m;
    attempt.x = factors[1 - i];
    Value* inner = matchOnePlus(factors[i], attempt);
    if (!inner) continue;
    if (Op* erf = matchIntermediate(inner, OpKind::Erf, attempt))
      if (matchErfArgument(erf->operand(0), attempt)) return attempt;
    if (Op* tanh = matchIntermediate(inner, OpKind::Tanh, attempt)) {
      attempt.attrs = {{"approximate", Attribute("tanh")}};
      if (matchTanhArgument(tanh->operand(0), attempt)) return attempt;
    }
  }
  return std::nullopt;
}

/// SiLU ending at `root`: mul(x, sigmoid(x)) or mul(sigmoid(x), x).
std::optional<Match> matchSilu(Op& root) {
  for (size_t i = 0; i < 2; ++i) {
    Match m;
    m.x = root.operand(1 - i);
    m.activation = OpKind::Silu;
    m.ops.push_back(&root);
    Op* sigmoid = matchIntermediate(root.operand(i), OpKind::Sigmoid, m);
    if (sigmoid && sigmoid->operand(0) == m.x) return m;
  }
  return std::nullopt;
}

// --- Rewriting ------------------------------------------------------------------

/// True when broadcasting `small` against `big` leaves `big`'s shape as it
/// is at run time (as in canonicalize): each dim of `small`, aligned from
/// the back, is a static 1 or the very same dim of `big`.
bool broadcastsInto(const TensorType& small, const TensorType& big) {
  if (small.rank() > big.rank()) return false;
  const size_t offset = big.shape.size() - small.shape.size();
  for (size_t d = 0; d < small.shape.size(); ++d) {
    const Dim& s = small.shape[d];
    if (s.isStatic() && s.size == 1) continue;
    if (s.isUnknown() || s != big.shape[offset + d]) return false;
  }
  return true;
}

/// True when the composite on x computes exactly what the pattern does: x
/// is a float, the result has x's type, and every constant has x's dtype
/// and does not broadcast x to a larger shape.
bool isSameComputation(const Match& m, const Op& root) {
  const TensorType& type = m.x->type();
  if (!isFloat(type.dtype) || root.result()->type() != type) return false;
  for (const Op* c : m.constants) {
    const TensorType& constantType = c->result()->type();
    if (constantType.dtype != type.dtype || !broadcastsInto(constantType, type)) return false;
  }
  return true;
}

/// Replaces the pattern ending at `root` by the composite, which takes the
/// root's name and location, then erases the pattern's ops and the
/// constants nothing else reads.
void raise(Function& f, Op& root, const Match& m) {
  Builder b(f);
  b.setInsertionPoint(&root);
  b.setLocation(root.loc());
  Value* activation = b.create(m.activation, {m.x}, {m.x->type()}, m.attrs)->result();
  activation->setName(root.result()->name());
  root.result()->replaceAllUsesWith(activation);
  for (Op* op : m.ops) f.erase(op);
  std::vector<Op*> erased;
  for (Op* c : m.constants) {
    if (c->hasUses() || std::find(erased.begin(), erased.end(), c) != erased.end()) continue;
    erased.push_back(c);
    f.erase(c);
  }
}

bool raiseActivations(Function& f) {
  bool changed = false;
  for (auto it = f.ops().begin(); it != f.ops().end();) {
    // Step past the root first: raising erases it and ops before it.
    Op* op = (it++)->get();
    if (op->kind() != OpKind::Mul) continue;
    std::optional<Match> m = matchGelu(*op);
    if (!m) m = matchSilu(*op);
    if (!m || !isSameComputation(*m, *op)) continue;
    raise(f, *op, *m);
    changed = true;
  }
  return changed;
}

}  // namespace

/// Replaces the primitive forms of GELU and SiLU by `gelu` and `silu`:
///
///  - gelu: 0.5 * x * (1 + erf(x / sqrt 2)), the three factors multiplied in
///    any order and grouping, x / sqrt 2 as a div by sqrt 2 or a mul by
///    1 / sqrt 2, the add's operands either way round;
///  - gelu {approximate = "tanh"}: the same with 1 + tanh(sqrt(2/pi) * (x +
///    0.044715 * x^3)), x^3 as pow(x, 3) or x * x * x;
///  - silu: x * sigmoid(x), either way round.
///
/// Constants are scalars or splats (any shape that does not broadcast x
/// larger) of x's dtype, equal to the exact value within the dtype's
/// rounding and at least relative 1e-6. A pattern is raised only when each
/// of its intermediate values is read by the pattern alone (x may have
/// other users), x is a float and the result has x's type; otherwise the
/// graph is left as it is. The composite takes the final value's name and
/// location; the pattern's ops go, and so do its constants unless other
/// ops read them. Regions are not entered: they hold primitives only.
///
///   %c = constant() {value = dense<f32[]>[1.4142135]} : f32[]
///   %d = div(%x, %c) : f32[8,128]
///   %e = erf(%d) : f32[8,128]
///   %one = constant() {value = dense<f32[]>[1.0]} : f32[]
///   %a = add(%e, %one) : f32[8,128]
///   %m = mul(%x, %a) : f32[8,128]
///   %half = constant() {value = dense<f32[]>[0.5]} : f32[]
///   %y = mul(%m, %half) : f32[8,128]
///   %s = sigmoid(%x) : f32[8,128]
///   %z = mul(%x, %s) : f32[8,128]
/// becomes
///   %y = gelu(%x) : f32[8,128]
///   %z = silu(%x) : f32[8,128]
class RaiseActivationsPass : public Pass {
 public:
  std::string_view name() const override { return "raise-activations"; }

  Expected<bool> run(Module& m, const PassContext&) override {
    bool changed = false;
    for (const auto& f : m.functions()) changed |= raiseActivations(*f);
    return changed;
  }
};

std::unique_ptr<Pass> createRaiseActivationsPass() { return std::make_unique<RaiseActivationsPass>(); }

}  // namespace kiln
