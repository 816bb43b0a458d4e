#include "llama_setup.h"

#include <glog/logging.h>

#include "engine/paths.h"
#include "hf_checkpoint.h"

namespace engine::transformer {

void ValidateLlamaOptions(const LlamaOptions& o, const std::string& prefix, OptionErrors* errors) {
  if (o.has_pretrained()) {
    if (o.pretrained().empty()) errors->Add(prefix + "pretrained", "is empty");
    // A pretrained directory's config.json fixes the sizes; a size given too would be ignored.
    for (const char* field :
         {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
          "rope_theta", "tie_word_embeddings", "initializer_range"}) {
      const auto* descriptor = o.GetDescriptor()->FindFieldByName(field);
      if (o.GetReflection()->HasField(o, descriptor)) {
        errors->Add(prefix + field,
                    "is set together with `pretrained`, whose config.json decides the sizes; "
                    "remove one");
      }
    }
    return;
  }
  LlamaConfig sizes;
  sizes.vocab_size = o.vocab_size();
  sizes.hidden_size = o.hidden_size();
  sizes.intermediate_size = o.intermediate_size();
  sizes.num_hidden_layers = o.num_hidden_layers();
  sizes.num_attention_heads = o.num_attention_heads();
  sizes.num_key_value_heads = o.num_key_value_heads();
  sizes.max_position_embeddings = o.max_position_embeddings();
  for (const auto& [name, value, limit] : LlamaSizeLimits(sizes)) {
    if (value > limit) {
      errors->Add(prefix + name, "must be at most " + std::to_string(limit) + " (got " +
                                     std::to_string(value) + ")");
    }
  }
  if (o.hidden_size() == 0) errors->Add(prefix + "hidden_size", "must be > 0");
  if (o.num_hidden_layers() == 0) errors->Add(prefix + "num_hidden_layers", "must be > 0");
  if (o.num_attention_heads() == 0) {
    errors->Add(prefix + "num_attention_heads", "must be > 0");
  } else {
    if (o.hidden_size() % o.num_attention_heads() != 0) {
      errors->Add(prefix + "hidden_size", "must be a multiple of num_attention_heads (" +
                                              std::to_string(o.num_attention_heads()) + ")");
    } else if ((o.hidden_size() / o.num_attention_heads()) % 2 != 0) {
      errors->Add(prefix + "hidden_size",
                  "hidden_size / num_attention_heads must be even (rotary embeddings)");
    }
    if (o.num_key_value_heads() > 0 && o.num_attention_heads() % o.num_key_value_heads() != 0) {
      errors->Add(
          prefix + "num_key_value_heads",
          "must divide num_attention_heads (" + std::to_string(o.num_attention_heads()) + ")");
    }
  }
  if (!(o.rms_norm_eps() > 0)) errors->Add(prefix + "rms_norm_eps", "must be > 0");
  if (!(o.rope_theta() > 0)) errors->Add(prefix + "rope_theta", "must be > 0");
  if (!(o.initializer_range() > 0)) errors->Add(prefix + "initializer_range", "must be > 0");
}

namespace {

bool TokenLabels(const DataSpec* data) {
  const FieldSpec* ids = data->Find("input_ids");
  const FieldSpec* labels = data->Find("labels");
  return ids != nullptr && labels != nullptr && labels->shape == ids->shape &&
         !at::isFloatingType(labels->dtype);
}

}  // namespace

bool UsesTokenLabels(const DataSpec* data) {
  if (data == nullptr || data->Find("labels") == nullptr) return false;
  if (TokenLabels(data)) return true;
  LOG(WARNING) << "the data's 'labels' field is not one target per token (the shape of "
                  "'input_ids'); the model predicts the next input id and ignores it";
  return false;
}

Status CheckDataVocab(const DataSpec* data, int64_t vocab_size) {
  if (data == nullptr) return Status::Ok();
  for (const FieldSpec& field : data->fields) {
    if (field.name != "input_ids" && !(field.name == "labels" && TokenLabels(data))) continue;
    if (field.num_classes > vocab_size) {
      return InvalidArgumentError(
          "the data's '" + field.name + "' has " + std::to_string(field.num_classes) +
          " token ids but the model's vocabulary has " + std::to_string(vocab_size) +
          " (another tokenizer than the model's?)");
    }
  }
  return Status::Ok();
}

StatusOr<ResolvedLlama> ResolveLlama(const LlamaOptions& options, const DataSpec* data,
                                     const std::filesystem::path& base_dir) {
  ResolvedLlama resolved;
  if (data != nullptr && data->Find("input_ids") == nullptr) {
    return InvalidArgumentError(
        "the model needs an 'input_ids' field from the data loader, "
        "which provides: " +
        data->ToString());
  }
  if (!options.pretrained().empty()) {
    const std::filesystem::path dir = ResolvePath(base_dir, options.pretrained());
    ENGINE_ASSIGN_OR_RETURN(nlohmann::json json, ReadConfigJson(dir));
    ENGINE_ASSIGN_OR_RETURN(resolved.config,
                            ConfigFromJson(json, "'" + (dir / "config.json").string() + "'"));
    resolved.pretrained_dir = dir;
  } else {
    const FieldSpec* ids = data != nullptr ? data->Find("input_ids") : nullptr;
    ENGINE_ASSIGN_OR_RETURN(resolved.config,
                            ConfigFromOptions(options, ids != nullptr ? ids->num_classes : 0));
  }
  ENGINE_RETURN_IF_ERROR(CheckDataVocab(data, resolved.config.vocab_size));
  return resolved;
}

bool LabelsMarkAnswers(const DataSpec* data) {
  if (data == nullptr || !TokenLabels(data)) return false;
  const FieldSpec* labels = data->Find("labels");
  return labels != nullptr && labels->num_classes == 0;
}

}  // namespace engine::transformer
