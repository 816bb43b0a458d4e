// F10: bf16 was requested on a GPU without bf16 (Turing). `auto` picks fp16 with loss scaling
// there; an explicit bf16 request is refused at check time naming the device and its capability.
// Without a Turing GPU the device is injected; the decision is what is tested.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/precision.h"
#include "plugins/plugin_registry.h"
#include "testing/devices.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

StatusOr<PrecisionPlan> PlanOnTuring(const std::string& policy) {
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry();
    EXPECT_TRUE(r->LoadDirectory(testing::kBuiltinPluginDir).ok());
    return r;
  }();
  const auto& plugin = static_cast<const PrecisionPolicyPlugin&>(
      *registry->Find(PluginKind::kPrecisionPolicy, policy)->plugin);
  auto created = plugin.Create(plugin.default_options());
  PrecisionRequest request;
  request.census = {{"w", "w", at::kFloat, 64, true, false}};
  request.device = testing::Turing();
  OptionErrors errors;
  return (*created)->MakePlan(request, &errors);
}

TEST(F10Bf16WithoutHardwareTest, AutoPicksFp16WithLossScaling) {
  auto plan = PlanOnTuring("auto");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->policy, "fp16-mixed");
  EXPECT_EQ(plan->autocast, at::kHalf);
  EXPECT_TRUE(plan->loss_scaling.enabled);
  EXPECT_EQ(plan->tensors[0].master, at::kFloat);
}

TEST(F10Bf16WithoutHardwareTest, ExplicitBf16IsRefusedNamingTheDevice) {
  for (const std::string policy : {"bf16-mixed", "bf16-true"}) {
    auto plan = PlanOnTuring(policy);
    ASSERT_FALSE(plan.ok()) << policy;
    EXPECT_THAT(plan.status().message(),
                ::testing::HasSubstr(policy + " computes in bf16, but cuda:0 NVIDIA TITAN RTX "
                                              "(sm_75) cannot: it has no bf16 arithmetic (bf16 "
                                              "needs CUDA compute capability 8.0"));
  }
}

}  // namespace
}  // namespace engine
