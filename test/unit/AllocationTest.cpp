// Allocation that cannot be made is an error naming the value (issue 25):
// byte counts that cannot overflow (ir/ByteSize.h), Tensor::allocate, a
// compiled program's result and the interpreter's under an address-space
// limit (RLIMIT_AS, as `ulimit -v` sets; restored after), and the `.kc`
// writer refusing what its reader would.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include "codegen/cpu/CpuExecutable.h"
#include "ir/ByteSize.h"
#include "ir/Parser.h"
#include "passes/MemoryPlan.h"
#include "runtime/Interpreter.h"
#include "runtime/KcFile.h"

namespace kiln {
namespace {

using codegen::CpuExecutor;

// AddressSanitizer reports an impossible allocation and ends the process
// instead of letting operator new throw std::bad_alloc, which these tests
// ask for on purpose (scripts/test --sanitize).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_SKIP_UNDER_ASAN() GTEST_SKIP() << "AddressSanitizer ends the process on an impossible allocation"
#endif
#endif
#ifndef KILN_SKIP_UNDER_ASAN
#define KILN_SKIP_UNDER_ASAN() (void)0
#endif

TEST(ByteSizeTest, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(1023), "1023 B");
  EXPECT_EQ(formatBytes(1024), "1.0 KiB");
  EXPECT_EQ(formatBytes(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(formatBytes(uint64_t{8} << 30), "8.0 GiB");
  EXPECT_EQ(formatBytes(uint64_t{4} << 40), "4.0 TiB");
  EXPECT_EQ(formatBytes(~uint64_t{0}), "16.0 EiB");
}

TEST(ByteSizeTest, CountsWithoutOverflow) {
  const std::vector<int64_t> big{1024, 1024, 1024, 1024};
  EXPECT_EQ(tensorByteSize(DType::F32, big), uint64_t{4} << 40);
  // 2^80 elements, and 2^61 elements of 8 bytes: both overflow 63 bits.
  EXPECT_EQ(tensorByteSize(DType::F32, std::vector<int64_t>{1 << 20, 1 << 20, 1 << 20, 1 << 20}), std::nullopt);
  EXPECT_EQ(tensorByteSize(DType::F64, std::vector<int64_t>{int64_t{1} << 61}), std::nullopt);
  EXPECT_EQ(tensorByteSize(DType::F32, std::vector<int64_t>{-1}), std::nullopt);
  EXPECT_EQ(tensorByteSize(DType::I8, std::vector<int64_t>{}), 1u);
  EXPECT_EQ(tensorByteSize(TensorType{DType::F32, {Dim::symbolic("N")}}), std::nullopt);
}

TEST(AllocationTest, OverflowingAndImpossibleSizesAreErrors) {
  KILN_SKIP_UNDER_ASAN();
  auto overflow = Tensor::allocate(DType::F32, {1 << 20, 1 << 20, 1 << 20, 1 << 20}, "%y", "broadcast 'node_3'");
  ASSERT_FALSE(overflow.ok());
  EXPECT_EQ(overflow.error().message(),
            "cannot allocate more than 8 EiB for %y: f32[1048576,1048576,1048576,1048576] (its size overflows 64 "
            "bits) (broadcast 'node_3')");
  // 2^62 bytes: more than any address space, so operator new fails.
  auto huge = Tensor::allocate(DType::I32, {int64_t{1} << 30, int64_t{1} << 30}, "%z");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().message(), "cannot allocate 4.0 EiB for %z: i32[1073741824,1073741824]");
  auto small = Tensor::allocate(DType::F32, {2, 3}, "%w");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->numBytes(), 24u);
  EXPECT_EQ(small->getDouble(5), 0.0);
}

/// Limits this process's address space to `bytes` more than it has now
/// until destroyed.
class AddressSpaceLimit {
 public:
  explicit AddressSpaceLimit(uint64_t bytes) {
    getrlimit(RLIMIT_AS, &saved_);
    rlimit limit = saved_;
    limit.rlim_cur = currentSize() + bytes;
    if (saved_.rlim_max != RLIM_INFINITY && limit.rlim_cur > saved_.rlim_max) limit.rlim_cur = saved_.rlim_max;
    ok_ = setrlimit(RLIMIT_AS, &limit) == 0;
  }
  ~AddressSpaceLimit() { setrlimit(RLIMIT_AS, &saved_); }
  bool ok() const { return ok_; }

 private:
  static uint64_t currentSize() {
    // /proc/self/statm: the size in pages first.
    unsigned long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    return uint64_t{pages} * 4096;
  }
  rlimit saved_{};
  bool ok_ = false;
};

constexpr const char* kBroadcast = R"(
func @big(%x: f32[1]) -> f32[2,1024,1024,1024] {
  %y = broadcast(%x) : f32[2,1024,1024,1024]  loc("big.onnx":"node_3")
  return %y
}
)";

TEST(AllocationTest, AResultThatCannotBeAllocatedIsAnErrorOnTheJitAndTheInterpreter) {
  KILN_SKIP_UNDER_ASAN();
  auto m = parseModule(kBroadcast, "big.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  const Function& f = *(*m)->functions().front();
  auto executor = CpuExecutor::create(f, {.threads = 2});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  std::vector<Tensor> inputs{Tensor(DType::F32, {1})};
  ASSERT_TRUE((*executor)->prepare(inputs).ok());  // compiled without a limit: LLVM needs its memory
  {
    AddressSpaceLimit limit(uint64_t{1} << 30);
    ASSERT_TRUE(limit.ok());
    auto out = (*executor)->run(inputs);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.error().message(),
              "program 'big': cannot allocate 8.0 GiB for %y: f32[2,1024,1024,1024] (broadcast)");
    auto interpreted = interpret(f, inputs);
    ASSERT_FALSE(interpreted.ok());
    EXPECT_EQ(interpreted.error().str(),
              "big.onnx: node 'node_3': error: 'broadcast' cannot allocate 8.0 GiB for %y: f32[2,1024,1024,1024]");
  }
}

TEST(AllocationTest, TheKcWriterRefusesWhatItsReaderWould) {
  auto m = parseModule("func @f(%x: f32[4]) -> f32[4] {\n  %y = neg(%x) : f32[4]\n  return %y\n}\n", "f.kir");
  ASSERT_TRUE(m.ok()) << m.error().str();
  auto executor = CpuExecutor::create(*(*m)->functions().front(), {.threads = 1, .optLevel = 2});
  ASSERT_TRUE(executor.ok()) << executor.error().str();
  std::vector<Tensor> inputs{Tensor(DType::F32, {4})};
  auto compiled = (*executor)->compiledProgram(inputs);
  ASSERT_TRUE(compiled.ok()) << compiled.error().str();
  const Function& optimized = *compiled->first->functions().front();
  ASSERT_TRUE(serializeArtifact(optimized, *compiled->second, 2, "").ok());

  // An argument of 2^42 elements: the program is consistent, but no reader
  // of a .kc takes a type over 2^40 elements, so nothing is written.
  Program program = *compiled->second;
  const TensorType huge{DType::U8, staticShape({int64_t{1} << 21, int64_t{1} << 21})};
  program.arguments[0].type = huge;
  for (Program::Slot& slot : program.slots)
    if (slot.kind == Program::SlotKind::Argument) slot.type = huge;
  ASSERT_TRUE(program.validate().ok());
  auto bytes = serializeArtifact(optimized, program, 2, "");
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.error().message(),
            "cannot write a .kc that Kiln can read back: the .kc of 'f' (program section): corrupt: an argument's "
            "type has a dim of 2097152");
}

}  // namespace
}  // namespace kiln
