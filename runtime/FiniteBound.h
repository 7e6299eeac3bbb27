// Bounds on f32 data that prove a library call's result finite: the largest
// magnitude of a buffer, and the largest sum of weight magnitudes that one
// result element of a convolution or matmul takes. A convolution whose
// input, weights, bias and added tensors are finite, and whose bound
//   max|x| * max_m sum|w_m| + max|bias| + max|t| ...
// is far below FLT_MAX, computes no infinity and no NaN, so oneDNN's relu
// (max(x, 0)) and clip (max, then min) give what the IR's do
// (DnnlKernels.cpp's guarded post-ops).
#pragma once

#include <cstdint>

namespace kiln {

/// The largest |v| of `n` floats, or +inf when one is an infinity or a NaN.
/// Runs on the OpenMP threads of the calling thread (omp_set_num_threads)
/// when `n` is large enough to split.
float maxMagnitude(const float* data, int64_t n);

/// The largest sum of |v| over one of `rows` rows of `rowLength` floats
/// (conv weights [M, C/g, K...]: a result channel's weights), or +inf when
/// one is not finite. Summed in double.
double maxRowMagnitudeSum(const float* data, int64_t rows, int64_t rowLength);

/// The largest sum of |v| down one column of `batch` row-major [k, n]
/// matrices (a matmul's b: a result column's weights), or +inf when one is
/// not finite. Summed in double.
double maxColumnMagnitudeSum(const float* data, int64_t batch, int64_t k, int64_t n);

}  // namespace kiln
