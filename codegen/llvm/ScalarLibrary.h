// ir/ScalarSemantics.h for the LLVM emitter. CMake compiles the header's
// functions with clang-16 to LLVM bitcode, one C entry point per function
// and dtype (ScalarLibrary.bitcode.cpp: kiln_max_f32, kiln_div_i8, ...),
// and embeds it (codegen/Embedded.h). A ScalarLibrary reads that bitcode
// lazily into one LLVM context; the emitter calls the functions it needs by
// name, and linkInto() then copies just those bodies into the kernel
// module, internal and always-inline, so O3 inlines them into the loops
// and no call is left. Their target attributes are dropped: the functions
// take the kernel module's target (the host CPU's features), so they
// vectorize as the code around them does.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "ir/Support.h"

namespace llvm {
class IRBuilderBase;
class LLVMContext;
class Module;
class Type;
class Value;
template <typename T>
class ArrayRef;
}  // namespace llvm

namespace kiln::codegen {

class ScalarLibrary {
 public:
  /// Reads the embedded bitcode into `context` (bodies are read when
  /// linked). Failing is an internal error: the bitcode is built with Kiln.
  static Expected<std::unique_ptr<ScalarLibrary>> load(llvm::LLVMContext& context);
  ~ScalarLibrary();

  /// A call of `name` (kiln_<function>_<dtype>) returning `result`, at the
  /// builder's position in its module.
  llvm::Value* call(llvm::IRBuilderBase& b, const std::string& name, llvm::Type* result,
                    llvm::ArrayRef<llvm::Value*> args);

  /// Links the functions called in `module` into it. Once per library: the
  /// bitcode module is moved into `module`. An error names a function the
  /// bitcode lacks or declares with another type (a build mismatch).
  Status linkInto(llvm::Module& module);

 private:
  explicit ScalarLibrary(std::unique_ptr<llvm::Module> bitcode);

  std::unique_ptr<llvm::Module> bitcode_;
  std::set<std::string> called_;
  std::string problems_;
};

}  // namespace kiln::codegen
