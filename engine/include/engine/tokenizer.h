// Text to token ids and back, for data loaders (and models that decode).
//
//   ENGINE_ASSIGN_OR_RETURN(auto tokenizer, engine::MakeTokenizer(options.tokenizer(), base_dir));
//   std::vector<int64_t> ids = tokenizer->Encode("seven");
//
// Three kinds: byte-level (the default: no files, 259 ids), SentencePiece models, and Hugging Face
// tokenizer.json files (text/hf_json_tokenizer.h). Errors name the file. Tokenizers are immutable
// after creation; Encode and Decode may be called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plugin.h"
#include "engine/status.h"
#include "engine/tokenizer.pb.h"

namespace engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int64_t> Encode(std::string_view text) const = 0;
  // Ids that are not text (pad, bos, eos, out of range) are skipped.
  virtual std::string Decode(const std::vector<int64_t>& ids) const = 0;
  // The text of every id, special tokens included (how chat data finds which tokens carry loss).
  virtual std::string DecodeWithSpecialTokens(const std::vector<int64_t>& ids) const {
    return Decode(ids);
  }
  virtual int64_t vocab_size() const = 0;
  virtual int64_t pad_id() const = 0;
  virtual int64_t bos_id() const = 0;
  virtual int64_t eos_id() const = 0;
  // "byte-level, 259 ids", "SentencePiece tokenizer.model, 32,000 ids".
  virtual std::string description() const = 0;
  // Changes when the mapping changes (part of data identities).
  virtual std::string identity() const = 0;
  // The first `max_tokens` ids of Encode(text). A tokenizer may stop early, so that the work
  // follows max_tokens rather than the text: data loaders that keep max_length tokens ask for
  // max_length + 1 and so also learn whether the text was longer. (Declared last, so that the
  // slots of the functions above stay where plugins built against an older SDK call them.)
  virtual std::vector<int64_t> EncodeAtMost(std::string_view text, size_t max_tokens) const {
    std::vector<int64_t> ids = Encode(text);
    if (ids.size() > max_tokens) ids.resize(max_tokens);
    return ids;
  }
};

// Adds errors for options that cannot make a tokenizer (a SENTENCEPIECE kind without its
// model_file, an HF_JSON kind without its path), under `prefix` ("tokenizer.").
void ValidateTokenizerOptions(const proto::TokenizerOptions& options, const std::string& prefix,
                              OptionErrors* errors);

// `base_dir` resolves a relative model_file.
StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const proto::TokenizerOptions& options,
                                                   const std::filesystem::path& base_dir);

}  // namespace engine
