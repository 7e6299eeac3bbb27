// kiln-npy-compare: compares two .npy files the way the end-to-end tests
// need, like numpy.testing.assert_allclose: same dtype and shape exactly,
// floats within |actual - expected| <= atol + rtol * |expected| (NaN equal
// to NaN, infinities equal only to themselves), integers and bools exactly.
// On a mismatch it prints how many elements differ and the worst one with
// its index, so that a failing model says where it went wrong.
//
//   kiln-npy-compare ACTUAL.npy EXPECTED.npy [--rtol 1e-4] [--atol 1e-5]
//   kiln-npy-compare ACTUAL.npy EXPECTED.npy --rel-l2 2e-2
//
// --rel-l2 E compares floats as a whole instead: ||actual - expected|| /
// ||expected|| (L2 norms over every element, NaN and infinities equal only
// to themselves) at most E, the measure of a reduced-precision run against
// f32 (docs/precision.md).
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "runtime/Npy.h"

namespace {

using namespace kiln;

/// Element `i` as text: integers exactly (a u64 as the unsigned value it
/// is), floats to 9 significant digits.
std::string elementText(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::U64) return std::to_string(static_cast<uint64_t>(t.getInt(i)));
  if (!isFloat(t.dtype())) return std::to_string(t.getInt(i));
  std::ostringstream os;
  os.precision(9);
  os << t.getDouble(i);
  return os.str();
}

constexpr const char* kUsage =
    "usage: kiln-npy-compare ACTUAL.npy EXPECTED.npy [--rtol R] [--atol A] | [--rel-l2 E]\n";

std::string indexStr(const Tensor& t, int64_t flat) {
  std::string s = "[";
  const std::vector<int64_t> strides = t.strides();
  for (size_t d = 0; d < strides.size(); ++d) {
    s += (d ? "," : "") + std::to_string(flat / strides[d]);
    flat %= strides[d];
  }
  return s + "]";
}

bool parseTolerance(const char* text, double& out) {
  char* end = nullptr;
  out = std::strtod(text, &end);
  return end != text && *end == '\0' && out >= 0 && std::isfinite(out);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  double rtol = 1e-4, atol = 1e-5, relL2 = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--rtol" || a == "--atol" || a == "--rel-l2") && i + 1 < argc) {
      if (!parseTolerance(argv[++i], a == "--rtol" ? rtol : a == "--atol" ? atol : relL2)) {
        std::cerr << "kiln-npy-compare: error: " << a << " expects a non-negative number, got '" << argv[i] << "'\n";
        return 2;
      }
    } else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a.size() > 1 && a[0] == '-') {
      std::cerr << "kiln-npy-compare: error: unknown option '" << a << "' (valid options: --rtol, --atol, --rel-l2)\n"
                << kUsage;
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (files.size() != 2) {
    std::cerr << kUsage;
    return 2;
  }
  auto actual = readNpy(files[0]);
  auto expected = readNpy(files[1]);
  for (auto* t : {&actual, &expected}) {
    if (!*t) {
      std::cerr << "kiln-npy-compare: error: " << t->error().message() << "\n";
      return 1;
    }
  }
  if (actual->type() != expected->type()) {
    std::cerr << "kiln-npy-compare: " << files[0] << " is " << actual->type().str() << ", but " << files[1] << " is "
              << expected->type().str() << "\n";
    return 1;
  }

  const bool exact = !isFloat(actual->dtype());
  if (relL2 >= 0 && !exact) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < actual->numElements(); ++i) {
      const double a = actual->getDouble(i), e = expected->getDouble(i);
      if (!std::isfinite(a) || !std::isfinite(e)) {
        if (!(a == e || (std::isnan(a) && std::isnan(e)))) diff = INFINITY;
        continue;
      }
      diff += (a - e) * (a - e);
      norm += e * e;
    }
    const double error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    std::cout.precision(3);
    if (!(error <= relL2)) {
      std::cerr << "kiln-npy-compare: " << files[0] << ": relative L2 error " << error << " against " << files[1]
                << ", more than " << relL2 << "\n";
      return 1;
    }
    std::cout << files[0] << ": relative L2 error " << error << " (at most " << relL2 << ")\n";
    return 0;
  }
  int64_t mismatches = 0, worst = -1;
  double worstExcess = 0, maxAbs = 0;
  for (int64_t i = 0; i < actual->numElements(); ++i) {
    const double a = actual->getDouble(i), e = expected->getDouble(i);
    bool ok;
    double excess = 0;
    if (exact) {
      ok = actual->getInt(i) == expected->getInt(i);
      excess = ok ? 0 : INFINITY;
    } else if (std::isnan(a) || std::isnan(e)) {
      ok = std::isnan(a) && std::isnan(e);
      excess = ok ? 0 : INFINITY;
    } else if (std::isinf(a) || std::isinf(e)) {
      ok = a == e;
      excess = ok ? 0 : INFINITY;
    } else {
      const double diff = std::fabs(a - e);
      maxAbs = std::max(maxAbs, diff);
      excess = diff - (atol + rtol * std::fabs(e));
      ok = excess <= 0;
    }
    if (!ok) {
      ++mismatches;
      if (worst < 0 || excess > worstExcess) {
        worst = i;
        worstExcess = excess;
      }
    }
  }
  if (mismatches) {
    std::cerr.precision(9);
    std::cerr << "kiln-npy-compare: " << files[0] << ": " << mismatches << " of " << actual->numElements()
              << " elements differ from " << files[1] << " beyond rtol " << rtol << ", atol " << atol
              << "; the worst at " << indexStr(*actual, worst) << ": " << elementText(*actual, worst) << " vs "
              << elementText(*expected, worst) << "\n";
    return 1;
  }
  std::cout << files[0] << ": " << actual->numElements() << " elements of " << actual->type().str()
            << " match (max abs diff " << maxAbs << ")\n";
  return 0;
}
