// A sharded stage's GradientSync at shard_level 2 (ZeRO stage 2): each gradient is reduce-scattered
// into the rank that owns its part (dist/shard_layout.h), while the backward still runs, and no
// rank keeps a whole gradient once it has been sent.
//
// As each parameter's gradient is accumulated in the step's last backward, it is copied in f32
// into its buckets and the parameter's .grad() is released; a complete bucket is reduce-scattered
// at once, buckets always started last to first (roughly the order backward produces them, and
// the same order on every rank). A bucket's f32 buffer returns to a pool when its reduce-scatter
// is done, and at most kBucketsInFlight are on the wire, so the gradients held during the backward
// are the parameters' not yet sent, a few buckets, and the parts. Finish() leaves, as the .grad()
// of each part's view, the part's mean over the ranks in its parameter's dtype (reduced in f32
// and rounded once, as DDP's averager does, so the parts hold exactly DDP's elements); every
// parameter's own .grad() is then undefined. A parameter with no gradient in a step counts as
// zeros; earlier micro-batches accumulate whole, unsent.
//
// Ownership: borrows `group` and the parameters; shares the layout. The post-accumulate hooks it
// sets on the parameters are removed by the destructor. Thread safety: see GradientSync.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/named_parameter.h"
#include "dist/data_parallel.h"
#include "dist/gradient_sync.h"
#include "dist/shard_layout.h"
#include "engine/status.h"

namespace engine {

class GradientReduceScatter : public GradientSync {
 public:
  // Reduce-scatters started and not yet waited for, at most.
  static constexpr int kBucketsInFlight = 4;

  GradientReduceScatter(DataParallel* group, std::vector<NamedParameter> parameters,
                        std::shared_ptr<const ShardLayout> layout);
  ~GradientReduceScatter() override;
  GradientReduceScatter(const GradientReduceScatter&) = delete;
  GradientReduceScatter& operator=(const GradientReduceScatter&) = delete;

  void ArmForLastBackward() override;
  // Leaves each part's mean gradient on its view and no parameter with a .grad().
  Status Finish() override;

  int bucket_count() const override { return static_cast<int>(buckets_.size()); }
  int buckets_started_during_backward() const override { return started_during_backward_; }

  // Called by the hooks, after autograd accumulated parameter `index`'s gradient.
  void OnGradientAccumulated(size_t index);

 private:
  struct Bucket {
    int64_t waiting = 0;  // pieces whose gradient has not arrived this step
    at::Tensor buffer;    // from the pool while the bucket is filled and sent
    at::Tensor flat;      // f32, the bucket padded: the start of `buffer`
    at::Tensor out;       // f32, this rank's slice of the sum; kept
    std::unique_ptr<DataParallel::PendingSum> pending;
  };
  // Where each piece of a parameter lies: bucket and piece index in it.
  struct PieceAt {
    size_t bucket = 0;
    size_t piece = 0;
  };

  void ResetStep();
  // Copies (or adds) `gradient` (parameter `index`'s, whole, or undefined: zeros) into its
  // buckets' pieces. Holds mutex_.
  void CopyIntoBuckets(size_t index, const at::Tensor& gradient, bool add);
  // Bucket b's buffer, taken from the pool (its padding zeroed) on first use in a step.
  at::Tensor FlatOf(size_t b);
  // Whether one of parameter `index`'s buckets was started this step.
  bool Sent(size_t index) const;
  // Starts buckets in order while they are complete (all of them when `all`). Holds mutex_.
  void StartReadyBuckets(bool all);
  // Waits for the oldest reduce-scatter on the wire and returns its buffer to the pool. Holds
  // mutex_.
  void WaitOldest();

  DataParallel* group_;
  std::vector<NamedParameter> parameters_;
  std::shared_ptr<const ShardLayout> layout_;
  std::vector<std::vector<PieceAt>> pieces_of_;  // per parameter
  std::vector<bool> arrived_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> pool_;  // free f32 buffers of the largest bucket's size
  std::deque<size_t> in_flight_;  // buckets started and not waited for, oldest first
  Status wire_status_;            // the first failed wait during the backward
  std::string late_parameter_;    // one whose gradient came again after it was sent
  std::mutex mutex_;
  bool armed_ = false;
  size_t started_ = 0;  // buckets started this step; the next one is buckets_.size() - 1 - started_
  int started_during_backward_ = 0;
};

}  // namespace engine
