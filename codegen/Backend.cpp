// The backend registry and the one lowering of Backend.h. The built-in
// backends are registered on the first look-up, so a static library that no
// one references for them cannot leave them out.
#include "codegen/Backend.h"

#include <mutex>

#include "codegen/cpu/CpuBackend.h"
#include "codegen/cuda/CudaBackend.h"
#include "passes/PassManager.h"

namespace kiln::codegen {

std::string Backend::pipeline(int level) const { return std::string(optLevelPipeline(level, /*forTarget=*/true)); }

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<Backend>> backends;
};

Registry& registry() {
  static Registry* r = [] {
    auto* created = new Registry;
    created->backends.push_back(createCpuBackend());
    created->backends.push_back(createCudaBackend());
    return created;
  }();
  return *r;
}

bool isPlainWord(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return false;
  return true;
}

}  // namespace

Status registerBackend(std::unique_ptr<Backend> backend) {
  if (!backend) return Error("registerBackend was given no backend");
  const std::string name(backend->name());
  if (!isPlainWord(name))
    return Error("a backend's name must be a plain word (letters, digits, '-', '_'), not '" + name + "'");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& b : r.backends)
    if (b->name() == backend->name()) return Error("a backend named '" + name + "' is registered already");
  r.backends.push_back(std::move(backend));
  return Status::success();
}

const Backend* backendNamed(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& b : r.backends)
    if (b->name() == name) return b.get();
  return nullptr;
}

std::string backendNames() {
  std::string names;
  for (const Backend* b : registeredBackends()) names += (names.empty() ? "" : ", ") + std::string(b->name());
  return names;
}

Expected<const Backend*> findBackend(std::string_view name) {
  if (const Backend* b = backendNamed(name)) return b;
  return Error("no backend is named '" + std::string(name) + "' (registered: " + backendNames() + ")");
}

std::vector<const Backend*> registeredBackends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<const Backend*> all;
  for (const auto& b : r.backends) all.push_back(b.get());
  return all;
}

const Backend* backendOf(const Target& target) {
  for (const Backend* b : registeredBackends())
    if (&b->target() == &target) return b;
  return nullptr;
}

Expected<std::vector<LoweredStep>> lowerForBackend(const Function& f, const Backend& backend, std::string_view prefix,
                                                   std::vector<std::string>* unsupported) {
  auto steps = lowerToSteps(f, prefix, unsupported);
  if (!steps) return steps.takeError();
  for (LoweredStep& step : *steps)
    if (step.kind == LoweredStep::Kind::Kernel) backend.schedule(step.kernel);
  return steps;
}

Expected<std::string> printBackendSteps(const Module& m, const Backend& backend) {
  std::string out;
  for (const auto& f : m.functions()) {
    auto steps = lowerForBackend(*f, backend, "kiln_");
    if (!steps) return steps.takeError();
    out += "kernels of @" + f->name() + " for " + std::string(backend.name()) + ":\n" +
           printSteps(*steps, [&](const LibraryCall& call) { return backend.describeLibraryCall(call); });
  }
  return out;
}

}  // namespace kiln::codegen
