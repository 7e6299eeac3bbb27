// Numerical equivalence of the `decompose` pass: every composite op, in
// several shapes and attribute settings, is parsed twice from text IR, one
// copy is decomposed, and both run through the reference interpreter on the
// same fixed-seed random inputs (in f64 with tight tolerances and in f32 with
// rtol 1e-5 / atol 1e-6). Each decomposed module must verify and contain no
// composite op. Also tested: errors (an unrollable RNN, bad attributes)
// leave the function untouched, locations carry over, primitives stay put.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>

#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Decompose.h"
#include "passes/Pass.h"
#include "runtime/Interpreter.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

/// How a case's inputs are drawn. Integer arguments are class labels in
/// [0, numClasses), every third one replaced by `ignoreIndex`; bool
/// arguments are masks (true with probability 3/4); float arguments are
/// uniform in [-2, 2], except that names starting with `var` are variances
/// in [0.1, 2] and names starting with `wide` are uniform in [-40, 40].
struct InputSpec {
  int64_t numClasses = 0;
  int64_t ignoreIndex = -100;
  /// Sizes of symbolic dims of the arguments.
  std::map<std::string, int64_t> symbols;
};

InputSpec labels(int64_t numClasses, int64_t ignoreIndex = -100) {
  InputSpec spec;
  spec.numClasses = numClasses;
  spec.ignoreIndex = ignoreIndex;
  return spec;
}

/// `spec` with symbolic dim `symbol` bound to `size`.
InputSpec bind(std::string symbol, int64_t size, InputSpec spec = {}) {
  spec.symbols[std::move(symbol)] = size;
  return spec;
}

struct Tolerance {
  double rtol, atol;
};

using test::parseOk;

/// Runs the `decompose` pass as kiln-opt would.
Expected<bool> runDecompose(Module& m) { return createDecomposePass()->run(m, PassContext{}); }

std::vector<int64_t> concreteDims(const TensorType& type, const InputSpec& spec) {
  std::vector<int64_t> dims;
  for (const Dim& d : type.shape) {
    if (d.isStatic()) {
      dims.push_back(d.size);
    } else {
      auto it = spec.symbols.find(d.symbol);
      EXPECT_TRUE(it != spec.symbols.end()) << "no size given for dim '" << d.str() << "'";
      dims.push_back(it != spec.symbols.end() ? it->second : 1);
    }
  }
  return dims;
}

std::vector<Tensor> randomInputs(const Function& f, const InputSpec& spec, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> inputs;
  for (Value* arg : f.arguments()) {
    Tensor t(arg->type().dtype, concreteDims(arg->type(), spec));
    const std::string& name = arg->name();
    for (int64_t i = 0; i < t.numElements(); ++i) {
      if (t.dtype() == DType::Bool) {
        t.setInt(i, std::uniform_int_distribution<int>(0, 3)(rng) != 0);
      } else if (isInteger(t.dtype())) {
        int64_t label = std::uniform_int_distribution<int64_t>(0, spec.numClasses - 1)(rng);
        t.setInt(i, i % 3 == 1 ? spec.ignoreIndex : label);
      } else if (name.starts_with("var")) {
        t.setDouble(i, std::uniform_real_distribution<double>(0.1, 2.0)(rng));
      } else if (name.starts_with("wide")) {
        t.setDouble(i, std::uniform_real_distribution<double>(-40.0, 40.0)(rng));
      } else {
        t.setDouble(i, std::uniform_real_distribution<double>(-2.0, 2.0)(rng));
      }
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

bool hasComposite(const Module& m) {
  for (auto& f : m.functions())
    for (auto& op : f->ops())
      if (op->info().isComposite()) return true;
  return false;
}

/// `ir` with every `T` dtype placeholder (written `T[`) replaced by `dtype`.
std::string withDType(std::string ir, std::string_view dtype) {
  for (size_t pos = 0; (pos = ir.find("T[", pos)) != std::string::npos; pos += dtype.size()) ir.replace(pos, 1, dtype);
  return ir;
}

/// Checks that decomposing the single function of `ir` preserves its results.
void expectEquivalent(const std::string& ir, const InputSpec& spec, Tolerance tol) {
  auto original = parseOk(ir);
  auto decomposed = parseOk(ir);
  ASSERT_TRUE(original && decomposed);
  Status valid = verify(*original);
  ASSERT_TRUE(valid.ok()) << valid.error().str() << "\n" << ir;

  auto changed = runDecompose(*decomposed);
  ASSERT_TRUE(changed.ok()) << changed.error().str() << "\n" << ir;
  EXPECT_TRUE(*changed);
  EXPECT_FALSE(hasComposite(*decomposed)) << print(*decomposed);
  Status verified = verify(*decomposed);
  ASSERT_TRUE(verified.ok()) << verified.error().str() << "\n" << print(*decomposed);

  const Function& f = *original->functions()[0];
  std::vector<Tensor> inputs = randomInputs(f, spec, /*seed=*/20240611);
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str() << "\n" << ir;
  auto got = interpret(*decomposed->functions()[0], inputs);
  ASSERT_TRUE(got.ok()) << got.error().str() << "\n" << print(*decomposed);
  ASSERT_EQ(got->size(), want->size());
  for (size_t r = 0; r < want->size(); ++r) {
    const Tensor& w = (*want)[r];
    const Tensor& g = (*got)[r];
    ASSERT_EQ(g.dtype(), w.dtype()) << "result " << r;
    ASSERT_EQ(g.shape(), w.shape()) << "result " << r;
    int mismatches = 0, finite = 0;
    for (int64_t i = 0; i < w.numElements() && mismatches < 5; ++i) {
      double a = g.getDouble(i), b = w.getDouble(i);
      finite += std::isfinite(b);
      bool same = (std::isnan(a) && std::isnan(b)) || a == b || std::abs(a - b) <= tol.atol + tol.rtol * std::abs(b);
      if (!same) ++mismatches;
      EXPECT_TRUE(same) << "result " << r << " element " << i << ": decomposed " << a << ", reference " << b << "\n"
                        << ir;
    }
    EXPECT_GT(finite, 0) << "result " << r << " has no finite element to compare\n" << ir;
  }
}

/// One composite in one setting, written with the dtype placeholder `T`.
struct Case {
  std::string name;
  std::string ir;
  InputSpec spec = {};
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DecomposeEquivalence : public testing::TestWithParam<Case> {};

TEST_P(DecomposeEquivalence, F64) {
  expectEquivalent(withDType(GetParam().ir, "f64"), GetParam().spec, {1e-10, 1e-12});
}

TEST_P(DecomposeEquivalence, F32) { expectEquivalent(withDType(GetParam().ir, "f32"), GetParam().spec, {1e-5, 1e-6}); }

/// A function of one op: `%r = <op>` over `args`, returning its result(s).
std::string fn(const std::string& args, const std::string& results, const std::string& body) {
  return "func @f(" + args + ") -> " + results + " {\n  " + body + "\n}\n";
}

const Case kCases[] = {
    // --- softmax / log_softmax
    {"softmax_last", fn("%x: T[2,3,5]", "T[2,3,5]", "%y = softmax(%x) : T[2,3,5]\n  return %y")},
    {"softmax_axis0", fn("%x: T[4,3]", "T[4,3]", "%y = softmax(%x) {axis = 0} : T[4,3]\n  return %y")},
    {"softmax_wide", fn("%wide: T[3,7]", "T[3,7]", "%y = softmax(%wide) {axis = 1} : T[3,7]\n  return %y")},
    {"softmax_symbolic_batch", fn("%x: T[N,5]", "T[N,5]", "%y = softmax(%x) : T[N,5]\n  return %y"), bind("N", 3)},
    {"log_softmax_last", fn("%wide: T[3,6]", "T[3,6]", "%y = log_softmax(%wide) : T[3,6]\n  return %y")},
    {"log_softmax_middle", fn("%x: T[2,4,3]", "T[2,4,3]", "%y = log_softmax(%x) {axis = -2} : T[2,4,3]\n  return %y")},
    // --- layer_norm / batch_norm
    {"layer_norm_scale_bias",
     fn("%x: T[2,3,4], %s: T[4], %b: T[4]", "T[2,3,4]", "%y = layer_norm(%x, %s, %b) : T[2,3,4]\n  return %y")},
    {"layer_norm_two_axes_scale_only",
     fn("%x: T[2,3,4], %s: T[3,4]", "T[2,3,4]",
        "%y = layer_norm(%x, %s) {axis = 1, epsilon = 0.001} : T[2,3,4]\n  return %y")},
    {"layer_norm_plain", fn("%x: T[5,6]", "T[5,6]", "%y = layer_norm(%x) : T[5,6]\n  return %y")},
    {"layer_norm_symbolic_batch",
     fn("%x: T[B,6], %s: T[6], %b: T[6]", "T[B,6]", "%y = layer_norm(%x, %s, %b) : T[B,6]\n  return %y"), bind("B", 2)},
    {"batch_norm_4d", fn("%x: T[2,3,4,4], %s: T[3], %b: T[3], %m: T[3], %var: T[3]", "T[2,3,4,4]",
                         "%y = batch_norm(%x, %s, %b, %m, %var) : T[2,3,4,4]\n  return %y")},
    {"batch_norm_2d", fn("%x: T[5,3], %s: T[3], %b: T[3], %m: T[3], %var: T[3]", "T[5,3]",
                         "%y = batch_norm(%x, %s, %b, %m, %var) {epsilon = 0.01} : T[5,3]\n  return %y")},
    {"batch_norm_symbolic_batch",
     fn("%x: T[N,2,5], %s: T[2], %b: T[2], %m: T[2], %var: T[2]", "T[N,2,5]",
        "%y = batch_norm(%x, %s, %b, %m, %var) : T[N,2,5]\n  return %y"),
     bind("N", 3)},
    // --- activations
    {"gelu_erf", fn("%x: T[3,8]", "T[3,8]", "%y = gelu(%x) : T[3,8]\n  return %y")},
    {"gelu_tanh", fn("%x: T[3,8]", "T[3,8]", "%y = gelu(%x) {approximate = \"tanh\"} : T[3,8]\n  return %y")},
    {"silu", fn("%x: T[4,5]", "T[4,5]", "%y = silu(%x) : T[4,5]\n  return %y")},
    {"leaky_relu", fn("%x: T[4,5]", "T[4,5]", "%y = leaky_relu(%x) {alpha = 0.2} : T[4,5]\n  return %y")},
    {"leaky_relu_default", fn("%x: T[7]", "T[7]", "%y = leaky_relu(%x) : T[7]\n  return %y")},
    {"elu", fn("%x: T[4,5]", "T[4,5]", "%y = elu(%x) {alpha = 0.7} : T[4,5]\n  return %y")},
    {"softplus", fn("%x: T[4,5]", "T[4,5]", "%y = softplus(%x) : T[4,5]\n  return %y")},
    {"softplus_wide", fn("%wide: T[6,6]", "T[6,6]", "%y = softplus(%wide) : T[6,6]\n  return %y")},
    // --- recurrent: X[seq,batch,in], W[dirs,G*H,in], R[dirs,G*H,H], B[dirs,2*G*H], h0[dirs,batch,H]
    {"rnn_tanh", fn("%x: T[3,2,4], %w: T[1,5,4], %r: T[1,5,5], %b: T[1,10], %h: T[1,2,5]", "(T[3,1,2,5], T[1,2,5])",
                    "%y, %yh = rnn(%x, %w, %r, %b, %h) {hidden_size = 5} : T[3,1,2,5], T[1,2,5]\n  return %y, %yh")},
    {"rnn_relu_reverse",
     fn("%x: T[4,3,2], %w: T[1,3,2], %r: T[1,3,3], %b: T[1,6], %h: T[1,3,3]", "(T[4,1,3,3], T[1,3,3])",
        "%y, %yh = rnn(%x, %w, %r, %b, %h) {activation = \"relu\", direction = \"reverse\", "
        "hidden_size = 3} : T[4,1,3,3], T[1,3,3]\n  return %y, %yh")},
    {"rnn_sigmoid_bidirectional",
     fn("%x: T[2,1,3], %w: T[2,4,3], %r: T[2,4,4], %b: T[2,8], %h: T[2,1,4]", "(T[2,2,1,4], T[2,1,4])",
        "%y, %yh = rnn(%x, %w, %r, %b, %h) {activation = \"sigmoid\", direction = "
        "\"bidirectional\", hidden_size = 4} : T[2,2,1,4], T[2,1,4]\n  return %y, %yh")},
    {"lstm_forward", fn("%x: T[3,2,4], %w: T[1,20,4], %r: T[1,20,5], %b: T[1,40], %h: T[1,2,5], %c: T[1,2,5]",
                        "(T[3,1,2,5], T[1,2,5], T[1,2,5])",
                        "%y, %yh, %yc = lstm(%x, %w, %r, %b, %h, %c) {hidden_size = 5} : T[3,1,2,5], T[1,2,5], "
                        "T[1,2,5]\n  return %y, %yh, %yc")},
    {"lstm_reverse", fn("%x: T[4,1,3], %w: T[1,8,3], %r: T[1,8,2], %b: T[1,16], %h: T[1,1,2], %c: T[1,1,2]",
                        "(T[4,1,1,2], T[1,1,2], T[1,1,2])",
                        "%y, %yh, %yc = lstm(%x, %w, %r, %b, %h, %c) {direction = \"reverse\", hidden_size = 2} : "
                        "T[4,1,1,2], T[1,1,2], T[1,1,2]\n  return %y, %yh, %yc")},
    {"lstm_bidirectional", fn("%x: T[3,2,4], %w: T[2,12,4], %r: T[2,12,3], %b: T[2,24], %h: T[2,2,3], %c: T[2,2,3]",
                              "(T[3,2,2,3], T[2,2,3], T[2,2,3])",
                              "%y, %yh, %yc = lstm(%x, %w, %r, %b, %h, %c) {direction = \"bidirectional\", "
                              "hidden_size = 3} : T[3,2,2,3], T[2,2,3], T[2,2,3]\n  return %y, %yh, %yc")},
    {"lstm_symbolic_batch",
     fn("%x: T[2,B,3], %w: T[1,8,3], %r: T[1,8,2], %b: T[1,16], %h: T[1,B,2], %c: T[1,B,2]",
        "(T[2,1,B,2], T[1,B,2], T[1,B,2])",
        "%y, %yh, %yc = lstm(%x, %w, %r, %b, %h, %c) {hidden_size = 2} : T[2,1,B,2], T[1,B,2], "
        "T[1,B,2]\n  return %y, %yh, %yc"),
     bind("B", 3)},
    {"gru_forward",
     fn("%x: T[3,2,4], %w: T[1,15,4], %r: T[1,15,5], %b: T[1,30], %h: T[1,2,5]", "(T[3,1,2,5], T[1,2,5])",
        "%y, %yh = gru(%x, %w, %r, %b, %h) {hidden_size = 5} : T[3,1,2,5], T[1,2,5]\n  return %y, %yh")},
    {"gru_linear_before_reset",
     fn("%x: T[3,2,4], %w: T[1,15,4], %r: T[1,15,5], %b: T[1,30], %h: T[1,2,5]", "(T[3,1,2,5], T[1,2,5])",
        "%y, %yh = gru(%x, %w, %r, %b, %h) {hidden_size = 5, linear_before_reset = true} : "
        "T[3,1,2,5], T[1,2,5]\n  return %y, %yh")},
    {"gru_bidirectional",
     fn("%x: T[2,3,2], %w: T[2,9,2], %r: T[2,9,3], %b: T[2,18], %h: T[2,3,3]", "(T[2,2,3,3], T[2,3,3])",
        "%y, %yh = gru(%x, %w, %r, %b, %h) {direction = \"bidirectional\", hidden_size = 3} : "
        "T[2,2,3,3], T[2,3,3]\n  return %y, %yh")},
    {"gru_reverse_linear_before_reset",
     fn("%x: T[4,1,2], %w: T[1,6,2], %r: T[1,6,2], %b: T[1,12], %h: T[1,1,2]", "(T[4,1,1,2], T[1,1,2])",
        "%y, %yh = gru(%x, %w, %r, %b, %h) {direction = \"reverse\", hidden_size = 2, "
        "linear_before_reset = true} : T[4,1,1,2], T[1,1,2]\n  return %y, %yh")},
    // --- attention: q[..., Lq, D], k[..., Lk, D], v[..., Lk, Dv]
    {"attention_default_scale",
     fn("%q: T[2,4,8], %k: T[2,6,8], %v: T[2,6,3]", "T[2,4,3]", "%o = attention(%q, %k, %v) : T[2,4,3]\n  return %o")},
    {"attention_explicit_scale_4d", fn("%q: T[2,2,3,4], %k: T[2,2,5,4], %v: T[2,2,5,4]", "T[2,2,3,4]",
                                       "%o = attention(%q, %k, %v) {scale = 0.3} : T[2,2,3,4]\n  return %o")},
    {"attention_causal", fn("%q: T[2,5,4], %k: T[2,5,4], %v: T[2,5,4]", "T[2,5,4]",
                            "%o = attention(%q, %k, %v) {causal = true} : T[2,5,4]\n  return %o")},
    {"attention_causal_rectangular", fn("%q: T[3,4], %k: T[5,4], %v: T[5,2]", "T[3,2]",
                                        "%o = attention(%q, %k, %v) {causal = true} : T[3,2]\n  return %o")},
    {"attention_bool_mask", fn("%q: T[2,4,8], %k: T[2,6,8], %v: T[2,6,8], %m: bool[4,6]", "T[2,4,8]",
                               "%o = attention(%q, %k, %v, %m) : T[2,4,8]\n  return %o")},
    {"attention_float_mask_broadcast", fn("%q: T[2,2,4,8], %k: T[2,2,6,8], %v: T[2,2,6,8], %m: T[2,1,4,6]",
                                          "T[2,2,4,8]", "%o = attention(%q, %k, %v, %m) : T[2,2,4,8]\n  return %o")},
    {"attention_causal_and_mask",
     fn("%q: T[4,4], %k: T[4,4], %v: T[4,3], %m: T[4,4]", "T[4,3]",
        "%o = attention(%q, %k, %v, %m) {causal = true, scale = 1.5} : T[4,3]\n  return %o")},
    {"attention_symbolic_batch",
     fn("%q: T[N,4,8], %k: T[N,6,8], %v: T[N,6,8]", "T[N,4,8]", "%o = attention(%q, %k, %v) : T[N,4,8]\n  return %o"),
     bind("N", 2)},
    // --- losses
    {"cross_entropy_mean", fn("%x: T[6,5], %l: i64[6]", "T[]", "%y = cross_entropy(%x, %l) : T[]\n  return %y"),
     labels(5)},
    {"cross_entropy_sum",
     fn("%x: T[6,5], %l: i64[6]", "T[]", "%y = cross_entropy(%x, %l) {reduction = \"sum\"} : T[]\n  return %y"),
     labels(5)},
    {"cross_entropy_none",
     fn("%x: T[6,5], %l: i64[6]", "T[6]", "%y = cross_entropy(%x, %l) {reduction = \"none\"} : T[6]\n  return %y"),
     labels(5)},
    {"cross_entropy_label_smoothing",
     fn("%x: T[6,5], %l: i64[6]", "T[]", "%y = cross_entropy(%x, %l) {label_smoothing = 0.1} : T[]\n  return %y"),
     labels(5)},
    {"cross_entropy_spatial_i32_ignore",
     fn("%x: T[2,3,4], %l: i32[2,4]", "T[2,4]",
        "%y = cross_entropy(%x, %l) {ignore_index = 1, label_smoothing = 0.2, "
        "reduction = \"none\"} : T[2,4]\n  return %y"),
     labels(3, 1)},
    {"cross_entropy_spatial_mean",
     fn("%x: T[2,3,2,2], %l: i64[2,2,2]", "T[]",
        "%y = cross_entropy(%x, %l) {label_smoothing = 0.05} : T[]\n  return %y"),
     labels(3)},
    {"cross_entropy_symbolic_batch",
     fn("%x: T[N,4], %l: i64[N]", "T[]", "%y = cross_entropy(%x, %l) : T[]\n  return %y"), bind("N", 5, labels(4))},
    {"nll_loss_mean", fn("%x: T[6,5], %l: i64[6]", "T[]", "%y = nll_loss(%x, %l) : T[]\n  return %y"), labels(5)},
    {"nll_loss_sum",
     fn("%x: T[6,5], %l: i64[6]", "T[]", "%y = nll_loss(%x, %l) {reduction = \"sum\"} : T[]\n  return %y"), labels(5)},
    {"nll_loss_none_spatial",
     fn("%x: T[2,3,4], %l: i32[2,4]", "T[2,4]",
        "%y = nll_loss(%x, %l) {ignore_index = 0, reduction = \"none\"} : T[2,4]\n  return %y"),
     labels(3, 0)},
    {"mse_loss_mean", fn("%a: T[3,4], %b: T[3,4]", "T[]", "%y = mse_loss(%a, %b) : T[]\n  return %y")},
    {"mse_loss_sum",
     fn("%a: T[3,4], %b: T[3,4]", "T[]", "%y = mse_loss(%a, %b) {reduction = \"sum\"} : T[]\n  return %y")},
    {"mse_loss_none", fn("%a: T[2,3,2], %b: T[2,3,2]", "T[2,3,2]",
                         "%y = mse_loss(%a, %b) {reduction = \"none\"} : T[2,3,2]\n  return %y")},
    // --- quantization: scales are positive (`var`), x wide enough to saturate
    {"quantize_per_tensor",
     fn("%wide: T[3,4], %var: T[], %z: u8[]", "u8[3,4]", "%y = quantize(%wide, %var, %z) : u8[3,4]\n  return %y"),
     labels(50)},
    {"quantize_per_axis_i8",
     fn("%wide: T[2,3,4], %var: T[3], %z: i8[3]", "i8[2,3,4]",
        "%y = quantize(%wide, %var, %z) : i8[2,3,4]\n  return %y"),
     labels(20)},
    {"dequantize_per_axis",
     fn("%x: u8[2,3,4], %var: T[4], %z: u8[4]", "T[2,3,4]",
        "%y = dequantize(%x, %var, %z) {axis = 2} : T[2,3,4]\n  return %y"),
     labels(200)},
    {"dequantize_i32", fn("%x: i32[5], %var: T[], %z: i32[]", "T[5]", "%y = dequantize(%x, %var, %z) : T[5]\n  return %y"),
     labels(1000)},
};

INSTANTIATE_TEST_SUITE_P(AllComposites, DecomposeEquivalence, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(DecomposeTest, EveryCompositeIsCovered) {
  std::set<std::string> covered;
  for (const Case& c : kCases) {
    auto m = parseOk(withDType(c.ir, "f32"));
    ASSERT_TRUE(m);
    for (auto& op : m->functions()[0]->ops()) covered.insert(std::string(op->name()));
  }
  for (const OpInfo& info : allOps()) {
    if (!info.isComposite()) continue;
    EXPECT_TRUE(covered.count(std::string(info.mnemonic))) << info.mnemonic << " has no case";
  }
}

TEST(DecomposeTest, CompositesInsideLargerFunctionsAllExpand) {
  auto m = parseOk(
      "func @f(%x: f64[4,6], %l: i64[4]) -> (f64[], f64[4,6]) {\n"
      "  %a = gelu(%x) : f64[4,6]\n"
      "  %b = layer_norm(%a) : f64[4,6]\n"
      "  %c = cross_entropy(%b, %l) : f64[]\n"
      "  %d = softmax(%b) : f64[4,6]\n"
      "  return %c, %d\n"
      "}\n");
  ASSERT_TRUE(m);
  auto reference = parseOk(print(*m));
  ASSERT_TRUE(reference);
  auto changed = runDecompose(*m);
  ASSERT_TRUE(changed.ok()) << changed.error().str();
  EXPECT_FALSE(hasComposite(*m));
  ASSERT_TRUE(verify(*m).ok());
  InputSpec spec = labels(6);
  auto inputs = randomInputs(*reference->functions()[0], spec, 7);
  auto want = interpret(*reference->functions()[0], inputs);
  auto got = interpret(*m->functions()[0], inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  for (size_t r = 0; r < 2; ++r)
    for (int64_t i = 0; i < (*want)[r].numElements(); ++i)
      EXPECT_NEAR((*got)[r].getDouble(i), (*want)[r].getDouble(i), 1e-12);
}

TEST(DecomposeTest, PrimitiveOnlyFunctionIsUnchanged) {
  const std::string ir =
      "func @f(%x: f32[2,3]) -> f32[2] {\n"
      "  %e = exp(%x) : f32[2,3]\n"
      "  %s = reduce_sum(%e) {axes = [1]} : f32[2]\n"
      "  return %s\n"
      "}\n";
  auto m = parseOk(ir);
  ASSERT_TRUE(m);
  std::string before = print(*m);
  auto changed = runDecompose(*m);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(print(*m), before);
}

TEST(DecomposeTest, NewOpsKeepTheCompositeLocation) {
  auto m = parseOk(
      "func @f(%x: f32[2,3]) -> f32[2,3] {\n"
      "  %y = softmax(%x) : f32[2,3] loc(\"model.onnx\":\"Softmax_3\")\n"
      "  return %y\n"
      "}\n");
  ASSERT_TRUE(m);
  ASSERT_TRUE(runDecompose(*m).ok());
  int expanded = 0;
  for (auto& op : m->functions()[0]->ops()) {
    if (op->kind() == OpKind::Return) continue;
    ++expanded;
    EXPECT_EQ(op->loc(), Location::named("Softmax_3", "model.onnx")) << printOp(*op);
  }
  EXPECT_GE(expanded, 5);  // reduce_max, sub, exp, reduce_sum, div
}

TEST(DecomposeTest, DecomposedResultKeepsTheDeclaredType) {
  // The result's declared type is what its users were checked against.
  auto m = parseOk(
      "func @f(%x: f32[N,5]) -> f32[N,5] {\n"
      "  %y = silu(%x) : f32[N,5]\n"
      "  return %y\n"
      "}\n");
  ASSERT_TRUE(m);
  ASSERT_TRUE(runDecompose(*m).ok());
  Op* ret = m->functions()[0]->returnOp();
  EXPECT_EQ(ret->operand(0)->type().str(), "f32[N,5]");
  EXPECT_TRUE(verify(*m).ok());
}

/// Decomposing `ir` fails with an error mentioning `message`, at the
/// composite's location, and leaves the module as it was.
void expectDecomposeError(const std::string& ir, const std::string& message) {
  auto m = parseOk(ir);
  ASSERT_TRUE(m);
  std::string before = print(*m);
  auto changed = runDecompose(*m);
  ASSERT_FALSE(changed.ok()) << "decomposed unexpectedly:\n" << print(*m);
  EXPECT_NE(changed.error().message().find(message), std::string::npos) << changed.error().str();
  EXPECT_EQ(changed.error().location().line, 2) << changed.error().str();
  EXPECT_EQ(print(*m), before);
  EXPECT_TRUE(verify(*m).ok());
}

TEST(DecomposeTest, RecurrenceWithUnknownSequenceLengthIsAnError) {
  expectDecomposeError(
      "func @f(%x: f32[?,2,3], %w: f32[1,8,3], %r: f32[1,8,2], %b: f32[1,16], %h: f32[1,2,2], %c: f32[1,2,2]) -> "
      "f32[1,2,2] {\n"
      "  %y, %yh, %yc = lstm(%x, %w, %r, %b, %h, %c) {hidden_size = 2} : f32[?,1,2,2], f32[1,2,2], f32[1,2,2]\n"
      "  return %yh\n"
      "}\n",
      "'lstm' cannot be decomposed: the sequence length must be static");
}

TEST(DecomposeTest, AttentionDefaultScaleNeedsStaticHeadSize) {
  expectDecomposeError(
      "func @f(%q: f32[2,4,?], %k: f32[2,6,?], %v: f32[2,6,3]) -> f32[2,4,3] {\n"
      "  %o = attention(%q, %k, %v) : f32[2,4,3]\n"
      "  return %o\n"
      "}\n",
      "static head size");
}

TEST(DecomposeTest, FailedLoweringIsUndone) {
  // The causal mask is checked after the scores (transpose, matmul, scale)
  // have been emitted; those must be erased again.
  expectDecomposeError(
      "func @f(%q: f32[2,?,4], %k: f32[2,?,4], %v: f32[2,?,3]) -> f32[2,?,3] {\n"
      "  %o = attention(%q, %k, %v) {causal = true} : f32[2,?,3]\n"
      "  return %o\n"
      "}\n",
      "a causal mask needs static or named query and key lengths");
}

/// Runs the decomposed form of the one-op function `op` on x (dtype `dtype`)
/// and returns its result, each element rounded to `dtype` by every op as
/// the backends round it.
std::vector<double> runDecomposed(const std::string& op, const std::string& dtype, const std::vector<double>& x) {
  const std::string n = std::to_string(x.size());
  const std::string type = dtype + "[" + n + "]";
  auto m = parseOk("func @f(%x: " + type + ") -> " + type + " {\n  %y = " + op + " : " + type +
                   "\n  return %y\n}\n");
  if (!m) return {};
  auto changed = runDecompose(*m);
  EXPECT_TRUE(changed.ok() && *changed);
  Tensor t(dtype == "f32" ? DType::F32 : DType::F64, {static_cast<int64_t>(x.size())});
  for (size_t i = 0; i < x.size(); ++i) t.setDouble(static_cast<int64_t>(i), x[i]);
  auto got = interpret(*m->functions()[0], {t});
  EXPECT_TRUE(got.ok()) << (got.ok() ? "" : got.error().str());
  std::vector<double> out;
  if (got.ok())
    for (int64_t i = 0; i < (*got)[0].numElements(); ++i) out.push_back((*got)[0].getDouble(i));
  return out;
}

/// `got` matches `want` (PyTorch's values: expm1 and log1p in f64) within
/// `rtol`, NaN matching NaN and infinities exactly.
void expectClose(const std::vector<double>& x, const std::vector<double>& got, const std::vector<double>& want,
                 double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "x = " << x[i];
    } else if (std::isinf(want[i]) || want[i] == 0) {
      EXPECT_EQ(got[i], want[i]) << "x = " << x[i];
    } else {
      EXPECT_LE(std::abs(got[i] - want[i]), rtol * std::abs(want[i]))
          << "x = " << x[i] << ": decomposed " << got[i] << ", expected " << want[i];
    }
  }
}

TEST(DecomposeTest, EluKeepsTheDigitsOfExpm1NearZero) {
  // exp(x) - 1 lost them: 3e-6 relative error at x = -4e-4 in f32, and 0
  // for -1e-39 in f64 where PyTorch's alpha * expm1(x) gives alpha * x.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> x = {-4e-4, -1e-7, -3e-3, -0.5, -1, -5, -16.5, -17.5, -30, -200, -inf, nan, 0, 2, inf};
  std::vector<double> want;
  for (double v : x) {
    const double v32 = static_cast<float>(v);  // the f32 input
    want.push_back(v32 < 0 ? 0.7 * std::expm1(v32) : v32);
  }
  expectClose(x, runDecomposed("elu(%x) {alpha = 0.7}", "f32", x), want, 5e-7);
  std::vector<double> x64 = x;
  x64.push_back(-1e-39);
  x64.push_back(-1e-300);
  want.clear();
  for (double v : x64) want.push_back(v < 0 ? 0.7 * std::expm1(v) : v);
  expectClose(x64, runDecomposed("elu(%x) {alpha = 0.7}", "f64", x64), want, 1e-15);
}

TEST(DecomposeTest, SoftplusKeepsExpOfLargeNegativeX) {
  // log(1 + e^x) rounded to 0 below x = -17 in f32 (softplus(-26.78) gave 0,
  // not PyTorch's 2.342e-12).
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> x = {-26.78, -17.5, -40, -87, -100, -1e-3, 0, 1e-3, 0.5, 3, 15, 30, 100, -inf, inf, nan};
  std::vector<double> want;
  for (double v : x) {
    const double v32 = static_cast<float>(v);  // the f32 input
    want.push_back(std::max(v32, 0.0) + std::log1p(std::exp(-std::abs(v32))));
  }
  want[4] = static_cast<double>(static_cast<float>(std::exp(-100.0)));  // e^-100 is an f32 denormal: 37 ulps of 0
  expectClose(x, runDecomposed("softplus(%x)", "f32", x), want, 5e-7);
  std::vector<double> x64 = x;
  x64.push_back(-700);
  want.clear();
  for (double v : x64) want.push_back(std::max(v, 0.0) + std::log1p(std::exp(-std::abs(v))));
  expectClose(x64, runDecomposed("softplus(%x)", "f64", x64), want, 1e-15);
}

TEST(DecomposeTest, DecomposeOpRejectsPrimitives) {
  auto m = parseOk("func @f(%x: f32[3]) -> f32[3] {\n  %y = exp(%x) : f32[3]\n  return %y\n}\n");
  ASSERT_TRUE(m);
  Op* exp = m->functions()[0]->ops().front().get();
  Status s = decomposeOp(*exp);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("'exp' is a primitive op"), std::string::npos) << s.error().str();
}

}  // namespace
}  // namespace kiln
