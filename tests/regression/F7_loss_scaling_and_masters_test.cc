// F7: fp16 loss scaling with fp16 trainable weights ("Attempting to unscale FP16 gradients"); the
// "fix" was pure fp16 without scaling, which loses small updates. The engine keeps f32 masters
// under loss scaling, skips overflowed steps, backs off the scale and trains on.
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "engine/precision_kit.h"
#include "engine/safetensors.h"
#include "precision/census.h"
#include "testing/devices.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/test_paths.h"
#include "train/optimizer.h"
#include "train/precision_runtime.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

TEST(F7LossScalingAndMastersTest, PureFp16UpdatesAreLostWhereF32MastersKeepThem) {
  at::Tensor fp16_weight = at::full({1}, 1.0, at::kHalf);
  at::Tensor f32_master = at::full({1}, 1.0, at::kFloat);
  for (int i = 0; i < 100; ++i) {
    fp16_weight.add_(1e-4);  // below fp16's resolution at 1.0 (about 1e-3)
    f32_master.add_(1e-4);
  }
  EXPECT_EQ(fp16_weight.item<float>(), 1.0f) << "a hundred updates, all lost";
  EXPECT_NEAR(f32_master.item<float>(), 1.01f, 1e-4);
}

TEST(F7LossScalingAndMastersTest, Fp16ScalingWithoutMastersIsRefused) {
  torch::nn::Linear layer(4, 2);
  PrecisionRequest request;
  request.census = TakeCensus(*layer);
  request.device = testing::Turing();
  OptionErrors errors;
  auto plan = BuildPolicyPlan(request, {}, *StandardPolicy("fp16-true"), "fp16-true", &errors);
  ASSERT_TRUE(plan.ok());
  PrecisionPlan broken = *plan;
  for (TensorPlan& t : broken.tensors) t.master = t.optimizer_state = at::kHalf;
  Status s = CheckPlanInvariants(broken, testing::Turing());
  EXPECT_THAT(s.message(),
              HasSubstr("loss scaling needs an f32 master for every trainable tensor"));
}

TEST(F7LossScalingAndMastersTest, AnOverflowSkipsTheStepHalvesTheScaleAndTrainingContinues) {
  torch::nn::Linear layer(4, 2);
  PrecisionRequest request;
  request.census = TakeCensus(*layer);
  request.device = testing::CpuWithBf16();
  OptionErrors errors;
  auto plan = BuildPolicyPlan(request, {}, *StandardPolicy("fp32"), "fp32", &errors);
  ASSERT_TRUE(plan.ok());
  // Beyond f32's range: the scaled gradients are inf, as fp16's overflow at a too-large scale.
  plan->loss_scaling = {true, 1e39, 2, 0.5, 2000};
  auto runtime = PrecisionRuntime::Apply(*plan, *layer, at::kCPU);
  ASSERT_TRUE(runtime.ok());
  proto::Optimizer config;
  config.mutable_sgd();
  auto optimizer = MakeOptimizer(config, (*runtime)->optimizer_parameters());
  const at::Tensor before = layer->weight.detach().clone();
  auto step = [&] {
    (*runtime)->ZeroGrad();
    at::Tensor loss = layer->forward(at::ones({3, 4})).pow(2).mean() + 10;
    (loss * (*runtime)->loss_scale()).backward();
    const bool finite = (*runtime)->UnscaleAndCheck();
    if (finite) (*runtime)->Step(*optimizer, 0.1);
    (*runtime)->UpdateScale(!finite);
    return finite;
  };
  EXPECT_FALSE(step()) << "forced overflow";
  EXPECT_TRUE(at::equal(layer->weight, before)) << "weights unchanged by a skipped step";
  EXPECT_EQ((*runtime)->loss_scale(), 5e38);
  EXPECT_EQ((*runtime)->skipped_steps(), 1);
  int skipped = 1;
  while (!step()) ++skipped;
  EXPECT_LT(skipped, 10);
  EXPECT_FALSE(at::equal(layer->weight, before)) << "training continued";
}

TEST(F7LossScalingAndMastersTest, AStageWithForcedOverflowsFinishes) {
  testing::TempDir dir;
  auto file = dir.Write(
      "p.pbtxt",
      "output_dir: \"out\"\nplugin_path: \"" + std::string(testing::kTestPluginDir) +
          "/scaled_fp32\"\n" +
          testing::DigitsStage("s", testing::Precision("scaled_fp32",
                                                       "loss_scaling { initial_scale: 1e39 "
                                                       "}") +
                                        "  schedule { epochs: 5 }"));
  auto r = testing::RunEngine({"run", file.string()}, dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("step 1 overflowed at loss scale 1e+39; skipped (weights "
                               "unchanged), scale now 5e+38"));
  EXPECT_THAT(r.out, HasSubstr("dynamic loss scaling from 1e+39"));
  auto optimizer = safetensors::File::Open(dir.path() / "out/s/final/optimizer.safetensors");
  ASSERT_TRUE(optimizer.ok());
  EXPECT_GE(std::stoi((*optimizer)->metadata().at("skipped_steps")), 2);
  EXPECT_THAT(r.out, ::testing::ContainsRegex("accuracy 0\\.9[0-9]"));
}

}  // namespace
}  // namespace engine
