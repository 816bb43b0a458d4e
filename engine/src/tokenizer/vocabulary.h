// The tokens of a tokenizer.json model and their ids, both ways: what every model type (BPE,
// Unigram, WordPiece) looks tokens up in. An id may be missing (gaps) and a token may be given two
// ids (the later one wins, as in the tokenizers crate's maps).
//
// Immutable after building; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"

namespace engine::tokenizer {

class Vocabulary {
 public:
  // How many ids past twice the token count a vocabulary may use (gaps, added tokens' ids).
  static constexpr int64_t kUnusedIdMargin = 1 << 20;

  // {"token": id, ...}; `path` names the field in errors. An id past twice the token count plus
  // kUnusedIdMargin is an error (the table it indexes would be that large).
  static StatusOr<Vocabulary> FromObject(const Json& vocab, const std::string& path);

  // `id` >= 0.
  void Add(std::string token, int32_t id);
  // The id of `token`, or -1. (Two overloads: a std::string is looked up without a copy.)
  int64_t Id(const std::string& token) const;
  int64_t Id(std::string_view token) const { return Id(std::string(token)); }
  // The token of `id`, or nullptr where the vocabulary has no such id.
  const std::string* Token(int64_t id) const;
  // One past the largest id.
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  // The length in bytes of the longest token.
  size_t longest() const { return longest_; }
  // The ids of the byte tokens <0x00> .. <0xFF> (byte_fallback), -1 where missing.
  std::vector<int32_t> ByteIds() const;

 private:
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> tokens_;  // by id
  std::vector<bool> present_;        // by id: false in the gaps
  size_t longest_ = 0;
};

}  // namespace engine::tokenizer
