// One line of a JSON Lines data file, parsed with bounds: a line from a downloaded dataset may be
// hundreds of megabytes or nested millions deep, and nothing downstream (rendering, tokenizing,
// converting values) should have to cope with that.
//
//   ENGINE_ASSIGN_OR_RETURN(nlohmann::json json, ParseDataLine<nlohmann::json>(line, "a.jsonl:7"));
//
// Failure names `where` (FILE:LINE): a line over the `data_line` limit of engine/untrusted_file.h
// (checked before parsing), nested deeper than kMaxDataLineDepth, not valid JSON, or not an object.
// Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include "engine/status.h"
#include "engine/untrusted_file.h"

namespace engine::plugins {

// Arrays and objects inside one another; a conversation with content parts needs 5.
inline constexpr int kMaxDataLineDepth = 64;

// The deepest nesting of arrays and objects in `line`, stopping once past `limit`; strings (and
// the brackets inside them) are skipped.
int JsonNestingDepth(std::string_view line, int limit);

template <typename Json>
StatusOr<Json> ParseDataLine(std::string_view line, const std::string& where) {
  ENGINE_RETURN_IF_ERROR(CheckFileLimit(FileKind::kDataLine, line.size(), where));
  if (JsonNestingDepth(line, kMaxDataLineDepth) > kMaxDataLineDepth) {
    return DataLossError(where + ": nested more than " + std::to_string(kMaxDataLineDepth) +
                         " arrays or objects deep");
  }
  Json json = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return DataLossError(where + ": not valid JSON");
  if (!json.is_object()) return DataLossError(where + ": not a JSON object");
  return json;
}

}  // namespace engine::plugins
