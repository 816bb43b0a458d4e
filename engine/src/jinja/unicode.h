// UTF-8 helpers for the template evaluator: Python counts and slices strings by code point and
// strips Unicode whitespace, so the string filters and methods do too.
//
// Invalid UTF-8 bytes decode as single code points U+FFFD of length 1, so no input makes these
// loop or read out of bounds. Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace engine::jinja {

// The code point starting at s[pos]; *length is how many bytes it spans.
char32_t DecodeUtf8(std::string_view s, size_t pos, size_t* length);
void AppendUtf8(char32_t cp, std::string& out);
// The byte offset at which each code point of s starts, plus s.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view s);
// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t cp);
// Python's str.strip/lstrip/rstrip: with `chars` unset, Unicode whitespace; else those code points.
std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace engine::jinja
