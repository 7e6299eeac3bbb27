// ORC LLJIT for the host CPU. Modules are optimized here, with the O3
// pipeline of a TargetMachine for the host's CPU name and features (so the
// vectorizer sizes vectors for AVX-512 where present), then handed to the
// JIT, which only generates code. LLVM diagnostics and llvm::Errors become
// Kiln errors carrying LLVM's message.
#include "codegen/llvm/CpuJit.h"

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>

#include <mutex>

#include "codegen/llvm/LlvmEmitter.h"

namespace kiln::codegen {
namespace {

Error toError(const std::string& context, llvm::Error error) {
  return Error(context + ": " + llvm::toString(std::move(error)));
}

/// Error diagnostics LLVM reports while optimizing or compiling a module.
struct Diagnostics {
  std::string errors;
  static void handle(const llvm::DiagnosticInfo& info, void* self) {
    if (info.getSeverity() != llvm::DS_Error) return;
    std::string message;
    llvm::raw_string_ostream os(message);
    llvm::DiagnosticPrinterRawOStream printer(os);
    info.print(printer);
    auto& d = *static_cast<Diagnostics*>(self);
    d.errors += (d.errors.empty() ? "" : "; ") + os.str();
  }
};

void initializeNativeTarget() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

llvm::orc::JITTargetMachineBuilder hostMachineBuilder(const llvm::Triple& triple) {
  llvm::orc::JITTargetMachineBuilder builder(triple);
  builder.setCPU(llvm::sys::getHostCPUName().str());
  llvm::StringMap<bool> features;
  llvm::SubtargetFeatures subtarget;
  if (llvm::sys::getHostCPUFeatures(features))
    for (const auto& f : features) subtarget.AddFeature(f.first(), f.second);
  builder.addFeatures(subtarget.getFeatures());
  builder.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
  return builder;
}

}  // namespace

struct CpuJit::Impl {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::unique_ptr<llvm::TargetMachine> machine;
  std::string cpu;
  std::string features;

  /// Emits and optimizes `kernels` in `context`.
  Expected<std::unique_ptr<llvm::Module>> build(const std::vector<kir::Kernel>& kernels, llvm::LLVMContext& context) {
    Diagnostics diagnostics;
    context.setDiagnosticHandlerCallBack(&Diagnostics::handle, &diagnostics);
    auto module = emitLlvmModule(kernels, context);
    if (!module) return module;
    (*module)->setDataLayout(machine->createDataLayout());
    (*module)->setTargetTriple(machine->getTargetTriple().str());
    for (llvm::Function& f : **module) {
      if (f.isDeclaration()) continue;
      f.addFnAttr("target-cpu", cpu);
      f.addFnAttr("target-features", features);
    }

    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(machine.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
    mpm.run(**module, mam);
    context.setDiagnosticHandlerCallBack(nullptr, nullptr);
    if (!diagnostics.errors.empty()) return Error("LLVM could not optimize the kernels: " + diagnostics.errors);
    return module;
  }
};

CpuJit::CpuJit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuJit::~CpuJit() = default;

const std::string& CpuJit::cpuName() const { return impl_->cpu; }

Expected<std::unique_ptr<CpuJit>> CpuJit::create() {
  initializeNativeTarget();
  auto impl = std::make_unique<Impl>();
  const llvm::Triple triple(llvm::sys::getProcessTriple());
  llvm::orc::JITTargetMachineBuilder builder = hostMachineBuilder(triple);
  impl->cpu = builder.getCPU();
  impl->features = builder.getFeatures().getString();
  auto machine = builder.createTargetMachine();
  if (!machine)
    return toError("cannot create an LLVM target machine for host CPU '" + impl->cpu + "'", machine.takeError());
  impl->machine = std::move(*machine);

  auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(builder).create();
  if (!jit) return toError("cannot create the LLVM JIT", jit.takeError());
  impl->jit = std::move(*jit);
  // Kernels call libm (tanhf, erff, ...) and the math functions LLVM
  // lowers intrinsics to; they resolve against this process.
  auto generator =
      llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(impl->jit->getDataLayout().getGlobalPrefix());
  if (!generator) return toError("cannot expose the process's symbols to the JIT", generator.takeError());
  impl->jit->getMainJITDylib().addGenerator(std::move(*generator));
  return std::unique_ptr<CpuJit>(new CpuJit(std::move(impl)));
}

Expected<std::vector<KernelFn>> CpuJit::compile(const std::vector<kir::Kernel>& kernels) {
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = impl_->build(kernels, *context);
  if (!module) return module.takeError();
  if (llvm::Error e = impl_->jit->addIRModule(llvm::orc::ThreadSafeModule(std::move(*module), std::move(context))))
    return toError("the JIT refused the kernels", std::move(e));
  std::vector<KernelFn> entries;
  for (const kir::Kernel& k : kernels) {
    auto address = impl_->jit->lookup(k.name);
    if (!address) return toError("cannot compile kernel '" + k.name + "'", address.takeError());
    entries.push_back(address->toPtr<KernelFn>());
  }
  return entries;
}

Expected<std::string> CpuJit::optimizedIR(const std::vector<kir::Kernel>& kernels) {
  llvm::LLVMContext context;
  auto module = impl_->build(kernels, context);
  if (!module) return module.takeError();
  std::string text;
  llvm::raw_string_ostream os(text);
  (*module)->print(os, nullptr);
  return os.str();
}

}  // namespace kiln::codegen
