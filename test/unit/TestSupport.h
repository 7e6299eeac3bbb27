// Helpers shared by the unit tests that parse text IR, make random inputs
// and compare what the CPU JIT (or the CUDA emitter's host build) computes
// with what the reference interpreter computes. Each helper reports
// problems as GoogleTest failures in the calling test, so a test that
// uses one fails exactly as it did with its own copy. The interpreter's
// op-by-op helpers are in InterpreterTestSupport.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/KernelIR.h"
#include "ir/IR.h"
#include "runtime/Tensor.h"

namespace kiln::test {

/// The results of `f` on `inputs` from the reference interpreter; on an
/// error, fails the test with its message and returns nullopt.
std::optional<std::vector<Tensor>> interpretedResults(const Function& f, const std::vector<Tensor>& inputs);

/// The results of `f` on `inputs` from the CPU JIT at `optLevel` on 2
/// threads; on a compile or run error, fails the test with its message and
/// returns nullopt.
std::optional<std::vector<Tensor>> cpuJitResults(const Function& f, const std::vector<Tensor>& inputs, int optLevel);

/// Parses `text` (error locations name `fileName`); on an error, fails the
/// test with the parser's message and the text, and returns null. The
/// module is not verified.
std::unique_ptr<Module> parseOk(std::string_view text, std::string_view fileName = "test.kir");

/// parseOk, then the verifier: a module that does not verify fails the test
/// with the verifier's message and the text (and is still returned).
std::unique_ptr<Module> parseVerified(std::string_view text, std::string_view fileName = "test.kir");

/// The text of `func @f(%a, %b, %c)` computing %y = matmul(a, b) + c, a
/// [24, 64] (batched: [2, 3, 24, 64]), b [64, 40] (batched: [2, 3, 64, 40])
/// and c [40]; with `transposedA` (`transposedB`) the argument %a (%b) is
/// stored with its last two dims swapped and transposed by the function, as
/// a library call reads it in place (LibraryCall::transposedA, transposedB).
std::string transposedMatmulFunction(bool transposedA, bool transposedB, bool batched);

/// Random values for a tensor of `type` (static shape) drawn from `rng`:
/// floats uniform in [-2, 2), integers in [-5, 5] (u8: their magnitude),
/// bools true for positive draws. With `positive`, floats are in [0.5, 2)
/// and integers in [1, 5], so divisors are never zero and log and sqrt
/// inputs are in their domain.
Tensor randomTensor(const TensorType& type, std::mt19937& rng, bool positive = false);

/// An f32 tensor of `shape` with values uniform in [-1, 1) from a generator
/// seeded with `seed`: the same seed gives the same tensor.
Tensor randomF32(const std::vector<int64_t>& shape, int seed);

/// A tensor of `dtype` and `shape` whose first elements are `values`, in
/// row-major order (any others zero).
Tensor tensorOf(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values);

/// Every element of `t`, in row-major order, as a double.
std::vector<double> elementsOf(const Tensor& t);

/// Checks that `got` has `want`'s dtype and shape (fatal to this check when
/// not) and its values: floats within atol + rtol * |want| (NaN matches NaN,
/// an infinity only itself), integers and bools exactly. Failures name
/// `what` and the element.
void expectClose(const Tensor& got, const Tensor& want, const std::string& what, double rtol = 1e-4,
                 double atol = 1e-5);

/// `cudaSource` (a translation unit of codegen/cuda/CudaEmitter.h) compiled
/// as host C++ into a shared library and loaded: a shim defines __global__,
/// blockIdx, ... and CUDA's few non-standard functions, so the emitter's
/// indexing and scalar rules run without a GPU. Null, with a test failure,
/// when it does not compile.
void* buildCudaHostLibrary(const std::string& cudaSource);

/// Runs `kernel` (looked up in `library` with dlsym) on `args` (buffers,
/// then sizes) on an emulated grid of 3 blocks of 4 threads, one thread
/// after another: fewer threads than elements, so the grid-stride loop takes
/// several turns.
void runCudaKernelOnHost(void* library, void* kernel, const std::vector<void*>& args);

/// Runs `kernels`, compiled into `library` by buildCudaHostLibrary under
/// their own names, one after another with runCudaKernelOnHost: each reads
/// its input buffers by name from `values` (a function's arguments, by
/// name) and adds its result there. Returns the last kernel's result; a
/// kernel missing from the library, or one reading a value that neither an
/// argument nor an earlier kernel made, fails the test.
Tensor runKernelsOnHost(void* library, const std::vector<kir::Kernel>& kernels, std::map<std::string, Tensor> values);

}  // namespace kiln::test
