// The chunked head cross-entropy against matmul + cross_entropy over the whole logits: loss,
// predictions and both gradients, in f32 and under bf16 autocast, with ignored targets, several
// chunks, a tied head that also embeds, and no target at all.
#include "lm_head_loss.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <limits>

#include "engine/precision_context.h"
#include "engine_kernels/cpu_kernels_switch.h"

namespace engine::transformer {
namespace {

constexpr int64_t kIgnore = -100;

struct Scored {
  at::Tensor loss, grad_hidden, grad_weight;
};

// loss * 3 (a loss scale) backpropagated, for the chunked form or the whole logits.
Scored Score(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
             bool chunked, int64_t chunk_rows, const PrecisionContext& precision) {
  at::Tensor h = hidden.detach().requires_grad_(), w = weight.detach().requires_grad_();
  at::Tensor loss;
  {
    auto scope = precision.Enter();
    if (chunked) {
      loss = ChunkedHeadCrossEntropy(h, w, targets, kIgnore, false, chunk_rows).loss;
    } else {
      loss = at::cross_entropy_loss(at::matmul(h, w.t()).to(at::kFloat), targets, {},
                                    at::Reduction::Mean, kIgnore);
    }
  }
  const auto grads = torch::autograd::grad({loss * 3}, {h, w});
  return {loss.detach(), grads[0], grads[1]};
}

double Relative(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() /
          b.to(at::kDouble).abs().max().clamp_min(1e-12))
      .item<double>();
}

// With the CPU kernels (the fused cross-entropy rows) and without (ATen's expressions, as on a
// GPU).
class ChunkedHeadCrossEntropyPathTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam()) ::setenv(kernels::kCpuKernelsVariable, "0", 1);
  }
  void TearDown() override { ::unsetenv(kernels::kCpuKernelsVariable); }
};

INSTANTIATE_TEST_SUITE_P(CpuKernelsOnOrOff, ChunkedHeadCrossEntropyPathTest, ::testing::Bool());

TEST_P(ChunkedHeadCrossEntropyPathTest, EqualsCrossEntropyOverTheWholeLogits) {
  at::manual_seed(21);
  const at::Tensor hidden = at::randn({37, 24}), weight = at::randn({301, 24}) * 0.3;
  at::Tensor targets = at::randint(0, 301, {37}, at::kLong);
  targets.narrow(0, 5, 4).fill_(kIgnore);
  for (int64_t chunk : {0, 1, 8, 37}) {
    const Scored want = Score(hidden, weight, targets, false, 0, PrecisionContext::None());
    const Scored got = Score(hidden, weight, targets, true, chunk, PrecisionContext::None());
    EXPECT_NEAR(got.loss.item<double>(), want.loss.item<double>(), 1e-5) << chunk;
    EXPECT_LE(Relative(got.grad_hidden, want.grad_hidden), 1e-5) << chunk;
    EXPECT_LE(Relative(got.grad_weight, want.grad_weight), 1e-5) << chunk;
    EXPECT_EQ(got.grad_weight.scalar_type(), at::kFloat);
  }
  // Predictions: the argmax of each row's logits where the target counts; the ignored rows are
  // not scored at all.
  const HeadLoss scored = ChunkedHeadCrossEntropy(hidden, weight, targets, kIgnore, true, 8);
  EXPECT_EQ(scored.count.item<int64_t>(), 33);
  const at::Tensor counted = targets.ne(kIgnore);
  EXPECT_TRUE(at::equal(scored.predicted.masked_select(counted),
                        at::matmul(hidden, weight.t()).argmax(-1).masked_select(counted)));
  EXPECT_TRUE(scored.predicted.masked_select(counted.logical_not()).eq(kIgnore).all().item<bool>());
}

TEST_P(ChunkedHeadCrossEntropyPathTest, MostlyIgnoredRowsAsInAChatBatchScoreAsTheWholeLogits) {
  // A chat batch: prompts and padding ignored, a few answer tokens counted, and non-finite hidden
  // states in a padding row, which cross_entropy over the whole logits turns into a NaN loss and
  // the chunked form does not even multiply.
  at::manual_seed(23);
  const at::Tensor hidden = at::randn({50, 16}), weight = at::randn({77, 16}) * 0.3;
  at::Tensor targets = at::full({50}, kIgnore, at::kLong);
  for (int64_t row : {3, 4, 5, 21, 22, 40}) targets[row] = (row * 7) % 77;
  const Scored want = Score(hidden, weight, targets, false, 0, PrecisionContext::None());
  for (int64_t chunk : {0, 1, 4}) {
    const Scored got = Score(hidden, weight, targets, true, chunk, PrecisionContext::None());
    EXPECT_NEAR(got.loss.item<double>(), want.loss.item<double>(), 1e-5) << chunk;
    EXPECT_LE(Relative(got.grad_hidden, want.grad_hidden), 1e-5) << chunk;
    EXPECT_LE(Relative(got.grad_weight, want.grad_weight), 1e-5) << chunk;
    EXPECT_TRUE(got.grad_hidden.index_select(0, targets.eq(kIgnore).nonzero().view({-1}))
                    .eq(0)
                    .all()
                    .item<bool>());
  }
  at::Tensor padded = hidden.clone();
  padded[49].fill_(std::numeric_limits<float>::quiet_NaN());
  const Scored got = Score(padded, weight, targets, true, 0, PrecisionContext::None());
  EXPECT_NEAR(got.loss.item<double>(), want.loss.item<double>(), 1e-5);
  EXPECT_TRUE(got.grad_hidden.isfinite().all().item<bool>());
}

TEST_P(ChunkedHeadCrossEntropyPathTest, UnderBf16AutocastComputesAsAutocastMatmulWould) {
  at::manual_seed(22);
  const at::Tensor hidden = at::randn({20, 32}), weight = at::randn({97, 32}) * 0.3;
  const at::Tensor targets = at::randint(0, 97, {20}, at::kLong);
  const PrecisionContext bf16 = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16);
  const Scored want = Score(hidden, weight, targets, false, 0, bf16);
  const Scored got = Score(hidden, weight, targets, true, 6, bf16);
  // The same bf16 logits scored in f32: the loss to f32 rounding; the gradients are bf16 products
  // either way (one bf16 step apart at most).
  EXPECT_NEAR(got.loss.item<double>(), want.loss.item<double>(), 1e-5);
  EXPECT_LE(Relative(got.grad_hidden, want.grad_hidden), 1.0 / 128);
  EXPECT_LE(Relative(got.grad_weight, want.grad_weight), 1.0 / 128);
  EXPECT_EQ(got.grad_hidden.scalar_type(), at::kFloat);
}

TEST(ChunkedHeadCrossEntropyTest, ASecondBackwardOfARetainedGraphIsAnError) {
  const at::Tensor hidden = at::randn({3, 4}).requires_grad_(), weight = at::randn({5, 4});
  const at::Tensor loss =
      ChunkedHeadCrossEntropy(hidden, weight, at::tensor({1, 2, 3}, at::kLong), kIgnore, false)
          .loss;
  loss.backward({}, /*retain_graph=*/true);
  const at::Tensor first = hidden.grad().clone();
  EXPECT_THROW(loss.backward(), c10::Error);
  EXPECT_TRUE(at::equal(hidden.grad(), first));
}

TEST(ChunkedHeadCrossEntropyTest, NoTargetGivesAZeroLossTiedToTheInputs) {
  const at::Tensor hidden = at::randn({3, 4}).requires_grad_(), weight = at::randn({5, 4});
  const HeadLoss scored =
      ChunkedHeadCrossEntropy(hidden, weight, at::full({3}, kIgnore, at::kLong), kIgnore, true);
  EXPECT_EQ(scored.count.item<int64_t>(), 0);
  EXPECT_EQ(scored.loss.item<float>(), 0.0f);
  scored.loss.backward();
  EXPECT_TRUE(at::equal(hidden.grad(), at::zeros({3, 4})));
}

}  // namespace
}  // namespace engine::transformer
