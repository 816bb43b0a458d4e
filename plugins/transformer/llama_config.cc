#include "llama_config.h"

#include "engine/format.h"

namespace engine::transformer {
namespace {

StatusOr<int64_t> PositiveInt(const nlohmann::json& json, const std::string& key,
                              const std::string& where, std::optional<int64_t> fallback = {}) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) {
    if (fallback) return *fallback;
    return InvalidArgumentError(where + ": '" + key + "' is missing");
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    return InvalidArgumentError(where + ": '" + key + "' must be a positive integer, not " +
                                it->dump());
  }
  return it->get<int64_t>();
}

StatusOr<double> PositiveNumber(const nlohmann::json& json, const std::string& key,
                                const std::string& where, double fallback) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return fallback;
  if (!it->is_number() || !(it->get<double>() > 0)) {
    return InvalidArgumentError(where + ": '" + key + "' must be a positive number, not " +
                                it->dump());
  }
  return it->get<double>();
}

}  // namespace

std::vector<SizeLimit> LlamaSizeLimits(const LlamaConfig& c) {
  return {{"vocab_size", c.vocab_size, int64_t{1} << 22},
          {"hidden_size", c.hidden_size, int64_t{1} << 16},
          {"intermediate_size", c.intermediate_size, int64_t{1} << 18},
          {"num_hidden_layers", c.num_hidden_layers, 1024},
          {"num_attention_heads", c.num_attention_heads, 1024},
          {"num_key_value_heads", c.num_key_value_heads, 1024},
          {"max_position_embeddings", c.max_position_embeddings, int64_t{1} << 24}};
}

Status LlamaConfig::Check() const {
  if (vocab_size <= 0) return InvalidArgumentError("vocab_size must be > 0");
  for (const auto& [name, value, limit] : LlamaSizeLimits(*this)) {
    if (value > limit) {
      return InvalidArgumentError(std::string(name) + " " + std::to_string(value) +
                                  " is above the largest this loader builds (" +
                                  std::to_string(limit) + ")");
    }
  }
  if (hidden_size <= 0 || num_attention_heads <= 0 || num_hidden_layers <= 0) {
    return InvalidArgumentError(
        "hidden_size, num_attention_heads and num_hidden_layers must be > 0");
  }
  if (hidden_size % num_attention_heads != 0) {
    return InvalidArgumentError("hidden_size " + std::to_string(hidden_size) +
                                " is not a multiple of num_attention_heads " +
                                std::to_string(num_attention_heads));
  }
  if (head_dim() % 2 != 0) {
    return InvalidArgumentError("the head size " + std::to_string(head_dim()) +
                                " must be even for rotary embeddings");
  }
  if (num_key_value_heads <= 0 || num_attention_heads % num_key_value_heads != 0) {
    return InvalidArgumentError("num_attention_heads " + std::to_string(num_attention_heads) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(num_key_value_heads));
  }
  if (intermediate_size <= 0) return InvalidArgumentError("intermediate_size must be > 0");
  return Status::Ok();
}

nlohmann::json LlamaConfig::ToJson(const std::string& dtype) const {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", vocab_size},
          {"hidden_size", hidden_size},
          {"intermediate_size", intermediate_size},
          {"num_hidden_layers", num_hidden_layers},
          {"num_attention_heads", num_attention_heads},
          {"num_key_value_heads", num_key_value_heads},
          {"max_position_embeddings", max_position_embeddings},
          {"rms_norm_eps", rms_norm_eps},
          {"rope_theta", rope_theta},
          {"tie_word_embeddings", tie_word_embeddings},
          {"initializer_range", initializer_range},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"torch_dtype", dtype}};
}

StatusOr<LlamaConfig> ConfigFromOptions(const LlamaOptions& o, int64_t data_vocab) {
  LlamaConfig c;
  c.vocab_size = o.vocab_size() > 0 ? o.vocab_size() : data_vocab;
  c.hidden_size = o.hidden_size();
  c.intermediate_size =
      o.intermediate_size() > 0 ? o.intermediate_size() : ((8 * c.hidden_size / 3 + 31) / 32) * 32;
  c.num_hidden_layers = o.num_hidden_layers();
  c.num_attention_heads = o.num_attention_heads();
  c.num_key_value_heads =
      o.num_key_value_heads() > 0 ? o.num_key_value_heads() : o.num_attention_heads();
  c.max_position_embeddings = o.max_position_embeddings();
  c.rms_norm_eps = o.rms_norm_eps();
  c.rope_theta = o.rope_theta();
  c.tie_word_embeddings = o.tie_word_embeddings();
  c.initializer_range = o.initializer_range();
  if (c.vocab_size <= 0) {
    return InvalidArgumentError(
        "vocab_size is 0 and the data gives no token id count (an `input_ids` field with its "
        "number of classes); set vocab_size");
  }
  ENGINE_RETURN_IF_ERROR(c.Check());
  return c;
}

StatusOr<LlamaConfig> ConfigFromJson(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not a JSON object");
  auto model_type = json.find("model_type");
  if (model_type != json.end() && model_type->is_string() && *model_type != "llama" &&
      *model_type != "mistral") {
    return InvalidArgumentError(where + ": model_type is '" + model_type->get<std::string>() +
                                "', not a Llama-family decoder");
  }
  LlamaConfig c;
  ENGINE_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(json, "vocab_size", where));
  ENGINE_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(json, "hidden_size", where));
  ENGINE_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(json, "intermediate_size", where));
  ENGINE_ASSIGN_OR_RETURN(c.num_hidden_layers, PositiveInt(json, "num_hidden_layers", where));
  ENGINE_ASSIGN_OR_RETURN(c.num_attention_heads, PositiveInt(json, "num_attention_heads", where));
  ENGINE_ASSIGN_OR_RETURN(c.num_key_value_heads,
                          PositiveInt(json, "num_key_value_heads", where, c.num_attention_heads));
  ENGINE_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          PositiveInt(json, "max_position_embeddings", where, 2048));
  ENGINE_ASSIGN_OR_RETURN(c.rms_norm_eps, PositiveNumber(json, "rms_norm_eps", where, 1e-6));
  ENGINE_ASSIGN_OR_RETURN(c.rope_theta, PositiveNumber(json, "rope_theta", where, 10000));
  ENGINE_ASSIGN_OR_RETURN(c.initializer_range,
                          PositiveNumber(json, "initializer_range", where, 0.02));
  auto tie = json.find("tie_word_embeddings");
  if (tie != json.end() && !tie->is_null()) {
    if (!tie->is_boolean()) {
      return InvalidArgumentError(where + ": 'tie_word_embeddings' must be true or false");
    }
    c.tie_word_embeddings = tie->get<bool>();
  }
  Status checked = c.Check();
  if (!checked.ok()) return InvalidArgumentError(where + ": " + checked.message());
  return c;
}

}  // namespace engine::transformer
