// Checkpoints (Checkpoint.h): the two metadata arrays are built from one
// list each, so that writing and checking cannot disagree on the order, and
// each checked option carries how to show its value in an error.
#include "training/Checkpoint.h"

#include <filesystem>
#include <map>

#include "runtime/Npz.h"
#include "training/Numerics.h"

namespace kiln::training {

namespace {

constexpr std::string_view kCheckpointMeta = "kiln.train_state";
constexpr std::string_view kCheckpointOptions = "kiln.train_options";

std::vector<int64_t> checkpointMeta(const CheckpointRun& run, int64_t step) {
  return {kCheckpointVersion, step,       static_cast<int64_t>(run.seed), run.batchSize, run.shuffle,
          run.dropLast,       run.samples};
}

/// One of the options stored as kiln.train_options (float64, in order).
struct CheckedOption {
  const char* name;
  double value;
  std::string (*show)(double);
};

std::string showNumber(double v) { return shortest(v); }
std::string showOptimizer(double v) {
  const int64_t k = static_cast<int64_t>(v);
  return k == static_cast<int64_t>(OptimizerKind::Sgd)     ? "sgd"
         : k == static_cast<int64_t>(OptimizerKind::Adam)  ? "adam"
         : k == static_cast<int64_t>(OptimizerKind::AdamW) ? "adamw"
                                                           : shortest(v);
}
std::string showSchedule(double v) {
  const int64_t k = static_cast<int64_t>(v);
  return k == static_cast<int64_t>(LrScheduleKind::Constant)       ? "constant"
         : k == static_cast<int64_t>(LrScheduleKind::Step)         ? "step"
         : k == static_cast<int64_t>(LrScheduleKind::CosineWarmup) ? "cosine"
                                                                   : shortest(v);
}
std::string showFlag(double v) { return v != 0 ? "on" : "off"; }

std::vector<CheckedOption> checkpointOptions(const CheckpointRun& run) {
  const OptimizerConfig& opt = run.optimizer;
  const LrScheduleConfig& sch = run.schedule;
  const bool cosine = sch.kind == LrScheduleKind::CosineWarmup;
  return {
      {"--optimizer", static_cast<double>(opt.kind), showOptimizer},
      {"--lr", run.lr, showNumber},
      {"--momentum", opt.momentum, showNumber},
      {"dampening", opt.dampening, showNumber},
      {"--nesterov", opt.nesterov ? 1.0 : 0.0, showFlag},
      {"--weight-decay", opt.weightDecay, showNumber},
      {"--betas (beta1)", opt.beta1, showNumber},
      {"--betas (beta2)", opt.beta2, showNumber},
      {"--eps", opt.eps, showNumber},
      {"--lr-schedule", static_cast<double>(sch.kind), showSchedule},
      {"--lr-step-size", static_cast<double>(sch.stepSize), showNumber},
      {"--lr-gamma", sch.gamma, showNumber},
      {"--warmup-steps", static_cast<double>(sch.warmupSteps), showNumber},
      {"--min-lr", sch.minLr, showNumber},
      // The cosine runs over the run's total steps; the others ignore them.
      {"the cosine schedule's total steps (--steps or --epochs)", cosine ? static_cast<double>(sch.totalSteps) : 0.0,
       showNumber},
  };
}

}  // namespace

Status writeCheckpoint(const std::string& path, const TrainState& state, const CheckpointRun& run, int64_t step) {
  std::vector<NpzArray> arrays;
  for (size_t i = 0; i < state.names.size(); ++i) arrays.push_back({state.names[i], state.values[i]});
  const std::vector<int64_t> meta = checkpointMeta(run, step);
  Tensor m(DType::I64, {static_cast<int64_t>(meta.size())});
  for (size_t i = 0; i < meta.size(); ++i) m.setInt(static_cast<int64_t>(i), meta[i]);
  arrays.push_back({std::string(kCheckpointMeta), m});
  const std::vector<CheckedOption> options = checkpointOptions(run);
  Tensor opts(DType::F64, {static_cast<int64_t>(options.size())});
  for (size_t i = 0; i < options.size(); ++i) opts.setDouble(static_cast<int64_t>(i), options[i].value);
  arrays.push_back({std::string(kCheckpointOptions), opts});
  return writeNpz(path, arrays);
}

Expected<int64_t> readCheckpoint(const std::string& path, const CheckpointRun& run, TrainState& state) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Error(path + ": no such checkpoint file");
  auto arrays = readNpz(path);
  if (!arrays) return Error(path + ": not a readable checkpoint: " + arrays.error().message());
  std::map<std::string, const Tensor*> byName;
  for (const NpzArray& a : *arrays) byName[a.name] = &a.tensor;
  auto metaIt = byName.find(std::string(kCheckpointMeta));
  if (metaIt == byName.end() || metaIt->second->dtype() != DType::I64 || metaIt->second->numElements() != 7)
    return Error(path + ": not a kiln train checkpoint (no " + std::string(kCheckpointMeta) + " array)");
  const Tensor& meta = *metaIt->second;
  if (meta.getInt(0) == 1)
    return Error(path +
                 ": checkpoint format 1, written before checkpoints stored the optimizer and learning-rate "
                 "options; this kiln resumes format " +
                 std::to_string(kCheckpointVersion) +
                 " only (resume it with the kiln that wrote it, or train again from the model)");
  if (meta.getInt(0) != kCheckpointVersion)
    return Error(path + ": checkpoint format " + std::to_string(meta.getInt(0)) + ", this kiln reads format " +
                 std::to_string(kCheckpointVersion));
  const std::vector<int64_t> mine = checkpointMeta(run, 0);
  const char* what[] = {
      "", "", "--seed", "--batch-size", "shuffling (--no-shuffle)", "--drop-last", "the number of training samples"};
  for (size_t i = 2; i < mine.size(); ++i)
    if (meta.getInt(static_cast<int64_t>(i)) != mine[i])
      return Error(path + ": the checkpoint was written with " + what[i] + " " +
                   std::to_string(meta.getInt(static_cast<int64_t>(i))) + ", this run has " + std::to_string(mine[i]) +
                   "; resuming needs the same data and batching to continue exactly");
  const std::vector<CheckedOption> options = checkpointOptions(run);
  auto optionsIt = byName.find(std::string(kCheckpointOptions));
  if (optionsIt == byName.end() || optionsIt->second->dtype() != DType::F64 ||
      optionsIt->second->numElements() != static_cast<int64_t>(options.size()))
    return Error(path + ": not a kiln train checkpoint of format " + std::to_string(kCheckpointVersion) + " (no " +
                 std::string(kCheckpointOptions) + " array of " + std::to_string(options.size()) + " values)");
  for (size_t i = 0; i < options.size(); ++i) {
    const double stored = optionsIt->second->getDouble(static_cast<int64_t>(i));
    if (stored != options[i].value)
      return Error(path + ": the checkpoint was written with " + options[i].name + " " + options[i].show(stored) +
                   ", this run has " + options[i].show(options[i].value) +
                   "; resuming needs the same optimizer and learning rate to continue exactly");
  }
  for (size_t i = 0; i < state.names.size(); ++i) {
    auto it = byName.find(state.names[i]);
    if (it == byName.end())
      return Error(path + ": the checkpoint has no '" + state.names[i] + "' (written for another model or optimizer?)");
    if (it->second->type() != state.values[i].type())
      return Error(path + ": '" + state.names[i] + "' is " + it->second->type().str() + " in the checkpoint, " +
                   state.values[i].type().str() + " in this run's training step");
    state.values[i] = *it->second;
  }
  if (byName.size() != state.names.size() + 2)
    return Error(path + ": the checkpoint holds " + std::to_string(byName.size() - 2) +
                 " arrays, this run's training step " + std::to_string(state.names.size()) +
                 " (written for another model or optimizer?)");
  return meta.getInt(1);
}

}  // namespace kiln::training
