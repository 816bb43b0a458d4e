#include "tokenizer/precompiled_charsmap.h"

#include <cstring>

#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

// The fields of a Darts-clone double-array unit.
bool HasLeaf(uint32_t unit) { return ((unit >> 8) & 1) == 1; }
uint32_t Value(uint32_t unit) { return unit & ((1U << 31) - 1); }
uint32_t Label(uint32_t unit) { return unit & ((1U << 31) | 0xFF); }
uint32_t Offset(uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); }

// The longest grapheme cluster tokenizers looks up whole, plus one.
constexpr size_t kWholeGraphemeLimit = 6;
// The longest replacement read (nmt_nfkc's is 33 bytes).
constexpr size_t kLongestReplacement = 256;

}  // namespace

std::optional<std::string> DecodeBase64(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  const auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const size_t padding = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (padding == 1 && text[i + 2] == '=') return std::nullopt;
    uint32_t group = 0;
    for (size_t j = 0; j < 4; ++j) {
      const int value = j >= 4 - padding ? 0 : sextet(text[i + j]);
      if (value < 0) return std::nullopt;
      group = (group << 6) | static_cast<uint32_t>(value);
    }
    out.push_back(static_cast<char>(group >> 16));
    if (padding < 2) out.push_back(static_cast<char>((group >> 8) & 0xFF));
    if (padding < 1) out.push_back(static_cast<char>(group & 0xFF));
  }
  return out;
}

StatusOr<PrecompiledCharsmap> PrecompiledCharsmap::Parse(std::string_view base64,
                                                         const std::string& path) {
  std::optional<std::string> blob = DecodeBase64(base64);
  if (!blob) return FieldError(path, "is not base64");
  uint32_t trie_bytes = 0;
  if (blob->size() < 4) return FieldError(path, "is shorter than its 4-byte size");
  for (int i = 3; i >= 0; --i)
    trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>((*blob)[i]);
  if (trie_bytes % 4 != 0 || trie_bytes > blob->size() - 4 || trie_bytes == 0) {
    return FieldError(path, "says its trie is " + std::to_string(trie_bytes) +
                                " bytes, which does not fit its " + std::to_string(blob->size()) +
                                " bytes in whole units");
  }
  PrecompiledCharsmap charsmap;
  charsmap.units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < charsmap.units_.size(); ++i) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(blob->data() + 4 + 4 * i);
    charsmap.units_[i] =
        bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
  }
  charsmap.replacements_ = blob->substr(4 + trie_bytes);
  if (!IsValidUtf8(charsmap.replacements_)) {
    return FieldError(path, "holds replacements that are not UTF-8");
  }
  // Each replacement ends at a NUL and is short, so one lookup's output is bounded.
  if (!charsmap.replacements_.empty() && charsmap.replacements_.back() != '\0') {
    return FieldError(path, "does not end its replacements with a NUL");
  }
  for (size_t begin = 0; begin < charsmap.replacements_.size();) {
    const size_t end = charsmap.replacements_.find('\0', begin);
    if (end - begin > kLongestReplacement) {
      return FieldError(path, "holds a replacement of " + std::to_string(end - begin) +
                                  " bytes (this engine reads up to " +
                                  std::to_string(kLongestReplacement) + ")");
    }
    begin = end + 1;
  }
  return charsmap;
}

std::optional<std::string_view> PrecompiledCharsmap::Transform(std::string_view chunk) const {
  size_t node = Offset(units_[0]);
  for (char c : chunk) {
    const auto byte = static_cast<unsigned char>(c);
    node ^= byte;
    if (node >= units_.size()) return std::nullopt;
    const uint32_t unit = units_[node];
    if (Label(unit) != byte) return std::nullopt;
    node ^= Offset(unit);
    if (node >= units_.size()) return std::nullopt;
    if (!HasLeaf(unit)) continue;
    const size_t begin = Value(units_[node]);
    // An offset into the middle of a character (a hostile blob) matches nothing. The pool is
    // valid UTF-8 and its NULs are ASCII, so from a character's start to the NUL is valid too.
    if (begin >= replacements_.size() || IsContinuationByte(replacements_[begin])) {
      return std::nullopt;
    }
    return std::string_view(replacements_).substr(begin, replacements_.find('\0', begin) - begin);
  }
  return std::nullopt;
}

std::string PrecompiledCharsmap::Normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  const std::vector<size_t> starts = GraphemeStarts(text);
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : text.size();
    const std::string_view grapheme = text.substr(starts[i], end - starts[i]);
    if (grapheme.size() < kWholeGraphemeLimit) {
      if (const auto replacement = Transform(grapheme)) {
        out.append(*replacement);
        continue;
      }
    }
    for (size_t pos = 0; pos < grapheme.size();) {
      const size_t begin = pos;
      NextCodePoint(grapheme, &pos);
      const std::string_view character = grapheme.substr(begin, pos - begin);
      const auto replacement = Transform(character);
      out.append(replacement ? *replacement : character);
    }
  }
  return out;
}

}  // namespace engine::tokenizer
