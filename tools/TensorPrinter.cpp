// NumPy-style tensor printing (TensorPrinter.h). The structure follows
// numpy/core/arrayprint.py (_formatArray and FloatingFormat with its
// defaults: precision 8, floatmode 'maxprec', linewidth 75, edgeitems 3,
// threshold 1000), so that a user comparing `kiln run` with PyTorch sees
// the same digits. Element widths are computed over the elements shown
// only, as NumPy does for summarized arrays.
#include "tools/TensorPrinter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace kiln::cli {

namespace {

constexpr int kPrecision = 8;
constexpr size_t kLineWidth = 75;
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kSummaryThreshold = 1000;

/// True when `text` read back and rounded to `dtype` gives `v` again.
bool roundTrips(const char* text, double v, DType dtype) {
  double back = std::strtod(text, nullptr);
  switch (dtype) {
    case DType::F32:
      return static_cast<float>(back) == static_cast<float>(v);
    case DType::F16:
      return floatToHalf(static_cast<float>(back)) == floatToHalf(static_cast<float>(v));
    case DType::BF16:
      return floatToBFloat16(static_cast<float>(back)) == floatToBFloat16(static_cast<float>(v));
    default:
      return back == v;
  }
}

/// The shortest decimal digits that identify finite `v` in `dtype`: digits
/// without sign or point, and the decimal exponent of the first digit.
struct Decimal {
  std::string digits;
  int exponent = 0;
};

Decimal shortestDecimal(double v, DType dtype) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, std::fabs(v));
    if (precision == 17 || roundTrips(buf, std::fabs(v), dtype)) break;
  }
  Decimal d;
  const char* e = std::strchr(buf, 'e');
  for (const char* p = buf; p < e; ++p)
    if (*p != '.') d.digits += *p;
  d.exponent = std::atoi(e + 1);
  while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
  return d;
}

/// Formats floats like NumPy's FloatingFormat: positional unless the
/// magnitudes span too much, then scientific; padded to a common width.
class FloatFormat {
 public:
  FloatFormat(const std::vector<double>& shown, DType dtype) : dtype_(dtype) {
    double maxAbs = 0, minAbs = INFINITY;
    bool anyFinite = false;
    for (double v : shown) {
      if (!std::isfinite(v)) continue;
      anyFinite = true;
      maxAbs = std::max(maxAbs, std::fabs(v));
      if (v != 0) minAbs = std::min(minAbs, std::fabs(v));
    }
    scientific_ = anyFinite && (maxAbs >= 1e8 || (minAbs != INFINITY && (minAbs < 1e-4 || maxAbs / minAbs > 1e3)));
    for (double v : shown) {
      if (!std::isfinite(v)) {
        nonFiniteWidth_ = std::max(nonFiniteWidth_, std::string(v < 0 ? "-inf" : std::isnan(v) ? "nan" : "inf").size());
        continue;
      }
      Parts p = split(v);
      padLeft_ = std::max(padLeft_, p.left.size());
      padRight_ = std::max(padRight_, p.right.size());
      expWidth_ = std::max(expWidth_, p.exp.size());
    }
    // A NaN or infinity wider than the numbers widens the integer part of
    // every element, so that all stay aligned.
    const size_t offset = padRight_ + 1 + (scientific_ ? expWidth_ + 2 : 0);
    if (nonFiniteWidth_ > offset) padLeft_ = std::max(padLeft_, nonFiniteWidth_ - offset);
  }

  std::string operator()(double v) const {
    const size_t width = padLeft_ + 1 + padRight_ + (scientific_ ? expWidth_ + 2 : 0);
    if (!std::isfinite(v)) {
      std::string s = std::isnan(v) ? "nan" : v < 0 ? "-inf" : "inf";
      return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
    }
    Parts p = split(v);
    if (scientific_ && p.right.size() < padRight_) {
      // NumPy prints every scientific mantissa with the same number of
      // digits, continuing a short one with the digits of its exact value.
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.*e", static_cast<int>(padRight_), std::fabs(v));
      const char* e = std::strchr(buf, 'e');
      p.left = (std::signbit(v) ? "-" : "") + std::string(buf, 1);
      p.right = std::string(static_cast<const char*>(buf + 2), e);
      const int exponent = v == 0 ? 0 : std::atoi(e + 1);
      p.expSign = exponent < 0 ? "-" : "+";
      p.exp = std::to_string(std::abs(exponent));
      if (p.exp.size() < 2) p.exp = "0" + p.exp;
    }
    std::string s = std::string(padLeft_ - p.left.size(), ' ') + p.left + ".";
    if (scientific_) {
      s +=
          p.right + "e" + p.expSign + std::string(expWidth_ > p.exp.size() ? expWidth_ - p.exp.size() : 0, '0') + p.exp;
    } else {
      s += p.right + std::string(padRight_ - p.right.size(), ' ');
    }
    return s;
  }

 private:
  /// One number: sign and integer digits, fraction digits, exponent.
  struct Parts {
    std::string left, right, expSign, exp;
  };

  Parts split(double v) const {
    Parts p;
    std::string sign = std::signbit(v) ? "-" : "";
    Decimal d = shortestDecimal(v, dtype_);
    if (scientific_) {
      if (d.digits.size() > kPrecision + 1) {
        // More digits than the precision: round to it, as NumPy does.
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.*e", kPrecision, std::fabs(v));
        d.digits.clear();
        const char* e = std::strchr(buf, 'e');
        for (const char* q = buf; q < e; ++q)
          if (*q != '.') d.digits += *q;
        d.exponent = std::atoi(e + 1);
        while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
      }
      if (v == 0) d.exponent = 0;
      p.left = sign + d.digits.substr(0, 1);
      p.right = d.digits.substr(1);
      p.expSign = d.exponent < 0 ? "-" : "+";
      p.exp = std::to_string(std::abs(d.exponent));
      if (p.exp.size() < 2) p.exp = "0" + p.exp;
      return p;
    }
    int fraction = std::max(0, static_cast<int>(d.digits.size()) - 1 - d.exponent);
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", std::min(fraction, kPrecision), std::fabs(v));
    std::string text = buf;
    size_t dot = text.find('.');
    p.left = sign + text.substr(0, dot);
    p.right = dot == std::string::npos ? "" : text.substr(dot + 1);
    while (!p.right.empty() && p.right.back() == '0') p.right.pop_back();
    return p;
  }

  DType dtype_;
  bool scientific_ = false;
  size_t padLeft_ = 0, padRight_ = 0, expWidth_ = 0, nonFiniteWidth_ = 0;
};

/// Which indices of an axis of `size` are shown, in order; -1 marks `...`.
std::vector<int64_t> shownIndices(int64_t size, bool summarize) {
  std::vector<int64_t> idx;
  if (summarize && size > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);
    for (int64_t i = size - kEdgeItems; i < size; ++i) idx.push_back(i);
  } else {
    for (int64_t i = 0; i < size; ++i) idx.push_back(i);
  }
  return idx;
}

/// NumPy's _extendLine: wraps before `word` when the line would overflow.
void extendLine(std::string& s, std::string& line, const std::string& word, size_t width, const std::string& prefix) {
  if (line.size() + word.size() > width && line.size() > prefix.size()) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    s += line + "\n";
    line = prefix;
  }
  line += word;
}

/// An integer element as NumPy prints it (a u64 as the unsigned value it is).
std::string integerText(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::U64) return std::to_string(static_cast<uint64_t>(t.getInt(i)));
  return std::to_string(t.getInt(i));
}

/// A 0-d array prints as NumPy prints its scalar, which follows Python's
/// float repr: positional from 1e-4 to 1e16 (`1.0`, `0.5`), else scientific
/// (`1e-05`).
std::string formatScalar(const Tensor& t) {
  if (t.dtype() == DType::Bool) return t.getInt(0) ? "True" : "False";
  if (!isFloat(t.dtype())) return integerText(t, 0);
  const double v = t.getDouble(0);
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  const std::string sign = std::signbit(v) ? "-" : "";
  Decimal d = shortestDecimal(v, t.dtype());
  if (v == 0) return sign + "0.0";
  if (d.exponent < -4 || d.exponent >= 16) {
    std::string mantissa = d.digits.substr(0, 1) + (d.digits.size() > 1 ? "." + d.digits.substr(1) : "");
    std::string exp = std::to_string(std::abs(d.exponent));
    return sign + mantissa + "e" + (d.exponent < 0 ? "-" : "+") + (exp.size() < 2 ? "0" : "") + exp;
  }
  std::string digits = d.digits;
  if (d.exponent < 0) return sign + "0." + std::string(-d.exponent - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= d.exponent + 1)
    return sign + digits + std::string(d.exponent + 1 - digits.size(), '0') + ".0";
  return sign + digits.substr(0, d.exponent + 1) + "." + digits.substr(d.exponent + 1);
}

}  // namespace

std::string formatTensor(const Tensor& t) {
  const std::vector<int64_t>& shape = t.shape();
  const int64_t count = t.numElements();
  if (count == 0) return "[]";
  const bool summarize = count > kSummaryThreshold;
  const std::vector<int64_t> strides = t.strides();

  // The flat indices of the elements that will be shown.
  std::vector<int64_t> shown;
  std::function<void(size_t, int64_t)> collect = [&](size_t axis, int64_t offset) {
    if (axis == shape.size()) {
      shown.push_back(offset);
      return;
    }
    for (int64_t i : shownIndices(shape[axis], summarize))
      if (i >= 0) collect(axis + 1, offset + i * strides[axis]);
  };
  collect(0, 0);

  std::function<std::string(int64_t)> element;
  std::vector<double> values;
  if (isFloat(t.dtype())) {
    for (int64_t i : shown) values.push_back(t.getDouble(i));
    auto format = std::make_shared<FloatFormat>(values, t.dtype());
    element = [format, &t](int64_t i) { return (*format)(t.getDouble(i)); };
  } else {
    // NumPy always widens True to the width of False, even when no element is False.
    size_t width = t.dtype() == DType::Bool ? 5 : 0;
    auto text = [&t](int64_t i) {
      return t.dtype() == DType::Bool ? std::string(t.getInt(i) ? "True" : "False") : integerText(t, i);
    };
    for (int64_t i : shown) width = std::max(width, text(i).size());
    element = [text, width](int64_t i) {
      std::string s = text(i);
      return std::string(width - s.size(), ' ') + s;
    };
  }
  if (shape.empty()) return formatScalar(t);

  // NumPy's _formatArray recursion.
  std::function<std::string(size_t, int64_t, const std::string&, size_t)> recurse =
      [&](size_t axis, int64_t offset, const std::string& indent, size_t width) -> std::string {
    if (axis == shape.size()) return element(offset);
    const std::string nextIndent = indent + " ";
    const size_t nextWidth = width - 1;
    const std::vector<int64_t> idx = shownIndices(shape[axis], summarize);
    const size_t axesLeft = shape.size() - axis;
    std::string s;
    if (axesLeft == 1) {
      std::string line = indent;
      for (size_t k = 0; k < idx.size(); ++k) {
        std::string word =
            idx[k] < 0 ? "..." : recurse(axis + 1, offset + idx[k] * strides[axis], nextIndent, nextWidth);
        // NumPy keeps one column free for the closing bracket.
        extendLine(s, line, word, width - 1, indent);
        if (k + 1 < idx.size()) line += " ";
      }
      s += line;
    } else {
      const std::string separator(axesLeft - 1, '\n');
      for (size_t k = 0; k < idx.size(); ++k) {
        s += indent;
        s += idx[k] < 0 ? "..." : recurse(axis + 1, offset + idx[k] * strides[axis], nextIndent, nextWidth);
        if (k + 1 < idx.size()) s += separator;
      }
    }
    return "[" + s.substr(indent.size()) + "]";
  };
  return recurse(0, 0, " ", kLineWidth);
}

}  // namespace kiln::cli
