// tokenizer.json's "model" of type Unigram (SentencePiece's unigram language model, as T5,
// ALBERT, XLNet and mBART ship it): each word is cut into the pieces whose scores sum highest
// (Viterbi over every vocabulary piece that starts at each character), as the Hugging Face
// tokenizers crate does: ties keep the first path found, a character no piece covers is unk_id
// with the lowest score less 10, neighbouring unknowns fuse into one, and with byte_fallback an
// unknown stretch is spelled as <0xXX> tokens when the vocabulary has them all.
//
// Failure (at parse time): a vocabulary that is not [[piece, score], ...], an unk_id outside it,
// or no unk_id (tokenizers fails on any text with a character the pieces miss), each naming the
// field. Immutable after parsing; Encode may be called from any thread.
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

class UnigramModel : public VocabularyModel {
 public:
  static StatusOr<std::unique_ptr<Model>> Parse(const Json& json, const std::string& path);

  void Encode(std::string_view word, std::vector<int64_t>* ids) const override;

 private:
  // A byte trie of the pieces: node 0 is the root; an edge is (node << 8 | byte) -> child.
  struct TrieNode {
    int32_t piece = -1;  // the piece id ending here (the last one given, as tokenizers keeps)
  };
  // After vocab_ holds `piece`.
  void AddToTrie(const std::string& piece);
  // The best cut of `word`, as (begin, end, id) from the start; unk_id marks unknown stretches.
  struct Cut {
    size_t begin, end;
    int32_t id;
  };
  std::vector<Cut> BestPath(std::string_view word) const;
  void AppendIds(std::string_view text, int32_t id, std::vector<int64_t>* ids) const;

  std::vector<double> scores_;  // by id
  std::vector<TrieNode> nodes_;
  std::unordered_map<uint64_t, int32_t> edges_;
  int32_t unk_id_ = -1;
  double unk_score_ = 0;
  bool byte_fallback_ = false;
  std::vector<int32_t> byte_ids_;
};

}  // namespace engine::tokenizer
