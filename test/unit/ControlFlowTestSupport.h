// Programs and checks shared by the tests of functions with control flow
// and data-dependent ops: the interpreter's (InterpreterTestControlFlow.cpp,
// DataDependentTest.cpp) and the executors' that run them in stages
// (CpuControlFlowTest.cpp, CudaControlFlowTest.cpp, codegen/Stages.h). A
// program used by several of them is written here once, with the values
// its tests expect. Checks report problems as GoogleTest failures in the
// calling test, as TestSupport.h's do.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "runtime/Interpreter.h"
#include "runtime/Tensor.h"
#include "test/unit/TestSupport.h"

namespace kiln::test {

inline Tensor i64Scalar(int64_t v) { return tensorOf(DType::I64, {}, {static_cast<double>(v)}); }
inline Tensor boolScalar(bool v) { return tensorOf(DType::Bool, {}, {v ? 1.0 : 0.0}); }

/// Runs `f` on `inputs` with `executor` (a CpuExecutor, a CudaExecutor) and
/// on the interpreter and checks that they agree, shapes included. `what`
/// names the case in failures.
template <typename Executor>
void expectMatchesInterpreter(Executor& executor, const Function& f, const std::vector<Tensor>& inputs,
                              const std::string& what) {
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << what << ": " << want.error().str();
  auto got = executor.run(inputs);
  ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
  ASSERT_EQ(got->size(), want->size()) << what;
  for (size_t r = 0; r < got->size(); ++r) expectClose((*got)[r], (*want)[r], what + ", result " + std::to_string(r));
}

/// Sums %step into %acc; the body ends the loop once the sum passes %limit;
/// each iteration's sum is a scan row and its iteration number another.
/// An op before the loop squares the start, one after it doubles the sum
/// (so that an executor has a prefix and a suffix to compile).
constexpr const char* kAccumulateLoop = R"(
func @accumulate(%n: i64[], %go: bool[], %init: f32[2], %step: f32[2], %limit: f32[]) -> (f32[2], f32[?,2], i64[?]) {
  %start = mul(%init, %init) : f32[2]
  %sum, %rows, %iters = loop(%n, %go, %start, %step, %limit) {num_carried = 1} : f32[2], f32[?,2], i64[?] {
  ^(%i: i64[], %c: bool[], %acc: f32[2], %s: f32[2], %lim: f32[]) -> (bool[], f32[2], f32[2], i64[]):
    %next = add(%acc, %s) : f32[2]
    %total = reduce_sum(%next) {axes = [0]} : f32[]
    %more = lt(%total, %lim) : bool[]
    return %more, %next, %next, %i
  }
  %twice = add(%sum, %sum) : f32[2]
  return %twice, %rows, %iters
}
)";

/// kAccumulateLoop's inputs: up to `n` iterations (none unless `go`) from
/// init [0, 1] in steps of [1, 2] while the sum stays below `limit`. With
/// (3, true, 100): three rows, the result [6, 14], iterations [0, 1, 2];
/// with (100, true, 6) it ends after two (totals 4, 7).
inline std::vector<Tensor> accumulateInputs(int64_t n, bool go, double limit) {
  return {i64Scalar(n), boolScalar(go), tensorOf(DType::F32, {2}, {0, 1}), tensorOf(DType::F32, {2}, {1, 2}),
          tensorOf(DType::F32, {}, {limit})};
}

/// A loop whose body holds an `if`: the Collatz sequence of %x, up to %n
/// steps or until it reaches 1, each step a scan row (kCollatzOf6).
constexpr const char* kCollatzLoop = R"(
func @collatz(%n: i64[], %x: i64[]) -> (i64[], i64[?]) {
  %t = constant() {value = dense<bool[]>[true]} : bool[]
  %last, %seq = loop(%n, %t, %x) {num_carried = 1} : i64[], i64[?] {
  ^(%i: i64[], %k: bool[], %v: i64[]) -> (bool[], i64[], i64[]):
    %two = constant() {value = dense<i64[]>[2]} : i64[]
    %zero = constant() {value = dense<i64[]>[0]} : i64[]
    %one = constant() {value = dense<i64[]>[1]} : i64[]
    %r = mod(%v, %two) : i64[]
    %even = eq(%r, %zero) : bool[]
    %next = if(%even, %v) : i64[] {
    ^(%a: i64[]):
      %d = constant() {value = dense<i64[]>[2]} : i64[]
      %h = div(%a, %d) : i64[]
      return %h
    } {
    ^(%a: i64[]):
      %three = constant() {value = dense<i64[]>[3]} : i64[]
      %u = constant() {value = dense<i64[]>[1]} : i64[]
      %p = mul(%a, %three) : i64[]
      %q = add(%p, %u) : i64[]
      return %q
    }
    %more = gt(%next, %one) : bool[]
    return %more, %next, %next
  }
  return %last, %seq
}
)";

/// kCollatzLoop's scan for %x = 6 (and %n of 8 or more).
inline const std::vector<double> kCollatzOf6 = {3, 10, 5, 16, 8, 4, 2, 1};

/// The carried value doubles in length each iteration, and is also a scan
/// value: the rows of a second iteration are longer than the first's, an
/// error (kRaggedScanError) for the interpreter as for an executor.
constexpr const char* kRaggedScan = R"(
func @ragged(%n: i64[], %x: f32[?]) -> (f32[?], f32[?,?]) {
  %t = constant() {value = dense<bool[]>[true]} : bool[]
  %last, %rows = loop(%n, %t, %x) {num_carried = 1} : f32[?], f32[?,?] {
  ^(%i: i64[], %k: bool[], %v: f32[?]) -> (bool[], f32[?], f32[?]):
    %w = concat(%v, %v) {axis = 0} : f32[?]
    return %k, %w, %w
  }
  return %last, %rows
}
)";

/// The error of kRaggedScan run twice from an f32[1].
constexpr const char* kRaggedScanError = "scan value 0 is f32[4] in iteration 1 but f32[2] in iteration 0";

/// nonzero between compiled ops: an executor compiles the ops before it,
/// runs it on the host, and compiles the ops after it for the count it
/// gave.
constexpr const char* kNonZeroBetweenStages =
    "func @f(%x: f32[6], %w: f32[6]) -> (f32[?], i64[1,?], f32[6]) {\n"
    "  %d = sub(%x, %w) : f32[6]\n"
    "  %m = relu(%d) : f32[6]\n"
    "  %n = nonzero(%m) : i64[1,?]\n"
    "  %i = reshape(%n) : i64[?]\n"
    "  %g = gather(%x, %i) {axis = 0} : f32[?]\n"
    "  %e = exp(%g) : f32[?]\n"
    "  return %e, %n, %m\n}\n";

}  // namespace kiln::test
