// DDP's GradientSync (dist/gradient_sync.h): averages a stage's gradients over the ranks of a
// DataParallel group in buckets, starting each bucket's all-reduce while the backward that
// completes the step's gradients is still running (what PyTorch's DDP Reducer does), so
// communication overlaps with the rest of the backward.
//
// Buckets hold about `bucket_bytes` of f32 each, filled in reverse parameter order (roughly the
// order in which backward produces gradients) and always started in bucket order, so every rank
// starts the same all-reduces in the same order whatever order its hooks fire in. A gradient is
// reduced in f32 whatever its dtype and written back in its own dtype. A parameter that gets no
// gradient in a step counts as zeros, as in DDP with find_unused_parameters.
//
// Ownership: borrows `group` and the parameters' tensors; the hooks it puts on the parameters are
// removed by the destructor. Thread safety: the hooks may run on autograd's threads; the other
// methods belong to the training thread. A failed all-reduce (a rank died) is Finish()'s error.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/named_parameter.h"
#include "dist/data_parallel.h"
#include "dist/gradient_sync.h"
#include "engine/status.h"

namespace engine {

class GradientAverager : public GradientSync {
 public:
  GradientAverager(DataParallel* group, std::vector<NamedParameter> parameters,
                   int64_t bucket_bytes);
  ~GradientAverager() override;
  GradientAverager(const GradientAverager&) = delete;
  GradientAverager& operator=(const GradientAverager&) = delete;

  void ArmForLastBackward() override;
  // Replaces every gradient by its mean over the ranks.
  Status Finish() override;

  int bucket_count() const override { return static_cast<int>(buckets_.size()); }
  int buckets_started_during_backward() const override { return started_during_backward_; }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into parameters_
    at::Tensor flat;              // f32, every member's gradient end to end
    int64_t waiting = 0;          // members whose gradient has not arrived this step
    std::unique_ptr<DataParallel::PendingSum> pending;
  };

  // Forgets the last step. Holds mutex_.
  void ResetStep();
  void OnGradient(size_t index, const at::Tensor& incoming);
  // Starts buckets next_bucket_, next_bucket_ + 1, ... while they are complete (all of them when
  // `all`). Holds mutex_.
  void StartReadyBuckets(bool all);
  at::Tensor Slice(size_t index);

  DataParallel* group_;
  std::vector<NamedParameter> parameters_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket
  std::vector<int64_t> offset_;    // parameter index -> offset in its bucket
  std::vector<bool> arrived_;
  std::vector<Bucket> buckets_;
  std::vector<unsigned> hooks_;
  std::mutex mutex_;
  bool armed_ = false;
  size_t next_bucket_ = 0;
  int started_during_backward_ = 0;
};

}  // namespace engine
