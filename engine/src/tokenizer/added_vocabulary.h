// tokenizer.json's "added_tokens": tokens matched in the text before anything else, so that
// "<|im_start|>" is one id however the model would split it. As in the tokenizers crate, tokens
// with normalized=false are found in the raw text and the others in each normalized stretch
// (their content normalized too); the leftmost, then longest match wins; lstrip/rstrip take the
// whitespace beside a match into it; single_word tokens match only between non-word characters.
//
// Immutable after parsing; Split may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace engine::tokenizer {

struct AddedToken {
  int64_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

class AddedVocabulary {
 public:
  // `normalizer` (may be null) normalizes the contents of normalized tokens.
  static StatusOr<AddedVocabulary> Parse(const Json& list, const std::string& path,
                                         const Normalizer* normalizer);

  // Cuts `piece` at the added tokens of one kind (normalized ones or the others), appending the
  // parts in order; token parts carry their id.
  void Split(const Piece& piece, bool normalized, std::vector<Piece>* out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The added token with `id`, or nullptr.
  const AddedToken* Find(int64_t id) const;
  // The id of the added token whose content is `content`, or -1.
  int64_t Id(const std::string& content) const;

 private:
  // A byte trie over token contents.
  struct Trie {
    std::vector<std::unordered_map<unsigned char, int32_t>> children{1};
    std::vector<int32_t> token_at{-1};  // index into tokens_ of a token ending at the node
    bool empty = true;
    void Insert(const std::string& text, int32_t token);
    // The longest token starting at `pos`: its index and end, or -1.
    int32_t LongestAt(const std::string& text, size_t pos, size_t* end) const;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int64_t, size_t> by_id_;
  Trie raw_;
  Trie normalized_;
};

}  // namespace engine::tokenizer
