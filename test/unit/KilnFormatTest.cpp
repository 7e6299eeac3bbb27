// Tests of the Kiln graph format (frontend/KilnFormat.h): binary and text
// round trips of a function using every attribute kind an op declares, many
// dtypes, argument defaults, result names and locations; external data;
// atomic writes; and every check on hostile input, each with the exact
// one-line error it gives.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "frontend/FileIO.h"
#include "frontend/KilnFormat.h"
#include "ir/Builder.h"
#include "ir/Printer.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

using test::parseOk;

/// Serializes `m` and reads it back under the file name `m.kiln`.
std::string roundTrip(const Module& m, bool text) {
  auto bytes = serializeKilnModel(m, text);
  EXPECT_TRUE(bytes.ok()) << (bytes.ok() ? "" : bytes.error().str());
  if (!bytes.ok()) return {};
  auto back = parseKilnModel(*bytes, text, "m.kiln", "");
  EXPECT_TRUE(back.ok()) << (back.ok() ? "" : back.error().str()) << "\n" << *bytes;
  return back.ok() ? print(**back) : std::string();
}

/// A text model with the given graph body (inputs, nodes, ...).
std::string textModel(const std::string& graph) {
  return "format_version: 1\ngraph {\n  name: \"g\"\n" + graph + "}\n";
}

/// The error of reading the text model `text` from memory or, with
/// `baseDir`, as if it sat in that folder.
std::string textError(const std::string& text, const std::string& baseDir = "") {
  auto m = parseKilnModel(text, true, "m.kiln.txt", baseDir);
  EXPECT_FALSE(m.ok()) << "read unexpectedly:\n" << text;
  return m.ok() ? std::string() : m.error().str();
}

/// A scratch folder removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kiln-format-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void writeFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// What `m` prints as once written to and read back from `path`: the same,
/// except that node locations name the file read.
std::string expectedFromFile(const Module& m, const std::string& path) {
  std::string expected = print(m);
  for (size_t at = 0; (at = expected.find("\"m.kiln\":", at)) != std::string::npos; at += path.size() + 3)
    expected.replace(at, 9, "\"" + path + "\":");
  return expected;
}

// A function using every attribute kind some op declares (int, float, bool,
// string, int list, tensor; no op declares a float list), every dtype,
// symbolic and unknown dims, argument defaults, named, unnamed and repeated
// results, declared result types that differ from the inferred ones, ops
// that take their type from the declaration, and node locations.
constexpr std::string_view kEverything =
    R"(func @everything(%x: f32[N,4], %w: f16[4,4] = dense<f16[4,4]>[1.0, -0.5, 0.25, 65504.0, 0.0, -0.0, inf, -inf, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5], %mask: bool[2] = dense<bool[2]>[true, false], %idx: i64[2], %u: f32[?], %b: bf16[3]) -> ("out": f32[N,6], f32[N,?], "again": f32[N,6], "idx": i64[2], "mask": bool[2], "big": f64[2]) {
  %c = constant() {value = dense<bf16[3]>[1.5, -2.0, 0.0078125]} : bf16[3]
  %k = constant() {value = dense<i32[2,2]>[1, -2, 2147483647, -2147483648]} : i32[2,2]
  %xh = cast(%x) : f16[N,4] loc("m.kiln":"to_half")
  %mm = matmul(%xh, %w) : f16[N,4] loc("m.kiln":"fc1")
  %back = cast(%mm) : f32[N,4]
  %p = pad(%back) {mode = "reflect", pads = [0, 1, 0, 1], value = 0.5} : f32[N,6] loc("m.kiln":"pad")
  %s = reduce_sum(%back) {axes = [1], keepdims = true} : f32[N,?]
  %i8 = constant() {value = dense<i8[3]>[-128, 0, 127]} : i8[3] loc("m.kiln":"int8s")
  %i16 = cast(%i8) : i16[3]
  %u8 = cast(%i16) : u8[3]
  %u64 = constant() {value = dense<u64[2]>[18446744073709551615, 7]} : u64[2]
  %u32 = cast(%u64) : u32[2]
  %u16 = cast(%u32) : u16[2]
  %sum = add(%b, %c) : bf16[3]
  %g = gather(%k, %idx) {axis = 1} : i32[2,2]
  %d = constant() {value = dense<f64[2]>[0.1, 1e+300]} : f64[2]
  %r = random_uniform() {high = 2.0, seed = 7} : f32[2,3]
  %io = iota() {axis = 0} : i64[2]
  return %p, %s, %p, %idx, %mask, %d
}
)";

TEST(KilnFormatTest, RoundTripsEveryAttributeKindAndDtypeBinary) {
  auto m = parseOk(kEverything);
  ASSERT_TRUE(m);
  EXPECT_EQ(roundTrip(*m, /*text=*/false), print(*m));
}

TEST(KilnFormatTest, RoundTripsEveryAttributeKindAndDtypeText) {
  auto m = parseOk(kEverything);
  ASSERT_TRUE(m);
  EXPECT_EQ(roundTrip(*m, /*text=*/true), print(*m));
}

TEST(KilnFormatTest, ReadBackKeepsDefaultsResultNamesAndLocations) {
  auto m = parseOk(kEverything);
  ASSERT_TRUE(m);
  auto bytes = serializeKilnModel(*m, false);
  ASSERT_TRUE(bytes.ok());
  auto back = parseKilnModel(*bytes, false, "m.kiln", "");
  ASSERT_TRUE(back.ok()) << back.error().str();
  const Function& f = *(*back)->functions()[0];
  EXPECT_EQ(f.name(), "everything");
  ASSERT_NE(f.argumentDefault(1), nullptr);
  EXPECT_EQ(*f.argumentDefault(1), *m->functions()[0]->argumentDefault(1));
  EXPECT_EQ(f.argumentDefault(0), nullptr);
  EXPECT_EQ(f.resultName(0), "out");
  EXPECT_EQ(f.resultName(1), "");
  const Op& cast = **std::next(f.ops().begin(), 2);
  EXPECT_EQ(cast.loc(), Location::named("to_half", "m.kiln"));
}

TEST(KilnFormatTest, UnnamedValuesReadBackUnderThePrintersNumbers) {
  auto m = parseOk(
      "func @f(%a: f32[2]) -> f32[2] {\n"
      "  %0 = neg(%a) : f32[2]\n"
      "  %x = exp(%0) : f32[2]\n"
      "  %y = abs(%x) : f32[2]\n"
      "  return %y\n"
      "}\n");
  ASSERT_TRUE(m);
  // Clear every hint but one so the writer has to number values exactly as
  // the printer does, around the name that is taken.
  Function& f = *m->functions()[0];
  for (const auto& op : f.ops())
    for (Value* r : op->results()) r->setName("");
  f.argument(0)->setName("1");
  EXPECT_EQ(roundTrip(*m, false), print(*m));
  EXPECT_EQ(roundTrip(*m, true), print(*m));
}

TEST(KilnFormatTest, TextWriterUsesReadableNumbers) {
  auto m = parseOk(
      "func @f(%a: f32[2]) -> f32[2] {\n"
      "  %c = constant() {value = dense<f32[2]>[0.1, -2.5]} : f32[2]\n"
      "  %s = add(%a, %c) : f32[2] loc(\"fc\")\n"
      "  return %s\n"
      "}\n");
  ASSERT_TRUE(m);
  auto text = serializeKilnModel(*m, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "# Kiln model, text form (docs/format.md)\n"
            "format_version: 1\n"
            "producer: \"kiln\"\n"
            "graph {\n"
            "  name: \"f\"\n"
            "  inputs {\n"
            "    name: \"a\"\n"
            "    type {\n"
            "      dtype: F32\n"
            "      dims {\n"
            "        size: 2\n"
            "      }\n"
            "    }\n"
            "  }\n"
            "  outputs {\n"
            "    type {\n"
            "      dtype: F32\n"
            "      dims {\n"
            "        size: 2\n"
            "      }\n"
            "    }\n"
            "    value: \"s\"\n"
            "  }\n"
            "  nodes {\n"
            "    name: \"fc\"\n"
            "    op: \"add\"\n"
            "    inputs: \"a\"\n"
            "    inputs: \"c\"\n"
            "    outputs: \"s\"\n"
            "  }\n"
            "  initializers {\n"
            "    name: \"c\"\n"
            "    dtype: F32\n"
            "    dims: [2]\n"
            "    float_values: [0.1, -2.5]\n"
            "  }\n"
            "}\n");
}

TEST(KilnFormatTest, TextKeepsNanPayloadsThroughRawData) {
  DenseTensor t = DenseTensor::zeros(TensorType{DType::F32, staticShape({2})});
  uint32_t payload = 0x7fc00123;
  std::memcpy(t.bytes.data(), &payload, 4);
  Module m;
  Function& f = *m.addFunction("f");
  Builder b(f);
  Value* c = b.constant(t);
  b.ret({c});
  auto text = serializeKilnModel(m, true);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("raw_data"), std::string::npos) << *text;
  auto back = parseKilnModel(*text, true, "m.kiln.txt", "");
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ((*back)->functions()[0]->ops().front()->getTensor("value"), t);
}

TEST(KilnFormatTest, TextWritesU64ListsOnlyWhereInt64HoldsThem) {
  for (auto [values, listed] : {std::pair{"[7, 9223372036854775807]", true}, {"[7, 9223372036854775808]", false}}) {
    auto m = parseOk(std::string("func @f() -> u64[2] {\n  %c = constant() {value = dense<u64[2]>") + values +
                     "} : u64[2]\n  return %c\n}\n");
    ASSERT_TRUE(m);
    auto text = serializeKilnModel(*m, true);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(text->find("int_values") != std::string::npos, listed) << *text;
    EXPECT_EQ(text->find("raw_data") != std::string::npos, !listed) << *text;
    auto back = parseKilnModel(*text, true, "m.kiln.txt", "");
    ASSERT_TRUE(back.ok()) << back.error().str();
    EXPECT_EQ(print(**back), print(*m));
  }
  // A hand-written list may not go past int64 for u64, nor below 0.
  for (const char* bad : {"-1", "4294967296"}) {
    const std::string dtype = std::string(bad) == "-1" ? "U64" : "U32";
    auto parsed = parseKilnModel("format_version: 1\ngraph {\n  name: \"f\"\n  outputs { value: \"c\" }\n"
                                 "  initializers { name: \"c\" dtype: " + dtype + " dims: [1] int_values: [" + bad +
                                     "] }\n}\n",
                                 true, "bad.kiln.txt", "");
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.error().message().find("out of range"), std::string::npos) << parsed.error().message();
  }
}

TEST(KilnFormatTest, FilesRoundTripThroughDiskInBothForms) {
  TempDir dir;
  auto m = parseOk(kEverything);
  ASSERT_TRUE(m);
  for (const char* name : {"m.kiln", "m.kiln.txt"}) {
    std::string path = dir / name;
    Status written = writeKilnModel(*m, path);
    ASSERT_TRUE(written.ok()) << written.error().str();
    auto back = readKilnModel(path);
    ASSERT_TRUE(back.ok()) << back.error().str();
    EXPECT_EQ(print(**back), expectedFromFile(*m, path)) << name;
  }
  EXPECT_FALSE(fs::exists(dir / "m.kiln.data"));
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir.path())) files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"m.kiln", "m.kiln.txt"}));  // no temporary files left
}

TEST(KilnFormatTest, ExternalDataRoundTrips) {
  TempDir dir;
  auto m = parseOk(kEverything);
  ASSERT_TRUE(m);
  for (const char* name : {"ext.kiln", "ext.kiln.txt"}) {
    std::string path = dir / name;
    Status written = writeKilnModel(*m, path, KilnWriteOptions{.externalDataThreshold = 16});
    ASSERT_TRUE(written.ok()) << written.error().str();
    // Out go the f16 default (32 bytes), the i32, u64 and f64 constants (16
    // each); the small ones stay inline. Each starts 64-aligned.
    EXPECT_EQ(readFile(path + ".data").size(), 192u + 16u) << name;
    std::string model = readFile(path);
    EXPECT_NE(model.find(std::string(name) + ".data"), std::string::npos);
    auto back = readKilnModel(path);
    ASSERT_TRUE(back.ok()) << back.error().str();
    EXPECT_EQ(print(**back), expectedFromFile(*m, path)) << name;
    EXPECT_EQ(*(*back)->functions()[0]->argumentDefault(1), *m->functions()[0]->argumentDefault(1));
  }
}

TEST(KilnFormatTest, WriterRefusesUnknownExtensionsAndInvalidIR) {
  auto m = parseOk("func @f(%a: f32[2]) -> f32[2] {\n  return %a\n}\n");
  ASSERT_TRUE(m);
  Status s = writeKilnModel(*m, "/tmp/model.onnx");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().str(), "error: /tmp/model.onnx: not a Kiln model file name (expected .kiln or .kiln.txt)");
  Module empty;
  auto bytes = serializeKilnModel(empty, false);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.error().str(), "error: the module has no function to write");
  m->functions()[0]->argument(0)->setName("\xff");
  bytes = serializeKilnModel(*m, false);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.error().str(),
            "error: cannot write value name '\xff': the Kiln format stores names and strings as UTF-8");
}

TEST(KilnFormatTest, AtomicWriteReplacesAndLeavesNothingOnFailure) {
  TempDir dir;
  std::string path = dir / "f.bin";
  ASSERT_TRUE(writeFileAtomically(path, "first").ok());
  ASSERT_TRUE(writeFileAtomically(path, "second").ok());
  EXPECT_EQ(readFile(path), "second");
  Status s = writeFileAtomically(dir / "missing/f.bin", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().str(), "error: cannot write '" + (dir / "missing/f.bin") + "': No such file or directory");
  // A failure on the second file leaves the first untouched too.
  s = writeFilesAtomically({{path, "third"}, {dir / "missing/g.bin", "y"}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(readFile(path), "second");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(KilnFormatTest, ReadFileBoundedRefusesLargeFilesAndFolders) {
  TempDir dir;
  std::string path = dir / "f.bin";
  writeFile(path, "0123456789");
  auto ok = readFileBounded(path, 10);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "0123456789");
  auto big = readFileBounded(path, 9);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().str(), "error: '" + path + "' is 10 bytes, more than the limit of 9");
  auto folder = readFileBounded(dir.path().string(), 100);
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.error().str(), "error: cannot read '" + dir.path().string() + "': not a regular file");
  auto missing = readKilnModel(dir / "none.kiln");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().str(), "error: cannot open '" + (dir / "none.kiln") + "': No such file or directory");
}

// --- The hand-written example --------------------------------------------------

TEST(KilnFormatTest, ExampleMlpReads) {
  auto m = readKilnModel(std::string(KILN_SOURCE_DIR) + "/examples/mlp.kiln.txt");
  ASSERT_TRUE(m.ok()) << m.error().str();
  const Function& f = *(*m)->functions()[0];
  EXPECT_EQ(f.name(), "mlp");
  EXPECT_EQ(f.argument(0)->type().str(), "f32[N,4]");
  EXPECT_EQ(f.resultTypes()[0].str(), "f32[N,3]");
  EXPECT_EQ(f.resultName(0), "probs");
  EXPECT_EQ(roundTrip(**m, false), roundTrip(**m, true));
}

// --- Hostile input ---------------------------------------------------------------

const std::string kInputX = "  inputs { name: \"x\" type { dtype: F32 dims { size: 2 } } }\n";
const std::string kOutputY = "  outputs { name: \"y\" }\n";

std::string node(const std::string& name, const std::string& op, const std::string& inputs, const std::string& outputs,
                 const std::string& rest = "") {
  return "  nodes { name: \"" + name + "\" op: \"" + op + "\" " + inputs + " " + outputs + " " + rest + "}\n";
}

TEST(KilnFormatTest, MalformedFilesAreOneLineErrors) {
  EXPECT_EQ(textError("graph { name: "), "m.kiln.txt:1:15: error: malformed text model: Expected string, got: ");
  EXPECT_EQ(textError("graph { nam: \"g\" }"),
            "m.kiln.txt:1:12: error: malformed text model: Message type \"kiln.format.Graph\" has no field named "
            "\"nam\".");
  auto binary = parseKilnModel("\xff\xff\xff", false, "m.kiln", "");
  ASSERT_FALSE(binary.ok());
  EXPECT_EQ(binary.error().str(),
            "error: m.kiln: not a Kiln model (malformed binary protobuf; a text model must be named .kiln.txt)");
  EXPECT_EQ(textError(""), "error: m.kiln.txt: format_version is missing or invalid (0); expected 1");
  EXPECT_EQ(textError("format_version: 2 graph { name: \"g\" }"),
            "error: m.kiln.txt: format_version 2 is newer than this Kiln reads (1); upgrade Kiln or write the model "
            "with format_version 1");
  // A newer model is refused for its version, not for the fields it adds.
  EXPECT_EQ(textError("format_version: 3 graph { name: \"g\" quantization { bits: 4 } }"),
            "error: m.kiln.txt: format_version 3 is newer than this Kiln reads (1); upgrade Kiln or write the model "
            "with format_version 1");
  EXPECT_EQ(textError("format_version: 1"), "error: m.kiln.txt: the model has no graph");
  // The text parser lets any bytes into a string; names must be UTF-8 as in
  // binary models, or the model could not be written back.
  EXPECT_EQ(textError(textModel(node("fc\\377", "relu", "", ""))),
            "error: m.kiln.txt: malformed text model: a kiln.format.Node.name string is not valid UTF-8");
  EXPECT_EQ(textError("format_version: 1 graph { }"),
            "error: m.kiln.txt: the graph has no name (it names the function)");
}

TEST(KilnFormatTest, TruncatedBinaryModelsNeverCrash) {
  auto m = parseOk(kEverything);
  ASSERT_TRUE(m);
  auto bytes = serializeKilnModel(*m, false);
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); n += 7)
    EXPECT_FALSE(parseKilnModel(bytes->substr(0, n), false, "t.kiln", "").ok());
}

TEST(KilnFormatTest, UnknownOpsAndArity) {
  EXPECT_EQ(textError(textModel(kInputX + node("n1", "frobnicate", "inputs: \"x\"", "outputs: \"y\"") + kOutputY)),
            "m.kiln.txt: node 'n1': error: unknown op 'frobnicate' (not in Kiln's op table, ir/Ops.def; "
            "docs/ops.md lists the ops)");
  EXPECT_EQ(textError(textModel(kInputX + node("r", "return", "inputs: \"x\"", ""))),
            "m.kiln.txt: node 'r': error: unknown op 'return' (graph outputs are the function's results; 'return' is "
            "not a node)");
  EXPECT_EQ(textError(textModel(kInputX + node("", "add", "inputs: \"x\"", "outputs: \"y\"") + kOutputY)),
            "m.kiln.txt: node '#0': error: 'add' has 1 input, expected 2");
  EXPECT_EQ(
      textError(textModel(kInputX + node("l", "lstm",
                                         "inputs: \"x\" inputs: \"x\" inputs: \"x\" inputs: "
                                         "\"x\" inputs: \"x\" inputs: \"x\"",
                                         "outputs: \"y\"", "attributes { key: \"hidden_size\" value { i: 2 } }"))),
      "m.kiln.txt: node 'l': error: 'lstm' has 1 output, expected 3");
}

TEST(KilnFormatTest, AttributesAreCheckedAgainstTheOpTable) {
  std::string in = "  inputs { name: \"x\" type { dtype: F32 dims { size: 2 } dims { size: 3 } } }\n";
  EXPECT_EQ(textError(textModel(in + node("s", "reduce_sum", "inputs: \"x\"", "outputs: \"y\"",
                                          "attributes { key: \"axs\" value { ints { values: 0 } } }"))),
            "m.kiln.txt: node 's': error: unknown attribute 'axs' for 'reduce_sum' (expected: axes, keepdims)");
  EXPECT_EQ(textError(textModel(in + node("s", "reduce_sum", "inputs: \"x\"", "outputs: \"y\"",
                                          "attributes { key: \"axes\" value { s: \"0\" } }"))),
            "m.kiln.txt: node 's': error: attribute 'axes' of 'reduce_sum' expects an int list, got a string");
  EXPECT_EQ(textError(textModel(in + node("s", "reduce_sum", "inputs: \"x\"", "outputs: \"y\"",
                                          "attributes { key: \"axes\" value { floats { } } }"))),
            "m.kiln.txt: node 's': error: attribute 'axes' of 'reduce_sum' expects an int list, got a float list");
  EXPECT_EQ(textError(textModel(in + node("s", "reduce_sum", "inputs: \"x\"", "outputs: \"y\"",
                                          "attributes { key: \"axes\" value { } }"))),
            "m.kiln.txt: node 's': error: attribute 'axes' of 'reduce_sum' has no value (expected an int list)");
  EXPECT_EQ(textError(textModel(in + node("s", "reduce_sum", "inputs: \"x\"", "outputs: \"y\""))),
            "m.kiln.txt: node 's': error: missing required attribute 'axes' of 'reduce_sum'");
  EXPECT_EQ(textError(textModel(in + node("t", "relu", "inputs: \"x\"", "outputs: \"y\"",
                                          "attributes { key: \"alpha\" value { f: 1 } }"))),
            "m.kiln.txt: node 't': error: unknown attribute 'alpha' for 'relu' (expected: none)");
  // Shape rules see the attribute values and name the node.
  EXPECT_EQ(textError(textModel(in + node("s", "reduce_sum", "inputs: \"x\"", "outputs: \"y\"",
                                          "attributes { key: \"axes\" value { ints { values: 5 } } }"))),
            "m.kiln.txt: node 's': error: 'reduce_sum' attribute 'axes' entry 0 = 5 is out of range for rank 2");
}

TEST(KilnFormatTest, EveryReferenceIsChecked) {
  EXPECT_EQ(textError(textModel(kInputX + node("n", "relu", "inputs: \"z\"", "outputs: \"y\"") + kOutputY)),
            "m.kiln.txt: node 'n': error: input 'z' is not defined (no graph input, initializer or earlier node "
            "output has that name)");
  EXPECT_EQ(textError(textModel(kInputX + node("n", "relu", "inputs: \"\"", "outputs: \"y\""))),
            "m.kiln.txt: node 'n': error: an input name is empty");
  EXPECT_EQ(textError(textModel(kInputX + node("n", "relu", "inputs: \"x\"", "outputs: \"\""))),
            "m.kiln.txt: node 'n': error: output 0 has no name");
  EXPECT_EQ(textError(textModel(kInputX + node("n", "relu", "inputs: \"x\"", "outputs: \"x\""))),
            "m.kiln.txt: node 'n': error: 'x' is defined twice: by a graph input and by node 'n'");
  EXPECT_EQ(textError(textModel(kInputX + kInputX)),
            "error: m.kiln.txt: 'x' is defined twice: by a graph input and by a graph input");
  std::string w = "  initializers { name: \"w\" dtype: F32 dims: 1 float_values: 1 }\n";
  EXPECT_EQ(textError(textModel(w + w)), "error: m.kiln.txt: initializer 'w' is defined twice");
  EXPECT_EQ(textError(textModel(w + node("n", "relu", "inputs: \"w\"", "outputs: \"w\""))),
            "m.kiln.txt: node 'n': error: 'w' is defined twice: by an initializer and by node 'n'");
  EXPECT_EQ(textError(textModel(kInputX + kOutputY)),
            "error: m.kiln.txt: graph output 'y' is not produced: no graph input, initializer or node defines 'y'");
  EXPECT_EQ(textError(textModel(kInputX + "  outputs { name: \"a\" value: \"x\" }\n  outputs { name: \"a\" value: "
                                          "\"x\" }\n")),
            "error: m.kiln.txt: graph output 'a' is listed twice");
  EXPECT_EQ(textError(textModel(kInputX + "  outputs { }\n")),
            "error: m.kiln.txt: a graph output has neither a name nor a value");
  EXPECT_EQ(textError(textModel("  inputs { name: \"x\" }\n")), "error: m.kiln.txt: graph input 'x' has no type");
  EXPECT_EQ(textError(textModel("  inputs { type { dtype: F32 } }\n")), "error: m.kiln.txt: a graph input has no name");
}

TEST(KilnFormatTest, CyclesAreFoundAndNamed) {
  // a -> b -> c -> a, listed in that order: a uses c's output.
  EXPECT_EQ(textError(textModel(kInputX + node("a", "add", "inputs: \"x\" inputs: \"vc\"", "outputs: \"va\"") +
                                node("b", "relu", "inputs: \"va\"", "outputs: \"vb\"") +
                                node("c", "neg", "inputs: \"vb\"", "outputs: \"vc\""))),
            "m.kiln.txt: node 'a': error: the graph has a cycle through this node: 'a' -> 'b' -> 'c' -> 'a' (input "
            "'vc')");
  EXPECT_EQ(textError(textModel(kInputX + node("self", "add", "inputs: \"x\" inputs: \"s\"", "outputs: \"s\""))),
            "m.kiln.txt: node 'self': error: the graph has a cycle through this node: 'self' -> 'self' (input 's')");
  // Out of order, but no cycle.
  EXPECT_EQ(textError(textModel(kInputX + node("late", "relu", "inputs: \"e\"", "outputs: \"f\"") +
                                node("early", "neg", "inputs: \"x\"", "outputs: \"e\""))),
            "m.kiln.txt: node 'late': error: input 'e' is used before node 'early' defines it (nodes must be in "
            "topological order)");
  // A long cycle is cut short in the message.
  std::string nodes = kInputX + node("n0", "add", "inputs: \"x\" inputs: \"v19\"", "outputs: \"v0\"");
  for (int i = 1; i < 20; ++i)
    nodes += node("n" + std::to_string(i), "neg", "inputs: \"v" + std::to_string(i - 1) + "\"",
                  "outputs: \"v" + std::to_string(i) + "\"");
  EXPECT_EQ(textError(textModel(nodes)),
            "m.kiln.txt: node 'n0': error: the graph has a cycle through this node: 'n0' -> 'n1' -> 'n2' -> 'n3' -> "
            "'n4' -> 'n5' -> 'n6' -> 'n7' -> ... (12 more) -> 'n0' (input 'v19')");
}

TEST(KilnFormatTest, TypesAndSizesAreBounded) {
  EXPECT_EQ(textError(textModel("  inputs { name: \"x\" type { dims { size: 2 } } }\n")),
            "error: m.kiln.txt: graph input 'x' has no dtype");
  EXPECT_EQ(textError(textModel("  inputs { name: \"x\" type { dtype: 77 } }\n")),
            "error: m.kiln.txt: graph input 'x' has unknown dtype 77");
  EXPECT_EQ(textError(textModel("  inputs { name: \"x\" type { dtype: F32 dims { size: -3 } } }\n")),
            "error: m.kiln.txt: graph input 'x' has dimension -3 (expected 0 to 2^40)");
  EXPECT_EQ(textError(textModel("  inputs { name: \"x\" type { dtype: F32 dims { size: 1099511627777 } } }\n")),
            "error: m.kiln.txt: graph input 'x' has dimension 1099511627777 (expected 0 to 2^40)");
  EXPECT_EQ(textError(textModel("  inputs { name: \"x\" type { dtype: F32 dims { size: 2097152 } dims { size: "
                                "2097152 } dims { symbol: \"N\" } dims { } } }\n")),
            "error: m.kiln.txt: graph input 'x' has more than 2^40 elements");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: F32 dims: 4294967296 dims: 4294967296 }\n")),
            "error: m.kiln.txt: initializer 'w' has more than 2^40 elements");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: F32 dims: 2 raw_data: \"abc\" }\n")),
            "error: m.kiln.txt: initializer 'w' has 3 bytes of raw_data, expected 8 (2 elements of f32)");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: F32 dims: 2 }\n")),
            "error: m.kiln.txt: initializer 'w' has no data (expected 2 elements of f32)");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: F32 dims: 2 float_values: [1] }\n")),
            "error: m.kiln.txt: initializer 'w' has 1 float_values, expected 2 elements of f32");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: F64 dims: 1 float_values: [1] }\n")),
            "error: m.kiln.txt: initializer 'w' is f64 but has float_values (for f32, f16, bf16)");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: F32 dims: 1 int_values: [1] }\n")),
            "error: m.kiln.txt: initializer 'w' is f32 but has int_values (for integers and bool)");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: U8 dims: 2 int_values: [1, 256] }\n")),
            "error: m.kiln.txt: initializer 'w' element 1 is 256, out of range for u8");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: BOOL dims: 1 raw_data: \"\\002\" }\n")),
            "error: m.kiln.txt: initializer 'w' bool element 0 is 2 (expected 0 or 1)");
  EXPECT_EQ(textError(textModel("  initializers { name: \"w\" dtype: F32 dims: 1 raw_data: \"abcd\" float_values: "
                                "1 }\n")),
            "error: m.kiln.txt: initializer 'w' sets more than one of raw_data, float_values, double_values, "
            "int_values and external");
  EXPECT_EQ(textError(textModel(kInputX + "  initializers { name: \"x\" dtype: F32 dims: 3 float_values: [1, 2, "
                                          "3] }\n")),
            "error: m.kiln.txt: initializer 'x' of type f32[3] does not fit graph input type f32[2]");
}

TEST(KilnFormatTest, DeclaredTypesMustAgreeWithTheShapeRules) {
  std::string in = kInputX + "  inputs { name: \"z\" type { dtype: F32 dims { size: 3 } } }\n";
  EXPECT_EQ(textError(textModel(in + node("sum", "add", "inputs: \"x\" inputs: \"z\"", "outputs: \"y\""))),
            "m.kiln.txt: node 'sum': error: 'add' operand 1: shapes [2] and [3] do not broadcast: dim -1 is 2 vs 3");
  EXPECT_EQ(textError(textModel(kInputX + node("r", "relu", "inputs: \"x\"", "outputs: \"y\"",
                                               "output_types { dtype: F32 dims { size: 3 } }"))),
            "m.kiln.txt: node 'r': error: output 'y' is declared f32[3] but 'relu' gives f32[2]");
  EXPECT_EQ(textError(textModel(kInputX + node("r", "reshape", "inputs: \"x\"", "outputs: \"y\""))),
            "m.kiln.txt: node 'r': error: 'reshape' takes its result type from the declaration, but no result type "
            "was declared");
  EXPECT_EQ(textError(textModel(kInputX + node("r", "relu", "inputs: \"x\"", "outputs: \"y\"") +
                                "  outputs { name: \"y\" type { dtype: I32 } }\n")),
            "error: m.kiln.txt: graph output 'y' is declared i32[] but 'y' is f32[2]");
}

TEST(KilnFormatTest, ExternalDataStaysInsideTheModelFolder) {
  TempDir outer;
  fs::create_directory(outer.path() / "model");
  std::string dir = outer / "model";
  writeFile(outer / "secret.bin", std::string(16, 'x'));
  writeFile(dir + "/w.bin", std::string(16, '\0'));
  fs::create_symlink(outer.path() / "secret.bin", fs::path(dir) / "link.bin");
  auto model = [](const std::string& location, int64_t offset = 0, int64_t length = 8) {
    return textModel("  initializers { name: \"w\" dtype: F32 dims: 2 external { location: \"" + location +
                     "\" offset: " + std::to_string(offset) + " length: " + std::to_string(length) + " } }\n");
  };
  auto ok = parseKilnModel(model("w.bin", 8), true, "m.kiln.txt", dir);
  EXPECT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(textError(model("w.bin")),
            "error: m.kiln.txt: initializer 'w' uses external data, which a model read from memory cannot have (no "
            "folder to read it from)");
  EXPECT_EQ(textError(model(outer / "secret.bin"), dir), "error: m.kiln.txt: initializer 'w' external data '" +
                                                             (outer / "secret.bin") +
                                                             "': the location must be relative to the model's folder");
  EXPECT_EQ(textError(model("../secret.bin"), dir),
            "error: m.kiln.txt: initializer 'w' external data '../secret.bin': the location may not contain '..'");
  EXPECT_EQ(textError(model("link.bin"), dir),
            "error: m.kiln.txt: initializer 'w' external data 'link.bin' resolves outside the model's folder "
            "(through a symlink)");
  EXPECT_EQ(textError(model("none.bin"), dir),
            "error: m.kiln.txt: initializer 'w' external data 'none.bin' is not a file beside the model");
  EXPECT_EQ(textError(model("w.bin", 9), dir),
            "error: m.kiln.txt: initializer 'w' external data 'w.bin': offset 9 and length 8 reach past its end (16 "
            "bytes)");
  EXPECT_EQ(textError(model("w.bin", INT64_MAX), dir),
            "error: m.kiln.txt: initializer 'w' external data 'w.bin': offset 9223372036854775807 and length 8 reach "
            "past its end (16 bytes)");
  EXPECT_EQ(textError(model("w.bin", 0, 4), dir),
            "error: m.kiln.txt: initializer 'w' external data 'w.bin' has length 4, expected 8 bytes");
  EXPECT_EQ(textError(model("w.bin", -1), dir),
            "error: m.kiln.txt: initializer 'w' external data 'w.bin' has a negative offset or length");
  EXPECT_EQ(textError(model(""), dir), "error: m.kiln.txt: initializer 'w' has external data without a location");
  EXPECT_EQ(textError(model("."), dir),
            "error: m.kiln.txt: initializer 'w' external data '.' is not a file beside the model");
}

TEST(KilnFormatTest, FusedOpsAreNeitherWrittenNorRead) {
  // Regions exist only after fusion, a compilation step; model files hold
  // the graph before it.
  auto m = parseOk(
      "func @f(%x: f32[2]) -> f32[2] {\n"
      "  %y = fused(%x) {kind = \"elementwise\"} : f32[2] {\n"
      "  ^(%a: f32[2]):\n"
      "    %r = relu(%a) : f32[2]\n"
      "    return %r\n"
      "  }\n"
      "  return %y\n"
      "}\n");
  ASSERT_TRUE(m);
  auto bytes = serializeKilnModel(*m, false);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.error().str(),
            "test.kir:2:3: error: 'fused' has a region, which the Kiln graph format cannot store; write text IR (.kir) "
            "instead");
  EXPECT_EQ(textError(textModel(kInputX + node("f", "fused", "inputs: \"x\"", "outputs: \"y\"",
                                               "attributes { key: \"kind\" value { s: \"elementwise\" } }"))),
            "m.kiln.txt: node 'f': error: op 'fused' has a region, which the Kiln format does not hold (it stores "
            "models before fusion)");
}

}  // namespace
}  // namespace kiln
