// Converters for ONNX's math ops: elementwise unary and binary (NumPy
// broadcasting, and the `broadcast`/`axis` attributes of opsets before 7),
// comparisons and logic, Where, Cast/CastLike, Clip, the variadic
// Max/Min/Sum/Mean, every Reduce* (axes as attribute or input by opset),
// ArgMax/ArgMin, MatMul, Gemm, Einsum (two-operand contractions), CumSum and
// the small activations that compose from primitives (HardSigmoid, Selu,
// PRelu, ...). Kiln has no implicit type promotion, so where ONNX allows mixed
// types (Pow's exponent) a cast is inserted.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "frontend/onnx/ConverterSupport.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {
namespace {

constexpr int64_t kNewest = kNewestOnnxOpset;

/// Input `i`, or the error.
#define KILN_INPUT(var, i)                \
  auto var##_ = ctx.input(i);             \
  if (!var##_) return var##_.takeError(); \
  Value* var = *var##_

/// `b` aligned for the legacy (opset < 7) broadcast of binary ops: with
/// `broadcast = 1`, B's dims match A's starting at `axis` (default: suffix).
Expected<Value*> legacyBroadcast(NodeContext& ctx, Value* a, Value* b) {
  if (ctx.opset() >= 7) return b;
  auto broadcast = ctx.intAttr("broadcast", 0);
  if (!broadcast) return broadcast.takeError();
  if (*broadcast == 0) {
    if (a->type().rank() != b->type().rank())
      return ctx.error("operands have ranks " + std::to_string(a->type().rank()) + " and " +
                       std::to_string(b->type().rank()) + " without broadcast = 1");
    return b;
  }
  const int64_t ra = a->type().rank(), rb = b->type().rank();
  auto axis = ctx.intAttr("axis", ra - rb);
  if (!axis) return axis.takeError();
  int64_t start = *axis < 0 ? *axis + ra : *axis;
  if (start < 0 || start + rb > ra)
    return ctx.error("broadcast axis " + std::to_string(*axis) + " does not fit B's rank " + std::to_string(rb) +
                     " into A's rank " + std::to_string(ra));
  Shape shape = b->type().shape;
  shape.insert(shape.end(), static_cast<size_t>(ra - start - rb), Dim::fixed(1));
  return reshapeTo(ctx, b, std::move(shape));
}

template <OpKind Kind>
Status convertBinary(NodeContext& ctx) {
  KILN_INPUT(a, 0);
  KILN_INPUT(b, 1);
  auto bb = legacyBroadcast(ctx, a, b);
  if (!bb) return bb.takeError();
  if (a->type().dtype != (*bb)->type().dtype)
    return ctx.error("operands have different types " + a->type().str() + " and " + (*bb)->type().str());
  return setOutput0(ctx, ctx.emit(Kind, {a, *bb}));
}

template <OpKind Kind>
Status convertUnary(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  return setOutput0(ctx, ctx.emit(Kind, {x}));
}

Status convertPow(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_INPUT(y, 1);
  auto yb = legacyBroadcast(ctx, x, y);
  if (!yb) return yb.takeError();
  // Pow (opset 12+) allows an exponent of another type; Kiln does not.
  auto yc = castTo(ctx, *yb, x->type().dtype);
  if (!yc) return yc.takeError();
  return setOutput0(ctx, ctx.emit(OpKind::Pow, {x, *yc}));
}

Status convertMod(NodeContext& ctx) {
  KILN_INPUT(a, 0);
  KILN_INPUT(b, 1);
  auto fmod = ctx.intAttr("fmod", 0);
  if (!fmod) return fmod.takeError();
  if (*fmod == 0 && isFloat(a->type().dtype))
    return ctx.error("fmod = 0 on floats is not allowed by ONNX (expected fmod = 1 for " + a->type().str() + ")");
  return setOutput0(ctx, ctx.emit(*fmod ? OpKind::Rem : OpKind::Mod, {a, b}));
}

Status convertIsInf(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto pos = ctx.intAttr("detect_positive", 1);
  auto neg = ctx.intAttr("detect_negative", 1);
  if (!pos) return pos.takeError();
  if (!neg) return neg.takeError();
  auto inf = ctx.emit(OpKind::IsInf, {x});
  if (!inf) return inf.takeError();
  if (*pos && *neg) return setOutput0(ctx, inf);
  if (!*pos && !*neg) return setOutput0(ctx, ctx.emit(OpKind::And, {*inf, ctx.scalar(DType::Bool, 0)}));
  auto sign = ctx.emit(*pos ? OpKind::Gt : OpKind::Lt, {x, ctx.scalar(x->type().dtype, 0)});
  if (!sign) return sign.takeError();
  return setOutput0(ctx, ctx.emit(OpKind::And, {*inf, *sign}));
}

Status convertWhere(NodeContext& ctx) {
  KILN_INPUT(c, 0);
  KILN_INPUT(x, 1);
  KILN_INPUT(y, 2);
  return setOutput0(ctx, ctx.emit(OpKind::Select, {c, x, y}));
}

/// The dtype named by Cast's `to` (an enum value, or a string before opset 6).
Expected<DType> castTarget(NodeContext& ctx) {
  const onnx::AttributeProto* to = ctx.attribute("to");
  if (!to) return ctx.error("attribute 'to' is required");
  int32_t type = 0;
  if (to->type() == onnx::AttributeProto::STRING || (to->type() == onnx::AttributeProto::UNDEFINED && to->has_s())) {
    onnx::TensorProto::DataType parsed;
    if (!onnx::TensorProto::DataType_Parse(to->s(), &parsed))
      return ctx.error("attribute 'to' names an unknown type '" + to->s() + "'");
    type = parsed;
  } else {
    auto v = ctx.intAttr("to", 0);
    if (!v) return v.takeError();
    type = static_cast<int32_t>(*v);
  }
  if (auto dtype = dtypeFromOnnx(type)) return *dtype;
  const std::string name = onnx::TensorProto::DataType_IsValid(type)
                               ? onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(type))
                               : std::to_string(type);
  return ctx.error("cast to " + name + " is not supported (Kiln has no such dtype)");
}

Status convertCast(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto to = castTarget(ctx);
  if (!to) return to.takeError();
  return setOutput0(ctx, castTo(ctx, x, *to));
}

Status convertCastLike(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_INPUT(like, 1);
  return setOutput0(ctx, castTo(ctx, x, like->type().dtype));
}

Status convertClip(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const DType dtype = x->type().dtype;
  Value* lo = nullptr;
  Value* hi = nullptr;
  if (ctx.opset() < 11) {
    auto min = ctx.floatAttr("min", -std::numeric_limits<double>::infinity());
    auto max = ctx.floatAttr("max", std::numeric_limits<double>::infinity());
    if (!min) return min.takeError();
    if (!max) return max.takeError();
    if (ctx.attribute("min")) lo = ctx.scalar(dtype, *min);
    if (ctx.attribute("max")) hi = ctx.scalar(dtype, *max);
  } else {
    for (const char* name : {"min", "max"}) KILN_TRY(rejectMovedAttribute(ctx, name, 11));
    for (size_t i : {1, 2}) {
      if (!ctx.hasInput(i)) continue;
      auto v = ctx.input(i);
      if (!v) return v.takeError();
      if ((*v)->type().dtype != dtype)
        return ctx.error("input " + std::to_string(i) + " is " + (*v)->type().str() + ", expected " +
                         std::string(dtypeName(dtype)) + " like the input");
      (i == 1 ? lo : hi) = *v;
    }
  }
  Value* y = x;
  if (lo) {
    auto v = ctx.emit(OpKind::Max, {y, lo});
    if (!v) return v.takeError();
    y = *v;
  }
  if (hi) {
    auto v = ctx.emit(OpKind::Min, {y, hi});
    if (!v) return v.takeError();
    y = *v;
  }
  ctx.setOutput(0, y);
  return {};
}

/// Max, Min, Sum and Mean of any number of broadcasting inputs.
template <OpKind Kind, bool Mean>
Status convertVariadic(NodeContext& ctx) {
  if (ctx.numInputs() == 0) return ctx.error("needs at least one input");
  Value* acc = nullptr;
  for (size_t i = 0; i < ctx.numInputs(); ++i) {
    KILN_INPUT(v, i);
    if (!acc) {
      acc = v;
      continue;
    }
    auto next = ctx.emit(Kind, {acc, v});
    if (!next) return next.takeError();
    acc = *next;
  }
  if (Mean && ctx.numInputs() > 1)
    return setOutput0(ctx, ctx.emit(OpKind::Div, {acc, ctx.scalar(acc->type().dtype, double(ctx.numInputs()))}));
  ctx.setOutput(0, acc);
  return {};
}

// --- Reductions -----------------------------------------------------------------

enum class Reduction { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

/// The opset from which a reduction takes `axes` as an input.
int64_t axesInputSince(Reduction r) { return r == Reduction::Sum ? 13 : 18; }

template <Reduction R>
Status convertReduce(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const int64_t rank = x->type().rank();
  auto keepdims = ctx.intAttr("keepdims", 1);
  if (!keepdims) return keepdims.takeError();
  std::vector<int64_t> axes;
  if (ctx.opset() >= axesInputSince(R)) {
    auto input = optionalConstantInts(ctx, 1, "axes");
    if (!input) return input.takeError();
    if (*input) axes = **input;
    KILN_TRY(rejectMovedAttribute(ctx, "axes", axesInputSince(R)));
  } else {
    auto attr = ctx.intsAttr("axes", {});
    if (!attr) return attr.takeError();
    axes = *attr;
  }
  auto noop = ctx.intAttr("noop_with_empty_axes", 0);
  if (!noop) return noop.takeError();
  if (axes.empty() && *noop) {
    ctx.setOutput(0, x);
    return {};
  }
  auto norm = normalizeAxes(ctx, axes, rank);
  if (!norm) return norm.takeError();
  if (norm->empty())
    for (int64_t d = 0; d < rank; ++d) norm->push_back(d);
  AttrMap attrs{{"axes", Attribute(*norm)}, {"keepdims", Attribute(*keepdims != 0)}};
  const DType dtype = x->type().dtype;
  auto reduce = [&](OpKind kind, Value* v) { return ctx.emit(kind, {v}, attrs); };
  switch (R) {
    case Reduction::Sum: return setOutput0(ctx, reduce(OpKind::ReduceSum, x));
    case Reduction::Mean: return setOutput0(ctx, reduce(OpKind::ReduceMean, x));
    case Reduction::Max: return setOutput0(ctx, reduce(OpKind::ReduceMax, x));
    case Reduction::Min: return setOutput0(ctx, reduce(OpKind::ReduceMin, x));
    case Reduction::Prod: return setOutput0(ctx, reduce(OpKind::ReduceProd, x));
    case Reduction::L1: {
      auto a = ctx.emit(OpKind::Abs, {x});
      if (!a) return a.takeError();
      return setOutput0(ctx, reduce(OpKind::ReduceSum, *a));
    }
    case Reduction::SumSquare:
    case Reduction::L2: {
      auto sq = ctx.emit(OpKind::Mul, {x, x});
      if (!sq) return sq.takeError();
      auto sum = reduce(OpKind::ReduceSum, *sq);
      if (R == Reduction::SumSquare || !sum) return setOutput0(ctx, sum);
      if (isFloat(dtype)) return setOutput0(ctx, ctx.emit(OpKind::Sqrt, {*sum}));
      // Integer L2: the square root in double, truncated back (as NumPy's
      // astype in the ONNX reference).
      auto f = castTo(ctx, *sum, DType::F64);
      if (!f) return f.takeError();
      auto s = ctx.emit(OpKind::Sqrt, {*f});
      if (!s) return s.takeError();
      return setOutput0(ctx, castTo(ctx, *s, dtype));
    }
    case Reduction::LogSum: {
      auto sum = reduce(OpKind::ReduceSum, x);
      if (!sum) return sum.takeError();
      return setOutput0(ctx, ctx.emit(OpKind::Log, {*sum}));
    }
    case Reduction::LogSumExp: {
      // log(sum(exp(x - m))) + m with m the maximum, so large inputs do not
      // overflow; an all -inf (or empty) slice gives m = -inf, which is
      // replaced by 0 to keep NaN out.
      AttrMap keep{{"axes", Attribute(*norm)}, {"keepdims", Attribute(true)}};
      auto m = ctx.emit(OpKind::ReduceMax, {x}, keep);
      if (!m) return m.takeError();
      auto isInf = ctx.emit(OpKind::IsInf, {*m});
      if (!isInf) return isInf.takeError();
      auto safe = ctx.emit(OpKind::Select, {*isInf, ctx.scalar(dtype, 0), *m});
      if (!safe) return safe.takeError();
      auto shifted = ctx.emit(OpKind::Sub, {x, *safe});
      if (!shifted) return shifted.takeError();
      auto e = ctx.emit(OpKind::Exp, {*shifted});
      if (!e) return e.takeError();
      auto sum = reduce(OpKind::ReduceSum, *e);
      if (!sum) return sum.takeError();
      auto l = ctx.emit(OpKind::Log, {*sum});
      if (!l) return l.takeError();
      Value* offset = *safe;
      if (!*keepdims) {
        auto sq = squeezeAxes(ctx, *safe, *norm);
        if (!sq) return sq.takeError();
        offset = *sq;
      }
      return setOutput0(ctx, ctx.emit(OpKind::Add, {*l, offset}));
    }
  }
  return ctx.error("unknown reduction");
}

template <OpKind Kind>
Status convertArgReduce(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto axis = ctx.intAttr("axis", 0);
  auto keepdims = ctx.intAttr("keepdims", 1);
  auto last = ctx.intAttr("select_last_index", 0);
  if (!axis) return axis.takeError();
  if (!keepdims) return keepdims.takeError();
  if (!last) return last.takeError();
  auto a = normalizeAxis(ctx, *axis, x->type().rank());
  if (!a) return a.takeError();
  return setOutput0(ctx, ctx.emit(Kind, {x},
                                  {{"axis", Attribute(*a)},
                                   {"keepdims", Attribute(*keepdims != 0)},
                                   {"select_last_index", Attribute(*last != 0)}}));
}

// --- Contractions -------------------------------------------------------------

Status convertMatMul(NodeContext& ctx) {
  KILN_INPUT(a, 0);
  KILN_INPUT(b, 1);
  return setOutput0(ctx, ctx.emit(OpKind::MatMul, {a, b}));
}

Expected<Value*> transpose2d(NodeContext& ctx, Value* v) {
  if (v->type().rank() != 2) return ctx.error("Gemm operands must be 2-d, got " + v->type().str());
  return ctx.emit(OpKind::Transpose, {v}, {{"perm", Attribute(std::vector<int64_t>{1, 0})}});
}

Status convertGemm(NodeContext& ctx) {
  KILN_INPUT(a, 0);
  KILN_INPUT(b, 1);
  auto alpha = ctx.floatAttr("alpha", 1.0);
  auto beta = ctx.floatAttr("beta", 1.0);
  auto transA = ctx.intAttr("transA", 0);
  auto transB = ctx.intAttr("transB", 0);
  if (!alpha) return alpha.takeError();
  if (!beta) return beta.takeError();
  if (!transA) return transA.takeError();
  if (!transB) return transB.takeError();
  if (a->type().rank() != 2 || b->type().rank() != 2)
    return ctx.error("Gemm operands must be 2-d, got " + a->type().str() + " and " + b->type().str());
  if (*transA) {
    auto t = transpose2d(ctx, a);
    if (!t) return t.takeError();
    a = *t;
  }
  if (*transB) {
    auto t = transpose2d(ctx, b);
    if (!t) return t.takeError();
    b = *t;
  }
  const DType dtype = a->type().dtype;
  auto y = ctx.emit(OpKind::MatMul, {a, b});
  if (!y) return y.takeError();
  Value* out = *y;
  if (*alpha != 1.0) {
    auto v = ctx.emit(OpKind::Mul, {out, ctx.scalar(dtype, *alpha)});
    if (!v) return v.takeError();
    out = *v;
  }
  if (ctx.hasInput(2) && *beta != 0.0) {
    KILN_INPUT(c, 2);
    if (*beta != 1.0) {
      auto v = ctx.emit(OpKind::Mul, {c, ctx.scalar(dtype, *beta)});
      if (!v) return v.takeError();
      c = *v;
    }
    auto v = ctx.emit(OpKind::Add, {out, c});
    if (!v) return v.takeError();
    out = *v;
  }
  ctx.setOutput(0, out);
  return {};
}

/// Einsum as transposes, reshapes, reductions and one batched matmul; an
/// ellipsis becomes labels of its own, a label repeated within an operand a
/// diagonal (`slice` with step n+1 of the two dims flattened).
class EinsumLowering {
 public:
  explicit EinsumLowering(NodeContext& ctx) : ctx_(ctx) {}

  Status run() {
    auto eq = ctx_.stringAttr("equation", "");
    if (!eq) return eq.takeError();
    std::string equation;
    for (char c : *eq)
      if (c != ' ') equation += c;
    std::string lhs = equation, rhs;
    const bool explicitOutput = equation.find("->") != std::string::npos;
    if (explicitOutput) {
      lhs = equation.substr(0, equation.find("->"));
      rhs = equation.substr(equation.find("->") + 2);
    }
    std::vector<std::string> terms;
    size_t start = 0;
    while (true) {
      size_t comma = lhs.find(',', start);
      terms.push_back(lhs.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (terms.size() != ctx_.numInputs() || terms.size() > 2)
      return ctx_.error("equation '" + *eq + "' has " + std::to_string(terms.size()) + " operands for " +
                        std::to_string(ctx_.numInputs()) + " inputs (Kiln supports one or two)");
    std::vector<Value*> operands;
    for (size_t i = 0; i < terms.size(); ++i) {
      auto v = ctx_.input(i);
      if (!v) return v.takeError();
      if (!(*v)->type().isStatic()) return ctx_.error("Einsum needs static shapes, got " + (*v)->type().str());
      operands.push_back(*v);
    }
    // An ellipsis stands for the dims no label names, aligned from the right
    // across operands; each of them gets a label of its own, a digit (ONNX
    // labels are letters).
    std::vector<int64_t> ellipsisDims(terms.size(), 0);
    int64_t ellipsisRank = 0;
    for (size_t i = 0; i < terms.size(); ++i) {
      const size_t at = terms[i].find("...");
      if (at == std::string::npos) continue;
      if (terms[i].find("...", at + 3) != std::string::npos)
        return ctx_.error("equation '" + *eq + "' has two ellipses in operand " + std::to_string(i));
      ellipsisDims[i] = operands[i]->type().rank() - static_cast<int64_t>(terms[i].size() - 3);
      if (ellipsisDims[i] < 0)
        return ctx_.error("operand " + std::to_string(i) + " " + operands[i]->type().str() + " has fewer dims than '" +
                          terms[i] + "' names");
      ellipsisRank = std::max(ellipsisRank, ellipsisDims[i]);
    }
    if (ellipsisRank > 10) return ctx_.error("an ellipsis of more than 10 dims is not supported");
    auto ellipsisLabels = [](int64_t from, int64_t to) {
      std::string labels;
      for (int64_t k = from; k < to; ++k) labels += static_cast<char>('0' + k);
      return labels;
    };
    for (size_t i = 0; i < terms.size(); ++i) {
      for (char c : terms[i])
        if (!std::isalpha(static_cast<unsigned char>(c)) && c != '.')
          return ctx_.error("equation '" + *eq + "' has an invalid label '" + std::string(1, c) + "'");
      const size_t at = terms[i].find("...");
      if (at != std::string::npos)
        terms[i].replace(at, 3, ellipsisLabels(ellipsisRank - ellipsisDims[i], ellipsisRank));
      if (terms[i].find('.') != std::string::npos)
        return ctx_.error("equation '" + *eq + "' has a '.' outside an ellipsis");
    }
    // Labels appearing once in the whole equation (a label repeated within
    // an operand counts twice, so "ii" is a trace) form the implicit output.
    std::map<char, int> counts;
    for (const std::string& t : terms)
      for (char c : t) ++counts[c];
    if (!explicitOutput) {
      rhs = ellipsisLabels(0, ellipsisRank);
      for (auto [c, n] : counts)
        if (n == 1 && std::isalpha(static_cast<unsigned char>(c))) rhs += c;
    } else {
      for (char c : rhs)
        if (!std::isalpha(static_cast<unsigned char>(c)) && c != '.')
          return ctx_.error("equation '" + *eq + "' has an invalid output label '" + std::string(1, c) + "'");
      if (const size_t at = rhs.find("..."); at != std::string::npos)
        rhs.replace(at, 3, ellipsisLabels(0, ellipsisRank));
      if (rhs.find('.') != std::string::npos)
        return ctx_.error("equation '" + *eq + "' has a '.' outside an ellipsis in its output");
    }
    for (char c : rhs) {
      if (!counts.count(c)) return ctx_.error("output label '" + std::string(1, c) + "' appears in no operand");
      if (std::count(rhs.begin(), rhs.end(), c) > 1)
        return ctx_.error("output label '" + std::string(1, c) + "' is repeated in equation '" + *eq + "'");
    }
    for (size_t i = 0; i < terms.size(); ++i) {
      if (operands[i]->type().rank() != static_cast<int64_t>(terms[i].size()))
        return ctx_.error("operand " + std::to_string(i) + " " + operands[i]->type().str() + " does not have the " +
                          std::to_string(terms[i].size()) + " dims of '" + terms[i] + "'");
      auto d = diagonal(operands[i], terms[i]);
      if (!d) return d.takeError();
      operands[i] = *d;
    }
    // Sum out labels that only one operand has and the output lacks.
    for (size_t i = 0; i < terms.size(); ++i) {
      std::vector<int64_t> axes;
      std::string kept;
      for (size_t d = 0; d < terms[i].size(); ++d) {
        char c = terms[i][d];
        bool inOther = terms.size() == 2 && terms[1 - i].find(c) != std::string::npos;
        if (!inOther && rhs.find(c) == std::string::npos)
          axes.push_back(static_cast<int64_t>(d));
        else
          kept += c;
      }
      if (axes.empty()) continue;
      auto r = ctx_.emit(OpKind::ReduceSum, {operands[i]}, {{"axes", Attribute(axes)}});
      if (!r) return r.takeError();
      operands[i] = *r;
      terms[i] = kept;
    }
    if (terms.size() == 1) return finish(operands[0], terms[0], rhs);

    // batch: in both and the output; contracted: in both, not the output;
    // left/right: in one operand only.
    std::string batch, contracted, left, right;
    for (char c : terms[0]) {
      bool inB = terms[1].find(c) != std::string::npos;
      bool inOut = rhs.find(c) != std::string::npos;
      (inB ? (inOut ? batch : contracted) : left) += c;
    }
    for (char c : terms[1])
      if (terms[0].find(c) == std::string::npos) right += c;
    auto a = arrange(operands[0], terms[0], batch + left + contracted, {batch, left, contracted});
    if (!a) return a.takeError();
    auto b = arrange(operands[1], terms[1], batch + contracted + right, {batch, contracted, right});
    if (!b) return b.takeError();
    auto mm = ctx_.emit(OpKind::MatMul, {*a, *b});
    if (!mm) return mm.takeError();
    Shape shape;
    for (char c : batch + left + right) shape.push_back(Dim::fixed(sizes_[c]));
    auto r = reshapeTo(ctx_, *mm, shape);
    if (!r) return r.takeError();
    return finish(*r, batch + left + right, rhs);
  }

 private:
  /// `v` with each label repeated within `term` taken once, on the diagonal:
  /// the two dims moved last, flattened, and every (n+1)-th element sliced
  /// out. `term` becomes the labels of the result.
  Expected<Value*> diagonal(Value* v, std::string& term) {
    while (true) {
      size_t first = 0, second = std::string::npos;
      for (size_t d = 0; d < term.size() && second == std::string::npos; ++d) {
        first = d;
        second = term.find(term[d], d + 1);
      }
      if (second == std::string::npos) return v;
      const Shape& shape = v->type().shape;
      const int64_t n = shape[first].size;
      if (shape[second].size != n)
        return ctx_.error("label '" + std::string(1, term[first]) + "' is repeated over dims of sizes " +
                          std::to_string(n) + " and " + std::to_string(shape[second].size));
      std::vector<int64_t> perm;
      std::string rest;
      Shape flat;
      for (size_t d = 0; d < term.size(); ++d)
        if (d != first && d != second) {
          perm.push_back(static_cast<int64_t>(d));
          rest += term[d];
          flat.push_back(shape[d]);
        }
      perm.push_back(static_cast<int64_t>(first));
      perm.push_back(static_cast<int64_t>(second));
      flat.push_back(Dim::fixed(n * n));
      auto t = ctx_.emit(OpKind::Transpose, {v}, {{"perm", Attribute(perm)}});
      if (!t) return t;
      auto r = reshapeTo(ctx_, *t, flat);
      if (!r) return r;
      std::vector<int64_t> starts(flat.size(), 0), ends, steps(flat.size(), 1);
      for (const Dim& d : flat) ends.push_back(d.size);
      steps.back() = n + 1;
      auto diag = ctx_.emit(OpKind::Slice, {*r},
                            {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
      if (!diag) return diag;
      v = *diag;
      term = rest + term[first];
    }
  }

  /// `v` (labels `have`) transposed to `want` and reshaped to one dim per group.
  Expected<Value*> arrange(Value* v, const std::string& have, const std::string& want,
                           std::initializer_list<std::string> groups) {
    for (size_t d = 0; d < have.size(); ++d) {
      const int64_t size = v->type().shape[d].size;
      auto [it, inserted] = sizes_.emplace(have[d], size);
      if (!inserted && it->second != size)
        return ctx_.error("label '" + std::string(1, have[d]) + "' has sizes " + std::to_string(it->second) + " and " +
                          std::to_string(size));
    }
    auto t = transposeTo(v, have, want);
    if (!t) return t.takeError();
    Shape shape;
    for (const std::string& g : groups) {
      int64_t n = 1;
      for (char c : g) n *= sizes_[c];
      shape.push_back(Dim::fixed(n));
    }
    return reshapeTo(ctx_, *t, shape);
  }

  Expected<Value*> transposeTo(Value* v, const std::string& have, const std::string& want) {
    if (have == want) return v;
    std::vector<int64_t> perm;
    for (char c : want) perm.push_back(static_cast<int64_t>(have.find(c)));
    return ctx_.emit(OpKind::Transpose, {v}, {{"perm", Attribute(perm)}});
  }

  Status finish(Value* v, const std::string& have, const std::string& want) {
    return setOutput0(ctx_, transposeTo(v, have, want));
  }

  NodeContext& ctx_;
  std::map<char, int64_t> sizes_;
};

Status convertEinsum(NodeContext& ctx) { return EinsumLowering(ctx).run(); }

/// CumSum as a matmul with a triangular matrix of ones along the axis.
Status convertCumSum(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto axisValues = constantInts(ctx, 1, "axis");
  if (!axisValues) return axisValues.takeError();
  if (axisValues->size() != 1) return ctx.error("axis must hold one value");
  auto exclusive = ctx.intAttr("exclusive", 0);
  auto reverse = ctx.intAttr("reverse", 0);
  if (!exclusive) return exclusive.takeError();
  if (!reverse) return reverse.takeError();
  const int64_t rank = x->type().rank();
  auto axis = normalizeAxis(ctx, (*axisValues)[0], rank);
  if (!axis) return axis.takeError();
  const Dim& dim = x->type().shape[*axis];
  if (!dim.isStatic()) return ctx.error("CumSum needs a static size along the axis, got " + x->type().str());
  const int64_t n = dim.size;
  const DType dtype = x->type().dtype;
  // out[j] = sum_i x[i] * m[i][j]: m[i][j] = 1 when i <= j (i < j when
  // exclusive), mirrored when reversed.
  KILN_TRY(checkGeneratedSize(ctx, staticShape({n, n}), "the prefix-sum matrix"));
  DenseTensor m = DenseTensor::zeros(TensorType{dtype, staticShape({n, n})});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      bool on = *reverse ? (*exclusive ? i > j : i >= j) : (*exclusive ? i < j : i <= j);
      if (on) m.setDouble(i * n + j, 1.0);
    }
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (d != *axis) perm.push_back(d);
  perm.push_back(*axis);
  std::vector<int64_t> inverse(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) inverse[static_cast<size_t>(perm[static_cast<size_t>(d)])] = d;
  Value* v = x;
  if (*axis != rank - 1) {
    auto t = ctx.emit(OpKind::Transpose, {v}, {{"perm", Attribute(perm)}});
    if (!t) return t.takeError();
    v = *t;
  }
  auto mm = ctx.emit(OpKind::MatMul, {v, ctx.constant(std::move(m))});
  if (!mm) return mm.takeError();
  if (*axis == rank - 1) return setOutput0(ctx, mm);
  return setOutput0(ctx, ctx.emit(OpKind::Transpose, {*mm}, {{"perm", Attribute(inverse)}}));
}

// --- Activations composed from primitives ---------------------------------------

/// Small helper that chains emits and keeps the first error.
class Chain {
 public:
  explicit Chain(NodeContext& ctx) : ctx_(ctx) {}
  Value* op(OpKind kind, std::vector<Value*> operands) {
    for (Value* v : operands)
      if (!v) return nullptr;
    if (error_) return nullptr;
    auto v = ctx_.emit(kind, std::move(operands));
    if (!v) {
      error_ = v.takeError();
      return nullptr;
    }
    return *v;
  }
  Value* scalar(DType dtype, double value) { return ctx_.scalar(dtype, value); }
  /// Records `error` (when it is the first) and returns null.
  Value* fail(Error error) {
    if (!error_) error_ = std::move(error);
    return nullptr;
  }
  /// The first error, else binds output 0 to `out` (unless null).
  Status finish(Value* out) {
    if (error_) return *error_;
    if (out) ctx_.setOutput(0, out);
    return {};
  }

 private:
  NodeContext& ctx_;
  std::optional<Error> error_;
};

Status convertHardSigmoid(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto alpha = ctx.floatAttr("alpha", 0.2);
  auto beta = ctx.floatAttr("beta", 0.5);
  if (!alpha) return alpha.takeError();
  if (!beta) return beta.takeError();
  const DType t = x->type().dtype;
  Chain c(ctx);
  Value* lin = c.op(OpKind::Add, {c.op(OpKind::Mul, {x, c.scalar(t, *alpha)}), c.scalar(t, *beta)});
  return c.finish(c.op(OpKind::Max, {c.op(OpKind::Min, {lin, c.scalar(t, 1)}), c.scalar(t, 0)}));
}

Status convertSelu(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto alpha = ctx.floatAttr("alpha", 1.67326319217681884765625);
  auto gamma = ctx.floatAttr("gamma", 1.05070102214813232421875);
  if (!alpha) return alpha.takeError();
  if (!gamma) return gamma.takeError();
  const DType t = x->type().dtype;
  Chain c(ctx);
  Value* neg = c.op(OpKind::Mul, {c.op(OpKind::Sub, {c.op(OpKind::Exp, {x}), c.scalar(t, 1)}), c.scalar(t, *alpha)});
  Value* sel = c.op(OpKind::Select, {c.op(OpKind::Gt, {x, c.scalar(t, 0)}), x, neg});
  return c.finish(c.op(OpKind::Mul, {sel, c.scalar(t, *gamma)}));
}

Status convertCelu(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto alpha = ctx.floatAttr("alpha", 1.0);
  if (!alpha) return alpha.takeError();
  if (*alpha == 0) return ctx.error("alpha must not be 0");
  const DType t = x->type().dtype;
  Chain c(ctx);
  Value* e = c.op(OpKind::Sub, {c.op(OpKind::Exp, {c.op(OpKind::Div, {x, c.scalar(t, *alpha)})}), c.scalar(t, 1)});
  Value* neg = c.op(OpKind::Min, {c.op(OpKind::Mul, {e, c.scalar(t, *alpha)}), c.scalar(t, 0)});
  return c.finish(c.op(OpKind::Add, {c.op(OpKind::Max, {x, c.scalar(t, 0)}), neg}));
}

Status convertThresholdedRelu(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto alpha = ctx.floatAttr("alpha", 1.0);
  if (!alpha) return alpha.takeError();
  const DType t = x->type().dtype;
  Chain c(ctx);
  return c.finish(c.op(OpKind::Select, {c.op(OpKind::Gt, {x, c.scalar(t, *alpha)}), x, c.scalar(t, 0)}));
}

Status convertPRelu(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_INPUT(slope, 1);
  // Before opset 7 a slope of shape [C] applies along dim 1 of [N, C, ...].
  if (ctx.opset() < 7 && slope->type().rank() == 1 && x->type().rank() > 2) {
    Shape shape = slope->type().shape;
    shape.insert(shape.end(), static_cast<size_t>(x->type().rank() - 2), Dim::fixed(1));
    auto r = reshapeTo(ctx, slope, shape);
    if (!r) return r.takeError();
    slope = *r;
  }
  const DType t = x->type().dtype;
  Chain c(ctx);
  Value* neg = c.op(OpKind::Mul, {x, slope});
  return c.finish(c.op(OpKind::Select, {c.op(OpKind::Lt, {x, c.scalar(t, 0)}), neg, x}));
}

Status convertSoftsign(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const DType t = x->type().dtype;
  Chain c(ctx);
  return c.finish(c.op(OpKind::Div, {x, c.op(OpKind::Add, {c.op(OpKind::Abs, {x}), c.scalar(t, 1)})}));
}

Status convertShrink(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  auto lambd = ctx.floatAttr("lambd", 0.5);
  auto bias = ctx.floatAttr("bias", 0.0);
  if (!lambd) return lambd.takeError();
  if (!bias) return bias.takeError();
  const DType t = x->type().dtype;
  Chain c(ctx);
  Value* low = c.op(OpKind::Lt, {x, c.scalar(t, -*lambd)});
  Value* high = c.op(OpKind::Gt, {x, c.scalar(t, *lambd)});
  Value* up = c.op(OpKind::Add, {x, c.scalar(t, *bias)});
  Value* down = c.op(OpKind::Sub, {x, c.scalar(t, *bias)});
  return c.finish(c.op(OpKind::Select, {low, up, c.op(OpKind::Select, {high, down, c.scalar(t, 0)})}));
}

/// TopK without a sort op: each element's rank is the number of elements
/// that come before it (greater, or equal at a lower index, for largest);
/// output position p takes the element of rank p. Pairwise comparisons cost
/// O(n^2) per row, fine for the sizes models select from.
Status convertTopK(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  int64_t k = 0;
  if (ctx.opset() < 10) {
    auto attr = ctx.intAttr("k", -1);
    if (!attr) return attr.takeError();
    k = *attr;
  } else {
    auto kv = constantInts(ctx, 1, "k");
    if (!kv) return kv.takeError();
    if (kv->size() != 1) return ctx.error("k must hold one value");
    k = (*kv)[0];
  }
  auto axisAttr = ctx.intAttr("axis", -1);
  auto largest = ctx.intAttr("largest", 1);
  auto sorted = ctx.intAttr("sorted", 1);
  if (!axisAttr) return axisAttr.takeError();
  if (!largest) return largest.takeError();
  if (!sorted) return sorted.takeError();
  const int64_t rank = x->type().rank();
  auto axis = normalizeAxis(ctx, *axisAttr, rank);
  if (!axis) return axis.takeError();
  const Dim& dim = x->type().shape[static_cast<size_t>(*axis)];
  if (!dim.isStatic()) return ctx.error("TopK needs a static size along the axis, got " + x->type().str());
  const int64_t n = dim.size;
  if (k < 0 || k > n)
    return ctx.error("k = " + std::to_string(k) + " is out of range for " + std::to_string(n) + " elements");
  if (n > 4096) return ctx.error("TopK over more than 4096 elements is not supported (the lowering is quadratic)");

  // Work along the last axis.
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (d != *axis) perm.push_back(d);
  perm.push_back(*axis);
  std::vector<int64_t> inverse(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) inverse[static_cast<size_t>(perm[static_cast<size_t>(d)])] = d;
  auto moveAxis = [&](Value* v, const std::vector<int64_t>& p) -> Expected<Value*> {
    if (*axis == rank - 1) return v;
    return ctx.emit(OpKind::Transpose, {v}, {{"perm", Attribute(p)}});
  };
  auto xt = moveAxis(x, perm);
  if (!xt) return xt.takeError();
  auto xi = unsqueezeAxes(ctx, *xt, {rank});      // [..., n, 1]: element i
  auto xj = unsqueezeAxes(ctx, *xt, {rank - 1});  // [..., 1, n]: element j
  if (!xi) return xi.takeError();
  if (!xj) return xj.takeError();
  // Element j comes before element i when it is better, or equal at a lower index.
  KILN_TRY(checkGeneratedSize(ctx, staticShape({n, n}), "the comparison mask"));
  KILN_TRY(checkGeneratedSize(ctx, staticShape({k}), "the positions"));
  DenseTensor lower = DenseTensor::zeros(TensorType{DType::Bool, staticShape({n, n})});
  DenseTensor rowIndex = DenseTensor::zeros(TensorType{DType::I64, staticShape({n, 1})});
  DenseTensor positions = DenseTensor::zeros(TensorType{DType::I64, staticShape({k})});
  for (int64_t i = 0; i < n; ++i) {
    rowIndex.setInt(i, i);
    for (int64_t j = 0; j < i; ++j) lower.setInt(i * n + j, 1);
  }
  for (int64_t p = 0; p < k; ++p) positions.setInt(p, p);
  Chain c(ctx);
  Value* better = c.op(*largest ? OpKind::Gt : OpKind::Lt, {*xj, *xi});
  Value* tie = c.op(OpKind::And, {c.op(OpKind::Eq, {*xj, *xi}), ctx.constant(std::move(lower))});
  Value* before = c.op(OpKind::Or, {better, tie});
  KILN_TRY(c.finish(nullptr));
  auto count = castTo(ctx, before, DType::I64);
  if (!count) return count.takeError();
  auto ranks = ctx.emit(OpKind::ReduceSum, {*count}, {{"axes", Attribute(std::vector<int64_t>{rank})}});
  if (!ranks) return ranks.takeError();
  auto ranksCol = unsqueezeAxes(ctx, *ranks, {rank});  // [..., n, 1]
  if (!ranksCol) return ranksCol.takeError();
  Value* hit = c.op(OpKind::Eq, {*ranksCol, ctx.constant(std::move(positions))});  // [..., n, k]
  Value* picked = c.op(OpKind::Select, {hit, ctx.constant(std::move(rowIndex)), ctx.scalar(DType::I64, 0)});
  KILN_TRY(c.finish(nullptr));
  auto index = ctx.emit(OpKind::ReduceSum, {picked}, {{"axes", Attribute(std::vector<int64_t>{rank - 1})}});
  if (!index) return index.takeError();
  auto values = ctx.emit(OpKind::GatherElements, {*xt, *index}, {{"axis", Attribute(rank - 1)}});
  if (!values) return values.takeError();
  auto v = moveAxis(*values, inverse);
  if (!v) return v.takeError();
  auto i = moveAxis(*index, inverse);
  if (!i) return i.takeError();
  ctx.setOutput(0, *v);
  ctx.setOutput(1, *i);
  return {};
}

/// BitShift of unsigned integers as multiplication or division by 2^y in
/// x's dtype. 2^y wraps to 0 once y reaches the width, so a left shift by
/// the width or more gives 0 as the product wraps; a right shift by as much
/// divides by 1 instead of 0 and selects 0.
Status convertBitShift(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_INPUT(y, 1);
  auto direction = ctx.stringAttr("direction", "");
  if (!direction) return direction.takeError();
  if (*direction != "LEFT" && *direction != "RIGHT") return ctx.error("direction must be LEFT or RIGHT");
  const DType dtype = x->type().dtype;
  if (!isInteger(dtype) || isSigned(dtype))
    return ctx.error("BitShift takes unsigned integers (u8, u16, u32 or u64), got " + x->type().str());
  if (y->type().dtype != dtype)
    return ctx.error("BitShift's shift amounts must have x's dtype " + std::string(dtypeName(dtype)) + ", got " +
                     y->type().str());
  Chain c(ctx);
  Value* factor = c.op(OpKind::Pow, {c.scalar(dtype, 2), y});
  Value* shifted = nullptr;
  if (*direction == "LEFT") {
    shifted = c.op(OpKind::Mul, {x, factor});
  } else {
    Value* zero = c.scalar(dtype, 0);
    Value* pastWidth = c.op(OpKind::Eq, {factor, zero});
    Value* quotient = c.op(OpKind::Div, {x, c.op(OpKind::Select, {pastWidth, c.scalar(dtype, 1), factor})});
    shifted = c.op(OpKind::Select, {pastWidth, zero, quotient});
  }
  return c.finish(shifted);
}

/// The determinant of 1x1, 2x2 and 3x3 matrices by cofactor expansion.
Status convertDet(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const int64_t rank = x->type().rank();
  if (rank < 2) return ctx.error("expects [..., M, M], got " + x->type().str());
  const Dim& m = x->type().shape[static_cast<size_t>(rank - 1)];
  if (!m.isStatic() || x->type().shape[static_cast<size_t>(rank - 2)] != m || m.size < 1 || m.size > 3)
    return ctx.error("supports square matrices of size 1 to 3, got " + x->type().str());
  const int64_t n = m.size;
  // a[i][j] as a tensor of the batch shape.
  std::vector<std::vector<Value*>> a(static_cast<size_t>(n), std::vector<Value*>(static_cast<size_t>(n)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      std::vector<int64_t> starts(static_cast<size_t>(rank), 0),
          ends(static_cast<size_t>(rank), std::numeric_limits<int64_t>::max()), steps(static_cast<size_t>(rank), 1);
      starts[static_cast<size_t>(rank - 2)] = i;
      ends[static_cast<size_t>(rank - 2)] = i + 1;
      starts[static_cast<size_t>(rank - 1)] = j;
      ends[static_cast<size_t>(rank - 1)] = j + 1;
      auto s = ctx.emit(OpKind::Slice, {x},
                        {{"starts", Attribute(starts)}, {"ends", Attribute(ends)}, {"steps", Attribute(steps)}});
      if (!s) return s.takeError();
      auto sq = squeezeAxes(ctx, *s, {rank - 2, rank - 1});
      if (!sq) return sq.takeError();
      a[static_cast<size_t>(i)][static_cast<size_t>(j)] = *sq;
    }
  Chain c(ctx);
  auto at = [&](int i, int j) { return a[static_cast<size_t>(i)][static_cast<size_t>(j)]; };
  auto det2 = [&](int r0, int r1, int c0, int c1) {
    return c.op(OpKind::Sub,
                {c.op(OpKind::Mul, {at(r0, c0), at(r1, c1)}), c.op(OpKind::Mul, {at(r0, c1), at(r1, c0)})});
  };
  Value* det = nullptr;
  if (n == 1) {
    det = at(0, 0);
  } else if (n == 2) {
    det = det2(0, 1, 0, 1);
  } else {
    Value* t0 = c.op(OpKind::Mul, {at(0, 0), det2(1, 2, 1, 2)});
    Value* t1 = c.op(OpKind::Mul, {at(0, 1), det2(1, 2, 0, 2)});
    Value* t2 = c.op(OpKind::Mul, {at(0, 2), det2(1, 2, 0, 1)});
    det = c.op(OpKind::Add, {c.op(OpKind::Sub, {t0, t1}), t2});
  }
  return c.finish(det);
}

// --- Quantization ----------------------------------------------------------------
// QuantizeLinear and DequantizeLinear become Kiln's `quantize` and
// `dequantize` (composites), which the `fold-qdq` pass recognizes around
// convolutions and matmuls; a missing zero point is a zero of the default
// dtype (u8; i32 for a dequantized int32 bias).

/// The `axis` attribute of a per-axis scale, as a Kiln attribute map.
Expected<AttrMap> quantizationAxis(NodeContext& ctx) {
  auto axis = ctx.intAttr("axis", 1);
  if (!axis) return axis.takeError();
  return AttrMap{{"axis", Attribute(*axis)}};
}

/// The zero point input `i`, or a scalar zero of `dtype` when it is absent.
Expected<Value*> zeroPointOr(NodeContext& ctx, size_t i, DType dtype) {
  if (!ctx.hasInput(i)) return ctx.scalar(dtype, 0);
  return ctx.input(i);
}

/// round(x / scale) + zero point, saturated to `dtype` (u8 or i8); `scale`
/// and `zeroPoint` scalars or vectors along `axis`.
Expected<Value*> quantize(NodeContext& ctx, Value* x, Value* scale, Value* zeroPoint, AttrMap axis = {}) {
  const DType dtype = zeroPoint->type().dtype;
  if (dtype != DType::U8 && dtype != DType::I8)
    return ctx.error("zero point must be uint8 or int8, got " + std::string(dtypeName(dtype)));
  auto sc = castTo(ctx, scale, x->type().dtype);
  if (!sc) return sc.takeError();
  return ctx.emit(OpKind::Quantize, {x, *sc, zeroPoint}, std::move(axis));
}

Status convertQuantizeLinear(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_INPUT(scale, 1);
  auto zp = zeroPointOr(ctx, 2, DType::U8);
  if (!zp) return zp.takeError();
  auto axis = quantizationAxis(ctx);
  if (!axis) return axis.takeError();
  return setOutput0(ctx, quantize(ctx, x, scale, *zp, std::move(*axis)));
}

/// (x - zero point) * scale in scale's dtype.
Expected<Value*> dequantize(NodeContext& ctx, Value* x, Value* scale, Value* zeroPoint, AttrMap axis = {}) {
  const DType dtype = x->type().dtype;
  if (dtype != DType::U8 && dtype != DType::I8 && dtype != DType::I32)
    return ctx.error("expects a uint8, int8 or int32 input, got " + x->type().str());
  return ctx.emit(OpKind::Dequantize, {x, scale, zeroPoint}, std::move(axis));
}

Status convertDequantizeLinear(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  KILN_INPUT(scale, 1);
  auto zp = zeroPointOr(ctx, 2, x->type().dtype);
  if (!zp) return zp.takeError();
  auto axis = quantizationAxis(ctx);
  if (!axis) return axis.takeError();
  return setOutput0(ctx, dequantize(ctx, x, scale, *zp, std::move(*axis)));
}

Status convertDynamicQuantizeLinear(NodeContext& ctx) {
  KILN_INPUT(x, 0);
  const DType f = x->type().dtype;
  if (f != DType::F32) return ctx.error("expects a float input, got " + x->type().str());
  std::vector<int64_t> all;
  for (int64_t d = 0; d < x->type().rank(); ++d) all.push_back(d);
  AttrMap attrs{{"axes", Attribute(all)}};
  auto mn = ctx.emit(OpKind::ReduceMin, {x}, attrs);
  if (!mn) return mn.takeError();
  auto mx = ctx.emit(OpKind::ReduceMax, {x}, attrs);
  if (!mx) return mx.takeError();
  Chain c(ctx);
  // The range always includes 0 so that 0 quantizes exactly.
  Value* lo = c.op(OpKind::Min, {*mn, c.scalar(f, 0)});
  Value* hi = c.op(OpKind::Max, {*mx, c.scalar(f, 0)});
  Value* scale = c.op(OpKind::Div, {c.op(OpKind::Sub, {hi, lo}), c.scalar(f, 255)});
  Value* zpf = c.op(OpKind::Sub, {c.scalar(f, 0), c.op(OpKind::Div, {lo, scale})});
  Value* zpr = c.op(OpKind::Min, {c.op(OpKind::Max, {c.op(OpKind::Round, {zpf}), c.scalar(f, 0)}), c.scalar(f, 255)});
  KILN_TRY(c.finish(nullptr));
  auto zp = castTo(ctx, zpr, DType::U8);
  if (!zp) return zp.takeError();
  auto y = quantize(ctx, x, scale, *zp);
  if (!y) return y.takeError();
  ctx.setOutput(0, *y);
  ctx.setOutput(1, scale);
  ctx.setOutput(2, *zp);
  return {};
}

/// (A - a_zero_point) @ (B - b_zero_point) in int32.
Status convertMatMulInteger(NodeContext& ctx) {
  KILN_INPUT(a, 0);
  KILN_INPUT(b, 1);
  std::vector<Value*> v{a, b};
  for (size_t i = 0; i < 2; ++i) {
    auto c = castTo(ctx, v[i], DType::I32);
    if (!c) return c.takeError();
    v[i] = *c;
    if (!ctx.hasInput(2 + i)) continue;
    KILN_INPUT(zp, 2 + i);
    auto z = castTo(ctx, zp, DType::I32);
    if (!z) return z.takeError();
    Value* zv = *z;
    // A 1-D zero point of A is per row: [M] -> [M, 1].
    if (i == 0 && zv->type().rank() == 1) {
      auto r = reshapeTo(ctx, zv, {zv->type().shape[0], Dim::fixed(1)});
      if (!r) return r.takeError();
      zv = *r;
    }
    auto d = ctx.emit(OpKind::Sub, {v[i], zv});
    if (!d) return d.takeError();
    v[i] = *d;
  }
  return setOutput0(ctx, ctx.emit(OpKind::MatMul, {v[0], v[1]}));
}

Status convertQLinearMatMul(NodeContext& ctx) {
  std::vector<Value*> in;
  for (size_t i = 0; i < 8; ++i) {
    KILN_INPUT(v, i);
    in.push_back(v);
  }
  // a's scale and zero point are per row (axis 0 of a 2-D a), b's per
  // column (its last axis): the `dequantize` of each with that axis.
  auto a = dequantize(ctx, in[0], in[1], in[2], {{"axis", Attribute(int64_t{-2})}});
  if (!a) return a.takeError();
  auto b = dequantize(ctx, in[3], in[4], in[5], {{"axis", Attribute(int64_t{-1})}});
  if (!b) return b.takeError();
  auto mm = ctx.emit(OpKind::MatMul, {*a, *b});
  if (!mm) return mm.takeError();
  return setOutput0(ctx, quantize(ctx, *mm, in[6], in[7], {{"axis", Attribute(int64_t{-1})}}));
}

// --- Training ops (ai.onnx.preview.training) ----------------------------------------

/// The shared inputs of Adagrad, Momentum and Adam: R, T, then `groups`
/// lists of n tensors each (X..., G..., and the optimizer state).
struct OptimizerInputs {
  Value* rate;
  Value* step;  // T as the float type of the rate
  std::vector<std::vector<Value*>> groups;
};

Expected<OptimizerInputs> optimizerInputs(NodeContext& ctx, size_t groups) {
  if (ctx.numInputs() < 2 || (ctx.numInputs() - 2) % groups != 0 || ctx.numInputs() == 2)
    return ctx.error("expects R, T and " + std::to_string(groups) + " lists of equal length, got " +
                     std::to_string(ctx.numInputs()) + " inputs");
  const size_t n = (ctx.numInputs() - 2) / groups;
  if (ctx.numOutputs() > n * groups)
    return ctx.error("has " + std::to_string(ctx.numOutputs()) + " outputs, expected at most " +
                     std::to_string(n * groups));
  OptimizerInputs in;
  KILN_INPUT(r, 0);
  KILN_INPUT(t, 1);
  in.rate = r;
  auto tf = castTo(ctx, t, r->type().dtype);
  if (!tf) return tf.takeError();
  in.step = *tf;
  for (size_t g = 0; g < groups; ++g) {
    in.groups.emplace_back();
    for (size_t i = 0; i < n; ++i) {
      KILN_INPUT(v, 2 + g * n + i);
      if (v->type().dtype != r->type().dtype) return ctx.error("tensor " + v->name() + " must have R's dtype");
      in.groups.back().push_back(v);
    }
  }
  return in;
}

Status convertAdagrad(NodeContext& ctx) {
  auto in = optimizerInputs(ctx, 3);
  if (!in) return in.takeError();
  auto decay = ctx.floatAttr("decay_factor", 0.0);
  auto eps = ctx.floatAttr("epsilon", 1e-6);
  auto norm = ctx.floatAttr("norm_coefficient", 0.0);
  if (!decay) return decay.takeError();
  if (!eps) return eps.takeError();
  if (!norm) return norm.takeError();
  const DType f = in->rate->type().dtype;
  const size_t n = in->groups[0].size();
  Chain c(ctx);
  // r = R / (1 + T * decay_factor)
  Value* r = c.op(OpKind::Div,
                  {in->rate, c.op(OpKind::Add, {c.scalar(f, 1), c.op(OpKind::Mul, {in->step, c.scalar(f, *decay)})})});
  for (size_t i = 0; i < n; ++i) {
    Value* x = in->groups[0][i];
    Value* g = c.op(OpKind::Add, {c.op(OpKind::Mul, {x, c.scalar(f, *norm)}), in->groups[1][i]});
    Value* h = c.op(OpKind::Add, {in->groups[2][i], c.op(OpKind::Mul, {g, g})});
    Value* adaptive = c.op(OpKind::Add, {c.op(OpKind::Sqrt, {h}), c.scalar(f, *eps)});
    Value* xNew = c.op(OpKind::Sub, {x, c.op(OpKind::Div, {c.op(OpKind::Mul, {r, g}), adaptive})});
    KILN_TRY(c.finish(nullptr));
    ctx.setOutput(i, xNew);
    ctx.setOutput(n + i, h);
  }
  return {};
}

Status convertMomentum(NodeContext& ctx) {
  auto in = optimizerInputs(ctx, 3);
  if (!in) return in.takeError();
  auto alpha = ctx.floatAttr("alpha", 0.0);
  auto beta = ctx.floatAttr("beta", 0.0);
  auto norm = ctx.floatAttr("norm_coefficient", 0.0);
  auto mode = ctx.stringAttr("mode", "standard");
  if (!alpha) return alpha.takeError();
  if (!beta) return beta.takeError();
  if (!norm) return norm.takeError();
  if (!mode) return mode.takeError();
  if (*mode != "standard" && *mode != "nesterov") return ctx.error("mode '" + *mode + "' is not standard or nesterov");
  const DType f = in->rate->type().dtype;
  const size_t n = in->groups[0].size();
  Chain c(ctx);
  // The first step (T = 0) takes the gradient unscaled.
  Value* betaAdj =
      c.op(OpKind::Select, {c.op(OpKind::Gt, {in->step, c.scalar(f, 0)}), c.scalar(f, *beta), c.scalar(f, 1)});
  for (size_t i = 0; i < n; ++i) {
    Value* x = in->groups[0][i];
    Value* g = c.op(OpKind::Add, {c.op(OpKind::Mul, {x, c.scalar(f, *norm)}), in->groups[1][i]});
    Value* v = c.op(OpKind::Add,
                    {c.op(OpKind::Mul, {in->groups[2][i], c.scalar(f, *alpha)}), c.op(OpKind::Mul, {g, betaAdj})});
    Value* step = *mode == "standard" ? v : c.op(OpKind::Add, {g, c.op(OpKind::Mul, {v, c.scalar(f, *alpha)})});
    Value* xNew = c.op(OpKind::Sub, {x, c.op(OpKind::Mul, {in->rate, step})});
    KILN_TRY(c.finish(nullptr));
    ctx.setOutput(i, xNew);
    ctx.setOutput(n + i, v);
  }
  return {};
}

Status convertAdam(NodeContext& ctx) {
  auto in = optimizerInputs(ctx, 4);
  if (!in) return in.takeError();
  auto alpha = ctx.floatAttr("alpha", 0.9);
  auto beta = ctx.floatAttr("beta", 0.999);
  auto eps = ctx.floatAttr("epsilon", 1e-6);
  auto norm = ctx.floatAttr("norm_coefficient", 0.0);
  auto post = ctx.floatAttr("norm_coefficient_post", 0.0);
  for (auto* a : {&alpha, &beta, &eps, &norm, &post})
    if (!*a) return a->takeError();
  const DType f = in->rate->type().dtype;
  const size_t n = in->groups[0].size();
  Chain c(ctx);
  // R * sqrt(1 - beta^T) / (1 - alpha^T) after the first step, R before it.
  Value* t = in->step;
  Value* corrected = c.op(
      OpKind::Div,
      {c.op(OpKind::Mul,
            {in->rate,
             c.op(OpKind::Sqrt, {c.op(OpKind::Sub, {c.scalar(f, 1), c.op(OpKind::Pow, {c.scalar(f, *beta), t})})})}),
       c.op(OpKind::Sub, {c.scalar(f, 1), c.op(OpKind::Pow, {c.scalar(f, *alpha), t})})});
  Value* rate = c.op(OpKind::Select, {c.op(OpKind::Gt, {t, c.scalar(f, 0)}), corrected, in->rate});
  for (size_t i = 0; i < n; ++i) {
    Value* x = in->groups[0][i];
    Value* g = c.op(OpKind::Add, {c.op(OpKind::Mul, {x, c.scalar(f, *norm)}), in->groups[1][i]});
    Value* v = c.op(OpKind::Add, {c.op(OpKind::Mul, {in->groups[2][i], c.scalar(f, *alpha)}),
                                  c.op(OpKind::Mul, {g, c.scalar(f, 1 - *alpha)})});
    Value* h = c.op(OpKind::Add, {c.op(OpKind::Mul, {in->groups[3][i], c.scalar(f, *beta)}),
                                  c.op(OpKind::Mul, {c.op(OpKind::Mul, {g, g}), c.scalar(f, 1 - *beta)})});
    Value* denom = c.op(OpKind::Add, {c.op(OpKind::Sqrt, {h}), c.scalar(f, *eps)});
    Value* xNew = c.op(OpKind::Sub, {x, c.op(OpKind::Div, {c.op(OpKind::Mul, {rate, v}), denom})});
    if (*post != 0) xNew = c.op(OpKind::Mul, {xNew, c.scalar(f, 1 - *post)});
    KILN_TRY(c.finish(nullptr));
    ctx.setOutput(i, xNew);
    ctx.setOutput(n + i, v);
    ctx.setOutput(2 * n + i, h);
  }
  return {};
}

/// The tensor names of STRINGS attribute `name` (empty when absent).
Expected<std::vector<std::string>> tensorNames(NodeContext& ctx, const std::string& name) {
  const onnx::AttributeProto* a = ctx.attribute(name);
  if (!a) return std::vector<std::string>{};
  if (a->type() != onnx::AttributeProto::STRINGS)
    return ctx.error("attribute '" + name + "' must be a list of tensor names (STRINGS)");
  return std::vector<std::string>(a->strings().begin(), a->strings().end());
}

/// Gradient: the gradient of the tensor named by `y` with respect to each
/// tensor named in `xs`, those named in `zs` held constant, built into the
/// graph at import by Kiln's autodiff (the VJP rules of passes/Vjp.h). A y
/// of several elements is differentiated as the sum of its elements (its
/// gradient seeded with ones). The inputs must be the tensors that xs then
/// zs name, as in ONNX's examples: Kiln differentiates the graph at the
/// values it computes, it does not evaluate it again at other values.
Status convertGradient(NodeContext& ctx) {
  auto xs = tensorNames(ctx, "xs");
  if (!xs) return xs.takeError();
  auto zs = tensorNames(ctx, "zs");
  if (!zs) return zs.takeError();
  auto yName = ctx.stringAttr("y", "");
  if (!yName) return yName.takeError();
  if (xs->empty()) return ctx.error("attribute 'xs' (the tensors to differentiate with respect to) is required");
  if (yName->empty()) return ctx.error("attribute 'y' (the tensor to differentiate) is required");
  std::vector<std::string> names = *xs;
  names.insert(names.end(), zs->begin(), zs->end());
  std::string undefined;
  for (const std::string& n : names)
    if (!ctx.tensorNamed(n)) undefined += (undefined.empty() ? "'" : ", '") + n + "'";
  if (!undefined.empty())
    return ctx.error("attributes 'xs' and 'zs' name " + undefined +
                     ", which no node, initializer or graph input of the graph defines");
  Value* y = ctx.tensorNamed(*yName);
  if (!y) return ctx.error("attribute 'y' names '" + *yName + "', which no node, initializer or graph input defines");
  if (ctx.numInputs() != names.size())
    return ctx.error("has " + std::to_string(ctx.numInputs()) + " inputs, expected one per tensor named in 'xs' and 'zs' (" +
                     std::to_string(names.size()) + ")");
  if (ctx.numOutputs() > xs->size())
    return ctx.error("has " + std::to_string(ctx.numOutputs()) + " outputs, expected at most one per tensor in 'xs' (" +
                     std::to_string(xs->size()) + ")");
  std::vector<Value*> xValues, zValues;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& input = ctx.node().input(static_cast<int>(i));
    if (input != names[i])
      return ctx.error("input " + std::to_string(i) + " is '" + input + "', expected '" + names[i] +
                       "', the tensor the attributes name there (Kiln differentiates the graph at the values it "
                       "computes, not at other values fed to Gradient)");
    Value* v = ctx.tensorNamed(names[i]);
    if (i < xs->size()) {
      const Op* def = v->definingOp();
      if (def && def->kind() == OpKind::Constant)
        return ctx.error("'" + names[i] +
                         "' in 'xs' is a constant at import (an initializer that is not a graph input, or computed "
                         "from constants only), which the graph was folded around; declare it a graph input to "
                         "differentiate with respect to it");
      xValues.push_back(v);
    } else {
      zValues.push_back(v);
    }
  }
  auto grads = ctx.gradients(y, xValues, zValues);
  if (!grads) return grads.takeError();
  for (size_t i = 0; i < ctx.numOutputs(); ++i)
    if (ctx.hasOutput(i)) ctx.setOutput(i, (*grads)[i]);
  return {};
}

constexpr OpConverter kConverters[] = {
    {"", "Add", 1, kNewest, &convertBinary<OpKind::Add>},
    {"", "Sub", 1, kNewest, &convertBinary<OpKind::Sub>},
    {"", "Mul", 1, kNewest, &convertBinary<OpKind::Mul>},
    {"", "Div", 1, kNewest, &convertBinary<OpKind::Div>},
    {"", "Pow", 1, kNewest, &convertPow},
    {"", "Mod", 10, kNewest, &convertMod},
    {"", "And", 1, kNewest, &convertBinary<OpKind::And>},
    {"", "Or", 1, kNewest, &convertBinary<OpKind::Or>},
    {"", "Xor", 1, kNewest, &convertBinary<OpKind::Xor>},
    {"", "Equal", 1, kNewest, &convertBinary<OpKind::Eq>},
    {"", "Less", 1, kNewest, &convertBinary<OpKind::Lt>},
    {"", "Greater", 1, kNewest, &convertBinary<OpKind::Gt>},
    {"", "LessOrEqual", 12, kNewest, &convertBinary<OpKind::Le>},
    {"", "GreaterOrEqual", 12, kNewest, &convertBinary<OpKind::Ge>},
    {"", "Neg", 1, kNewest, &convertUnary<OpKind::Neg>},
    {"", "Abs", 1, kNewest, &convertUnary<OpKind::Abs>},
    {"", "Sign", 9, kNewest, &convertUnary<OpKind::Sign>},
    {"", "Exp", 1, kNewest, &convertUnary<OpKind::Exp>},
    {"", "Log", 1, kNewest, &convertUnary<OpKind::Log>},
    {"", "Sqrt", 1, kNewest, &convertUnary<OpKind::Sqrt>},
    {"", "Reciprocal", 1, kNewest, &convertUnary<OpKind::Reciprocal>},
    {"", "Tanh", 1, kNewest, &convertUnary<OpKind::Tanh>},
    {"", "Sigmoid", 1, kNewest, &convertUnary<OpKind::Sigmoid>},
    {"", "Relu", 1, kNewest, &convertUnary<OpKind::Relu>},
    {"", "Erf", 9, kNewest, &convertUnary<OpKind::Erf>},
    {"", "Sin", 7, kNewest, &convertUnary<OpKind::Sin>},
    {"", "Cos", 7, kNewest, &convertUnary<OpKind::Cos>},
    {"", "Tan", 7, kNewest, &convertUnary<OpKind::Tan>},
    {"", "Asin", 7, kNewest, &convertUnary<OpKind::Asin>},
    {"", "Acos", 7, kNewest, &convertUnary<OpKind::Acos>},
    {"", "Atan", 7, kNewest, &convertUnary<OpKind::Atan>},
    {"", "Sinh", 9, kNewest, &convertUnary<OpKind::Sinh>},
    {"", "Cosh", 9, kNewest, &convertUnary<OpKind::Cosh>},
    {"", "Asinh", 9, kNewest, &convertUnary<OpKind::Asinh>},
    {"", "Acosh", 9, kNewest, &convertUnary<OpKind::Acosh>},
    {"", "Atanh", 9, kNewest, &convertUnary<OpKind::Atanh>},
    {"", "Floor", 1, kNewest, &convertUnary<OpKind::Floor>},
    {"", "Ceil", 1, kNewest, &convertUnary<OpKind::Ceil>},
    {"", "Round", 11, kNewest, &convertUnary<OpKind::Round>},
    {"", "Not", 1, kNewest, &convertUnary<OpKind::Not>},
    {"", "IsNaN", 9, kNewest, &convertUnary<OpKind::IsNan>},
    {"", "IsInf", 10, kNewest, &convertIsInf},
    {"", "Where", 9, kNewest, &convertWhere},
    {"", "Cast", 1, kNewest, &convertCast},
    {"", "CastLike", 15, kNewest, &convertCastLike},
    {"", "Clip", 1, kNewest, &convertClip},
    {"", "Max", 1, kNewest, &convertVariadic<OpKind::Max, false>},
    {"", "Min", 1, kNewest, &convertVariadic<OpKind::Min, false>},
    {"", "Sum", 1, kNewest, &convertVariadic<OpKind::Add, false>},
    {"", "Mean", 1, kNewest, &convertVariadic<OpKind::Add, true>},
    {"", "ReduceSum", 1, kNewest, &convertReduce<Reduction::Sum>},
    {"", "ReduceMean", 1, kNewest, &convertReduce<Reduction::Mean>},
    {"", "ReduceMax", 1, kNewest, &convertReduce<Reduction::Max>},
    {"", "ReduceMin", 1, kNewest, &convertReduce<Reduction::Min>},
    {"", "ReduceProd", 1, kNewest, &convertReduce<Reduction::Prod>},
    {"", "ReduceL1", 1, kNewest, &convertReduce<Reduction::L1>},
    {"", "ReduceL2", 1, kNewest, &convertReduce<Reduction::L2>},
    {"", "ReduceLogSum", 1, kNewest, &convertReduce<Reduction::LogSum>},
    {"", "ReduceLogSumExp", 1, kNewest, &convertReduce<Reduction::LogSumExp>},
    {"", "ReduceSumSquare", 1, kNewest, &convertReduce<Reduction::SumSquare>},
    {"", "ArgMax", 1, kNewest, &convertArgReduce<OpKind::ArgMax>},
    {"", "ArgMin", 1, kNewest, &convertArgReduce<OpKind::ArgMin>},
    {"", "MatMul", 1, kNewest, &convertMatMul},
    {"", "Gemm", 1, kNewest, &convertGemm},
    {"", "Einsum", 12, kNewest, &convertEinsum},
    {"", "CumSum", 11, kNewest, &convertCumSum},
    {"", "HardSigmoid", 1, kNewest, &convertHardSigmoid},
    {"", "HardSwish", 14, kNewest, &convertUnary<OpKind::HardSwish>},
    {"", "Selu", 1, kNewest, &convertSelu},
    {"", "Celu", 12, kNewest, &convertCelu},
    {"", "ThresholdedRelu", 10, kNewest, &convertThresholdedRelu},
    {"", "PRelu", 1, kNewest, &convertPRelu},
    {"", "Softsign", 1, kNewest, &convertSoftsign},
    {"", "Shrink", 9, kNewest, &convertShrink},
    {"", "TopK", 1, kNewest, &convertTopK},
    {"", "BitShift", 11, kNewest, &convertBitShift},
    {"", "Det", 11, kNewest, &convertDet},
    {"", "QuantizeLinear", 10, kNewest, &convertQuantizeLinear},
    {"", "DequantizeLinear", 10, kNewest, &convertDequantizeLinear},
    {"", "DynamicQuantizeLinear", 11, kNewest, &convertDynamicQuantizeLinear},
    {"", "MatMulInteger", 10, kNewest, &convertMatMulInteger},
    {"", "QLinearMatMul", 10, kNewest, &convertQLinearMatMul},
    {"ai.onnx.preview.training", "Adagrad", 1, 1, &convertAdagrad},
    {"ai.onnx.preview.training", "Momentum", 1, 1, &convertMomentum},
    {"ai.onnx.preview.training", "Adam", 1, 1, &convertAdam},
    {"ai.onnx.preview.training", "Gradient", 1, 1, &convertGradient},
};

}  // namespace

std::span<const OpConverter> mathConverters() { return kConverters; }

}  // namespace kiln::onnx_import
