// F6: bf16 gradients reached an optimizer whose state was f32 ("expected dtype float for `end` but
// got dtype c10::BFloat16"). The engine's optimizer step unscales and casts a low-precision
// gradient into its master's f32 before any arithmetic (fused into AdamW's pass on the CPU); the
// plan names grad, master and optimizer-state dtypes.
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "engine/precision_kit.h"
#include "precision/census.h"
#include "testing/devices.h"
#include "train/optimizer.h"
#include "train/precision_runtime.h"

namespace engine {
namespace {

TEST(F6GradDtypeAtOptimizerTest, PlainOptimizerStateMeetsBf16Gradients) {
  // What torch._foreach_lerp_ did inside Adam: f32 state, bf16 gradient.
  at::Tensor exp_avg = at::zeros({4}, at::kFloat);
  at::Tensor grad = at::full({4}, 0.5, at::kBFloat16);
  try {
    exp_avg.lerp_(grad, 0.1);
    FAIL() << "expected a dtype error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(),
                ::testing::HasSubstr("expected dtype float for `end` but got dtype c10::BFloat16"));
  }
}

TEST(F6GradDtypeAtOptimizerTest, TheEnginesStepGivesTheOptimizerItsOwnDtype) {
  torch::nn::Module module;
  module.register_parameter("w", at::full({4}, 1.0, at::kFloat));
  PrecisionRequest request;
  request.census = TakeCensus(module);
  request.device = testing::CpuWithBf16();
  OptionErrors errors;
  auto plan = BuildPolicyPlan(request, {}, *StandardPolicy("bf16-true"), "bf16-true", &errors);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->groups[0].grad, at::kBFloat16);
  EXPECT_EQ(plan->groups[0].master, at::kFloat);
  EXPECT_EQ(plan->groups[0].optimizer_state, at::kFloat);

  auto runtime = PrecisionRuntime::Apply(*plan, module, at::kCPU);
  ASSERT_TRUE(runtime.ok());
  proto::Optimizer config;
  config.mutable_adamw();
  auto optimizer = MakeOptimizer(config, (*runtime)->optimizer_parameters());
  at::Tensor w = module.named_parameters()["w"];
  w.mutable_grad() = at::full({4}, 0.5, at::kBFloat16);  // what backward gives a bf16 weight
  ASSERT_TRUE((*runtime)->UnscaleAndCheck());
  EXPECT_NO_THROW((*runtime)->Step(*optimizer, 0.1));
  for (const auto& [name, state] : optimizer->State()) {
    EXPECT_EQ(state.scalar_type(), at::kFloat) << name;
  }
  EXPECT_EQ(w.scalar_type(), at::kBFloat16);
  EXPECT_LT(w[0].item<float>(), 1.0f) << "the update reached the bf16 weights";
  // The f32 master moved by what AdamW's first step gives an f32 gradient: lr * sign(g), plus
  // the decay.
  EXPECT_NEAR((*runtime)->optimizer_parameters()[0].tensor[0].item<float>(),
              1.0f * (1 - 0.1f * 0.01f) - 0.1f, 1e-6);

  // The same through ATen (SGD has no fused path): the bf16 gradient is cast before any
  // arithmetic with the f32 master.
  (*runtime)->ZeroGrad();
  proto::Optimizer sgd;
  sgd.mutable_sgd()->set_momentum(0.9);
  auto plain = MakeOptimizer(sgd, (*runtime)->optimizer_parameters());
  w.mutable_grad() = at::full({4}, 0.5, at::kBFloat16);
  ASSERT_TRUE((*runtime)->UnscaleAndCheck());
  EXPECT_NO_THROW((*runtime)->Step(*plain, 0.1));
  for (const auto& [name, state] : plain->State()) {
    EXPECT_EQ(state.scalar_type(), at::kFloat) << name;
  }
}

}  // namespace
}  // namespace engine
