// libFuzzer target for the Kiln graph format reader: any bytes, read as a
// binary `.kiln` and as a text `.kiln.txt` model, must either give a Module
// or an error, never crash, hang or leak. A model that reads must verify,
// and writing it in both forms and reading that back must give IR that
// prints the same: the reader and writer agree on everything they accept.
// Models are read as if they sat in a scratch folder holding a data file
// `w.bin` and a symlink `out.bin` that leads outside it, so external data
// and its path checks are fuzzed too.
#include <google/protobuf/stubs/logging.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "frontend/KilnFormat.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace {

std::string scratchFolder;

void removeScratchFolder() {
  std::error_code ec;
  std::filesystem::remove_all(scratchFolder, ec);
  std::filesystem::remove(scratchFolder + ".outside", ec);
}

void checkRoundTrip(const kiln::Module& module, const char* how) {
  if (kiln::Status s = kiln::verify(module); !s) {
    std::fprintf(stderr, "%s model reads but does not verify: %s\n%s", how, s.error().str().c_str(),
                 kiln::print(module).c_str());
    std::abort();
  }
  std::string printed = kiln::print(module);
  for (bool text : {false, true}) {
    auto bytes = kiln::serializeKilnModel(module, text);
    if (!bytes) {
      std::fprintf(stderr, "%s model reads but cannot be written: %s\n%s", how, bytes.error().str().c_str(),
                   printed.c_str());
      std::abort();
    }
    auto back = kiln::parseKilnModel(*bytes, text, "fuzz.kiln", "");
    if (!back) {
      std::fprintf(stderr, "written %s model does not read back: %s\n", text ? "text" : "binary",
                   back.error().str().c_str());
      std::abort();
    }
    if (kiln::print(**back) != printed) {
      std::fprintf(stderr, "%s model changes through a %s write and read:\n%s---\n%s", how, text ? "text" : "binary",
                   printed.c_str(), kiln::print(**back).c_str());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs malformed UTF-8 in string fields to stderr; the reader's
  // error already says the file is malformed.
  google::protobuf::SetLogHandler(nullptr);
  std::string pattern = (std::filesystem::temp_directory_path() / "kiln-fuzz-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) {
    std::perror("mkdtemp");
    std::abort();
  }
  scratchFolder = pattern;
  std::atexit(removeScratchFolder);
  std::ofstream data(scratchFolder + "/w.bin", std::ios::binary);
  for (int i = 0; i < 256; ++i) data.put(static_cast<char>(i % 2));  // valid bools too
  data.close();
  std::ofstream(scratchFolder + ".outside", std::ios::binary) << std::string(64, '\1');
  std::filesystem::create_symlink(scratchFolder + ".outside", scratchFolder + "/out.bin");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (auto binary = kiln::parseKilnModel(bytes, false, "fuzz.kiln", scratchFolder)) checkRoundTrip(**binary, "binary");
  if (auto text = kiln::parseKilnModel(bytes, true, "fuzz.kiln", scratchFolder)) checkRoundTrip(**text, "text");
  return 0;
}
