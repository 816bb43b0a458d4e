#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "engine/precision.h"
#include "plugin_test_util.h"

namespace engine {
namespace {

const PrecisionPolicyPlugin& Fp32() {
  return testing::BuiltinPlugin<PrecisionPolicyPlugin>(PluginKind::kPrecisionPolicy, "fp32");
}

TEST(Fp32Test, PlansEverythingInFloat32FromTheRealDtypes) {
  auto policy = Fp32().Create(Fp32().default_options());
  ASSERT_TRUE(policy.ok());
  ParameterCensus census = {{"a.weight", at::kBFloat16, 100, true, false},
                            {"a.bias", at::kFloat, 10, true, false},
                            {"b.weight", at::kHalf, 50, false, false},
                            {"steps", at::kLong, 1, false, true}};
  auto plan = (*policy)->MakePlan(census);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->policy, "fp32");
  EXPECT_FALSE(plan->loss_scaling);
  EXPECT_EQ(plan->reason, "casts to f32: 1 bf16 tensor(s) 1 f16 tensor(s)");
  ASSERT_EQ(plan->groups.size(), 3u);
  const PrecisionGroupPlan& trainable = plan->groups[0];
  EXPECT_EQ(trainable.name, "trainable");
  EXPECT_EQ(trainable.num_tensors, 2);
  EXPECT_EQ(trainable.num_elements, 110);
  EXPECT_EQ(trainable.bytes, 440);
  EXPECT_EQ(trainable.master, at::kFloat);
  EXPECT_EQ(trainable.optimizer_state, at::kFloat);
  EXPECT_TRUE(trainable.has_grad);
  EXPECT_EQ(plan->groups[1].name, "frozen");
  EXPECT_FALSE(plan->groups[1].has_grad);
  EXPECT_EQ(plan->groups[2].name, "buffers");
  EXPECT_EQ(plan->groups[2].storage, at::kLong) << "integer buffers keep their dtype";
  EXPECT_EQ(plan->groups[2].bytes, 8);
}

TEST(Fp32Test, ApplyCastsFloatingTensors) {
  auto policy = Fp32().Create(Fp32().default_options());
  ASSERT_TRUE(policy.ok());
  torch::nn::Module module;
  module.register_parameter("w", at::ones({2}, at::kBFloat16));
  module.register_buffer("count", at::ones({1}, at::kLong));
  ASSERT_TRUE((*policy)->Apply(PrecisionPlan(), module).ok());
  EXPECT_EQ(module.named_parameters()["w"].scalar_type(), at::kFloat);
  EXPECT_EQ(module.named_buffers()["count"].scalar_type(), at::kLong);
}

}  // namespace
}  // namespace engine
