// The sizes of a Llama-family decoder, from options or from a Hugging Face config.json, and back to
// config.json.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/status.h"
#include "transformer_options.pb.h"

namespace engine::transformer {

struct LlamaConfig {
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

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Sizes that cannot work (heads that do not divide the width, ...), in words.
  Status Check() const;
  // Hugging Face's config.json for LlamaForCausalLM; `dtype` names the weights' dtype.
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

// From a parsed config.json. Errors name `where` and the key.
StatusOr<LlamaConfig> ConfigFromJson(const nlohmann::json& json, const std::string& where);

}  // namespace engine::transformer
