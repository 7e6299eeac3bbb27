// lowerToSteps and printSteps (LowerToKernels.h).
#include "codegen/LowerToKernels.h"

#include <algorithm>
#include <sstream>

#include "codegen/cpu/CpuTarget.h"
#include "codegen/Lowering.h"
#include "ir/Printer.h"

namespace kiln::codegen {

Expected<std::vector<LoweredStep>> lowerToSteps(const Function& f, std::string_view prefix,
                                                std::vector<std::string>* unsupportedOut) {
  std::vector<LoweredStep> steps;
  std::vector<std::string> unsupported;
  size_t computing = 0;  // steps that are not checks
  for (const auto& op : f.ops()) {
    if (op->kind() == OpKind::Constant || op->kind() == OpKind::Return) continue;
    LoweredStep step;
    step.op = op.get();
    if (op->kind() == OpKind::Check) {
      auto check = hostCheckOf(*op);
      if (!check) return check.takeError();
      step.kind = LoweredStep::Kind::Check;
      step.check = std::move(*check);
      steps.push_back(std::move(step));
      continue;
    }
    if (op->info().isControlFlow()) {
      // The CPU executor runs these between compiled stages, each body a
      // program of its own (Stages.h), and never lowers them; a target
      // that gets one here cannot run it.
      unsupported.push_back("'" + std::string(op->name()) +
                            "' (control flow; its bodies are not lowered to kernels on this target)" +
                            (op->loc().isPrinted() ? " at " + op->loc().str() : ""));
      ++computing;
      continue;
    }
    if (op->info().hasDataDependentShape()) {
      // The CPU executor runs these between compiled stages (Stages.h) and
      // never lowers them; a target that gets one here cannot run it.
      unsupported.push_back("'" + std::string(op->name()) +
                            "' (its result size depends on values; not lowered to kernels on this target)" +
                            (op->loc().isPrinted() ? " at " + op->loc().str() : ""));
      ++computing;
      continue;
    }
    if (op->numResults() != 1) return op->emitError("has several results; split-fused-results makes one per kernel");
    if (opInfo(op->kind()).opClass == OpClass::Collective) {
      auto call = collectiveOf(*op);
      if (!call) return call.takeError();
      step.kind = LoweredStep::Kind::Collective;
      step.collective = std::move(*call);
      steps.push_back(std::move(step));
      ++computing;
      continue;
    }
    if (op->kind() == OpKind::Fused && op->getString("kind") == "library") {
      auto call = describeLibraryCall(*op);
      if (!call) return call.takeError();
      step.kind = LoweredStep::Kind::Library;
      step.call = std::move(*call);
      steps.push_back(std::move(step));
      ++computing;
      continue;
    }
    if (std::string why = whyNotLowerable(*op); !why.empty()) {
      // Every unlowerable op is collected, so the error lists them all.
      unsupported.push_back(why + (op->loc().isPrinted() ? " at " + op->loc().str() : ""));
      ++computing;
      continue;
    }
    // Numbered among the kernels and library calls, as before checks existed,
    // so that kernel names (and cache keys) do not depend on them.
    auto kernel = lowerOpToKernel(*op, std::string(prefix) + std::string(op->name()) + "_" + std::to_string(computing));
    if (!kernel) return kernel.takeError();
    step.kernel = std::move(*kernel);
    steps.push_back(std::move(step));
    ++computing;
  }
  if (!unsupported.empty()) {
    std::sort(unsupported.begin(), unsupported.end());
    unsupported.erase(std::unique(unsupported.begin(), unsupported.end()), unsupported.end());
    std::string list;
    for (const std::string& u : unsupported) list += (list.empty() ? "" : "; ") + u;
    if (unsupportedOut) *unsupportedOut = unsupported;
    return Error("cannot lower '" + f.name() + "' to kernels: " + list);
  }
  return steps;
}

namespace {

std::string describeCheck(const HostCheck& check) {
  switch (check.condition) {
    case HostCheck::Condition::InRange:
      return "indices of '" + check.of + "' in [-" + std::to_string(check.size) + ", " + std::to_string(check.size) +
             ") along dim " + std::to_string(check.axis);
    case HostCheck::Condition::NonZero: return "divisors of '" + check.of + "' nonzero";
    case HostCheck::Condition::NonNegative: return "exponents of '" + check.of + "' nonnegative";
  }
  return {};
}

}  // namespace

std::string printSteps(const std::vector<LoweredStep>& steps,
                       const std::function<std::string(const LibraryCall&)>& describeCall) {
  std::string text;
  for (const LoweredStep& step : steps) {
    text += text.empty() ? "" : "\n";
    if (step.kind == LoweredStep::Kind::Check)
      text += "check %" + step.op->operand(0)->name() + ": " + describeCheck(step.check) + "\n";
    else if (step.kind == LoweredStep::Kind::Library)
      text += "library %" + step.op->result()->name() + ": " + describeCall(step.call) + "\n";
    else if (step.kind == LoweredStep::Kind::Collective)
      text += "collective %" + step.op->result()->name() + ": " + describeCollective(step.collective) + " of " +
              step.op->operand(0)->type().str() + "\n";
    else
      text += kir::printKernel(step.kernel);
  }
  return text;
}

}  // namespace kiln::codegen
