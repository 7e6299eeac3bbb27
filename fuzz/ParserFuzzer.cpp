// libFuzzer target for the text IR parser: any bytes must either parse or
// give an error, never crash, hang or leak. A module that parses must also
// print, verify without crashing (bad IR is reported, not asserted), and
// print back to the same text after a second parse.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto module = kiln::parseModule(text, "fuzz.kir");
  if (!module) return 0;
  std::string printed = kiln::print(**module);
  (void)kiln::verify(**module);
  auto reparsed = kiln::parseModule(printed, "printed.kir");
  if (!reparsed) {
    std::fprintf(stderr, "printed module does not parse: %s\n%s", reparsed.error().str().c_str(), printed.c_str());
    std::abort();
  }
  if (kiln::print(**reparsed) != printed) {
    std::fprintf(stderr, "print(parse(print(m))) != print(m) for:\n%s", printed.c_str());
    std::abort();
  }
  return 0;
}
