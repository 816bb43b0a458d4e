// The decoder computes what transformers computes: every fixture under tests/fixtures/hf (tiny
// random checkpoints written by transformers' save_pretrained, with the logits transformers
// computed for a batch with a left- and a right-padded row; tests/fixtures/hf/make_fixtures.py) is
// loaded from its own config.json and weights and run on the same batch; the logits must agree at
// every real token. Each fixture's metadata records how far the plausible mistakes for its variant
// move the logits, so agreeing within the tolerance proves the variant.
//
// Tolerances: fp32 1e-4 (max abs logit difference). bf16 (llama_bf16) 0.2: bf16's own rounding of
// this model is 0.07 (the fixture's "fp32 forward of the same bf16 weights"), a wrong activation
// 0.85.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "engine/safetensors.h"
#include "hf_checkpoint.h"
#include "llama_modules.h"
#include "qwen2_vl_model.h"
#include "testing/test_paths.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kFixtures =
    std::filesystem::path(testing::kSourceDir) / "tests" / "fixtures" / "hf";

// The decoder fixtures (qwen3_sharded: save_pretrained's shards and index).
const std::vector<std::string> kDecoderFixtures = {"llama",
                                                   "llama_tied_bias",
                                                   "llama_head_dim",
                                                   "llama_gelu",
                                                   "llama_gelu_tanh",
                                                   "llama_relu",
                                                   "llama_rope_linear",
                                                   "llama_rope_dynamic",
                                                   "llama3_rope",
                                                   "llama3_rope_v5config",
                                                   "mistral_sliding",
                                                   "qwen2",
                                                   "qwen2_sliding",
                                                   "qwen3_sharded",
                                                   "qwen3",
                                                   "llama_bf16"};

class CausalLmModule : public torch::nn::Module {
 public:
  explicit CausalLmModule(const LlamaConfig& c) : lm(*this, c) {}
  CausalLm lm;
};

struct Reference {
  at::Tensor input_ids, attention_mask, position_ids, logits;
  double tolerance = 0;
  std::string dtype;
};

Reference ReadReference(const std::string& name) {
  auto file = safetensors::File::Open(kFixtures / name / "reference.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().message();
  Reference r;
  if (!file.ok()) return r;
  r.input_ids = *(*file)->Get("input_ids");
  r.attention_mask = *(*file)->Get("attention_mask");
  r.position_ids = *(*file)->Get("position_ids");
  r.logits = *(*file)->Get("logits");
  r.tolerance = std::stod((*file)->metadata().at("tolerance"));
  r.dtype = (*file)->metadata().at("dtype");
  return r;
}

// The model of directory `name` built from `config` with the directory's weights.
std::shared_ptr<CausalLmModule> LoadFidelityFixture(const std::string& name,
                                                    const LlamaConfig& config) {
  auto module = std::make_shared<CausalLmModule>(config);
  std::set<std::string> optional;
  if (config.tie_word_embeddings) optional.insert("lm_head.weight");
  const Status loaded = LoadWeights(kFixtures / name, *module, optional);
  EXPECT_TRUE(loaded.ok()) << loaded.message();
  module->eval();
  return module;
}

at::Tensor RunReferenceBatch(CausalLmModule& m, const Reference& r) {
  at::NoGradGuard no_grad;
  DecoderInputs inputs;
  inputs.attention_mask = r.attention_mask;
  inputs.position_ids = r.position_ids;
  return m.lm.Logits(m.lm.model->Forward(m.lm.model->Embed(r.input_ids), inputs, nullptr))
      .to(at::kFloat);
}

// Max abs difference over the real tokens.
double MaxDifferenceAtRealTokens(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  const at::Tensor real = mask.to(at::kBool).unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(real).max().item<double>();
}

StatusOr<LlamaConfig> FixtureConfig(const std::string& name) {
  ENGINE_ASSIGN_OR_RETURN(nlohmann::json json, ReadConfigJson(kFixtures / name));
  return ConfigFromJson(json, name + "/config.json");
}

TEST(HfFidelityTest, EveryDecoderFixtureIsCovered) {
  std::set<std::string> listed(kDecoderFixtures.begin(), kDecoderFixtures.end());
  for (const auto& entry : std::filesystem::directory_iterator(kFixtures)) {
    const std::string name = entry.path().filename().string();
    // The image-text fixtures have tests of their own (qwen2_vl_model_test, qwen2_5_vl_model_test,
    // qwen3_vl_model_test).
    if (!entry.is_directory() || name == "qwen2_vl" || name == "qwen2_5_vl" || name == "qwen3_vl") {
      continue;
    }
    EXPECT_TRUE(listed.count(name)) << name << " is a fixture no test compares";
  }
}

TEST(HfFidelityTest, LogitsEqualTransformersOnEveryFixture) {
  for (const std::string& name : kDecoderFixtures) {
    SCOPED_TRACE(name);
    auto config = FixtureConfig(name);
    ASSERT_TRUE(config.ok()) << config.status().message();
    const Reference r = ReadReference(name);
    EXPECT_EQ(r.tolerance, r.dtype == "bfloat16" ? 0.2 : 1e-4) << "the tolerance this test states";
    auto module = LoadFidelityFixture(name, *config);
    const at::Tensor logits = RunReferenceBatch(*module, r);
    ASSERT_EQ(logits.sizes(), r.logits.sizes());
    EXPECT_LE(MaxDifferenceAtRealTokens(logits, r.logits, r.attention_mask), r.tolerance);
  }
}

TEST(HfFidelityTest, ALeftPaddedRowComputesWhatItWouldUnpadded) {
  // Row 1 of the reference batch has 4 pads on the left: alone and unpadded, its tokens must give
  // the same logits (positions counted from its first real token, padding never attended).
  auto config = FixtureConfig("mistral_sliding");
  ASSERT_TRUE(config.ok()) << config.status().message();
  const Reference r = ReadReference("mistral_sliding");
  auto module = LoadFidelityFixture("mistral_sliding", *config);
  DecoderInputs padded;
  padded.attention_mask = r.attention_mask;  // positions derived from the mask
  at::NoGradGuard no_grad;
  const at::Tensor all = module->lm.Logits(
      module->lm.model->Forward(module->lm.model->Embed(r.input_ids), padded, nullptr));
  const at::Tensor row = r.input_ids.narrow(0, 1, 1).narrow(1, 4, 8);
  const at::Tensor alone =
      module->lm.Logits(module->lm.model->forward(module->lm.model->Embed(row), 0, nullptr));
  EXPECT_LE((all.narrow(0, 1, 1).narrow(1, 4, 8) - alone).abs().max().item<double>(), 1e-5);
}

TEST(HfFidelityTest, TheWrittenConfigComputesTheSameModel) {
  for (const std::string& name : kDecoderFixtures) {
    SCOPED_TRACE(name);
    auto config = FixtureConfig(name);
    ASSERT_TRUE(config.ok()) << config.status().message();
    const nlohmann::json written = config->ToJson("float32");
    auto back = ConfigFromJson(written, "written config.json");
    ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << written.dump(2);
    EXPECT_EQ(back->ToJson("float32"), written);
    EXPECT_EQ(written["model_type"], config->model_type);
    const Reference r = ReadReference(name);
    auto module = LoadFidelityFixture(name, *back);
    EXPECT_LE(MaxDifferenceAtRealTokens(RunReferenceBatch(*module, r), r.logits, r.attention_mask),
              r.tolerance);
  }
}

TEST(HfFidelityTest, Qwen2VlLanguageModelWithImageFeaturesAndMropeEqualsTransformers) {
  // The decoder half of qwen2_vl: transformers' own vision features placed at the image tokens,
  // its M-RoPE positions (get_rope_index), and the logits it computed.
  auto json = ReadConfigJson(kFixtures / "qwen2_vl");
  ASSERT_TRUE(json.ok()) << json.status().message();
  auto vision_language = Qwen2VlConfigFromJson(*json, "qwen2_vl/config.json");
  ASSERT_TRUE(vision_language.ok()) << vision_language.status().message();
  LlamaConfig config = vision_language->text;
  EXPECT_EQ(config.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  auto weights = safetensors::File::Open(kFixtures / "qwen2_vl" / "model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  CausalLmModule module(config);
  at::NoGradGuard no_grad;
  for (auto& p : module.named_parameters()) {
    auto stored = (*weights)->Get(p.key());
    ASSERT_TRUE(stored.ok()) << p.key();
    p.value().copy_(*stored);
  }
  auto reference = safetensors::File::Open(kFixtures / "qwen2_vl" / "reference.safetensors");
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  const at::Tensor ids = *(*reference)->Get("input_ids");
  const at::Tensor mask = *(*reference)->Get("attention_mask");
  const at::Tensor features = *(*reference)->Get("image_features");
  const at::Tensor image_tokens = ids.eq((*json)["image_token_id"].get<int64_t>());
  ASSERT_EQ(image_tokens.sum().item<int64_t>(), features.size(0));
  const at::Tensor embeds = module.lm.model->Embed(ids).masked_scatter(
      image_tokens.unsqueeze(-1).expand({-1, -1, config.hidden_size}), features);
  DecoderInputs inputs;
  inputs.attention_mask = mask;
  inputs.position_ids = *(*reference)->Get("mrope_position_ids");
  const at::Tensor logits = module.lm.Logits(module.lm.model->Forward(embeds, inputs, nullptr));
  EXPECT_LE(MaxDifferenceAtRealTokens(logits, *(*reference)->Get("logits"), mask), 1e-4);

  // Plain 1-D positions are another model (the fixture's own sensitivity: 4.0).
  inputs.position_ids = at::Tensor();
  config.mrope_section.clear();
  EXPECT_GT(
      MaxDifferenceAtRealTokens(module.lm.Logits(module.lm.model->Forward(embeds, inputs, nullptr)),
                                *(*reference)->Get("logits"), mask),
      0.1);
}

TEST(HfFidelityTest, Qwen2VlNeedsItsOwnLoader) {
  auto json = ReadConfigJson(kFixtures / "qwen2_vl");
  ASSERT_TRUE(json.ok());
  auto refused = ConfigFromJson(*json, "config.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model_type is 'qwen2_vl', a vision-language model; load it with the "
                        "qwen2_vl model loader"));
  nlohmann::json no_section = *json;
  no_section["text_config"]["rope_parameters"].erase("mrope_section");
  EXPECT_THAT(Qwen2VlConfigFromJson(no_section, "c").status().message(),
              HasSubstr("mrope_section must be three positive integers"));
}

}  // namespace
}  // namespace engine::transformer
