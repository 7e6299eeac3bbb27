// The CUDA runtime on the emulated GPU (test/devices/emulator/): compiled
// programs run by CudaRunner through the CudaExecutor, against the
// interpreter — a replayed CUDA graph reads each run's new inputs, the
// allocator's statistics account for exactly the runner's buffers,
// out-of-memory and kernel faults give their messages. Faults break the
// emulated context for the rest of the process (as on a GPU), so those
// tests run in a fresh child process.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "codegen/cuda/CudaExecutor.h"
#include "ir/Parser.h"
#include "runtime/Interpreter.h"
#include "runtime/cuda/CudaContext.h"
#include "runtime/cuda/CudaDevices.h"
#include "test/unit/EmulatedGpu.h"

namespace kiln {
namespace {

constexpr const char* kModel = R"(
func @f(%x: f32[64,33], %w: f32[33,8], %b: f32[8]) -> ("y": f32[64,8], "s": f32[64]) {
  %m = matmul(%x, %w) : f32[64,8]
  %a = add(%m, %b) : f32[64,8]
  %y = tanh(%a) : f32[64,8]
  %s = reduce_sum(%x) {axes = [1]} : f32[64]
  return %y, %s
}
)";

using test::emulatorContext;

Tensor random(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(DType::F32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int64_t i = 0; i < t.numElements(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

void expectClose(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.type(), want.type());
  for (int64_t i = 0; i < got.numElements(); ++i)
    ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5 + 1e-4 * std::abs(want.data<float>()[i])) << "at " << i;
}

/// Runs `executor` on `inputs` and expects each result to be the
/// interpreter's on the same inputs.
void expectRunMatchesTheInterpreter(codegen::CudaExecutor& executor, const Function& f,
                                    const std::vector<Tensor>& inputs) {
  auto got = executor.run(inputs);
  ASSERT_TRUE(got) << got.error().message();
  auto want = interpret(f, inputs);
  ASSERT_TRUE(want) << want.error().message();
  ASSERT_EQ(got->size(), want->size());
  for (size_t r = 0; r < got->size(); ++r) expectClose((*got)[r], (*want)[r]);
}

std::unique_ptr<Module> model() {
  auto m = parseModule(kModel, "cuda-runner-test.kir");
  EXPECT_TRUE(m) << m.error().message();
  return std::move(*m);
}

/// Runs `body` in a fresh process (gtest's threadsafe death-test style
/// starts the test binary again, so no lock another thread held at fork
/// time is inherited) and expects it to exit with 0; `body` returns the
/// exit status.
#define EXPECT_CHILD_SUCCEEDS(body)                                        \
  do {                                                                     \
    GTEST_FLAG_SET(death_test_style, "threadsafe");                        \
    EXPECT_EXIT(std::exit((body)()), ::testing::ExitedWithCode(0), "");    \
  } while (0)

TEST(CudaRunnerTest, GraphReplayReadsEachRunsInputs) {
  KILN_REQUIRE_EMULATOR();
  auto m = model();
  const Function& f = *m->functions().front();
  auto executor = codegen::CudaExecutor::create(f, emulatorContext());
  ASSERT_TRUE(executor) << executor.error().message();
  // Run 1 runs eagerly, run 2 captures the graph and launches it, runs 3
  // and 4 replay it: every run must see its own inputs, not the captured ones.
  for (uint32_t run = 0; run < 4; ++run) {
    expectRunMatchesTheInterpreter(**executor, f,
                                   {random({64, 33}, 10 + run), random({33, 8}, 20 + run), random({8}, 30 + run)});
  }
  ASSERT_NE((*executor)->lastRunner(), nullptr);
  EXPECT_EQ((*executor)->lastRunner()->graphReplays(), 3);
}

/// hard_swish on the emulated GPU against the interpreter, over its three
/// pieces, its kinks at -3 and 3 and the special values.
TEST(CudaRunnerTest, HardSwishMatchesTheInterpreter) {
  KILN_REQUIRE_EMULATOR();
  auto m = parseModule("func @f(%x: f32[2,7]) -> f32[2,7] {\n  %y = hard_swish(%x) : f32[2,7]\n  return %y\n}\n",
                       "hard-swish.kir");
  ASSERT_TRUE(m) << m.error().message();
  const Function& f = *(*m)->functions().front();
  auto executor = codegen::CudaExecutor::create(f, emulatorContext());
  ASSERT_TRUE(executor) << executor.error().message();
  Tensor x(DType::F32, {2, 7});
  const float values[] = {-5, -3, -2.75f, -1, -0.0f, 0.5f, 2.5f, 3, 7, 1e-3f, -1e-3f, 2.99f, NAN, INFINITY};
  for (int64_t i = 0; i < 14; ++i) x.data<float>()[i] = values[i];
  auto got = (*executor)->run({x});
  ASSERT_TRUE(got) << got.error().message();
  auto want = interpret(f, {x});
  ASSERT_TRUE(want) << want.error().message();
  for (int64_t i = 0; i < 14; ++i) {
    const float g = (*got)[0].data<float>()[i], w = (*want)[0].data<float>()[i];
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << "x = " << values[i];
    } else if (std::isinf(w)) {
      EXPECT_EQ(g, w) << "x = " << values[i];
    } else {
      EXPECT_NEAR(g, w, 1e-6 * (1 + std::abs(w))) << "x = " << values[i];
    }
  }
}

TEST(CudaRunnerTest, WithoutGraphsEveryRunLaunches) {
  KILN_REQUIRE_EMULATOR();
  auto m = model();
  const Function& f = *m->functions().front();
  codegen::CudaOptions options;
  options.run.graphs = false;
  auto executor = codegen::CudaExecutor::create(f, emulatorContext(), options);
  ASSERT_TRUE(executor) << executor.error().message();
  for (uint32_t run = 0; run < 3; ++run) {
    expectRunMatchesTheInterpreter(**executor, f,
                                   {random({64, 33}, 40 + run), random({33, 8}, 50 + run), random({8}, 60 + run)});
  }
  EXPECT_EQ((*executor)->lastRunner()->graphReplays(), 0);
}

TEST(CudaRunnerTest, ProfileTimesEveryStepWithEventsAndReplaysNoGraph) {
  // `kiln run --device cuda --profile`: one entry per step, each timed on
  // every run (CUDA events around it), the matmul's flops counted as the
  // CPU counts them (2 x 64 x 33 x 8), and no graph replayed.
  KILN_REQUIRE_EMULATOR();
  auto m = model();
  const Function& f = *m->functions().front();
  StepProfile profile;
  codegen::CudaOptions options;
  options.run.profile = &profile;
  auto executor = codegen::CudaExecutor::create(f, emulatorContext(), options);
  ASSERT_TRUE(executor) << executor.error().message();
  for (uint32_t run = 0; run < 3; ++run) {
    expectRunMatchesTheInterpreter(**executor, f,
                                   {random({64, 33}, 70 + run), random({33, 8}, 80 + run), random({8}, 90 + run)});
  }
  const cuda::CudaRunner* runner = (*executor)->lastRunner();
  ASSERT_NE(runner, nullptr);
  EXPECT_EQ(runner->graphReplays(), 0);
  ASSERT_EQ(profile.entries.size(), runner->program().plan.steps.size());
  int libraryCalls = 0;
  for (const StepProfile::Entry& e : profile.entries) {
    EXPECT_EQ(e.calls, 3) << e.name;
    EXPECT_GE(e.seconds, 0) << e.name;
    if (e.what.find("cublasLt") != std::string::npos) {
      ++libraryCalls;
      EXPECT_EQ(e.flops, 2.0 * 64 * 33 * 8) << e.what;
    } else {
      EXPECT_EQ(e.flops, 0) << e.what;
    }
  }
  EXPECT_EQ(libraryCalls, 1);
  EXPECT_NE(profile.format().find("library calls"), std::string::npos);
}

TEST(CudaRunnerTest, AllocatorAccountsForTheRunnersBuffers) {
  KILN_REQUIRE_EMULATOR();
  auto ctx = emulatorContext();
  const cuda::MemoryStats before = ctx->allocator().stats();
  {
    auto m = model();
    auto executor = codegen::CudaExecutor::create(*m->functions().front(), ctx);
    ASSERT_TRUE(executor);
    std::vector<Tensor> inputs{random({64, 33}, 1), random({33, 8}, 2), random({8}, 3)};
    ASSERT_TRUE((*executor)->run(inputs));
    const cuda::MemoryStats during = ctx->allocator().stats();
    // The three arguments, the two results and the arena at least, each
    // rounded to 512 bytes: x is 64*33*4 = 8448 bytes.
    EXPECT_GE(during.allocated - before.allocated, 8704 + 1536 + 512 + 2048 + 512);
    EXPECT_GE(during.allocations - before.allocations, 6);
    EXPECT_GE(during.reserved, during.allocated);
  }
  // The runner gave everything back.
  const cuda::MemoryStats after = ctx->allocator().stats();
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_GT(after.numFrees, before.numFrees);
}

TEST(CudaRunnerTest, OutOfMemorySaysHowMuchWasAskedFor) {
  KILN_REQUIRE_EMULATOR();
  auto ctx = emulatorContext();
  ctx->allocator().emptyCache();  // what earlier tests left cached would serve it
  ctx->allocator().setLimit(4096);
  auto m = model();
  auto executor = codegen::CudaExecutor::create(*m->functions().front(), ctx);
  ASSERT_TRUE(executor);
  std::vector<Tensor> inputs{random({64, 33}, 1), random({33, 8}, 2), random({8}, 3)};
  auto got = (*executor)->run(inputs);
  ctx->allocator().setLimit(std::nullopt);
  ASSERT_FALSE(got);
  const std::string message = got.error().message();
  EXPECT_NE(message.find("CUDA out of memory: tried to allocate 8.25 KiB on cuda:0 (Kiln emulated GPU)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("the memory limit is 4.00 KiB"), std::string::npos) << message;
  EXPECT_NE(message.find("(for input 'x' of program 'f')"), std::string::npos) << message;
}

/// A program of one kernel that stores through a null pointer: the run
/// fails with the driver's error, and with CUDA_LAUNCH_BLOCKING=1 the error
/// names the kernel.
constexpr const char* kFaultingPtx = R"(
.version 8.0
.target sm_75
.address_size 64
.visible .entry kiln_bad_0(.param .u64 in, .param .u64 out, .param .u64 sizes) {
  .reg .b64 %rd<2>;
  .reg .f32 %f<2>;
  mov.u64 %rd1, 0;
  mov.f32 %f1, 0f3F800000;
  st.global.f32 [%rd1], %f1;
  ret;
}
)";

std::shared_ptr<cuda::CudaProgram> faultingProgram() {
  auto program = std::make_shared<cuda::CudaProgram>();
  Program& p = program->plan;
  p.name = "bad";
  const TensorType type{DType::F32, staticShape({4})};
  p.arguments.push_back({"x", type, false, Tensor()});
  p.slots.push_back({Program::SlotKind::Argument, type, 0});
  p.slots.push_back({Program::SlotKind::Output, type, 0});
  Program::Step step;
  step.name = "y";
  step.what = "store through null";
  step.kernel = 0;
  step.operands = {0};
  step.result = 1;
  p.steps.push_back(step);
  p.results.push_back({"y", 1, -1});
  p.kernelNames = {"kiln_bad_0"};
  p.kernelHashes = {"0"};
  p.arenaBytes = 64;
  program->launches = {{4, 32}};
  program->ptxArch = 75;
  program->ptx = kFaultingPtx;
  return program;
}

int runFaultingProgram(bool blocking, std::string& message) {
  if (blocking) setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
  auto runner = cuda::CudaRunner::create(faultingProgram(), emulatorContext());
  if (!runner) {
    fprintf(stderr, "%s\n", runner.error().message().c_str());
    return 3;
  }
  auto got = (*runner)->run({random({4}, 1)});
  if (got) return 4;
  message = got.error().message();
  return 0;
}

TEST(CudaRunnerTest, KernelFaultIsAnErrorNamingTheCall) {
  KILN_REQUIRE_EMULATOR();
  EXPECT_CHILD_SUCCEEDS([] {
    std::string message;
    if (int rc = runFaultingProgram(false, message)) return rc;
    const bool ok = message.find("CUDA error while running 'bad' on cuda:0 (Kiln emulated GPU): "
                                 "CUDA_ERROR_ILLEGAL_ADDRESS") != std::string::npos &&
                    message.find("run with CUDA_LAUNCH_BLOCKING=1") != std::string::npos;
    if (!ok) fprintf(stderr, "unexpected message: %s\n", message.c_str());
    return ok ? 0 : 1;
  });
}

TEST(CudaRunnerTest, LaunchBlockingNamesTheFailingKernel) {
  KILN_REQUIRE_EMULATOR();
  EXPECT_CHILD_SUCCEEDS([] {
    std::string message;
    if (int rc = runFaultingProgram(true, message)) return rc;
    const bool ok = message.find("CUDA error while running kernel kiln_bad_0 (store through null) on cuda:0") !=
                        std::string::npos &&
                    message.find("CUDA_ERROR_ILLEGAL_ADDRESS") != std::string::npos;
    if (!ok) fprintf(stderr, "unexpected message: %s\n", message.c_str());
    return ok ? 0 : 1;
  });
}

/// A training-like step: the parameter `w` is donated, its new value
/// w + mean(x) replaces it.
constexpr const char* kStep = R"(
func @step(%w: f32[16], %x: f32[16]) -> ("loss": f32[], "w": f32[16]) {
  %s = reduce_sum(%x) {axes = [0]} : f32[]
  %n = add(%w, %x) : f32[16]
  %l = reduce_sum(%n) {axes = [0]} : f32[]
  return %l, %n
}
)";

/// Elementwise maps over f32 and i32 take 4 elements per thread step with
/// vector loads and stores (CudaEmitter.h), and a scalar tail; the emulated
/// GPU faults on a misaligned vector access, so these runs check that the
/// runner's buffers (arguments, results, the arena's intermediates) are
/// aligned for them, and that the tail covers what the vectors do not.
TEST(CudaRunnerTest, VectorizedElementwiseMapsMatchTheInterpreterAtOddSizes) {
  KILN_REQUIRE_EMULATOR();
  for (const int64_t n : {1, 3, 4, 1027}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const std::string type = "[" + std::to_string(n) + "]";
    auto m = parseModule("func @f(%x: f32" + type + ", %y: f32" + type + ", %k: i32" + type + ") -> (\"z\": f32" +
                             type + ", \"j\": i32" + type + ", \"s\": f32[]) {\n" + "  %a = add(%x, %y) : f32" + type +
                             "\n  %m = mul(%a, %x) : f32" + type + "\n  %z = tanh(%m) : f32" + type +
                             "\n  %j = mul(%k, %k) : i32" + type +
                             "\n  %s = reduce_sum(%a) {axes = [0]} : f32[]\n  return %z, %j, %s\n}\n",
                         "vector.kir");
    ASSERT_TRUE(m) << m.error().message();
    const Function& f = *(*m)->functions().front();
    Tensor k(DType::I32, {n});
    for (int64_t i = 0; i < n; ++i) k.data<int32_t>()[i] = static_cast<int32_t>(i * 7919 - 5000);
    const std::vector<Tensor> inputs{random({n}, 70), random({n}, 71), k};
    auto executor = codegen::CudaExecutor::create(f, emulatorContext());
    ASSERT_TRUE(executor) << executor.error().message();
    auto program = (*executor)->compiledProgram(inputs);
    ASSERT_TRUE(program) << program.error().message();
    // With no whole vector (n < 4) the compiler drops the vector loop.
    if (n >= 4) {
      EXPECT_NE(program->second->ptx.find(".v4.f32"), std::string::npos);
      EXPECT_NE(program->second->ptx.find(".v4.u32"), std::string::npos);
    }
    auto got = (*executor)->run(inputs);
    ASSERT_TRUE(got) << got.error().message();
    auto want = interpret(f, inputs);
    ASSERT_TRUE(want) << want.error().message();
    expectClose((*got)[0], (*want)[0]);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ((*got)[1].data<int32_t>()[i], (*want)[1].data<int32_t>()[i]) << "at " << i;
    expectClose((*got)[2], (*want)[2]);
  }
}

TEST(CudaRunnerTest, DonatedValuesStayOnTheDeviceUntilSynced) {
  KILN_REQUIRE_EMULATOR();
  auto m = parseModule(kStep, "step.kir");
  ASSERT_TRUE(m) << m.error().message();
  const Function& f = *(*m)->functions().front();
  codegen::CudaOptions options;
  options.aliases = {ResultAlias{1, 0}};
  options.run.keepDonated = true;
  auto executor = codegen::CudaExecutor::create(f, emulatorContext(), options);
  ASSERT_TRUE(executor) << executor.error().message();
  std::vector<Tensor> inputs{random({16}, 1), random({16}, 2)};
  const Tensor w0 = inputs[0];
  std::vector<Tensor> want = {inputs[0], inputs[1]};
  const uint8_t* host = inputs[0].raw();
  // Four steps, graph-captured or replayed after the first, with a
  // new x each time; w lives on the device, its host tensor untouched.
  for (uint32_t k = 0; k < 4; ++k) {
    inputs[1] = random({16}, 10 + k);
    want[1] = inputs[1];
    auto got = (*executor)->runInPlace(inputs);
    ASSERT_TRUE(got) << got.error().message();
    auto reference = interpret(f, want);
    ASSERT_TRUE(reference);
    expectClose((*got)[0], (*reference)[0]);  // the loss comes back every step
    EXPECT_EQ((*got)[1].numBytes(), 0u);
    want[0] = (*reference)[1];
    ASSERT_EQ(inputs[0].raw(), host);
    expectClose(inputs[0], w0);  // stale until synced
  }
  // Step 1 copies w in (eager); step 2, the first with w resident, is captured and launched; 3 and 4 replay.
  EXPECT_EQ((*executor)->lastRunner()->graphReplays(), 3);
  ASSERT_TRUE((*executor)->syncDonated());
  expectClose(inputs[0], want[0]);
  // run() leaves inputs alone and starts from the host's value.
  auto again = (*executor)->run(inputs);
  ASSERT_TRUE(again);
  auto reference = interpret(f, inputs);
  ASSERT_TRUE(reference);
  expectClose((*again)[1], (*reference)[1]);
}

TEST(CudaRunnerTest, NextInputsAreCopiedAheadAndUsedOnlyWhenTheSame) {
  KILN_REQUIRE_EMULATOR();
  auto m = parseModule(kStep, "step.kir");
  ASSERT_TRUE(m) << m.error().message();
  const Function& f = *(*m)->functions().front();
  codegen::CudaOptions options;
  options.aliases = {ResultAlias{1, 0}};
  options.run.keepDonated = true;
  auto executor = codegen::CudaExecutor::create(f, emulatorContext(), options);
  ASSERT_TRUE(executor) << executor.error().message();
  std::vector<Tensor> batches;
  for (uint32_t k = 0; k < 6; ++k) batches.push_back(random({16}, 100 + k));
  std::vector<Tensor> inputs{random({16}, 1), batches[0]};
  std::vector<Tensor> want = inputs;
  for (size_t k = 0; k < batches.size(); ++k) {
    // Step 3 is given a copy of the batch staged for it (other host memory):
    // it must copy that one in, not use what was staged.
    if (k == 3) batches[3] = Tensor(batches[3]);
    // Moved, as the trainer binds a batch: the same host memory as staged.
    if (k > 0) inputs[1] = std::move(batches[k]);
    want[1] = inputs[1];
    std::vector<const Tensor*> next{nullptr, k + 1 < batches.size() ? &batches[k + 1] : nullptr};
    auto got = (*executor)->runInPlace(inputs, &next);
    ASSERT_TRUE(got) << got.error().message();
    auto reference = interpret(f, want);
    ASSERT_TRUE(reference);
    expectClose((*got)[0], (*reference)[0]);
    want[0] = (*reference)[1];
  }
  ASSERT_TRUE((*executor)->syncDonated());
  expectClose(inputs[0], want[0]);
}

/// Whether `a` and `b` hold the same bytes.
bool sameBytes(const Tensor& a, const Tensor& b) {
  return a.type() == b.type() && std::memcmp(a.raw(), b.raw(), a.numBytes()) == 0;
}

TEST(CudaRunnerTest, EachRunStagesEachInputOnceAndTimesTheCopiesApart) {
  // `kiln run --device cuda --bench --json`: a run reads the caller's
  // tensors where they are (no copy of its own), copies each input once
  // into pinned staging and once to the device, each result once back and
  // once out of staging; with timeRuns, the copies and the steps are timed
  // apart. The same whether the steps launch (run 1) or replay (2 and 3).
  KILN_REQUIRE_EMULATOR();
  auto m = model();
  const Function& f = *m->functions().front();
  codegen::CudaOptions options;
  options.run.timeRuns = true;
  auto executor = codegen::CudaExecutor::create(f, emulatorContext(), options);
  ASSERT_TRUE(executor) << executor.error().message();
  const uint64_t inputBytes = (64 * 33 + 33 * 8 + 8) * 4, resultBytes = (64 * 8 + 64) * 4;
  for (uint32_t run = 0; run < 3; ++run) {
    const std::vector<Tensor> inputs{random({64, 33}, 1 + run), random({33, 8}, 2 + run), random({8}, 3 + run)};
    const std::vector<Tensor> before = inputs;
    expectRunMatchesTheInterpreter(**executor, f, inputs);
    for (size_t i = 0; i < inputs.size(); ++i) EXPECT_TRUE(sameBytes(inputs[i], before[i])) << "input " << i;
    const cuda::CudaRunStats& stats = (*executor)->lastRunner()->lastRunStats();
    EXPECT_EQ(stats.stagedInputs, 3) << "run " << run;
    EXPECT_EQ(stats.stagedInputBytes, inputBytes);
    EXPECT_EQ(stats.hostToDeviceCopies, 3);
    EXPECT_EQ(stats.hostToDeviceBytes, inputBytes);
    EXPECT_EQ(stats.deviceToHostCopies, 2);
    EXPECT_EQ(stats.deviceToHostBytes, resultBytes);
    EXPECT_EQ(stats.stagedResults, 2);
    EXPECT_EQ(stats.stagedResultBytes, resultBytes);
    ASSERT_TRUE(stats.timed);
    EXPECT_GT(stats.deviceMs, 0);
    EXPECT_GE(stats.copyInMs, 0);
    EXPECT_GE(stats.copyOutMs, 0);
  }
  EXPECT_EQ((*executor)->lastRunner()->graphReplays(), 2);
}

TEST(CudaRunnerTest, RunReturnsADonatedArgumentsNewValueAndLeavesTheInputAlone) {
  // run() (not runInPlace) of a program with a donated argument: the new
  // value comes back as a result, copied once out of staging, and the
  // caller's tensor keeps its old value.
  KILN_REQUIRE_EMULATOR();
  auto m = parseModule(kStep, "step.kir");
  ASSERT_TRUE(m) << m.error().message();
  const Function& f = *(*m)->functions().front();
  codegen::CudaOptions options;
  options.aliases = {ResultAlias{1, 0}};
  auto executor = codegen::CudaExecutor::create(f, emulatorContext(), options);
  ASSERT_TRUE(executor) << executor.error().message();
  const std::vector<Tensor> inputs{random({16}, 5), random({16}, 6)};
  const std::vector<Tensor> before = inputs;
  for (int run = 0; run < 2; ++run) {
    expectRunMatchesTheInterpreter(**executor, f, inputs);  // the loss and the new value
    EXPECT_TRUE(sameBytes(inputs[0], before[0]));
    const cuda::CudaRunStats& stats = (*executor)->lastRunner()->lastRunStats();
    EXPECT_EQ(stats.stagedInputs, 2);
    EXPECT_EQ(stats.stagedResults, 2);
    EXPECT_EQ(stats.deviceToHostCopies, 2);
    EXPECT_FALSE(stats.timed);  // timeRuns is off
  }
}

TEST(CudaRunnerTest, LargeInputsAreStagedByThreadsInBlocks) {
  // An input of 4 MiB or more is copied into staging by several threads,
  // 1 MiB each: every byte arrives, the partial last block included.
  KILN_REQUIRE_EMULATOR();
  constexpr int64_t n = (int64_t{5} << 18) + 7;  // 5 MiB + 28 bytes of f32
  const std::string text = "func @f(%x: f32[" + std::to_string(n) + "]) -> f32[" + std::to_string(n) +
                           "] {\n  %y = neg(%x) : f32[" + std::to_string(n) + "]\n  return %y\n}\n";
  auto m = parseModule(text, "large.kir");
  ASSERT_TRUE(m) << m.error().message();
  const Function& f = *(*m)->functions().front();
  auto executor = codegen::CudaExecutor::create(f, emulatorContext());
  ASSERT_TRUE(executor) << executor.error().message();
  Tensor x(DType::F32, {n});
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = static_cast<float>(i % 1000003);
  auto got = (*executor)->run({x});
  ASSERT_TRUE(got) << got.error().message();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ((*got)[0].data<float>()[i], -x.data<float>()[i]) << "at " << i;
  EXPECT_EQ((*executor)->lastRunner()->lastRunStats().stagedInputBytes, static_cast<uint64_t>(n) * 4);
}

TEST(CudaRunnerTest, ProgramRefusesInputsOfOtherShapes) {
  KILN_REQUIRE_EMULATOR();
  auto m = model();
  auto executor = codegen::CudaExecutor::create(*m->functions().front(), emulatorContext());
  ASSERT_TRUE(executor);
  std::vector<Tensor> inputs{random({64, 33}, 1), random({33, 8}, 2), random({8}, 3)};
  auto compiled = (*executor)->compiledProgram(inputs);
  ASSERT_TRUE(compiled);
  auto runner = cuda::CudaRunner::create(compiled->second, emulatorContext());
  ASSERT_TRUE(runner);
  inputs[0] = random({32, 33}, 1);
  auto got = (*runner)->run(inputs);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().message(),
            "input 0 ('x') of 'f' is f32[32,33], expected f32[64,33] (the program was compiled for these shapes)");
}

}  // namespace
}  // namespace kiln
