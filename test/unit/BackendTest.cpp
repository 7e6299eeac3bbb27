// The backend registry (codegen/Backend.h), the runtime's registry of
// program loaders (runtime/ProgramLoaders.h), and the options each backend
// keeps for itself: a program compiled by a backend's compiler, stored as a
// `.kc` and loaded by its device's loader runs as the interpreter computes;
// CUDA's optimization level is its own, not the CPU's.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "codegen/Backend.h"
#include "codegen/Session.h"
#include "codegen/cpu/CpuBackend.h"
#include "codegen/cuda/CudaBackend.h"
#include "runtime/Interpreter.h"
#include "runtime/KcFile.h"
#include "runtime/ProgramLoaders.h"
#include "runtime/cuda/CudaDevices.h"
#include "runtime/cuda/CudaProgramLoader.h"
#include "test/unit/EmulatedGpu.h"
#include "test/unit/TestSupport.h"

namespace kiln {
namespace {

constexpr std::string_view kAddRelu = R"(
func @add_relu(%x: f32[4,8], %y: f32[4,8]) -> f32[4,8] {
  %s = add(%x, %y) : f32[4,8]
  %r = relu(%s) : f32[4,8]
  return %r
}
)";

std::vector<Tensor> addReluInputs() { return {test::randomF32({4, 8}, 1), test::randomF32({4, 8}, 2)}; }

/// The backend whose name is `name`, never found by a string comparison
/// outside the registry.
class NamedBackend : public codegen::Backend {
 public:
  explicit NamedBackend(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "a name only"; }
  const Target& target() const override { return codegen::cpuBackend().target(); }
  void schedule(kir::Kernel& kernel) const override { codegen::cpuBackend().schedule(kernel); }
  std::string describeLibraryCall(const LibraryCall& call) const override {
    return codegen::cpuBackend().describeLibraryCall(call);
  }
  Expected<std::unique_ptr<codegen::ProgramCompiler>> createCompiler(const codegen::BackendOptions*) const override {
    return Error("compiles nothing");
  }
  Expected<codegen::BackendProgram> load(const CompiledArtifact&, const std::string&) const override {
    return Error("loads nothing");
  }

 private:
  std::string name_;
};

TEST(BackendTest, RegistryNamesTheBuiltInBackends) {
  const auto all = codegen::registeredBackends();
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all[0]->name(), "cpu");
  EXPECT_EQ(all[1]->name(), "cuda");
  EXPECT_EQ(codegen::backendNamed("cpu"), &codegen::cpuBackend());
  EXPECT_EQ(codegen::backendOf(codegen::cudaBackend().target()), &codegen::cudaBackend());
  // The pass pipelines are the backends': the CPU's -O3 fuses, -O2 not.
  EXPECT_NE(codegen::cpuBackend().pipeline(3).find("fuse"), std::string::npos);
  EXPECT_EQ(codegen::cpuBackend().pipeline(2).find("fuse"), std::string::npos);
  auto missing = codegen::findBackend("tpu");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("no backend is named 'tpu' (registered: cpu, cuda"), std::string::npos)
      << missing.error().str();
}

TEST(BackendTest, RegistryRefusesATakenOrMalformedName) {
  Status taken = codegen::registerBackend(std::make_unique<NamedBackend>("cpu"));
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.error().message(), "a backend named 'cpu' is registered already");
  Status malformed = codegen::registerBackend(std::make_unique<NamedBackend>("my gpu"));
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.error().message().find("plain word"), std::string::npos) << malformed.error().str();
  EXPECT_EQ(codegen::backendNamed("my gpu"), nullptr);
}

TEST(BackendTest, ABackendRefusesAnotherBackendsOptions) {
  codegen::CudaCompilerOptions cudaOptions;
  auto compiler = codegen::cpuBackend().createCompiler(&cudaOptions);
  ASSERT_FALSE(compiler.ok());
  EXPECT_EQ(compiler.error().message(), "the cpu backend was given another backend's options");
}

/// The CPU backend's program, stored as a `.kc`, runs through the loader
/// of its device as the interpreter computes; an unknown device is named.
TEST(BackendTest, AStoredCpuProgramRunsThroughItsDevicesLoader) {
  auto m = test::parseVerified(kAddRelu);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  auto compiler = codegen::cpuBackend().createCompiler(nullptr);
  ASSERT_TRUE(compiler.ok()) << compiler.error().str();
  auto compiled = (*compiler)->compile(f, nullptr);
  ASSERT_TRUE(compiled.ok()) << compiled.error().str();
  EXPECT_EQ(compiled->device, "cpu");
  auto bytes = serializeArtifact(f, *compiled->program, 3, compiled->plan.str(), compiled->device, compiled->code);
  ASSERT_TRUE(bytes.ok()) << bytes.error().str();
  auto artifact = parseArtifact(*bytes, "add_relu.kc");
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  ASSERT_TRUE(codegen::cpuBackend().load(*artifact, "add_relu.kc").ok());

  auto loaded = loadProgram(*artifact, "add_relu.kc");
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  const std::vector<Tensor> inputs = addReluInputs();
  auto got = (*loaded)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().str();
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok());
  test::expectClose((*got)[0], (*want)[0], "add_relu from its .kc");

  CompiledArtifact other = *artifact;
  other.device = "tpu";
  auto refused = loadProgram(other, "other.kc");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("compiled for 'tpu', which this process cannot run (it runs programs for: cpu"),
            std::string::npos)
      << refused.error().str();
}

/// A CUDA `.kc` from the CUDA backend's compiler runs through the CUDA
/// runtime's loader on the emulated GPU, with no compiler involved.
TEST(BackendTest, AStoredCudaProgramRunsThroughTheCudaLoader) {
  KILN_REQUIRE_EMULATOR();
  const cuda::LibrarySearchOptions search = test::emulatorOptions();
  auto device = cuda::requireCudaDevice(search, std::nullopt);
  ASSERT_TRUE(device.ok()) << device.error().str();
  auto m = test::parseVerified(kAddRelu);
  ASSERT_TRUE(m);
  const Function& f = *m->functions().front();
  codegen::CudaCompilerOptions options;
  options.search = search;
  options.deviceMajor = device->computeMajor;
  options.deviceMinor = device->computeMinor;
  auto compiler = codegen::cudaBackend().createCompiler(&options);
  ASSERT_TRUE(compiler.ok()) << compiler.error().str();
  auto compiled = (*compiler)->compile(f, nullptr);
  ASSERT_TRUE(compiled.ok()) << compiled.error().str();
  EXPECT_EQ(compiled->device, "cuda");
  auto bytes = serializeArtifact(f, *compiled->program, 3, compiled->plan.str(), compiled->device, compiled->code);
  ASSERT_TRUE(bytes.ok()) << bytes.error().str();
  auto artifact = parseArtifact(*bytes, "add_relu.kc");
  ASSERT_TRUE(artifact.ok()) << artifact.error().str();
  EXPECT_EQ(artifact->device, "cuda");
  ASSERT_TRUE(codegen::cudaBackend().load(*artifact, "add_relu.kc").ok());

  ASSERT_TRUE(cuda::registerCudaProgramLoader(search).ok());
  auto loaded = loadProgram(*artifact, "add_relu.kc");
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  const std::vector<Tensor> inputs = addReluInputs();
  auto got = (*loaded)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().str();
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want.ok());
  test::expectClose((*got)[0], (*want)[0], "add_relu from its CUDA .kc");
}

/// A CUDA session compiles at CUDA's own optimization level: -O2 keeps the
/// add and the relu two kernels while the CPU's level is -O3, which would
/// fuse them (the session used to take CUDA's level from the CPU's).
TEST(BackendTest, CudaTakesItsOwnOptimizationLevel) {
  KILN_REQUIRE_EMULATOR();
  ASSERT_EQ(setenv("KILN_CUDA_DRIVER", test::emulatorDriverPath(), 1), 0);
  SessionOptions options;
  options.device = "cuda";
  options.allowFallback = false;
  options.cpu.optLevel = 3;
  options.cuda.optLevel = 2;
  auto created = Session::create(options);
  unsetenv("KILN_CUDA_DRIVER");
  ASSERT_TRUE(std::holds_alternative<std::unique_ptr<Session>>(created))
      << std::get<DeviceError>(created).error.str();
  auto& session = std::get<std::unique_ptr<Session>>(created);
  auto m = test::parseVerified(kAddRelu);
  ASSERT_TRUE(m);
  auto model = session->compile(*m->functions().front());
  ASSERT_TRUE(model.ok()) << model.error().str();
  ASSERT_NE((*model)->cudaExecutor(), nullptr);
  auto program = (*model)->cudaExecutor()->compiledProgram(addReluInputs());
  ASSERT_TRUE(program.ok()) << program.error().str();
  EXPECT_EQ(program->second->plan.kernelNames.size(), 2u);
}

}  // namespace
}  // namespace kiln
