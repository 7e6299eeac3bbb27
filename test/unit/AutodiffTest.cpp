// The `autodiff` pass against central finite differences in float64 on the
// reference interpreter. Each case is one op (or a small model) in f64 whose
// output y is projected to a scalar loss sum(proj * y) by a random `proj`;
// the autodiff'd function's "grad.<p>" results must match
// (L(p + h e_i) - L(p - h e_i)) / 2h for every element i of every parameter
// p. Shapes are drawn at random for the elementwise ops (broadcasting
// included). Also: which ops are declared not differentiable, fan-out,
// unused parameters, the default parameter choice and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>

#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"
#include "passes/Vjp.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

struct Range {
  double lo, hi;
};

/// One finite-difference case: `body` computes %out of type `outType` from
/// the arguments `args`; `params` are differentiated.
struct Case {
  std::string args;
  std::string body;
  std::string outType;
  std::vector<std::string> params;
  /// Value ranges by argument name; float arguments default to [-2, 2].
  std::map<std::string, Range> ranges = {};
  /// Integer arguments are drawn from [0, intMax).
  int64_t intMax = 3;
  /// The finite-difference step (relative to max(1, |x|)) and tolerance.
  double step = 1e-6, rtol = 1e-5;
};

std::string caseText(const Case& c) {
  return "func @f(" + c.args + ", %proj: " + c.outType + ") -> f64[] {\n" + c.body +
         "\n  %p = mul(%out, %proj) : " + c.outType +
         "\n  %loss = reduce_sum(%p) {axes = []} : f64[]\n  return %loss\n}\n";
}

std::vector<Tensor> randomInputs(const Function& f, const Case& c, std::mt19937& rng) {
  std::vector<Tensor> inputs;
  for (Value* arg : f.arguments()) {
    Tensor t(arg->type().dtype, staticDims(arg->type().shape));
    auto range = c.ranges.count(arg->name()) ? c.ranges.at(arg->name()) : Range{-2.0, 2.0};
    for (int64_t i = 0; i < t.numElements(); ++i) {
      if (t.dtype() == DType::Bool)
        t.setInt(i, std::uniform_int_distribution<int>(0, 1)(rng));
      else if (isInteger(t.dtype()))
        t.setInt(i, std::uniform_int_distribution<int64_t>(0, c.intMax - 1)(rng));
      else
        t.setDouble(i, std::uniform_real_distribution<double>(range.lo, range.hi)(rng));
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

double lossAt(const Function& f, const std::vector<Tensor>& inputs) {
  auto r = interpret(f, inputs);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().str());
  return r.ok() ? (*r)[0].getDouble(0) : NAN;
}

/// Differentiates the case and compares every gradient element with a
/// central difference.
void expectGradientsMatch(const Case& c, uint32_t seed = 7) {
  std::string text = caseText(c);
  SCOPED_TRACE(text);
  auto original = parseModule(text, "autodiff-test.kir");
  auto diffed = parseModule(text, "autodiff-test.kir");
  ASSERT_TRUE(original.ok()) << original.error().str();
  ASSERT_TRUE(diffed.ok());
  Function& f = *(*original)->functions()[0];
  Function& g = *(*diffed)->functions()[0];
  Status s = differentiateFunction(g, AutodiffOptions{c.params, 0});
  ASSERT_TRUE(s.ok()) << s.error().str();
  Status v = verify(g);
  ASSERT_TRUE(v.ok()) << v.error().str() << "\n" << print(g);
  ASSERT_EQ(g.resultTypes().size(), 1 + c.params.size());

  std::mt19937 rng(seed);
  std::vector<Tensor> inputs = randomInputs(f, c, rng);
  auto results = interpret(g, inputs);
  ASSERT_TRUE(results.ok()) << results.error().str() << "\n" << print(g);
  EXPECT_NEAR((*results)[0].getDouble(0), lossAt(f, inputs), 1e-12);

  for (size_t p = 0; p < c.params.size(); ++p) {
    EXPECT_EQ(g.resultName(1 + p), "grad." + c.params[p]);
    size_t arg = 0;
    while (f.argument(arg)->name() != c.params[p]) ++arg;
    const Tensor& grad = (*results)[1 + p];
    ASSERT_EQ(grad.shape(), inputs[arg].shape()) << c.params[p];
    for (int64_t i = 0; i < grad.numElements(); ++i) {
      std::vector<Tensor> plus = inputs, minus = inputs;
      double x = inputs[arg].getDouble(i), h = c.step * std::max(1.0, std::abs(x));
      plus[arg].setDouble(i, x + h);
      minus[arg].setDouble(i, x - h);
      double fd = (lossAt(f, plus) - lossAt(f, minus)) / (2 * h);
      EXPECT_NEAR(grad.getDouble(i), fd, c.rtol * (0.1 + std::abs(fd)))
          << "d loss / d " << c.params[p] << "[" << i << "]\n"
          << print(g);
    }
  }
}

std::string typeStr(const std::vector<int64_t>& dims) {
  std::string s = "f64[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

std::vector<int64_t> randomDims(std::mt19937& rng) {
  std::vector<int64_t> dims(std::uniform_int_distribution<int>(0, 3)(rng));
  for (int64_t& d : dims) d = std::uniform_int_distribution<int64_t>(1, 4)(rng);
  return dims;
}

// --- Elementwise ----------------------------------------------------------------

TEST(AutodiffTest, UnaryOpsMatchFiniteDifferencesOverRandomShapes) {
  std::map<std::string, Range> domains = {
      {"log", {0.2, 2}},   {"sqrt", {0.2, 2}},  {"rsqrt", {0.2, 2}},  {"reciprocal", {0.3, 2}}, {"tan", {-1, 1}},
      {"asin", {-.8, .8}}, {"acos", {-.8, .8}}, {"atanh", {-.8, .8}}, {"acosh", {1.2, 3}},
  };
  std::mt19937 rng(1);
  for (std::string op :
       {"neg", "abs", "exp", "log",  "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu",  "erf",
        "sin", "cos", "tan", "asin", "acos", "atan",  "sinh",       "cosh", "asinh",   "acosh", "atanh"}) {
    for (int trial = 0; trial < 2; ++trial) {
      std::string t = typeStr(randomDims(rng));
      Case c{"%x: " + t, "  %out = " + op + "(%x) : " + t, t, {"x"}};
      if (domains.count(op)) c.ranges["x"] = domains[op];
      expectGradientsMatch(c, rng());
    }
  }
}

/// Shapes of `b` that broadcast against `a`: a suffix of it with some dims set to 1.
std::vector<int64_t> broadcastPartner(const std::vector<int64_t>& a, std::mt19937& rng) {
  size_t drop = std::uniform_int_distribution<size_t>(0, a.size())(rng);
  std::vector<int64_t> b(a.begin() + drop, a.end());
  for (int64_t& d : b)
    if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) d = 1;
  return b;
}

TEST(AutodiffTest, BinaryOpsMatchFiniteDifferencesWithBroadcasting) {
  std::mt19937 rng(2);
  for (std::string op : {"add", "sub", "mul", "div", "pow", "max", "min", "mod", "rem"}) {
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<int64_t> a = randomDims(rng), b = broadcastPartner(a, rng);
      if (trial == 1) std::swap(a, b);
      std::vector<int64_t> out = a.size() >= b.size() ? a : b;
      const auto& shorter = a.size() >= b.size() ? b : a;
      for (size_t i = 0; i < shorter.size(); ++i)
        out[out.size() - shorter.size() + i] = std::max(out[out.size() - shorter.size() + i], shorter[i]);
      Case c{"%a: " + typeStr(a) + ", %b: " + typeStr(b),
             "  %out = " + op + "(%a, %b) : " + typeStr(out),
             typeStr(out),
             {"a", "b"}};
      if (op == "div") c.ranges["b"] = {0.5, 2};
      if (op == "pow") c.ranges["a"] = {0.3, 2};
      // a / b stays between integers, away from mod's and rem's jumps.
      if (op == "mod" || op == "rem") c.ranges = {{"a", {2.2, 2.8}}, {"b", {-1.05, -1.0}}};
      expectGradientsMatch(c, rng());
    }
  }
}

TEST(AutodiffTest, SelectRoutesTheGradientByTheCondition) {
  expectGradientsMatch(
      {"%c: bool[3,4], %x: f64[3,4], %y: f64[4]", "  %out = select(%c, %x, %y) : f64[3,4]", "f64[3,4]", {"x", "y"}});
}

/// The f32 middle rounds at 1e-7, so the step is larger and the tolerance looser.
TEST(AutodiffTest, FloatCastPassesTheGradientBack) {
  expectGradientsMatch({"%x: f64[3,2]",
                        "  %c = cast(%x) : f32[3,2]\n  %e = exp(%c) : f32[3,2]\n  %out = cast(%e) : f64[3,2]",
                        "f64[3,2]",
                        {"x"},
                        {},
                        3,
                        1e-3,
                        1e-3});
}

// --- Control flow -------------------------------------------------------------------

/// The gradient of an `if` is an `if` of the branches' backwards: the branch
/// taken gives its captures' gradients, the other's captures get zeros, and
/// a capture also used outside the `if` sums both paths.
TEST(AutodiffTest, IfDifferentiatesTheBranchTaken) {
  for (const char* taken : {"true", "false"}) {
    SCOPED_TRACE(taken);
    expectGradientsMatch({"%x: f64[3], %y: f64[3]",
                          std::string("  %t = constant() {value = dense<bool[]>[") + taken + "]} : bool[]\n" +
                              "  %r = if(%t, %x, %y) : f64[3] {\n"
                              "  ^(%a: f64[3], %b: f64[3]):\n"
                              "    %m = mul(%a, %b) : f64[3]\n"
                              "    %e = exp(%m) : f64[3]\n"
                              "    return %e\n"
                              "  } {\n"
                              "  ^(%a: f64[3], %b: f64[3]):\n"
                              "    %s = sin(%a) : f64[3]\n"
                              "    return %s\n"
                              "  }\n"
                              "  %out = add(%r, %x) : f64[3]",
                          "f64[3]",
                          {"x", "y"},
                          {{"x", {-1.0, 1.0}}, {"y", {-1.0, 1.0}}}});
  }
}

/// The body x = tanh(x * w + b) of a loop of `trips` iterations.
std::string tanhLoop(const std::string& trips, const std::string& go = "true") {
  return "  %n = constant() {value = dense<i64[]>[" + trips + "]} : i64[]\n" +
         "  %t = constant() {value = dense<bool[]>[" + go + "]} : bool[]\n" +
         "  %out = loop(%n, %t, %x, %w, %b) {num_carried = 1} : f64[3] {\n"
         "  ^(%i: i64[], %c: bool[], %v: f64[3], %ww: f64[3], %bb: f64[3]) -> (bool[], f64[3]):\n"
         "    %m = mul(%v, %ww) : f64[3]\n"
         "    %a = add(%m, %bb) : f64[3]\n"
         "    %h = tanh(%a) : f64[3]\n"
         "    return %c, %h\n"
         "  }";
}

/// A loop of a static trip count is differentiated in reverse mode: the
/// forward loop stacks the carried values entering each iteration and a
/// backward loop runs the body's VJP from the last iteration to the first,
/// threading x's gradient and summing those of the captures w and b.
TEST(AutodiffTest, LoopWithCarriedValuesMatchesFiniteDifferences) {
  for (const char* trips : {"1", "4"}) {
    SCOPED_TRACE(trips);
    expectGradientsMatch({"%x: f64[3], %w: f64[3], %b: f64[3]", tanhLoop(trips), "f64[3]", {"x", "w", "b"}});
  }
}

/// Two carried values (one an accumulator), a scan result, the iteration
/// number read as a float, and a capture used outside the loop too.
TEST(AutodiffTest, LoopWithScanResultsMatchesFiniteDifferences) {
  expectGradientsMatch({"%x: f64[2], %z: f64[2], %w: f64[2]",
                        "  %n = constant() {value = dense<i64[]>[3]} : i64[]\n"
                        "  %t = constant() {value = dense<bool[]>[true]} : bool[]\n"
                        "  %r, %acc, %rows = loop(%n, %t, %x, %z, %w) {num_carried = 2} : f64[2], f64[2], f64[3,2] {\n"
                        "  ^(%i: i64[], %c: bool[], %v: f64[2], %s: f64[2], %ww: f64[2]) -> (bool[], f64[2], f64[2], "
                        "f64[2]):\n"
                        "    %fi = cast(%i) : f64[]\n"
                        "    %p = mul(%v, %ww) : f64[2]\n"
                        "    %q = add(%p, %fi) : f64[2]\n"
                        "    %nv = sin(%q) : f64[2]\n"
                        "    %e = mul(%v, %v) : f64[2]\n"
                        "    %ns = add(%s, %e) : f64[2]\n"
                        "    return %c, %nv, %ns, %p\n"
                        "  }\n"
                        "  %o1 = reduce_sum(%rows) {axes = [0]} : f64[2]\n"
                        "  %o2 = mul(%r, %acc) : f64[2]\n"
                        "  %o3 = add(%o1, %o2) : f64[2]\n"
                        "  %out = mul(%o3, %w) : f64[2]",
                        "f64[2]",
                        {"x", "z", "w"},
                        {{"x", {-1.0, 1.0}}, {"z", {-1.0, 1.0}}, {"w", {-1.0, 1.0}}}});
}

/// x = tanh(x * w) in a loop that a counter stops, as PyTorch exports
/// `while j < n` (no trip count; the body returns `cmp(counter, limit)`):
/// `counter` is `%j1` (the carried %j plus `step`) or `%i` (the iteration
/// number).
std::string counterLoop(const std::string& bound, const std::string& init, const std::string& step,
                        const std::string& cmp, const std::string& counter, const std::string& limit) {
  return "  %n = constant() {value = dense<i64[]>[" + bound + "]} : i64[]\n" +
         "  %t = constant() {value = dense<bool[]>[true]} : bool[]\n" +
         "  %j0 = constant() {value = dense<i64[]>[" + init + "]} : i64[]\n" +
         "  %out, %k = loop(%n, %t, %x, %j0, %w) {num_carried = 2} : f64[3], i64[] {\n"
         "  ^(%i: i64[], %c: bool[], %v: f64[3], %j: i64[], %ww: f64[3]) -> (bool[], f64[3], i64[]):\n"
         "    %m = mul(%v, %ww) : f64[3]\n"
         "    %h = tanh(%m) : f64[3]\n"
         "    %s = constant() {value = dense<i64[]>[" + step + "]} : i64[]\n" +
         "    %j1 = add(%j, %s) : i64[]\n"
         "    %l = constant() {value = dense<i64[]>[" + limit + "]} : i64[]\n" +
         "    %go = " + cmp + "(" + counter + ", %l) : bool[]\n" +
         "    return %go, %h, %j1\n"
         "  }";
}

/// A loop stopped by a counter compared with a constant has a static trip
/// count (counterTripCount in passes/CanonicalizeLoops.cpp): it is made a counted loop and
/// differentiated like one. The finite differences run the original loop,
/// so a count off by one fails them.
TEST(AutodiffTest, LoopStoppedByACounterMatchesFiniteDifferences) {
  const char* noBound = "9223372036854775807";
  struct Case {
    const char* what;
    std::string body;
  };
  for (const Case& c : {
           Case{"while j < 3 (3 iterations)", counterLoop(noBound, "0", "1", "lt", "%j1", "3")},
           Case{"i <= 2 (4 iterations)", counterLoop(noBound, "0", "1", "le", "%i", "2")},
           Case{"j from 1 by 2 below 8 (4 iterations)", counterLoop(noBound, "1", "2", "lt", "%j1", "8")},
           Case{"the same with a trip bound of 2", counterLoop("2", "1", "2", "lt", "%j1", "8")},
           Case{"a limit already passed (1 iteration)", counterLoop(noBound, "5", "1", "lt", "%j1", "3")},
       }) {
    SCOPED_TRACE(c.what);
    expectGradientsMatch({"%x: f64[3], %w: f64[3]", c.body, "f64[3]", {"x", "w"}});
  }
}

/// A loop that runs no iteration (a trip count of 0, or a false initial
/// condition) passes its carried values through: x's gradient is the
/// result's, w and b get zeros.
TEST(AutodiffTest, LoopOfNoIterationPassesTheGradientThrough) {
  expectGradientsMatch({"%x: f64[3], %w: f64[3], %b: f64[3]", tanhLoop("0"), "f64[3]", {"x", "w", "b"}});
  expectGradientsMatch({"%x: f64[3], %w: f64[3], %b: f64[3]", tanhLoop("5", "false"), "f64[3]", {"x", "w", "b"}});
}

/// A loop whose trip count is not a constant, or whose body may stop it
/// early, is not differentiated: the error names the op and why.
TEST(AutodiffTest, LoopWithoutAStaticTripCountIsAnError) {
  auto errorOfLoop = [](const std::string& args, const std::string& body) {
    auto m = parseModule("func @f(" + args + ") -> f64[] {\n" + body +
                             "\n  %s = reduce_sum(%out) {axes = []} : f64[]\n  return %s\n}\n",
                         "loop.kir");
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().str());
    if (!m.ok()) return std::string();
    Status s = differentiateFunction(*(*m)->functions()[0], AutodiffOptions{std::vector<std::string>{"x"}, 0});
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : s.error().str();
  };
  std::string dynamic = errorOfLoop("%x: f64[3], %w: f64[3], %b: f64[3], %k: i64[]",
                                    tanhLoop("2").replace(tanhLoop("2").find("loop(%n"), 7, "loop(%k"));
  EXPECT_NE(dynamic.find("'loop' cannot be differentiated: the VJP of 'loop' needs a static trip count: its trip "
                         "bound (operand 0) is not a constant"),
            std::string::npos)
      << dynamic;
  std::string unbounded = errorOfLoop("%x: f64[3], %w: f64[3], %b: f64[3]", tanhLoop("9223372036854775807"));
  EXPECT_NE(unbounded.find("its trip bound 9223372036854775807 is more than 2147483648 iterations to stack"),
            std::string::npos)
      << unbounded;
  std::string early = errorOfLoop("%x: f64[3]",
                                  "  %n = constant() {value = dense<i64[]>[4]} : i64[]\n"
                                  "  %t = constant() {value = dense<bool[]>[true]} : bool[]\n"
                                  "  %out = loop(%n, %t, %x) {num_carried = 1} : f64[3] {\n"
                                  "  ^(%i: i64[], %c: bool[], %v: f64[3]) -> (bool[], f64[3]):\n"
                                  "    %h = tanh(%v) : f64[3]\n"
                                  "    %s = reduce_sum(%h) {axes = []} : f64[]\n"
                                  "    %z = constant() {value = dense<f64[]>[0]} : f64[]\n"
                                  "    %more = gt(%s, %z) : bool[]\n"
                                  "    return %more, %h\n"
                                  "  }");
  EXPECT_NE(early.find("the condition its body returns is not provably true"), std::string::npos) << early;
}

// --- Data movement ----------------------------------------------------------------

TEST(AutodiffTest, LayoutOpsMatchFiniteDifferences) {
  expectGradientsMatch({"%x: f64[3,1]", "  %out = broadcast(%x) : f64[2,3,4]", "f64[2,3,4]", {"x"}});
  expectGradientsMatch({"%x: f64[2,6]", "  %out = reshape(%x) : f64[3,2,2]", "f64[3,2,2]", {"x"}});
  expectGradientsMatch(
      {"%x: f64[2,3,4]", "  %out = transpose(%x) {perm = [2, 0, 1]} : f64[4,2,3]", "f64[4,2,3]", {"x"}});
  expectGradientsMatch({"%x: f64[4,5]",
                        "  %out = slice(%x) {starts = [1, -4], ends = [3, 100], steps = [1, 1]} : f64[2,4]",
                        "f64[2,4]",
                        {"x"}});
  expectGradientsMatch({"%x: f64[4,5]",
                        "  %out = slice(%x) {starts = [3, 0], ends = [0, 5], steps = [-1, 1]} : f64[3,5]",
                        "f64[3,5]",
                        {"x"}});
  expectGradientsMatch(
      {"%a: f64[2,3], %b: f64[2,1]", "  %out = concat(%a, %b, %a) {axis = 1} : f64[2,7]", "f64[2,7]", {"a", "b"}});
  // Steps of 2 and -3 spread the gradient apart.
  expectGradientsMatch({"%x: f64[7,8]",
                        "  %out = slice(%x) {starts = [1, -1], ends = [100, 0], steps = [2, -3]} : f64[3,3]",
                        "f64[3,3]",
                        {"x"}});
  expectGradientsMatch({"%x: f64[2,9]",
                        "  %out = slice(%x) {starts = [0, 2], ends = [2, 8], steps = [1, 4]} : f64[2,2]",
                        "f64[2,2]",
                        {"x"}});
  expectGradientsMatch({"%x: f64[3,4]", "  %out = pad(%x) {pads = [1, -1, 0, 2]} : f64[4,5]", "f64[4,5]", {"x"}});
}

TEST(AutodiffTest, GatherAndScatterMatchFiniteDifferences) {
  // Repeated indices add their gradients.
  expectGradientsMatch(
      {"%x: f64[2,4,3], %i: i64[5]", "  %out = gather(%x, %i) {axis = 1} : f64[2,5,3]", "f64[2,5,3]", {"x"}, {}, 4});
  expectGradientsMatch(
      {"%x: f64[5,3], %i: i64[2,2]", "  %out = gather(%x, %i) : f64[2,2,3]", "f64[2,2,3]", {"x"}, {}, 5});
  expectGradientsMatch({"%x: f64[3,4], %i: i64[3,6]",
                        "  %out = gather_elements(%x, %i) {axis = 1} : f64[3,6]",
                        "f64[3,6]",
                        {"x"},
                        {},
                        4});
  // Distinct indices per row (a permutation of iota would need more setup:
  // one column written per row keeps them distinct).
  expectGradientsMatch({"%x: f64[3,4], %i: i64[3,1], %u: f64[3,1]",
                        "  %out = scatter_elements(%x, %i, %u) {axis = 1} : f64[3,4]",
                        "f64[3,4]",
                        {"x", "u"},
                        {},
                        4});
  // With reduction add, repeated indices each receive their update's gradient.
  expectGradientsMatch({"%x: f64[3,4], %i: i64[3,5], %u: f64[3,5]",
                        "  %out = scatter_elements(%x, %i, %u) {axis = 1, reduction = \"add\"} : f64[3,4]",
                        "f64[3,4]",
                        {"x", "u"},
                        {},
                        4});
}

/// A random pad of `dims` in `mode`: pads in [-1, dim - 1] for reflect
/// (which needs fewer than dim), [-1, 3] for edge, every result dim >= 1.
TEST(AutodiffTest, ReflectAndEdgePadMatchFiniteDifferencesOverRandomShapes) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 10; ++trial) {
    for (std::string mode : {"reflect", "edge"}) {
      std::vector<int64_t> dims(std::uniform_int_distribution<int>(1, 3)(rng));
      for (int64_t& d : dims) d = std::uniform_int_distribution<int64_t>(1, 4)(rng);
      const size_t rank = dims.size();
      std::vector<int64_t> pads(2 * rank), out(rank);
      for (size_t d = 0; d < rank; ++d) {
        const int64_t hi = mode == "reflect" ? dims[d] - 1 : 3;
        do {
          pads[d] = std::uniform_int_distribution<int64_t>(-1, hi)(rng);
          pads[rank + d] = std::uniform_int_distribution<int64_t>(-1, hi)(rng);
          out[d] = dims[d] + pads[d] + pads[rank + d];
        } while (out[d] < 1);
      }
      std::string padList;
      for (size_t i = 0; i < pads.size(); ++i) padList += (i ? ", " : "") + std::to_string(pads[i]);
      expectGradientsMatch({"%x: " + typeStr(dims),
                            "  %out = pad(%x) {pads = [" + padList + "], mode = \"" + mode + "\"} : " + typeStr(out),
                            typeStr(out),
                            {"x"}});
    }
  }
}

TEST(AutodiffTest, ScatterReductionsMulMaxMinMatchFiniteDifferences) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 6; ++trial) {
    for (std::string reduction : {"mul", "max", "min"}) {
      const int64_t rows = std::uniform_int_distribution<int64_t>(1, 3)(rng);
      const int64_t cols = std::uniform_int_distribution<int64_t>(1, 4)(rng);
      const int64_t k = std::uniform_int_distribution<int64_t>(1, 6)(rng);
      const int64_t axis = trial % 2;
      // Axis 1: indices [rows, k] into cols; axis 0: [k, cols] into rows.
      std::vector<int64_t> data = {rows, cols},
                           idx = axis ? std::vector<int64_t>{rows, k} : std::vector<int64_t>{k, cols};
      Case c{"%x: " + typeStr(data) + ", %i: i64[" + std::to_string(idx[0]) + "," + std::to_string(idx[1]) +
                 "], %u: " + typeStr(idx),
             "  %out = scatter_elements(%x, %i, %u) {axis = " + std::to_string(axis) + ", reduction = \"" + reduction +
                 "\"} : " + typeStr(data),
             typeStr(data),
             {"x", "u"},
             {},
             axis ? cols : rows};
      // Products of factors away from zero; max and min of distinct values.
      if (reduction == "mul") c.ranges = {{"x", {0.5, 1.5}}, {"u", {-1.5, -0.5}}};
      expectGradientsMatch(c, 100 + trial);
    }
  }
}

/// The gradient of `text` (a function of %x and %u returning the loss) at
/// `x` and `u` with the indices `i`, for hand-computed checks.
std::vector<Tensor> gradientsAt(const std::string& text, const std::vector<Tensor>& inputs) {
  auto m = parseModule(text, "ties.kir");
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().str());
  if (!m.ok()) return {};
  Function& g = *(*m)->functions()[0];
  Status s = differentiateFunction(g, AutodiffOptions{std::vector<std::string>{"x", "u"}, 0});
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().str());
  auto r = interpret(g, inputs);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().str());
  return r.ok() ? *r : std::vector<Tensor>{};
}

TEST(AutodiffTest, ScatterMaxTiesShareTheGradientAndMulHandlesZeros) {
  auto text = [](const std::string& reduction) {
    return "func @f(%x: f64[1,3], %i: i64[1,5], %u: f64[1,5]) -> f64[] {\n"
           "  %s = scatter_elements(%x, %i, %u) {axis = 1, reduction = \"" +
           reduction +
           "\"} : f64[1,3]\n"
           "  %l = reduce_sum(%s) {axes = []} : f64[]\n  return %l\n}\n";
  };
  Tensor i = test::tensorOf(DType::I64, {1, 5}, {1, 1, 2, 0, 0});
  // max: place 1 holds 5 in data and in update 0 (each gets 1/2); place 2
  // holds 2 in data and update 2 (1/2 each); place 0: data 1 < updates
  // 0.5 and 0.25, so data keeps it.
  auto max = gradientsAt(text("max"), {test::tensorOf(DType::F64, {1, 3}, {1, 5, 2}), i,
                                       test::tensorOf(DType::F64, {1, 5}, {5, 3, 2, 0.5, 0.25})});
  ASSERT_EQ(max.size(), 3u);
  EXPECT_EQ(test::elementsOf(max[1]), (std::vector<double>{1, 0.5, 0.5}));
  EXPECT_EQ(test::elementsOf(max[2]), (std::vector<double>{0.5, 0, 0.5, 0, 0}));
  // min: place 0 is 0.25 from update 4 alone.
  auto min = gradientsAt(text("min"), {test::tensorOf(DType::F64, {1, 3}, {1, 5, 2}), i,
                                       test::tensorOf(DType::F64, {1, 5}, {5, 3, 2, 0.5, 0.25})});
  ASSERT_EQ(min.size(), 3u);
  EXPECT_EQ(test::elementsOf(min[1]), (std::vector<double>{0, 0, 0.5}));
  EXPECT_EQ(test::elementsOf(min[2]), (std::vector<double>{0, 1, 0.5, 0, 1}));
  // mul with zeros: place 0 = 2 * 0 * 5 (update 3 is the only zero: its
  // gradient is 2 * 5 = 10, update 4's is 0, data's 0); place 1 = 3 * 0 * 0
  // (two zeros: every gradient 0); place 2 = 4 * 7.
  Tensor j = test::tensorOf(DType::I64, {1, 5}, {1, 1, 2, 0, 0});
  auto mul = gradientsAt(text("mul"), {test::tensorOf(DType::F64, {1, 3}, {2, 3, 4}), j,
                                       test::tensorOf(DType::F64, {1, 5}, {0, 0, 7, 0, 5})});
  ASSERT_EQ(mul.size(), 3u);
  EXPECT_EQ(test::elementsOf(mul[1]), (std::vector<double>{0, 0, 7}));
  EXPECT_EQ(test::elementsOf(mul[2]), (std::vector<double>{0, 0, 4, 10, 0}));
}

// --- Reductions and contractions ----------------------------------------------------

TEST(AutodiffTest, ReductionsMatchFiniteDifferences) {
  for (std::string op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"}) {
    expectGradientsMatch({"%x: f64[2,3,4]", "  %out = " + op + "(%x) {axes = [-1, 0]} : f64[3]", "f64[3]", {"x"}});
    expectGradientsMatch(
        {"%x: f64[2,3,4]", "  %out = " + op + "(%x) {axes = [1], keepdims = true} : f64[2,1,4]", "f64[2,1,4]", {"x"}});
    expectGradientsMatch({"%x: f64[3,2]", "  %out = " + op + "(%x) {axes = []} : f64[]", "f64[]", {"x"}});
  }
}

TEST(AutodiffTest, MatMulMatchesFiniteDifferencesBatchedAndBroadcast) {
  expectGradientsMatch({"%a: f64[3,4], %b: f64[4,2]", "  %out = matmul(%a, %b) : f64[3,2]", "f64[3,2]", {"a", "b"}});
  expectGradientsMatch(
      {"%a: f64[2,3,4], %b: f64[4,2]", "  %out = matmul(%a, %b) : f64[2,3,2]", "f64[2,3,2]", {"a", "b"}});
  expectGradientsMatch(
      {"%a: f64[2,1,3,4], %b: f64[3,4,2]", "  %out = matmul(%a, %b) : f64[2,3,3,2]", "f64[2,3,3,2]", {"a", "b"}});
  expectGradientsMatch({"%a: f64[4], %b: f64[2,4,3]", "  %out = matmul(%a, %b) : f64[2,3]", "f64[2,3]", {"a", "b"}});
  expectGradientsMatch({"%a: f64[2,3,4], %b: f64[4]", "  %out = matmul(%a, %b) : f64[2,3]", "f64[2,3]", {"a", "b"}});
  expectGradientsMatch({"%a: f64[4], %b: f64[4]", "  %out = matmul(%a, %b) : f64[]", "f64[]", {"a", "b"}});
}

TEST(AutodiffTest, ConvMatchesFiniteDifferences) {
  expectGradientsMatch({"%x: f64[2,2,5,5], %w: f64[3,2,3,3], %b: f64[3]",
                        "  %out = conv(%x, %w, %b) : f64[2,3,3,3]",
                        "f64[2,3,3,3]",
                        {"x", "w", "b"}});
  // Stride, padding and dilation, with a size the stride does not divide.
  expectGradientsMatch({"%x: f64[1,2,6,5], %w: f64[2,2,2,3]",
                        "  %out = conv(%x, %w) {strides = [2, 2], pads = [1, 0, 0, 1], dilations = [1, 2]} : "
                        "f64[1,2,3,1]",
                        "f64[1,2,3,1]",
                        {"x", "w"}});
  expectGradientsMatch({"%x: f64[2,3,7], %w: f64[2,3,3]",
                        "  %out = conv(%x, %w) {strides = [3]} : f64[2,2,2]",
                        "f64[2,2,2]",
                        {"x", "w"}});
}

TEST(AutodiffTest, GroupedConvAndConvTransposeMatchFiniteDifferences) {
  expectGradientsMatch({"%x: f64[2,4,5,5], %w: f64[6,2,3,3], %b: f64[6]",
                        "  %out = conv(%x, %w, %b) {groups = 2, strides = [2, 1], pads = [1, 0, 1, 1]} : f64[2,6,3,4]",
                        "f64[2,6,3,4]",
                        {"x", "w", "b"}});
  // Depthwise.
  expectGradientsMatch({"%x: f64[1,3,6], %w: f64[3,1,3]",
                        "  %out = conv(%x, %w) {groups = 3, dilations = [2]} : f64[1,3,2]",
                        "f64[1,3,2]",
                        {"x", "w"}});
  expectGradientsMatch({"%x: f64[2,3,3,3], %w: f64[3,2,2,3], %b: f64[2]",
                        "  %out = conv_transpose(%x, %w, %b) : f64[2,2,4,5]",
                        "f64[2,2,4,5]",
                        {"x", "w", "b"}});
  // Stride, padding, dilation, output_padding and groups.
  expectGradientsMatch({"%x: f64[1,4,3,4], %w: f64[4,3,3,2]",
                        "  %out = conv_transpose(%x, %w) {strides = [2, 3], pads = [1, 0, 0, 1], dilations = [1, 2], "
                        "output_padding = [1, 2], groups = 2} : f64[1,6,7,13]",
                        "f64[1,6,7,13]",
                        {"x", "w"}});
}

TEST(AutodiffTest, PoolingMatchesFiniteDifferences) {
  expectGradientsMatch({"%x: f64[2,2,4,4]",
                        "  %out = max_pool(%x) {kernel = [2, 2], strides = [2, 2]} : f64[2,2,2,2]",
                        "f64[2,2,2,2]",
                        {"x"}});
  // Overlapping windows, padding, dilation and ceil_mode's partial window.
  expectGradientsMatch(
      {"%x: f64[1,2,6,6]",
       "  %out = max_pool(%x) {kernel = [3, 2], strides = [2, 1], pads = [1, 0, 1, 1], dilations = [1, 2], "
       "ceil_mode = true} : f64[1,2,4,5]",
       "f64[1,2,4,5]",
       {"x"}});
  expectGradientsMatch(
      {"%x: f64[2,3,7]", "  %out = max_pool(%x) {kernel = [3], strides = [2]} : f64[2,3,3]", "f64[2,3,3]", {"x"}});
  expectGradientsMatch({"%x: f64[2,2,4,5]",
                        "  %out = avg_pool(%x) {kernel = [2, 2], strides = [2, 2]} : f64[2,2,2,2]",
                        "f64[2,2,2,2]",
                        {"x"}});
  for (std::string countPad : {"false", "true"})
    expectGradientsMatch({"%x: f64[1,2,6,6]",
                          "  %out = avg_pool(%x) {kernel = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], "
                          "ceil_mode = true, count_include_pad = " +
                              countPad + "} : f64[1,2,4,4]",
                          "f64[1,2,4,4]",
                          {"x"}});
}

// --- Composites through their decompositions ---------------------------------------------

TEST(AutodiffTest, CompositesAreDifferentiatedThroughTheirDecompositions) {
  expectGradientsMatch({"%x: f64[3,5]", "  %out = softmax(%x) : f64[3,5]", "f64[3,5]", {"x"}});
  expectGradientsMatch({"%x: f64[3,5]", "  %out = log_softmax(%x) {axis = 0} : f64[3,5]", "f64[3,5]", {"x"}});
  expectGradientsMatch({"%x: f64[2,3,4], %s: f64[4], %b: f64[4]",
                        "  %out = layer_norm(%x, %s, %b) : f64[2,3,4]",
                        "f64[2,3,4]",
                        {"x", "s", "b"}});
  expectGradientsMatch({"%x: f64[3,4]", "  %out = gelu(%x) : f64[3,4]", "f64[3,4]", {"x"}});
  expectGradientsMatch({"%x: f64[4,5], %y: i64[4]", "  %out = cross_entropy(%x, %y) : f64[]", "f64[]", {"x"}, {}, 5});
  expectGradientsMatch({"%x: f64[4,3], %t: f64[4,3]", "  %out = mse_loss(%x, %t) : f64[]", "f64[]", {"x", "t"}});
}

/// A two-layer MLP with an MSE loss: the gradient of every weight and bias.
TEST(AutodiffTest, MlpWithMseLossMatchesFiniteDifferences) {
  expectGradientsMatch({"%x: f64[4,6], %w1: f64[6,5], %b1: f64[5], %w2: f64[5,3], %b2: f64[3], %t: f64[4,3]",
                        "  %h = matmul(%x, %w1) : f64[4,5]\n"
                        "  %hb = add(%h, %b1) : f64[4,5]\n"
                        "  %r = relu(%hb) : f64[4,5]\n"
                        "  %o = matmul(%r, %w2) : f64[4,3]\n"
                        "  %ob = add(%o, %b2) : f64[4,3]\n"
                        "  %out = mse_loss(%ob, %t) : f64[]",
                        "f64[]",
                        {"w1", "b1", "w2", "b2"}});
}

// --- Graph structure and errors ----------------------------------------------------------

TEST(AutodiffTest, FanOutSumsAndUnusedParametersGetZeros) {
  expectGradientsMatch({"%x: f64[3], %unused: f64[2,2]",
                        "  %a = mul(%x, %x) : f64[3]\n  %b = sin(%x) : f64[3]\n  %out = add(%a, %b) : f64[3]",
                        "f64[3]",
                        {"x", "unused"}});
}

/// The VJP entries live in one file per op family (passes/Vjp<Family>.cpp),
/// so what the table's static_assert checked in one file is checked here:
/// composite ops, and only they, are differentiated through their
/// decomposition.
/// hard_swish on each of its three pieces (finite differences across a
/// kink at -3 or 3 would not match any one-sided slope), and at points of
/// each piece and at its kinks the values of PyTorch's hardswish_backward
/// (0 at -3, dy at 3).
TEST(AutodiffTest, HardSwishMatchesFiniteDifferencesOnEachPieceAndPyTorchAtTheKinks) {
  std::mt19937 rng(7);
  for (Range piece : {Range{-6, -3.2}, Range{-2.8, 2.8}, Range{3.2, 6}}) {
    std::string t = typeStr(randomDims(rng));
    Case c{"%x: " + t, "  %out = hard_swish(%x) : " + t, t, {"x"}};
    c.ranges["x"] = piece;
    expectGradientsMatch(c, rng());
  }
  auto m = parseModule(
      "func @f(%x: f64[9], %dy: f64[9]) -> f64[9] {\n  %y = hard_swish(%x) : f64[9]\n  return %y\n}\n", "hs.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  Function& f = *(*m)->functions()[0];
  Builder b(f);
  b.setInsertionPoint(f.returnOp());
  const Op& op = *f.returnOp()->operand(0)->definingOp();
  auto grads = applyVjp(b, op, f.argument(1), {true});
  ASSERT_TRUE(grads.ok()) << grads.error().str();
  f.returnOp()->setOperands({(*grads)[0]});
  Tensor x(DType::F64, {9}), dy(DType::F64, {9});
  const double xs[] = {-4, -3, -2.5, -1, 0, 0.5, 2.9, 3, 4};
  for (int64_t i = 0; i < 9; ++i) {
    x.setDouble(i, xs[i]);
    dy.setDouble(i, 2);
  }
  auto out = interpret(f, {x, dy});
  ASSERT_TRUE(out.ok()) << out.error().str();
  // torch.autograd of torch.nn.functional.hardswish in float64, dy = 2.
  const double want[] = {0.0, 0.0, -0.6666666666666667, 0.33333333333333337, 1.0, 1.3333333333333333,
                         2.9333333333333336, 2.0, 2.0};
  for (int64_t i = 0; i < 9; ++i) EXPECT_NEAR((*out)[0].getDouble(i), want[i], 1e-12) << "x = " << xs[i];
}

TEST(AutodiffTest, CompositesAndOnlyCompositesDecompose) {
  for (size_t i = 0; i < kNumOpKinds; ++i) {
    const OpKind k = static_cast<OpKind>(i);
    EXPECT_EQ(opInfo(k).isComposite(), vjpKind(k) == VjpKind::Decompose) << opName(k);
  }
}

TEST(AutodiffTest, NonDifferentiableOpsAreDeclared) {
  for (OpKind k : {OpKind::Sign,        OpKind::Floor,    OpKind::Ceil,
                   OpKind::Round,       OpKind::Not,      OpKind::IsNan,
                   OpKind::IsInf,       OpKind::And,      OpKind::Or,
                   OpKind::Xor,         OpKind::Eq,       OpKind::Ne,
                   OpKind::Lt,          OpKind::Le,       OpKind::Gt,
                   OpKind::Ge,          OpKind::Constant, OpKind::Iota,
                   OpKind::ArgMax,      OpKind::ArgMin,   OpKind::RandomUniform,
                   OpKind::RandomNormal})
    EXPECT_EQ(vjpKind(k), VjpKind::NotDifferentiable) << opName(k);
  // fused ops come after autodiff in every pipeline.
  EXPECT_EQ(vjpKind(OpKind::Fused), VjpKind::Unsupported);
  for (OpKind k : {OpKind::Softmax, OpKind::LayerNorm, OpKind::Lstm, OpKind::CrossEntropy})
    EXPECT_EQ(vjpKind(k), VjpKind::Decompose) << opName(k);
  for (OpKind k : {OpKind::Exp, OpKind::MatMul, OpKind::Conv, OpKind::ConvTranspose, OpKind::MaxPool, OpKind::AvgPool,
                   OpKind::Gather, OpKind::Select, OpKind::Cast})
    EXPECT_EQ(vjpKind(k), VjpKind::Rule) << opName(k);
  // A path through argmax carries no gradient: the result is zeros.
  expectGradientsMatch({"%x: f64[3,4]",
                        "  %i = argmax(%x) {axis = 1} : i64[3]\n  %c = cast(%i) : f64[3]\n"
                        "  %f = floor(%x) : f64[3,4]\n  %s = reduce_sum(%f) {axes = [1]} : f64[3]\n"
                        "  %out = add(%c, %s) : f64[3]",
                        "f64[3]",
                        {"x"}});
}

std::string errorOf(const std::string& text, AutodiffOptions options = {}) {
  auto m = parseModule(text, "e.kir");
  EXPECT_TRUE(m.ok());
  if (!m.ok()) return "";
  Status s = differentiateFunction(*(*m)->functions()[0], options);
  EXPECT_FALSE(s.ok());
  return s.ok() ? "" : s.error().str();
}

TEST(AutodiffTest, ErrorsNameTheProblem) {
  EXPECT_NE(errorOf("func @f(%w: f32[3] = dense<f32[3]>[1, 2, 3]) -> f32[3] {\n %e = exp(%w) : f32[3]\n return %e\n}")
                .find("is f32[3], expected a scalar f32[] or f64[]"),
            std::string::npos);
  EXPECT_NE(errorOf("func @f(%w: i64[] = dense<i64[]>[1]) -> i64[] {\n return %w\n}").find("expected a scalar"),
            std::string::npos);
  EXPECT_NE(errorOf("func @f(%x: f32[3]) -> f32[] {\n %s = reduce_sum(%x) {axes = []} : f32[]\n return %s\n}")
                .find("no parameters to differentiate"),
            std::string::npos);
  EXPECT_NE(errorOf("func @f(%x: f32[3]) -> f32[] {\n %s = reduce_sum(%x) {axes = []} : f32[]\n return %s\n}",
                    AutodiffOptions{std::vector<std::string>{"y"}, 0})
                .find("has no argument %y"),
            std::string::npos);
  std::string unsupported = errorOf(
      "func @f(%x: f32[1,1,N,4]) -> f32[] {\n"
      " %p = pad(%x) {pads = [0, 0, 1, 1, 0, 0, 1, 1], mode = \"reflect\"} : f32[1,1,?,6]\n"
      " %s = reduce_sum(%p) {axes = []} : f32[]\n return %s\n}",
      AutodiffOptions{std::vector<std::string>{"x"}, 0});
  EXPECT_NE(unsupported.find("'pad' cannot be differentiated"), std::string::npos) << unsupported;
  EXPECT_NE(unsupported.find("the gradient of pad needs static shapes, got f32[1,1,N,4]"), std::string::npos)
      << unsupported;
}

TEST(AutodiffTest, FailureLeavesNoBackwardOps) {
  auto m = parseModule(
      "func @f(%x: f32[1,1,N,4]) -> f32[] {\n %e = exp(%x) : f32[1,1,N,4]\n"
      " %p = pad(%e) {pads = [0, 0, 1, 1, 0, 0, 1, 1], mode = \"reflect\"} : f32[1,1,?,6]\n %s = reduce_sum(%p) {axes "
      "= []} : f32[]\n return %s\n}",
      "e.kir");
  ASSERT_TRUE(m.ok());
  Function& f = *(*m)->functions()[0];
  std::string before = print(f);
  EXPECT_FALSE(differentiateFunction(f, AutodiffOptions{std::vector<std::string>{"x"}, 0}).ok());
  EXPECT_EQ(print(f), before);
}

}  // namespace
}  // namespace kiln
