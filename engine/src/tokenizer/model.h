// tokenizer.json's "model": how one pre-tokenized word becomes ids. The registry picks the
// implementation by the model's "type": BPE (bpe_model.h), Unigram (unigram_model.h) and
// WordPiece (wordpiece_model.h); any other type is an error naming it.
//
// Immutable after parsing; Encode may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"

namespace engine::tokenizer {

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of `word` (valid UTF-8) to `ids`.
  virtual void Encode(std::string_view word, std::vector<int64_t>* ids) const = 0;
  // The token of `id`, or nullptr.
  virtual const std::string* Token(int64_t id) const = 0;
  // The id of `token`, or -1.
  virtual int64_t Id(std::string_view token) const = 0;
  // One past the largest id.
  virtual int64_t size() const = 0;
};

// `path` names the field ("model") in errors.
StatusOr<std::unique_ptr<Model>> ParseModel(const Json& json, const std::string& path);

}  // namespace engine::tokenizer
