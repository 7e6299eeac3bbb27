// ONNX signal-processing and text-featurizing ops: DFT, STFT,
// MelWeightMatrix and TfIdfVectorizer. Kiln has no complex dtype and no FFT
// op; each of these is a decomposition at import into primitives, exact to
// float rounding, rather than a new IR op:
//
//  - DFT: a `matmul` of the signal, its real and imaginary parts side by side
//    along the transformed axis, with a constant [N*parts, 2*bins] matrix of
//    cosines and sines; complex numbers stay a trailing dim of 2 as ONNX
//    has them. That is O(N * bins) multiply-adds per signal where an FFT
//    does O(N log N), a fair price for the frame lengths of audio front ends
//    (hundreds of samples) that runs on the matmul libraries of every
//    backend; the matrix is bounded by kMaxGeneratedElements.
//    TODO(kiln): an FFT op for long signals.
//  - STFT: `gather` of the frames at constant indices, `mul` by the window,
//    then the DFT above along the frame axis.
//  - MelWeightMatrix: its inputs fix the result's shape, so they must be
//    known at import; the matrix is a constant, computed as the ONNX
//    reference (onnx/reference/ops/op_mel_weight_matrix.py) computes it.
//  - TfIdfVectorizer: n-gram counts as `eq` of strided slices of the input
//    with the pool's n-grams, `and` over the items, `reduce_sum` over the
//    positions, and a constant 0/1 `matmul` from pool n-grams to output
//    coordinates; the counting rules are onnxruntime's and the reference's
//    (unigrams once, longer n-grams once per skip distance).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "frontend/onnx/ConverterSupport.h"
#include "frontend/onnx/NNEmitter.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {
namespace {

constexpr int64_t kNewest = kNewestNNOpset;

/// Input `i`, a constant scalar (one element), as a double; `what` names it.
Expected<double> constantScalar(NodeContext& ctx, size_t i, const std::string& what) {
  if (!ctx.hasInput(i)) return ctx.error(what + " (input " + std::to_string(i) + ") is required but absent");
  const DenseTensor* t = ctx.constantInput(i);
  if (!t)
    return ctx.error(what + " (input " + std::to_string(i) + " '" + ctx.node().input(static_cast<int>(i)) +
                     "') must be known at import time (a constant, an initializer or computed from them); Kiln "
                     "compiles static shapes");
  if (t->numElements() != 1)
    return ctx.error(what + " (input " + std::to_string(i) + ") must be a scalar, got " + t->type.str());
  return t->getDouble(0);
}

/// A constant positive integer scalar input.
Expected<int64_t> positiveScalar(NodeContext& ctx, size_t i, const std::string& what) {
  auto v = constantScalar(ctx, i, what);
  if (!v) return v.takeError();
  if (!(*v >= 1) || *v != std::floor(*v) || *v > static_cast<double>(int64_t{1} << 40))
    return ctx.error(what + " (input " + std::to_string(i) + ") must be a positive integer, got " + std::to_string(*v));
  return static_cast<int64_t>(*v);
}

/// Checks a signal of ONNX's complex layout: a float tensor of rank >= 2
/// (`minRank`) whose last dim is 1 (real) or 2 (real, imaginary).
Status checkSignal(NodeContext& ctx, const TensorType& t, int64_t minRank) {
  if (!isFloat(t.dtype)) return ctx.error("the signal must be a float tensor, got " + t.str());
  if (t.rank() < minRank)
    return ctx.error("the signal must have rank " + std::string(minRank == 3 ? "3 [batch, length, 1 or 2]" : ">= 2") +
                     ", got " + t.str());
  const Dim& parts = t.shape.back();
  if (!parts.isStatic() || (parts.size != 1 && parts.size != 2))
    return ctx.error("the signal's last dim must be 1 (real) or 2 (real and imaginary parts), got " + t.str());
  return {};
}

/// The DFT of `x` along `axis` (static), x's last dim holding the real (1)
/// or real and imaginary (2) parts. The signal is cut or zero-padded to
/// `length`; `inverse` uses e^{+2 pi i k n / length} and divides by length;
/// `onesided` keeps bins [0, length / 2]. The result has x's shape with
/// `axis` resized to the bins and a last dim of 2.
Value* dft(NNEmitter& e, Value* x, int64_t axis, int64_t length, bool inverse, bool onesided) {
  if (!x) return nullptr;
  const TensorType& t = x->type();
  const int64_t rank = t.rank();
  const int64_t parts = t.shape.back().size;
  const int64_t n = t.shape[static_cast<size_t>(axis)].size;
  const int64_t bins = onesided ? length / 2 + 1 : length;
  const int64_t rows = n * parts, cols = 2 * bins;
  if (Status s = checkGeneratedSize(e.ctx(), staticShape({rows, cols}), "the DFT matrix"); !s)
    return e.fail(s.takeError());

  // m[(j * parts + p), (k * 2 + q)]: how part p of sample j feeds part q of
  // bin k, i.e. the complex product x_j * w^(jk) written out in reals.
  DenseTensor m = DenseTensor::zeros(TensorType{t.dtype, staticShape({rows, cols})});
  for (int64_t j = 0; j < std::min(n, length); ++j) {
    for (int64_t k = 0; k < bins; ++k) {
      // (j * k) mod length keeps the angle in [0, 2 pi), where cos and sin
      // are accurate to double rounding however long the signal.
      const double angle = 2 * std::numbers::pi * static_cast<double>((j * k) % length) / static_cast<double>(length);
      const double scale = inverse ? 1.0 / static_cast<double>(length) : 1.0;
      const double wr = std::cos(angle) * scale, wi = (inverse ? std::sin(angle) : -std::sin(angle)) * scale;
      m.setDouble((j * parts) * cols + 2 * k, wr);
      m.setDouble((j * parts) * cols + 2 * k + 1, wi);
      if (parts == 2) {
        m.setDouble((j * parts + 1) * cols + 2 * k, -wi);
        m.setDouble((j * parts + 1) * cols + 2 * k + 1, wr);
      }
    }
  }

  // [rest..., n, parts] with the signal axis next to the parts, flattened to
  // [rest..., n * parts] for the matmul, and back.
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank - 1; ++d)
    if (d != axis) perm.push_back(d);
  perm.push_back(axis);
  perm.push_back(rank - 1);
  const bool moved = axis != rank - 2;
  Value* v = moved ? e.transpose(x, perm) : x;
  if (!v) return nullptr;
  Shape flat(v->type().shape.begin(), v->type().shape.end() - 2);
  flat.push_back(Dim::fixed(rows));
  Value* signal = e.reshape(v, flat);
  Value* y = e.emit(OpKind::MatMul, {signal, e.constant(std::move(m))});
  Shape complexShape(flat.begin(), flat.end() - 1);
  complexShape.push_back(Dim::fixed(bins));
  complexShape.push_back(Dim::fixed(2));
  y = e.reshape(y, complexShape);
  if (!moved) return y;
  std::vector<int64_t> inversePerm(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) inversePerm[static_cast<size_t>(perm[static_cast<size_t>(d)])] = d;
  return e.transpose(y, inversePerm);
}

/// A 0/1 attribute.
Expected<bool> flagAttr(NodeContext& ctx, std::string_view name, int64_t dflt) {
  auto v = ctx.intAttr(name, dflt);
  if (!v) return v.takeError();
  if (*v != 0 && *v != 1)
    return ctx.error("attribute '" + std::string(name) + "' = " + std::to_string(*v) + "; expected 0 or 1");
  return *v == 1;
}

// --- DFT, STFT ------------------------------------------------------------------

/// DFT: opset 17 takes the axis as an attribute (default 1), opset 20 as
/// input 2 (default -2). Axes count the signal dims: [0, rank - 2] from the
/// front, [-rank, -2] from the back (the last dim holds the parts).
Status convertDft(NodeContext& ctx) {
  NNEmitter e(ctx);
  const bool axisIsInput = ctx.opset() >= 20;
  if (axisIsInput) {
    e.expectOnlyAttributes({"inverse", "onesided"});
  } else {
    e.expectOnlyAttributes({"axis", "inverse", "onesided"});
  }
  int64_t axis = axisIsInput ? -2 : e.intAttr("axis", 1);
  Value* x = e.input(0);
  if (e.failed()) return e.status();
  auto inverse = flagAttr(ctx, "inverse", 0);
  if (!inverse) return inverse.takeError();
  auto onesided = flagAttr(ctx, "onesided", 0);
  if (!onesided) return onesided.takeError();
  if (axisIsInput && ctx.hasInput(2)) {
    auto a = constantScalar(ctx, 2, "axis");
    if (!a) return a.takeError();
    axis = static_cast<int64_t>(*a);
  }
  const TensorType& t = x->type();
  KILN_TRY(checkSignal(ctx, t, 2));
  const int64_t rank = t.rank();
  if (axis < -rank || axis > rank - 2 || axis == -1)
    return ctx.error("axis " + std::to_string(axis) + " is out of range for a signal of rank " + std::to_string(rank) +
                     " (expected " + std::to_string(-rank) + " to -2 or 0 to " + std::to_string(rank - 2) +
                     "; the last dim holds the real and imaginary parts)");
  if (axis < 0) axis += rank;
  const Dim& n = t.shape[static_cast<size_t>(axis)];
  if (!n.isStatic())
    return ctx.error("the signal needs a static size along axis " + std::to_string(axis) + ", got " + t.str());
  int64_t length = n.size;
  if (ctx.hasInput(1)) {
    auto l = positiveScalar(ctx, 1, "dft_length");
    if (!l) return l.takeError();
    length = *l;
  }
  if (length == 0) return ctx.error("the signal is empty along axis " + std::to_string(axis));
  e.setOutput(0, dft(e, x, axis, length, *inverse, *onesided));
  return e.status();
}

/// STFT (opset 17): signal [batch, length, 1 or 2], frame_step and
/// frame_length known at import, an optional window [frame_length] (a
/// run-time input is fine). frame_length defaults to the window's length,
/// else the signal's (as the reference does); frames start every
/// frame_step samples and must fit the signal.
Status convertStft(NodeContext& ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"onesided"});
  Value* signal = e.input(0);
  Value* window = e.optionalInput(2);
  if (e.failed()) return e.status();
  auto onesided = flagAttr(ctx, "onesided", 1);
  if (!onesided) return onesided.takeError();
  const TensorType& t = signal->type();
  KILN_TRY(checkSignal(ctx, t, 3));
  if (t.rank() != 3) return ctx.error("the signal must have rank 3 [batch, length, 1 or 2], got " + t.str());
  if (!t.shape[1].isStatic()) return ctx.error("the signal needs a static length, got " + t.str());
  const int64_t signalLength = t.shape[1].size;
  auto step = positiveScalar(ctx, 1, "frame_step");
  if (!step) return step.takeError();

  int64_t frameLength = signalLength;
  if (window) {
    const TensorType& w = window->type();
    if (w.rank() != 1 || !w.shape[0].isStatic()) return ctx.error("the window must be a static vector, got " + w.str());
    if (w.dtype != t.dtype)
      return ctx.error("the window " + w.str() + " must have the signal's type " + std::string(dtypeName(t.dtype)));
    frameLength = w.shape[0].size;
  }
  if (ctx.hasInput(3)) {
    auto l = positiveScalar(ctx, 3, "frame_length");
    if (!l) return l.takeError();
    if (window && *l != frameLength)
      return ctx.error("frame_length " + std::to_string(*l) + " differs from the window's length " +
                       std::to_string(frameLength));
    frameLength = *l;
  }
  if (frameLength < 1 || frameLength > signalLength)
    return ctx.error("frame length " + std::to_string(frameLength) + " must be from 1 to the signal's length " +
                     std::to_string(signalLength));
  const int64_t frames = 1 + (signalLength - frameLength) / *step;
  KILN_TRY(checkGeneratedSize(ctx, staticShape({frames, frameLength}), "the frame index table"));

  // Frame f is samples [f * step, f * step + frameLength).
  std::vector<int64_t> index;
  index.reserve(static_cast<size_t>(frames * frameLength));
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t i = 0; i < frameLength; ++i) index.push_back(f * *step + i);
  Value* framed =
      e.gather(signal, e.tensorI64({frames, frameLength}, index), 1);  // [batch, frames, frameLength, parts]
  if (window) framed = e.mul(framed, e.reshape(window, staticShape({1, 1, frameLength, 1})));
  e.setOutput(0, dft(e, framed, 2, frameLength, false, *onesided));
  return e.status();
}

// --- MelWeightMatrix ----------------------------------------------------------------

/// MelWeightMatrix (opset 17): the [dft_length / 2 + 1, num_mel_bins]
/// matrix of triangular mel filters, a constant. Filter i rises over DFT
/// bins [edge_i, edge_{i+1}] and falls over [edge_{i+1}, edge_{i+2}), with
/// num_mel_bins + 2 edges spaced evenly in mel from lower_edge_hertz (the
/// reference divides the mel range by num_mel_bins + 2, not + 1; so does
/// this) and mapped to bins as floor((dft_length + 1) * hz / sample_rate).
Status convertMelWeightMatrix(NodeContext& ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"output_datatype"});
  const int64_t outputType = e.intAttr("output_datatype", onnx::TensorProto::FLOAT);
  if (e.failed()) return e.status();
  std::optional<DType> dtype = dtypeOfOnnx(outputType);
  if (!dtype) return ctx.error("output_datatype " + std::to_string(outputType) + " is not a type Kiln has");
  auto melBins = positiveScalar(ctx, 0, "num_mel_bins");
  if (!melBins) return melBins.takeError();
  auto dftLength = positiveScalar(ctx, 1, "dft_length");
  if (!dftLength) return dftLength.takeError();
  auto sampleRate = positiveScalar(ctx, 2, "sample_rate");
  if (!sampleRate) return sampleRate.takeError();
  auto lower = constantScalar(ctx, 3, "lower_edge_hertz");
  if (!lower) return lower.takeError();
  auto upper = constantScalar(ctx, 4, "upper_edge_hertz");
  if (!upper) return upper.takeError();
  // An edge above sample_rate is past every bin (checked below for the
  // exact bound); refusing it first keeps the bin arithmetic in range.
  if (!(*lower >= 0) || !(*upper >= *lower) || !(*upper <= static_cast<double>(*sampleRate)))
    return ctx.error("the edges must satisfy 0 <= lower_edge_hertz <= upper_edge_hertz <= sample_rate / 2, got " +
                     std::to_string(*lower) + " and " + std::to_string(*upper) + " for sample_rate " +
                     std::to_string(*sampleRate));
  const int64_t bins = *dftLength / 2 + 1;
  KILN_TRY(checkGeneratedSize(ctx, staticShape({bins, *melBins}), "the mel weight matrix"));

  auto toMel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const double lowMel = toMel(*lower);
  const double melStep = (toMel(*upper) - lowMel) / static_cast<double>(*melBins + 2);
  std::vector<int64_t> edge(static_cast<size_t>(*melBins + 2));
  for (size_t i = 0; i < edge.size(); ++i) {
    const double hz = 700.0 * (std::pow(10.0, (static_cast<double>(i) * melStep + lowMel) / 2595.0) - 1.0);
    edge[i] =
        static_cast<int64_t>(std::floor(static_cast<double>(*dftLength + 1) * hz / static_cast<double>(*sampleRate)));
  }
  // The highest bin a filter reaches: past the matrix means the upper edge
  // lies above the Nyquist frequency (the reference fails with IndexError).
  if (edge.back() > bins || (edge[edge.size() - 2] >= bins))
    return ctx.error("upper_edge_hertz " + std::to_string(*upper) + " reaches DFT bin " +
                     std::to_string(std::max(edge.back() - 1, edge[edge.size() - 2])) + " of " + std::to_string(bins) +
                     " (it must not exceed sample_rate / 2 = " + std::to_string(*sampleRate / 2) + ")");

  DenseTensor m = DenseTensor::zeros(TensorType{*dtype, staticShape({bins, *melBins})});
  for (int64_t i = 0; i < *melBins; ++i) {
    const int64_t left = edge[static_cast<size_t>(i)], center = edge[static_cast<size_t>(i + 1)],
                  right = edge[static_cast<size_t>(i + 2)];
    if (center == left) {
      m.setDouble(center * *melBins + i, 1.0);
    } else {
      for (int64_t j = left; j <= center; ++j)
        m.setDouble(j * *melBins + i, static_cast<double>(j - left) / static_cast<double>(center - left));
    }
    for (int64_t j = center; j < right; ++j)
      m.setDouble(j * *melBins + i, static_cast<double>(right - j) / static_cast<double>(right - center));
  }
  ctx.setOutput(0, ctx.constant(std::move(m)));
  return {};
}

// --- TfIdfVectorizer ------------------------------------------------------------------

/// TfIdfVectorizer (opset 9) over integer input [C] or [N, C]: Y[.., o] is
/// the number of times the pool n-grams mapped to output o (ngram_indexes)
/// occur, an n-gram of length n >= 2 being items (s, s + d, ..., s + (n-1) d)
/// for each skip distance d in 1..max_skip_count + 1 and a unigram counted
/// once per position; only lengths min_gram_length..max_gram_length count.
/// IDF turns counts into weights[o] (1 without weights) where non-zero,
/// TFIDF multiplies them by weights[o]: the weights index output coordinates
/// as onnxruntime and the ONNX reference index them.
Status convertTfIdfVectorizer(NodeContext& ctx) {
  NNEmitter e(ctx);
  e.expectOnlyAttributes({"max_gram_length", "max_skip_count", "min_gram_length", "mode", "ngram_counts",
                          "ngram_indexes", "pool_int64s", "pool_strings", "weights"});
  if (ctx.attribute("pool_strings"))
    return ctx.error("attribute 'pool_strings': Kiln has no string tensors; only pool_int64s pools are supported");
  const int64_t minGram = e.intAttr("min_gram_length", 0), maxGram = e.intAttr("max_gram_length", 0);
  const int64_t maxSkip = e.intAttr("max_skip_count", 0);
  const std::string mode = e.stringAttr("mode", "");
  const std::vector<int64_t> counts = e.intsAttr("ngram_counts", {}), indexes = e.intsAttr("ngram_indexes", {});
  const std::vector<int64_t> pool = e.intsAttr("pool_int64s", {});
  const bool weighted = e.hasAttr("weights");
  const std::vector<double> weights = e.floatsAttr("weights", {});
  Value* x = e.input(0);
  if (e.failed()) return e.status();

  if (mode != "TF" && mode != "IDF" && mode != "TFIDF")
    return ctx.error("attribute 'mode' = \"" + mode + "\"; expected \"TF\", \"IDF\" or \"TFIDF\"");
  if (minGram < 1 || maxGram < minGram)
    return ctx.error("needs 1 <= min_gram_length <= max_gram_length, got " + std::to_string(minGram) + " and " +
                     std::to_string(maxGram));
  if (maxSkip < 0) return ctx.error("max_skip_count must not be negative, got " + std::to_string(maxSkip));
  if (counts.empty() || maxGram > static_cast<int64_t>(counts.size()))
    return ctx.error("ngram_counts (" + std::to_string(counts.size()) +
                     " entries) must give the pool's start of every n-gram length up to max_gram_length " +
                     std::to_string(maxGram));
  if (pool.empty()) return ctx.error("pool_int64s must not be empty");
  if (indexes.empty() || *std::min_element(indexes.begin(), indexes.end()) < 0)
    return ctx.error("ngram_indexes must be a non-empty list of output coordinates >= 0");
  const int64_t largest = *std::max_element(indexes.begin(), indexes.end());
  if (largest >= kMaxGeneratedElements)
    return ctx.error("ngram_indexes holds output coordinate " + std::to_string(largest) + "; at most " +
                     std::to_string(kMaxGeneratedElements) + " coordinates are supported");
  const int64_t outputs = largest + 1;
  if (weighted && weights.size() != indexes.size())
    return ctx.error("weights has " + std::to_string(weights.size()) + " entries, ngram_indexes " +
                     std::to_string(indexes.size()) + "; they must be equal");
  if (weighted && static_cast<int64_t>(weights.size()) < outputs)
    return ctx.error("weights has " + std::to_string(weights.size()) + " entries for " + std::to_string(outputs) +
                     " output coordinates");

  const TensorType& t = x->type();
  if (t.dtype != DType::I32 && t.dtype != DType::I64)
    return ctx.error("input must be int32 or int64 (Kiln has no strings), got " + t.str());
  if (t.rank() != 1 && t.rank() != 2) return ctx.error("input must be [C] or [N, C], got " + t.str());
  if (!t.shape.back().isStatic()) return ctx.error("input needs a static last dim C, got " + t.str());
  const int64_t width = t.shape.back().size;
  const Dim batch = t.rank() == 2 ? t.shape[0] : Dim::fixed(1);
  Value* rows = e.reshape(e.cast(x, DType::I64), Shape{batch, Dim::fixed(width)});

  Value* total = nullptr;  // [batch, outputs]
  int64_t ngramId = 0;     // index into ngram_indexes of the first n-gram of the current length
  for (int64_t n = 1; n <= static_cast<int64_t>(counts.size()); ++n) {
    const int64_t begin = counts[static_cast<size_t>(n - 1)];
    const int64_t end =
        n < static_cast<int64_t>(counts.size()) ? counts[static_cast<size_t>(n)] : static_cast<int64_t>(pool.size());
    if (begin < 0 || end < begin || end > static_cast<int64_t>(pool.size()) || (end - begin) % n != 0)
      return ctx.error("ngram_counts gives " + std::to_string(n) + "-grams pool items [" + std::to_string(begin) +
                       ", " + std::to_string(end) + "), which is not a whole number of them inside the pool of " +
                       std::to_string(pool.size()));
    const int64_t grams = (end - begin) / n;
    const int64_t first = ngramId;
    ngramId += grams;
    if (ngramId > static_cast<int64_t>(indexes.size()))
      return ctx.error("the pool has more n-grams than ngram_indexes has entries (" + std::to_string(indexes.size()) +
                       ")");
    if (n < minGram || n > maxGram || grams == 0) continue;

    // Matches of each pool n-gram of this length, summed over positions
    // and skip distances: [batch, grams].
    Value* found = nullptr;
    const int64_t distances = n == 1 ? 1 : maxSkip + 1;
    for (int64_t d = 1; d <= distances; ++d) {
      const int64_t positions = width - (n - 1) * d;
      if (positions <= 0) break;
      Value* match = nullptr;
      for (int64_t k = 0; k < n; ++k) {
        std::vector<int64_t> item(static_cast<size_t>(grams));
        for (int64_t g = 0; g < grams; ++g) item[static_cast<size_t>(g)] = pool[static_cast<size_t>(begin + g * n + k)];
        Value* column = e.unsqueeze(e.sliceAxis(rows, 1, k * d, k * d + positions), 2);  // [batch, positions, 1]
        Value* eq = e.binary(OpKind::Eq, column, e.tensorI64({grams}, item));            // [batch, positions, grams]
        match = match ? e.binary(OpKind::And, match, eq) : eq;
      }
      Value* perDistance = e.reduce(OpKind::ReduceSum, e.cast(match, DType::F32), {1}, false);
      found = found ? e.add(found, perDistance) : perDistance;
    }
    if (!found) continue;
    KILN_TRY(checkGeneratedSize(ctx, staticShape({grams, outputs}), "the n-gram to output matrix"));
    std::vector<double> toOutput(static_cast<size_t>(grams * outputs), 0.0);
    for (int64_t g = 0; g < grams; ++g)
      toOutput[static_cast<size_t>(g * outputs + indexes[static_cast<size_t>(first + g)])] = 1.0;
    Value* counted = e.emit(OpKind::MatMul, {found, e.tensor(DType::F32, {grams, outputs}, toOutput)});
    total = total ? e.add(total, counted) : counted;
  }
  if (e.failed()) return e.status();
  if (!total)  // no n-gram fits the input: all counts are 0
    total = e.emit(OpKind::Broadcast, {e.scalar(DType::F32, 0.0)}, {},
                   {TensorType{DType::F32, Shape{batch, Dim::fixed(outputs)}}});

  Value* y = total;
  if (mode == "IDF") {
    Value* present = e.binary(OpKind::Gt, total, e.scalar(DType::F32, 0.0));
    if (weighted) {
      Value* weight = e.tensor(DType::F32, {outputs}, weights);
      Value* zero = e.scalar(DType::F32, 0.0);
      y = e.select(present, weight, zero);
    } else {
      y = e.cast(present, DType::F32);
    }
  } else if (mode == "TFIDF" && weighted) {
    y = e.mul(total, e.tensor(DType::F32, {outputs}, weights));
  }
  if (t.rank() == 1) y = e.reshape(y, Shape{Dim::fixed(outputs)});
  e.setOutput(0, y);
  return e.status();
}

const OpConverter kSignalConverters[] = {
    {"", "DFT", 17, kNewest, &convertDft},
    {"", "STFT", 17, kNewest, &convertStft},
    {"", "MelWeightMatrix", 17, kNewest, &convertMelWeightMatrix},
    {"", "TfIdfVectorizer", 9, kNewest, &convertTfIdfVectorizer},
};

}  // namespace

std::span<const OpConverter> signalConverters() { return kSignalConverters; }

}  // namespace kiln::onnx_import
