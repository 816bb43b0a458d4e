// What a Llama-family decoder computes (Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3: sizes, rotary
// scaling, biases, activation, sliding windows, per-head norms), from options or from a Hugging
// Face config.json, and back to config.json. Reading config.json is in llama_config_json.cc: every
// key is implemented, known not to change the math, or refused by name.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/status.h"
#include "transformer_options.pb.h"

namespace engine::transformer {

// How the rotary frequencies are scaled (transformers' rope_type). Every type keeps transformers'
// attention_scaling of 1.
struct RopeScaling {
  enum class Type { kDefault, kLinear, kDynamic, kLlama3 };
  Type type = Type::kDefault;
  double factor = 1;
  // llama3 only.
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position_embeddings = 0;
};

// An MLP's activation (config.json's hidden_act): the decoders' (silu, gelu, gelu_pytorch_tanh,
// relu) and Qwen2-VL's vision tower's (quick_gelu: x * sigmoid(1.702 x)).
enum class Activation { kSilu, kGelu, kGeluTanh, kRelu, kQuickGelu };

// The architectures this decoder computes, as config.json's model_type names them.
inline constexpr const char* kDecoderModelTypes[] = {"llama", "mistral", "qwen2", "qwen3"};

struct LlamaConfig {
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  // 0: hidden_size / num_attention_heads.
  int64_t explicit_head_dim = 0;
  Activation hidden_act = Activation::kSilu;
  bool qkv_bias = false;  // q_proj, k_proj, v_proj
  bool o_bias = false;
  bool mlp_bias = false;  // gate_proj, up_proj, down_proj
  bool qk_norm = false;   // Qwen3: RMSNorm over each head of q and k, before rotary
  RopeScaling rope_scaling;
  // Qwen2-VL's multimodal rotary embedding: the head's frequency bands taken, in turn, from the
  // temporal, height and width positions (position_ids [3, batch, positions]); sums to head_dim
  // / 2. Empty: one position per token.
  std::vector<int64_t> mrope_section;
  // Qwen3-VL's layout of those bands: frequency i comes from the height positions when i % 3 == 1
  // and i < 3 x mrope_section[1], from the width positions when i % 3 == 2 and i < 3 x
  // mrope_section[2], from the temporal ones otherwise (transformers' mrope_interleaved).
  bool mrope_interleaved = false;
  // Keys within this many positions (the query's own included) on the layers that slide; 0: none.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // one per layer when sliding_window > 0
  // Token ids as config.json gave them (a number, a list, or null), written back unchanged. The
  // math does not read them.
  nlohmann::json bos_token_id, eos_token_id, pad_token_id;

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  bool LayerSlides(int64_t layer) const {
    return sliding_window > 0 && layer < static_cast<int64_t>(sliding_layers.size()) &&
           sliding_layers[static_cast<size_t>(layer)];
  }
  // Sizes that cannot work (heads that do not divide the width, ...), in words.
  Status Check() const;
  // Hugging Face's config.json for this model_type (LlamaForCausalLM, MistralForCausalLM, ...), in
  // the transformers 4 spelling that transformers 4 and 5 both read; `dtype` names the weights'
  // dtype.
  nlohmann::json ToJson(const std::string& dtype) const;
};

// Sizes beyond these are refused (a typo, not a model): they would exhaust memory or time before
// any error could name them.
struct SizeLimit {
  const char* name;
  int64_t value;
  int64_t limit;
};
std::vector<SizeLimit> LlamaSizeLimits(const LlamaConfig& config);

// From options; `data_vocab` (the data's token id count) fills vocab_size when the options leave it
// 0.
StatusOr<LlamaConfig> ConfigFromOptions(const LlamaOptions& options, int64_t data_vocab);

// From a parsed config.json (transformers 4 or 5 spelling). Errors name `where`, the key and its
// value: a key this engine does not implement is an error unless it cannot change the math.
StatusOr<LlamaConfig> ConfigFromJson(const nlohmann::json& json, const std::string& where);

// The language model of a Qwen2-VL, Qwen2.5-VL or Qwen3-VL config.json (model_type qwen2_vl,
// qwen2_5_vl or qwen3_vl, read in transformers 4's flat layout): a Qwen2 decoder with
// mrope_section, or for qwen3_vl a Qwen3 decoder (q/k norms) with interleaved bands. The multimodal
// keys (vision_config, image_token_id, ...) are left to the vision-language loader; any other key
// is treated as ConfigFromJson treats it.
StatusOr<LlamaConfig> Qwen2VlTextConfigFromJson(const nlohmann::json& json,
                                                const std::string& where);

// "silu", "gelu", ... as config.json spells them.
const char* ActivationName(Activation activation);
// The activation config.json's hidden_act names ("swish" is silu); nothing for another name.
std::optional<Activation> ActivationFromName(const std::string& name);

}  // namespace engine::transformer
