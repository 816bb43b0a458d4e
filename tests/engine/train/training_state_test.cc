// TrainingState in optimizer.safetensors: what is written reads back bit for bit (numbers with 17
// digits, generator states), slots and masters are told apart, and a damaged file names its fault.
#include "train/training_state.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/fake_data_parallel.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

TEST(TrainingStateTest, WhatIsWrittenReadsBackExactly) {
  at::manual_seed(11);
  TrainingState state;
  state.algorithm = "adamw";
  state.optimizer_steps = 41;
  state.scaler = {65536.0 / 3.0, 7, 2, 1};
  state.examples = 1312;
  state.last_loss = 0.1 + 0.2;  // not a short decimal
  state.last_lr = 3e-4 / 7;
  safetensors::NamedTensors tensors = {{"w.exp_avg", at::randn({3})}, {"w.master", at::randn({3})}};
  state.generators["cpu"] = GeneratorState(at::Device(at::kCPU));
  const safetensors::Metadata metadata = AppendTrainingState(state, tensors);
  testing::TempDir tmp;
  const auto path = tmp.path() / "optimizer.safetensors";
  ASSERT_TRUE(safetensors::Write(path, tensors, metadata).ok());
  auto file = safetensors::File::Open(path);
  ASSERT_TRUE(file.ok());

  auto saved = ReadTrainingState(**file);
  ASSERT_TRUE(saved.ok()) << saved.status().message();
  EXPECT_EQ(saved->state.algorithm, "adamw");
  EXPECT_EQ(saved->state.optimizer_steps, 41);
  EXPECT_EQ(saved->state.scaler.scale, 65536.0 / 3.0);
  EXPECT_EQ(saved->state.scaler.growth_tracker, 7);
  EXPECT_EQ(saved->state.scaler.skipped_steps, 2);
  EXPECT_EQ(saved->state.scaler.consecutive_skipped_steps, 1);
  EXPECT_EQ(saved->state.examples, 1312);
  EXPECT_EQ(saved->state.last_loss, 0.1 + 0.2);
  EXPECT_EQ(saved->state.last_lr, 3e-4 / 7);
  ASSERT_EQ(saved->optimizer_slots.size(), 1u);
  EXPECT_EQ(saved->optimizer_slots[0].first, "w.exp_avg");
  ASSERT_EQ(saved->masters.size(), 1u);
  EXPECT_EQ(saved->masters[0].first, "w.master");

  // Restoring the generator replays the same draws.
  const at::Tensor first = at::rand({4});
  SetGeneratorState(at::Device(at::kCPU), saved->state.generators.at("cpu"));
  EXPECT_TRUE(at::equal(at::rand({4}), first));
}

TEST(TrainingStateTest, AMissingOrMalformedEntryIsNamed) {
  testing::TempDir tmp;
  const auto path = tmp.path() / "optimizer.safetensors";
  TrainingState state;
  state.generators["cpu"] = GeneratorState(at::Device(at::kCPU));
  safetensors::NamedTensors tensors;
  safetensors::Metadata metadata = AppendTrainingState(state, tensors);
  metadata["growth_tracker"] = "7.5";
  ASSERT_TRUE(safetensors::Write(path, tensors, metadata).ok());
  auto saved = ReadTrainingState(**safetensors::File::Open(path));
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().message(), HasSubstr("'growth_tracker' is not an integer"));

  metadata.erase("last_lr");
  metadata["growth_tracker"] = "7";
  ASSERT_TRUE(safetensors::Write(path, tensors, metadata).ok());
  saved = ReadTrainingState(**safetensors::File::Open(path));
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().message(), HasSubstr("lacks 'last_lr'"));

  ASSERT_TRUE(safetensors::Write(path, {}, AppendTrainingState(TrainingState(), tensors)).ok());
  saved = ReadTrainingState(**safetensors::File::Open(path));
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().message(), HasSubstr("lacks the random generator's state"));
}

TEST(TrainingStateTest, EveryRankHasItsOwnSeedAndRankZeroKeepsTheSingleProcessOne) {
  EXPECT_EQ(TrainingSeed(5, 0), 5ULL ^ 0x5452414953454544ULL);
  EXPECT_NE(TrainingSeed(5, 1), TrainingSeed(5, 0));
  EXPECT_NE(TrainingSeed(5, 2), TrainingSeed(5, 1));
  EXPECT_NE(TrainingSeed(6, 1), TrainingSeed(5, 1));
}

TEST(TrainingStateTest, RankGeneratorsAreGatheredForRankZerosCheckpoint) {
  const at::Device cpu(at::kCPU);
  at::manual_seed(TrainingSeed(3, 1));
  const at::Tensor other = GeneratorState(cpu).clone();
  at::manual_seed(TrainingSeed(3, 0));
  const at::Tensor mine = GeneratorState(cpu).clone();
  ASSERT_FALSE(at::equal(mine, other));

  // The scripted rank 1 reports its length in its slot and its bytes in its half of the sum.
  testing::FakeDataParallel ranks;
  const int64_t n = mine.numel();
  ranks.other_max = {0.0, static_cast<double>(n)};
  ranks.other_sum.assign(static_cast<size_t>(2 * n), 0.0);
  for (int64_t i = 0; i < n; ++i) ranks.other_sum[n + i] = other.data_ptr<uint8_t>()[i];
  auto gathered = GatherRankGenerators(ranks, 0, 2, cpu);
  ASSERT_TRUE(gathered.ok()) << gathered.status().message();
  ASSERT_EQ(gathered->size(), 1u);
  EXPECT_TRUE(at::equal(gathered->at(RankGeneratorKey(1, false)), other));
  EXPECT_TRUE(at::equal(GeneratorState(cpu), mine)) << "gathering leaves this rank's generator";

  ranks.other_max = {0.0, static_cast<double>(n + 8)};
  EXPECT_THAT(GatherRankGenerators(ranks, 0, 2, cpu).status().message(),
              HasSubstr("rank 1's random generator state has another size than rank 0's"));
}

}  // namespace
}  // namespace engine
