#include "train/batch_prefetcher.h"

#include <ATen/Parallel.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <utility>

#include "engine_kernels/parallel_threads.h"

namespace engine {
namespace {

// Example i is the single value i; index 5 fails, index 6 throws.
class Numbers : public Dataset {
 public:
  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split) const override { return 100; }
  StatusOr<Batch> GetBatch(Split, const std::vector<int64_t>& indices) const override {
    ++calls;
    for (int64_t i : indices) {
      if (i == 5) return DataLossError("example 5 is unreadable");
      if (i == 6) throw std::runtime_error("example 6 exploded");
    }
    return Batch{{"x", at::tensor(indices, at::kLong)}};
  }
  std::string description() const override { return "numbers"; }
  std::string identity() const override { return "numbers"; }
  mutable std::atomic<int> calls{0};

 private:
  DataSpec spec_;
};

TEST(BatchPrefetcherTest, CheapBatchesAreReadOnTheCallersThread) {
  class Cheap : public Numbers {
   public:
    bool cheap_batches() const override { return true; }
  } data;
  BatchPrefetcher prefetcher(data, Split::kTrain, {{1}, {2}}, "numbers", StepDevice::kCpu);
  EXPECT_FALSE(prefetcher.background());
  EXPECT_EQ(data.calls.load(), 0);
  EXPECT_EQ(prefetcher.Next()->at("x")[0].item<int64_t>(), 1);
  EXPECT_EQ(prefetcher.Next()->at("x")[0].item<int64_t>(), 2);
  EXPECT_FALSE(prefetcher.Next().ok());
}

// How many threads a parallel_for on the loader thread reaches, with LibTorch at 2 threads, and
// how many one on the step's thread reaches meanwhile.
std::pair<int, int> LoaderAndStepThreads(StepDevice step_device) {
  class Parallel : public Numbers {
   public:
    StatusOr<Batch> GetBatch(Split split, const std::vector<int64_t>& indices) const override {
      loader_threads = kernels::ParallelForThreads(64);
      return Numbers::GetBatch(split, indices);
    }
    mutable std::atomic<int> loader_threads{0};
  } data;
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  int step_threads = 0;
  {
    BatchPrefetcher prefetcher(data, Split::kTrain, {{1}, {2}}, "numbers", step_device);
    EXPECT_TRUE(prefetcher.background());
    EXPECT_TRUE(prefetcher.Next().ok());
    step_threads = kernels::ParallelForThreads(64);
    EXPECT_TRUE(prefetcher.Next().ok());
  }
  at::set_num_threads(before);
  return {data.loader_threads.load(), step_threads};
}

TEST(BatchPrefetcherTest, BesideACpuStepTheLoadersOperationsStayOnItsThread) {
  // A loader's ATen operations must not open a second team of intra-op threads beside the step's:
  // on two cores, that made a stage 1.6x slower.
  EXPECT_EQ(LoaderAndStepThreads(StepDevice::kCpu), std::make_pair(1, 2));
}

TEST(BatchPrefetcherTest, BesideAGpuStepTheLoaderUsesLibTorchsThreads) {
  EXPECT_EQ(LoaderAndStepThreads(StepDevice::kAccelerator), std::make_pair(2, 2));
}

TEST(BatchPrefetcherTest, BatchesComeInOrder) {
  Numbers data;
  std::vector<std::vector<int64_t>> batches = {{1, 2}, {3}, {9, 8, 7}, {4}};
  BatchPrefetcher prefetcher(data, Split::kTrain, batches, "numbers", StepDevice::kCpu);
  for (const auto& expected : batches) {
    auto batch = prefetcher.Next();
    ASSERT_TRUE(batch.ok());
    const at::Tensor& x = batch->at("x");
    ASSERT_EQ(x.numel(), static_cast<int64_t>(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(x[i].item<int64_t>(), expected[i]);
  }
  EXPECT_FALSE(prefetcher.Next().ok()) << "no batch left";
}

TEST(BatchPrefetcherTest, ErrorsAndExceptionsArriveWithTheirBatch) {
  Numbers data;
  BatchPrefetcher prefetcher(data, Split::kTrain, {{1}, {5}, {6}, {2}}, "stage 's' data loader 'n'",
                             StepDevice::kCpu);
  EXPECT_TRUE(prefetcher.Next().ok());
  auto failed = prefetcher.Next();
  EXPECT_EQ(failed.status().message(), "stage 's' data loader 'n': example 5 is unreadable");
  auto thrown = prefetcher.Next();
  EXPECT_EQ(thrown.status().message(), "stage 's' data loader 'n': example 6 exploded");
  EXPECT_TRUE(prefetcher.Next().ok());
}

TEST(BatchPrefetcherTest, StaysAFewBatchesAheadAndStopsCleanly) {
  Numbers data;
  std::vector<std::vector<int64_t>> batches(50, std::vector<int64_t>{1});
  {
    BatchPrefetcher prefetcher(data, Split::kTrain, batches, "numbers", StepDevice::kCpu,
                               /*depth=*/2);
    ASSERT_TRUE(prefetcher.Next().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_LE(data.calls.load(), 4) << "it does not read the whole epoch ahead";
  }  // destroyed with batches pending: must not hang
  SUCCEED();
}

}  // namespace
}  // namespace engine
