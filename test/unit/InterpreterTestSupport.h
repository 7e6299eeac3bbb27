// Helpers shared by the interpreter's unit tests: building small tensors,
// running one op through a one-op function (so the whole interpret path,
// shape rules included, is exercised), and comparing results.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ir/Builder.h"
#include "runtime/Interpreter.h"

namespace kiln::test {

/// A tensor of `dtype` and `dims` holding `values` (converted to the dtype).
inline Tensor makeTensor(DType dtype, std::vector<int64_t> dims, const std::vector<double>& values) {
  Tensor t(dtype, std::move(dims));
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numElements()) << "wrong number of test values";
  for (int64_t i = 0; i < t.numElements() && i < static_cast<int64_t>(values.size()); ++i) t.setDouble(i, values[i]);
  return t;
}

inline Tensor f32(std::vector<int64_t> dims, const std::vector<double>& values) {
  return makeTensor(DType::F32, std::move(dims), values);
}

/// An integer (or bool) tensor, set through int64 so large values are exact.
inline Tensor ints(DType dtype, std::vector<int64_t> dims, const std::vector<int64_t>& values) {
  Tensor t(dtype, std::move(dims));
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numElements()) << "wrong number of test values";
  for (int64_t i = 0; i < t.numElements() && i < static_cast<int64_t>(values.size()); ++i) t.setInt(i, values[i]);
  return t;
}

inline Tensor bools(std::vector<int64_t> dims, const std::vector<int64_t>& values) {
  return ints(DType::Bool, std::move(dims), values);
}

inline std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numElements(); ++i) v.push_back(t.getDouble(i));
  return v;
}

inline std::vector<int64_t> int64s(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.numElements(); ++i) v.push_back(t.getInt(i));
  return v;
}

/// Runs `kind` on `inputs` as a one-op function whose arguments have the
/// inputs' types; result types come from the shape rules, or from
/// `declared` for ops that take their type from the declaration.
inline Expected<std::vector<Tensor>> runOpFunction(OpKind kind, std::vector<Tensor> inputs, AttrMap attrs = {},
                                                   std::vector<TensorType> declared = {}) {
  Function f("test");
  std::vector<Value*> args;
  for (size_t i = 0; i < inputs.size(); ++i) args.push_back(f.addArgument(inputs[i].type(), "a" + std::to_string(i)));
  Builder b(f);
  auto op = b.build(kind, args, std::move(attrs), std::move(declared));
  if (!op) return op.takeError();
  b.ret((*op)->results());
  return interpret(f, std::move(inputs));
}

/// Result 0 of runOpFunction; fails the test (and returns an empty tensor)
/// on an error.
inline Tensor run(OpKind kind, std::vector<Tensor> inputs, AttrMap attrs = {}, std::vector<TensorType> declared = {}) {
  auto results = runOpFunction(kind, std::move(inputs), std::move(attrs), std::move(declared));
  if (!results) {
    ADD_FAILURE() << opName(kind) << " failed: " << results.error().str();
    return Tensor();
  }
  return std::move((*results)[0]);
}

/// The message of the error that running `kind` produces; fails the test
/// when it succeeds.
inline std::string runError(OpKind kind, std::vector<Tensor> inputs, AttrMap attrs = {},
                            std::vector<TensorType> declared = {}) {
  auto results = runOpFunction(kind, std::move(inputs), std::move(attrs), std::move(declared));
  if (results) {
    ADD_FAILURE() << opName(kind) << " succeeded where an error was expected";
    return {};
  }
  return results.error().str();
}

/// Checks shape and values (NaN matches NaN; `tol` is absolute plus relative).
inline void expectTensor(const Tensor& t, const std::vector<int64_t>& dims, const std::vector<double>& expected,
                         double tol = 1e-6) {
  ASSERT_EQ(t.shape(), dims);
  ASSERT_EQ(t.numElements(), static_cast<int64_t>(expected.size()));
  for (int64_t i = 0; i < t.numElements(); ++i) {
    const double got = t.getDouble(i), want = expected[i];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "element " << i << ": got " << got << ", want NaN";
    } else if (std::isinf(want)) {
      EXPECT_EQ(got, want) << "element " << i;
    } else {
      EXPECT_NEAR(got, want, tol * (1 + std::fabs(want))) << "element " << i;
    }
  }
}

/// Checks shape and exact integer values.
inline void expectInts(const Tensor& t, const std::vector<int64_t>& dims, const std::vector<int64_t>& expected) {
  ASSERT_EQ(t.shape(), dims);
  EXPECT_EQ(int64s(t), expected);
}

}  // namespace kiln::test
