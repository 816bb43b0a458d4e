// Qwen3-VL computes what transformers computes: the qwen3_vl fixture (tests/fixtures/hf/
// qwen2_vl_fixture.py; a tiny random Qwen3VLForConditionalGeneration saved by save_pretrained, the
// same images, texts and tokenizer as qwen2_vl's, patches of 16 pixels) holds transformers'
// pixel_values and image_grid_thw, get_rope_index's M-RoPE positions, the vision tower's merged
// output, the DeepStack mergers' outputs and the logits. Its tower has learned positions on a 3x3
// grid (resampled to each image's grid), DeepStack mergers after blocks 0 and 1 feeding decoder
// layers 0 and 1 of 3; the decoder is Qwen3's (q/k norms, head_dim 16) with interleaved rotary
// bands 4/2/2.
//
// Tolerance: fp32 1e-4 (max abs difference; logits at real tokens). The fixture's metadata records
// what the plausible mistakes move the logits by: DeepStack ignored 1.0, the rotary bands in
// blocks (Qwen2-VL's layout) 0.93, learned positions resampled without aligned corners 2.3,
// mrope_section ignored 0.89, vision attention across images 4.4, 1-D text positions 3.4.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "engine/precision_context.h"
#include "engine_kernels/cpu_kernels_switch.h"
#include "qwen2_vl_positions.h"
#include "qwen3_vl_vision.h"
#include "qwen_vl_fixture.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;
using testing_support::LoadQwenVlFixture;
using testing_support::MaxDifferenceAtRealTokens;
using testing_support::QwenVlFixture;

QwenVlFixture LoadQwen3VlFixture() { return LoadQwenVlFixture("qwen3_vl"); }

// Runs `body` through the engine's attention kernel and through ATen's products
// (ENGINE_CPU_KERNELS=0).
template <typename Body>
void WithAndWithoutKernels(Body body) {
  for (bool kernels : {true, false}) {
    SCOPED_TRACE(kernels ? "engine kernels" : "ATen");
    if (!kernels) setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
    body();
    unsetenv(engine::kernels::kCpuKernelsVariable);
  }
}

TEST(Qwen3VlModelTest, ConfigIsReadFromTheCheckpoint) {
  const QwenVlFixture f = LoadQwen3VlFixture();
  EXPECT_EQ(f.config.model_type(), "qwen3_vl");
  EXPECT_EQ(f.config.vision.family, VisionFamily::kQwen3Vl);
  EXPECT_EQ(f.config.vision.embed_dim, 32);
  EXPECT_EQ(f.config.vision.intermediate_size, 48);
  EXPECT_EQ(f.config.vision.patch_size, 16);
  EXPECT_EQ(f.config.vision.num_position_embeddings, 9);
  EXPECT_EQ(f.config.vision.deepstack_visual_indexes, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(f.config.vision.hidden_act, Activation::kGeluTanh);
  EXPECT_TRUE(f.config.text.qk_norm);
  EXPECT_TRUE(f.config.text.mrope_interleaved);
  EXPECT_EQ(f.config.text.mrope_section, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(f.config.text.head_dim(), 16);
  EXPECT_FALSE(f.config.text.tie_word_embeddings);
  // Written back in transformers 5's layout (Qwen3VLConfig reads no other), it reads as the same
  // model.
  const nlohmann::json written = f.config.ToJson("float32");
  EXPECT_EQ(written["architectures"][0], "Qwen3VLForConditionalGeneration");
  EXPECT_EQ(written["text_config"]["model_type"], "qwen3_vl_text");
  EXPECT_EQ(written["text_config"]["rope_parameters"]["mrope_section"], nlohmann::json({4, 2, 2}));
  EXPECT_EQ(written["text_config"]["head_dim"], 16);
  EXPECT_FALSE(written.contains("hidden_size"));
  EXPECT_EQ(written["vision_config"]["deepstack_visual_indexes"], nlohmann::json({0, 1}));
  auto again = Qwen2VlConfigFromJson(written, "written");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->ToJson("float32"), written);
}

// The module's tensors have the checkpoint's names, transformers 5's: nothing is renamed on the
// way in or out.
TEST(Qwen3VlModelTest, TensorsHaveTheCheckpointsNames) {
  const QwenVlFixture f = LoadQwen3VlFixture();
  std::set<std::string> names;
  for (const auto& p : f.module->named_parameters()) names.insert(p.key());
  for (const char* name :
       {"model.language_model.layers.2.self_attn.k_norm.weight",
        "model.language_model.embed_tokens.weight", "model.visual.patch_embed.proj.bias",
        "model.visual.pos_embed.weight", "model.visual.blocks.2.mlp.linear_fc2.weight",
        "model.visual.merger.norm.weight", "model.visual.deepstack_merger_list.1.norm.weight",
        "lm_head.weight"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  EXPECT_EQ(f.module->visual->named_parameters()["merger.norm.weight"].numel(), 32);
  EXPECT_EQ(f.module->visual->named_parameters()["deepstack_merger_list.0.norm.weight"].numel(),
            128);
}

// transformers' fast_pos_embed_interpolate on the fixture's table for a 2x4 grid: bilinear with
// aligned corners, then each 2x2 group together.
TEST(Qwen3VlModelTest, LearnedPositionsAreResampledWithAlignedCorners) {
  const at::Tensor table = at::arange(9, at::kFloat).reshape({9, 1});  // value = row * 3 + column
  const at::Tensor positions = InterpolatedPositions(table, {ImageGrid{1, 2, 4}}, 2).flatten();
  // Rows 0 and 2 of the table; columns 0, 2/3, 4/3, 2 of it. Merged order: the 2x2 groups.
  const std::vector<float> raster = {0, 2.f / 3, 4.f / 3, 2, 6, 6 + 2.f / 3, 6 + 4.f / 3, 8};
  const std::vector<int> merged_order = {0, 1, 4, 5, 2, 3, 6, 7};
  for (size_t i = 0; i < merged_order.size(); ++i) {
    EXPECT_NEAR(positions[static_cast<int64_t>(i)].item<float>(), raster[merged_order[i]], 1e-6)
        << i;
  }
}

TEST(Qwen3VlModelTest, VisionTowerAndDeepStackEqualTransformers) {
  const QwenVlFixture f = LoadQwen3VlFixture();
  at::NoGradGuard no_grad;
  const at::Tensor merged = f.Get("image_features"), deepstack = f.Get("deepstack_features");
  WithAndWithoutKernels([&] {
    const VisionTokens tokens = f.module->visual->Features(f.Get("pixel_values"), f.Grids());
    ASSERT_EQ(tokens.merged.sizes(), merged.sizes());
    EXPECT_LE((tokens.merged - merged).abs().max().item<double>(), 1e-4);
    ASSERT_EQ(tokens.deepstack.size(), 2u);
    for (int64_t k = 0; k < 2; ++k) {
      EXPECT_LE(
          (tokens.deepstack[static_cast<size_t>(k)] - deepstack[k]).abs().max().item<double>(),
          1e-4)
          << "DeepStack layer " << k;
    }
  });
}

TEST(Qwen3VlModelTest, MultimodalPositionsEqualGetRopeIndex) {
  const QwenVlFixture f = LoadQwen3VlFixture();
  auto positions = ComputeMultimodalPositions(f.Get("input_ids"), f.Get("attention_mask"),
                                              f.RowGrids(), f.config.image_token_id, 2);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  const at::Tensor real = f.Get("attention_mask").to(at::kBool).unsqueeze(0).expand({3, -1, -1});
  EXPECT_TRUE(at::equal(positions->position_ids.masked_select(real),
                        f.Get("mrope_position_ids").masked_select(real)));
}

TEST(Qwen3VlModelTest, LogitsEqualTransformers) {
  const QwenVlFixture f = LoadQwen3VlFixture();
  at::NoGradGuard no_grad;
  const at::Tensor mask = f.Get("attention_mask");
  WithAndWithoutKernels([&] {
    auto hidden = f.module->Hidden(f.Get("input_ids"), mask, f.Get("pixel_values"), f.RowGrids());
    ASSERT_TRUE(hidden.ok()) << hidden.status().message();
    EXPECT_LE(MaxDifferenceAtRealTokens(f.module->lm.Logits(*hidden), f.Get("logits"), mask), 1e-4);
  });
}

// Each row's DeepStack features land at its own image tokens: row 1 (two images) alone computes
// what it computes in the batch.
TEST(Qwen3VlModelTest, ARowAloneComputesWhatItComputesInTheBatch) {
  const QwenVlFixture f = LoadQwen3VlFixture();
  at::NoGradGuard no_grad;
  const at::Tensor mask = f.Get("attention_mask");
  auto batch = f.module->Hidden(f.Get("input_ids"), mask, f.Get("pixel_values"), f.RowGrids());
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  const auto grids = f.Grids();
  const int64_t first = grids[0].patches(), patches = grids[1].patches() + grids[2].patches();
  auto alone =
      f.module->Hidden(f.Get("input_ids").narrow(0, 1, 1), mask.narrow(0, 1, 1),
                       f.Get("pixel_values").narrow(0, first, patches), {{grids[1], grids[2]}});
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  EXPECT_LE(
      MaxDifferenceAtRealTokens(f.module->lm.Logits(*alone),
                                f.module->lm.Logits(*batch).narrow(0, 1, 1), mask.narrow(0, 1, 1)),
      1e-5);
}

// Per-block checkpointing gives the plain backward's gradients, DeepStack mergers and learned
// positions included, in f32 and under bf16 autocast.
TEST(Qwen3VlModelTest, GradientsReachEveryVisionTensorThroughCheckpointing) {
  const QwenVlFixture f = LoadQwen3VlFixture();
  f.module->train();
  const auto names = f.module->visual->named_parameters().keys();
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    auto gradients = [&](bool checkpointing) {
      f.module->zero_grad();
      auto scope = bf16 ? PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter()
                        : PrecisionContext::None().Enter();
      auto hidden = f.module->Hidden(f.Get("input_ids"), f.Get("attention_mask"),
                                     f.Get("pixel_values"), f.RowGrids(), checkpointing);
      EXPECT_TRUE(hidden.ok());
      f.module->lm.Logits(*hidden).to(at::kFloat).pow(2).mean().backward();
      std::vector<at::Tensor> grads;
      for (const auto& p : f.module->visual->parameters()) grads.push_back(p.grad().clone());
      return grads;
    };
    const auto plain = gradients(false);
    const auto checkpointed = gradients(true);
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(at::equal(plain[i], checkpointed[i])) << names[i];
      EXPECT_GT(plain[i].abs().sum().item<double>(), 0) << names[i];
    }
  }
}

TEST(Qwen3VlModelTest, ConfigsThatCannotWorkAreRefusedByKey) {
  auto json = ReadConfigJson(testing_support::FixtureDir("qwen3_vl"));
  ASSERT_TRUE(json.ok());
  struct Case {
    std::string key;  // a/b: a's b; a/b/c: a's b's c
    nlohmann::json value;
    std::string message;
  };
  for (const Case& c :
       {Case{"vision_config/deepstack_visual_indexes",
             {0, 3},
             "'deepstack_visual_indexes' holds 3, not a block of the tower (0 to depth - 1 = 2)"},
        Case{"vision_config/deepstack_visual_indexes",
             {1, 1},
             "'deepstack_visual_indexes' holds block 1 twice"},
        Case{
            "text_config/num_hidden_layers", 1,
            "vision_config.deepstack_visual_indexes feeds 2 decoder layers, but the decoder has 1"},
        Case{"vision_config/depth", 5000,
             "vision sizes above the largest this loader builds (hidden_size 65536, "
             "out_hidden_size 131072, intermediate_size 262144, depth 1024"},
        Case{"vision_config/num_position_embeddings", 4194304,
             "vision num_position_embeddings must be 1 to 1,048,576, not 4194304"},
        Case{"vision_config/num_position_embeddings", 10,
             "vision num_position_embeddings 10 is not a square grid of positions"},
        Case{"vision_config/model_type", "qwen2_5_vl",
             "'model_type' is \"qwen2_5_vl\", not the vision config of qwen3_vl"},
        Case{"text_config/model_type", "qwen2_vl_text",
             "text_config.model_type is \"qwen2_vl_text\", not the text config of qwen3_vl"},
        Case{"vision_config/out_hidden_size", 48,
             "vision_config.out_hidden_size 48 (the merger's output) is not the decoder's "
             "hidden_size 32"},
        Case{"vision_config/window_size", 64,
             "'window_size' (64) is not supported by this engine's Qwen3-VL vision tower"},
        Case{"text_config/rope_parameters/mrope_interleaved", false,
             "rope_parameters.mrope_interleaved is false, but transformers' qwen3_vl always "
             "interleaves the rotary bands"},
        Case{"rope_theta", 1000,
             "'rope_theta' is at the top level, where transformers' "
             "Qwen3VLConfig does not read it"},
        Case{"text_config/sliding_window", 8,
             "'sliding_window' is 8, but transformers' qwen3_vl has no sliding window"}}) {
    SCOPED_TRACE(c.key);
    nlohmann::json changed = *json;
    nlohmann::json* at = &changed;
    size_t start = 0;
    for (size_t slash; (slash = c.key.find('/', start)) != std::string::npos; start = slash + 1) {
      at = &(*at)[c.key.substr(start, slash - start)];
    }
    (*at)[c.key.substr(start)] = c.value;
    auto config = Qwen2VlConfigFromJson(changed, "config.json");
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
  nlohmann::json moe = *json;
  moe["model_type"] = "qwen3_vl_moe";
  moe["text_config"]["model_type"] = "qwen3_vl_moe_text";
  auto refused = Qwen2VlConfigFromJson(moe, "config.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("Qwen3-VL's mixture-of-experts variant"));
}

// transformers' Qwen3-VL ties its head as the top-level tie_word_embeddings says; text_config's is
// not read (the hub's configs repeat it there). Keys left out take Qwen3VLTextConfig's defaults:
// bands 24/20/20, rope_theta 500000, head_dim 128. The decoder is read from text_config only.
TEST(Qwen3VlModelTest, TheTopLevelTieAndLeftOutKeysAreTransformers) {
  auto json = ReadConfigJson(testing_support::FixtureDir("qwen3_vl"));
  ASSERT_TRUE(json.ok());
  nlohmann::json changed = *json;
  changed["text_config"]["tie_word_embeddings"] = true;
  changed.erase("tie_word_embeddings");
  auto untied = Qwen2VlConfigFromJson(changed, "config.json");
  ASSERT_TRUE(untied.ok()) << untied.status().message();
  EXPECT_FALSE(untied->text.tie_word_embeddings);
  changed["tie_word_embeddings"] = true;
  auto tied = Qwen2VlConfigFromJson(changed, "config.json");
  ASSERT_TRUE(tied.ok()) << tied.status().message();
  EXPECT_TRUE(tied->text.tie_word_embeddings);

  nlohmann::json wide = *json;
  wide["text_config"]["head_dim"] = 128;
  wide["text_config"]["rope_parameters"].erase("mrope_section");
  auto defaults = Qwen2VlConfigFromJson(wide, "config.json");
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(defaults->text.mrope_section, (std::vector<int64_t>{24, 20, 20}));

  nlohmann::json sparse = *json;
  sparse["text_config"].erase("head_dim");
  sparse["text_config"]["num_attention_heads"] = 2;  // 128 x 2 heads: not hidden_size / heads
  sparse["text_config"]["num_key_value_heads"] = 1;
  sparse["text_config"]["rope_parameters"].erase("rope_theta");
  sparse["text_config"]["rope_parameters"].erase("mrope_section");
  auto left_out = Qwen2VlConfigFromJson(sparse, "config.json");
  ASSERT_TRUE(left_out.ok()) << left_out.status().message();
  EXPECT_EQ(left_out->text.head_dim(), 128);
  EXPECT_EQ(left_out->text.rope_theta, 500000);

  nlohmann::json flat = *json;
  flat.erase("text_config");
  auto refused = Qwen2VlConfigFromJson(flat, "config.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("'text_config' is missing (transformers' Qwen3VLConfig reads the decoder "
                        "only from it)"));
}

}  // namespace
}  // namespace engine::transformer
