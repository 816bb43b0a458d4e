// A Hugging Face tokenizer.json, encoded and decoded token for token as the tokenizers crate
// does: added tokens first, then the normalizer, the pre-tokenizer, the model (BPE, Unigram or
// WordPiece), and (when special tokens are asked for) the post-processor's template. The
// supported components are listed in normalizer.h, pre_tokenizer.h, model.h, post_processor.h and
// decoder.h.
//
//   ENGINE_ASSIGN_OR_RETURN(auto tokenizer, HfTokenizer::FromFile("model/tokenizer.json"));
//   std::vector<int64_t> ids = tokenizer->Encode("Hello", /*add_special_tokens=*/false);
//
// Failure: a file that cannot be read, JSON that does not parse, or a field that is malformed or
// names an unsupported component is an error naming the file and the field. Text that is not
// valid UTF-8 is encoded as if each invalid byte run were U+FFFD (tokenizers only takes valid
// text). Immutable after loading; Encode and Decode may be called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/decoder.h"
#include "tokenizer/model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace engine::tokenizer {

class HfTokenizer {
 public:
  static StatusOr<std::unique_ptr<HfTokenizer>> FromFile(const std::filesystem::path& path);
  // `origin` names the text in errors (a file name).
  static StatusOr<std::unique_ptr<HfTokenizer>> FromJson(std::string_view text,
                                                         const std::string& origin);

  // With `max_tokens`, the first max_tokens ids of the whole text's (before the post-processor
  // adds its special tokens), found without encoding the words after them.
  std::vector<int64_t> Encode(std::string_view text, bool add_special_tokens,
                              size_t max_tokens = std::numeric_limits<size_t>::max()) const;
  // `text` through the normalizer alone (no added tokens, no pre-tokenizer): what the model's
  // words are cut from.
  std::string Normalize(std::string_view text) const;
  // Unknown ids are skipped; so are special added tokens when `skip_special_tokens`.
  std::string Decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const;

  // One past the largest id of the model or the added tokens.
  int64_t vocab_size() const;
  // The id of a token (added tokens first), or -1.
  int64_t TokenId(const std::string& token) const;
  // The token of an id, or nullptr.
  const std::string* Token(int64_t id) const;
  bool IsSpecial(int64_t id) const;
  const PostProcessor& post_processor() const { return post_processor_; }
  const AddedVocabulary& added_tokens() const { return added_; }

 private:
  HfTokenizer() = default;
  Status ParseComponents(const Json& json);
  // The text cut at added tokens and normalized, as pieces that are either added tokens or
  // normalized text.
  std::vector<Piece> ExtractAndNormalize(std::string_view text) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Model> model_;
  PostProcessor post_processor_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
};

}  // namespace engine::tokenizer
