// The printed form of a MemoryPlan, shared by kiln-opt's --print-memory-plan
// and tests, so that a plan reads the same wherever it is shown.
#include "passes/MemoryPlan.h"

#include <algorithm>
#include <sstream>

namespace kiln {

namespace {

/// `%name`, quoted the way the IR printer quotes names that are not plain
/// identifiers (ONNX tensor names such as `/attn/MatMul_output_0`).
std::string valueRef(const std::string& name) {
  bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '$' || c == '-';
  });
  if (plain) return "%" + name;
  std::string quoted = "%\"";
  for (char c : name) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

template <typename T>
std::string intList(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::vector<int64_t> MemoryPlan::stridesOf(const Value* v) const {
  const Buffer* b = find(v);
  return b ? b->strides : std::vector<int64_t>{};
}

std::vector<int> MemoryPlan::concatCopies(const Op& op) const {
  if (const Buffer* b = find(op.result())) return b->copiedOperands;
  std::vector<int> all(op.numOperands());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return all;
}

const MemoryPlan::Alias* MemoryPlan::aliasOfResult(size_t result) const {
  for (const Alias& a : aliases)
    if (a.result == result) return &a;
  return nullptr;
}

const MemoryPlan::Buffer* MemoryPlan::find(const Value* v) const {
  for (const Buffer& b : buffers)
    if (b.value == v) return &b;
  return nullptr;
}

std::string MemoryPlan::str() const {
  std::ostringstream os;
  for (const Buffer& b : buffers) {
    if (b.sizing == Buffer::Sizing::Dynamic)
      os << valueRef(b.name) << ": dynamic size, allocated at run time";
    else
      os << valueRef(b.name) << ": offset " << b.offset << ", size "
         << (b.sizing == Buffer::Sizing::Bound ? "at most " : "") << b.size;
    os << ", live [" << b.first << ", " << b.last << "]";
    if (b.inPlaceOf >= 0) os << ", in place of " << valueRef(buffers[b.inPlaceOf].name);
    if (b.viewOf >= 0) {
      os << ", view of " << valueRef(buffers[b.viewOf].name);
      if (b.viewOffset) os << " at +" << b.viewOffset;
    }
    if (b.sliceOf >= 0) {
      os << ", slice of " << valueRef(buffers[b.sliceOf].name) << " at +" << b.sliceOffset;
      if (!b.strides.empty()) os << " strides " << intList(b.strides);
    }
    if (b.isConcat) {
      if (b.copiedOperands.empty())
        os << ", no step";
      else
        os << ", copies operands " << intList(b.copiedOperands);
    }
    os << "\n";
  }
  for (const Alias& a : aliases) {
    os << "result " << a.result << " -> argument " << valueRef(a.argumentName) << ": ";
    if (a.inPlace)
      os << "in place\n";
    else
      os << "copied after the last kernel (" << a.whyCopied << ")\n";
  }
  os << "peak " << peak << " bytes, no reuse " << noReuseTotal << " bytes\n";
  return os.str();
}

}  // namespace kiln
