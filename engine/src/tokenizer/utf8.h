// UTF-8 walking and the Unicode character classes that tokenizer.json components rely on (decoding
// and encoding are engine/utf8.h's).
//
// Tokenizers work on valid UTF-8; Encode replaces invalid bytes first (ToValidUtf8), as Python's
// errors="replace" does, so every other function here may assume valid input. The character
// classes follow Rust's char methods (the Hugging Face tokenizers crate is the specification),
// answered by ICU. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/utf8.h"

namespace engine::tokenizer {

// The code point starting at byte `*pos` of valid UTF-8 `text`; advances `*pos` past it.
char32_t NextCodePoint(std::string_view text, size_t* pos);
// The code point ending just before byte `end` (> 0); sets `*start` to where it begins.
char32_t PreviousCodePoint(std::string_view text, size_t end, size_t* start);

bool IsValidUtf8(std::string_view bytes);
// A byte that continues a character (10xxxxxx): never where a character starts.
inline bool IsContinuationByte(char byte) {
  return (static_cast<unsigned char>(byte) & 0xC0) == 0x80;
}
// Each maximal invalid subsequence becomes U+FFFD (the WHATWG and Rust from_utf8_lossy rule).
std::string ToValidUtf8(std::string_view bytes);
// `bytes` as they are when valid, else ToValidUtf8's.
inline std::string AsValidUtf8(std::string_view bytes) {
  return IsValidUtf8(bytes) ? std::string(bytes) : ToValidUtf8(bytes);
}

// Rust's char::is_whitespace (the White_Space property).
bool IsWhitespace(char32_t c);
// Rust's char::is_alphanumeric (Alphabetic, or a number category).
bool IsAlphanumeric(char32_t c);

// Rust's char::is_ascii_punctuation, or a punctuation category (Pc, Pd, Ps, Pe, Pi, Pf, Po): what
// BERT's pre-tokenizer and the Punctuation pre-tokenizer split on.
bool IsPunctuation(char32_t c);
// The "Other" categories that BERT's normalizer removes: Cc, Cf, Cs and Co. Unassigned code points
// (Cn) stay, as in the tokenizers crate (its tables leave them without a category).
bool IsOther(char32_t c);
// A nonspacing mark (Mn), which BERT's normalizer strips with the accents.
bool IsNonspacingMark(char32_t c);
// Any mark (Mn, Mc, Me), which the StripAccents normalizer removes.
bool IsMark(char32_t c);
// Rust's char::to_lowercase: the full mapping of one character, without context (a final sigma
// is σ, as in the tokenizers crate).
void AppendLowercase(char32_t c, std::string* out);

// The extended grapheme clusters of valid UTF-8 `text`, as byte offsets where each begins (the
// first is 0; the text's end is not included).
std::vector<size_t> GraphemeStarts(std::string_view text);

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };
std::string NormalizeUnicode(std::string_view text, UnicodeForm form);

}  // namespace engine::tokenizer
