// The `data-parallel` pass: turns a function that computes gradients (the
// `autodiff` pass's results named "grad.<param>") into the gradient step of
// one rank of a data-parallel job, as PyTorch's DistributedDataParallel
// does: the gradients are all-reduced over the ranks (mean: each rank then
// holds the gradient of the whole job's batch), in buckets.
//
//  - Buckets take the gradients in the order the backward pass produces
//    them, up to `bucketCapBytes` each (a larger gradient is a bucket of its
//    own), one dtype per bucket.
//  - A bucket's gradients are flattened and concatenated into one vector
//    (DDP's bucket buffer), all-reduced by one `all_reduce {bucket = k}`
//    (named %bucket<k>), and sliced back into their shapes at the end of
//    the function, where the optimizer update will read them.
//  - Each bucket's ops go right after the op that produces its last
//    gradient, so its communication starts as soon as its gradients exist;
//    the CPU runner waits for an all-reduce only when a later step reads its
//    result (runtime/Collectives.h), so the reduction overlaps the rest of
//    the backward pass.
//
// Buckets are numbered in the order they are issued. The training-step
// transform (TrainingStep.h) runs this between the backward pass and the
// optimizer update when it builds a data-parallel step.
#pragma once

#include <string>
#include <vector>

#include "ir/IR.h"

namespace kiln {

struct DataParallelOptions {
  int64_t bucketCapBytes = int64_t{25} * 1024 * 1024;
  /// "mean": the job's mean of the ranks' gradients; "sum".
  std::string reduction = "mean";
};

/// One bucket: its gradients (by parameter name) and their bytes.
struct GradientBucket {
  std::vector<std::string> gradients;
  int64_t bytes = 0;
};

/// Inserts the bucketed all-reduces of `f`'s gradient results; returns the
/// buckets in the order they are issued.
Expected<std::vector<GradientBucket>> insertGradientAllReduces(Function& f, const DataParallelOptions& options);

}  // namespace kiln
