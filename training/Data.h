// The training data: reading the x and y arrays of a .npz file and checking
// them against the model before anything trains, with one error per problem
// naming the file, what is wrong and what was expected; and batching: each
// epoch's sample order (a shuffle seeded by (seed, epoch) alone, so that a
// resumed run can recompute any epoch's order without the ones before it),
// the gather of a batch's rows, and the prefetcher that gathers the next
// step's batch on a background thread while the current step runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "passes/TrainingStep.h"
#include "runtime/Tensor.h"

namespace kiln::training {

/// Receives a notice for the user (an array converted to the model's dtype,
/// the JIT falling back to the interpreter, a new thread count).
using NoticeFn = std::function<void(const std::string&)>;

/// What the data must fit.
struct DataSpec {
  std::string modelPath;     // named in errors about the model
  std::string xKey, yKey;    // the arrays' names in the .npz
  TensorType input, output;  // the fed input's and the loss output's types
  std::string inputName;     // the fed input, as the model names it
  std::string outputName;    // "'logits'" or "output 0"
  LossKind loss = LossKind::CrossEntropy;
  bool classesLast = false;    // class losses: classes are the output's last dim
  int64_t ignoreIndex = -100;  // class losses: a label that is not a class and is skipped
};

/// One .npz file's samples, converted to the types the step takes.
struct Dataset {
  std::string file;
  Tensor x, y;  // converted to what the step takes
  int64_t size = 0;
};

/// Reads `file` and checks it against `spec`: the arrays exist, have one row
/// per sample, x's per-sample shape and dtype fit the input (float64 or
/// float16 converted with a note), labels are integer classes in range for
/// class losses (widened to int64) or finite targets shaped like the output
/// for MSE, and every input is finite. A conversion that is not silent
/// (float64 inputs to float32) is reported through `notice`.
Expected<Dataset> loadDataset(const std::string& file, const DataSpec& spec, const NoticeFn& notice = {});

/// The checks and conversions of loadDataset on arrays already in memory
/// (the Python package's kiln.Trainer); errors name them as `source`'s
/// arrays spec.xKey and spec.yKey.
Expected<Dataset> checkDataset(const std::string& source, const Tensor& x, const Tensor& y, const DataSpec& spec,
                               const NoticeFn& notice = {});

/// Rows `rows` of `t` (a dataset array) as one batch tensor.
Tensor gatherRows(const Tensor& t, const std::vector<int64_t>& rows);

/// The sample order of epoch `epoch`: 0..n-1, or with `shuffle` a
/// Fisher-Yates shuffle driven by mt19937_64 seeded with (seed, epoch).
std::vector<int64_t> epochOrder(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

/// Which samples each step takes.
///
/// In a data-parallel job of `world` ranks each rank takes its shard of
/// every epoch, as PyTorch's DistributedSampler (drop_last=False) gives it:
/// the epoch's order (the same on every rank) padded with its first samples
/// to a multiple of the world size, then every world-th sample from `rank`
/// on. Each rank then batches its shard by `batchSize`.
struct BatchPlan {
  int64_t samples = 0, batchSize = 1, stepsPerEpoch = 1;
  bool shuffle = false, dropLast = false;
  uint64_t seed = 0;
  int64_t rank = 0, world = 1;

  /// The plan of `samples` in batches of `batchSize` (>= 1): every sample
  /// once an epoch, the last batch smaller unless `dropLast` drops it; for
  /// `rank` of `world`, its shard's.
  static BatchPlan of(int64_t samples, int64_t batchSize, bool shuffle, bool dropLast, uint64_t seed,
                      int64_t rank = 0, int64_t world = 1) {
    const int64_t shard = (samples + world - 1) / world;
    const int64_t steps = dropLast ? shard / batchSize : (shard + batchSize - 1) / batchSize;
    return BatchPlan{samples, batchSize, steps, shuffle, dropLast, seed, rank, world};
  }

  /// The samples of each rank's shard of an epoch.
  int64_t shardSize() const { return (samples + world - 1) / world; }
  int64_t epochOf(int64_t step) const { return step / stepsPerEpoch; }
  int64_t sizeOf(int64_t step) const {
    const int64_t start = (step % stepsPerEpoch) * batchSize;
    return std::min(batchSize, shardSize() - start);
  }
};

/// The inputs and labels of one step.
struct Batch {
  int64_t step = 0;
  Tensor x, y;
};

/// Gathers batches in step order, keeping the current epoch's order.
class BatchGatherer {
 public:
  BatchGatherer(const Dataset& data, const BatchPlan& plan) : data_(data), plan_(plan) {}
  Batch gather(int64_t step) {
    const int64_t epoch = plan_.epochOf(step);
    if (epoch != orderEpoch_) {
      order_ = epochOrder(plan_.samples, plan_.shuffle, plan_.seed, epoch);
      if (plan_.world > 1) {
        // This rank's shard of the padded order.
        std::vector<int64_t> shard;
        for (int64_t j = plan_.rank; j < plan_.shardSize() * plan_.world; j += plan_.world)
          shard.push_back(order_[static_cast<size_t>(j % plan_.samples)]);
        order_ = std::move(shard);
      }
      orderEpoch_ = epoch;
    }
    const int64_t start = (step % plan_.stepsPerEpoch) * plan_.batchSize;
    std::vector<int64_t> rows(order_.begin() + start, order_.begin() + start + plan_.sizeOf(step));
    return Batch{step, gatherRows(data_.x, rows), gatherRows(data_.y, rows)};
  }

 private:
  const Dataset& data_;
  BatchPlan plan_;
  std::vector<int64_t> order_;
  int64_t orderEpoch_ = -1;
};

/// Gathers the batches of steps [first, end) in order, each one on a
/// background thread while the caller runs the step before it (double
/// buffering), or in line when `overlap` is false: the same batches either
/// way. The gather of a step starts only after the previous batch was
/// taken, so the gatherer's state is touched by one thread at a time.
class BatchPrefetcher {
 public:
  BatchPrefetcher(const Dataset& data, const BatchPlan& plan, bool overlap, int64_t first, int64_t end);
  /// Waits for a gather in flight.
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  /// The next step's batch; starts gathering the one after it.
  Batch next();

 private:
  void launch(int64_t step);

  BatchGatherer gatherer_;
  bool overlap_;
  int64_t end_;
  std::future<Batch> pending_;
};

/// `dims` from index `from` on as "[3,28,28]".
std::string shapeString(const std::vector<int64_t>& dims, size_t from = 0);

}  // namespace kiln::training
