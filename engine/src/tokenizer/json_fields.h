// Reading tokenizer.json's fields with errors that name the field: every reader takes the
// field's path ("pre_tokenizer.pretokenizers[1].pattern") and the caller adds the file name.
//
// Pure functions; any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/status.h"

namespace engine::tokenizer {

using Json = nlohmann::json;

Status FieldError(const std::string& path, const std::string& problem);

// A missing or null field gives `fallback`; a field of another type is an error.
StatusOr<std::string> StringField(const Json& object, const std::string& key,
                                  const std::string& path, const std::string& fallback);
StatusOr<bool> BoolField(const Json& object, const std::string& key, const std::string& path,
                         bool fallback);
StatusOr<int64_t> IntField(const Json& object, const std::string& key, const std::string& path,
                           int64_t fallback);
// A required field of the given kind.
StatusOr<const Json*> ObjectField(const Json& object, const std::string& key,
                                  const std::string& path);
StatusOr<const Json*> ArrayField(const Json& object, const std::string& key,
                                 const std::string& path);
// A component's "type".
StatusOr<std::string> TypeField(const Json& component, const std::string& path);

// A "pattern" field: {"String": "..."} (a literal) or {"Regex": "..."}; sets `*is_regex`.
StatusOr<std::string> PatternField(const Json& object, const std::string& path, bool* is_regex);

}  // namespace engine::tokenizer
