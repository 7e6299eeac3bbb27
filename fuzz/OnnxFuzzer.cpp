// libFuzzer target for the ONNX importer: any bytes given to importOnnxBytes
// (with the interpreter folding constants, as `kiln run` does) must give a
// Module or an error, never crash, hang or leak. An imported model must
// verify, and must survive a write and read in the Kiln graph format, so
// `kiln convert model.onnx -o model.kiln` is exercised on every model the
// fuzzer gets through the importer. The same bytes go to the reader of
// value files (parseOnnxValue: TensorProto, SequenceProto, OptionalProto),
// which must give a value or an error too.
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "frontend/KilnFormat.h"
#include "frontend/onnx/OnnxImporter.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "runtime/Interpreter.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::InterpreterEvaluator evaluator;
  kiln::LoadOptions options;
  options.evaluator = &evaluator;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (kiln::OnnxValueFile kind :
       {kiln::OnnxValueFile::Tensor, kiln::OnnxValueFile::Sequence, kiln::OnnxValueFile::Optional})
    (void)kiln::parseOnnxValue(bytes, kind, "fuzz.pb");
  auto module = kiln::importOnnxBytes(bytes, "fuzz.onnx", "", options);
  if (!module) return 0;
  if (kiln::Status s = kiln::verify(**module); !s) {
    std::fprintf(stderr, "imported model does not verify: %s\n%s", s.error().str().c_str(),
                 kiln::print(**module).c_str());
    std::abort();
  }
  // The Kiln format keeps node locations but not the function's or the
  // return's, which the importer sets; compare without them.
  kiln::Function& f = *(*module)->functions().front();
  f.setLoc({});
  if (kiln::Op* ret = f.returnOp()) ret->setLoc({});
  auto written = kiln::serializeKilnModel(**module, false);
  if (!written) return 0;  // names that are not UTF-8 cannot be written; the writer says so
  auto back = kiln::parseKilnModel(*written, false, "fuzz.onnx", "");
  if (!back) {
    std::fprintf(stderr, "imported model, written as .kiln, does not read back: %s\n%s", back.error().str().c_str(),
                 kiln::print(**module).c_str());
    std::abort();
  }
  if (kiln::print(**back) != kiln::print(**module)) {
    std::fprintf(stderr, "imported model changes through .kiln:\n%s---\n%s", kiln::print(**module).c_str(),
                 kiln::print(**back).c_str());
    std::abort();
  }
  return 0;
}
