// What a data-parallel stage does with its gradients at the end of each step's backward, so that
// every rank updates from the mean over all ranks: DDP's all-reduce of every gradient
// (dist/gradient_averager.h), or a sharded stage's reduce-scatter of each gradient into the rank
// that owns its part (dist/gradient_reduce_scatter.h). Both start their buckets while the backward
// still runs.
//
// Use per optimizer step:
//   ArmForLastBackward(); <the step's last backward>; Finish();
// Backwards before ArmForLastBackward() (earlier micro-batches) just accumulate, unreduced.
//
// Thread safety: hooks may run on autograd's threads; these methods belong to the training thread.
// A failed collective (a rank died) is Finish()'s error.
#pragma once

#include "engine/status.h"

namespace engine {

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // The next backward produces the step's final gradients: from then on, a bucket whose
  // gradients are all computed is sent at once.
  virtual void ArmForLastBackward() = 0;
  // Sends the buckets the backward did not complete, waits for all of them and leaves the mean
  // gradients where the implementation says. Disarms.
  virtual Status Finish() = 0;

  virtual int bucket_count() const = 0;
  // Buckets of the last step started from inside the backward, before Finish().
  virtual int buckets_started_during_backward() const = 0;
};

}  // namespace engine
