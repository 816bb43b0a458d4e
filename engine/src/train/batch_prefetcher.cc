#include "train/batch_prefetcher.h"

#include "core/guarded_call.h"
#include "core/logging.h"
#include "engine_kernels/parallel_threads.h"

namespace engine {

BatchPrefetcher::BatchPrefetcher(const Dataset& dataset, Split split,
                                 std::vector<std::vector<int64_t>> batches, std::string context,
                                 StepDevice step_device, size_t depth)
    : dataset_(dataset),
      split_(split),
      batches_(std::move(batches)),
      context_(std::move(context)),
      depth_(std::max<size_t>(1, depth)) {
  // A plugin's accessor, so behind the guard; one that fails gets the background thread, which
  // is right for any dataset.
  StatusOr<bool> cheap =
      GuardedCall(context_, [&]() -> StatusOr<bool> { return dataset_.cheap_batches(); });
  if (!cheap.ok()) LOG(WARNING) << cheap.status().message();
  if (!cheap.ok() || !*cheap) thread_ = std::thread([this, step_device] { Run(step_device); });
}

BatchPrefetcher::~BatchPrefetcher() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BatchPrefetcher::Run(StepDevice step_device) {
  for (const std::vector<int64_t>& indices : batches_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [this] { return stop_ || ready_.size() < depth_; });
      if (stop_) return;
    }
    // Before every batch: a library's first parallel_for on this thread sets it back to
    // LibTorch's thread count (parallel_threads.h says why).
    if (step_device == StepDevice::kCpu) kernels::KeepIntraOpWorkOnThisThread();
    StatusOr<Batch> batch =
        GuardedCall(context_, [&] { return dataset_.GetBatch(split_, indices); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(batch));
    }
    changed_.notify_all();
  }
}

StatusOr<Batch> BatchPrefetcher::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (taken_ >= batches_.size()) {
    return InternalError(context_ + ": asked for batch " + std::to_string(taken_ + 1) + " of " +
                         std::to_string(batches_.size()));
  }
  if (!thread_.joinable()) {
    const std::vector<int64_t>& indices = batches_[taken_++];
    return GuardedCall(context_, [&] { return dataset_.GetBatch(split_, indices); });
  }
  changed_.wait(lock, [this] { return !ready_.empty(); });
  StatusOr<Batch> batch = std::move(ready_.front());
  ready_.pop_front();
  ++taken_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace engine
