// Kiln's emulated GPU (test/devices/emulator): the driver API Kiln loads
// through $KILN_CUDA_DRIVER, running kernels that NVRTC compiles from CUDA
// C++ here (warp shuffles, shared-memory reductions, atomics, f64 and f32
// math, integer division of every width, float4 accesses, .func calls),
// and the strictness that makes it worth running: illegal and misaligned
// accesses, launch limits, unknown PTX, host reads before a synchronize,
// missing cross-stream waits (adversarial scheduling), graph replay of
// baked arguments. Each test gets a fresh primary context.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <bit>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/cuda/NvrtcCompiler.h"
#include "runtime/cuda/CudaLibraries.h"
#include "test/unit/EmulatedGpu.h"


namespace kiln::cuda {
namespace {

constexpr CUresult kMisalignedAddress = 716;
constexpr CUresult kNotReady = 600;

/// The entry points the tests call beyond CudaDriverApi and CudaExecApi.
struct Extras {
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);
  CUresult (*cuModuleLoadDataEx)(CUmodule*, const void*, unsigned, int*, void**);
  CUresult (*cuMemAllocHost)(void**, size_t);
  const char* (*kilnEmulatorLastFault)();
  int (*kilnEmulatorEnqueue)(void*, void (*)(void*), void*, void (*)(void*));
  void* (*kilnEmulatorTranslate)(unsigned long long, unsigned long long);
  void (*kilnEmulatorFault)(const char*);
};

using test::emulatorOptions;

template <typename Fn>
void resolveInto(const CudaLibrary& library, const char* name, Fn*& slot) {
  auto address = library.symbol(name);
  ASSERT_TRUE(address) << address.error().message();
  slot = reinterpret_cast<Fn*>(*address);
}

class CudaEmulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto driver = loadCudaDriver(emulatorOptions());
    ASSERT_TRUE(driver) << driver.error().message();
    auto exec = loadCudaExec(emulatorOptions());
    ASSERT_TRUE(exec) << exec.error().message();
    d_ = *driver;
    x_ = *exec;
    const CudaLibrary& l = d_->library;
    resolveInto(l, "cuMemcpyHtoD_v2", e_.cuMemcpyHtoD);
    resolveInto(l, "cuMemcpyDtoH_v2", e_.cuMemcpyDtoH);
    resolveInto(l, "cuMemsetD32Async", e_.cuMemsetD32Async);
    resolveInto(l, "cuStreamQuery", e_.cuStreamQuery);
    resolveInto(l, "cuEventQuery", e_.cuEventQuery);
    resolveInto(l, "cuEventElapsedTime_v2", e_.cuEventElapsedTime);
    resolveInto(l, "cuStreamIsCapturing", e_.cuStreamIsCapturing);
    resolveInto(l, "cuModuleLoadDataEx", e_.cuModuleLoadDataEx);
    resolveInto(l, "cuMemAllocHost_v2", e_.cuMemAllocHost);
    resolveInto(l, "kilnEmulatorLastFault", e_.kilnEmulatorLastFault);
    resolveInto(l, "kilnEmulatorEnqueue", e_.kilnEmulatorEnqueue);
    resolveInto(l, "kilnEmulatorTranslate", e_.kilnEmulatorTranslate);
    resolveInto(l, "kilnEmulatorFault", e_.kilnEmulatorFault);
    ASSERT_EQ(d_->cuInit(0), CUDA_SUCCESS);
    retain();
  }

  void TearDown() override {
    if (retained_) d_->cuDevicePrimaryCtxRelease(0);
  }

  void retain() {
    CUcontext context = nullptr;
    ASSERT_EQ(d_->cuDevicePrimaryCtxRetain(&context, 0), CUDA_SUCCESS);
    ASSERT_EQ(d_->cuCtxSetCurrent(context), CUDA_SUCCESS);
    retained_ = true;
  }

  /// A fresh context (after a sticky error, or to read changed settings).
  void recreateContext() {
    ASSERT_EQ(d_->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    retained_ = false;
    retain();
  }

  std::string lastFault() { return e_.kilnEmulatorLastFault(); }

  /// PTX of `source` from NVRTC, or empty with the test skipped when NVRTC
  /// is missing (CI has it).
  std::string ptxOf(const std::string& source, int arch = 90) {
    auto nvrtc = loadNvrtc();
    if (!nvrtc) {
      skipReason_ = nvrtc.error().message();
      return "";
    }
    auto binary = codegen::compileCudaSource(**nvrtc, source, "emulator_test.cu", arch);
    EXPECT_TRUE(binary) << (binary ? "" : binary.error().message());
    return binary ? binary->ptx : "";
  }

  CUmodule load(const std::string& ptx) {
    CUmodule module = nullptr;
    EXPECT_EQ(x_->cuModuleLoadData(&module, ptx.c_str()), CUDA_SUCCESS) << lastFault();
    return module;
  }

  CUfunction function(CUmodule module, const char* name) {
    CUfunction f = nullptr;
    EXPECT_EQ(x_->cuModuleGetFunction(&f, module, name), CUDA_SUCCESS) << name;
    return f;
  }

  template <typename T>
  CUdeviceptr upload(const std::vector<T>& values) {
    CUdeviceptr p = 0;
    EXPECT_EQ(x_->cuMemAlloc(&p, std::max<size_t>(1, values.size() * sizeof(T))), CUDA_SUCCESS);
    if (!values.empty()) {
      EXPECT_EQ(e_.cuMemcpyHtoD(p, values.data(), values.size() * sizeof(T)), CUDA_SUCCESS);
    }
    return p;
  }

  template <typename T>
  CUdeviceptr allocate(size_t count) {
    CUdeviceptr p = 0;
    EXPECT_EQ(x_->cuMemAlloc(&p, count * sizeof(T)), CUDA_SUCCESS);
    return p;
  }

  template <typename T>
  std::vector<T> download(CUdeviceptr p, size_t count) {
    std::vector<T> values(count);
    EXPECT_EQ(e_.cuMemcpyDtoH(values.data(), p, count * sizeof(T)), CUDA_SUCCESS) << lastFault();
    return values;
  }

  /// Launches `f` on `stream` with `args` (each passed by address).
  template <typename... Args>
  CUresult launch(CUfunction f, unsigned grid, unsigned block, CUstream stream, unsigned shared, Args... args) {
    void* params[] = {static_cast<void*>(&args)..., nullptr};
    return x_->cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, stream, params, nullptr);
  }

  const CudaDriverApi* d_ = nullptr;
  const CudaExecApi* x_ = nullptr;
  Extras e_{};
  bool retained_ = false;
  std::string skipReason_;
};

#define KILN_PTX_OR_SKIP(var, source)        \
  const std::string var = ptxOf(source);     \
  if (var.empty() && !skipReason_.empty()) { \
    GTEST_SKIP() << skipReason_;             \
  }                                          \
  ASSERT_FALSE(var.empty())

// ---------------------------------------------------------------------------
// The device as Kiln sees it

TEST_F(CudaEmulatorTest, DescribesAnEmulatedDeviceOfAFutureArchitecture) {
  EXPECT_EQ(emulatorDescription(*d_), "Kiln CUDA emulator 1 (PTX interpreter)");
  char name[64];
  ASSERT_EQ(d_->cuDeviceGetName(name, sizeof name, 0), CUDA_SUCCESS);
  EXPECT_STREQ(name, "Kiln emulated GPU");
  int count = 0, version = 0, value = 0;
  EXPECT_EQ(d_->cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(d_->cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
  const std::pair<int, int> attributes[] = {{1, 1024}, {2, 1024}, {5, 2147483647}, {8, 49152}, {10, 32},
                                            {16, 2},   {20, 0},   {75, 15},        {76, 0}};
  for (auto [attribute, expected] : attributes) {
    EXPECT_EQ(d_->cuDeviceGetAttribute(&value, attribute, 0), CUDA_SUCCESS) << attribute;
    EXPECT_EQ(value, expected) << attribute;
  }
  EXPECT_EQ(d_->cuDeviceGetAttribute(&value, 9999, 0), CUDA_ERROR_INVALID_VALUE);
  CUdevice device = 0;
  EXPECT_EQ(d_->cuDeviceGet(&device, 1), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(CudaEmulatorTest, ErrorNamesAndTextsAreTheDriversOwn) {
  const char* text = nullptr;
  ASSERT_EQ(d_->cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "CUDA_ERROR_ILLEGAL_ADDRESS");
  ASSERT_EQ(d_->cuGetErrorString(CUDA_ERROR_ILLEGAL_ADDRESS, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "an illegal memory access was encountered");
  ASSERT_EQ(d_->cuGetErrorString(kMisalignedAddress, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "misaligned address");
  ASSERT_EQ(d_->cuGetErrorString(CUDA_ERROR_NO_BINARY_FOR_GPU, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "no kernel image is available for execution on the device");
  EXPECT_EQ(d_->errorString(CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
}

TEST_F(CudaEmulatorTest, DevicePointersAreNotHostAddressesAndCopiesAreChecked) {
  CUdeviceptr a = allocate<float>(16), b = allocate<float>(16);
  EXPECT_GE(a, 0x7e0000000000ull);
  EXPECT_LT(a, 0x7f0000000000ull);
  EXPECT_EQ(a % 256, 0u);
  EXPECT_GT(b, a + 64);  // a guard gap: an overrun of a does not reach b
  std::vector<float> host(32);
  EXPECT_EQ(e_.cuMemcpyHtoD(a, host.data(), 65), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(e_.cuMemcpyHtoD(a + 4, host.data(), 64), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(e_.cuMemcpyDtoH(host.data(), a + 60, 8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(e_.cuMemcpyHtoD(a, host.data(), 64), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(e_.cuMemcpyHtoD(a, host.data(), 4), CUDA_ERROR_INVALID_VALUE);  // freed
  CUdeviceptr c = allocate<float>(16);
  EXPECT_NE(c, a);  // not reused right away
}

/// Host memory that the process maps inside the emulated device's address
/// range (Linux's randomized mmap base can put a pinned staging buffer
/// there) is host memory: copies from and to it succeed. A live device
/// allocation passed as the host side is still refused.
TEST_F(CudaEmulatorTest, HostMemoryInTheDeviceAddressRangeIsHostMemory) {
  CUdeviceptr a = allocate<float>(16);
  void* want = reinterpret_cast<void*>(0x7ef000000000ull);
  void* mapped = mmap(want, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (mapped == MAP_FAILED) GTEST_SKIP() << "could not map host memory at " << want;
  ASSERT_EQ(mapped, want);
  auto* host = static_cast<float*>(mapped);
  for (int i = 0; i < 16; ++i) host[i] = static_cast<float>(i) + 0.5f;
  EXPECT_EQ(e_.cuMemcpyHtoD(a, host, 64), CUDA_SUCCESS);
  std::vector<float> back(16);
  EXPECT_EQ(e_.cuMemcpyDtoH(back.data(), a, 64), CUDA_SUCCESS);
  EXPECT_EQ(back[15], 15.5f);
  EXPECT_EQ(e_.cuMemcpyDtoH(host + 16, a, 64), CUDA_SUCCESS);
  EXPECT_EQ(host[31], 15.5f);
  CUdeviceptr b = allocate<float>(16);
  EXPECT_EQ(e_.cuMemcpyHtoD(a, reinterpret_cast<const void*>(b), 64), CUDA_ERROR_INVALID_VALUE);
  munmap(mapped, 4096);
}

TEST_F(CudaEmulatorTest, MemoryLimitComesFromTheEnvironment) {
  setenv("KILN_EMULATOR_MEMORY", "1048576", 1);
  recreateContext();
  unsetenv("KILN_EMULATOR_MEMORY");
  size_t free = 0, total = 0;
  ASSERT_EQ(d_->cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 1048576u);
  EXPECT_EQ(free, 1048576u);
  CUdeviceptr p = 0, q = 0;
  EXPECT_EQ(x_->cuMemAlloc(&p, 2 << 20), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(x_->cuMemAlloc(&p, 600000), CUDA_SUCCESS);
  ASSERT_EQ(d_->cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(free, 1048576u - 600000u);
  EXPECT_EQ(x_->cuMemAlloc(&q, 600000), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(x_->cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuMemAlloc(&q, 600000), CUDA_SUCCESS);
  recreateContext();
  size_t bytes = 0;
  ASSERT_EQ(d_->cuDeviceTotalMem(&bytes, 0), CUDA_SUCCESS);
  EXPECT_EQ(bytes, 4ull << 30);
}

TEST_F(CudaEmulatorTest, RefusesCubinWithNoBinaryForGpu) {
  auto nvrtc = loadNvrtc();
  if (!nvrtc) GTEST_SKIP() << nvrtc.error().message();
  auto binary =
      codegen::compileCudaSource(**nvrtc, "extern \"C\" __global__ void k(float* x) { x[0] = 1; }", "cubin.cu", 90);
  ASSERT_TRUE(binary) << binary.error().message();
  CUmodule module = nullptr;
  EXPECT_EQ(x_->cuModuleLoadData(&module, binary->cubin.data()), CUDA_ERROR_NO_BINARY_FOR_GPU);
  EXPECT_NE(lastFault().find("PTX only"), std::string::npos) << lastFault();
  EXPECT_EQ(x_->cuModuleLoadData(&module, binary->ptx.c_str()), CUDA_SUCCESS) << lastFault();
}

// ---------------------------------------------------------------------------
// Kernels from CUDA C++

TEST_F(CudaEmulatorTest, RunsAGridStrideKernel) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void saxpy(const float* x, float* y, float a, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] + y[i];
})");
  const int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = 0.5f * i;
    y[i] = 1.0f - i;
  }
  CUdeviceptr dx = upload(x), dy = upload(y);
  CUfunction f = function(load(ptx), "saxpy");
  ASSERT_EQ(launch(f, 3, 128, nullptr, 0, dx, dy, 3.0f, n), CUDA_SUCCESS);
  std::vector<float> got = download<float>(dy, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], 3.0f * x[i] + y[i]) << i;
}

TEST_F(CudaEmulatorTest, WarpShufflesVotesAndActiveMask) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void warp(const int* in, int* sums, unsigned* ballots, int* all, unsigned* masks, int* up) {
  int v = in[threadIdx.x];
  int s = v;
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
  int x = v;
  for (int offset = 1; offset < 32; offset *= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = s;
  if (x != __shfl_sync(0xffffffffu, x, 7)) sums[8 + threadIdx.x / 32] = -1;
  ballots[threadIdx.x / 32] = __ballot_sync(0xffffffffu, v > 50);
  all[threadIdx.x / 32] = __all_sync(0xffffffffu, v >= 0);
  if (threadIdx.x % 2 == 0) masks[threadIdx.x] = __activemask();
  else masks[threadIdx.x] = 0;
  up[threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 3);
})");
  const int n = 64;
  std::vector<int> in(n);
  for (int i = 0; i < n; ++i) in[i] = (i * 37) % 101;
  CUdeviceptr din = upload(in), sums = upload(std::vector<int>(16, 0)), ballots = allocate<unsigned>(2),
              all = allocate<int>(2), masks = allocate<unsigned>(n), up = allocate<int>(n);
  CUfunction f = function(load(ptx), "warp");
  ASSERT_EQ(launch(f, 1, n, nullptr, 0, din, sums, ballots, all, masks, up), CUDA_SUCCESS);
  std::vector<int> gotSums = download<int>(sums, 16);
  std::vector<unsigned> gotBallots = download<unsigned>(ballots, 2), gotMasks = download<unsigned>(masks, n);
  std::vector<int> gotAll = download<int>(all, 2), gotUp = download<int>(up, n);
  for (int w = 0; w < 2; ++w) {
    int sum = 0;
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l) {
      sum += in[w * 32 + l];
      if (in[w * 32 + l] > 50) ballot |= 1u << l;
    }
    EXPECT_EQ(gotSums[w], sum);
    EXPECT_EQ(gotSums[8 + w], 0) << "xor butterfly disagrees between lanes";
    EXPECT_EQ(gotBallots[w], ballot);
    EXPECT_EQ(gotAll[w], 1);
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(gotMasks[i], i % 2 == 0 ? 0x55555555u : 0u) << i;
    EXPECT_EQ(gotUp[i], i % 32 < 3 ? in[i] : in[i - 3]) << i;
  }
}

TEST_F(CudaEmulatorTest, DivergentLanesReconvergeBeforeWarpCollectives) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void diverge(const int* in, int* out) {
  int lane = threadIdx.x % 32;
  int v = in[threadIdx.x];
  // A loop whose trip count differs per lane, with a break.
  for (int k = 0; k < lane % 7 + 1; ++k) {
    if (v > 1000 * (k + 1)) break;
    v = v * 3 + k;
  }
  // Nested divergent branches.
  if (lane % 2) {
    if (lane % 3) v += 5; else v -= 7;
  } else if (lane < 20) {
    v ^= 0x55;
  }
  // Every lane must be back for the full-warp shuffles.
  int s = v;
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  out[threadIdx.x] = s;
  if (lane >= 24) return;  // early exit: the rest go on with 24 lanes
  unsigned m = __ballot_sync(0x00ffffffu, v & 1);
  out[64 + threadIdx.x] = (int)m;
})");
  std::vector<int> in(64);
  for (int i = 0; i < 64; ++i) in[i] = (i * 97) % 1500;
  CUdeviceptr din = upload(in), out = upload(std::vector<int>(128, -1));
  ASSERT_EQ(launch(function(load(ptx), "diverge"), 1, 64, nullptr, 0, din, out), CUDA_SUCCESS);
  std::vector<int> got = download<int>(out, 128);
  std::vector<int> v(64);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    int x = in[t];
    for (int k = 0; k < lane % 7 + 1; ++k) {
      if (x > 1000 * (k + 1)) break;
      x = x * 3 + k;
    }
    if (lane % 2) {
      x += lane % 3 ? 5 : -7;
    } else if (lane < 20) {
      x ^= 0x55;
    }
    v[t] = x;
  }
  for (int w = 0; w < 2; ++w) {
    int sum = 0;
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l) sum += v[32 * w + l];
    for (int l = 0; l < 24; ++l) ballot |= static_cast<unsigned>(v[32 * w + l] & 1) << l;
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(got[32 * w + l], sum) << "thread " << 32 * w + l;
      EXPECT_EQ(got[64 + 32 * w + l], l < 24 ? static_cast<int>(ballot) : -1) << "thread " << 32 * w + l;
    }
  }
}

TEST_F(CudaEmulatorTest, SharedMemoryBlockReductionWithSyncthreads) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void reduce(const float* in, float* out, int n) {
  __shared__ float partial[256];
  float s = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += in[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
extern "C" __global__ void reverse(int* data, int n) {
  extern __shared__ int tile[];
  tile[threadIdx.x] = data[threadIdx.x];
  __syncthreads();
  data[threadIdx.x] = tile[n - 1 - threadIdx.x];
})");
  const int n = 5000, blocks = 4;
  std::vector<float> in(n);
  for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i % 17);
  CUdeviceptr din = upload(in), dout = allocate<float>(blocks);
  CUmodule module = load(ptx);
  ASSERT_EQ(launch(function(module, "reduce"), blocks, 256, nullptr, 0, din, dout, n), CUDA_SUCCESS);
  std::vector<float> partial = download<float>(dout, blocks);
  double total = 0, expected = 0;
  for (float p : partial) total += p;
  for (float v : in) expected += v;
  EXPECT_EQ(total, expected);

  std::vector<int> values(200);
  for (int i = 0; i < 200; ++i) values[i] = i;
  CUdeviceptr data = upload(values);
  ASSERT_EQ(launch(function(module, "reverse"), 1, 200, nullptr, 200 * sizeof(int), data, 200), CUDA_SUCCESS);
  std::vector<int> reversed = download<int>(data, 200);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(reversed[i], 199 - i);
}

TEST_F(CudaEmulatorTest, Atomics) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void atomics(float* fsum, int* isum, unsigned long long* usum, int* imax, int* cas,
                                   unsigned* inc, int* blockSums) {
  __shared__ int local;
  if (threadIdx.x == 0) local = 0;
  __syncthreads();
  atomicAdd(fsum, 0.5f);
  atomicAdd(isum, (int)threadIdx.x);
  atomicAdd(usum, 1ull << 33);
  atomicMax(imax, (int)(threadIdx.x * 7 % 1000));
  atomicCAS(cas, (int)threadIdx.x, (int)threadIdx.x + 1);
  atomicInc(inc, 9u);
  atomicAdd(&local, 2);
  __syncthreads();
  if (threadIdx.x == 0) blockSums[blockIdx.x] = local;
})");
  CUdeviceptr fsum = upload(std::vector<float>{0}), isum = upload(std::vector<int>{0}),
              usum = upload(std::vector<unsigned long long>{0}), imax = upload(std::vector<int>{-5}),
              cas = upload(std::vector<int>{0}), inc = upload(std::vector<unsigned>{0}), blockSums = allocate<int>(2);
  ASSERT_EQ(launch(function(load(ptx), "atomics"), 2, 256, nullptr, 0, fsum, isum, usum, imax, cas, inc, blockSums),
            CUDA_SUCCESS);
  EXPECT_EQ(download<float>(fsum, 1)[0], 256.0f);
  EXPECT_EQ(download<int>(isum, 1)[0], 2 * 255 * 256 / 2);
  EXPECT_EQ(download<unsigned long long>(usum, 1)[0], 512ull << 33);
  int expectedMax = 0;
  for (int t = 0; t < 256; ++t) expectedMax = std::max(expectedMax, t * 7 % 1000);
  EXPECT_EQ(download<int>(imax, 1)[0], expectedMax);
  EXPECT_EQ(download<int>(cas, 1)[0], 256);  // thread t bumps t to t+1 when it runs after t-1: in order here
  EXPECT_EQ(download<unsigned>(inc, 1)[0], 512u % 10u);
  std::vector<int> sums = download<int>(blockSums, 2);
  EXPECT_EQ(sums[0], 512);
  EXPECT_EQ(sums[1], 512);
}

TEST_F(CudaEmulatorTest, DoubleMathMatchesTheHost) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void math(const double* x, double* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double v = x[i];
  out[9 * i + 0] = sin(v);
  out[9 * i + 1] = cos(v);
  out[9 * i + 2] = exp(v);
  out[9 * i + 3] = log(fabs(v) + 1e-3);
  out[9 * i + 4] = sqrt(fabs(v));
  out[9 * i + 5] = pow(fabs(v), 1.7);
  out[9 * i + 6] = tanh(v);
  out[9 * i + 7] = v / 3.0;
  out[9 * i + 8] = fma(v, v, -1.0);
})");
  const int n = 200;
  std::vector<double> x(n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-20, 20);
  for (double& v : x) v = dist(rng);
  x[0] = 1e6;  // the slow path of sin/cos argument reduction
  x[1] = -3.0e8;
  CUdeviceptr dx = upload(x), out = allocate<double>(9 * n);
  ASSERT_EQ(launch(function(load(ptx), "math"), 2, 128, nullptr, 0, dx, out, n), CUDA_SUCCESS);
  std::vector<double> got = download<double>(out, 9 * n);
  for (int i = 0; i < n; ++i) {
    const double v = x[i];
    const double want[9] = {std::sin(v),
                            std::cos(v),
                            std::exp(v),
                            std::log(std::fabs(v) + 1e-3),
                            std::sqrt(std::fabs(v)),
                            std::pow(std::fabs(v), 1.7),
                            std::tanh(v),
                            v / 3.0,
                            std::fma(v, v, -1.0)};
    for (int k = 0; k < 9; ++k) {
      if (std::isinf(want[k])) {
        EXPECT_EQ(got[9 * i + k], want[k]) << "x=" << v << " function " << k;
      } else {
        EXPECT_NEAR(got[9 * i + k], want[k], 1e-15 * std::fabs(want[k]) + 1e-300) << "x=" << v << " function " << k;
      }
    }
  }
}

TEST_F(CudaEmulatorTest, FloatMathMatchesTheHost) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void math(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  out[8 * i + 0] = expf(v);
  out[8 * i + 1] = logf(fabsf(v) + 1e-3f);
  out[8 * i + 2] = tanhf(v);
  out[8 * i + 3] = erff(v);
  out[8 * i + 4] = sinf(v);
  out[8 * i + 5] = powf(fabsf(v), 0.37f);
  out[8 * i + 6] = 1.0f / (1.0f + expf(-v));
  out[8 * i + 7] = rsqrtf(fabsf(v) + 1.0f);
})");
  const int n = 300;
  std::vector<float> x(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-30, 30);
  for (float& v : x) v = dist(rng);
  x[0] = 123456.7f;  // sinf's Payne-Hanek path: local memory and a global table
  CUdeviceptr dx = upload(x), out = allocate<float>(8 * n);
  ASSERT_EQ(launch(function(load(ptx), "math"), 3, 128, nullptr, 0, dx, out, n), CUDA_SUCCESS);
  std::vector<float> got = download<float>(out, 8 * n);
  for (int i = 0; i < n; ++i) {
    const double v = x[i];
    const double want[8] = {std::exp(v),
                            std::log(std::fabs(x[i]) + 1e-3f),
                            std::tanh(v),
                            std::erf(v),
                            std::sin(v),
                            std::pow(std::fabs(v), 0.37),
                            1.0 / (1.0 + std::exp(-v)),
                            1.0 / std::sqrt(std::fabs(v) + 1)};
    for (int k = 0; k < 8; ++k) {
      if (std::isinf(want[k])) {
        EXPECT_EQ(got[8 * i + k], want[k]) << "x=" << v << " function " << k;
      } else {
        EXPECT_NEAR(got[8 * i + k], want[k], 1e-6 * std::fabs(want[k]) + 1e-37) << "x=" << v << " function " << k;
      }
    }
  }
}

TEST_F(CudaEmulatorTest, IntegerDivisionAndRemainderOfEveryWidth) {
  KILN_PTX_OR_SKIP(ptx, R"(
template <typename T> __device__ void divmod(const T* a, const T* b, T* q, T* r, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { q[i] = a[i] / b[i]; r[i] = a[i] % b[i]; }
}
#define KERNEL(T, name) extern "C" __global__ void name(const T* a, const T* b, T* q, T* r, int n) { divmod<T>(a, b, q, r, n); }
KERNEL(signed char, div_i8) KERNEL(unsigned char, div_u8) KERNEL(short, div_i16) KERNEL(unsigned short, div_u16)
KERNEL(int, div_i32) KERNEL(unsigned, div_u32) KERNEL(long long, div_i64) KERNEL(unsigned long long, div_u64)
)");
  CUmodule module = load(ptx);
  std::mt19937_64 rng(11);
  auto check = [&](auto tag, const char* name) {
    using T = decltype(tag);
    const int n = 300;
    std::vector<T> a(n), b(n);
    for (int i = 0; i < n; ++i) {
      a[i] = static_cast<T>(rng());
      do b[i] = static_cast<T>(rng() >> (rng() % (8 * sizeof(T))));
      while (b[i] == 0 || (std::is_signed_v<T> && b[i] == T(-1) && a[i] == std::numeric_limits<T>::min()));
    }
    a[0] = std::numeric_limits<T>::min();
    a[1] = std::numeric_limits<T>::max();
    CUdeviceptr da = upload(a), db = upload(b), dq = allocate<T>(n), dr = allocate<T>(n);
    ASSERT_EQ(launch(function(module, name), 3, 128, nullptr, 0, da, db, dq, dr, n), CUDA_SUCCESS);
    std::vector<T> q = download<T>(dq, n), r = download<T>(dr, n);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(q[i], static_cast<T>(a[i] / b[i])) << name << " " << +a[i] << " / " << +b[i];
      ASSERT_EQ(r[i], static_cast<T>(a[i] % b[i])) << name << " " << +a[i] << " % " << +b[i];
    }
  };
  check(int8_t{}, "div_i8");
  check(uint8_t{}, "div_u8");
  check(int16_t{}, "div_i16");
  check(uint16_t{}, "div_u16");
  check(int32_t{}, "div_i32");
  check(uint32_t{}, "div_u32");
  check(int64_t{}, "div_i64");
  check(uint64_t{}, "div_u64");
}

TEST_F(CudaEmulatorTest, VectorizedFloat4AccessesAndConversions) {
  KILN_PTX_OR_SKIP(ptx, R"(
__device__ unsigned short toHalf(float v) {  // cvt.rn.f16.f32, as cuda_fp16.h's __float2half_rn
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
}
__device__ float fromHalf(unsigned short h) {
  float v;
  asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(h));
  return v;
}
extern "C" __global__ void scale4(const float4* in, float4* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float4 v = in[i]; out[i] = make_float4(v.x * 2, v.y + 1, -v.z, v.w * v.w); }
}
extern "C" __global__ void convert(const float* in, int* toInt, long long* toLong, unsigned short* toHalfBits,
                                   float* fromHalfBits, unsigned* toUnsigned, double* toDouble, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = in[i];
  toInt[i] = __float2int_rn(v);
  toLong[i] = (long long)v;
  unsigned short h = toHalf(v);
  toHalfBits[i] = h;
  fromHalfBits[i] = fromHalf(h);
  toUnsigned[i] = __float2uint_rz(v);
  toDouble[i] = (double)v * 3.0;
})");
  CUmodule module = load(ptx);
  const int n = 100;
  std::vector<float> in(4 * n);
  for (int i = 0; i < 4 * n; ++i) in[i] = 0.25f * i - 7;
  CUdeviceptr din = upload(in), dout = allocate<float>(4 * n);
  ASSERT_EQ(launch(function(module, "scale4"), 1, 128, nullptr, 0, din, dout, n), CUDA_SUCCESS);
  std::vector<float> out = download<float>(dout, 4 * n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out[4 * i + 0], in[4 * i + 0] * 2);
    EXPECT_EQ(out[4 * i + 1], in[4 * i + 1] + 1);
    EXPECT_EQ(out[4 * i + 2], -in[4 * i + 2]);
    EXPECT_EQ(out[4 * i + 3], in[4 * i + 3] * in[4 * i + 3]);
  }

  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     1.5f,
                                     2.5f,
                                     -2.5f,
                                     3.7f,
                                     -3.7f,
                                     65504.0f,
                                     65520.0f,
                                     1e-7f,
                                     6e-8f,
                                     3e9f,
                                     -3e9f,
                                     1e20f,
                                     std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN(),
                                     0.1f,
                                     1.0009765625f};
  const int m = static_cast<int>(values.size());
  CUdeviceptr dv = upload(values), toInt = allocate<int>(m), toLong = allocate<long long>(m),
              toHalf = allocate<uint16_t>(m), fromHalf = allocate<float>(m), toUnsigned = allocate<unsigned>(m),
              toDouble = allocate<double>(m);
  ASSERT_EQ(launch(function(module, "convert"), 1, 32, nullptr, 0, dv, toInt, toLong, toHalf, fromHalf, toUnsigned,
                   toDouble, m),
            CUDA_SUCCESS);
  std::vector<int> ints = download<int>(toInt, m);
  std::vector<long long> longs = download<long long>(toLong, m);
  std::vector<uint16_t> halves = download<uint16_t>(toHalf, m);
  std::vector<float> back = download<float>(fromHalf, m);
  std::vector<unsigned> unsigneds = download<unsigned>(toUnsigned, m);
  std::vector<double> doubles = download<double>(toDouble, m);
  const uint16_t expectedHalves[] = {0x0000, 0x8000, 0x3e00, 0x4100, 0xc100, 0x4366, 0xc366, 0x7bff, 0x7c00,
                                     0x0002, 0x0001, 0x7c00, 0xfc00, 0x7c00, 0x7c00, 0x7fff, 0x2e66, 0x3c01};
  for (int i = 0; i < m; ++i) {
    const float v = values[i];
    const double clamped = std::isnan(v) ? 0.0 : std::clamp<double>(std::nearbyint(v), INT32_MIN, INT32_MAX);
    EXPECT_EQ(ints[i], static_cast<int>(clamped)) << v;
    const double truncated = std::isnan(v) ? 0.0 : std::trunc(v);
    if (std::fabs(truncated) < 9e18) {
      EXPECT_EQ(longs[i], static_cast<long long>(truncated)) << v;
    }
    EXPECT_EQ(halves[i], expectedHalves[i]) << v;
    if (!std::isnan(v)) {
      EXPECT_EQ(unsigneds[i], static_cast<unsigned>(std::clamp<double>(truncated, 0, UINT32_MAX))) << v;
      EXPECT_EQ(doubles[i], static_cast<double>(v) * 3.0) << v;
    }
  }
  EXPECT_EQ(longs[13], std::numeric_limits<long long>::max());  // 1e20 saturates
  EXPECT_EQ(back[2], 1.5f);
  EXPECT_EQ(back[9], 1.1920928955078125e-07f);  // the f16 subnormal 2 * 2^-24
  EXPECT_TRUE(std::isinf(back[8]));
}

TEST_F(CudaEmulatorTest, NonInlinedFunctionsAndGenericAddresses) {
  KILN_PTX_OR_SKIP(ptx, R"(
__device__ __noinline__ float weighted(const float* p, int i, float w) { return p[i] * w + 1.0f; }
__device__ __noinline__ void bump(int* p) { *p += 1; }  // p points to shared or local memory: generic
extern "C" __global__ void calls(const float* in, float* out, int* counts) {
  __shared__ int shared;
  int local = 10;
  if (threadIdx.x == 0) shared = 0;
  __syncthreads();
  out[threadIdx.x] = weighted(in, threadIdx.x, 2.0f);
  if (threadIdx.x % 2) bump(&local);
  if (threadIdx.x < 5) { atomicAdd(&shared, 1); }
  __syncthreads();
  if (threadIdx.x == 0) bump(&shared);
  __syncthreads();
  counts[threadIdx.x] = local + shared;
})");
  std::vector<float> in(64);
  for (int i = 0; i < 64; ++i) in[i] = i * 0.5f;
  CUdeviceptr din = upload(in), out = allocate<float>(64), counts = allocate<int>(64);
  ASSERT_EQ(launch(function(load(ptx), "calls"), 1, 64, nullptr, 0, din, out, counts), CUDA_SUCCESS);
  std::vector<float> got = download<float>(out, 64);
  std::vector<int> gotCounts = download<int>(counts, 64);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(got[i], in[i] * 2.0f + 1.0f) << i;
    EXPECT_EQ(gotCounts[i], (i % 2 ? 11 : 10) + 6) << i;
  }
}

/// x op y on the host in rounding mode `mode` (volatile: computed between
/// the fesetround calls).
template <typename T, typename Op>
T hostRounded(int mode, T x, T y, Op op) {
  volatile T a = x, b = y;
  std::fesetround(mode);
  volatile T r = op(a, b);
  std::fesetround(FE_TONEAREST);
  return r;
}

TEST_F(CudaEmulatorTest, DirectedRoundingMatchesTheHost) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void rounding(const float* x, const float* y, const double* dx, const long long* li,
                                    float* f, double* d, int* i, int n) {
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n) return;
  float a = x[k], b = y[k];
  double p = dx[k];
  float* o = f + 20 * k;
  o[0] = __fadd_rz(a, b); o[1] = __fadd_rd(a, b); o[2] = __fadd_ru(a, b);
  o[3] = __fmul_rz(a, b); o[4] = __fmul_rd(a, b); o[5] = __fmul_ru(a, b);
  o[6] = __fdiv_rz(a, b); o[7] = __fdiv_rd(a, b); o[8] = __fdiv_ru(a, b);
  o[9] = __fsqrt_rz(fabsf(a)); o[10] = __fsqrt_rd(fabsf(a)); o[11] = __fsqrt_ru(fabsf(a));
  o[12] = __fmaf_rz(a, b, 1.0f / 3.0f); o[13] = __fmaf_rd(a, b, 1.0f / 3.0f); o[14] = __fmaf_ru(a, b, 1.0f / 3.0f);
  o[15] = __double2float_rz(p); o[16] = __double2float_rd(p); o[17] = __double2float_ru(p);
  o[18] = __ll2float_rd(li[k]); o[19] = __ll2float_ru(li[k]);
  double* e = d + 4 * k;
  e[0] = __dadd_rz(p, (double)a); e[1] = __dmul_rd(p, 1.0 / 3.0); e[2] = __ddiv_ru(p, 7.0); e[3] = __dsqrt_rd(fabs(p));
  int* q = i + 4 * k;
  q[0] = __float2int_rd(a * 1000.0f); q[1] = __float2int_ru(a * 1000.0f); q[2] = __float2int_rz(a * 1000.0f);
  q[3] = __float2int_rn(a * 1000.0f);
})");
  const int n = 64;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> dist(-100, 100);
  std::vector<float> x(n), y(n);
  std::vector<double> dx(n);
  std::vector<long long> li(n);
  for (int k = 0; k < n; ++k) {
    x[k] = dist(rng);
    y[k] = dist(rng);
    dx[k] = static_cast<double>(dist(rng)) / 3.0;
    li[k] = static_cast<long long>(rng()) << 20 | rng();
  }
  CUdeviceptr dX = upload(x), dY = upload(y), dD = upload(dx), dL = upload(li), f = allocate<float>(20 * n),
              d = allocate<double>(4 * n), i = allocate<int>(4 * n);
  ASSERT_EQ(launch(function(load(ptx), "rounding"), 1, n, nullptr, 0, dX, dY, dD, dL, f, d, i, n), CUDA_SUCCESS);
  std::vector<float> gotF = download<float>(f, 20 * n);
  std::vector<double> gotD = download<double>(d, 4 * n);
  std::vector<int> gotI = download<int>(i, 4 * n);
  const int modes[3] = {FE_TOWARDZERO, FE_DOWNWARD, FE_UPWARD};
  for (int k = 0; k < n; ++k) {
    const float a = x[k], b = y[k];
    for (int m = 0; m < 3; ++m) {
      const int mode = modes[m];
      EXPECT_EQ(gotF[20 * k + m], hostRounded<float>(mode, a, b, [](float u, float v) { return u + v; })) << k;
      EXPECT_EQ(gotF[20 * k + 3 + m], hostRounded<float>(mode, a, b, [](float u, float v) { return u * v; })) << k;
      EXPECT_EQ(gotF[20 * k + 6 + m], hostRounded<float>(mode, a, b, [](float u, float v) { return u / v; })) << k;
      EXPECT_EQ(gotF[20 * k + 9 + m],
                hostRounded<float>(mode, std::fabs(a), 0.0f, [](float u, float) { return std::sqrt(u); }))
          << k;
      EXPECT_EQ(gotF[20 * k + 12 + m],
                hostRounded<float>(mode, a, b, [](float u, float v) { return std::fma(u, v, 1.0f / 3.0f); }))
          << k;
      EXPECT_EQ(gotF[20 * k + 15 + m],
                hostRounded<double>(mode, dx[k], 0.0, [](double u, double) { return static_cast<float>(u); }))
          << k;
    }
    EXPECT_EQ(gotF[20 * k + 18], hostRounded<double>(FE_DOWNWARD, static_cast<double>(k), 0.0,
                                                     [&](double, double) { return static_cast<float>(li[k]); }))
        << k;
    EXPECT_EQ(gotF[20 * k + 19], hostRounded<double>(FE_UPWARD, static_cast<double>(k), 0.0,
                                                     [&](double, double) { return static_cast<float>(li[k]); }))
        << k;
    const double p = dx[k];
    EXPECT_EQ(gotD[4 * k + 0],
              hostRounded<double>(FE_TOWARDZERO, p, static_cast<double>(a), [](double u, double v) { return u + v; }));
    EXPECT_EQ(gotD[4 * k + 1],
              hostRounded<double>(FE_DOWNWARD, p, 1.0 / 3.0, [](double u, double v) { return u * v; }));
    EXPECT_EQ(gotD[4 * k + 2], hostRounded<double>(FE_UPWARD, p, 7.0, [](double u, double v) { return u / v; }));
    EXPECT_EQ(gotD[4 * k + 3],
              hostRounded<double>(FE_DOWNWARD, std::fabs(p), 0.0, [](double u, double) { return std::sqrt(u); }));
    const float scaled = a * 1000.0f;
    EXPECT_EQ(gotI[4 * k + 0], static_cast<int>(std::floor(scaled)));
    EXPECT_EQ(gotI[4 * k + 1], static_cast<int>(std::ceil(scaled)));
    EXPECT_EQ(gotI[4 * k + 2], static_cast<int>(std::trunc(scaled)));
    EXPECT_EQ(gotI[4 * k + 3], static_cast<int>(std::nearbyint(scaled)));
  }
}

TEST_F(CudaEmulatorTest, BitIntrinsicsMatchTheirDefinitions) {
  KILN_PTX_OR_SKIP(ptx, R"(
__device__ unsigned bfeU(unsigned a, unsigned pos, unsigned len) {
  unsigned d; asm("bfe.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(pos), "r"(len)); return d;
}
__device__ int bfeS(int a, unsigned pos, unsigned len) {
  int d; asm("bfe.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(pos), "r"(len)); return d;
}
__device__ unsigned bfi(unsigned a, unsigned b, unsigned pos, unsigned len) {
  unsigned d; asm("bfi.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(pos), "r"(len)); return d;
}
__device__ unsigned prmtF4e(unsigned a, unsigned b, unsigned c) {
  unsigned d; asm("prmt.b32.f4e %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
__device__ unsigned prmtEcr(unsigned a, unsigned b, unsigned c) {
  unsigned d; asm("prmt.b32.ecr %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
extern "C" __global__ void bits(const unsigned* x, const unsigned* y, unsigned* out, int n) {
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n) return;
  unsigned a = x[k], b = y[k];
  unsigned* o = out + 20 * k;
  o[0] = __brev(a); o[1] = __clz(a); o[2] = __popc(a); o[3] = __ffs(a);
  o[4] = __byte_perm(a, b, b & 0xffff); o[5] = __funnelshift_l(a, b, b); o[6] = __funnelshift_r(a, b, b);
  o[7] = __funnelshift_lc(a, b, b); o[8] = __funnelshift_rc(a, b, b); o[9] = __sad((int)a, (int)b, 5u);
  o[10] = __umulhi(a, b); o[11] = (unsigned)__mulhi((int)a, (int)b); o[12] = (unsigned)__dp4a((int)a, (int)b, 7);
  o[13] = __dp2a_lo(a, b, 3u); o[14] = (unsigned)__dp2a_hi((int)a, (int)b, -3);
  o[15] = bfeU(a, b & 63, (b >> 8) & 63); o[16] = (unsigned)bfeS((int)a, b & 63, (b >> 8) & 63);
  o[17] = bfi(a, b, (b >> 16) & 63, (b >> 24) & 63);
  o[18] = prmtF4e(a, b, b); o[19] = prmtEcr(a, b, b);
})");
  const int n = 256;
  std::mt19937 rng(23);
  std::vector<unsigned> x(n), y(n);
  for (int k = 0; k < n; ++k) {
    x[k] = rng() >> (k % 7);
    y[k] = rng();
  }
  x[0] = 0;
  y[1] = 32;      // funnel shifts by 32: wrap is 0, clamp is 32
  y[2] = 0x3f20;  // a bit field running past bit 31
  CUdeviceptr dX = upload(x), dY = upload(y), out = allocate<unsigned>(20 * n);
  ASSERT_EQ(launch(function(load(ptx), "bits"), 2, 128, nullptr, 0, dX, dY, out, n), CUDA_SUCCESS);
  std::vector<unsigned> got = download<unsigned>(out, 20 * n);
  auto byteOf = [](uint64_t v, unsigned i) { return static_cast<unsigned>((v >> (8 * i)) & 0xff); };
  for (int k = 0; k < n; ++k) {
    const unsigned a = x[k], b = y[k];
    const uint64_t pair = static_cast<uint64_t>(b) << 32 | a;
    unsigned want[20];
    unsigned rev = 0;
    for (int i = 0; i < 32; ++i) rev |= ((a >> i) & 1u) << (31 - i);
    want[0] = rev;
    want[1] = static_cast<unsigned>(std::countl_zero(a));
    want[2] = static_cast<unsigned>(std::popcount(a));
    want[3] = a ? static_cast<unsigned>(std::countr_zero(a)) + 1 : 0;
    unsigned perm = 0;
    for (int i = 0; i < 4; ++i) perm |= byteOf(pair, (b >> (4 * i)) & 7) << (8 * i);
    want[4] = perm;
    want[5] = static_cast<unsigned>((pair << (b & 31)) >> 32);
    want[6] = static_cast<unsigned>(pair >> (b & 31));
    const unsigned clamped = std::min(b, 32u);
    want[7] = clamped == 32 ? a : static_cast<unsigned>((pair << clamped) >> 32);
    want[8] = static_cast<unsigned>(pair >> clamped);
    const int64_t sa = static_cast<int32_t>(a), sb = static_cast<int32_t>(b);
    want[9] = static_cast<unsigned>(std::llabs(sa - sb) + 5);
    want[10] = static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
    want[11] = static_cast<unsigned>((sa * sb) >> 32);
    int64_t dot = 7;
    for (int i = 0; i < 4; ++i) dot += static_cast<int8_t>(byteOf(a, i)) * static_cast<int8_t>(byteOf(b, i));
    want[12] = static_cast<unsigned>(dot);
    uint64_t lo = 3;
    for (int i = 0; i < 2; ++i) lo += ((a >> (16 * i)) & 0xffff) * byteOf(b, i);
    want[13] = static_cast<unsigned>(lo);
    int64_t hi = -3;
    for (int i = 0; i < 2; ++i)
      hi += static_cast<int16_t>((a >> (16 * i)) & 0xffff) * static_cast<int8_t>(byteOf(b, 2 + i));
    want[14] = static_cast<unsigned>(hi);
    // bfe, bfi as the PTX ISA defines them.
    const unsigned pos = b & 63, len = (b >> 8) & 63;
    unsigned u = 0, sgn = 0;
    const bool sbit = len != 0 && ((a >> std::min(pos + len - 1, 31u)) & 1);
    for (unsigned i = 0; i < 32; ++i) {
      const bool inField = i < len && pos + i <= 31;
      u |= (inField ? (a >> (pos + i)) & 1u : 0u) << i;
      sgn |= (inField ? (a >> (pos + i)) & 1u : static_cast<unsigned>(sbit)) << i;
    }
    want[15] = u;
    want[16] = sgn;
    unsigned f = b;
    const unsigned ipos = (b >> 16) & 63, ilen = (b >> 24) & 63;
    for (unsigned i = 0; i < ilen && ipos + i <= 31; ++i)
      f = (f & ~(1u << (ipos + i))) | (((a >> i) & 1u) << (ipos + i));
    want[17] = f;
    const unsigned sel = b & 3;
    unsigned f4e = 0, ecr = 0;
    for (unsigned i = 0; i < 4; ++i) {
      f4e |= byteOf(pair, (sel + i) & 7) << (8 * i);
      ecr |= byteOf(pair, std::min(i, sel)) << (8 * i);
    }
    want[18] = f4e;
    want[19] = ecr;
    for (int j = 0; j < 20; ++j) EXPECT_EQ(got[20 * k + j], want[j]) << "case " << j << " a=" << a << " b=" << b;
  }
}

TEST_F(CudaEmulatorTest, RunsPtxForTheNewestArchitectureNvrtcHas) {
  // Kiln hands the emulated device (compute capability 15.0) PTX for the
  // newest architecture NVRTC knows below it, which uses instructions older
  // targets do not (funnel shifts in sinf's range reduction, dp2a in index
  // arithmetic).
  auto nvrtc = loadNvrtc();
  if (!nvrtc) GTEST_SKIP() << nvrtc.error().message();
  int arch = 0;
  for (int a : (*nvrtc)->supportedArchs())
    if (a < 150) arch = std::max(arch, a);
  ASSERT_GE(arch, 90);
  auto binary = codegen::compileCudaSource(**nvrtc, R"(
extern "C" __global__ void trig(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { out[2 * i] = sinf(x[i]); out[2 * i + 1] = cosf(x[i]); }
})",
                                           "newest.cu", arch);
  ASSERT_TRUE(binary) << binary.error().message();
  const std::vector<float> x = {0.5f, -2.0f, 105615.0f, 3.0e6f, -7.5e9f, 1.0e30f, 123456.7f, 10.0f};
  const int n = static_cast<int>(x.size());
  CUdeviceptr dx = upload(x), out = allocate<float>(2 * n);
  ASSERT_EQ(launch(function(load(binary->ptx), "trig"), 1, 32, nullptr, 0, dx, out, n), CUDA_SUCCESS);
  std::vector<float> got = download<float>(out, 2 * n);
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(got[2 * i], std::sin(static_cast<double>(x[i])), 2e-7) << "sm_" << arch << " sinf(" << x[i] << ")";
    EXPECT_NEAR(got[2 * i + 1], std::cos(static_cast<double>(x[i])), 2e-7) << "sm_" << arch << " cosf(" << x[i] << ")";
  }
}

// ---------------------------------------------------------------------------
// Strictness

TEST_F(CudaEmulatorTest, OutOfBoundsStoreIsAnIllegalAddressThatSticks) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void overrun(float* x, int n) { x[threadIdx.x] = 1.0f; })");
  CUdeviceptr x = allocate<float>(32);
  CUfunction f = function(load(ptx), "overrun");
  ASSERT_EQ(launch(f, 1, 33, nullptr, 0, x, 32), CUDA_SUCCESS);  // faults when it runs, not here
  EXPECT_EQ(x_->cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
  const std::string fault = lastFault();
  EXPECT_NE(fault.find("CUDA_ERROR_ILLEGAL_ADDRESS: kernel 'overrun'"), std::string::npos) << fault;
  EXPECT_NE(fault.find("st.global"), std::string::npos) << fault;
  EXPECT_NE(fault.find("thread (32,0,0)"), std::string::npos) << fault;
  EXPECT_NE(fault.find("0 bytes past its end"), std::string::npos) << fault;
  // Sticky, as on a GPU: every later call fails until the context is recreated.
  CUdeviceptr y = 0;
  EXPECT_EQ(x_->cuMemAlloc(&y, 16), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(x_->cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
  recreateContext();
  EXPECT_EQ(x_->cuMemAlloc(&y, 16), CUDA_SUCCESS);
}

TEST_F(CudaEmulatorTest, MisalignedFloat4LoadIsAMisalignedAddress) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void load4(const float* x, float* y) {
  float4 v = *reinterpret_cast<const float4*>(x + 1);
  y[0] = v.x + v.y + v.z + v.w;
})");
  CUdeviceptr x = allocate<float>(16), y = allocate<float>(1);
  ASSERT_EQ(launch(function(load(ptx), "load4"), 1, 1, nullptr, 0, x, y), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuCtxSynchronize(), kMisalignedAddress);
  EXPECT_NE(lastFault().find("not aligned to 16 bytes"), std::string::npos) << lastFault();
  EXPECT_NE(lastFault().find("ld.global"), std::string::npos) << lastFault();
}

TEST_F(CudaEmulatorTest, LaunchLimitsAreInvalidValues) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void nothing(int* x) { if (x) x[0] = 0; }
extern "C" __global__ void __launch_bounds__(128) bounded(int* x) { if (x) x[0] = 0; }
)");
  CUmodule module = load(ptx);
  CUfunction f = function(module, "nothing");
  CUdeviceptr null = 0;
  EXPECT_EQ(launch(f, 1, 1025, nullptr, 0, null), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(f, 0, 32, nullptr, 0, null), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(f, 1, 32, nullptr, 48 * 1024 + 1, null), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(f, 1, 1024, nullptr, 48 * 1024, null), CUDA_SUCCESS);
  CUfunction bounded = function(module, "bounded");
  int maxThreads = 0;
  ASSERT_EQ(x_->cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, bounded), CUDA_SUCCESS);
  EXPECT_EQ(maxThreads, 128);
  EXPECT_EQ(launch(bounded, 1, 129, nullptr, 0, null), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS);
}

TEST_F(CudaEmulatorTest, UnknownInstructionIsInvalidPtxAtLoad) {
  const std::string ptx = R"(.version 9.0
.target sm_90
.address_size 64

.visible .entry broken(.param .u64 p)
{
  .reg .b32 %r<3>;
  mov.u32 %r1, 1;
  frobnicate.b32 %r2, %r1;
  ret;
}
)";
  CUmodule module = nullptr;
  EXPECT_EQ(x_->cuModuleLoadData(&module, ptx.c_str()), CUDA_ERROR_INVALID_PTX);
  EXPECT_NE(lastFault().find("line 9: unknown instruction 'frobnicate.b32'"), std::string::npos) << lastFault();
  char log[256] = {};
  int options[] = {5, 6};  // CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
  void* values[] = {log, reinterpret_cast<void*>(sizeof log)};
  EXPECT_EQ(e_.cuModuleLoadDataEx(&module, ptx.c_str(), 2, options, values), CUDA_ERROR_INVALID_PTX);
  EXPECT_NE(std::string(log).find("frobnicate.b32"), std::string::npos) << log;
  // Register names need not start with '%'.
  std::string plain = ptx;
  plain.replace(plain.find("frobnicate.b32 %r2, %r1;"), 24,
                ".reg .pred p, q;\n  { .reg .b16 tmp, hi; mov.b32 {tmp, hi}, %r1; cvt.u32.u16 %r2, tmp; }\n"
                "  setp.eq.u32 p|q, %r2, 1;\n  @!p bra done;\ndone:");
  EXPECT_EQ(x_->cuModuleLoadData(&module, plain.c_str()), CUDA_SUCCESS) << lastFault();
  // An unimplemented modifier is refused too, never ignored.
  std::string modifier = ptx;
  modifier.replace(modifier.find("frobnicate.b32 %r2, %r1"), 23, "add.cc.u16 %r2, %r1, %r1");
  EXPECT_EQ(x_->cuModuleLoadData(&module, modifier.c_str()), CUDA_ERROR_INVALID_PTX);
  EXPECT_NE(lastFault().find("add.cc.u16"), std::string::npos) << lastFault();
}

TEST_F(CudaEmulatorTest, LoadsThePtxOfKilnsModels) {
  // PTX that `kiln compile --device cuda --emit=ptx` gave for the e2e MLP
  // and CNN (the other models: ctest CudaEmulator-load-<model>).
  for (const char* name : {"mlp", "cnn"}) {
    std::ifstream file(std::string(KILN_SOURCE_DIR) + "/test/unit/data/ptx/" + name + ".ptx");
    ASSERT_TRUE(file) << name;
    std::stringstream text;
    text << file.rdbuf();
    CUmodule module = load(text.str());
    ASSERT_NE(module, nullptr) << name;
    size_t entries = 0;
    for (size_t at = text.str().find(".entry "); at != std::string::npos; at = text.str().find(".entry ", at + 1)) {
      const size_t start = at + 7, end = text.str().find('(', start);
      const std::string kernel = text.str().substr(start, end - start);
      CUfunction f = function(module, kernel.c_str());
      EXPECT_NE(f, nullptr) << kernel;
      ++entries;
    }
    EXPECT_GT(entries, 0u) << name;
    EXPECT_EQ(x_->cuModuleUnload(module), CUDA_SUCCESS);
  }
}

// ---------------------------------------------------------------------------
// Asynchrony

TEST_F(CudaEmulatorTest, AsyncCopyReadBeforeSynchronizingSeesTheOldBytes) {
  CUstream stream = nullptr;
  ASSERT_EQ(x_->cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  CUdeviceptr d = upload(std::vector<int>{1, 2, 3, 4});
  std::vector<int> host = {-1, -1, -1, -1};
  ASSERT_EQ(x_->cuMemcpyDtoHAsync(host.data(), d, 16, stream), CUDA_SUCCESS);
  EXPECT_EQ(host, (std::vector<int>{-1, -1, -1, -1}));  // nothing ran yet
  ASSERT_EQ(x_->cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(host, (std::vector<int>{1, 2, 3, 4}));
  // An H2D copy reads the host buffer when it runs: reusing the staging
  // buffer before synchronizing changes what arrives.
  std::vector<int> staging = {5, 6, 7, 8};
  ASSERT_EQ(x_->cuMemcpyHtoDAsync(d, staging.data(), 16, stream), CUDA_SUCCESS);
  staging[0] = 50;
  ASSERT_EQ(x_->cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(download<int>(d, 4), (std::vector<int>{50, 6, 7, 8}));
  // A query runs one command at a time.
  ASSERT_EQ(e_.cuMemsetD32Async(d, 9, 4, stream), CUDA_SUCCESS);
  ASSERT_EQ(e_.cuMemsetD32Async(d, 10, 4, stream), CUDA_SUCCESS);
  EXPECT_EQ(e_.cuStreamQuery(stream), kNotReady);
  EXPECT_EQ(e_.cuStreamQuery(stream), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuStreamDestroy(stream), CUDA_SUCCESS);
}

TEST_F(CudaEmulatorTest, LegacyStreamWaitsForBlockingStreamsOnly) {
  CUstream blocking = nullptr, nonBlocking = nullptr;
  ASSERT_EQ(x_->cuStreamCreate(&blocking, 0), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuStreamCreate(&nonBlocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr a = upload(std::vector<int>{0}), b = upload(std::vector<int>{0});
  ASSERT_EQ(e_.cuMemsetD32Async(a, 7, 1, blocking), CUDA_SUCCESS);
  ASSERT_EQ(e_.cuMemsetD32Async(b, 7, 1, nonBlocking), CUDA_SUCCESS);
  // The synchronous copy runs on the legacy stream: after the blocking
  // stream's memset, not after the non-blocking one's.
  EXPECT_EQ(download<int>(a, 1)[0], 7);
  EXPECT_EQ(download<int>(b, 1)[0], 0);
  ASSERT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(download<int>(b, 1)[0], 7);
}

TEST_F(CudaEmulatorTest, EventsOrderStreamsAndAMissingWaitIsARace) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void copy(const int* in, int* out) { out[threadIdx.x] = in[threadIdx.x]; })");
  // Run with a wait, then without one under several seeds: adversarial
  // scheduling runs the kernel before the copy for some.
  auto run = [&](bool wait) {
    CUstream a = nullptr, b = nullptr;
    CUevent copied = nullptr;
    EXPECT_EQ(x_->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT_EQ(x_->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT_EQ(x_->cuEventCreate(&copied, 0), CUDA_SUCCESS);
    CUdeviceptr in = upload(std::vector<int>(32, 0)), out = allocate<int>(32);
    std::vector<int> host(32, 42);
    CUfunction f = function(load(ptx), "copy");
    EXPECT_EQ(x_->cuMemcpyHtoDAsync(in, host.data(), 32 * sizeof(int), a), CUDA_SUCCESS);
    EXPECT_EQ(x_->cuEventRecord(copied, a), CUDA_SUCCESS);
    if (wait) {
      EXPECT_EQ(x_->cuStreamWaitEvent(b, copied, 0), CUDA_SUCCESS);
    }
    EXPECT_EQ(launch(f, 1, 32, b, 0, in, out), CUDA_SUCCESS);
    EXPECT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS);
    return download<int>(out, 32)[0];
  };
  EXPECT_EQ(run(true), 42);
  EXPECT_EQ(run(false), 42);  // creation order: stream a's copy first
  bool raced = false;
  for (int seed = 1; seed <= 16 && !raced; ++seed) {
    setenv("KILN_EMULATOR_SEED", std::to_string(seed).c_str(), 1);
    recreateContext();
    EXPECT_EQ(run(true), 42) << "seed " << seed;
    raced = run(false) == 0;
  }
  unsetenv("KILN_EMULATOR_SEED");
  EXPECT_TRUE(raced) << "no seed ran the kernel before the copy it did not wait for";
}

TEST_F(CudaEmulatorTest, AdversarialModeShufflesBlocksAndWarps) {
  KILN_PTX_OR_SKIP(ptx, R"(
// Races a GPU may or may not show: warp 1 reads shared memory warp 0 wrote
// without __syncthreads, and each block reads what the previous block wrote.
extern "C" __global__ void warps(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x + 1;
  if (threadIdx.x >= 32) out[threadIdx.x - 32] = s[threadIdx.x - 32];
}
extern "C" __global__ void blocks(int* data) {
  if (threadIdx.x == 0) data[blockIdx.x + 1] = data[blockIdx.x] + 1;
})");
  auto run = [&]() {
    CUmodule module = load(ptx);
    CUdeviceptr out = upload(std::vector<int>(32, 0)), data = upload(std::vector<int>(9, 0));
    EXPECT_EQ(launch(function(module, "warps"), 1, 64, nullptr, 0, out), CUDA_SUCCESS);
    EXPECT_EQ(launch(function(module, "blocks"), 8, 32, nullptr, 0, data), CUDA_SUCCESS);
    std::vector<int> got = download<int>(out, 32);
    const bool warpsInOrder = got[31] == 32;
    const bool blocksInOrder = download<int>(data, 9)[8] == 8;
    return std::make_pair(warpsInOrder, blocksInOrder);
  };
  EXPECT_EQ(run(), std::make_pair(true, true));  // index order without a seed
  bool warpsShuffled = false, blocksShuffled = false;
  for (int seed = 1; seed <= 16 && !(warpsShuffled && blocksShuffled); ++seed) {
    setenv("KILN_EMULATOR_SEED", std::to_string(seed).c_str(), 1);
    recreateContext();
    auto [warpsInOrder, blocksInOrder] = run();
    warpsShuffled = warpsShuffled || !warpsInOrder;
    blocksShuffled = blocksShuffled || !blocksInOrder;
  }
  unsetenv("KILN_EMULATOR_SEED");
  EXPECT_TRUE(warpsShuffled) << "no seed ran warp 1 before warp 0";
  EXPECT_TRUE(blocksShuffled) << "no seed ran the blocks out of order";
}

TEST_F(CudaEmulatorTest, EventTimingAndQueries) {
  CUstream stream = nullptr;
  CUevent start = nullptr, end = nullptr;
  ASSERT_EQ(x_->cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuEventCreate(&start, 0), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuEventCreate(&end, 0), CUDA_SUCCESS);
  CUdeviceptr d = allocate<int>(1024);
  ASSERT_EQ(x_->cuEventRecord(start, stream), CUDA_SUCCESS);
  ASSERT_EQ(e_.cuMemsetD32Async(d, 1, 1024, stream), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuEventRecord(end, stream), CUDA_SUCCESS);
  float ms = -1;
  EXPECT_EQ(e_.cuEventElapsedTime(&ms, start, end), kNotReady);
  ASSERT_EQ(x_->cuEventSynchronize(end), CUDA_SUCCESS);
  EXPECT_EQ(e_.cuEventQuery(end), CUDA_SUCCESS);
  ASSERT_EQ(e_.cuEventElapsedTime(&ms, start, end), CUDA_SUCCESS);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(x_->cuEventDestroy(start), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuEventDestroy(end), CUDA_SUCCESS);
}

TEST_F(CudaEmulatorTest, GraphReplayReadsTheInputAsItIsAtReplay) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void twice(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
extern "C" __global__ void addOne(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 1.0f;
})");
  CUmodule module = load(ptx);
  CUfunction twice = function(module, "twice"), addOne = function(module, "addOne");
  const int n = 8;
  CUdeviceptr x = upload(std::vector<float>(n, 1.0f)), y = upload(std::vector<float>(n, 0.0f));
  CUstream stream = nullptr, side = nullptr;
  CUevent fork = nullptr, join = nullptr;
  ASSERT_EQ(x_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuEventCreate(&join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  int status = 0;
  ASSERT_EQ(e_.cuStreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, 1);
  ASSERT_EQ(launch(twice, 1, 32, stream, 0, x, y, n), CUDA_SUCCESS);
  // The side stream joins the capture through an event recorded in it.
  ASSERT_EQ(x_->cuEventRecord(fork, stream), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuStreamWaitEvent(side, fork, 0), CUDA_SUCCESS);
  ASSERT_EQ(launch(addOne, 1, 32, side, 0, y, n), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuEventRecord(join, side), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuStreamWaitEvent(stream, join, 0), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(x_->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_EQ(e_.cuStreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, 0);
  ASSERT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(download<float>(y, n), std::vector<float>(n, 0.0f));  // capture records, it does not run
  CUgraphExec exec = nullptr;
  ASSERT_EQ(x_->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  for (float value : {3.0f, 5.0f}) {
    // The pointers are baked in; what they point to is read at replay.
    std::vector<float> input(n, value);
    ASSERT_EQ(e_.cuMemcpyHtoD(x, input.data(), n * sizeof(float)), CUDA_SUCCESS);
    ASSERT_EQ(x_->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
    ASSERT_EQ(x_->cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT_EQ(download<float>(y, n), std::vector<float>(n, 2 * value + 1)) << value;
  }
  EXPECT_EQ(x_->cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuGraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(CudaEmulatorTest, SynchronizingACapturingStreamInvalidatesTheCapture) {
  CUstream stream = nullptr;
  ASSERT_EQ(x_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr d = allocate<int>(4);
  ASSERT_EQ(x_->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  ASSERT_EQ(e_.cuMemsetD32Async(d, 1, 4, stream), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuStreamSynchronize(stream), 900);  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
  int status = 0;
  ASSERT_EQ(e_.cuStreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, 2);  // invalidated
  CUgraph graph = nullptr;
  EXPECT_EQ(x_->cuStreamEndCapture(stream, &graph), 901);  // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
  EXPECT_EQ(graph, nullptr);
  // "Potentially unsafe" calls during a capture that is not relaxed fail and
  // invalidate it: allocating, freeing, a synchronous copy.
  CUdeviceptr p = 0;
  std::vector<int> host(4);
  ASSERT_EQ(x_->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuMemAlloc(&p, 64), 900);
  EXPECT_EQ(x_->cuStreamEndCapture(stream, &graph), 901);
  ASSERT_EQ(x_->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  EXPECT_EQ(e_.cuMemcpyDtoH(host.data(), d, 16), 900);
  EXPECT_EQ(x_->cuStreamEndCapture(stream, &graph), 901);
  ASSERT_EQ(x_->cuStreamBeginCapture(stream, 2), CUDA_SUCCESS);  // CU_STREAM_CAPTURE_MODE_RELAXED
  EXPECT_EQ(x_->cuMemAlloc(&p, 64), CUDA_SUCCESS);
  ASSERT_EQ(e_.cuMemsetD32Async(d, 1, 4, stream), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  EXPECT_NE(graph, nullptr);
}

// ---------------------------------------------------------------------------
// The hooks of the emulator's own math libraries (EmulatorHooks.h)

struct HostItem {
  const Extras* extras;
  CUdeviceptr device;
  std::vector<int>* seen;
  int* destroyed;
  bool fault;
};

void runHostItem(void* user) {
  auto* item = static_cast<HostItem*>(user);
  if (item->fault) {
    item->extras->kilnEmulatorFault("host work item: bad range");
    return;
  }
  auto* p = static_cast<int*>(item->extras->kilnEmulatorTranslate(item->device, 4 * sizeof(int)));
  item->seen->push_back(p ? p[0] : -1);
  if (p) p[1] = 99;
  if (item->extras->kilnEmulatorTranslate(item->device, 1 << 20) != nullptr) item->seen->push_back(-2);
}

void destroyHostItem(void* user) { ++*static_cast<HostItem*>(user)->destroyed; }

TEST_F(CudaEmulatorTest, HostWorkRunsInStreamOrderAndCanFault) {
  CUstream stream = nullptr;
  ASSERT_EQ(x_->cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  CUdeviceptr d = upload(std::vector<int>{0, 0, 0, 0});
  std::vector<int> seen;
  int destroyed = 0;
  HostItem item{&e_, d, &seen, &destroyed, false};
  ASSERT_EQ(e_.cuMemsetD32Async(d, 3, 4, stream), CUDA_SUCCESS);
  ASSERT_EQ(e_.kilnEmulatorEnqueue(stream, runHostItem, &item, destroyHostItem), CUDA_SUCCESS);
  EXPECT_TRUE(seen.empty());
  ASSERT_EQ(x_->cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(seen, std::vector<int>{3});
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(download<int>(d, 4), (std::vector<int>{3, 99, 3, 3}));

  // Captured host work runs at each replay and is released with the graph.
  ASSERT_EQ(x_->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  ASSERT_EQ(e_.kilnEmulatorEnqueue(stream, runHostItem, &item, destroyHostItem), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ASSERT_EQ(x_->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(x_->cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(x_->cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(x_->cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(destroyed, 2);

  HostItem faulty{&e_, d, &seen, &destroyed, true};
  ASSERT_EQ(e_.kilnEmulatorEnqueue(stream, runHostItem, &faulty, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(x_->cuStreamSynchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(lastFault().find("host work item: bad range"), std::string::npos) << lastFault();
}

// ---------------------------------------------------------------------------
// Speed: lane instructions per second on a simple kernel, as
// KILN_EMULATOR_STATS reports them.

TEST_F(CudaEmulatorTest, InterpreterSpeed) {
  KILN_PTX_OR_SKIP(ptx, R"(
extern "C" __global__ void spin(const float* in, float* out, int n, int iterations) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float a = in[i], b = 1.0001f;
    for (int k = 0; k < iterations; ++k) a = a * b + 0.5f;
    out[i] = a;
  }
})");
  setenv("KILN_EMULATOR_STATS", "1", 1);
  recreateContext();
  unsetenv("KILN_EMULATOR_STATS");
  const int n = 1 << 14;
  CUdeviceptr in = upload(std::vector<float>(n, 1.0f)), out = allocate<float>(n);
  CUfunction f = function(load(ptx), "spin");
  ASSERT_EQ(launch(f, 16, 256, nullptr, 0, in, out, n, 200), CUDA_SUCCESS);
  testing::internal::CaptureStderr();
  ASSERT_EQ(x_->cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_EQ(d_->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  retained_ = false;
  const std::string report = testing::internal::GetCapturedStderr();
  retain();
  const size_t at = report.find(" lane instructions in ");
  EXPECT_NE(report.find("1 kernel launches"), std::string::npos) << report;
  ASSERT_NE(at, std::string::npos) << report;
  const size_t open = report.find('(', at);
  const double millions = std::atof(report.c_str() + open + 1);
  std::printf("interpreter speed: %s", report.c_str());
  RecordProperty("lane_instructions_per_second_millions", std::to_string(millions));
  // The floor is for the normal build: AddressSanitizer's checks on every
  // register and memory access (scripts/test --sanitize) take the
  // interpreter well under it, which says nothing about the emulator.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "no speed floor under AddressSanitizer: " << report;
#endif
#endif
  EXPECT_GT(millions, 20.0) << report;
}

}  // namespace
}  // namespace kiln::cuda
