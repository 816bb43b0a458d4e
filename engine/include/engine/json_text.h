// JSON text for output a user or a program reads (plans, errors, metrics lines).
//
// Strings may hold bytes that are not UTF-8 (a pipeline name, a path, a data error quoting file
// bytes); nlohmann::json's plain dump() throws on them, which would lose the whole output. JsonText
// replaces each invalid sequence with U+FFFD instead and never throws.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace engine {

// `indent` < 0: one line.
inline std::string JsonText(const nlohmann::json& json, int indent = -1) {
  return json.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace engine
