// The pass manager: builds pipelines from pass names (`a,b,c`) or -O
// levels, runs them with optional verification, printing and timing.
#pragma once

#include <chrono>
#include <iosfwd>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "passes/Pass.h"

namespace kiln {

/// One registered pass: flag, summary and factory.
struct PassInfo {
  std::string_view name;
  std::string_view summary;
  std::unique_ptr<Pass> (*create)();
};

/// Every registered pass, in declaration order.
std::span<const PassInfo> registeredPasses();
const PassInfo* lookupPass(std::string_view name);

struct PassManagerOptions {
  bool verifyEach = false;
  bool printAfterAll = false;
  std::set<std::string> printAfter;  // pass names
  bool timePasses = false;
};

class PassManager {
 public:
  explicit PassManager(PassManagerOptions options = {}, PassContext ctx = {})
      : options_(std::move(options)), ctx_(ctx) {}

  /// Appends the passes of a comma-separated pipeline string. An unknown
  /// name is an error listing the valid ones.
  Status addPipeline(std::string_view pipeline);
  /// Appends the standard pipeline of -O`level` (0..3); the target pipeline
  /// when the context has a target.
  Status addOptLevel(int level);
  void addPass(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }
  std::vector<std::string_view> passNames() const;

  /// Runs every pass in order; prints to `log` (IR after passes, timings).
  Status run(Module& m, std::ostream& log);

 private:
  PassManagerOptions options_;
  PassContext ctx_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

/// The pipeline string for -O`level`: the graph passes alone, or, with
/// `forTarget`, everything a target needs from the imported graph to its
/// final kernel list (library selection, fusion, splitting, scheduling and
/// host checks); the target itself is the PassContext's.
std::string_view optLevelPipeline(int level, bool forTarget = false);

}  // namespace kiln
