#include "train/precision_runtime.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "engine/precision_kit.h"
#include "precision/census.h"
#include "testing/devices.h"

namespace engine {
namespace {

std::shared_ptr<torch::nn::Module> MakeModule() {
  auto module = std::make_shared<torch::nn::Module>();
  module->register_parameter("w", at::full({4}, 0.5, at::kFloat));
  module->register_parameter("frozen", at::ones({2}), /*requires_grad=*/false);
  module->register_buffer("count", at::ones({1}, at::kLong));
  return module;
}

PrecisionPlan PlanFor(const std::string& policy, torch::nn::Module& module) {
  PrecisionRequest request;
  request.census = TakeCensus(module);
  request.device = policy.rfind("fp16", 0) == 0 ? testing::Turing() : testing::CpuWithBf16();
  OptionErrors errors;
  return *BuildPolicyPlan(request, {}, *StandardPolicy(policy), policy, &errors);
}

TEST(PrecisionRuntimeTest, Bf16TrueCastsStorageAndKeepsF32Masters) {
  auto module = MakeModule();
  PrecisionPlan plan = PlanFor("bf16-true", *module);
  auto runtime = PrecisionRuntime::Apply(plan, *module, at::kCPU);
  ASSERT_TRUE(runtime.ok()) << runtime.status().message();
  EXPECT_EQ(module->named_parameters()["w"].scalar_type(), at::kBFloat16);
  EXPECT_EQ(module->named_parameters()["frozen"].scalar_type(), at::kBFloat16);
  EXPECT_EQ(module->named_buffers()["count"].scalar_type(), at::kLong);
  ASSERT_EQ((*runtime)->parameters().size(), 1u);
  const at::Tensor& master = (*runtime)->optimizer_parameters()[0].tensor;
  EXPECT_EQ(master.scalar_type(), at::kFloat);
  EXPECT_EQ((*runtime)->context(), PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16));

  // A bf16 gradient goes to the optimizer as it is, with the factor that unscales it into the
  // master's f32 and the bf16 weight to write back; the update lands back in bf16.
  at::Tensor w = module->named_parameters()["w"];
  w.mutable_grad() = at::full({4}, 2.0, at::kBFloat16);
  ASSERT_TRUE((*runtime)->UnscaleAndCheck());
  (*runtime)->ApplyClip(/*total_norm=*/0, /*max_norm=*/0, /*divisor=*/4.0);
  ASSERT_EQ((*runtime)->feeds().size(), 1u);
  EXPECT_TRUE((*runtime)->feeds()[0].grad.is_same(w.grad()));
  EXPECT_DOUBLE_EQ((*runtime)->feeds()[0].scale, 0.25);
  EXPECT_TRUE((*runtime)->feeds()[0].write_back.is_same(w));
  EXPECT_FALSE(master.grad().defined());
  {
    at::NoGradGuard no_grad;
    master.add_(0.25);
  }
  (*runtime)->SyncParameters();
  EXPECT_FLOAT_EQ(w[0].item<float>(), 0.75f);
  auto saved = (*runtime)->MasterTensors();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].first, "w.master");
}

TEST(PrecisionRuntimeTest, MixedTrainsTheParametersThemselves) {
  auto module = MakeModule();
  auto runtime = PrecisionRuntime::Apply(PlanFor("bf16-mixed", *module), *module, at::kCPU);
  ASSERT_TRUE(runtime.ok());
  EXPECT_TRUE(
      (*runtime)->optimizer_parameters()[0].tensor.is_same(module->named_parameters()["w"]));
  EXPECT_TRUE((*runtime)->MasterTensors().empty());
}

TEST(PrecisionRuntimeTest, DynamicLossScaling) {
  auto module = MakeModule();
  PrecisionPlan plan = PlanFor("fp32", *module);
  plan.loss_scaling = {true, 1024, 2, 0.5, 3};
  auto runtime = PrecisionRuntime::Apply(plan, *module, at::kCPU);
  ASSERT_TRUE(runtime.ok());
  EXPECT_EQ((*runtime)->loss_scale(), 1024);
  at::Tensor w = module->named_parameters()["w"];
  w.mutable_grad() = at::full({4}, 2048.0);
  EXPECT_TRUE((*runtime)->UnscaleAndCheck());
  EXPECT_FLOAT_EQ(w.grad()[0].item<float>(), 2.0f);
  // An overflow: skipped, counted, scale halved; three clean steps grow it back.
  w.mutable_grad() = at::full({4}, INFINITY);
  EXPECT_FALSE((*runtime)->UnscaleAndCheck());
  (*runtime)->UpdateScale(true);
  EXPECT_EQ((*runtime)->loss_scale(), 512);
  EXPECT_EQ((*runtime)->skipped_steps(), 1);
  EXPECT_EQ((*runtime)->consecutive_skipped_steps(), 1);
  for (int i = 0; i < 3; ++i) (*runtime)->UpdateScale(false);
  EXPECT_EQ((*runtime)->loss_scale(), 1024);
  EXPECT_EQ((*runtime)->consecutive_skipped_steps(), 0);
  w.mutable_grad() = at::full({4}, NAN);
  EXPECT_FALSE((*runtime)->UnscaleAndCheck());
}

// The fused step (bf16 gradient, factor and write-back in one kernel pass) against the unfused
// arithmetic: the gradient cast to f32 and unscaled, AdamW on the f32 master, the master copied
// down. With clipping on a mix of a master and a plain f32 parameter.
TEST(PrecisionRuntimeTest, FusedStepEqualsCastUnscaleUpdateCopy) {
  auto module = std::make_shared<torch::nn::Module>();
  module->register_parameter("w", at::linspace(-1, 1, 40000, at::kFloat));
  PrecisionPlan plan = PlanFor("bf16-true", *module);
  plan.loss_scaling = {true, 256, 2, 0.5, 1000};
  auto runtime = PrecisionRuntime::Apply(plan, *module, at::kCPU);
  ASSERT_TRUE(runtime.ok()) << runtime.status().message();
  at::Tensor w = module->named_parameters()["w"];
  ASSERT_EQ(w.scalar_type(), at::kBFloat16);
  at::Tensor reference = w.detach().to(at::kFloat).clone();
  proto::Optimizer config;
  config.mutable_adamw()->set_weight_decay(0.1);
  auto fused = MakeOptimizer(config, (*runtime)->optimizer_parameters());
  auto plain = MakeOptimizer(config, {{"w", reference}});
  for (int step = 0; step < 3; ++step) {
    (*runtime)->ZeroGrad();
    const at::Tensor scaled = at::linspace(-300, 500, 40000, at::kFloat).to(at::kBFloat16);
    w.mutable_grad() = scaled.clone();
    ASSERT_TRUE((*runtime)->UnscaleAndCheck());
    const double norm = (*runtime)->ClipGradients(0.5, /*divisor=*/2.0);
    (*runtime)->Step(*fused, 0.01);

    at::Tensor g = scaled.to(at::kFloat) * (1.0 / 512);
    EXPECT_NEAR(norm, g.norm().item<double>(), 1e-3 * norm) << step;
    g.mul_(0.5 / (g.norm().item<double>() + 1e-6));
    reference.mutable_grad() = g;
    plain->Step(0.01);
  }
  EXPECT_TRUE(at::allclose((*runtime)->optimizer_parameters()[0].tensor, reference, 1e-5, 1e-6));
  EXPECT_TRUE(at::equal(w, (*runtime)->optimizer_parameters()[0].tensor.to(at::kBFloat16)));
  EXPECT_TRUE((*runtime)->feeds().empty()) << "Step lets go of the step's gradients";
}

TEST(PrecisionRuntimeTest, ClipGradientsOnParametersWithoutMasters) {
  auto module = std::make_shared<torch::nn::Module>();
  module->register_parameter("a", at::zeros({2}));
  module->register_parameter("b", at::zeros({1}));
  auto runtime = PrecisionRuntime::Apply(PlanFor("fp32", *module), *module, at::kCPU);
  ASSERT_TRUE(runtime.ok());
  at::Tensor a = module->named_parameters()["a"], b = module->named_parameters()["b"];
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  ASSERT_TRUE((*runtime)->UnscaleAndCheck());
  EXPECT_NEAR((*runtime)->ClipGradients(1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad()[0].item<float>(), 0.6, 1e-5);
  EXPECT_NEAR(b.grad()[0].item<float>(), 0.8, 1e-5);
  EXPECT_NEAR((*runtime)->ClipGradients(10.0), 1.0, 1e-4);
  EXPECT_NEAR(b.grad()[0].item<float>(), 0.8, 1e-5) << "below the limit nothing changes";
}

// An optimizer whose state is whatever the test says, as a loaded checkpoint could make it.
class FixedStateOptimizer : public Optimizer {
 public:
  explicit FixedStateOptimizer(safetensors::NamedTensors state) : state_(std::move(state)) {}
  std::string algorithm() const override { return "fixed"; }
  std::vector<std::string> slot_names() const override { return {}; }
  safetensors::NamedTensors State() const override { return state_; }
  Status LoadState(const safetensors::NamedTensors&, int64_t) override { return Status::Ok(); }

 protected:
  void Update(double, const std::vector<GradientFeed>&) override {}

 private:
  safetensors::NamedTensors state_;
};

TEST(PrecisionRuntimeTest, OptimizerStateMustMatchTheMasters) {
  auto module = MakeModule();
  auto runtime = PrecisionRuntime::Apply(PlanFor("bf16-true", *module), *module, at::kCPU);
  ASSERT_TRUE(runtime.ok());
  proto::Optimizer config;
  config.mutable_adamw();
  auto adamw = MakeOptimizer(config, (*runtime)->optimizer_parameters());
  module->named_parameters()["w"].mutable_grad() = at::ones({4}, at::kBFloat16);
  ASSERT_TRUE((*runtime)->UnscaleAndCheck());
  (*runtime)->Step(*adamw, 0.1);
  EXPECT_TRUE((*runtime)->VerifyOptimizerState(*adamw).ok());

  FixedStateOptimizer bf16_state({{"w.exp_avg", at::ones({4}, at::kBFloat16)}});
  Status s = (*runtime)->VerifyOptimizerState(bf16_state);
  EXPECT_EQ(s.message(),
            "optimizer state 'w.exp_avg' is bf16 but the weights it updates are f32 (or of another "
            "shape); the optimizer would meet mismatched dtypes (F6)");
  FixedStateOptimizer stray({{"v.exp_avg", at::ones({4})}});
  EXPECT_FALSE((*runtime)->VerifyOptimizerState(stray).ok());
}

TEST(PrecisionRuntimeTest, MastersLeftToTheOptimizerAreNeitherMadeNorSavedHere) {
  // A sharded optimizer keeps the masters of its part: the runtime makes none, hands over the bf16
  // parameter itself with its gradient feed, writes no masters into checkpoints and takes none
  // back, and checks the optimizer's state against the masters' dtype.
  auto module = MakeModule();
  auto runtime = PrecisionRuntime::Apply(PlanFor("bf16-true", *module), *module, at::kCPU,
                                         MasterHolder::kOptimizer);
  ASSERT_TRUE(runtime.ok()) << runtime.status().message();
  at::Tensor w = module->named_parameters()["w"];
  ASSERT_EQ((*runtime)->optimizer_parameters().size(), 1u);
  EXPECT_TRUE((*runtime)->optimizer_parameters()[0].tensor.is_same(w));
  EXPECT_EQ((*runtime)->OptimizerMasterDtypes(), std::vector<at::ScalarType>{at::kFloat});
  EXPECT_TRUE((*runtime)->MasterTensors().empty());
  w.mutable_grad() = at::full({4}, 2.0, at::kBFloat16);
  ASSERT_TRUE((*runtime)->UnscaleAndCheck());
  ASSERT_EQ((*runtime)->feeds().size(), 1u);
  EXPECT_TRUE((*runtime)->feeds()[0].write_back.is_same(w));

  FixedStateOptimizer f32_state({{"w.exp_avg", at::ones({4})}, {"w.master", at::ones({4})}});
  EXPECT_TRUE((*runtime)->VerifyOptimizerState(f32_state).ok());
  FixedStateOptimizer bf16_state({{"w.exp_avg", at::ones({4}, at::kBFloat16)}});
  EXPECT_THAT((*runtime)->VerifyOptimizerState(bf16_state).message(),
              ::testing::HasSubstr("the weights it updates are f32"));
  EXPECT_TRUE((*runtime)->Restore({}, {}).ok());
  EXPECT_THAT((*runtime)->Restore({{"w.master", at::ones({4})}}, {}).message(),
              ::testing::HasSubstr("'w.master' is for the optimizer"));
}

TEST(PrecisionRuntimeTest, PlanMustCoverEveryTensor) {
  auto module = MakeModule();
  PrecisionPlan plan = PlanFor("fp32", *module);
  plan.tensors.pop_back();
  auto runtime = PrecisionRuntime::Apply(plan, *module, at::kCPU);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().message(), "the precision plan has no entry for tensor 'count'");
}

}  // namespace
}  // namespace engine
