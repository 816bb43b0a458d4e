// Loads micro-batches on a background thread, a few ahead of the training loop, so reading and
// assembling the next batch overlaps the current step. For datasets whose batches are cheap
// (Dataset::cheap_batches) it reads them on the caller's thread instead.
//
//   BatchPrefetcher prefetcher(dataset, Split::kTrain, micro_batches, "stage 'x' data loader 'y'",
//                              StepDevice::kCpu);
//   while (...) { ENGINE_ASSIGN_OR_RETURN(Batch batch, prefetcher.Next()); ... }
//
// Batches come out in the order given. A loader error (or exception) is returned by the Next() call
// that would have produced that batch. The thread runs only the data loader's GetBatch (no model
// code), which the Dataset contract makes safe to call concurrently. Beside a step on the CPU, the
// ATen operations a loader runs there stay on that thread (kernels::KeepIntraOpWorkOnThisThread):
// the step's intra-op threads have the cores. Beside a step on a GPU they use LibTorch's threads,
// as the cores are otherwise idle.
//
// Thread safety: Next() from one thread. Destroying the prefetcher stops and joins its thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/data.h"

namespace engine {

// Where the training step computes.
enum class StepDevice { kCpu, kAccelerator };

class BatchPrefetcher {
 public:
  BatchPrefetcher(const Dataset& dataset, Split split, std::vector<std::vector<int64_t>> batches,
                  std::string context, StepDevice step_device, size_t depth = 2);
  // Whether batches are read on a background thread.
  bool background() const { return thread_.joinable(); }
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The next batch, waiting for it if needed. An error when there is none left.
  StatusOr<Batch> Next();

 private:
  void Run(StepDevice step_device);

  const Dataset& dataset_;
  const Split split_;
  const std::vector<std::vector<int64_t>> batches_;
  const std::string context_;
  const size_t depth_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<StatusOr<Batch>> ready_;
  size_t taken_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace engine
