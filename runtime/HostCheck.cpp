// Host checks (HostCheck.h) and the interpreter's kernel of `check`.
#include "runtime/HostCheck.h"

#include "runtime/Kernels.h"

namespace kiln {

namespace {

/// Element `i` of integer (or bool) data of dtype `t` at `p`; a u64 from
/// 2^63 up reads as int64's largest, which every check treats as the large
/// non-negative value it is.
int64_t intAt(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::I64: return static_cast<const int64_t*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I16: return static_cast<const int16_t*>(p)[i];
    case DType::I8: return static_cast<const int8_t*>(p)[i];
    case DType::U64: {
      const uint64_t v = static_cast<const uint64_t*>(p)[i];
      return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
    }
    case DType::U32: return static_cast<const uint32_t*>(p)[i];
    case DType::U16: return static_cast<const uint16_t*>(p)[i];
    case DType::U8:
    case DType::Bool: return static_cast<const uint8_t*>(p)[i];
    default: return 0;
  }
}

Error checkError(const HostCheck& check, const std::string& message) {
  return Error("'" + check.of + "' " + message, check.loc);
}

}  // namespace

Expected<HostCheck> hostCheckOf(const Op& op) {
  if (op.kind() != OpKind::Check) return op.emitError("is not a check");
  HostCheck check;
  const std::string& condition = op.getString("condition");
  if (condition == "in_range")
    check.condition = HostCheck::Condition::InRange;
  else if (condition == "nonzero")
    check.condition = HostCheck::Condition::NonZero;
  else if (condition == "nonnegative")
    check.condition = HostCheck::Condition::NonNegative;
  else
    return op.emitError("has condition \"" + condition + "\", expected in_range, nonzero or nonnegative");
  check.of = op.getString("of");
  check.axis = op.getInt("axis");
  check.size = op.getInt("size");
  check.loc = op.loc();
  return check;
}

Status runHostCheck(const HostCheck& check, const void* data, DType dtype, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = intAt(data, dtype, i);
    switch (check.condition) {
      case HostCheck::Condition::NonNegative:
        if (v < 0) return checkError(check, "integer pow with a negative exponent");
        break;
      case HostCheck::Condition::NonZero:
        if (v == 0)
          return checkError(check, check.of == "div" ? "integer division by zero" : "integer remainder by zero");
        break;
      case HostCheck::Condition::InRange:
        if (v < -check.size || v >= check.size)
          return checkError(check, "index " + std::to_string(v) + " is out of range for dim " +
                                       std::to_string(check.axis) + " of size " + std::to_string(check.size));
        break;
    }
  }
  return {};
}

namespace kernels {

Status Check(const KernelCall& c) {
  auto check = hostCheckOf(c.op);
  if (!check) return check.takeError();
  const Tensor& x = c.in(0);
  return runHostCheck(*check, x.raw(), x.dtype(), x.numElements());
}

}  // namespace kernels

}  // namespace kiln
