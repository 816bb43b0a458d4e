#include "tokenizer/post_processor.h"

namespace engine::tokenizer {
namespace {

// BertProcessing/RobertaProcessing's ["token", id] pairs.
StatusOr<int64_t> PairId(const Json& json, const std::string& key, const std::string& path) {
  const auto found = json.find(key);
  if (found == json.end() || !found->is_array() || found->size() != 2 ||
      !(*found)[1].is_number_integer()) {
    return FieldError(path + "." + key, "must be [\"token\", id]");
  }
  return (*found)[1].get<int64_t>();
}

}  // namespace

StatusOr<PostProcessor> PostProcessor::Parse(const Json& json, const std::string& path) {
  PostProcessor processor;
  if (json.is_null()) return processor;
  ENGINE_RETURN_IF_ERROR(processor.ParseOne(json, path));
  return processor;
}

Status PostProcessor::ParseOne(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(std::string type, TypeField(json, path));
  if (type == "ByteLevel") return Status::Ok();
  if (type == "TemplateProcessing") return ParseTemplate(json, path);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    ENGINE_ASSIGN_OR_RETURN(int64_t cls, PairId(json, "cls", path));
    ENGINE_ASSIGN_OR_RETURN(int64_t sep, PairId(json, "sep", path));
    prefix_.push_back(cls);
    suffix_.insert(suffix_.begin(), sep);
    return Status::Ok();
  }
  if (type == "Sequence") {
    ENGINE_ASSIGN_OR_RETURN(const Json* list, ArrayField(json, "processors", path));
    for (size_t i = 0; i < list->size(); ++i) {
      ENGINE_RETURN_IF_ERROR(ParseOne((*list)[i], path + ".processors[" + std::to_string(i) + "]"));
    }
    return Status::Ok();
  }
  return FieldError(path + ".type", "unsupported post-processor '" + type +
                                        "' (supported: TemplateProcessing, BertProcessing, "
                                        "RobertaProcessing, ByteLevel, Sequence)");
}

Status PostProcessor::ParseTemplate(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(const Json* single, ArrayField(json, "single", path));
  const Json empty = Json::object();
  const auto tokens = json.find("special_tokens");
  const Json& special = tokens != json.end() && tokens->is_object() ? *tokens : empty;
  bool after_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string where = path + ".single[" + std::to_string(i) + "]";
    if (item.is_object() && item.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
      return FieldError(where, "must be {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    const auto found = special.find(name);
    if (found == special.end() || !found->contains("ids") || !(*found)["ids"].is_array()) {
      return FieldError(path + ".special_tokens", "has no ids for '" + name + "'");
    }
    for (const Json& id : (*found)["ids"]) {
      if (!id.is_number_integer()) return FieldError(path + ".special_tokens." + name, "bad id");
      (after_sequence ? suffix_ : prefix_).push_back(id.get<int64_t>());
    }
  }
  return Status::Ok();
}

std::vector<int64_t> PostProcessor::Apply(const std::vector<int64_t>& ids) const {
  std::vector<int64_t> out;
  out.reserve(prefix_.size() + ids.size() + suffix_.size());
  out.insert(out.end(), prefix_.begin(), prefix_.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

}  // namespace engine::tokenizer
