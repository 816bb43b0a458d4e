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
#include "tokenizer/vocabulary.h"

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

// A model whose tokens are a Vocabulary (all three types): the lookups, in one place.
class VocabularyModel : public Model {
 public:
  const std::string* Token(int64_t id) const override { return vocab_.Token(id); }
  int64_t Id(std::string_view token) const override { return vocab_.Id(token); }
  int64_t size() const override { return vocab_.size(); }

 protected:
  Vocabulary vocab_;
};

// `path` names the field ("model") in errors.
StatusOr<std::unique_ptr<Model>> ParseModel(const Json& json, const std::string& path);

}  // namespace engine::tokenizer
