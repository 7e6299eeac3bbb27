// Tests of frontend/Model.h: the format is chosen by extension (case does
// not matter, `.kiln.txt` is not `.kiln`, compiled `.kc` files and unknown
// names are errors listing the formats), and loadModel/saveModel move a
// model through every format and back to the same IR, with verification
// of text IR on load and nothing left behind by a failed save.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "frontend/Model.h"
#include "ir/Parser.h"
#include "ir/Printer.h"

namespace kiln {
namespace {

constexpr const char* kModel = R"(func @m(%x: f32[N,2], %b: f32[2] = dense<f32[2]>[0.5, -1.0]) -> ("y": f32[N,2]) {
  %s = add(%x, %b) : f32[N,2]
  %y = relu(%s) : f32[N,2]
  return %y
}
)";

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kiln-model-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path(name)) << text; }

  std::filesystem::path dir_;
};

TEST(ModelFormatTest, ChosenByExtension) {
  EXPECT_EQ(*modelFormatOf("a/model.onnx"), ModelFormat::Onnx);
  EXPECT_EQ(*modelFormatOf("MODEL.ONNX"), ModelFormat::Onnx);
  EXPECT_EQ(*modelFormatOf("m.kiln"), ModelFormat::Kiln);
  EXPECT_EQ(*modelFormatOf("m.kiln.txt"), ModelFormat::KilnText);
  EXPECT_EQ(*modelFormatOf("m.Kiln.Txt"), ModelFormat::KilnText);
  EXPECT_EQ(*modelFormatOf("m.kir"), ModelFormat::KilnIR);
  EXPECT_EQ(modelFormatName(ModelFormat::Onnx), "ONNX");
  EXPECT_EQ(modelFormatName(ModelFormat::KilnIR), "Kiln IR text");

  auto unknown = modelFormatOf("model.txt");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().message(),
            "cannot tell the format of 'model.txt' from its name (expected one of .onnx, .kiln.txt, .kiln, .kir)");
  ASSERT_FALSE(modelFormatOf("").ok());
  ASSERT_FALSE(modelFormatOf("onnx").ok());  // a name, not an extension
  auto compiled = modelFormatOf("m.kc");
  ASSERT_FALSE(compiled.ok());
  EXPECT_NE(compiled.error().message().find("compiled executable (.kc)"), std::string::npos);
}

TEST_F(ModelTest, EveryFormatRoundTripsToTheSameIR) {
  write("m.kir", kModel);
  auto original = loadModel(path("m.kir"));
  ASSERT_TRUE(original.ok()) << original.error().str();
  const std::string printed = print(**original);
  for (const char* name : {"m.kiln", "m.kiln.txt", "m.onnx", "again.kir"}) {
    ASSERT_TRUE(saveModel(**original, path(name)).ok()) << name;
    auto back = loadModel(path(name));
    ASSERT_TRUE(back.ok()) << name << ": " << back.error().str();
    const Function& f = *(*back)->functions().front();
    EXPECT_EQ(f.argument(0)->name(), "x") << name;
    EXPECT_EQ(f.argument(1)->type().str(), "f32[2]") << name;
    ASSERT_NE(f.argumentDefault(1), nullptr) << name;
    EXPECT_EQ(f.argumentDefault(1)->getDouble(1), -1.0) << name;
    EXPECT_EQ(f.argumentDefault(0), nullptr) << name;
    EXPECT_EQ(f.resultName(0), "y") << name;
    EXPECT_EQ(f.resultTypes()[0].str(), "f32[N,2]") << name;
  }
  // Text IR keeps everything, so it prints identically.
  auto again = loadModel(path("again.kir"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(print(**again), printed);
}

TEST_F(ModelTest, TextIRIsVerifiedOnLoad) {
  // Parses, but the result type contradicts the shape rule.
  write("bad.kir", "func @m(%x: f32[2]) -> f32[3] {\n  %y = relu(%x) : f32[3]\n  return %y\n}\n");
  auto bad = loadModel(path("bad.kir"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("bad.kir:2:"), std::string::npos) << bad.error().str();

  write("syntax.kir", "func @m(%x: f32[2]) -> f32[2] {\n  %y = nosuchop(%x) : f32[2]\n  return %y\n}\n");
  auto syntax = loadModel(path("syntax.kir"));
  ASSERT_FALSE(syntax.ok());
  EXPECT_EQ(syntax.error().str(), path("syntax.kir") + ":2:8: error: unknown op 'nosuchop'");

  write("empty.kir", "// nothing here\n");
  auto empty = loadModel(path("empty.kir"));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message().find("holds no function"), std::string::npos);

  auto missing = loadModel(path("missing.kir"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().str().find("missing.kir"), std::string::npos);
}

TEST_F(ModelTest, FailedSavesLeaveNothingBehind) {
  auto module = parseModule(kModel, "m.kir");
  ASSERT_TRUE(module.ok());
  Status unknown = saveModel(**module, path("m.pb"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message().find("expected one of"), std::string::npos);
  Module empty;
  ASSERT_FALSE(saveModel(empty, path("empty.kir")).ok());
  ASSERT_FALSE(saveModel(**module, path("no-such-dir/m.kir")).ok());

  // An existing file survives a failed save untouched.
  write("keep.kir", "old");
  ASSERT_FALSE(saveModel(empty, path("keep.kir")).ok());
  std::ifstream in(path("keep.kir"));
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), std::filesystem::directory_iterator()), 1);
}

}  // namespace
}  // namespace kiln
