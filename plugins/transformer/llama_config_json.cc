// Reading a decoder's config.json (ConfigFromJson): transformers' configuration classes are the
// specification (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config and modeling_rope_utils).
// Every key is read, on the list of keys that cannot change the math, or refused by name, so that a
// checkpoint never loads as another model than the one it was trained as.
#include <set>

#include "engine/json_key_reader.h"
#include "llama_config.h"

namespace engine::transformer {
namespace {

// Keys that do not change what the forward pass computes: bookkeeping, generation defaults and
// output switches. pretraining_tp only splits transformers 4's matmuls into slices (the same sums).
const std::set<std::string>& KeysWithoutMath() {
  static const std::set<std::string> keys = {"_name_or_path",
                                             "architectures",
                                             "transformers_version",
                                             "torch_dtype",
                                             "dtype",
                                             "use_cache",
                                             "pretraining_tp",
                                             "output_attentions",
                                             "output_hidden_states",
                                             "return_dict",
                                             "torchscript",
                                             "use_bfloat16",
                                             "id2label",
                                             "label2id",
                                             "problem_type",
                                             "tokenizer_class",
                                             "prefix",
                                             "task_specific_params",
                                             "finetuning_task",
                                             "max_length",
                                             "min_length",
                                             "do_sample",
                                             "early_stopping",
                                             "num_beams",
                                             "num_beam_groups",
                                             "diversity_penalty",
                                             "temperature",
                                             "top_k",
                                             "top_p",
                                             "typical_p",
                                             "repetition_penalty",
                                             "length_penalty",
                                             "no_repeat_ngram_size",
                                             "encoder_no_repeat_ngram_size",
                                             "bad_words_ids",
                                             "num_return_sequences",
                                             "output_scores",
                                             "return_dict_in_generate",
                                             "forced_bos_token_id",
                                             "forced_eos_token_id",
                                             "remove_invalid_values",
                                             "exponential_decay_length_penalty",
                                             "suppress_tokens",
                                             "begin_suppress_tokens",
                                             "sep_token_id",
                                             "decoder_start_token_id",
                                             "chunk_size_feed_forward",
                                             "is_encoder_decoder",
                                             "is_decoder",
                                             "add_cross_attention",
                                             "tie_encoder_decoder",
                                             "cross_attention_hidden_size",
                                             "pruned_heads",
                                             "tf_legacy_loss",
                                             "_attn_implementation_autoset"};
  return keys;
}

// Reads one config.json object, remembering which keys it read (JsonKeyReader); what is left at
// the end is refused.
class ConfigReader : private JsonKeyReader {
 public:
  // `vision_language`: the text part of a qwen2_vl, qwen2_5_vl or qwen3_vl config; the multimodal
  // keys are read elsewhere.
  ConfigReader(const nlohmann::json& json, std::string where, bool vision_language = false)
      : JsonKeyReader(json, where), where_(std::move(where)), vision_language_(vision_language) {
    if (vision_language_) {
      // vision_token_id: the hub's configs carry it; transformers does not read it.
      for (const char* key : {"vision_config", "image_token_id", "video_token_id",
                              "vision_start_token_id", "vision_end_token_id", "vision_token_id"}) {
        MarkRead(key);
      }
    }
  }

  StatusOr<LlamaConfig> Read() {
    ENGINE_RETURN_IF_ERROR(ReadModelType());
    ENGINE_RETURN_IF_ERROR(ReadSizes());
    ENGINE_RETURN_IF_ERROR(ReadActivation());
    ENGINE_RETURN_IF_ERROR(ReadBiasesAndNorms());
    ENGINE_RETURN_IF_ERROR(ReadRope());
    if (vision_language_ && c_.mrope_section.empty()) {
      if (c_.model_type != "qwen3_vl") {
        return Error("rope_scaling", "needs an mrope_section for " + c_.model_type);
      }
      // Qwen3-VL's rotary embedding defaults to these bands (made for head_dim 128).
      c_.mrope_section = {24, 20, 20};
    }
    ENGINE_RETURN_IF_ERROR(ReadWindow());
    ENGINE_RETURN_IF_ERROR(ReadTokenIds());
    ENGINE_RETURN_IF_ERROR(ReadQuantization());
    ENGINE_RETURN_IF_ERROR(ReadNeutralKeys());
    ENGINE_RETURN_IF_ERROR(RefuseUnreadKeys());
    Status checked = c_.Check();
    if (!checked.ok()) return InvalidArgumentError(where_ + ": " + checked.message());
    return c_;
  }

 private:
  using JsonKeyReader::Error;
  using JsonKeyReader::Take;

  StatusOr<int64_t> PositiveInt(const std::string& key, std::optional<int64_t> fallback = {}) {
    const nlohmann::json& v = Take(key);
    if (v.is_null()) {
      if (fallback) return *fallback;
      return Error(key, "is missing");
    }
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      return Error(key, "must be a positive integer, not " + v.dump());
    }
    return v.get<int64_t>();
  }

  StatusOr<double> PositiveNumber(const nlohmann::json& v, const std::string& key,
                                  double fallback) {
    if (v.is_null()) return fallback;
    if (!v.is_number() || !(v.get<double>() > 0)) {
      return Error(key, "must be a positive number, not " + v.dump());
    }
    return v.get<double>();
  }

  StatusOr<bool> Bool(const std::string& key, bool fallback) {
    const nlohmann::json& v = Take(key);
    if (v.is_null()) return fallback;
    if (!v.is_boolean()) return Error(key, "must be true or false, not " + v.dump());
    return v.get<bool>();
  }

  Status ReadModelType() {
    const nlohmann::json& v = Take("model_type");
    if (v.is_null()) {
      return Error("model_type", "is missing (this loader reads llama, mistral, qwen2 and qwen3)");
    }
    const std::string type = v.is_string() ? v.get<std::string>() : v.dump();
    if (type == "qwen3_vl_moe") {
      return InvalidArgumentError(where_ +
                                  ": model_type is 'qwen3_vl_moe', Qwen3-VL's "
                                  "mixture-of-experts variant, which this engine does not build "
                                  "(the qwen3_vl loader reads the dense models)");
    }
    const bool vision_family = type == "qwen2_vl" || type == "qwen2_5_vl" || type == "qwen3_vl";
    if (vision_language_ || vision_family) {
      if (vision_language_ && vision_family) {
        c_.model_type = type;
        return Status::Ok();
      }
      return InvalidArgumentError(where_ + ": model_type is '" + type + "', " +
                                  (vision_language_ ? "not qwen2_vl, qwen2_5_vl or qwen3_vl"
                                                    : "a vision-language model; load it with the " +
                                                          type + " model loader"));
    }
    for (const char* known : kDecoderModelTypes) {
      if (type == known) {
        c_.model_type = type;
        return Status::Ok();
      }
    }
    return InvalidArgumentError(where_ + ": model_type is '" + type +
                                "', not a Llama-family decoder this loader reads (llama, mistral, "
                                "qwen2, qwen3)");
  }

  // What transformers 5.17's configuration class of the model_type takes for a key config.json
  // leaves out (head_dim 0: hidden_size / num_attention_heads).
  struct ClassDefaults {
    double rope_theta;
    int64_t head_dim;
    int64_t max_positions;
  };
  ClassDefaults Defaults() const {
    const std::string& type = c_.model_type;
    if (type == "qwen3") return {10000, 128, 32768};
    if (type == "qwen3_vl") return {500000, 128, 128000};
    if (type == "qwen2_vl" || type == "qwen2_5_vl") return {1000000, 0, 32768};
    if (type == "qwen2") return {10000, 0, 32768};
    if (type == "mistral") return {10000, 0, 131072};
    return {10000, 0, 2048};
  }

  Status ReadSizes() {
    ENGINE_ASSIGN_OR_RETURN(c_.vocab_size, PositiveInt("vocab_size"));
    ENGINE_ASSIGN_OR_RETURN(c_.hidden_size, PositiveInt("hidden_size"));
    ENGINE_ASSIGN_OR_RETURN(c_.intermediate_size, PositiveInt("intermediate_size"));
    ENGINE_ASSIGN_OR_RETURN(c_.num_hidden_layers, PositiveInt("num_hidden_layers"));
    ENGINE_ASSIGN_OR_RETURN(c_.num_attention_heads, PositiveInt("num_attention_heads"));
    ENGINE_ASSIGN_OR_RETURN(c_.num_key_value_heads,
                            PositiveInt("num_key_value_heads", c_.num_attention_heads));
    ENGINE_ASSIGN_OR_RETURN(c_.max_position_embeddings,
                            PositiveInt("max_position_embeddings", Defaults().max_positions));
    ENGINE_ASSIGN_OR_RETURN(c_.rms_norm_eps,
                            PositiveNumber(Take("rms_norm_eps"), "rms_norm_eps", 1e-6));
    ENGINE_ASSIGN_OR_RETURN(c_.initializer_range,
                            PositiveNumber(Take("initializer_range"), "initializer_range", 0.02));
    ENGINE_ASSIGN_OR_RETURN(c_.tie_word_embeddings, Bool("tie_word_embeddings", false));
    // transformers writes head_dim even when it is hidden_size / heads; only another value is kept
    // as explicit (so that the config written back stays the same).
    ENGINE_ASSIGN_OR_RETURN(const int64_t head_dim, PositiveInt("head_dim", Defaults().head_dim));
    if (head_dim > 0 && head_dim * c_.num_attention_heads != c_.hidden_size) {
      c_.explicit_head_dim = head_dim;
    }
    return Status::Ok();
  }

  Status ReadActivation() {
    const nlohmann::json& v = Take("hidden_act");
    if (v.is_null()) return Status::Ok();
    const std::string name = v.is_string() ? v.get<std::string>() : v.dump();
    // quick_gelu is the vision towers'; no decoder family this loader reads uses it.
    const std::optional<Activation> activation = ActivationFromName(name);
    if (activation && *activation != Activation::kQuickGelu) {
      c_.hidden_act = *activation;
      return Status::Ok();
    }
    return InvalidArgumentError(
        where_ + ": hidden_act '" + name +
        "' is not supported by this engine (supported: silu, gelu, gelu_pytorch_tanh, relu)");
  }

  // A bias key the family does not have: transformers ignores it, so only its neutral value is
  // accepted (another would say the checkpoint was trained with math it does not have).
  Status OnlyValue(const std::string& key, bool neutral) {
    const nlohmann::json& v = Take(key);
    if (v.is_null() || (v.is_boolean() && v.get<bool>() == neutral)) return Status::Ok();
    return Error(key, "is " + v.dump() + ", but transformers' " + c_.model_type +
                          " ignores it (its value is fixed to " + (neutral ? "true" : "false") +
                          "); remove it or fix the model_type");
  }

  Status ReadBiasesAndNorms() {
    const std::string& type = c_.model_type;
    if (type == "llama" || type == "qwen3" || type == "qwen3_vl") {
      ENGINE_ASSIGN_OR_RETURN(c_.qkv_bias, Bool("attention_bias", false));
      c_.o_bias = c_.qkv_bias;
    } else if (type == "qwen2" || type == "qwen2_vl" || type == "qwen2_5_vl") {
      c_.qkv_bias = true;  // Qwen2: q, k and v carry biases, o does not
      ENGINE_RETURN_IF_ERROR(OnlyValue("attention_bias", true));
    } else {
      ENGINE_RETURN_IF_ERROR(OnlyValue("attention_bias", false));
    }
    if (type == "llama") {
      ENGINE_ASSIGN_OR_RETURN(c_.mlp_bias, Bool("mlp_bias", false));
    } else {
      ENGINE_RETURN_IF_ERROR(OnlyValue("mlp_bias", false));
    }
    c_.qk_norm = type == "qwen3" || type == "qwen3_vl";
    c_.mrope_interleaved = type == "qwen3_vl";
    return Status::Ok();
  }

  // transformers 4: rope_theta and rope_scaling; transformers 5: rope_parameters holding both.
  Status ReadRope() {
    const nlohmann::json& parameters = Take("rope_parameters");
    const nlohmann::json& theta = Take("rope_theta");
    const nlohmann::json& scaling = Take("rope_scaling");
    if (!parameters.is_null()) {
      if (!parameters.is_object()) {
        return Error("rope_parameters", "must be an object, not " + parameters.dump());
      }
      const nlohmann::json inner_theta =
          parameters.contains("rope_theta") ? parameters["rope_theta"] : nlohmann::json();
      if (!theta.is_null() && !inner_theta.is_null() && theta != inner_theta) {
        return Error("rope_theta", theta.dump() + " disagrees with rope_parameters.rope_theta " +
                                       inner_theta.dump());
      }
      ENGINE_ASSIGN_OR_RETURN(
          c_.rope_theta, PositiveNumber(inner_theta.is_null() ? theta : inner_theta, "rope_theta",
                                        Defaults().rope_theta));
      if (!scaling.is_null()) {
        return Error("rope_scaling", "is given together with rope_parameters; keep one spelling");
      }
      return ReadRopeScaling(parameters, "rope_parameters");
    }
    ENGINE_ASSIGN_OR_RETURN(c_.rope_theta,
                            PositiveNumber(theta, "rope_theta", Defaults().rope_theta));
    if (scaling.is_null()) return Status::Ok();
    if (!scaling.is_object()) {
      return Error("rope_scaling", "must be an object or null, not " + scaling.dump());
    }
    return ReadRopeScaling(scaling, "rope_scaling");
  }

  // rope_type, or transformers 4's "type" (both must agree when both are given); "default" when
  // neither is (or, for a vision-language model, when either says "mrope").
  StatusOr<std::string> RopeType(const nlohmann::json& r, const std::string& key) const {
    // Qwen2-VL's "mrope" is the default rotary embedding split into sections: transformers 5
    // writes rope_type "default" and keeps transformers 4's "type": "mrope" beside it.
    const auto same_math = [&](const std::string& spelled) {
      return vision_language_ && spelled == "mrope" ? std::string("default") : spelled;
    };
    std::string type = "default", spelled_type;
    for (const char* spelling : {"rope_type", "type"}) {
      if (!r.contains(spelling) || r[spelling].is_null()) continue;
      const std::string given =
          r[spelling].is_string() ? r[spelling].get<std::string>() : r[spelling].dump();
      if (spelling == std::string("type") && r.contains("rope_type") && same_math(given) != type) {
        return InvalidArgumentError(where_ + ": " + key + ".type '" + given + "' disagrees with " +
                                    key + ".rope_type '" + spelled_type + "'");
      }
      type = same_math(given);
      spelled_type = given;
    }
    return type;
  }

  // rope_type (or transformers 4's "type") and the fields that type reads; any other field is an
  // error naming it.
  Status ReadRopeScaling(const nlohmann::json& r, const std::string& key) {
    ENGINE_ASSIGN_OR_RETURN(const std::string type, RopeType(r, key));
    if (vision_language_) return ReadMropeSection(r, key, type);
    std::set<std::string> fields;
    RopeScaling& s = c_.rope_scaling;
    if (type == "default") {
      s.type = RopeScaling::Type::kDefault;
    } else if (type == "linear" || type == "dynamic" || type == "llama3") {
      s.type = type == "linear"    ? RopeScaling::Type::kLinear
               : type == "dynamic" ? RopeScaling::Type::kDynamic
                                   : RopeScaling::Type::kLlama3;
      fields = {"factor"};
      if (type == "llama3") {
        fields.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
      }
    } else {
      return InvalidArgumentError(
          where_ + ": " + key + ".rope_type '" + type +
          "' is not supported by this engine (supported: default, linear, dynamic, llama3)");
    }
    for (auto it = r.begin(); it != r.end(); ++it) {
      const std::string& field = it.key();
      if (field == "rope_type" || field == "type" || field == "rope_theta") continue;
      if (!fields.count(field)) {
        return InvalidArgumentError(where_ + ": " + key + "." + field + " (" + it.value().dump() +
                                    ") is not read by this engine for rope_type '" + type +
                                    "', and it may change the rotary embedding");
      }
    }
    for (const std::string& field : fields) {
      if (!r.contains(field) || r[field].is_null()) {
        return InvalidArgumentError(where_ + ": " + key + "." + field + " is missing (rope_type '" +
                                    type + "' needs it)");
      }
      if (!r[field].is_number() || !(r[field].get<double>() > 0)) {
        return InvalidArgumentError(where_ + ": " + key + "." + field +
                                    " must be a positive number, not " + r[field].dump());
      }
    }
    if (fields.count("factor")) s.factor = r["factor"].get<double>();
    if (s.type == RopeScaling::Type::kLlama3) {
      s.low_freq_factor = r["low_freq_factor"].get<double>();
      s.high_freq_factor = r["high_freq_factor"].get<double>();
      s.original_max_position_embeddings =
          static_cast<int64_t>(r["original_max_position_embeddings"].get<double>());
      if (!(s.high_freq_factor > s.low_freq_factor)) {
        return InvalidArgumentError(where_ + ": " + key +
                                    ".high_freq_factor must be above low_freq_factor");
      }
    }
    return Status::Ok();
  }

  // Qwen2-VL's rope_scaling: type default (or mrope) with mrope_section, three bands summing to
  // head_dim / 2. Qwen3-VL's also says mrope_interleaved, and its bands default to 24/20/20.
  Status ReadMropeSection(const nlohmann::json& r, const std::string& key,
                          const std::string& type) {
    const bool qwen3 = c_.mrope_interleaved;
    if (type != "default") {  // RopeType reads "mrope" as "default"
      return InvalidArgumentError(where_ + ": " + key + ".rope_type '" + type +
                                  "' is not supported for " + c_.model_type +
                                  " (supported: default, mrope)");
    }
    for (auto it = r.begin(); it != r.end(); ++it) {
      // rope_parameters (transformers 5) holds rope_theta too, read by ReadRope.
      const bool theta = key == "rope_parameters" && it.key() == "rope_theta";
      if (qwen3 && it.key() == "mrope_interleaved") {
        // transformers' Qwen3-VL interleaves whatever the key says; a checkpoint that says
        // otherwise was not trained by it.
        if (it.value() != true) {
          return InvalidArgumentError(where_ + ": " + key + ".mrope_interleaved is " +
                                      it.value().dump() +
                                      ", but transformers' qwen3_vl always interleaves the "
                                      "rotary bands");
        }
        continue;
      }
      if (it.key() != "rope_type" && it.key() != "type" && it.key() != "mrope_section" && !theta) {
        return InvalidArgumentError(where_ + ": " + key + "." + it.key() + " (" +
                                    it.value().dump() + ") is not read by this engine for " +
                                    c_.model_type);
      }
    }
    if (qwen3 && !r.contains("mrope_section")) return Status::Ok();  // Read gives the default
    const nlohmann::json section = r.contains("mrope_section") ? r["mrope_section"] : nullptr;
    bool ok = section.is_array() && section.size() == 3;
    for (size_t i = 0; ok && i < section.size(); ++i) {
      ok = section[i].is_number_integer() && section[i].get<int64_t>() > 0;
      if (ok) c_.mrope_section.push_back(section[i].get<int64_t>());
    }
    if (!ok) {
      return InvalidArgumentError(where_ + ": " + key +
                                  ".mrope_section must be three positive integers, not " +
                                  section.dump());
    }
    // Interleaved bands need not fill the head: transformers takes the height and width bands
    // where they fall within it and the temporal positions everywhere else, as InterleavedBands.
    if (qwen3) return Status::Ok();
    return CheckMropeSum(key, section);
  }

  Status CheckMropeSum(const std::string& key, const nlohmann::json& section) const {
    int64_t sum = 0;
    for (int64_t band : c_.mrope_section) sum += band;
    if (sum * 2 != c_.head_dim()) {
      return InvalidArgumentError(where_ + ": " + key + ".mrope_section " + section.dump() +
                                  " sums to " + std::to_string(sum) +
                                  ", not head_dim / 2 = " + std::to_string(c_.head_dim() / 2));
    }
    return Status::Ok();
  }

  Status ReadWindow() {
    const std::string& type = c_.model_type;
    const nlohmann::json& window = Take("sliding_window");
    if (type == "llama" || type == "qwen3_vl") {
      if (!window.is_null()) {
        return Error("sliding_window", "is " + window.dump() + ", but transformers' " + type +
                                           " has no sliding window; remove it or fix the "
                                           "model_type");
      }
      return Status::Ok();
    }
    int64_t size = 0;
    if (!window.is_null()) {
      if (!window.is_number_integer() || window.get<int64_t>() <= 0) {
        return Error("sliding_window", "must be a positive integer or null, not " + window.dump());
      }
      size = window.get<int64_t>();
    }
    if (type == "mistral") {
      // Every layer slides.
      c_.sliding_window = size;
      c_.sliding_layers.assign(static_cast<size_t>(size > 0 ? c_.num_hidden_layers : 0), true);
      return Status::Ok();
    }
    return ReadQwenWindow(size);
  }

  // Qwen2 and Qwen3, as transformers 5 reads them: layer_types when given; otherwise, with
  // use_sliding_window, the layers from max_window_layers on slide. (transformers 4.x applied
  // sliding_window to every layer whenever it was set, even with use_sliding_window false.)
  Status ReadQwenWindow(int64_t size) {
    ENGINE_ASSIGN_OR_RETURN(const bool use, Bool("use_sliding_window", false));
    ENGINE_ASSIGN_OR_RETURN(const int64_t first,
                            PositiveInt("max_window_layers", c_.num_hidden_layers));
    const nlohmann::json& types = Take("layer_types");
    std::vector<bool> layers(static_cast<size_t>(c_.num_hidden_layers), false);
    if (!types.is_null()) {
      if (!types.is_array() || static_cast<int64_t>(types.size()) != c_.num_hidden_layers) {
        return Error("layer_types", "must list one type per layer (" +
                                        std::to_string(c_.num_hidden_layers) + "), not " +
                                        types.dump());
      }
      for (size_t i = 0; i < types.size(); ++i) {
        if (types[i] == "sliding_attention") {
          layers[i] = true;
        } else if (types[i] != "full_attention") {
          return Error("layer_types", "holds " + types[i].dump() +
                                          " (supported: full_attention, sliding_attention)");
        }
      }
    } else if (use) {
      for (int64_t i = first; i < c_.num_hidden_layers; ++i) layers[static_cast<size_t>(i)] = true;
    }
    const bool any = std::find(layers.begin(), layers.end(), true) != layers.end();
    if (any && size == 0) {
      return Error("sliding_window",
                   "is null, but layers slide (use_sliding_window or "
                   "layer_types); give the window's size");
    }
    if (any) {
      c_.sliding_window = size;
      c_.sliding_layers = layers;
    }
    return Status::Ok();
  }

  Status ReadTokenIds() {
    for (auto [key, target] :
         {std::pair<const char*, nlohmann::json*>{"bos_token_id", &c_.bos_token_id},
          {"eos_token_id", &c_.eos_token_id},
          {"pad_token_id", &c_.pad_token_id}}) {
      const nlohmann::json& v = Take(key);
      bool ok = v.is_null() || v.is_number_integer();
      if (v.is_array()) {
        ok = true;
        for (const auto& id : v) ok = ok && id.is_number_integer();
      }
      if (!ok) return Error(key, "must be a token id, a list of them, or null, not " + v.dump());
      *target = v;
    }
    return Status::Ok();
  }

  // Keys this engine has no code for, accepted at the value that means "off".
  Status ReadNeutralKeys() {
    const nlohmann::json& dropout = Take("attention_dropout");
    if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0)) {
      return Error("attention_dropout", "is " + dropout.dump() +
                                            "; this engine has no attention dropout (only 0 is "
                                            "supported)");
    }
    const nlohmann::json& partial = Take("partial_rotary_factor");
    if (!partial.is_null() && !(partial.is_number() && partial.get<double>() == 1)) {
      return Error(
          "partial_rotary_factor",
          "is " + partial.dump() + "; this engine rotates whole heads (only 1 is supported)");
    }
    const nlohmann::json& mrope = Take("use_mrope");
    if (!mrope.is_null() && mrope != false) {
      return Error("use_mrope",
                   "is " + mrope.dump() +
                       "; multimodal rotary positions need the qwen2_vl, qwen2_5_vl or qwen3_vl "
                       "loader");
    }
    return Status::Ok();
  }

  // A checkpoint bitsandbytes saved in 4 bits (NF4) is read as bitsandbytes dequantizes it
  // (bnb4_checkpoint.h: the tensors say which layers and how); any other quantization is refused.
  // bnb_4bit_compute_dtype is not the model's: the stage's precision says what its matmuls run in.
  Status ReadQuantization() {
    const nlohmann::json& q = Take("quantization_config");
    if (q.is_null()) return Status::Ok();
    const auto field = [&q](const char* key) {
      return q.is_object() && q.contains(key) ? q[key] : nlohmann::json();
    };
    const nlohmann::json storage = field("bnb_4bit_quant_storage");
    if (field("quant_method") != "bitsandbytes" || field("load_in_4bit") != true ||
        field("bnb_4bit_quant_type") != "nf4" || !(storage.is_null() || storage == "uint8")) {
      return Error("quantization_config",
                   "has quant_method " + field("quant_method").dump() + ", load_in_4bit " +
                       field("load_in_4bit").dump() + ", bnb_4bit_quant_type " +
                       field("bnb_4bit_quant_type").dump() + ", bnb_4bit_quant_storage " +
                       storage.dump() +
                       "; of quantized checkpoints only bitsandbytes' 4-bit NF4 ones (uint8 "
                       "storage) are read");
    }
    return Status::Ok();
  }

  Status RefuseUnreadKeys() const {
    return RefuseUnread(KeysWithoutMath(), "is not implemented by this engine's " + c_.model_type +
                                               " loader and may change the model's math");
  }

  std::string where_;
  bool vision_language_;
  LlamaConfig c_;
};

}  // namespace

StatusOr<LlamaConfig> ConfigFromJson(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not a JSON object");
  return ConfigReader(json, where).Read();
}

StatusOr<LlamaConfig> Qwen2VlTextConfigFromJson(const nlohmann::json& json,
                                                const std::string& where) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not a JSON object");
  return ConfigReader(json, where, /*vision_language=*/true).Read();
}

}  // namespace engine::transformer
