// Qwen2-VL computes what transformers computes: the qwen2_vl fixture (tests/fixtures/hf/
// qwen2_vl_fixture.py; a tiny random Qwen2VLForConditionalGeneration saved by save_pretrained)
// holds transformers' own pixel_values and image_grid_thw for four real images, get_rope_index's
// M-RoPE positions, the vision tower's output and the logits for three conversations (one with
// two images, right padding). The module is loaded from the fixture's directory by name.
//
// Tolerance: fp32 1e-4 (max abs difference; logits at real tokens). The fixture's metadata records
// what the plausible mistakes move the logits by: vision attention across images 4.2, 1-D text
// positions 4.0, mrope_section ignored 0.35.
#include "qwen2_vl_model.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "engine/precision_context.h"
#include "engine/safetensors.h"
#include "engine_kernels/cpu_kernels_switch.h"
#include "hf_checkpoint.h"
#include "qwen2_vl_positions.h"
#include "qwen_vl_fixture.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kFixture = testing_support::FixtureDir("qwen2_vl");

using testing_support::MaxDifferenceAtRealTokens;
using Fixture = testing_support::QwenVlFixture;

Fixture LoadQwen2VlFixture() { return testing_support::LoadQwenVlFixture("qwen2_vl"); }

TEST(Qwen2VlModelTest, ConfigIsReadFromTheCheckpoint) {
  const Fixture f = LoadQwen2VlFixture();
  // The checkpoint has no bos; the config written back says so rather than leaving transformers
  // its class default (151643, outside this vocabulary).
  const nlohmann::json written = f.config.ToJson("float32");
  ASSERT_TRUE(written.contains("bos_token_id"));
  EXPECT_TRUE(written["bos_token_id"].is_null());
  EXPECT_EQ(f.config.vision.depth, 2);
  EXPECT_EQ(f.config.vision.embed_dim, 32);
  EXPECT_EQ(f.config.vision.hidden_act, Activation::kQuickGelu);
  EXPECT_EQ(f.config.image_token_id, 264);
  EXPECT_EQ(f.config.text.mrope_section, (std::vector<int64_t>{2, 1, 1}));
}

// Through the engine's attention kernel (one key range per frame) and through ATen's products
// (ENGINE_CPU_KERNELS=0: batched for frames of one size, frame by frame otherwise).
TEST(Qwen2VlModelTest, VisionTowerEqualsTransformers) {
  const Fixture f = LoadQwen2VlFixture();
  at::NoGradGuard no_grad;
  const std::vector<ImageGrid> grids = f.Grids();
  const at::Tensor expected = f.Get("image_features");
  for (bool kernels : {true, false}) {
    if (!kernels) setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
    const at::Tensor features = f.module->visual->forward(f.Get("pixel_values"), grids);
    ASSERT_EQ(features.sizes(), expected.sizes());
    EXPECT_LE((features - expected).abs().max().item<double>(), 1e-4) << "kernels " << kernels;
    // Images of one size (the camera and the logo, 4x4 patches each): the same features.
    const at::Tensor same_size =
        f.module->visual->forward(f.Get("pixel_values").narrow(0, 32, 32), {grids[2], grids[3]});
    EXPECT_LE((same_size - expected.narrow(0, 8, 8)).abs().max().item<double>(), 1e-4)
        << "kernels " << kernels;
    // One attention over every image's patches is another model.
    const at::Tensor one_block =
        f.module->visual->forward(f.Get("pixel_values"), {ImageGrid{1, 8, 8}});
    EXPECT_GT((one_block - expected).abs().max().item<double>(), 1e-2) << "kernels " << kernels;
    unsetenv(engine::kernels::kCpuKernelsVariable);
  }
}

TEST(Qwen2VlModelTest, MultimodalPositionsEqualGetRopeIndex) {
  const Fixture f = LoadQwen2VlFixture();
  auto positions = ComputeMultimodalPositions(f.Get("input_ids"), f.Get("attention_mask"),
                                              f.RowGrids(), f.config.image_token_id, 2);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  // At the real tokens: what padding holds is never read (transformers 4.51 wrote 1 there, 5.17
  // writes 0).
  const at::Tensor real = f.Get("attention_mask").to(at::kBool).unsqueeze(0).expand({3, -1, -1});
  EXPECT_TRUE(at::equal(positions->position_ids.masked_select(real),
                        f.Get("mrope_position_ids").masked_select(real)));
  const at::Tensor expected_next = f.Get("mrope_position_ids").amax({0, 2}) + 1;
  for (size_t row = 0; row < positions->next.size(); ++row) {
    EXPECT_EQ(positions->next[row], expected_next[static_cast<int64_t>(row)].item<int64_t>());
  }
}

TEST(Qwen2VlModelTest, LogitsEqualTransformers) {
  const Fixture f = LoadQwen2VlFixture();
  at::NoGradGuard no_grad;
  const at::Tensor mask = f.Get("attention_mask");
  auto hidden = f.module->Hidden(f.Get("input_ids"), mask, f.Get("pixel_values"), f.RowGrids());
  ASSERT_TRUE(hidden.ok()) << hidden.status().message();
  const at::Tensor logits = f.module->lm.Logits(*hidden);
  EXPECT_LE(MaxDifferenceAtRealTokens(logits, f.Get("logits"), mask), 1e-4);
}

TEST(Qwen2VlModelTest, PackedExamplesCountTheirPositionsFromZeroAsAlone) {
  // Rows 0 and 2 of the fixture back to back in one row, the mask numbering them 1 and 2: each
  // gets the positions get_rope_index gave it alone.
  const Fixture f = LoadQwen2VlFixture();
  const at::Tensor ids = f.Get("input_ids"), mask = f.Get("attention_mask");
  const at::Tensor reference = f.Get("mrope_position_ids");
  std::vector<at::Tensor> packed_ids, packed_mask, expected;
  for (int64_t row : {0, 2}) {
    const at::Tensor real = mask[row].to(at::kBool);
    packed_ids.push_back(ids[row].masked_select(real));
    packed_mask.push_back(at::full({real.sum().item<int64_t>()}, row == 0 ? 1 : 2, at::kLong));
    expected.push_back(reference.select(1, row).masked_select(real.unsqueeze(0)).view({3, -1}));
  }
  const auto grids = f.RowGrids();
  auto positions = ComputeMultimodalPositions(
      at::cat(packed_ids).unsqueeze(0), at::cat(packed_mask).unsqueeze(0),
      {{grids[0][0], grids[2][0]}}, f.config.image_token_id, 2);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  EXPECT_TRUE(at::equal(positions->position_ids.select(1, 0), at::cat(expected, 1)));
}

// Gradients with per-block checkpointing equal the plain backward, in f32 and under bf16 autocast
// (where LayerNorm meets bf16 activations and f32 weights).
TEST(Qwen2VlModelTest, VisionTowerCheckpointingGivesTheSameGradientsInF32AndBf16) {
  const Fixture f = LoadQwen2VlFixture();
  f.module->train();
  const std::vector<ImageGrid> grids = f.Grids();
  for (bool bf16 : {false, true}) {
    auto gradients = [&](bool checkpointing) {
      f.module->zero_grad();
      auto scope = bf16 ? PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter()
                        : PrecisionContext::None().Enter();
      f.module->visual->forward(f.Get("pixel_values"), grids, checkpointing)
          .to(at::kFloat)
          .pow(2)
          .mean()
          .backward();
      std::vector<at::Tensor> grads;
      for (const auto& p : f.module->visual->parameters()) grads.push_back(p.grad().clone());
      return grads;
    };
    const auto plain = gradients(false);
    const auto checkpointed = gradients(true);
    ASSERT_EQ(plain.size(), checkpointed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(at::equal(plain[i], checkpointed[i])) << "bf16=" << bf16 << " tensor " << i;
      EXPECT_GT(plain[i].abs().sum().item<double>(), 0) << "bf16=" << bf16 << " tensor " << i;
    }
  }
}

// The kernel's frames (keys after the query as well as before) give ATen's gradients.
TEST(Qwen2VlModelTest, VisionTowerKernelGradientsEqualTheAtenPath) {
  const Fixture f = LoadQwen2VlFixture();
  f.module->train();
  const std::vector<ImageGrid> grids = f.Grids();
  auto gradients = [&](bool kernels) {
    if (!kernels) setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
    f.module->zero_grad();
    f.module->visual->forward(f.Get("pixel_values"), grids).pow(2).mean().backward();
    unsetenv(engine::kernels::kCpuKernelsVariable);
    std::vector<at::Tensor> grads;
    for (const auto& p : f.module->visual->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto with_kernels = gradients(true), aten = gradients(false);
  for (size_t i = 0; i < aten.size(); ++i) {
    const double scale = aten[i].abs().max().item<double>();
    EXPECT_LE((with_kernels[i] - aten[i]).abs().max().item<double>(), 1e-5 * std::max(scale, 1e-6))
        << "tensor " << i;
  }
}

TEST(Qwen2VlModelTest, ImageTokensThatDoNotMatchTheImagesAreErrors) {
  const Fixture f = LoadQwen2VlFixture();
  at::NoGradGuard no_grad;
  auto grids = f.RowGrids();
  grids[1].pop_back();
  auto hidden =
      f.module->Hidden(f.Get("input_ids"), f.Get("attention_mask"), f.Get("pixel_values"), grids);
  ASSERT_FALSE(hidden.ok());
  EXPECT_THAT(hidden.status().message(),
              HasSubstr("the batch has 16 image tokens but its 3 image(s) give 12"));
  auto swapped = f.RowGrids();
  std::swap(swapped[0], swapped[2]);
  auto positions = ComputeMultimodalPositions(f.Get("input_ids"), f.Get("attention_mask"), swapped,
                                              f.config.image_token_id, 2);
  ASSERT_FALSE(positions.ok());
  EXPECT_THAT(positions.status().message(),
              HasSubstr("row 0: image 1 has 6 image tokens where its 1x4x4 patches need 4"));
}

// transformers 5 names the tensors model.language_model.* and model.visual.*: a directory in that
// layout loads into the same model.
TEST(Qwen2VlModelTest, TransformersFiveTensorNamesLoadTheSameModel) {
  const Fixture f = LoadQwen2VlFixture();
  testing::TempDir dir;
  std::filesystem::copy_file(kFixture / "config.json", dir.path() / "config.json");
  auto weights = safetensors::File::Open(kFixture / "model.safetensors");
  ASSERT_TRUE(weights.ok());
  safetensors::NamedTensors renamed;
  for (const auto& info : (*weights)->tensors()) {
    std::string name = info.name;
    if (name.rfind("model.", 0) == 0) name = "model.language_model." + name.substr(6);
    if (name.rfind("visual.", 0) == 0) name = "model." + name;
    renamed.emplace_back(name, *(*weights)->Get(info.name));
  }
  ASSERT_TRUE(safetensors::Write(dir.path() / "model.safetensors", renamed).ok());
  Qwen2VlModule module(f.config);
  Status loaded = LoadWeights(dir.path(), module, {}, nullptr, Qwen2VlTransformers5Names());
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  for (const auto& p : f.module->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), module.named_parameters()[p.key()])) << p.key();
  }
}

// transformers 5 nests the language model's keys under text_config, with rope_parameters (the
// fixture's layout); transformers 4 wrote them flat, with rope_theta and rope_scaling.
TEST(Qwen2VlModelTest, TheFlatLayoutOfTransformers4ReadsAsTheNestedOne) {
  auto nested = ReadConfigJson(kFixture);
  ASSERT_TRUE(nested.ok());
  nlohmann::json flat;
  for (const auto& [key, value] : nested->items()) {
    if (key != "text_config") flat[key] = value;
  }
  for (const auto& [key, value] : (*nested)["text_config"].items()) {
    if (key != "model_type" && key != "rope_parameters") flat[key] = value;
  }
  const nlohmann::json& rope = (*nested)["text_config"]["rope_parameters"];
  flat["rope_theta"] = rope["rope_theta"];
  flat["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", rope["mrope_section"]}};
  auto from_flat = Qwen2VlConfigFromJson(flat, "flat");
  auto from_nested = Qwen2VlConfigFromJson(*nested, "nested");
  ASSERT_TRUE(from_flat.ok()) << from_flat.status().message();
  ASSERT_TRUE(from_nested.ok()) << from_nested.status().message();
  EXPECT_EQ(from_nested->ToJson("float32"), from_flat->ToJson("float32"));
  (*nested)["text_config"]["hidden_size"] = 64;
  (*nested)["hidden_size"] = 32;
  EXPECT_THAT(Qwen2VlConfigFromJson(*nested, "c").status().message(),
              HasSubstr("'hidden_size' is 32 but text_config.hidden_size is 64"));
}

TEST(Qwen2VlModelTest, ConfigKeysAreReadOrRefusedByName) {
  auto json = ReadConfigJson(kFixture);
  ASSERT_TRUE(json.ok());
  struct Case {
    std::string key;  // a/b: vision_config's b
    nlohmann::json value;
    std::string message;
  };
  for (const Case& c :
       {Case{"vision_config/hidden_size", 48,
             "vision_config.hidden_size 48 (the merger's output) is not the decoder's hidden_size "
             "32"},
        Case{"vision_config/in_chans", 4, "'in_chans' is 4 but the model reads 3 (in_channels)"},
        Case{"vision_config/window_size", 112,
             "'window_size' (112) is not supported by this engine's Qwen2-VL vision tower"},
        Case{"vision_config/hidden_act", "tanh", "'hidden_act' \"tanh\" is not supported"},
        Case{"vision_config/rope_parameters",
             {{"rope_type", "mrope"}},
             "rope_type \"mrope\" is not supported by this engine's vision towers "
             "(supported: axial)"},
        Case{"vision_config/rope_parameters",
             {{"rope_type", "axial"}, {"factor", 2}},
             "'rope_parameters' .factor (2) is not read"},
        Case{"image_token_id", 999, "'image_token_id' must be a token id below vocab_size 272"}}) {
    SCOPED_TRACE(c.key);
    nlohmann::json changed = *json;
    const auto slash = c.key.find('/');
    if (slash == std::string::npos) {
      changed[c.key] = c.value;
    } else {
      changed[c.key.substr(0, slash)][c.key.substr(slash + 1)] = c.value;
    }
    auto config = Qwen2VlConfigFromJson(changed, "config.json");
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
  // Qwen2.5-VL's model_type over Qwen2-VL's parts: another family's text and vision configs.
  nlohmann::json qwen25 = *json;
  qwen25["model_type"] = "qwen2_5_vl";
  EXPECT_THAT(Qwen2VlConfigFromJson(qwen25, "config.json").status().message(),
              HasSubstr("text_config.model_type is \"qwen2_vl_text\", not the text config of "
                        "qwen2_5_vl (qwen2_5_vl_text)"));
  qwen25["text_config"]["model_type"] = "qwen2_5_vl_text";
  EXPECT_THAT(
      Qwen2VlConfigFromJson(qwen25, "config.json").status().message(),
      HasSubstr("'model_type' is \"qwen2_vl_vision\", not the vision config of qwen2_5_vl"));
  // The vision rotary's base, as transformers 5 writes it, is the one the tower computes with.
  nlohmann::json theta = *json;
  theta["vision_config"]["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", 500.0}};
  auto with_theta = Qwen2VlConfigFromJson(theta, "config.json");
  ASSERT_TRUE(with_theta.ok()) << with_theta.status().message();
  EXPECT_EQ(with_theta->vision.rope_theta, 500.0);
  EXPECT_EQ(with_theta->vision.ToJson()["rope_parameters"]["rope_theta"], 500.0);
  // The hub's own extra keys, which transformers keeps without reading, are accepted.
  nlohmann::json hub = *json;
  hub["vision_token_id"] = 264;
  hub["vision_config"]["in_chans"] = 3;
  hub["vision_config"]["spatial_patch_size"] = 14;
  EXPECT_TRUE(Qwen2VlConfigFromJson(hub, "config.json").ok());
}

}  // namespace
}  // namespace engine::transformer
