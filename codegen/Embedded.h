// Files the codegen library carries in its binary, written into it by CMake
// at build time (codegen/CMakeLists.txt, cmake/EmbedFile.cmake), so that
// generating code never depends on finding the source tree at run time.
#pragma once

#include <string_view>

namespace kiln::codegen::embedded {

/// The text of ir/ScalarSemantics.h: the start of every CUDA translation
/// unit (cuda/CudaEmitter.cpp).
extern const std::string_view kScalarSemanticsSource;

/// ir/ScalarSemantics.h's functions compiled by clang-16 to LLVM bitcode,
/// one C entry point per function and dtype (llvm/ScalarLibrary.bitcode.cpp),
/// linked into kernel modules by llvm/ScalarLibrary.h.
extern const std::string_view kScalarLibraryBitcode;

}  // namespace kiln::codegen::embedded
