// UTF-8 walking and the Unicode character classes that tokenizer.json components rely on.
//
// Tokenizers work on valid UTF-8; Encode replaces invalid bytes first (ToValidUtf8), as Python's
// errors="replace" does, so every other function here may assume valid input. The character
// classes follow Rust's char methods (the Hugging Face tokenizers crate is the specification),
// answered by ICU. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace engine::tokenizer {

// The code point starting at byte `*pos` of valid UTF-8 `text`; advances `*pos` past it.
char32_t NextCodePoint(std::string_view text, size_t* pos);
// The code point ending just before byte `end` (> 0); sets `*start` to where it begins.
char32_t PreviousCodePoint(std::string_view text, size_t end, size_t* start);
void AppendUtf8(char32_t code_point, std::string* out);

bool IsValidUtf8(std::string_view bytes);
// Each maximal invalid subsequence becomes U+FFFD (the WHATWG and Rust from_utf8_lossy rule).
std::string ToValidUtf8(std::string_view bytes);

// Rust's char::is_whitespace (the White_Space property).
bool IsWhitespace(char32_t c);
// Rust's char::is_alphanumeric (Alphabetic, or a number category).
bool IsAlphanumeric(char32_t c);

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };
std::string NormalizeUnicode(std::string_view text, UnicodeForm form);

}  // namespace engine::tokenizer
