// tokenizer.json's "model" of type WordPiece (BERT's): each word is cut greedily into the longest
// vocabulary entries from its start, every piece after the first carrying the
// continuing_subword_prefix ("##"); a word with a part no entry matches, or longer than
// max_input_chars_per_word characters, is the one unk_token. As the Hugging Face tokenizers crate
// does.
//
// Failure (at parse time): a vocabulary that is not {"token": id}, or an unk_token missing from it,
// naming the field. Immutable after parsing; Encode may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/model.h"

namespace engine::tokenizer {

class WordPieceModel : public VocabularyModel {
 public:
  static StatusOr<std::unique_ptr<Model>> Parse(const Json& json, const std::string& path);

  void Encode(std::string_view word, std::vector<int64_t>* ids) const override;

 private:
  int32_t unk_id_ = -1;
  std::string prefix_;
  int64_t max_chars_ = 100;
};

}  // namespace engine::tokenizer
