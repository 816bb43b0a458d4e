// tokenizer.json's "model" of type BPE: a vocabulary and ranked merges, applied to each word as
// the Hugging Face tokenizers crate does (lowest rank first, leftmost on ties; ignore_merges
// takes a word that is itself in the vocabulary whole; byte_fallback spells characters missing
// from the vocabulary as <0xXX> tokens; otherwise unk_token, fused when fuse_unk). Merges may be
// written as "a b" strings or ["a", "b"] pairs.
//
// Failure (at parse time): dropout (encoding would not be deterministic), a
// merge or unk_token naming a token missing from the vocabulary, each naming the field.
// Immutable after parsing; Encode may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/model.h"

namespace engine::tokenizer {

class BpeModel : public VocabularyModel {
 public:
  static StatusOr<std::unique_ptr<Model>> Parse(const Json& json, const std::string& path);

  void Encode(std::string_view word, std::vector<int64_t>* ids) const override;

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int64_t left, int64_t right) {
    return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  }
  Status ParseMerges(const Json& merges, const std::string& path);
  // The word's characters as initial symbols (ids with their byte lengths).
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;
  void MergeAll(std::vector<int32_t>* symbols) const;

  std::unordered_map<uint64_t, Merge> merges_;
  int32_t unk_id_ = -1;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_ids_;  // <0xXX> ids by byte, -1 where missing
};

}  // namespace engine::tokenizer
