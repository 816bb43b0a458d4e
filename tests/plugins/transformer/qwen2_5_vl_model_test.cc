// Qwen2.5-VL computes what transformers computes: the qwen2_5_vl fixture (tests/fixtures/hf/
// qwen2_vl_fixture.py; a tiny random Qwen2_5_VLForConditionalGeneration saved by save_pretrained,
// the same images, texts and tokenizer as qwen2_vl's) holds transformers' pixel_values and
// image_grid_thw, get_rope_index's M-RoPE positions, the vision tower's output and the logits.
// Its tower attends within windows of 2x2 merged patches in block 0 (the 4x6-patch image is cut
// into a whole window and one cut at its right edge) and within each image in block 1.
//
// Tolerance: fp32 1e-4 (max abs difference; logits at real tokens). The fixture's metadata records
// what the plausible mistakes move the logits by: window attention ignored 3.5, windows of one
// merged patch 5.1, vision attention across images 4.6, 1-D text positions 3.8, mrope_section
// ignored 0.11.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "engine_kernels/cpu_kernels_switch.h"
#include "qwen2_5_vl_vision.h"
#include "qwen2_vl_model.h"
#include "qwen2_vl_positions.h"
#include "qwen_vl_fixture.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;

using testing_support::QwenVlFixture;
using Fixture = QwenVlFixture;

Fixture LoadQwen25VlFixture() { return testing_support::LoadQwenVlFixture("qwen2_5_vl"); }

TEST(Qwen25VlModelTest, ConfigIsReadFromTheCheckpoint) {
  const Fixture f = LoadQwen25VlFixture();
  EXPECT_EQ(f.config.model_type(), "qwen2_5_vl");
  EXPECT_EQ(f.config.vision.family, VisionFamily::kQwen25Vl);
  EXPECT_EQ(f.config.vision.embed_dim, 32);
  EXPECT_EQ(f.config.vision.intermediate_size, 48);
  EXPECT_EQ(f.config.vision.window_size, 56);
  EXPECT_EQ(f.config.vision.fullatt_block_indexes, (std::vector<int64_t>{1}));
  EXPECT_EQ(f.config.vision.hidden_act, Activation::kSilu);
  EXPECT_EQ(f.config.text.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  // Written back in transformers 4's flat layout, it reads as the same model.
  const nlohmann::json written = f.config.ToJson("float32");
  EXPECT_EQ(written["architectures"][0], "Qwen2_5_VLForConditionalGeneration");
  EXPECT_EQ(written["vision_config"]["out_hidden_size"], 32);
  auto again = Qwen2VlConfigFromJson(written, "written");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->ToJson("float32"), written);
}

// get_vision_window_index on the fixture's first image (4x6 patches: 2x3 merged, windows of 2x2
// merged): a whole window, then the one cut at the right edge.
TEST(Qwen25VlModelTest, WindowsAreTransformersWindows) {
  const VisionWindows windows = QwenVisionWindows({ImageGrid{1, 4, 6}, ImageGrid{1, 2, 4}}, 2, 2);
  EXPECT_TRUE(at::equal(windows.order, at::tensor({0, 1, 3, 4, 2, 5, 6, 7}, at::kLong)));
  EXPECT_EQ(windows.lengths, (std::vector<int64_t>{16, 8, 8}));
}

// Through the engine's attention kernel (one key range per window or image) and through ATen's
// products (ENGINE_CPU_KERNELS=0).
TEST(Qwen25VlModelTest, VisionTowerEqualsTransformers) {
  const Fixture f = LoadQwen25VlFixture();
  at::NoGradGuard no_grad;
  const at::Tensor expected = f.Get("image_features");
  for (bool kernels : {true, false}) {
    if (!kernels) setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
    const at::Tensor features = f.module->visual->forward(f.Get("pixel_values"), f.Grids());
    ASSERT_EQ(features.sizes(), expected.sizes());
    EXPECT_LE((features - expected).abs().max().item<double>(), 1e-4) << "kernels " << kernels;
    unsetenv(engine::kernels::kCpuKernelsVariable);
  }
}

TEST(Qwen25VlModelTest, MultimodalPositionsEqualGetRopeIndex) {
  const Fixture f = LoadQwen25VlFixture();
  auto positions = ComputeMultimodalPositions(f.Get("input_ids"), f.Get("attention_mask"),
                                              f.RowGrids(), f.config.image_token_id, 2);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  const at::Tensor real = f.Get("attention_mask").to(at::kBool).unsqueeze(0).expand({3, -1, -1});
  EXPECT_TRUE(at::equal(positions->position_ids.masked_select(real),
                        f.Get("mrope_position_ids").masked_select(real)));
}

TEST(Qwen25VlModelTest, LogitsEqualTransformers) {
  const Fixture f = LoadQwen25VlFixture();
  at::NoGradGuard no_grad;
  const at::Tensor mask = f.Get("attention_mask");
  auto hidden = f.module->Hidden(f.Get("input_ids"), mask, f.Get("pixel_values"), f.RowGrids());
  ASSERT_TRUE(hidden.ok()) << hidden.status().message();
  const at::Tensor logits = f.module->lm.Logits(*hidden);
  EXPECT_LE(testing_support::MaxDifferenceAtRealTokens(logits, f.Get("logits"), mask), 1e-4);
}

// Per-block checkpointing and the attention kernel give the plain ATen backward's gradients.
TEST(Qwen25VlModelTest, VisionTowerGradientsAreTheSameThroughCheckpointingAndTheKernel) {
  const Fixture f = LoadQwen25VlFixture();
  f.module->train();
  auto gradients = [&](bool checkpointing, bool kernels) {
    if (!kernels) setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
    f.module->zero_grad();
    f.module->visual->forward(f.Get("pixel_values"), f.Grids(), checkpointing)
        .pow(2)
        .mean()
        .backward();
    unsetenv(engine::kernels::kCpuKernelsVariable);
    std::vector<at::Tensor> grads;
    for (const auto& p : f.module->visual->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto aten = gradients(false, false);
  const auto checkpointed = gradients(true, false);
  const auto with_kernels = gradients(false, true);
  for (size_t i = 0; i < aten.size(); ++i) {
    EXPECT_TRUE(at::equal(aten[i], checkpointed[i])) << "tensor " << i;
    EXPECT_GT(aten[i].abs().sum().item<double>(), 0) << "tensor " << i;
    const double scale = aten[i].abs().max().item<double>();
    EXPECT_LE((with_kernels[i] - aten[i]).abs().max().item<double>(), 1e-5 * std::max(scale, 1e-6))
        << "tensor " << i;
  }
}

TEST(Qwen25VlModelTest, ConfigsThatCannotWorkAreRefusedByKey) {
  auto json = ReadConfigJson(testing_support::FixtureDir("qwen2_5_vl"));
  ASSERT_TRUE(json.ok());
  struct Case {
    std::string key;  // a/b: a's b
    nlohmann::json value;
    std::string message;
  };
  for (const Case& c :
       {Case{"vision_config/window_size", 100,
             "vision window_size 100 is not a multiple of the merged patch (patch_size x "
             "spatial_merge_size = 28 pixels)"},
        Case{"vision_config/fullatt_block_indexes",
             {1, 2},
             "'fullatt_block_indexes' holds 2, not a block of the tower (0 to depth - 1 = 1)"},
        Case{"vision_config/model_type", "qwen3_vl_vision",
             "'model_type' is \"qwen3_vl_vision\", not the vision config of qwen2_5_vl"},
        Case{"vision_config/out_hidden_size", 48,
             "vision_config.out_hidden_size 48 (the merger's output) is not the decoder's "
             "hidden_size 32"},
        Case{"vision_config/mlp_ratio", 4,
             "'mlp_ratio' (4) is not supported by this engine's Qwen2.5-VL vision tower"},
        Case{"vision_config/deepstack_visual_indexes",
             {0},
             "'deepstack_visual_indexes' ([0]) is not supported by this engine's Qwen2.5-VL"},
        Case{"text_config/model_type", "qwen2_vl_text",
             "text_config.model_type is \"qwen2_vl_text\", not the text config of qwen2_5_vl"}}) {
    SCOPED_TRACE(c.key);
    nlohmann::json changed = *json;
    const auto slash = c.key.find('/');
    changed[c.key.substr(0, slash)][c.key.substr(slash + 1)] = c.value;
    auto config = Qwen2VlConfigFromJson(changed, "config.json");
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
  // The hub's Qwen2.5-VL configs carry in_chans and spatial_patch_size beside what transformers
  // reads.
  nlohmann::json hub = *json;
  hub["vision_config"]["in_chans"] = 3;
  hub["vision_config"]["spatial_patch_size"] = 14;
  EXPECT_TRUE(Qwen2VlConfigFromJson(hub, "config.json").ok());
}

}  // namespace
}  // namespace engine::transformer
