// The shared unit-test helpers declared in TestSupport.h.
#include "TestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "ir/Parser.h"
#include "ir/Verifier.h"

namespace kiln::test {

std::unique_ptr<Module> parseOk(std::string_view text, std::string_view fileName) {
  auto m = parseModule(text, fileName);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().str()) << "\n" << text;
  return m.ok() ? std::move(*m) : nullptr;
}

std::unique_ptr<Module> parseVerified(std::string_view text, std::string_view fileName) {
  auto m = parseOk(text, fileName);
  if (!m) return nullptr;
  Status s = verify(*m);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().str()) << "\n" << text;
  return m;
}

Tensor randomTensor(const TensorType& type, std::mt19937& rng, bool positive) {
  Tensor t(type.dtype, staticDims(type.shape));
  std::uniform_real_distribution<double> real(positive ? 0.5 : -2.0, 2.0);
  std::uniform_int_distribution<int64_t> integer(positive ? 1 : -5, 5);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    if (type.dtype == DType::Bool)
      t.setInt(i, integer(rng) > 0);
    else if (isFloat(type.dtype))
      t.setDouble(i, real(rng));
    else
      t.setInt(i, type.dtype == DType::U8 ? std::abs(integer(rng)) : integer(rng));
  }
  return t;
}

Tensor randomF32(const std::vector<int64_t>& shape, int seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  Tensor t(DType::F32, shape);
  for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, real(rng));
  return t;
}

Tensor tensorOf(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values) {
  Tensor t(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.setDouble(static_cast<int64_t>(i), values[i]);
  return t;
}

std::vector<double> elementsOf(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numElements(); ++i) v.push_back(t.getDouble(i));
  return v;
}

void expectClose(const Tensor& got, const Tensor& want, const std::string& what, double rtol, double atol) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    if (isFloat(want.dtype())) {
      const double g = got.getDouble(i), w = want.getDouble(i);
      if (std::isnan(w) || std::isinf(w)) {
        EXPECT_TRUE(std::isnan(w) ? std::isnan(g) : g == w) << what << " element " << i << ": " << g << " vs " << w;
        continue;
      }
      EXPECT_NEAR(g, w, atol + rtol * std::fabs(w)) << what << " element " << i;
    } else {
      EXPECT_EQ(got.getInt(i), want.getInt(i)) << what << " element " << i;
    }
  }
}

}  // namespace kiln::test
