// Shard level 2's gradient reduce-scatter on real Gloo groups of 2 and 3 ranks (threads): every
// rank ends with the mean over the ranks of the elements it owns, as the .grad() of its parts'
// views, and with no whole gradient on any parameter; buckets are sent from inside the backward;
// earlier micro-batches and parameters without a gradient count as DDP counts them. Both ways a
// group may reduce-scatter are tried: c10d's reduce-scatter (NCCL's way) and an all-reduce of
// which each rank keeps its slice (Gloo's).
#define USE_C10D_GLOO 1
#include "dist/gradient_reduce_scatter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "testing/gloo_ranks.h"

namespace engine {
namespace {

// 41 elements in 6 tensors; 40-byte buckets cut them into 10, 10, 10, 10 and 1 elements (with 3
// ranks 9, 9, 9, 9 and 5: a full bucket is a multiple of the world size), so tensors span buckets
// and ranks, and the last bucket's slices are padded.
const std::vector<std::vector<int64_t>> kShapes = {{5, 3}, {2}, {3}, {7}, {2, 2, 2}, {11}};
constexpr int64_t kBucketBytes = 40;
// Parameter 3 takes no part in the loss: its gradient counts as zeros.
constexpr size_t kUnused = 3;

std::vector<at::Tensor> Random(uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> out;
  for (const auto& shape : kShapes) out.push_back(at::randn(shape, generator));
  return out;
}

// Rank r's loss for micro-batch m is sum_i <p_i * p_i, w_i(r, m)>, so its gradient is
// 2 * p_i * w_i(r, m).
at::Tensor Loss(const std::vector<NamedParameter>& parameters, int rank, int micro_batch) {
  const std::vector<at::Tensor> w = Random(1000 + 10 * rank + micro_batch);
  at::Tensor loss = at::zeros({});
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (i == kUnused) continue;
    loss = loss + (parameters[i].tensor * parameters[i].tensor * w[i]).sum();
  }
  return loss;
}

// The mean over `world` ranks of their summed micro-batches' gradients, reduced as the engine
// reduces them: each rank's sum in f32, summed over ranks, times 1 / world.
std::vector<at::Tensor> ExpectedMean(const std::vector<at::Tensor>& values, int world,
                                     int micro_batches) {
  std::vector<at::Tensor> mean;
  for (size_t i = 0; i < values.size(); ++i) {
    at::Tensor total = at::zeros_like(values[i]);
    for (int r = 0; r < world; ++r) {
      at::Tensor rank_sum;
      for (int m = 0; m < micro_batches; ++m) {
        const at::Tensor g =
            i == kUnused ? at::zeros_like(values[i]) : 2 * values[i] * Random(1000 + 10 * r + m)[i];
        rank_sum = rank_sum.defined() ? rank_sum + g : g;
      }
      total = total + rank_sum;
    }
    mean.push_back(total * (1.0 / world));
  }
  return mean;
}

using dist_internal::ReduceScatterBy;

// This rank's copy of the parameters, trainable.
std::vector<NamedParameter> Parameters(const std::vector<at::Tensor>& values) {
  std::vector<NamedParameter> parameters;
  for (size_t i = 0; i < values.size(); ++i) {
    parameters.push_back({"p" + std::to_string(i), values[i].clone().requires_grad_(true)});
  }
  return parameters;
}

std::shared_ptr<const ShardLayout> LayOut(const std::vector<NamedParameter>& parameters,
                                          const DataParallel& ranks) {
  std::vector<at::Tensor> tensors;
  for (const NamedParameter& p : parameters) tensors.push_back(p.tensor);
  return std::make_shared<const ShardLayout>(
      MakeShardLayout(tensors, ranks.world_size(), ranks.rank(), kBucketBytes));
}

class GradientReduceScatterTest
    : public ::testing::TestWithParam<std::tuple<int, ReduceScatterBy>> {};

TEST_P(GradientReduceScatterTest, EachRankEndsWithTheMeanOfItsPartsAndNoWholeGradient) {
  const auto [world, by] = GetParam();
  const std::vector<at::Tensor> values = Random(7);
  constexpr int kMicroBatches = 2;
  const std::vector<at::Tensor> expected = ExpectedMean(values, world, kMicroBatches);
  testing::OnRanks(
      world,
      [&](DataParallel& ranks) {
        const std::vector<NamedParameter> parameters = Parameters(values);
        const auto layout = LayOut(parameters, ranks);
        GradientReduceScatter scatter(&ranks, parameters, layout);
        for (int step = 0; step < 2; ++step) {  // the buffers are reused from step to step
          for (const NamedParameter& p : parameters) p.tensor.mutable_grad().reset();
          for (const ShardLayout::Part& part : layout->parts) part.view.mutable_grad().reset();
          Loss(parameters, ranks.rank(), 0).backward();  // an earlier micro-batch: accumulates
          scatter.ArmForLastBackward();
          Loss(parameters, ranks.rank(), 1).backward();
          ASSERT_TRUE(scatter.Finish().ok());
          EXPECT_GT(scatter.buckets_started_during_backward(), 0);
          for (const NamedParameter& p : parameters) {
            EXPECT_FALSE(p.tensor.grad().defined()) << p.name << " kept its whole gradient";
          }
          ASSERT_FALSE(layout->parts.empty());
          for (const ShardLayout::Part& part : layout->parts) {
            const at::Tensor want =
                expected[part.parameter].reshape({-1}).narrow(0, part.from, part.length);
            ASSERT_TRUE(part.view.grad().defined());
            EXPECT_TRUE(at::allclose(part.view.grad(), want, 1e-6, 1e-6))
                << "rank " << ranks.rank() << " part of p" << part.parameter << " from "
                << part.from;
          }
        }
      },
      by);
}

TEST_P(GradientReduceScatterTest, AStepWhoseLastMicroBatchHadNoLossSendsTheEarlierOnes) {
  const auto [world, by] = GetParam();
  const std::vector<at::Tensor> values = Random(7);
  const std::vector<at::Tensor> expected = ExpectedMean(values, world, /*micro_batches=*/1);
  testing::OnRanks(
      world,
      [&](DataParallel& ranks) {
        const std::vector<NamedParameter> parameters = Parameters(values);
        const auto layout = LayOut(parameters, ranks);
        GradientReduceScatter scatter(&ranks, parameters, layout);
        Loss(parameters, ranks.rank(), 0).backward();  // never armed
        ASSERT_TRUE(scatter.Finish().ok());
        EXPECT_EQ(scatter.buckets_started_during_backward(), 0);
        for (const ShardLayout::Part& part : layout->parts) {
          EXPECT_TRUE(
              at::allclose(part.view.grad(),
                           expected[part.parameter].reshape({-1}).narrow(0, part.from, part.length),
                           1e-6, 1e-6));
        }
      },
      by);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GradientReduceScatterTest,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(ReduceScatterBy::kReduceScatter,
                                                              ReduceScatterBy::kAllReduce)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "Ranks" +
                                  (std::get<1>(info.param) == ReduceScatterBy::kReduceScatter
                                       ? "ReduceScatter"
                                       : "AllReduceSliced");
                         });

}  // namespace
}  // namespace engine
