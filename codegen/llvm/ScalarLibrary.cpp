// Loading and linking the scalar library (ScalarLibrary.h). The bitcode is
// read with getLazyBitcodeModule, so a kernel module pays for parsing the
// few function bodies it links (LinkOnlyNeeded materializes them), not the
// whole library.
#include "codegen/llvm/ScalarLibrary.h"

#include <llvm/ADT/StringSet.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/Attributes.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>

#include "codegen/Embedded.h"

namespace kiln::codegen {

ScalarLibrary::ScalarLibrary(std::unique_ptr<llvm::Module> bitcode) : bitcode_(std::move(bitcode)) {}
ScalarLibrary::~ScalarLibrary() = default;

Expected<std::unique_ptr<ScalarLibrary>> ScalarLibrary::load(llvm::LLVMContext& context) {
  const llvm::MemoryBufferRef buffer(
      llvm::StringRef(embedded::kScalarLibraryBitcode.data(), embedded::kScalarLibraryBitcode.size()),
      "ir/ScalarSemantics.h");
  auto module = llvm::getLazyBitcodeModule(buffer, context);
  if (!module)
    return Error(
        "internal error: the scalar library built into Kiln (ir/ScalarSemantics.h as LLVM bitcode) does "
        "not load: " +
        llvm::toString(module.takeError()));
  // Only function bodies may reach a kernel module. The kernel module sets
  // its own triple and data layout (codegen/llvm/CpuJit.cpp), which the
  // linker would otherwise copy from here into a module that has none yet,
  // and clang's module flags (PIC and PIE levels, unwind tables) must not
  // change how the JIT's code is generated.
  (*module)->setTargetTriple("");
  (*module)->setDataLayout("");
  for (const char* name : {"llvm.module.flags", "llvm.ident"})
    if (llvm::NamedMDNode* node = (*module)->getNamedMetadata(name)) (*module)->eraseNamedMetadata(node);
  return std::unique_ptr<ScalarLibrary>(new ScalarLibrary(std::move(*module)));
}

llvm::Value* ScalarLibrary::call(llvm::IRBuilderBase& b, const std::string& name, llvm::Type* result,
                                 llvm::ArrayRef<llvm::Value*> args) {
  std::vector<llvm::Type*> params;
  for (llvm::Value* a : args) params.push_back(a->getType());
  auto* type = llvm::FunctionType::get(result, params, false);
  llvm::Module& module = *b.GetInsertBlock()->getModule();
  llvm::CallInst* call = b.CreateCall(module.getOrInsertFunction(name, type), args);
  call->setDoesNotThrow();
  const llvm::Function* definition = bitcode_ ? bitcode_->getFunction(name) : nullptr;
  if (called_.insert(name).second && (!definition || definition->getFunctionType() != type))
    problems_ += (problems_.empty() ? "" : "; ") + name + (definition ? " has another type" : " is missing");
  if (!definition) return call;
  // The C ABI's attributes (signext/zeroext on i8 and i16), so that the call
  // matches the definition until it is inlined.
  const llvm::AttributeList attributes = definition->getAttributes();
  std::vector<llvm::AttributeSet> paramAttributes;
  for (unsigned i = 0; i < args.size(); ++i) paramAttributes.push_back(attributes.getParamAttrs(i));
  call->setAttributes(
      llvm::AttributeList::get(b.getContext(), llvm::AttributeSet(), attributes.getRetAttrs(), paramAttributes));
  return call;
}

namespace {

/// Makes the linked functions private to the kernel module and inlined,
/// with the kernel module's target (see ScalarLibrary.h).
void internalize(llvm::Module& module, const llvm::StringSet<>& names) {
  for (const auto& name : names) {
    llvm::Function* f = module.getFunction(name.getKey());
    if (!f) continue;
    f->setLinkage(llvm::GlobalValue::InternalLinkage);
    f->removeFnAttr(llvm::Attribute::NoInline);
    f->addFnAttr(llvm::Attribute::AlwaysInline);
    for (const char* attribute : {"target-cpu", "target-features", "tune-cpu"}) f->removeFnAttr(attribute);
  }
}

}  // namespace

Status ScalarLibrary::linkInto(llvm::Module& module) {
  if (!problems_.empty())
    return Error("internal error: the scalar library built into Kiln does not match its emitter: " + problems_);
  if (called_.empty()) return {};
  if (!bitcode_) return Error("internal error: the scalar library was linked into a module twice");
  if (llvm::Linker::linkModules(module, std::move(bitcode_), llvm::Linker::LinkOnlyNeeded, internalize))
    return Error("internal error: LLVM could not link the scalar library into a kernel module");
  return {};
}

}  // namespace kiln::codegen
