#include "llama_config.h"

#include <map>

#include "engine/format.h"

namespace engine::transformer {
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
  if (explicit_head_dim == 0 && hidden_size % num_attention_heads != 0) {
    return InvalidArgumentError("hidden_size " + std::to_string(hidden_size) +
                                " is not a multiple of num_attention_heads " +
                                std::to_string(num_attention_heads) +
                                " (and no head_dim is given)");
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
  if (sliding_window > 0 && static_cast<int64_t>(sliding_layers.size()) != num_hidden_layers) {
    return InvalidArgumentError("the sliding window names " +
                                std::to_string(sliding_layers.size()) + " layers, not " +
                                std::to_string(num_hidden_layers));
  }
  return Status::Ok();
}

const char* ActivationName(Activation activation) {
  switch (activation) {
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_pytorch_tanh";
    case Activation::kRelu:
      return "relu";
    case Activation::kQuickGelu:
      return "quick_gelu";
    case Activation::kSilu:
      break;
  }
  return "silu";
}

std::optional<Activation> ActivationFromName(const std::string& name) {
  static const std::pair<const char*, Activation> kNames[] = {
      {"silu", Activation::kSilu}, {"swish", Activation::kSilu},
      {"gelu", Activation::kGelu}, {"gelu_pytorch_tanh", Activation::kGeluTanh},
      {"relu", Activation::kRelu}, {"quick_gelu", Activation::kQuickGelu}};
  for (const auto& [spelling, activation] : kNames) {
    if (name == spelling) return activation;
  }
  return std::nullopt;
}

namespace {

const char* RopeTypeName(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kDynamic:
      return "dynamic";
    case RopeScaling::Type::kLlama3:
      return "llama3";
    case RopeScaling::Type::kDefault:
      break;
  }
  return "default";
}

nlohmann::json RopeScalingJson(const RopeScaling& r, const std::vector<int64_t>& mrope_section,
                               bool mrope_interleaved) {
  if (mrope_interleaved) {
    return {
        {"rope_type", "default"}, {"mrope_section", mrope_section}, {"mrope_interleaved", true}};
  }
  if (!mrope_section.empty()) {
    // As transformers 4 writes Qwen2-VL's.
    return {{"type", "default"}, {"rope_type", "default"}, {"mrope_section", mrope_section}};
  }
  if (r.type == RopeScaling::Type::kDefault) return nullptr;
  nlohmann::json json = {{"rope_type", RopeTypeName(r.type)}, {"factor", r.factor}};
  if (r.type == RopeScaling::Type::kLlama3) {
    json["low_freq_factor"] = r.low_freq_factor;
    json["high_freq_factor"] = r.high_freq_factor;
    json["original_max_position_embeddings"] = r.original_max_position_embeddings;
  }
  return json;
}

// The first layer that slides when every later one does too (transformers 4's max_window_layers);
// -1 when the layers slide in another pattern.
int64_t FirstSlidingLayer(const LlamaConfig& c) {
  int64_t first = c.num_hidden_layers;
  while (first > 0 && c.LayerSlides(first - 1)) --first;
  for (int64_t i = 0; i < first; ++i) {
    if (c.LayerSlides(i)) return -1;
  }
  return first;
}

// Qwen2 and Qwen3 spell the window as use_sliding_window, sliding_window and max_window_layers
// (transformers 5 also writes layer_types, which is needed when the pattern is not "from layer m").
void AddQwenWindow(const LlamaConfig& c, nlohmann::json& json) {
  json["use_sliding_window"] = c.sliding_window > 0;
  json["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  const int64_t first = c.sliding_window > 0 ? FirstSlidingLayer(c) : c.num_hidden_layers;
  json["max_window_layers"] = first >= 0 ? first : c.num_hidden_layers;
  if (first < 0) {
    nlohmann::json types = nlohmann::json::array();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      types.push_back(c.LayerSlides(i) ? "sliding_attention" : "full_attention");
    }
    json["layer_types"] = types;
  }
}

}  // namespace

nlohmann::json LlamaConfig::ToJson(const std::string& dtype) const {
  const std::map<std::string, std::string> architectures = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},
      {"qwen2_vl", "Qwen2VLForConditionalGeneration"},
      {"qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"},
      {"qwen3_vl", "Qwen3VLForConditionalGeneration"}};
  auto architecture = architectures.find(model_type);
  nlohmann::json json = {
      {"architectures",
       {architecture != architectures.end() ? architecture->second : "LlamaForCausalLM"}},
      {"model_type", model_type},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"rope_scaling", RopeScalingJson(rope_scaling, mrope_section, mrope_interleaved)},
      {"tie_word_embeddings", tie_word_embeddings},
      {"initializer_range", initializer_range},
      {"hidden_act", ActivationName(hidden_act)},
      {"torch_dtype", dtype}};
  // Qwen3's configuration class takes 128 for a head_dim left out, not hidden_size / heads.
  if (explicit_head_dim > 0 || model_type == "qwen3") json["head_dim"] = head_dim();
  if (model_type == "llama") {
    json["attention_bias"] = qkv_bias;
    json["mlp_bias"] = mlp_bias;
  } else if (model_type == "mistral") {
    json["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nullptr;
  } else if (model_type == "qwen2" || model_type == "qwen3" || model_type == "qwen2_vl" ||
             model_type == "qwen2_5_vl") {
    AddQwenWindow(*this, json);
    if (model_type == "qwen3") json["attention_bias"] = qkv_bias;
  } else if (model_type == "qwen3_vl") {
    json["attention_bias"] = qkv_bias;
  }
  // Written when null too: left out, transformers would take its class's default (Qwen2-VL's bos
  // is 151643), another config than the one read.
  for (const auto& [key, value] :
       {std::pair<const char*, const nlohmann::json*>{"bos_token_id", &bos_token_id},
        {"eos_token_id", &eos_token_id},
        {"pad_token_id", &pad_token_id}}) {
    json[key] = *value;
  }
  return json;
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

}  // namespace engine::transformer
