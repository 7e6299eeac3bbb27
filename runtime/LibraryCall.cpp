// libraryCallWork (LibraryCall.h).
#include "runtime/LibraryCall.h"

namespace kiln {

namespace {

int64_t product(const std::vector<int64_t>& dims, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < dims.size(); ++i) n *= dims[i];
  return n;
}

}  // namespace

int64_t libraryCallWork(const LibraryCall& call) {
  if (call.operandDims.size() < 2) return 0;
  const std::vector<int64_t>& a = call.operandDims[0];
  const std::vector<int64_t>& w = call.operandDims[1];
  if (call.kind == LibraryCall::Kind::MatMul) return product(call.resultDims) * (a.empty() ? 1 : a.back());
  if (w.size() < 2) return 0;
  const int64_t taps = product(w, 2);
  if (call.kind == LibraryCall::Kind::ConvTranspose) return product(a) * w[1] * taps;
  // ConvWeightGrad: each dy element meets C/g x taps elements of x.
  if (call.kind == LibraryCall::Kind::ConvWeightGrad) return product(w) * product(call.resultDims, 1);
  return product(call.resultDims) * w[1] * taps;
}

}  // namespace kiln
