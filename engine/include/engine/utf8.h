// Bytes that may not be text, made safe to show: error messages quote file contents, and a file of
// random bytes must not reach a terminal raw or pass for text unnoticed.
//
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace engine {

// The length of the well-formed UTF-8 sequence at the start of `s` (1 to 4), or 0 when it is not
// one (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, cut short).
inline size_t Utf8SequenceLength(std::string_view s) {
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
  if (s.size() < n || b(1) < low || b(1) > high) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (b(i) < 0x80 || b(i) > 0xBF) return 0;
  }
  return n;
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
