// EvalPartials: a rank's evaluation sums, and their sum over the ranks (a scripted second rank).
#include "dist/eval_partials.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "testing/fake_data_parallel.h"

namespace engine {
namespace {

ModelOutput Output(double loss, int64_t count, double correct, double perplexity_sum) {
  ModelOutput out;
  out.loss = at::tensor(loss, at::kDouble);
  out.loss_count = count;
  out.metrics["accuracy"] = {correct, static_cast<double>(count), false};
  out.metrics["perplexity"] = {perplexity_sum, static_cast<double>(count), true};
  return out;
}

TEST(EvalPartialsTest, BatchesAreWeightedByTheirLossCount) {
  EvalPartials p;
  p.Add(Output(2.0, 10, 7, 10 * 0.5));
  p.Add(Output(1.0, 30, 15, 30 * 0.25));
  const auto values = p.Values();
  EXPECT_DOUBLE_EQ(values.at("eval/loss"), (2.0 * 10 + 1.0 * 30) / 40);
  EXPECT_DOUBLE_EQ(values.at("eval/accuracy"), 22.0 / 40);
  EXPECT_DOUBLE_EQ(values.at("eval/perplexity"), std::exp((5.0 + 7.5) / 40));
}

TEST(EvalPartialsTest, SumsOverTheRanksGiveTheWholeSplitsMetrics) {
  EvalPartials mine;
  mine.Add(Output(2.0, 10, 7, 5.0));
  testing::FakeDataParallel group;
  // The other rank: loss sum 30 over 30 terms, 15 correct, perplexity sum 7.5 over 30.
  group.other_sum = {30.0, 30.0, 15.0, 30.0, 7.5, 30.0};
  auto summed = SumOverRanks(group, mine);
  ASSERT_TRUE(summed.ok()) << summed.status().message();
  EXPECT_TRUE(*summed);
  const auto values = mine.Values();
  EXPECT_DOUBLE_EQ(values.at("eval/loss"), 50.0 / 40);
  EXPECT_DOUBLE_EQ(values.at("eval/accuracy"), 22.0 / 40);
  EXPECT_DOUBLE_EQ(values.at("eval/perplexity"), std::exp(12.5 / 40));
}

TEST(EvalPartialsTest, RanksWithDifferentMetricNamesAreToldSoAndNothingIsMixed) {
  EvalPartials mine;
  mine.Add(Output(2.0, 10, 7, 5.0));
  testing::FakeDataParallel group;
  group.other_max = {3.0};  // the other rank computed three metrics
  auto summed = SumOverRanks(group, mine);
  ASSERT_TRUE(summed.ok());
  EXPECT_FALSE(*summed);
  EXPECT_TRUE(group.sums.empty());
  EXPECT_DOUBLE_EQ(mine.Values().at("eval/accuracy"), 0.7);
}

}  // namespace
}  // namespace engine
