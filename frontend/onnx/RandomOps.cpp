// ONNX random ops: RandomUniform, RandomNormal, their *Like forms, and
// Bernoulli. They become Kiln's `random_uniform` / `random_normal`, whose
// samples are a pure function of the seed and the element index
// (docs/ops.md): a model draws the same values on every run and every
// backend, which is what lets the interpreter check the compiled code, but
// never NumPy's values, so the ONNX test cases of these ops are checked
// statistically (docs/onnx.md). Seeds come from randomSeed
// (ConverterSupport.h). Training-mode Dropout, the other random op, is in
// NNOps.cpp with the rest of Dropout.
#include "frontend/onnx/ConverterSupport.h"
#include "frontend/onnx/NNEmitter.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {
namespace {

constexpr int64_t kNewest = kNewestNNOpset;

/// The `dtype` attribute as a Kiln float dtype; `dflt` when absent.
Expected<DType> floatDtypeAttr(NodeContext& ctx, DType dflt) {
  const onnx::AttributeProto* attr = ctx.attribute("dtype");
  if (!attr) return dflt;
  auto code = ctx.intAttr("dtype", 0);
  if (!code) return code.takeError();
  std::optional<DType> dtype = dtypeOfOnnx(*code);
  if (!dtype || !isFloat(*dtype))
    return ctx.error("attribute 'dtype' = " + std::to_string(*code) +
                     " is not a float type (float, double, float16 or bfloat16)");
  return *dtype;
}

/// A random op of `type`: uniform in [a, b) or normal with mean a and
/// standard deviation b. The shape must be known (static or symbolic): Kiln
/// draws as many samples as the declared type holds.
Expected<Value*> emitRandom(NodeContext& ctx, bool uniform, TensorType type, double a, double b) {
  for (const Dim& d : type.shape)
    if (d.isUnknown()) return ctx.error("the random tensor needs a known shape, got " + type.str());
  auto seed = randomSeed(ctx);
  if (!seed) return seed.takeError();
  if (uniform) {
    if (!(a <= b)) return ctx.error("low " + std::to_string(a) + " must not exceed high " + std::to_string(b));
    return ctx.emit(OpKind::RandomUniform, {},
                    {{"low", Attribute(a)}, {"high", Attribute(b)}, {"seed", Attribute(*seed)}}, {type});
  }
  if (!(b >= 0)) return ctx.error("scale " + std::to_string(b) + " must not be negative");
  return ctx.emit(OpKind::RandomNormal, {}, {{"mean", Attribute(a)}, {"std", Attribute(b)}, {"seed", Attribute(*seed)}},
                  {type});
}

/// RandomUniform / RandomNormal: the shape from the `shape` attribute, the
/// dtype from `dtype` (default float).
template <bool Uniform>
Status convertRandom(NodeContext& ctx) {
  NNEmitter e(ctx);
  if (Uniform) {
    e.expectOnlyAttributes({"low", "high", "seed", "dtype", "shape"});
  } else {
    e.expectOnlyAttributes({"mean", "scale", "seed", "dtype", "shape"});
  }
  if (!e.hasAttr("shape")) return ctx.error("attribute 'shape' is required");
  const std::vector<int64_t> dims = e.intsAttr("shape", {});
  const double a = Uniform ? e.floatAttr("low", 0.0) : e.floatAttr("mean", 0.0);
  const double b = Uniform ? e.floatAttr("high", 1.0) : e.floatAttr("scale", 1.0);
  if (e.failed()) return e.status();
  for (int64_t d : dims)
    if (d < 0) return ctx.error("attribute 'shape' has a negative dim " + std::to_string(d));
  KILN_TRY(checkGeneratedSize(ctx, staticShape(dims), "the random tensor"));
  auto dtype = floatDtypeAttr(ctx, DType::F32);
  if (!dtype) return dtype.takeError();
  return setOutput0(ctx, emitRandom(ctx, Uniform, TensorType{*dtype, staticShape(dims)}, a, b));
}

/// RandomUniformLike / RandomNormalLike: the shape of input 0, the dtype
/// from `dtype` or else input 0's (which must then be a float type).
template <bool Uniform>
Status convertRandomLike(NodeContext& ctx) {
  NNEmitter e(ctx);
  if (Uniform) {
    e.expectOnlyAttributes({"low", "high", "seed", "dtype"});
  } else {
    e.expectOnlyAttributes({"mean", "scale", "seed", "dtype"});
  }
  const double a = Uniform ? e.floatAttr("low", 0.0) : e.floatAttr("mean", 0.0);
  const double b = Uniform ? e.floatAttr("high", 1.0) : e.floatAttr("scale", 1.0);
  Value* like = e.input(0);
  if (e.failed()) return e.status();
  const TensorType& t = like->type();
  if (!e.hasAttr("dtype") && !isFloat(t.dtype))
    return ctx.error("input " + t.str() + " is not a float tensor; give the result's type in attribute 'dtype'");
  auto dtype = floatDtypeAttr(ctx, t.dtype);
  if (!dtype) return dtype.takeError();
  return setOutput0(ctx, emitRandom(ctx, Uniform, TensorType{*dtype, t.shape}, a, b));
}

/// Bernoulli (opset 15): 1 with probability input[i], else 0, in `dtype`
/// (default the input's). Uniform samples are drawn in double, so every
/// probability a float type can hold is honoured (p = 0 never gives 1,
/// p = 1 always does).
Status convertBernoulli(NodeContext& ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"dtype", "seed"});
  Value* p = e.input(0);
  const int64_t code = e.intAttr("dtype", -1);
  if (e.failed()) return e.status();
  const TensorType& t = p->type();
  if (!isFloat(t.dtype)) return ctx.error("input (the probabilities) must be a float tensor, got " + t.str());
  DType dtype = t.dtype;
  if (code != -1) {
    std::optional<DType> d = dtypeOfOnnx(code);
    if (!d) return ctx.error("attribute 'dtype' = " + std::to_string(code) + " is not a type Kiln has");
    dtype = *d;
  }
  auto u = emitRandom(ctx, true, TensorType{DType::F64, t.shape}, 0.0, 1.0);
  if (!u) return u.takeError();
  Value* one = e.binary(OpKind::Lt, *u, e.cast(p, DType::F64));
  e.setOutput(0, e.cast(one, dtype));
  return e.status();
}

const OpConverter kRandomConverters[] = {
    {"", "RandomUniform", 1, kNewest, &convertRandom<true>},
    {"", "RandomNormal", 1, kNewest, &convertRandom<false>},
    {"", "RandomUniformLike", 1, kNewest, &convertRandomLike<true>},
    {"", "RandomNormalLike", 1, kNewest, &convertRandomLike<false>},
    {"", "Bernoulli", 15, kNewest, &convertBernoulli},
};

}  // namespace

std::span<const OpConverter> randomConverters() { return kRandomConverters; }

}  // namespace kiln::onnx_import
