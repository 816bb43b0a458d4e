// The "Precompiled" normalizer of tokenizer.json: SentencePiece's normalization rules (nmt_nfkc
// and the like) as the model was trained with them, carried as `precompiled_charsmap` (base64 of
// SentencePiece's blob: a little-endian u32 byte size, a Darts double-array trie of that many
// bytes mapping UTF-8 keys to offsets, then the NUL-terminated replacements those offsets point
// into). Text is rewritten as the Hugging Face tokenizers crate does: each grapheme cluster
// shorter than 6 bytes is replaced whole when a rule matches a prefix of it (the shortest rule
// that matches, as tokenizers takes it), otherwise each of its characters by its own rule.
//
// Failure (at parse time): base64 that does not decode, a size that does not fit the blob, or
// replacements that are not UTF-8, not NUL-terminated or longer than 256 bytes, naming the field.
// Every trie lookup is bounds-checked, so a hostile blob cannot read outside itself. Immutable
// after parsing; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"

namespace engine::tokenizer {

class PrecompiledCharsmap {
 public:
  // `base64` is the field's text; `path` names it in errors.
  static StatusOr<PrecompiledCharsmap> Parse(std::string_view base64, const std::string& path);

  std::string Normalize(std::string_view text) const;

 private:
  // The replacement of the shortest rule matching a prefix of `chunk`, if any.
  std::optional<std::string_view> Transform(std::string_view chunk) const;

  std::vector<uint32_t> units_;  // the double array
  std::string replacements_;
};

// Standard base64 with its padding (as tokenizer.json writes binary fields); nullopt when `text`
// is not that.
std::optional<std::string> DecodeBase64(std::string_view text);

}  // namespace engine::tokenizer
