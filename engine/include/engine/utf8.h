// UTF-8, in the one place the engine decodes and encodes it: which bytes are well-formed, each
// code point of a text, and bytes that may not be text made safe to show (error messages quote file
// contents, and a file of random bytes must not reach a terminal raw or pass for text unnoticed).
// Invalid bytes never make these read out of bounds: they decode as U+FFFD, spanning the maximal
// invalid subpart, as the WHATWG decoder, Python's errors="replace" and Rust's from_utf8_lossy do.
//
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace engine {

// The length of the well-formed UTF-8 sequence at the start of `s` (1 to 4), or 0 when it is not
// one (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, cut short); then
// `*invalid_length`, when given, is the length of the maximal invalid subpart there (1 to 3 bytes:
// what one U+FFFD replaces).
inline size_t Utf8SequenceLength(std::string_view s, size_t* invalid_length = nullptr) {
  if (invalid_length != nullptr) *invalid_length = 1;
  if (s.empty()) return 0;
  const auto b = [&s](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) low = 0xA0;
    if (c == 0xED) high = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) low = 0x90;
    if (c == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; ++i) {
    if (i >= s.size() || b(i) < low || b(i) > high) return 0;
    low = 0x80;
    high = 0xBF;
    if (invalid_length != nullptr) *invalid_length = i + 1;
  }
  return n;
}

// The code point of the UTF-8 sequence at byte `pos` of `s` (pos < s.size()), and in `*length` how
// many bytes it spans; U+FFFD over the maximal invalid subpart when the bytes there are not one.
inline char32_t DecodeUtf8(std::string_view s, size_t pos, size_t* length) {
  const std::string_view rest = s.substr(pos);
  const size_t n = Utf8SequenceLength(rest, length);
  if (n == 0) return 0xFFFD;
  *length = n;
  const auto b = [&rest](size_t i) { return static_cast<unsigned char>(rest[i]); };
  if (n == 1) return b(0);
  char32_t cp = b(0) & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (b(i) & 0x3F);
  return cp;
}

// Appends `cp` encoded as UTF-8; a surrogate or a value past U+10FFFF, which no UTF-8 encodes, as
// U+FFFD.
inline void AppendUtf8(char32_t cp, std::string* out) {
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// How many bytes of `s` are not part of well-formed UTF-8.
inline size_t CountInvalidUtf8Bytes(std::string_view s) {
  size_t invalid = 0;
  while (!s.empty()) {
    const size_t n = Utf8SequenceLength(s);
    if (n == 0) ++invalid;
    s.remove_prefix(n == 0 ? 1 : n);
  }
  return invalid;
}

// `s` with every byte that is not well-formed UTF-8, and every control character but newline and
// tab, written as \xNN: safe to print to a terminal, and still shows what the bytes were.
inline std::string Printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  while (!s.empty()) {
    const size_t n = Utf8SequenceLength(s);
    const auto c = static_cast<unsigned char>(s[0]);
    if (n == 0 || (n == 1 && ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F))) {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
      s.remove_prefix(1);
    } else {
      out.append(s.substr(0, n));
      s.remove_prefix(n);
    }
  }
  return out;
}

}  // namespace engine
