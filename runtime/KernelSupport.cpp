// Index arithmetic and attribute helpers shared by the interpreter's kernels.
#include "runtime/Kernels.h"

namespace kiln {

int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) n *= dims[i];
  return n;
}

std::vector<int64_t> rowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

std::vector<int64_t> broadcastStrides(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<int64_t> inStrides = rowMajorStrides(in);
  std::vector<int64_t> strides(out.size(), 0);
  // Align from the back; a missing or size-1 operand dim repeats its element.
  const int64_t lead = static_cast<int64_t>(out.size()) - static_cast<int64_t>(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t d = lead + static_cast<int64_t>(i);
    if (d >= 0) strides[d] = in[i] == 1 ? 0 : inStrides[i];
  }
  return strides;
}

void unravel(int64_t flat, const std::vector<int64_t>& shape, std::vector<int64_t>& index) {
  index.resize(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
}

std::string listStr(const std::vector<int64_t>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s + "]";
}

std::vector<int64_t> intsOr(const Op& op, std::string_view name) {
  const Attribute* a = op.attr(name);
  if (!a || a->kind() != AttrKind::Ints) return {};
  return a->getInts();
}

Error dtypeError(const Op& op, DType got, std::string_view expected) {
  return op.emitError("expects " + std::string(expected) + ", got " + std::string(dtypeName(got)));
}

}  // namespace kiln
