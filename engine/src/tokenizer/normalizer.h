// tokenizer.json's "normalizer": how text is rewritten before it is split. Supported types:
// NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, BertNormalizer,
// Precompiled (precompiled_charsmap.h) and Sequence; any other type is an error naming it (and the
// field it is in).
//
// Immutable after parsing; Normalize may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include "engine/status.h"
#include "tokenizer/json_fields.h"

namespace engine::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string Normalize(std::string text) const = 0;
};

// `path` names the field ("normalizer") for errors. A null `json` gives nullptr (no normalizer).
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json, const std::string& path);

}  // namespace engine::tokenizer
