// tokenizer.json's "pre_tokenizer": how normalized text is cut into the words the model encodes
// one by one. Supported types: ByteLevel, Split, Metaspace, Digits, Whitespace, WhitespaceSplit,
// BertPreTokenizer, Punctuation and Sequence; any other type is an error naming it.
//
// Immutable after parsing; Split may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace engine::tokenizer {

// A stretch of text on its way to ids. `at_origin`: it starts where the original text starts
// (Metaspace's "first" scheme prepends only there). `added_id` >= 0: an added token, left alone.
struct Piece {
  std::string text;
  bool at_origin = false;
  int64_t added_id = -1;
};

// How a split keeps what it matched (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// `piece` cut along `spans` (which cover it), keeping the matches as `behavior` says; empty
// results are dropped.
void SplitAlong(const Piece& piece, std::vector<Span> spans, SplitBehavior behavior,
                std::vector<Piece>* out);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void Split(const Piece& piece, std::vector<Piece>* out) const = 0;
};

// A null `json` gives nullptr (the whole normalized text is one word).
StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                          const std::string& path);

}  // namespace engine::tokenizer
