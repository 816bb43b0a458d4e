#include "core/glob.h"

#include <optional>

namespace engine {
namespace {

// Matches the class starting at pattern[p] == '[' against c. Returns the index after the class and
// whether it matched; nullopt when the class is not closed.
std::optional<std::pair<size_t, bool>> MatchClass(std::string_view pattern, size_t p, char c) {
  size_t i = p + 1;
  bool negate = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negate = true;
    ++i;
  }
  bool matched = false;
  bool first = true;
  while (i < pattern.size() && (pattern[i] != ']' || first)) {
    first = false;
    char lo = pattern[i];
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      char hi = pattern[i + 2];
      if (lo <= c && c <= hi) matched = true;
      i += 3;
    } else {
      if (lo == c) matched = true;
      ++i;
    }
  }
  if (i >= pattern.size()) return std::nullopt;
  return std::make_pair(i + 1, matched != negate);
}

}  // namespace

bool GlobMatch(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0;
  // Backtracking point: the last '*' and the text position it currently absorbs up to.
  std::optional<size_t> star_p;
  size_t star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size()) {
      char pc = pattern[p];
      if (pc == '*') {
        star_p = p++;
        star_t = t;
        continue;
      }
      if (pc == '?') {
        ++p;
        ++t;
        continue;
      }
      if (pc == '[') {
        auto cls = MatchClass(pattern, p, text[t]);
        if (cls && cls->second) {
          p = cls->first;
          ++t;
          continue;
        }
        if (!cls && text[t] == '[') {  // an unclosed '[' is a literal
          ++p;
          ++t;
          continue;
        }
      } else if (pc == text[t]) {
        ++p;
        ++t;
        continue;
      }
    }
    if (!star_p) return false;
    p = *star_p + 1;
    t = ++star_t;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string GlobSyntaxError(std::string_view pattern) {
  if (pattern.empty()) return "the pattern is empty";
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '[' && !MatchClass(pattern, i, '\0')) {
      return "'[' at position " + std::to_string(i + 1) + " is never closed by ']'";
    }
  }
  return "";
}

}  // namespace engine
