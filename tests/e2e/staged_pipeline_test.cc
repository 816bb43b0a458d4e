// Stages handing checkpoints to stages through `engine run`: a dense parent quantized to NF4 on the
// fly under new LoRA adapters, a `vlm` starting from a `llama` language model (new_tensors), a
// parent's LoRA adapters merged into the base, and adapters with nowhere to go refused by
// `engine check` at the field's position.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/safetensors.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

// A tiny vlm stage on the digit captions; `extra` adds fields.
std::string VlmStage(const std::string& name, const std::string& extra) {
  return "stage {\n  name: \"" + name +
         "\"\n  model { plugin: \"vlm\" options { [type.googleapis.com/engine.transformer."
         "VlmOptions] { vision { patch_size: 4 hidden_size: 16 num_layers: 1 num_heads: 2 } "
         "decoder { hidden_size: 32 num_hidden_layers: 1 num_attention_heads: 2 } } } }\n"
         "  data { plugin: \"digits_captions\" options { [type.googleapis.com/engine.plugins."
         "DigitsCaptionsOptions] { path: \"" +
         testing::DigitsDataPath().string() +
         "\" } } }\n"
         "  precision { plugin: \"fp32\" }\n"
         "  schedule { max_steps: 3 batch_size: 16 eval_batch_size: 128 }\n" +
         extra + "\n}\n";
}

const char kNf4[] =
    "  quantizer { plugin: \"nf4\" options { [type.googleapis.com/engine.plugins.Nf4Options] { "
    "target_modules: \"model.layers.*\" } } }\n";
const char kLora[] =
    "  adapter { plugin: \"lora\" options { [type.googleapis.com/engine.plugins.LoraOptions] { "
    "r: 4 lora_alpha: 8 target_modules: \"q_proj\" } } }\n";

at::Tensor Tensor(const std::filesystem::path& file, const std::string& name) {
  auto opened = safetensors::File::Open(file);
  EXPECT_TRUE(opened.ok()) << opened.status().message();
  if (!opened.ok()) return {};
  auto tensor = (*opened)->Get(name);
  EXPECT_TRUE(tensor.ok()) << tensor.status().message();
  return tensor.ok() ? tensor->clone() : at::Tensor();
}

TEST(StagedPipelineTest, ADenseParentIsQuantizedOnTheFlyUnderNewAdapters) {
  testing::TempDir tmp;
  const auto file = tmp.Write(
      "p.pbtxt", "output_dir: \"out\"\n" +
                     VlmStage("vision",
                              "  trainable { include: \"visual.*\" include: "
                              "\"projector.*\" }") +
                     VlmStage("llm", std::string("  from_stage: \"vision\"\n") + kNf4 + kLora +
                                         "  trainable { include: \"*.lora_*\" }"));
  auto r = testing::RunEngine({"run", file.string()}, tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("starts from the final weights of stage 'vision': "));
  EXPECT_THAT(r.out, HasSubstr("7 layers quantized from dense weights, 2 new adapter tensors"));
  const auto vision = tmp.path() / "out/vision/final/model.safetensors";
  const auto llm = tmp.path() / "out/llm/final/model.safetensors";
  // What stage 'llm' did not train is stage 'vision''s, bit for bit.
  for (const std::string name :
       {"visual.patch_embed.weight", "projector.linear_1.weight", "model.embed_tokens.weight"}) {
    EXPECT_TRUE(at::equal(Tensor(vision, name), Tensor(llm, name))) << name;
  }
  // The decoder's projections are NF4 codes now, quantized from stage 'vision''s dense weights.
  const at::Tensor dense = Tensor(vision, "model.layers.0.self_attn.q_proj.weight");
  const at::Tensor packed = Tensor(llm, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(dense.scalar_type(), at::kFloat);
  EXPECT_EQ(packed.scalar_type(), at::kByte);
  EXPECT_EQ(packed.numel() * 2, dense.numel());
  EXPECT_EQ(Tensor(llm, "model.layers.0.self_attn.q_proj.lora_B.weight").size(1), 4);
}

// A language-model warm-up: a `llama` stage on the fortunes, then a `vlm` whose decoder starts
// from it while its vision tower and projector are new.
TEST(StagedPipelineTest, AVlmDecoderStartsFromALlamaStageWithNewTensorsForTheRest) {
  testing::TempDir tmp;
  const std::string lm =
      "stage {\n  name: \"lm\"\n  model { plugin: \"llama\" options { "
      "[type.googleapis.com/engine.transformer.LlamaOptions] { hidden_size: 32 "
      "num_hidden_layers: 1 num_attention_heads: 2 } } }\n"
      "  data { plugin: \"text\" options { [type.googleapis.com/engine.plugins.TextOptions] { "
      "path: \"" +
      testing::FortunesDataPath().string() +
      "\" document_separator: \"%\" sequence_length: 32 max_documents: 200 } } }\n"
      "  precision { plugin: \"fp32\" }\n  schedule { max_steps: 3 batch_size: 8 }\n}\n";
  const std::string frozen_decoder =
      "  trainable { include: \"visual.*\" include: \"projector.*\" }";
  const auto refused =
      tmp.Write("refused.pbtxt", "output_dir: \"out\"\n" + lm +
                                     VlmStage("vision", "  from_stage: \"lm\"\n" + frozen_decoder));
  auto check = testing::RunEngine({"check", refused.string()}, tmp.path().string());
  EXPECT_NE(check.exit_code, 0);
  EXPECT_THAT(check.err, ::testing::ContainsRegex(
                             "refused.pbtxt:[0-9]+:3: error: stage 'vision' starts from stage "
                             "'lm', but their models do not fit: '[a-z_.0-9]+' exists only here "
                             "\\(name the tensors that keep the model's initialisation in "
                             "new_tensors\\)"));

  const auto file =
      tmp.Write("p.pbtxt", "output_dir: \"out\"\n" + lm +
                               VlmStage("vision",
                                        "  from_stage: \"lm\"\n  new_tensors: \"visual.*\"\n"
                                        "  new_tensors: \"projector.*\"\n" +
                                            frozen_decoder));
  auto r = testing::RunEngine({"run", file.string()}, tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "starts from the final weights of stage 'lm' \\(a 'llama' model\\): "
                         "[0-9]+ tensors copied, [0-9]+ new tensors initialised by the model"));
  auto json = testing::RunEngine({"check", "--format=json", file.string()}, tmp.path().string());
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"parent_architecture\": \"llama\""));
  // The frozen decoder is the language model's, bit for bit.
  const auto lm_file = tmp.path() / "out/lm/final/model.safetensors";
  const auto vlm_file = tmp.path() / "out/vision/final/model.safetensors";
  for (const std::string name : {"model.embed_tokens.weight",
                                 "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"}) {
    EXPECT_TRUE(at::equal(Tensor(lm_file, name), Tensor(vlm_file, name))) << name;
  }

  // A decoder of another size does not fit, and the shapes are named.
  std::string wider_vlm =
      VlmStage("vision",
               "  from_stage: \"lm\"\n  new_tensors: \"visual.*\"\n  new_tensors: \"projector.*\"");
  const std::string decoder = "decoder { hidden_size: 32";
  wider_vlm.replace(wider_vlm.find(decoder), decoder.size(), "decoder { hidden_size: 48");
  const auto wider = tmp.Write("wider.pbtxt", "output_dir: \"out\"\n" + lm + wider_vlm);
  check = testing::RunEngine({"check", wider.string()}, tmp.path().string());
  EXPECT_NE(check.exit_code, 0);
  EXPECT_THAT(check.err,
              HasSubstr("'model.embed_tokens.weight' is [259,32] in 'lm' but [259,48] here"));
}

TEST(StagedPipelineTest, AParentsLoraIsMergedIntoTheBaseWhenTheStageSaysSo) {
  testing::TempDir tmp;
  const auto file = tmp.Write(
      "p.pbtxt",
      "output_dir: \"out\"\n" +
          VlmStage("adapted", std::string(kLora) + "  optimizer { adamw {} learning_rate: 0.05 }") +
          VlmStage("merged",
                   "  from_stage: \"adapted\"\n  parent_adapters: MERGE\n"
                   "  trainable { include: \"projector.*\" }"));
  auto r = testing::RunEngine({"run", file.string()}, tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 dense layers loaded, the adapters of 1 layers merged"));
  const auto adapted = tmp.path() / "out/adapted/final/model.safetensors";
  const std::string layer = "model.layers.0.self_attn.q_proj";
  const at::Tensor a = Tensor(adapted, layer + ".lora_A.weight");
  const at::Tensor b = Tensor(adapted, layer + ".lora_B.weight");
  ASSERT_GT(b.abs().max().item<float>(), 0) << "the adapter did not train";
  const at::Tensor expected = Tensor(adapted, layer + ".weight") + at::matmul(b, a) * (8.0 / 4.0);
  const at::Tensor merged =
      Tensor(tmp.path() / "out/merged/final/model.safetensors", layer + ".weight");
  EXPECT_TRUE(at::allclose(merged, expected, 1e-5, 1e-6));
}

TEST(StagedPipelineTest, AdaptersWithNowhereToGoAreRefusedBeforeAnythingRuns) {
  testing::TempDir tmp;
  const auto file = tmp.Write("p.pbtxt", "output_dir: \"out\"\n" + VlmStage("adapted", kLora) +
                                             VlmStage("plain", "  from_stage: \"adapted\""));
  auto r = testing::RunEngine({"run", file.string()}, tmp.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("p.pbtxt:"));
  EXPECT_THAT(r.err,
              HasSubstr("stage 'plain' starts from stage 'adapted', but their models do "
                        "not fit: the parent's adapter tensor "
                        "'model.layers.0.self_attn.q_proj.lora_A.weight' has no place here"));
  EXPECT_THAT(r.err, HasSubstr("parent_adapters: MERGE"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/adapted"));
}

}  // namespace
}  // namespace engine
