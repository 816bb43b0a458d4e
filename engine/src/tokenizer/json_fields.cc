#include "tokenizer/json_fields.h"

namespace engine::tokenizer {

Status FieldError(const std::string& path, const std::string& problem) {
  return InvalidArgumentError(path + ": " + problem);
}

StatusOr<std::string> StringField(const Json& object, const std::string& key,
                                  const std::string& path, const std::string& fallback) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return fallback;
  if (!found->is_string()) return FieldError(path + "." + key, "must be a string");
  return found->get<std::string>();
}

StatusOr<bool> BoolField(const Json& object, const std::string& key, const std::string& path,
                         bool fallback) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return fallback;
  if (!found->is_boolean()) return FieldError(path + "." + key, "must be true or false");
  return found->get<bool>();
}

StatusOr<int64_t> IntField(const Json& object, const std::string& key, const std::string& path,
                           int64_t fallback) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return fallback;
  if (!found->is_number_integer()) return FieldError(path + "." + key, "must be an integer");
  return found->get<int64_t>();
}

StatusOr<const Json*> ObjectField(const Json& object, const std::string& key,
                                  const std::string& path) {
  const auto found = object.find(key);
  if (found == object.end() || !found->is_object()) {
    return FieldError(path + "." + key, "must be an object");
  }
  return &*found;
}

StatusOr<const Json*> ArrayField(const Json& object, const std::string& key,
                                 const std::string& path) {
  const auto found = object.find(key);
  if (found == object.end() || !found->is_array()) {
    return FieldError(path + "." + key, "must be a list");
  }
  return &*found;
}

StatusOr<std::string> TypeField(const Json& component, const std::string& path) {
  if (!component.is_object()) return FieldError(path, "must be an object with a \"type\"");
  ENGINE_ASSIGN_OR_RETURN(std::string type, StringField(component, "type", path, ""));
  if (type.empty()) return FieldError(path + ".type", "is missing");
  return type;
}

StatusOr<std::string> PatternField(const Json& object, const std::string& path, bool* is_regex) {
  ENGINE_ASSIGN_OR_RETURN(const Json* pattern, ObjectField(object, "pattern", path));
  if (const auto found = pattern->find("Regex"); found != pattern->end() && found->is_string()) {
    *is_regex = true;
    return found->get<std::string>();
  }
  if (const auto found = pattern->find("String"); found != pattern->end() && found->is_string()) {
    *is_regex = false;
    return found->get<std::string>();
  }
  return FieldError(path + ".pattern", "must be {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace engine::tokenizer
