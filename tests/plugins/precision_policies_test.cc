// The built-in precision policies as plugins, and `auto`'s decision table on injected devices.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/precision.h"
#include "plugin_test_util.h"
#include "testing/devices.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

const PrecisionPolicyPlugin& Policy(const std::string& name) {
  return testing::BuiltinPlugin<PrecisionPolicyPlugin>(PluginKind::kPrecisionPolicy, name);
}

ParameterCensus Census(at::ScalarType dtype) {
  return {{"model.layers.0.weight", "model.layers", dtype, 1000, true, false},
          {"model.norm.weight", "model.norm", dtype, 10, true, false},
          {"lm_head.weight", "lm_head", dtype, 500, false, false}};
}

StatusOr<PrecisionPlan> Plan(const std::string& policy, DeviceCapability device,
                             at::ScalarType stored = at::kFloat, const std::string& options = "") {
  auto created = Policy(policy).Create(*testing::Options(Policy(policy), options));
  EXPECT_TRUE(created.ok());
  PrecisionRequest request;
  request.census = Census(stored);
  request.device = std::move(device);
  OptionErrors errors;
  auto plan = (*created)->MakePlan(request, &errors);
  EXPECT_TRUE(errors.empty());
  return plan;
}

struct AutoCase {
  std::string device_name;
  DeviceCapability device;
  at::ScalarType stored;
  std::string expected_policy;
  std::string reason_fragment;
};

TEST(AutoPolicyTest, DecisionTable) {
  const std::vector<AutoCase> cases = {
      {"cpu with bf16 hardware", testing::CpuWithBf16(), at::kFloat, "bf16-mixed",
       "computes bf16 in hardware; the weights are stored in f32"},
      {"cpu with bf16 hardware", testing::CpuWithBf16(), at::kBFloat16, "bf16-true",
       "frozen weights stay bf16, trainable ones get f32 masters"},
      {"cpu without bf16 hardware", testing::CpuWithoutBf16(), at::kFloat, "fp32",
       "has no bf16 hardware (avx512_bf16 or amx_bf16), so bf16 would run slower than f32"},
      {"cpu without bf16 hardware", testing::CpuWithoutBf16(), at::kBFloat16, "fp32",
       "the bf16 weights are cast to f32"},
      {"ampere", testing::Ampere(), at::kFloat, "bf16-mixed", "(sm_80) computes bf16 in hardware"},
      {"ampere", testing::Ampere(), at::kBFloat16, "bf16-true", "stored in bf16"},
      {"ampere", testing::Ampere(), at::kHalf, "bf16-mixed", "stored in f16"},
      {"turing", testing::Turing(), at::kFloat, "fp16-mixed",
       "has no bf16 (it needs compute capability 8.0): fp16 autocast with dynamic loss scaling"},
      {"turing", testing::Turing(), at::kHalf, "fp16-true", "f32 masters and loss scaling"},
      {"turing", testing::Turing(), at::kBFloat16, "fp32", "whose range fp16 cannot hold"},
  };
  for (const AutoCase& c : cases) {
    auto plan = Plan("auto", c.device, c.stored);
    ASSERT_TRUE(plan.ok()) << c.device_name << ": " << plan.status().message();
    EXPECT_EQ(plan->policy, c.expected_policy) << c.device_name << ", " << c10::toString(c.stored);
    EXPECT_EQ(plan->requested, "auto");
    EXPECT_THAT(plan->reason, HasSubstr(c.reason_fragment)) << c.device_name;
    EXPECT_EQ(plan->reason.rfind("auto: ", 0), 0u);
  }
}

TEST(AutoPolicyTest, ComputeDtypePins) {
  auto fp32 = Plan("auto", testing::Ampere(), at::kFloat, "compute_dtype: \"fp32\"");
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(fp32->policy, "fp32");
  auto fp16 = Plan("auto", testing::Ampere(), at::kFloat, "compute_dtype: \"fp16\"");
  ASSERT_TRUE(fp16.ok());
  EXPECT_EQ(fp16->policy, "fp16-mixed");
  EXPECT_TRUE(fp16->loss_scaling.enabled);
  auto bf16_on_turing = Plan("auto", testing::Turing(), at::kFloat, "compute_dtype: \"bf16\"");
  ASSERT_FALSE(bf16_on_turing.ok());
  EXPECT_THAT(bf16_on_turing.status().message(),
              HasSubstr("cuda:0 NVIDIA TITAN RTX (sm_75) cannot"));
  auto fp16_on_cpu = Plan("auto", testing::CpuWithBf16(), at::kFloat, "compute_dtype: \"fp16\"");
  ASSERT_FALSE(fp16_on_cpu.ok());
}

TEST(AutoPolicyTest, LossScalingOptionsApplyWhenAutoPicksFp16) {
  auto plan = Plan("auto", testing::Turing(), at::kFloat,
                   "loss_scaling { initial_scale: 128 growth_interval: 50 }");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->loss_scaling.initial_scale, 128);
  EXPECT_EQ(plan->loss_scaling.growth_interval, 50);
}

TEST(StandardPoliciesTest, EachPluginIsItsPolicy) {
  for (const std::string name : {"fp32", "bf16-mixed", "bf16-true"}) {
    auto plan = Plan(name, testing::Ampere());
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status().message();
    EXPECT_EQ(plan->policy, name);
    EXPECT_THAT(plan->reason, HasSubstr("as the pipeline asks"));
  }
  for (const std::string name : {"fp16-mixed", "fp16-true"}) {
    auto plan = Plan(name, testing::Turing());
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status().message();
    EXPECT_TRUE(plan->loss_scaling.enabled) << name;
  }
}

TEST(StandardPoliciesTest, OptionsAreValidatedAgainstThePolicy) {
  OptionErrors errors;
  Policy("bf16-true")
      .ValidateOptions(*testing::Options(Policy("bf16-true"), "loss_scaling { initial_scale: 8 }"),
                       &errors);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_EQ(errors.entries()[0].field_path, "loss_scaling");
  OptionErrors none;
  Policy("fp16-true")
      .ValidateOptions(*testing::Options(Policy("fp16-true"), "loss_scaling { initial_scale: 8 }"),
                       &none);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace engine
