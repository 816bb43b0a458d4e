#include "train/optimizer.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>

#include "train/lr_schedule.h"

namespace engine {
namespace {

at::Tensor Param(std::vector<float> values) {
  return at::tensor(values, at::kFloat).set_requires_grad(true);
}

void SetGrad(at::Tensor& p, std::vector<float> values) {
  p.mutable_grad() = at::tensor(values, at::kFloat);
}

TEST(OptimizerTest, AdamWMatchesTheReferenceUpdate) {
  proto::Optimizer config;
  config.mutable_adamw()->set_weight_decay(0.1);
  at::Tensor p = Param({1.0f, -2.0f});
  auto opt = MakeOptimizer(config, {{"w", p}});
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  double w[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  const float grads[2][2] = {{0.5f, -1.0f}, {0.25f, 2.0f}};
  for (int step = 1; step <= 2; ++step) {
    SetGrad(p, {grads[step - 1][0], grads[step - 1][1]});
    opt->Step(lr);
    for (int i = 0; i < 2; ++i) {
      const double g = grads[step - 1][i];
      w[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, step));
      const double v_hat = v[i] / (1 - std::pow(b2, step));
      w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  EXPECT_NEAR(p.data_ptr<float>()[0], w[0], 1e-6);
  EXPECT_NEAR(p.data_ptr<float>()[1], w[1], 1e-6);
  EXPECT_EQ(opt->steps(), 2);
  EXPECT_EQ(opt->algorithm(), "adamw");
}

TEST(OptimizerTest, SgdWithNesterovMomentum) {
  proto::Optimizer config;
  config.mutable_sgd()->set_momentum(0.9);
  config.mutable_sgd()->set_nesterov(true);
  at::Tensor p = Param({1.0f});
  auto opt = MakeOptimizer(config, {{"w", p}});
  SetGrad(p, {1.0f});
  opt->Step(0.1);  // buf = 1; g = 1 + 0.9 * 1 = 1.9
  EXPECT_NEAR(p.data_ptr<float>()[0], 1.0 - 0.19, 1e-6);
  SetGrad(p, {1.0f});
  opt->Step(0.1);  // buf = 0.9 + 1 = 1.9; g = 1 + 0.9 * 1.9 = 2.71
  EXPECT_NEAR(p.data_ptr<float>()[0], 0.81 - 0.271, 1e-6);
}

TEST(OptimizerTest, ParametersWithoutGradientsAreLeftAlone) {
  proto::Optimizer config;
  at::Tensor used = Param({1.0f}), unused = Param({5.0f});
  auto opt = MakeOptimizer(config, {{"used", used}, {"unused", unused}});
  SetGrad(used, {1.0f});
  opt->Step(0.1);
  EXPECT_EQ(unused.data_ptr<float>()[0], 5.0f);
  EXPECT_NE(used.data_ptr<float>()[0], 1.0f);
  auto state = opt->State();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "used.exp_avg");
  EXPECT_EQ(state[1].first, "used.exp_avg_sq");
}

TEST(OptimizerTest, RestoredStateContinuesIdentically) {
  proto::Optimizer config;
  at::Tensor a = Param({1.0f, 2.0f}), b = Param({1.0f, 2.0f});
  auto first = MakeOptimizer(config, {{"w", a}});
  SetGrad(a, {0.3f, -0.7f});
  first->Step(0.05);
  // b takes a's weights and optimizer state, then both take the same step.
  b.detach().copy_(a.detach());
  auto second = MakeOptimizer(config, {{"w", b}});
  ASSERT_TRUE(second->LoadState(first->State(), first->steps()).ok());
  SetGrad(a, {0.1f, 0.2f});
  SetGrad(b, {0.1f, 0.2f});
  first->Step(0.05);
  second->Step(0.05);
  EXPECT_TRUE(at::equal(a, b));

  auto bad = MakeOptimizer(config, {{"other", b}});
  Status s = bad->LoadState(first->State(), 1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("matches no trainable parameter"), std::string::npos);
}

TEST(OptimizerTest, FedGradientsAreScaledCastAndWrittenBack) {
  // The same update from an f32 gradient and from a bf16 gradient with a factor to apply, through
  // the fused kernel (contiguous) and through ATen (a non-contiguous bf16 copy).
  for (bool contiguous : {true, false}) {
    at::Tensor plain = Param({1.0f, -2.0f, 3.0f, 0.5f});
    at::Tensor fed = Param({1.0f, -2.0f, 3.0f, 0.5f});
    at::Tensor low_storage = at::zeros({4, 2}, at::kBFloat16);
    at::Tensor low = contiguous ? low_storage.select(1, 0).contiguous() : low_storage.select(1, 0);
    at::Tensor grad16 = at::tensor({8.0f, -4.0f, 2.0f, 16.0f}).to(at::kBFloat16);
    SetGrad(plain, {1.0f, -0.5f, 0.25f, 2.0f});
    proto::Optimizer config;
    config.mutable_adamw();
    auto a = MakeOptimizer(config, {{"w", plain}});
    auto b = MakeOptimizer(config, {{"w", fed}});
    for (int step = 0; step < 3; ++step) {
      a->Step(0.1);
      b->Step(0.1, {GradientFeed{grad16, 0.125, low}});
    }
    EXPECT_TRUE(at::allclose(fed, plain, 1e-6, 1e-7)) << contiguous;
    EXPECT_FALSE(fed.grad().defined()) << "the parameter's own .grad() was not read";
    EXPECT_TRUE(at::equal(low, fed.to(at::kBFloat16))) << contiguous;
    EXPECT_EQ(grad16[0].item<float>(), 8.0f) << "the fed gradient is left as it was";
  }
  // SGD takes feeds the same way.
  at::Tensor w = Param({1.0f});
  proto::Optimizer sgd;
  sgd.mutable_sgd();
  auto opt = MakeOptimizer(sgd, {{"w", w}});
  at::Tensor low = at::zeros({1}, at::kHalf);
  opt->Step(1.0, {GradientFeed{at::full({1}, 4.0, at::kHalf), 0.25, low}});
  EXPECT_FLOAT_EQ(w[0].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(low[0].item<float>(), 0.0f);
}

TEST(LrScheduleTest, ConstantWarmupAndCosine) {
  proto::Optimizer o;
  o.set_learning_rate(1.0);
  EXPECT_EQ(LearningRateAt(o, 0, 10), 1.0);
  EXPECT_EQ(LearningRateAt(o, 9, 10), 1.0);

  o.mutable_lr_schedule()->set_kind(proto::LrSchedule::LINEAR_WARMUP);
  o.mutable_lr_schedule()->set_warmup_steps(4);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 0, 10), 0.25);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 3, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 9, 10), 1.0);

  o.mutable_lr_schedule()->set_kind(proto::LrSchedule::COSINE);
  o.mutable_lr_schedule()->set_min_lr_ratio(0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 1, 10), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 4, 10), 1.0) << "the cosine starts at the peak";
  EXPECT_NEAR(LearningRateAt(o, 9, 10), 0.1, 1e-12) << "and ends at the floor on the last step";
  EXPECT_NEAR(LearningRateAt(o, 6, 11), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 2 / 6)), 1e-12);
}

}  // namespace
}  // namespace engine
