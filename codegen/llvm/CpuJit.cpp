// Compiling kernels for the host CPU. Kernels are split into modules of a
// few kernels each; worker threads (each with its own LLVMContext and
// TargetMachine, as LLVM requires) emit a module, print its IR to derive the
// cache key, and either take its object file from the disk cache or run the
// O3 pipeline of a TargetMachine for the host's CPU name and features (so
// the vectorizer sizes vectors for AVX-512 where present) and generate the
// object file themselves. lld, called as a library, then links the objects
// into one shared object, which the runtime loads with dlopen. LLVM
// diagnostics and llvm::Errors become Kiln errors carrying LLVM's message.
//
// Why several modules: LLVM's per-module work is serial, so one module of a
// hundred kernels keeps one core busy while the other waits; modules also
// make cache entries small enough that one changed kernel costs one module.
#include "codegen/llvm/CpuJit.h"

#include <lld/Common/Driver.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "codegen/KernelCache.h"
#include "codegen/llvm/LlvmEmitter.h"

namespace kiln::codegen {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

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
  if (llvm::sys::getHostCPUFeatures(features)) {
    // Sorted, so that the feature string (part of cache keys and .kc
    // headers) does not depend on the StringMap's hash order.
    std::vector<std::pair<std::string, bool>> sorted;
    for (const auto& f : features) sorted.emplace_back(f.first().str(), f.second);
    std::sort(sorted.begin(), sorted.end());
    for (const auto& [name, on] : sorted) subtarget.AddFeature(name, on);
  }
  builder.addFeatures(subtarget.getFeatures());
  builder.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
  // The objects are linked into a shared object that the runtime loads at
  // any address.
  builder.setRelocationModel(llvm::Reloc::PIC_);
  return builder;
}

/// Reads a whole file, or nullopt.
std::optional<std::string> readWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

/// Links relocatable `objects` into one shared object with lld. lld reads
/// and writes files, so they pass through a private temporary folder. lld
/// keeps global state that one link leaves behind and the next one trips
/// over (lld 16 is not re-entrant for ELF), so each link runs in a child
/// process forked for it, whose lld state is fresh and which exits when it
/// is done; `--threads=1` keeps it to the one thread a fork has.
Expected<std::string> linkWithLld(const std::vector<std::string>& objects) {
  std::string pattern = (std::filesystem::temp_directory_path() / "kiln-link-XXXXXX").string();
  if (!mkdtemp(pattern.data()))
    return Error("cannot create a temporary folder to link the kernels in: " + std::string(std::strerror(errno)));
  const std::filesystem::path dir(pattern);
  struct RemoveDir {
    std::filesystem::path dir;
    ~RemoveDir() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } cleanup{dir};
  std::vector<std::string> args = {"ld.lld",      "-shared", "--strip-all", "--build-id=none", "--hash-style=gnu",
                                   "--threads=1", "-o",      (dir / "kernels.so").string()};
  for (size_t i = 0; i < objects.size(); ++i) {
    const std::filesystem::path path = dir / ("kernels-" + std::to_string(i) + ".o");
    std::ofstream out(path, std::ios::binary);
    if (!(out << objects[i]) || !(out.close(), out))
      return Error("cannot write the kernels' object code to '" + path.string() + "'");
    args.push_back(path.string());
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  const std::string messagesPath = (dir / "messages.txt").string();
  const pid_t child = fork();
  if (child < 0) return Error("cannot start the linker: fork: " + std::string(std::strerror(errno)));
  if (child == 0) {
    std::error_code ec;
    llvm::raw_fd_ostream messages(messagesPath, ec);
    const bool linked = !ec && lld::elf::link(argv, messages, messages, /*exitEarly=*/false, /*disableOutput=*/false);
    messages.flush();
    _exit(linked ? 0 : 1);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0)
    if (errno != EINTR) return Error("cannot wait for the linker: " + std::string(std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string messages = readWholeFile(messagesPath).value_or("");
    return Error("lld could not link the kernels" +
                 (WIFSIGNALED(status) ? " (it stopped on signal " + std::to_string(WTERMSIG(status)) + ")" : "") +
                 (messages.empty() ? std::string() : ": " + messages));
  }
  auto bytes = readWholeFile(dir / "kernels.so");
  if (!bytes) return Error("lld wrote no shared object");
  return std::move(*bytes);
}

/// Kernels per LLVM module: small enough that two threads stay busy and a
/// changed kernel recompiles little, large enough that the per-module cost
/// (pipeline setup, object file, linking) stays small.
constexpr size_t kKernelsPerModule = 12;
constexpr size_t kMaxModules = 16;

/// Contiguous ranges of `n` kernels, one per module, of nearly equal size.
std::vector<std::pair<size_t, size_t>> splitKernels(size_t n) {
  const size_t modules = std::clamp<size_t>((n + kKernelsPerModule - 1) / kKernelsPerModule, 1, kMaxModules);
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t m = 0; m < modules; ++m) ranges.emplace_back(n * m / modules, n * (m + 1) / modules);
  return ranges;
}

/// One module's work and results, filled by a worker thread.
struct ModuleJob {
  std::vector<kir::Kernel> kernels;
  std::string object;
  std::optional<Error> error;
  bool cacheHit = false;
  double emit = 0, optimize = 0, codegen = 0, cacheLookup = 0, cacheStore = 0;
};

}  // namespace

struct CpuJit::Impl {
  std::optional<llvm::orc::JITTargetMachineBuilder> builder;
  CpuMachine target;

  Expected<std::unique_ptr<llvm::TargetMachine>> createMachine() {
    auto machine = builder->createTargetMachine();
    if (!machine)
      return toError("cannot create an LLVM target machine for host CPU '" + target.cpu + "'", machine.takeError());
    return std::move(*machine);
  }

  /// Emits `kernels` into a module of `context` for `machine`'s target.
  Expected<std::unique_ptr<llvm::Module>> emit(const std::vector<kir::Kernel>& kernels, llvm::LLVMContext& context,
                                               llvm::TargetMachine& machine) {
    auto module = emitLlvmModule(kernels, context);
    if (!module) return module;
    (*module)->setDataLayout(machine.createDataLayout());
    (*module)->setTargetTriple(machine.getTargetTriple().str());
    for (llvm::Function& f : **module) {
      if (f.isDeclaration()) continue;
      f.addFnAttr("target-cpu", target.cpu);
      f.addFnAttr("target-features", target.features);
    }
    return module;
  }

  /// Runs the O3 pipeline on `module`.
  static void optimize(llvm::Module& module, llvm::TargetMachine& machine) {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(&machine);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
    mpm.run(module, mam);
  }

  /// Machine code for `module` as a relocatable object file.
  static Expected<std::string> generateObject(llvm::Module& module, llvm::TargetMachine& machine) {
    llvm::SmallVector<char, 0> buffer;
    llvm::raw_svector_ostream os(buffer);
    llvm::legacy::PassManager pm;
    if (machine.addPassesToEmitFile(pm, os, nullptr, llvm::CGFT_ObjectFile))
      return Error("LLVM cannot generate object files for host CPU '" + machine.getTargetCPU().str() + "'");
    pm.run(module);
    return std::string(buffer.begin(), buffer.end());
  }

  /// The cache key of a module: its IR text and everything else the object
  /// code depends on.
  std::string cacheKey(const std::string& irText) const {
    std::string keyed;
    keyed.reserve(irText.size() + 512);
    keyed.append(kCpuCodegenVersion).append("\n");
    keyed.append(target.triple).append("\n").append(target.cpu).append("\n").append(target.features).append("\n");
    keyed.append(irText);
    return contentHash(keyed);
  }

  /// A worker's part of compile(): the object of `job`'s kernels.
  void compileJob(ModuleJob& job, llvm::TargetMachine& machine, KernelCache* cache) {
    llvm::LLVMContext context;
    Diagnostics diagnostics;
    context.setDiagnosticHandlerCallBack(&Diagnostics::handle, &diagnostics);
    Clock::time_point start = Clock::now();
    auto module = emit(job.kernels, context, machine);
    if (!module) {
      job.error = module.takeError();
      return;
    }
    std::string key;
    if (cache && cache->enabled()) {
      std::string text;
      llvm::raw_string_ostream os(text);
      (*module)->print(os, nullptr);
      key = cacheKey(os.str());
      job.emit = secondsSince(start);
      start = Clock::now();
      std::optional<std::string> object = cache->lookup(key);
      job.cacheLookup = secondsSince(start);
      if (object) {
        job.object = std::move(*object);
        job.cacheHit = true;
        return;
      }
    } else {
      job.emit = secondsSince(start);
    }
    start = Clock::now();
    optimize(**module, machine);
    job.optimize = secondsSince(start);
    start = Clock::now();
    auto object = generateObject(**module, machine);
    job.codegen = secondsSince(start);
    if (!diagnostics.errors.empty()) {
      job.error = Error("LLVM could not compile the kernels: " + diagnostics.errors);
      return;
    }
    if (!object) {
      job.error = object.takeError();
      return;
    }
    job.object = std::move(*object);
    if (!key.empty()) {
      start = Clock::now();
      cache->store(key, job.object);
      job.cacheStore = secondsSince(start);
    }
  }

};

CpuJit::CpuJit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuJit::~CpuJit() = default;

const std::string& CpuJit::cpuName() const { return impl_->target.cpu; }
const CpuMachine& CpuJit::target() const { return impl_->target; }

CpuMachine CpuJit::hostTarget() {
  initializeNativeTarget();
  const llvm::Triple triple(llvm::sys::getProcessTriple());
  llvm::orc::JITTargetMachineBuilder builder = hostMachineBuilder(triple);
  return {triple.str(), builder.getCPU(), builder.getFeatures().getString()};
}

Expected<std::unique_ptr<CpuJit>> CpuJit::create() {
  initializeNativeTarget();
  auto impl = std::make_unique<Impl>();
  const llvm::Triple triple(llvm::sys::getProcessTriple());
  impl->builder = hostMachineBuilder(triple);
  impl->target = {triple.str(), impl->builder->getCPU(), impl->builder->getFeatures().getString()};
  // Fail early, with the CPU named, when LLVM cannot target this host.
  if (auto machine = impl->createMachine(); !machine) return machine.takeError();
  return std::unique_ptr<CpuJit>(new CpuJit(std::move(impl)));
}

Expected<std::string> CpuJit::compile(const std::vector<kir::Kernel>& kernels, int threads, KernelCache* cache,
                                      CompileReport* report) {
  std::vector<ModuleJob> jobs;
  for (auto [begin, end] : splitKernels(kernels.size())) {
    ModuleJob& job = jobs.emplace_back();
    job.kernels.assign(kernels.begin() + static_cast<std::ptrdiff_t>(begin),
                       kernels.begin() + static_cast<std::ptrdiff_t>(end));
  }
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t workers = std::min<size_t>(static_cast<size_t>(threads), jobs.size());

  // Each worker takes the next job until none is left.
  const Clock::time_point wallStart = Clock::now();
  std::atomic<size_t> next{0};
  std::vector<std::optional<Error>> workerErrors(workers);
  auto work = [&](size_t worker) {
    auto machine = impl_->createMachine();
    if (!machine) {
      workerErrors[worker] = machine.takeError();
      return;
    }
    for (size_t j = next++; j < jobs.size(); j = next++) impl_->compileJob(jobs[j], **machine, cache);
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& t : pool) t.join();
  const double llvmWall = secondsSince(wallStart);

  for (std::optional<Error>& e : workerErrors)
    if (e) return std::move(*e);
  std::vector<std::string> objects;
  for (ModuleJob& job : jobs) {
    if (job.error) return std::move(*job.error);
    objects.push_back(std::move(job.object));
  }
  const Clock::time_point linkStart = Clock::now();
  auto sharedObject = linkWithLld(objects);
  if (!sharedObject) return sharedObject.takeError();
  if (report) {
    report->llvmWall += llvmWall;
    report->link += secondsSince(linkStart);
    report->kernels += static_cast<int>(kernels.size());
    report->modules += static_cast<int>(jobs.size());
    report->threads = std::max(report->threads, static_cast<int>(workers));
    for (const ModuleJob& job : jobs) {
      report->emit += job.emit;
      report->optimize += job.optimize;
      report->codegen += job.codegen;
      report->cacheLookup += job.cacheLookup;
      report->cacheStore += job.cacheStore;
      report->cacheHits += job.cacheHit;
    }
  }
  return std::move(*sharedObject);
}

Expected<std::string> CpuJit::optimizedIR(const std::vector<kir::Kernel>& kernels) {
  auto machine = impl_->createMachine();
  if (!machine) return machine.takeError();
  llvm::LLVMContext context;
  Diagnostics diagnostics;
  context.setDiagnosticHandlerCallBack(&Diagnostics::handle, &diagnostics);
  auto module = impl_->emit(kernels, context, **machine);
  if (!module) return module.takeError();
  Impl::optimize(**module, **machine);
  if (!diagnostics.errors.empty()) return Error("LLVM could not optimize the kernels: " + diagnostics.errors);
  std::string text;
  llvm::raw_string_ostream os(text);
  (*module)->print(os, nullptr);
  return os.str();
}

std::string formatCompileReport(const CompileReport& r) {
  std::string out;
  char line[200];
  const double total = r.passes + r.lowering + r.llvmWall + r.link;
  out +=
      "===-------------------------------------------------------------------------===\n"
      "                  ... Code generation timing report ...\n"
      "===-------------------------------------------------------------------------===\n";
  std::snprintf(
      line, sizeof line,
      "  Total: %.4f seconds (%d kernel%s: %d LLVM module%s compiled on %d thread%s, %d linked as stored)\n\n", total,
      r.kernels, r.kernels == 1 ? "" : "s", r.modules, r.modules == 1 ? "" : "s", r.threads, r.threads == 1 ? "" : "s",
      r.storedModules);
  out += line;
  out += "  ----Wall Time----  ----Phase----\n";
  auto row = [&](double secs, const std::string& name) {
    std::snprintf(line, sizeof line, "  %8.4f (%5.1f%%)  %s\n", secs, total > 0 ? 100 * secs / total : 0.0,
                  name.c_str());
    out += line;
  };
  row(r.passes, "graph passes (the table above)");
  row(r.lowering, "lowering to kernel IR");
  row(r.llvmWall, "LLVM (wall time; the phases below are summed over threads)");
  auto sub = [&](double secs, const std::string& name) {
    std::snprintf(line, sizeof line, "  %8.4f           %s\n", secs, name.c_str());
    out += line;
  };
  sub(r.emit, "  LLVM IR emission");
  sub(r.cacheLookup,
      "  kernel cache lookups (" + std::to_string(r.cacheHits) + " of " + std::to_string(r.modules) + " modules hit)");
  sub(r.optimize, "  LLVM optimization (O3)");
  sub(r.codegen, "  machine code generation");
  sub(r.cacheStore, "  kernel cache stores");
  // A stored program (.kc) is loaded, not linked: no LLVM work above.
  row(r.link, r.storedModules > 0 && r.modules == 0 ? "loading the stored code and creating its library calls"
                                                     : "linking objects into the JIT");
  std::snprintf(line, sizeof line, "  %8.4f (100.0%%)  Total\n", total);
  out += line;
  return out;
}

}  // namespace kiln::codegen
