// Reading a decoder's config.json: both transformers spellings, every family's keys, and every key
// that is not implemented refused by name with its value.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "llama_config.h"
#include "rotary.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;

// A Llama 3.1-style config.json (transformers 4 spelling), tiny.
nlohmann::json Llama31() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 256})");
}

std::string Refusal(const nlohmann::json& json) {
  auto config = ConfigFromJson(json, "config.json");
  return config.ok() ? "(accepted)" : config.status().message();
}

TEST(HfConfigTest, ReadsALlama31ConfigWithItsRopeScalingAndEosList) {
  auto c = ConfigFromJson(Llama31(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->eos_token_id, nlohmann::json({128001, 128008, 128009}));
  EXPECT_EQ(c->ToJson("bfloat16")["eos_token_id"], c->eos_token_id);
}

TEST(HfConfigTest, TheTransformers5SpellingIsTheSameModel) {
  nlohmann::json v5 = Llama31();
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  auto four = ConfigFromJson(Llama31(), "v4");
  auto five = ConfigFromJson(v5, "v5");
  ASSERT_TRUE(five.ok()) << five.status().message();
  EXPECT_EQ(five->ToJson("bfloat16"), four->ToJson("bfloat16"));
  EXPECT_TRUE(
      at::equal(InverseFrequencies(*five, 1, at::kCPU), InverseFrequencies(*four, 1, at::kCPU)));

  v5["rope_theta"] = 10000.0;
  EXPECT_THAT(Refusal(v5), HasSubstr("'rope_theta' 10000.0 disagrees with rope_parameters"));
}

TEST(HfConfigTest, Llama3RopeDividesLongWavelengthsAndKeepsShortOnes) {
  auto c = ConfigFromJson(Llama31(), "config.json");
  ASSERT_TRUE(c.ok());
  LlamaConfig plain = *c;
  plain.rope_scaling = RopeScaling();
  const at::Tensor scaled = InverseFrequencies(*c, 1, at::kCPU);
  const at::Tensor base = InverseFrequencies(plain, 1, at::kCPU);
  // head_dim 16: the fastest rotation (wavelength 2 pi) is kept, the slowest divided by 8.
  EXPECT_FLOAT_EQ(scaled[0].item<float>(), base[0].item<float>());
  EXPECT_FLOAT_EQ(scaled[7].item<float>(), base[7].item<float>() / 8);
}

TEST(HfConfigTest, UnsupportedRopeTypesAreRefusedWithTheSupportedList) {
  nlohmann::json json = Llama31();
  json["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_EQ(Refusal(json),
            "config.json: rope_scaling.rope_type 'yarn' is not supported by this engine "
            "(supported: default, linear, dynamic, llama3)");
  json["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}, {"attention_factor", 0.5}};
  EXPECT_THAT(Refusal(json), HasSubstr("rope_scaling.attention_factor (0.5) is not read"));
  json["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_THAT(Refusal(json), HasSubstr("rope_scaling.high_freq_factor is missing"));
}

TEST(HfConfigTest, KeysThatMayChangeTheMathAreRefusedByName) {
  nlohmann::json json = Llama31();
  json["quantization_config"] = {{"quant_method", "gptq"}};
  EXPECT_THAT(Refusal(json), HasSubstr("config.json: 'quantization_config' has quant_method "
                                       "\"gptq\", load_in_4bit null, bnb_4bit_quant_type null, "
                                       "bnb_4bit_quant_storage null; of quantized checkpoints "
                                       "only bitsandbytes' 4-bit NF4 ones (uint8 storage) are "
                                       "read"));
  json = Llama31();
  json["attention_dropout"] = 0.1;
  EXPECT_THAT(Refusal(json), HasSubstr("'attention_dropout' is 0.1"));
  json = Llama31();
  json["hidden_act"] = "gelu_new";
  EXPECT_THAT(Refusal(json), HasSubstr("hidden_act 'gelu_new' is not supported by this engine"));
  json = Llama31();
  json["sliding_window"] = 4096;
  EXPECT_THAT(Refusal(json), HasSubstr("transformers' llama has no sliding window"));
  json = Llama31();
  json["model_type"] = "mistral";
  json["attention_bias"] = true;
  EXPECT_THAT(Refusal(json), HasSubstr("'attention_bias' is true, but transformers' mistral "
                                       "ignores it"));
}

TEST(HfConfigTest, WrongTypesAndMissingKeysNameTheKey) {
  nlohmann::json json = Llama31();
  json["eos_token_id"] = "</s>";
  EXPECT_THAT(Refusal(json), HasSubstr("'eos_token_id' must be a token id, a list of them, or "
                                       "null, not \"</s>\""));
  json = Llama31();
  json["tie_word_embeddings"] = 1;
  EXPECT_THAT(Refusal(json), HasSubstr("'tie_word_embeddings' must be true or false, not 1"));
  json = Llama31();
  json.erase("model_type");
  EXPECT_THAT(Refusal(json), HasSubstr("'model_type' is missing"));
  json = Llama31();
  json["rope_scaling"] = "llama3";
  EXPECT_THAT(Refusal(json), HasSubstr("'rope_scaling' must be an object or null"));
}

TEST(HfConfigTest, QwenWindowsSlideFromMaxWindowLayersOnlyWhenEnabled) {
  nlohmann::json json = Llama31();
  json.erase("rope_scaling");
  json.erase("attention_bias");
  json.erase("mlp_bias");
  json["model_type"] = "qwen2";
  json["num_hidden_layers"] = 4;
  json["sliding_window"] = 32;
  json["max_window_layers"] = 2;
  json["use_sliding_window"] = false;
  auto off = ConfigFromJson(json, "c");
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_EQ(off->sliding_window, 0);
  EXPECT_TRUE(off->qkv_bias);
  EXPECT_FALSE(off->o_bias);

  json["use_sliding_window"] = true;
  auto on = ConfigFromJson(json, "c");
  ASSERT_TRUE(on.ok()) << on.status().message();
  EXPECT_EQ(on->sliding_window, 32);
  EXPECT_EQ(on->sliding_layers, (std::vector<bool>{false, false, true, true}));

  json["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                         "full_attention"};
  auto typed = ConfigFromJson(json, "c");
  ASSERT_TRUE(typed.ok()) << typed.status().message();
  EXPECT_EQ(typed->sliding_layers, (std::vector<bool>{true, false, true, false}));
  auto back = ConfigFromJson(typed->ToJson("float32"), "written");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->sliding_layers, typed->sliding_layers);

  json["layer_types"] = {"sliding_attention"};
  EXPECT_THAT(Refusal(json), HasSubstr("'layer_types' must list one type per layer (4)"));
}

// A key config.json leaves out takes the value transformers 5.17's configuration class of that
// model_type gives it: Qwen3's head_dim is 128, not hidden_size / heads (and is written back, so
// that transformers reads the same head); Qwen2-VL's rope_theta is 1000000.
TEST(HfConfigTest, LeftOutKeysTakeTheirClassDefaults) {
  nlohmann::json qwen3 = Llama31();
  for (const char* key :
       {"rope_scaling", "rope_theta", "max_position_embeddings", "mlp_bias", "pretraining_tp"}) {
    qwen3.erase(key);
  }
  qwen3["model_type"] = "qwen3";
  auto read = ConfigFromJson(qwen3, "c");
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->head_dim(), 128);
  EXPECT_EQ(read->rope_theta, 10000);
  EXPECT_EQ(read->max_position_embeddings, 32768);
  auto tiny = ConfigFromJson(read->ToJson("float32"), "written");
  ASSERT_TRUE(tiny.ok());
  qwen3["head_dim"] = 16;  // hidden_size / heads
  auto explicit_head = ConfigFromJson(qwen3, "c");
  ASSERT_TRUE(explicit_head.ok()) << explicit_head.status().message();
  EXPECT_EQ(explicit_head->ToJson("float32")["head_dim"], 16);

  nlohmann::json vl = qwen3;
  vl.erase("head_dim");
  vl.erase("attention_bias");  // Qwen2-VL's q, k and v always have biases
  vl["model_type"] = "qwen2_vl";
  vl["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {4, 2, 2}}};
  auto qwen2_vl = Qwen2VlTextConfigFromJson(vl, "c");
  ASSERT_TRUE(qwen2_vl.ok()) << qwen2_vl.status().message();
  EXPECT_EQ(qwen2_vl->rope_theta, 1000000);
  EXPECT_EQ(qwen2_vl->head_dim(), 16);
}

}  // namespace
}  // namespace engine::transformer
