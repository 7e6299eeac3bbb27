// A backend registered from this folder alone (StubBackend.h) is a target
// of kiln-opt, run through its library entry point (tools/KilnOpt.h): its
// pipeline runs, and its kernel-level steps print with its own schedule.
// Its compiler's program and a `.kc` of it round-trip through the registry.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "codegen/Backend.h"
#include "ir/Parser.h"
#include "runtime/KcFile.h"
#include "test/unit/TestSupport.h"
#include "test/unit/stub-backend/StubBackend.h"
#include "tools/KilnOpt.h"

namespace kiln {
namespace {

constexpr std::string_view kAddRelu = R"(
func @add_relu(%x: f32[4,8], %y: f32[4,8]) -> f32[4,8] {
  %s = add(%x, %y) : f32[4,8]
  %r = relu(%s) : f32[4,8]
  return %r
}
)";

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// kiln-opt with `args` after the program's name; returns its exit status
/// and fills `err` with what it printed to stderr.
int runKilnOpt(std::vector<std::string> args, std::string& err) {
  args.insert(args.begin(), "kiln-opt");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStderr();
  const int status = kilnOptMain(static_cast<int>(argv.size()), argv.data());
  err = testing::internal::GetCapturedStderr();
  return status;
}

TEST(StubBackendTest, KilnOptRunsARegisteredBackendsPipeline) {
  ASSERT_TRUE(test::registerStubBackend().ok());
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kiln-stub-backend-test";
  std::filesystem::create_directories(dir);
  const std::filesystem::path input = dir / "add_relu.kir", output = dir / "out.kir";
  std::ofstream(input) << kAddRelu;

  std::string err;
  ASSERT_EQ(runKilnOpt({input.string(), "--target", "stub", "-O3", "--print-after-all", "--print-kernels", "-o",
                        output.string()},
                       err),
            0)
      << err;
  // The stub's own pipeline ran: its passes, and not the built-in target
  // pipeline's fusion or library selection.
  EXPECT_NE(err.find("IR Dump After decompose"), std::string::npos) << err;
  EXPECT_NE(err.find("IR Dump After dce"), std::string::npos) << err;
  EXPECT_EQ(err.find("IR Dump After fuse"), std::string::npos) << err;
  EXPECT_EQ(err.find("IR Dump After select-library"), std::string::npos) << err;
  // Then its kernel-level steps: lowered, scheduled by the stub, planned.
  const size_t lowered = err.find("// -----// Kernels After lower-to-kernels //----- //");
  const size_t scheduled = err.find("// -----// Kernels After schedule-kernels //----- //");
  const size_t planned = err.find("// -----// Memory Plan After plan-memory //----- //");
  ASSERT_NE(lowered, std::string::npos) << err;
  ASSERT_NE(scheduled, std::string::npos) << err;
  ASSERT_NE(planned, std::string::npos) << err;
  EXPECT_LT(lowered, scheduled);
  EXPECT_LT(scheduled, planned);
  EXPECT_NE(err.find("kernels of @add_relu for stub:", scheduled), std::string::npos) << err;
  EXPECT_NE(err.find("} schedule stub:", scheduled), std::string::npos) << err;
  EXPECT_NE(err.find("// memory plan @add_relu: 2 kernels", planned), std::string::npos) << err;
  // One kernel per op: no fusion.
  const std::string printed = readFile(output);
  EXPECT_NE(printed.find("// kernels of @add_relu for stub:"), std::string::npos) << printed;
  EXPECT_NE(printed.find("// kernel @kiln_add_0("), std::string::npos) << printed;
  EXPECT_NE(printed.find("// kernel @kiln_relu_1("), std::string::npos) << printed;

  // An unknown name lists the registered backends, the stub among them.
  EXPECT_EQ(runKilnOpt({input.string(), "--target", "tpu"}, err), 2);
  EXPECT_NE(err.find("no backend is named 'tpu' (registered: cpu, cuda, stub)"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

TEST(StubBackendTest, ItsProgramIsStoredAndLoadedUnderItsName) {
  ASSERT_TRUE(test::registerStubBackend().ok());
  const codegen::Backend* stub = codegen::backendNamed(test::kStubBackendName);
  ASSERT_NE(stub, nullptr);
  auto m = test::parseVerified(kAddRelu);
  ASSERT_TRUE(m);
  auto compiler = stub->createCompiler(nullptr);
  ASSERT_TRUE(compiler.ok()) << compiler.error().str();
  auto compiled = (*compiler)->compile(*m->functions().front(), nullptr);
  ASSERT_TRUE(compiled.ok()) << compiled.error().str();
  EXPECT_EQ(compiled->device, "stub");
  ASSERT_EQ(compiled->kernels.size(), 2u);
  EXPECT_EQ(compiled->kernels[0].schedule.target, "stub");
  EXPECT_EQ(compiled->program->kernelNames, (std::vector<std::string>{"kiln_add_0", "kiln_relu_1"}));

  // A `.kc` of it names the stub as its device, and only the stub loads it.
  auto bytes = serializeArtifact(*m->functions().front(), *compiled->program, 3, compiled->plan.str(),
                                 compiled->device, compiled->code);
  ASSERT_TRUE(bytes.ok()) << bytes.error().str();
  auto artifact = parseArtifact(*bytes, "stub.kc");
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  EXPECT_EQ(artifact->device, "stub");
  auto loaded = stub->load(*artifact, "stub.kc");
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  EXPECT_EQ(loaded->program->kernelNames, compiled->program->kernelNames);
  auto byCpu = codegen::backendNamed("cpu")->load(*artifact, "stub.kc");
  ASSERT_FALSE(byCpu.ok());
  EXPECT_NE(byCpu.error().message().find("holds a program for stub, not for the CPU"), std::string::npos)
      << byCpu.error().str();
}

}  // namespace
}  // namespace kiln
