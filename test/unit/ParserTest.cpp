// Tests of the text IR parser and printer: exact round trips of every
// attribute kind, dtype, location kind and float edge value, the printer's
// value naming, error messages with their file:line:col, and robustness
// against truncated and garbled input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "ir/Parser.h"
#include "ir/Printer.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

using test::parseOk;

/// The full `file:line:col: error: message` text of a parse that must fail.
std::string parseError(std::string_view text, int firstLine = 1) {
  auto m = parseModule(text, "test.kir", firstLine);
  EXPECT_FALSE(m.ok()) << "parsed unexpectedly:\n" << text;
  return m.ok() ? std::string() : m.error().str();
}

/// Checks that `text` parses and prints back exactly as written.
void expectRoundTrip(const std::string& text) {
  auto m = parseOk(text);
  ASSERT_TRUE(m);
  std::string printed = print(*m);
  EXPECT_EQ(printed, text);
  auto again = parseOk(printed);
  ASSERT_TRUE(again);
  EXPECT_EQ(print(*again), printed);
}

/// A one-function module whose body is `body` (ops, two-space indented).
std::string wrap(const std::string& signature, const std::string& body) {
  return "func @f" + signature + " {\n" + body + "}\n";
}

const Op& firstOp(const Module& m) { return *m.functions()[0]->ops().front(); }

uint64_t bitsOf(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

// --- Round trips ---------------------------------------------------------------

TEST(ParserTest, RoundTripsSimpleFunction) {
  expectRoundTrip(wrap("(%a: f32[2], %b: f32[2]) -> f32[2]",
                       "  %c = add(%a, %b) : f32[2]\n"
                       "  return %c\n"));
}

TEST(ParserTest, RoundTripsEveryAttributeKind) {
  // int, bool, string, int list, empty int list, float, tensor.
  expectRoundTrip(wrap("(%x: f32[4,6], %i: i64[4,6]) -> (f32[4], i64[4], f32[6,8], f32[4,6], f32[2])",
                       "  %a = argmax(%x) {axis = -1, keepdims = false} : i64[4]\n"
                       "  %g = gelu(%x) {approximate = \"tanh\"} : f32[4,6]\n"
                       "  %s = reduce_sum(%x) {axes = [1]} : f32[4]\n"
                       "  %p = pad(%x) {mode = \"edge\", pads = [1, 1, 1, 1], value = -1.5} : f32[6,8]\n"
                       "  %c = conv(%x, %x) {pads = [], strides = []} : f32[4,6]\n"
                       "  %k = constant() {value = dense<f32[2]>[1.0, -2.5]} : f32[2]\n"
                       "  return %s, %a, %p, %c, %k\n"));
}

TEST(ParserTest, AttributesTakeTheDeclaredKind) {
  auto m = parseOk(wrap("(%x: f32[2]) -> f32[4]",
                        "  %p = pad(%x) {pads = [1, 1], value = 0} : f32[4]\n"
                        "  %c = conv(%x, %x) {strides = []} : f32[4]\n"
                        "  return %p\n"));
  ASSERT_TRUE(m);
  const Op& pad = firstOp(*m);
  ASSERT_EQ(pad.attr("value")->kind(), AttrKind::Float);
  EXPECT_EQ(pad.getFloat("value"), 0.0);
  EXPECT_EQ(pad.getInts("pads"), (std::vector<int64_t>{1, 1}));
  const Op& conv = **std::next(m->functions()[0]->ops().begin());
  ASSERT_EQ(conv.attrs().at("strides").kind(), AttrKind::Ints);
  EXPECT_TRUE(conv.getInts("strides").empty());
  // The int literal reads back as a float literal.
  EXPECT_NE(print(*m).find("value = 0.0"), std::string::npos);
}

TEST(ParserTest, PrintsFloatListsAndStrings) {
  EXPECT_EQ(printAttribute(Attribute(std::vector<double>{1.0, -0.5, 1e-5})), "[1.0, -0.5, 1e-05]");
  EXPECT_EQ(printAttribute(Attribute(std::vector<double>{})), "[]");
  EXPECT_EQ(printAttribute(Attribute(std::vector<int64_t>{3, -1})), "[3, -1]");
  EXPECT_EQ(printAttribute(Attribute(std::string("a\"b\\c\nd\te\x01"))), "\"a\\\"b\\\\c\\nd\\te\\01\"");
  EXPECT_EQ(printAttribute(Attribute(true)), "true");
  EXPECT_EQ(printAttribute(Attribute(int64_t{-7})), "-7");
}

TEST(ParserTest, StringEscapesRoundTrip) {
  std::string text = wrap("(%x: f32[2]) -> f32[2]",
                          "  %g = gelu(%x) {approximate = \"q\\\"b\\\\s\\nn\\tt\\01\\7f\xc3\xa9\"} : f32[2]\n"
                          "  return %g\n");
  auto m = parseOk(text);
  ASSERT_TRUE(m);
  EXPECT_EQ(firstOp(*m).getString("approximate"), "q\"b\\s\nn\tt\x01\x7f\xc3\xa9");
  EXPECT_EQ(print(*m), text);
}

TEST(ParserTest, RoundTripsEveryDType) {
  std::string body;
  std::string results;
  std::string values;
  int i = 0;
  const char* elements[] = {"1.5, -2.0",
                            "0.25, 3.0",
                            "0.5, -1.0",
                            "0.5, 2.0",
                            "-9223372036854775808, 9223372036854775807",
                            "-2147483648, 2147483647",
                            "-32768, 32767",
                            "-128, 127",
                            "0, 18446744073709551615",
                            "0, 4294967295",
                            "0, 65535",
                            "0, 255",
                            "true, false"};
  static_assert(std::size(elements) == std::size(kAllDTypes), "one element list per dtype");
  for (DType dt : kAllDTypes) {
    std::string type = std::string(dtypeName(dt)) + "[2]";
    std::string name = "%c" + std::to_string(i);
    body += "  " + name + " = constant() {value = dense<" + type + ">[" + elements[i] + "]} : " + type + "\n";
    results += (i ? ", " : "") + type;
    values += (i ? ", " : "") + name;
    ++i;
  }
  expectRoundTrip(wrap("() -> (" + results + ")", body + "  return " + values + "\n"));
  auto m = parseOk(wrap("() -> (" + results + ")", body + "  return " + values + "\n"));
  ASSERT_TRUE(m);
  const DenseTensor& i64 = (*std::next(m->functions()[0]->ops().begin(), 4))->getTensor("value");
  EXPECT_EQ(i64.getInt(0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(i64.getInt(1), std::numeric_limits<int64_t>::max());
}

TEST(ParserTest, RoundTripsSymbolicDimsScalarsAndEmptyResults) {
  expectRoundTrip(wrap("(%x: f32[N,?,3], %s: f32[], %e: f32[0,N]) -> (f32[N,?,3], f32[])",
                       "  %y = mul(%x, %s) : f32[N,?,3]\n"
                       "  return %y, %s\n"));
  expectRoundTrip(wrap("() -> ()", "  return\n"));
  auto m = parseOk(wrap("(%x: f32[batch,?,3]) -> f32[batch,?,3]", "  return %x\n"));
  ASSERT_TRUE(m);
  const Shape& shape = m->functions()[0]->argument(0)->type().shape;
  EXPECT_TRUE(shape[0].isSymbolic());
  EXPECT_EQ(shape[0].symbol, "batch");
  EXPECT_TRUE(shape[1].isUnknown());
  EXPECT_EQ(shape[2], Dim::fixed(3));
}

TEST(ParserTest, RoundTripsMultiResultOps) {
  expectRoundTrip(
      wrap("(%x: f32[5,2,3], %w: f32[1,16,3], %r: f32[1,16,4], %b: f32[1,32], %h: f32[2,1,4], "
           "%c: f32[1,2,4]) -> (f32[5,1,2,4], f32[1,2,4], f32[1,2,4])",
           "  %y, %yh, %yc = lstm(%x, %w, %r, %b, %h, %c) {hidden_size = 4} : f32[5,1,2,4], f32[1,2,4], "
           "f32[1,2,4]\n"
           "  return %y, %yh, %yc\n"));
}

TEST(ParserTest, RoundTripsEveryLocationKind) {
  std::string text =
      "func @f(%x: f32[2]) -> f32[2] loc(\"model.onnx\":\"graph\") {\n"
      "  %a = neg(%x) : f32[2] loc(\"a.kir\":7:3)\n"
      "  %b = neg(%a) : f32[2] loc(\"Relu_1\")\n"
      "  %c = neg(%b) : f32[2] loc(\"m.onnx\":\"Neg_2\")\n"
      "  %d = neg(%c) : f32[2]\n"
      "  return %d loc(\"out\")\n"
      "}\n";
  expectRoundTrip(text);
  auto m = parseOk(text);
  ASSERT_TRUE(m);
  const Function& f = *m->functions()[0];
  EXPECT_EQ(f.loc(), Location::named("graph", "model.onnx"));
  auto it = f.ops().begin();
  EXPECT_EQ((*it++)->loc(), Location::fileLineCol("a.kir", 7, 3));
  EXPECT_EQ((*it++)->loc(), Location::named("Relu_1"));
  EXPECT_EQ((*it++)->loc(), Location::named("Neg_2", "m.onnx"));
  // Without loc(...), the op remembers where it was written; that is not printed.
  EXPECT_EQ((*it++)->loc(), Location::source("test.kir", 5, 3));
  EXPECT_EQ((*it)->loc(), Location::named("out"));
}

TEST(ParserTest, SourceLocationsHonourFirstLine) {
  auto m = parseModule("func @f(%x: f32[2]) -> f32[2] {\n  %y = neg(%x) : f32[2]\n  return %y\n}\n", "chunk.kir", 40);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->functions()[0]->loc(), Location::source("chunk.kir", 40, 1));
  EXPECT_EQ((*m)->functions()[0]->ops().front()->loc(), Location::source("chunk.kir", 41, 3));
}

// --- Floats --------------------------------------------------------------------

/// Prints `v` as the `value` of a pad op and parses it back.
double padValueRoundTrip(double v, std::string* printed = nullptr) {
  Module m;
  Function* f = m.addFunction("f");
  Value* x = f->addArgument({DType::F32, staticShape({2})}, "x");
  f->insert(nullptr, Op::create(OpKind::Pad, {x}, {{DType::F32, staticShape({2})}},
                                {{"pads", std::vector<int64_t>{0, 0}}, {"value", v}}));
  std::string text = print(m);
  if (printed) *printed = printAttribute(Attribute(v));
  auto parsed = parseModule(text, "float.kir");
  EXPECT_TRUE(parsed.ok()) << text;
  if (!parsed.ok()) return 0;
  EXPECT_EQ(print(**parsed), text);
  return firstOp(**parsed).getFloat("value");
}

TEST(ParserTest, FloatEdgeValuesRoundTripExactly) {
  const double values[] = {0.0,
                           -0.0,
                           0.1,
                           1e-45,
                           1e-5,
                           5e-324,
                           2.2250738585072014e-308,
                           1.7976931348623157e308,
                           1.0 / 3.0,
                           123456789.0,
                           -1e100,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  for (double v : values) EXPECT_EQ(bitsOf(padValueRoundTrip(v)), bitsOf(v)) << v;
  EXPECT_TRUE(std::isnan(padValueRoundTrip(std::nan(""))));

  std::string printed;
  padValueRoundTrip(0.1, &printed);
  EXPECT_EQ(printed, "0.1");
  padValueRoundTrip(1.0, &printed);
  EXPECT_EQ(printed, "1.0");
  padValueRoundTrip(-0.0, &printed);
  EXPECT_EQ(printed, "-0.0");
  padValueRoundTrip(1e-5, &printed);
  EXPECT_EQ(printed, "1e-05");
  padValueRoundTrip(5e-324, &printed);
  EXPECT_EQ(printed, "5e-324");
  padValueRoundTrip(1e16, &printed);
  EXPECT_EQ(printed, "1e+16");
  padValueRoundTrip(-std::numeric_limits<double>::infinity(), &printed);
  EXPECT_EQ(printed, "-inf");
  padValueRoundTrip(std::nan(""), &printed);
  EXPECT_EQ(printed, "nan");
}

TEST(ParserTest, RandomDoublesRoundTripExactly) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 2000; ++i) {
    uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, 8);
    if (std::isnan(v)) continue;
    EXPECT_EQ(bitsOf(padValueRoundTrip(v)), bits) << printAttribute(Attribute(v));
  }
}

/// A constant op holding `t`, printed, parsed back; returns the parsed tensor.
DenseTensor denseRoundTrip(const DenseTensor& t, std::string* printed = nullptr) {
  Module m;
  Function* f = m.addFunction("c");
  f->insert(nullptr, Op::create(OpKind::Constant, {}, {t.type}, {{"value", t}}));
  std::string text = print(m);
  if (printed) *printed = printAttribute(Attribute(t));
  auto parsed = parseModule(text, "dense.kir");
  EXPECT_TRUE(parsed.ok()) << (parsed.ok() ? "" : parsed.error().str());
  if (!parsed.ok()) return {};
  EXPECT_EQ(print(**parsed), text);
  return firstOp(**parsed).getTensor("value");
}

TEST(ParserTest, F32ElementsRoundTripInTheirOwnPrecision) {
  const float values[] = {0.1f,
                          -0.0f,
                          1e-45f,
                          3.4028235e38f,
                          16777216.0f,
                          1.0f / 3.0f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  DenseTensor t = DenseTensor::zeros({DType::F32, staticShape({std::size(values)})});
  for (size_t i = 0; i < std::size(values); ++i) t.setDouble(static_cast<int64_t>(i), values[i]);
  std::string printed;
  DenseTensor back = denseRoundTrip(t, &printed);
  EXPECT_EQ(printed, "dense<f32[8]>[0.1, -0.0, 1e-45, 3.4028235e+38, 16777216.0, 0.33333334, inf, nan]");
  EXPECT_EQ(back, t);
}

/// Every 16-bit pattern of a half or bfloat16 tensor reads back to the same
/// bits (NaNs to some NaN).
void expectAll16BitValuesRoundTrip(DType dtype) {
  DenseTensor t = DenseTensor::zeros({dtype, staticShape({65536})});
  for (uint32_t i = 0; i < 65536; ++i) {
    uint16_t bits = static_cast<uint16_t>(i);
    std::memcpy(t.bytes.data() + 2 * i, &bits, 2);
  }
  DenseTensor back = denseRoundTrip(t);
  ASSERT_EQ(back.bytes.size(), t.bytes.size());
  for (int64_t i = 0; i < 65536; ++i) {
    double original = t.getDouble(i);
    if (std::isnan(original)) {
      EXPECT_TRUE(std::isnan(back.getDouble(i)));
    } else {
      ASSERT_EQ(back.bytes[2 * i], t.bytes[2 * i]) << "element " << i << " = " << original;
      ASSERT_EQ(back.bytes[2 * i + 1], t.bytes[2 * i + 1]) << "element " << i << " = " << original;
    }
  }
}

TEST(ParserTest, AllHalfValuesRoundTrip) { expectAll16BitValuesRoundTrip(DType::F16); }
TEST(ParserTest, AllBFloat16ValuesRoundTrip) { expectAll16BitValuesRoundTrip(DType::BF16); }

TEST(ParserTest, SixteenBitFloatsPrintShortest) {
  DenseTensor h = DenseTensor::zeros({DType::F16, staticShape({3})});
  h.setDouble(0, 0.1);
  h.setDouble(1, 1.0);
  h.setDouble(2, -2.5);
  std::string printed;
  denseRoundTrip(h, &printed);
  EXPECT_EQ(printed, "dense<f16[3]>[0.1, 1.0, -2.5]");
  DenseTensor b = DenseTensor::zeros({DType::BF16, staticShape({2})});
  b.setDouble(0, 0.1);
  b.setDouble(1, 3.14159);
  denseRoundTrip(b, &printed);
  EXPECT_EQ(printed, "dense<bf16[2]>[0.1, 3.14]");
}

// --- Value naming ----------------------------------------------------------------

TEST(ParserTest, PrinterNamesValuesUniquely) {
  Module m;
  Function* f = m.addFunction("names");
  TensorType t{DType::F32, staticShape({2})};
  Value* x = f->addArgument(t, "x");
  Value* unnamed = f->addArgument(t);
  Op* a = f->insert(nullptr, Op::create(OpKind::Neg, {x}, {t}));
  a->result()->setName("x");  // taken by the argument: numbered
  Op* b = f->insert(nullptr, Op::create(OpKind::Neg, {a->result()}, {t}));
  b->result()->setName("input:0/weird name");  // printed quoted, kept exactly
  Op* c = f->insert(nullptr, Op::create(OpKind::Neg, {b->result()}, {t}));
  c->result()->setName("0");  // a numeric hint is kept, and numbering skips it
  Op* d = f->insert(nullptr, Op::create(OpKind::Add, {c->result(), unnamed}, {t}));
  f->insert(nullptr, Op::create(OpKind::Return, {d->result()}, {}));
  f->setResultTypes({t});
  std::string text = print(m);
  EXPECT_EQ(text,
            "func @names(%x: f32[2], %1: f32[2]) -> f32[2] {\n"
            "  %2 = neg(%x) : f32[2]\n"
            "  %\"input:0/weird name\" = neg(%2) : f32[2]\n"
            "  %0 = neg(%\"input:0/weird name\") : f32[2]\n"
            "  %3 = add(%0, %1) : f32[2]\n"
            "  return %3\n"
            "}\n");
  EXPECT_EQ(printOp(*d), "%3 = add(%0, %1) : f32[2]");
  auto parsed = parseOk(text);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(print(*parsed), text);
}

TEST(ParserTest, OddFunctionAndSymbolNamesStayParseable) {
  Module m;
  Function* f = m.addFunction("model/main graph");
  f->addArgument({DType::F32, {Dim::symbolic("batch size")}}, "x");
  f->setResultTypes({});
  f->insert(nullptr, Op::create(OpKind::Return, {}, {}));
  std::string text = print(m);
  EXPECT_EQ(text, "func @\"model/main graph\"(%x: f32[batch_size]) -> () {\n  return\n}\n");
  auto parsed = parseOk(text);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->functions()[0]->name(), "model/main graph");
  EXPECT_EQ(print(*parsed), text);
}

TEST(ParserTest, FunctionsAreSeparatedByABlankLine) {
  expectRoundTrip("func @a() -> () {\n  return\n}\n\nfunc @b(%x: i32[]) -> i32[] {\n  return %x\n}\n");
}

// --- Errors ---------------------------------------------------------------------

TEST(ParserTest, ReportsUnknownOp) {
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %y = foo(%x) : f32[2]\n  return %y\n")),
            "test.kir:2:8: error: unknown op 'foo'");
}

TEST(ParserTest, ReportsUndefinedAndForwardReferencedValues) {
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %y = neg(%z) : f32[2]\n  return %y\n")),
            "test.kir:2:12: error: use of undefined value %z");
  EXPECT_EQ(
      parseError(wrap("(%x: f32[2]) -> f32[2]", "  %y = neg(%w) : f32[2]\n  %w = neg(%x) : f32[2]\n  return %y\n")),
      "test.kir:2:12: error: use of undefined value %w");
  // Values do not leak from one function into the next.
  EXPECT_EQ(parseError("func @a(%x: f32[]) -> f32[] {\n  return %x\n}\nfunc @b() -> f32[] {\n  return %x\n}\n"),
            "test.kir:5:10: error: use of undefined value %x");
}

TEST(ParserTest, ReportsRedefinitions) {
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %x = neg(%x) : f32[2]\n  return %x\n")),
            "test.kir:2:3: error: redefinition of value %x");
  EXPECT_EQ(parseError("func @f(%a: f32[], %a: f32[]) -> () {\n  return\n}\n"),
            "test.kir:1:20: error: redefinition of value %a");
  EXPECT_EQ(parseError("func @f() -> () {\n  return\n}\nfunc @f() -> () {\n  return\n}\n"),
            "test.kir:4:6: error: redefinition of function @f");
}

TEST(ParserTest, ReportsAttributeErrors) {
  const char* sig = "(%x: f32[2]) -> f32[]";
  EXPECT_EQ(parseError(wrap(sig, "  %y = reduce_sum(%x) {axs = [0]} : f32[]\n  return %y\n")),
            "test.kir:2:24: error: unknown attribute 'axs' for 'reduce_sum' (expected: axes, keepdims)");
  EXPECT_EQ(parseError(wrap(sig, "  %y = reduce_sum(%x) {axes = \"0\"} : f32[]\n  return %y\n")),
            "test.kir:2:31: error: attribute 'axes' of 'reduce_sum' expects an int list, got a string");
  EXPECT_EQ(parseError(wrap(sig, "  %y = reduce_sum(%x) {axes = [0], axes = [0]} : f32[]\n  return %y\n")),
            "test.kir:2:36: error: duplicate attribute 'axes' for 'reduce_sum'");
  EXPECT_EQ(parseError(wrap(sig, "  %y = reduce_sum(%x) {axes = [0.5]} : f32[]\n  return %y\n")),
            "test.kir:2:31: error: attribute 'axes' of 'reduce_sum' expects an int list, got a float list");
  EXPECT_EQ(parseError(wrap(sig, "  %y = reduce_sum(%x) {axes = [0], keepdims = []} : f32[]\n  return %y\n")),
            "test.kir:2:47: error: attribute 'keepdims' of 'reduce_sum' expects a bool, got an empty list");
  EXPECT_EQ(parseError(wrap(sig, "  %y = neg(%x) {axes = [0]} : f32[]\n  return %y\n")),
            "test.kir:2:17: error: unknown attribute 'axes' for 'neg' (it has no attributes)");
}

TEST(ParserTest, ReportsMissingPunctuationAndTypeCountMismatch) {
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %y = add(%x, %x) f32[2]\n  return %y\n")),
            "test.kir:2:20: error: expected ':' after operands of 'add'");
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[]", "  %y = reduce_sum(%x) {axes = [0]}\n  return %y\n")),
            "test.kir:3:3: error: expected ':' after attributes of 'reduce_sum'");
  EXPECT_EQ(parseError(wrap("(%x: f32[1,1,2]) -> f32[]",
                            "  %y, %h = gru(%x, %x, %x, %x, %x) {hidden_size = 1} : f32[1]\n  return %y\n")),
            "test.kir:2:3: error: op 'gru' declares 2 results but has 1 type");
  EXPECT_EQ(parseError("func @f(%x f32[2]) -> () {\n  return\n}\n"),
            "test.kir:1:12: error: expected ':' after argument %x, found 'f32'");
  EXPECT_EQ(parseError("func @f() -> () {\n  return\n"),
            "test.kir:3:1: error: expected '}' at the end of @f, found end of input");
  EXPECT_EQ(parseError("module {}"), "test.kir:1:1: error: expected 'func' at the start of a function definition");
}

TEST(ParserTest, ReportsBadTypesAndSizes) {
  EXPECT_EQ(
      parseError("func @f(%x: f33[2]) -> () {\n  return\n}\n"),
      "test.kir:1:13: error: unknown element type 'f33' (expected f64, f32, f16, bf16, i64, i32, i16, i8, u8 or bool)");
  EXPECT_EQ(parseError("func @f(%x: f32[-2]) -> () {\n  return\n}\n"),
            "test.kir:1:17: error: dimension -2 is out of range (expected 0 to 2^40, '?' or a symbol)");
  EXPECT_EQ(
      parseError("func @f(%x: f32[99999999999999999999]) -> () {\n  return\n}\n"),
      "test.kir:1:17: error: dimension 99999999999999999999 is out of range (expected 0 to 2^40, '?' or a symbol)");
  EXPECT_EQ(parseError("func @f(%x: f32[1048576,1048576,2]) -> () {\n  return\n}\n"),
            "test.kir:1:33: error: type f32 has more than 2^40 elements");
  // A huge type with no data costs nothing before the count is checked.
  EXPECT_EQ(parseError(wrap("() -> f32[1099511627776]",
                            "  %c = constant() {value = dense<f32[1099511627776]>[1.0]} : f32[1099511627776]\n")),
            "test.kir:2:57: error: dense<f32[1099511627776]> expects 1099511627776 elements but has 1");
}

TEST(ParserTest, ReportsBadLiterals) {
  const char* sig = "() -> f32[2]";
  EXPECT_EQ(parseError(wrap(sig, "  %c = constant() {value = dense<f32[2]>[1.0]} : f32[2]\n")),
            "test.kir:2:45: error: dense<f32[2]> expects 2 elements but has 1");
  EXPECT_EQ(parseError(wrap(sig, "  %c = constant() {value = dense<f32[2]>[1.0, 2.0, 3.0]} : f32[2]\n")),
            "test.kir:2:52: error: dense<f32[2]> expects 2 elements but has more");
  EXPECT_EQ(parseError(wrap(sig, "  %c = constant() {value = dense<u8[2]>[1, 256]} : u8[2]\n")),
            "test.kir:2:44: error: element 256 is out of the range of u8 (0 to 255)");
  EXPECT_EQ(parseError(wrap(sig, "  %c = constant() {value = dense<bool[1]>[1]} : bool[1]\n")),
            "test.kir:2:43: error: expected true or false as an element of a bool tensor, found '1'");
  EXPECT_EQ(parseError(wrap(sig, "  %c = constant() {value = dense<f32[?]>[1.0]} : f32[2]\n")),
            "test.kir:2:34: error: dense tensor type f32[?] must have static dims");
  EXPECT_EQ(parseError(wrap(sig, "  %i = iota() {axis = 9223372036854775808} : f32[2]\n")),
            "test.kir:2:23: error: integer literal 9223372036854775808 does not fit in 64 bits");
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %p = pad(%x) {pads = [0, 0], value = 1e999} : f32[2]\n")),
            "test.kir:2:40: error: float literal 1e999 is out of the range of f64");
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %g = gelu(%x) {approximate = \"tanh} : f32[2]\n")),
            "test.kir:2:32: error: unterminated string literal (expected a closing '\"' on the same line)");
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %g = gelu(%x) {approximate = \"\\q\"} : f32[2]\n")),
            "test.kir:2:33: error: invalid escape in string literal (expected \\\", \\\\, \\n, \\t or two hex digits)");
  EXPECT_EQ(parseError("func @f() -> () {\n  return\n}\n#"), "test.kir:4:1: error: unexpected character '#'");
}

TEST(ParserTest, ErrorLinesHonourFirstLine) {
  EXPECT_EQ(parseError(wrap("(%x: f32[2]) -> f32[2]", "  %y = foo(%x) : f32[2]\n  return %y\n"), 100),
            "test.kir:101:8: error: unknown op 'foo'");
}

// --- Robustness -------------------------------------------------------------------

const char* kValidModule =
    "// A module using most of the syntax.\n"
    "func @mlp(%x: f32[N,4], %w: f32[4,3], %b: f32[3]) -> (f32[N,3], i64[N]) loc(\"m.onnx\":\"graph\") {\n"
    "  %mm = matmul(%x, %w) : f32[N,3] loc(\"m.onnx\":\"Gemm_0\")\n"
    "  %k = constant() {value = dense<f32[3]>[1.0, -2.5e-3, inf]} : f32[3]\n"
    "  %s = add(%mm, %b) : f32[N,3] loc(\"a.kir\":3:7)\n"
    "  %p = pad(%s) {mode = \"c\\\"\\01\", pads = [0, 0, 1, -1], value = 0} : f32[N,3]\n"
    "  %a = argmax(%p) {axis = 1, keepdims = false} : i64[N]\n"
    "  return %p, %a loc(\"out\")\n"
    "}\n"
    "\n"
    "func @g(%h: f16[2], %t: bool[]) -> () {\n"
    "  %c = constant() {value = dense<bf16[2]>[0.1, -0.0]} : bf16[2]\n"
    "  %y, %yh = gru(%h, %h, %h, %h, %h) {hidden_size = 1} : f16[?], f16[1]\n"
    "  return\n"
    "}\n";

TEST(ParserTest, EveryPrefixParsesOrFailsCleanly) {
  std::string text = kValidModule;
  ASSERT_TRUE(parseOk(text));
  for (size_t n = 0; n <= text.size(); ++n) {
    auto m = parseModule(std::string_view(text).substr(0, n), "prefix.kir");
    if (m.ok()) {
      // Whatever parsed must print and parse again to the same text.
      std::string printed = print(**m);
      auto again = parseModule(printed, "reprint.kir");
      ASSERT_TRUE(again.ok()) << printed;
      EXPECT_EQ(print(**again), printed);
    } else {
      EXPECT_FALSE(m.error().message().empty());
      EXPECT_EQ(m.error().location().kind, Location::Kind::Source);
    }
  }
}

TEST(ParserTest, GarbledInputParsesOrFailsCleanly) {
  std::string text = kValidModule;
  std::mt19937 rng(7);
  const char replacements[] = "()[]{}<>,:=%@\"\\-?0129e.xfi \n\0\xff";
  for (int round = 0; round < 3000; ++round) {
    std::string garbled = text;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % garbled.size();
      switch (rng() % 3) {
        case 0: garbled[pos] = replacements[rng() % (sizeof replacements - 1)]; break;
        case 1: garbled.erase(pos, 1 + rng() % 8); break;
        default: garbled.insert(pos, 1, replacements[rng() % (sizeof replacements - 1)]); break;
      }
      if (garbled.empty()) garbled = "x";
    }
    auto m = parseModule(garbled, "garbled.kir");
    if (m.ok()) {
      std::string printed = print(**m);
      auto again = parseModule(printed, "reprint.kir");
      ASSERT_TRUE(again.ok()) << printed;
      EXPECT_EQ(print(**again), printed);
    }
  }
}

}  // namespace
}  // namespace kiln
