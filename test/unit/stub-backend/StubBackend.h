// A backend that only a test knows: registered from this folder with
// codegen/Backend.h registerBackend, with no edit anywhere else in Kiln, it
// is what `kiln-opt --target stub` compiles for (BackendTest.cpp). Its
// target takes no library calls; its pipeline is its own (the graph
// passes, no fusion, so every op is a kernel of its own); its schedule runs
// every loop in order; its compiler lays out the plain-data program
// (codegen/cpu/CpuCompiler.h layoutProgram) with no code object, which is
// all a backend whose kernels some other party runs needs to give.
#pragma once

#include <memory>
#include <string_view>

#include "codegen/Backend.h"

namespace kiln::test {

/// The stub's name: `--target stub`.
inline constexpr std::string_view kStubBackendName = "stub";

/// A new stub backend.
std::unique_ptr<codegen::Backend> createStubBackend();

/// Registers the stub once per process (later calls do nothing).
Status registerStubBackend();

}  // namespace kiln::test
