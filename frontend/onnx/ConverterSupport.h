// Helpers shared by the ONNX op converters (MathOps.cpp, TensorOps.cpp and
// NNOps.cpp): reading inputs that must be known at import time, axis
// normalization, and the small op sequences (reshape to a shape, cast,
// broadcast) that many converters need. Each returns an error located at the
// node instead of building invalid IR.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "frontend/onnx/OnnxOps.h"

namespace kiln::onnx_import {

/// The Kiln dtype of an ONNX TensorProto.DataType, or nullopt when Kiln has
/// none (uint16/32/64, string, complex, float8).
std::optional<DType> dtypeFromOnnx(int32_t type);

/// The elements of a constant as int64 (any dtype; floats truncated).
std::vector<int64_t> tensorInts(const DenseTensor& t);
/// The elements of a constant as double.
std::vector<double> tensorDoubles(const DenseTensor& t);

/// Input `i` as integers when it is known at import time; an error naming
/// the input (`what`) and saying it must be a constant otherwise.
Expected<std::vector<int64_t>> constantInts(NodeContext& ctx, size_t i, const std::string& what);
/// Input `i` as integers if present, `dflt` when absent.
Expected<std::optional<std::vector<int64_t>>> optionalConstantInts(NodeContext& ctx, size_t i, const std::string& what);

/// kiln::normalizeAxis with the error an ONNX node gets: `what`, the axis
/// and the range it must lie in.
Expected<int64_t> normalizeAxis(NodeContext& ctx, int64_t axis, int64_t rank, const std::string& what = "axis");
/// Each of `axes` normalized; repeated axes are an error.
Expected<std::vector<int64_t>> normalizeAxes(NodeContext& ctx, const std::vector<int64_t>& axes, int64_t rank,
                                             const std::string& what = "axes");

/// `v` reshaped to `shape` (same element count; at most one unknown dim at run time).
Expected<Value*> reshapeTo(NodeContext& ctx, Value* v, Shape shape);
/// `v` converted to `dtype` (returned as is when it already has it).
Expected<Value*> castTo(NodeContext& ctx, Value* v, DType dtype);
/// `v` broadcast to `shape`.
Expected<Value*> broadcastTo(NodeContext& ctx, Value* v, Shape shape);
/// `v` with the given axes removed (each must be 1) or inserted.
Expected<Value*> squeezeAxes(NodeContext& ctx, Value* v, const std::vector<int64_t>& axes);
Expected<Value*> unsqueezeAxes(NodeContext& ctx, Value* v, const std::vector<int64_t>& axes);
/// The most elements a converter materializes in one constant (a mask, an
/// index table, an identity): the shapes come from the file, so a hostile
/// model could otherwise ask for gigabytes.
inline constexpr int64_t kMaxGeneratedElements = int64_t{1} << 24;
/// An error naming `what` when a constant of `shape` would be larger.
Status checkGeneratedSize(NodeContext& ctx, const Shape& shape, const std::string& what);

/// Product of dims as a Dim: static when all are, else unknown.
Dim productDim(const Shape& shape, size_t begin, size_t end);

/// An error when the node has attribute `name`, which became an input in
/// opset `since` (ONNX moved axes, split sizes, pads and slice bounds from
/// attributes to inputs; silently ignoring the attribute would be wrong).
Status rejectMovedAttribute(NodeContext& ctx, std::string_view name, int64_t since);

/// The seed of a random node (Kiln's random ops draw a pure function of the
/// seed and the element index, docs/ops.md): its `seed` attribute, a float
/// in ONNX's random ops and an int in Dropout, as an integer (an integral
/// float as itself, another as its bits), or, when absent, a hash of the
/// node's first output name, so that nodes without a seed draw different
/// samples and a model draws the same ones on every import.
Expected<int64_t> randomSeed(NodeContext& ctx);

/// Binds output 0 of the node to the value (or propagates the error).
Status setOutput0(NodeContext& ctx, Expected<Value*> v);

}  // namespace kiln::onnx_import
