// The causal LM loss and its evaluation metrics on hand-made logits.
#include "lm_metrics.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace engine::transformer {
namespace {

// Logits [1, positions, vocab 4] whose argmax at position t is predictions[t].
at::Tensor Predicting(const std::vector<int64_t>& predictions) {
  at::Tensor logits = at::zeros({1, static_cast<int64_t>(predictions.size()), 4});
  for (size_t t = 0; t < predictions.size(); ++t) logits[0][t][predictions[t]] = 5.0;
  return logits;
}

TEST(CausalLmMetricsTest, EosAccuracyCountsTheEosTargetsPredicted) {
  constexpr int64_t kEos = 3;
  // Targets (labels shifted by one): 1, eos, 2, eos; the model predicts 1, eos, 2, 0: it stops at
  // the first end of turn and runs on past the second.
  const at::Tensor labels =
      at::tensor(std::vector<int64_t>{0, 1, kEos, 2, kEos}, at::kLong).unsqueeze(0);
  ModelOutput out;
  CausalLmLoss(Predicting({1, kEos, 2, 0, 0}), labels, /*evaluating=*/true, &out, kEos);
  EXPECT_EQ(out.loss_count, 4);
  EXPECT_DOUBLE_EQ(out.metrics.at("token_accuracy").value(), 0.75);
  EXPECT_DOUBLE_EQ(out.metrics.at("eos_accuracy").sum, 1);
  EXPECT_DOUBLE_EQ(out.metrics.at("eos_accuracy").count, 2);

  // Without an eos id, or in training, no such metric.
  ModelOutput plain;
  CausalLmLoss(Predicting({1, kEos, 2, 0, 0}), labels, /*evaluating=*/true, &plain);
  EXPECT_EQ(plain.metrics.count("eos_accuracy"), 0u);
  ModelOutput training;
  CausalLmLoss(Predicting({1, kEos, 2, 0, 0}), labels, /*evaluating=*/false, &training, kEos);
  EXPECT_TRUE(training.metrics.empty());
  // Training leaves the count on the device for the trainer; the loss is the same mean.
  EXPECT_EQ(training.loss_count, 0);
  ASSERT_TRUE(training.loss_count_tensor.defined());
  EXPECT_EQ(training.loss_count_tensor.item<int64_t>(), 4);
  EXPECT_EQ(training.loss.item<float>(), out.loss.item<float>());
}

TEST(CausalLmMetricsTest, IgnoredTargetsAreNeitherCountedNorScored) {
  const at::Tensor labels =
      at::tensor(std::vector<int64_t>{0, kIgnoreIndex, 3, kIgnoreIndex}, at::kLong).unsqueeze(0);
  ModelOutput out;
  CausalLmLoss(Predicting({3, 3, 3, 3}), labels, /*evaluating=*/true, &out, /*eos_id=*/3);
  EXPECT_EQ(out.loss_count, 1);
  EXPECT_DOUBLE_EQ(out.metrics.at("eos_accuracy").value(), 1.0);
}

TEST(CausalLmMetricsTest, TeacherForcedExactMatchCountsExamplesWithEveryAnswerTokenRight) {
  // One packed row of two examples (mask 1 then 2) and padding (0): the first example's answer
  // (targets at positions 2 and 3) is predicted right, the second's (position 6) wrong.
  const at::Tensor labels = at::tensor(std::vector<int64_t>{0, kIgnoreIndex, 2, 3, kIgnoreIndex,
                                                            kIgnoreIndex, 1, kIgnoreIndex},
                                       at::kLong)
                                .unsqueeze(0);
  const at::Tensor mask =
      at::tensor(std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2, 0}, at::kLong).unsqueeze(0);
  const at::Tensor logits = Predicting({0, 2, 3, 0, 0, 2, 0, 0});
  ModelOutput packed;
  TeacherForcedExactMatch(NextTokenPredictions(logits), labels, mask, &packed);
  EXPECT_DOUBLE_EQ(packed.metrics.at("exact_match").sum, 1);
  EXPECT_DOUBLE_EQ(packed.metrics.at("exact_match").count, 2);
  // As one example (no mask), one wrong token fails it.
  ModelOutput whole;
  TeacherForcedExactMatch(NextTokenPredictions(logits), labels, at::Tensor(), &whole);
  EXPECT_DOUBLE_EQ(whole.metrics.at("exact_match").sum, 0);
  EXPECT_DOUBLE_EQ(whole.metrics.at("exact_match").count, 1);
  // A right prediction of the second answer makes both count.
  ModelOutput both;
  TeacherForcedExactMatch(NextTokenPredictions(Predicting({0, 2, 3, 0, 0, 1, 0, 0})), labels, mask,
                          &both);
  EXPECT_DOUBLE_EQ(both.metrics.at("exact_match").value(), 1.0);
}

}  // namespace
}  // namespace engine::transformer
