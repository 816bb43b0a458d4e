// Python's string semantics for the template evaluator: Python counts and slices strings by code
// point and strips Unicode whitespace, so the string filters and methods do too. Decoding is
// engine/utf8.h's: invalid bytes are U+FFFD code points, so no input makes these loop or read out
// of bounds. Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/utf8.h"

namespace engine::jinja {

// The byte offset at which each code point of s starts, plus s.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view s);
// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t cp);
// Python's str.strip/lstrip/rstrip: with `chars` unset, Unicode whitespace; else those code points.
std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace engine::jinja
