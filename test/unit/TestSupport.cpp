// The shared unit-test helpers declared in TestSupport.h, among them the
// host build of emitted CUDA C++ that CudaEmitterTest and ScalarSemanticsTest
// run kernels with.
#include "TestSupport.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include "codegen/cpu/CpuExecutable.h"
#include "ir/Parser.h"
#include "ir/Verifier.h"
#include "runtime/Interpreter.h"

namespace kiln::test {
namespace {

/// CUDA's built-ins as host C++, so an emitted translation unit compiles
/// with the host compiler; kiln_host_set picks the emulated thread.
constexpr const char* kHostShim = R"(#include <math.h>
#include <string.h>
struct KilnDim3 { unsigned x = 0, y = 1, z = 1; };
static KilnDim3 blockIdx, threadIdx, blockDim, gridDim;
extern "C" void kiln_host_set(unsigned block, unsigned thread, unsigned blocks, unsigned threads) {
  blockIdx.x = block; threadIdx.x = thread; gridDim.x = blocks; blockDim.x = threads;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
)";

/// Calls `fn` as a function of exactly `a.size()` pointers.
template <size_t... I>
void callWithPointers(void* fn, const std::vector<void*>& a, std::index_sequence<I...>) {
  using Fn = void (*)(decltype((void)I, static_cast<void*>(nullptr))...);
  reinterpret_cast<Fn>(fn)(a[I]...);
}

/// Calls a kernel taking `a.size()` pointers (buffers, then sizes), up to 40.
void callKernel(void* fn, const std::vector<void*>& a) {
  const bool called = [&]<size_t... N>(std::index_sequence<N...>) {
    return ((a.size() == N ? (callWithPointers(fn, a, std::make_index_sequence<N>{}), true) : false) || ...);
  }
  (std::make_index_sequence<41>{});
  ASSERT_TRUE(called) << "a kernel with " << a.size() << " parameters";
}

}  // namespace

std::unique_ptr<Module> parseOk(std::string_view text, std::string_view fileName) {
  auto m = parseModule(text, fileName);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().str()) << "\n" << text;
  return m.ok() ? std::move(*m) : nullptr;
}

std::unique_ptr<Module> parseVerified(std::string_view text, std::string_view fileName) {
  auto m = parseOk(text, fileName);
  if (!m) return nullptr;
  Status s = verify(*m);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().str()) << "\n" << text;
  return m;
}

Tensor randomTensor(const TensorType& type, std::mt19937& rng, bool positive) {
  Tensor t(type.dtype, staticDims(type.shape));
  std::uniform_real_distribution<double> real(positive ? 0.5 : -2.0, 2.0);
  std::uniform_int_distribution<int64_t> integer(positive ? 1 : -5, 5);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    if (type.dtype == DType::Bool)
      t.setInt(i, integer(rng) > 0);
    else if (isFloat(type.dtype))
      t.setDouble(i, real(rng));
    else
      t.setInt(i, isSigned(type.dtype) ? integer(rng) : std::abs(integer(rng)));
  }
  return t;
}

std::string transposedMatmulFunction(bool transposedA, bool transposedB, bool batched) {
  const std::string batch = batched ? "2,3," : "";
  const std::string perm = batched ? "[0, 1, 3, 2]" : "[1, 0]";
  const std::string a = "f32[" + batch + "24,64]", b = "f32[" + batch + "64,40]", y = "f32[" + batch + "24,40]";
  const std::string aStored = transposedA ? "f32[" + batch + "64,24]" : a;
  const std::string bStored = transposedB ? "f32[" + batch + "40,64]" : b;
  std::string text = "func @f(%a: " + aStored + ", %b: " + bStored + ", %c: f32[40]) -> " + y + " {\n";
  if (transposedA) text += "  %at = transpose(%a) {perm = " + perm + "} : " + a + "\n";
  if (transposedB) text += "  %bt = transpose(%b) {perm = " + perm + "} : " + b + "\n";
  text += "  %m = matmul(" + std::string(transposedA ? "%at" : "%a") + ", " + (transposedB ? "%bt" : "%b") + ") : " + y +
          "\n  %y = add(%m, %c) : " + y + "\n  return %y\n}\n";
  return text;
}

Tensor randomF32(const std::vector<int64_t>& shape, int seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  Tensor t(DType::F32, shape);
  for (int64_t i = 0; i < t.numElements(); ++i) t.setDouble(i, real(rng));
  return t;
}

Tensor tensorOf(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values) {
  Tensor t(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.setDouble(static_cast<int64_t>(i), values[i]);
  return t;
}

std::vector<double> elementsOf(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numElements(); ++i) v.push_back(t.getDouble(i));
  return v;
}

void expectClose(const Tensor& got, const Tensor& want, const std::string& what, double rtol, double atol) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    if (isFloat(want.dtype())) {
      const double g = got.getDouble(i), w = want.getDouble(i);
      if (std::isnan(w) || std::isinf(w)) {
        EXPECT_TRUE(std::isnan(w) ? std::isnan(g) : g == w) << what << " element " << i << ": " << g << " vs " << w;
        continue;
      }
      EXPECT_NEAR(g, w, atol + rtol * std::fabs(w)) << what << " element " << i;
    } else {
      EXPECT_EQ(got.getInt(i), want.getInt(i)) << what << " element " << i;
    }
  }
}

// Each call works in a fresh temporary folder (tests of several build trees
// may run at once), removed once the library is loaded.
void* buildCudaHostLibrary(const std::string& source) {
  std::string pattern = (std::filesystem::path(testing::TempDir()) / "kiln-cuda-host-XXXXXX").string();
  if (!mkdtemp(pattern.data())) {
    ADD_FAILURE() << "cannot create a temporary folder from " << pattern;
    return nullptr;
  }
  const std::filesystem::path dir = pattern, cpp = dir / "kernels.cpp", so = dir / "kernels.so";
  std::ofstream(cpp) << kHostShim << source;
  const std::string command =
      std::string(KILN_HOST_CXX) + " -std=c++17 -O1 -shared -fPIC -w -o " + so.string() + " " + cpp.string() + " 2>&1";
  void* library = nullptr;
  if (std::system(command.c_str()) != 0)
    ADD_FAILURE() << "the emitted CUDA C++ does not compile as host C++: " << command;
  else if (!(library = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL)))
    ADD_FAILURE() << dlerror();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return library;
}

void runCudaKernelOnHost(void* library, void* kernel, const std::vector<void*>& args) {
  auto setThread = reinterpret_cast<void (*)(unsigned, unsigned, unsigned, unsigned)>(dlsym(library, "kiln_host_set"));
  ASSERT_NE(setThread, nullptr) << "not a library of buildCudaHostLibrary";
  for (unsigned block = 0; block < 3; ++block)
    for (unsigned thread = 0; thread < 4; ++thread) {
      setThread(block, thread, 3, 4);
      callKernel(kernel, args);
    }
}

Tensor runKernelsOnHost(void* library, const std::vector<kir::Kernel>& kernels, std::map<std::string, Tensor> values) {
  Tensor last;
  for (const kir::Kernel& k : kernels) {
    void* fn = dlsym(library, k.name.c_str());
    EXPECT_NE(fn, nullptr) << k.name;
    if (!fn) return last;
    std::vector<void*> args;
    Tensor out;
    for (const kir::Buffer& b : k.buffers) {
      if (b.role == kir::Buffer::Role::Output) {
        out = Tensor(b.dtype, b.shape);
        args.push_back(out.raw());
        continue;
      }
      auto it = values.find(b.name);
      EXPECT_NE(it, values.end()) << "kernel " << k.name << " reads %" << b.name << ", which no earlier kernel made";
      if (it == values.end()) return last;
      args.push_back(const_cast<uint8_t*>(it->second.raw()));
    }
    args.push_back(nullptr);  // sizes
    runCudaKernelOnHost(library, fn, args);
    values[k.buffers.back().name] = out;
    last = out;
  }
  return last;
}

std::optional<std::vector<Tensor>> interpretedResults(const Function& f, const std::vector<Tensor>& inputs) {
  auto results = interpret(f, inputs);
  if (!results.ok()) {
    ADD_FAILURE() << "the interpreter: " << results.error().str();
    return std::nullopt;
  }
  return std::move(*results);
}

std::optional<std::vector<Tensor>> cpuJitResults(const Function& f, const std::vector<Tensor>& inputs, int optLevel) {
  auto executor = codegen::CpuExecutor::create(f, {.threads = 2, .optLevel = optLevel});
  if (!executor.ok()) {
    ADD_FAILURE() << "compiling at -O" << optLevel << ": " << executor.error().str();
    return std::nullopt;
  }
  auto results = (*executor)->run(inputs);
  if (!results.ok()) {
    ADD_FAILURE() << "running at -O" << optLevel << ": " << results.error().str();
    return std::nullopt;
  }
  return std::move(*results);
}

}  // namespace kiln::test
