#include "engine/precision_kit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "precision/device_capability.h"
#include "testing/devices.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

ParameterCensus MlpCensus(at::ScalarType dtype = at::kFloat) {
  return {{"layers.0.weight", "layers", dtype, 100, true, false},
          {"layers.0.bias", "layers", dtype, 10, true, false},
          {"head.weight", "head", dtype, 50, false, false},
          {"norm.running", "norm", at::kFloat, 10, false, true},
          {"steps", "steps", at::kLong, 1, false, true}};
}

PrecisionRequest Request(DeviceCapability device, at::ScalarType dtype = at::kFloat) {
  PrecisionRequest r;
  r.census = MlpCensus(dtype);
  r.device = std::move(device);
  return r;
}

StatusOr<PrecisionPlan> Plan(const std::string& policy, const PrecisionRequest& request,
                             const proto::PrecisionOptions& options = {},
                             OptionErrors* errors = nullptr) {
  OptionErrors ignored;
  return BuildPolicyPlan(request, options, *StandardPolicy(policy), policy,
                         errors ? errors : &ignored);
}

const TensorPlan& Tensor(const PrecisionPlan& plan, const std::string& name) {
  for (const TensorPlan& t : plan.tensors) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return plan.tensors.front();
}

TEST(PrecisionKitTest, Fp32) {
  auto plan = Plan("fp32", Request(testing::CpuWithBf16(), at::kBFloat16));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_FALSE(plan->autocast);
  EXPECT_FALSE(plan->loss_scaling.enabled);
  const TensorPlan& w = Tensor(*plan, "layers.0.weight");
  EXPECT_EQ(w.storage, at::kFloat);
  EXPECT_EQ(w.master, at::kFloat);
  EXPECT_EQ(plan->reason, "casts 3 tensor(s) bf16 to f32");
  EXPECT_EQ(Tensor(*plan, "steps").storage, at::kLong) << "integer buffers keep their dtype";
}

TEST(PrecisionKitTest, Bf16MixedKeepsF32StorageAndComputesInBf16) {
  auto plan = Plan("bf16-mixed", Request(testing::CpuWithBf16()));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->autocast, at::kBFloat16);
  EXPECT_FALSE(plan->loss_scaling.enabled);
  const TensorPlan& w = Tensor(*plan, "layers.0.weight");
  EXPECT_EQ(w.storage, at::kFloat);
  EXPECT_EQ(w.compute, at::kBFloat16);
  EXPECT_EQ(w.grad, at::kFloat);
  EXPECT_EQ(w.master, at::kFloat);
  EXPECT_EQ(w.optimizer_state, at::kFloat);
  EXPECT_EQ(Tensor(*plan, "head.weight").master, at::ScalarType::Undefined) << "frozen";
}

TEST(PrecisionKitTest, Bf16TrueStoresBf16WithF32Masters) {
  auto plan = Plan("bf16-true", Request(testing::Ampere()));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const TensorPlan& w = Tensor(*plan, "layers.0.weight");
  EXPECT_EQ(w.storage, at::kBFloat16);
  EXPECT_EQ(w.grad, at::kBFloat16);
  EXPECT_EQ(w.master, at::kFloat);
  EXPECT_EQ(w.optimizer_state, at::kFloat);
  EXPECT_EQ(Tensor(*plan, "head.weight").storage, at::kBFloat16);
  EXPECT_EQ(Tensor(*plan, "norm.running").storage, at::kBFloat16);
  EXPECT_TRUE(plan->warnings.empty());
  // Groups: trainable (bf16 storage + f32 masters), frozen, buffers by storage dtype.
  ASSERT_EQ(plan->groups.size(), 4u);
  EXPECT_EQ(plan->groups[0].name, "trainable");
  EXPECT_EQ(plan->groups[0].num_elements, 110);
  EXPECT_EQ(plan->groups[0].bytes, 110 * 2 + 110 * 4);
  EXPECT_EQ(plan->groups[1].name, "frozen");
  EXPECT_EQ(plan->groups[1].bytes, 100);
  EXPECT_EQ(plan->groups[2].name, "buffers (i64)");
  EXPECT_EQ(plan->groups[3].name, "buffers (bf16)");
}

TEST(PrecisionKitTest, Fp16PoliciesScaleTheLossWithF32Masters) {
  auto mixed = Plan("fp16-mixed", Request(testing::Turing()));
  ASSERT_TRUE(mixed.ok()) << mixed.status().message();
  EXPECT_EQ(mixed->autocast, at::kHalf);
  EXPECT_TRUE(mixed->loss_scaling.enabled);
  EXPECT_EQ(mixed->loss_scaling.initial_scale, 65536);
  EXPECT_EQ(mixed->loss_scaling.growth_interval, 2000);
  auto true_plan = Plan("fp16-true", Request(testing::Turing()));
  ASSERT_TRUE(true_plan.ok()) << true_plan.status().message();
  EXPECT_EQ(Tensor(*true_plan, "layers.0.weight").storage, at::kHalf);
  EXPECT_EQ(Tensor(*true_plan, "layers.0.weight").master, at::kFloat);
  EXPECT_TRUE(true_plan->loss_scaling.enabled);
}

TEST(PrecisionKitTest, UnsafeLowPrecisionUpdatesWarnAndDropScaling) {
  proto::PrecisionOptions options;
  options.set_unsafe_low_precision_updates(true);
  auto bf16 = Plan("bf16-true", Request(testing::Ampere()), options);
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ(Tensor(*bf16, "layers.0.weight").master, at::kBFloat16);
  EXPECT_EQ(Tensor(*bf16, "layers.0.weight").optimizer_state, at::kBFloat16);
  ASSERT_EQ(bf16->warnings.size(), 1u);
  EXPECT_THAT(bf16->warnings[0], HasSubstr("2 trainable tensor(s) are updated in bf16 without f32 "
                                           "masters"));
  auto fp16 = Plan("fp16-true", Request(testing::Turing()), options);
  ASSERT_TRUE(fp16.ok()) << fp16.status().message();
  EXPECT_FALSE(fp16->loss_scaling.enabled);
  EXPECT_THAT(fp16->warnings[0], HasSubstr("no loss scaling (it needs f32 masters)"));
}

TEST(PrecisionKitTest, KeepFp32AndDeclaredCompute) {
  proto::PrecisionOptions options;
  options.add_keep_fp32("layers.0.bias");
  options.add_keep_fp32("nothing.*");
  PrecisionRequest request = Request(testing::Ampere());
  request.declared_compute = {{"head.*", at::kFloat, "declared"}};
  OptionErrors errors;
  auto plan = Plan("bf16-true", request, options, &errors);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const TensorPlan& bias = Tensor(*plan, "layers.0.bias");
  EXPECT_TRUE(bias.kept_fp32);
  EXPECT_EQ(bias.storage, at::kFloat);
  EXPECT_EQ(bias.compute, at::kBFloat16) << "products still run under autocast";
  const TensorPlan& head = Tensor(*plan, "head.weight");
  EXPECT_TRUE(head.kept_fp32);
  EXPECT_EQ(head.compute, at::kFloat);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_EQ(errors.entries()[0].field_path, "keep_fp32[1]");
  EXPECT_EQ(errors.entries()[0].message, "pattern 'nothing.*' matches no parameter or buffer");
}

TEST(PrecisionKitTest, DeviceRefusalsNameTheDeviceAndTheFix) {
  auto bf16 = Plan("bf16-mixed", Request(testing::Turing()));
  ASSERT_FALSE(bf16.ok());
  EXPECT_EQ(bf16.status().message(),
            "bf16-mixed computes in bf16, but cuda:0 NVIDIA TITAN RTX (sm_75) cannot: it has no "
            "bf16 arithmetic (bf16 needs CUDA compute capability 8.0, sm_80, or newer). Use "
            "precision auto (it chooses what this device runs), or fp16-mixed");
  auto fp16 = Plan("fp16-mixed", Request(testing::CpuWithBf16()));
  ASSERT_FALSE(fp16.ok());
  EXPECT_THAT(fp16.status().message(),
              HasSubstr("fp16-mixed computes in fp16, but cpu Test CPU (avx512_bf16) cannot"));
  EXPECT_THAT(fp16.status().message(), HasSubstr("Use precision auto, or bf16-mixed"));
}

TEST(PrecisionKitTest, SlowBf16IsAWarningNotAnError) {
  auto plan = Plan("bf16-mixed", Request(testing::CpuWithoutBf16()));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->warnings.size(), 1u);
  EXPECT_THAT(plan->warnings[0], HasSubstr("has no bf16 hardware"));
}

TEST(PrecisionKitTest, Fp16OnACpuWithoutFp16HardwareIsAWarningNotAnError) {
  if (CpuHasFp16Hardware()) GTEST_SKIP() << "this CPU computes fp16 in hardware";
  DeviceCapability cpu = testing::CpuWithBf16();
  cpu.fp16 = cpu.fp16_autocast = true;  // as LibTorch 2.11 runs fp16 on an AVX-512 CPU
  auto plan = Plan("fp16-mixed", Request(cpu));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_THAT(plan->warnings, ::testing::Contains(HasSubstr(
                                  "has no fp16 hardware (avx512_fp16 or amx_fp16); fp16 compute "
                                  "runs in software, tens of times slower than f32")));
  // On a GPU fp16 is hardware.
  auto on_turing = Plan("fp16-mixed", Request(testing::Turing()));
  ASSERT_TRUE(on_turing.ok());
  EXPECT_THAT(on_turing->warnings,
              ::testing::Not(::testing::Contains(HasSubstr("has no fp16 hardware"))));
}

TEST(PrecisionKitTest, OptionContradictions) {
  auto errors_for = [](const std::string& policy, const proto::PrecisionOptions& options) {
    OptionErrors errors;
    auto spec = StandardPolicy(policy);
    ValidatePrecisionOptions(options, spec ? &*spec : nullptr, &errors);
    std::vector<std::string> out;
    for (const auto& e : errors.entries()) out.push_back(e.field_path + ": " + e.message);
    return out;
  };
  proto::PrecisionOptions scaling;
  scaling.mutable_loss_scaling()->set_initial_scale(1024);
  EXPECT_THAT(errors_for("bf16-mixed", scaling),
              ::testing::ElementsAre(HasSubstr("loss_scaling: bf16-mixed does not scale the loss: "
                                               "bf16 has f32's range")));
  EXPECT_TRUE(errors_for("fp16-mixed", scaling).empty());
  EXPECT_TRUE(errors_for("auto", scaling).empty());

  proto::PrecisionOptions bad;
  bad.set_compute_dtype("fp16");
  bad.set_unsafe_low_precision_updates(true);
  bad.mutable_loss_scaling()->set_growth_factor(0.5);
  bad.mutable_loss_scaling()->set_backoff_factor(1.5);
  bad.mutable_loss_scaling()->set_growth_interval(0);
  bad.add_keep_fp32("[oops");
  EXPECT_THAT(errors_for("bf16-mixed", bad),
              ::testing::ElementsAre(
                  HasSubstr("keep_fp32[0]: pattern '[oops'"),
                  "compute_dtype: bf16-mixed computes in bf16, not f16; name the policy for that "
                  "dtype, or use auto with compute_dtype to pin it",
                  HasSubstr("loss_scaling: bf16-mixed does not scale the loss"),
                  "loss_scaling.growth_factor: must be > 1 (got 0.5)",
                  "loss_scaling.backoff_factor: must be in (0, 1) (got 1.5)",
                  "loss_scaling.growth_interval: must be > 0",
                  HasSubstr("unsafe_low_precision_updates: bf16-mixed stores weights in f32")));
  proto::PrecisionOptions unknown;
  unknown.set_compute_dtype("int4");
  EXPECT_THAT(errors_for("auto", unknown),
              ::testing::ElementsAre("compute_dtype: 'int4' is not a compute dtype; use bf16, "
                                     "fp16 or fp32"));
}

TEST(PrecisionKitTest, InvariantsRejectBrokenPlans) {
  auto plan = Plan("bf16-true", Request(testing::Ampere()));
  ASSERT_TRUE(plan.ok());
  auto broken = [&](auto&& change) {
    PrecisionPlan copy = *plan;
    change(&copy);
    Status s = CheckPlanInvariants(copy, testing::Ampere());
    return s.ok() ? std::string("(ok)") : s.message();
  };
  EXPECT_EQ(broken([](PrecisionPlan*) {}), "(ok)");
  EXPECT_THAT(broken([](PrecisionPlan* p) { p->tensors[0].optimizer_state = at::kBFloat16; }),
              HasSubstr("the optimizer state (bf16) must have the dtype of the weights it "
                        "updates (f32), or the optimizer meets mismatched dtypes (F6)"));
  EXPECT_THAT(broken([](PrecisionPlan* p) { p->tensors[0].master = at::ScalarType::Undefined; }),
              HasSubstr("a trainable tensor needs a grad and a master dtype"));
  EXPECT_THAT(broken([](PrecisionPlan* p) { p->loss_scaling.enabled = true; }),
              HasSubstr("bf16 never uses loss scaling"));
  EXPECT_THAT(broken([](PrecisionPlan* p) {
                p->autocast = at::kHalf;
                p->loss_scaling.enabled = true;
                p->tensors[0].master = p->tensors[0].optimizer_state = at::kHalf;
              }),
              HasSubstr("loss scaling needs an f32 master for every trainable tensor (this one's "
                        "is f16)"));
  EXPECT_THAT(broken([](PrecisionPlan* p) {
                p->tensors[1].kept_fp32 = true;
                p->tensors[1].storage = at::kBFloat16;
              }),
              HasSubstr("it is kept in f32 but stored in bf16"));
  Status on_turing = CheckPlanInvariants(*plan, testing::Turing());
  EXPECT_THAT(on_turing.message(), HasSubstr("cuda:0 NVIDIA TITAN RTX (sm_75) cannot"));
}

TEST(PrecisionKitTest, DominantLowPrecision) {
  EXPECT_EQ(DominantLowPrecision(MlpCensus(at::kBFloat16)), at::kBFloat16);
  EXPECT_EQ(DominantLowPrecision(MlpCensus(at::kHalf)), at::kHalf);
  EXPECT_EQ(DominantLowPrecision(MlpCensus(at::kFloat)), std::nullopt);
  EXPECT_EQ(DominantLowPrecision({}), std::nullopt);
}

}  // namespace
}  // namespace engine
