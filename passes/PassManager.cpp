// The pass registry (from Passes.def), pipeline parsing, the -O pipelines and
// the instrumented pass runner (verification, IR printing, timing).
#include "passes/PassManager.h"

#include <cstdio>
#include <ostream>

#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace kiln {

namespace {

const PassInfo kPasses[] = {
#define KILN_PASS(Create, Flag, Summary) {Flag, Summary, &Create},
#include "passes/Passes.def"
};

std::string validPassNames() {
  std::string names;
  for (const PassInfo& p : kPasses) names += (names.empty() ? "" : ", ") + std::string(p.name);
  return names;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::span<const PassInfo> registeredPasses() { return kPasses; }

const PassInfo* lookupPass(std::string_view name) {
  for (const PassInfo& p : kPasses)
    if (p.name == name) return &p;
  return nullptr;
}

// The standard pipelines. Why each pass sits where it does:
//  - infer-shapes first, so every later pass sees the most precise types
//    (canonicalize's identities compare types; folding needs static shapes).
//  - canonicalize before decompose removes work that would otherwise be
//    expanded (e.g. softmax of a constant folds whole).
//  - decompose at -O2 exposes the primitives inside composites to folding,
//    CSE and (later) fusion; -O1 keeps composites for readable output.
//  - canonicalize again after decompose folds the constants decompositions
//    introduce (scales, epsilons) and removes their identities.
//  - cse then dce: CSE leaves the duplicates dead for DCE to remove.
//  - fuse last at -O3: it groups the primitives that are left into kernels,
//    and no graph pass after it has to look inside regions. -O2 stops
//    before it for now because the CPU JIT (codegen/cpu/CpuExecutable.cpp)
//    compiles the -O2 pipeline op by op and has no lowering for `fused` yet;
//    -O2 gains `fuse` when it does.
//
// A target's pipeline (`--target cpu|cuda`) continues to its kernel list:
//  - fold-qdq right after infer-shapes, before canonicalize would fold the
//    dequantized weights into float constants: the int8 contractions of a
//    QDQ model, where the target's library takes them.
//  - raise-activations turns exported GELU and SiLU subgraphs back into
//    `gelu` and `silu`, after canonicalize has folded their constants.
//  - select-library after it and before decompose: a
//    library call is chosen while matmuls, convolutions and the activations
//    after them are whole ops (bias adds already folded into plain adds),
//    so nothing is recognized from primitives and nothing is un-fused later.
//  - fuse then groups the rest, leaving library groups alone.
//  - split-fused-results: a kernel computes one result.
//  - schedule orders kernels for the in-place update of donated arguments;
//    after the split, which creates the kernels it orders.
//  - insert-host-checks last, in front of the final kernels.
std::string_view optLevelPipeline(int level, bool forTarget) {
  if (forTarget) {
    switch (level) {
      case 0: return "schedule,insert-host-checks";
      case 1: return "infer-shapes,canonicalize,cse,dce,schedule,insert-host-checks";
      case 2:
        return "infer-shapes,fold-qdq,canonicalize,raise-activations,expand-conv-weight-grad,assign-layouts,"
               "canonicalize,select-library,decompose,canonicalize,cse,dce,schedule,insert-host-checks";
      default:
        return "infer-shapes,fold-qdq,canonicalize,raise-activations,expand-conv-weight-grad,assign-layouts,"
               "canonicalize,select-library,decompose,canonicalize,cse,dce,select-library,fuse,split-fused-results,"
               "schedule,insert-host-checks";
    }
  }
  switch (level) {
    case 0: return "";
    case 1: return "infer-shapes,canonicalize,cse,dce";
    case 2: return "infer-shapes,canonicalize,decompose,canonicalize,cse,dce";
    default: return "infer-shapes,canonicalize,decompose,canonicalize,cse,dce,fuse";
  }
}

Status PassManager::addPipeline(std::string_view pipeline) {
  pipeline = trim(pipeline);
  if (pipeline.empty()) return Status::success();
  while (true) {
    size_t comma = pipeline.find(',');
    std::string_view name = trim(pipeline.substr(0, comma));
    const PassInfo* info = lookupPass(name);
    if (!info)
      return Error("unknown pass '" + std::string(name) + "' in pipeline; valid passes: " + validPassNames());
    passes_.push_back(info->create());
    if (comma == std::string_view::npos) break;
    pipeline.remove_prefix(comma + 1);
  }
  return Status::success();
}

Status PassManager::addOptLevel(int level) {
  if (level < 0 || level > 3)
    return Error("unknown optimization level -O" + std::to_string(level) + "; expected -O0 to -O3");
  return addPipeline(optLevelPipeline(level, ctx_.target != nullptr));
}

std::vector<std::string_view> PassManager::passNames() const {
  std::vector<std::string_view> names;
  for (const auto& p : passes_) names.push_back(p->name());
  return names;
}

Status PassManager::run(Module& m, std::ostream& log) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<std::string_view, double>> times;
  Clock::time_point start = Clock::now();
  for (const auto& pass : passes_) {
    Clock::time_point passStart = Clock::now();
    Expected<bool> changed = pass->run(m, ctx_);
    times.emplace_back(pass->name(), std::chrono::duration<double>(Clock::now() - passStart).count());
    if (!changed) {
      Error e = changed.takeError();
      return Error(e.message() + " (in pass '" + std::string(pass->name()) + "')", e.location());
    }
    if (options_.verifyEach) {
      if (Status s = verify(m); !s) {
        Error e = s.takeError();
        return Error("verification failed after pass '" + std::string(pass->name()) + "': " + e.message(),
                     e.location());
      }
    }
    if (options_.printAfterAll || options_.printAfter.count(std::string(pass->name()))) {
      log << "// -----// IR Dump After " << pass->name() << " //----- //\n";
      print(m, log);
      log << "\n";
    }
  }
  if (options_.timePasses) {
    double total = std::chrono::duration<double>(Clock::now() - start).count();
    char line[160];
    log << "===-------------------------------------------------------------------------===\n"
        << "                      ... Pass execution timing report ...\n"
        << "===-------------------------------------------------------------------------===\n";
    std::snprintf(line, sizeof line, "  Total Execution Time: %.4f seconds\n\n", total);
    log << line << "  ----Wall Time----  ----Name----\n";
    for (const auto& [name, secs] : times) {
      std::snprintf(line, sizeof line, "  %8.4f (%5.1f%%)  %.*s\n", secs, total > 0 ? 100 * secs / total : 0.0,
                    static_cast<int>(name.size()), name.data());
      log << line;
    }
    std::snprintf(line, sizeof line, "  %8.4f (100.0%%)  Total\n", total);
    log << line;
  }
  return Status::success();
}

}  // namespace kiln
