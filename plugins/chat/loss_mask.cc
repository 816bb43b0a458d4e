#include "loss_mask.h"

#include <algorithm>
#include <optional>

namespace engine::plugins {
namespace {

size_t CommonPrefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// A partial character at the end of a prefix's decoding: one U+FFFD, 3 bytes.
constexpr size_t kReplacementBytes = 3;

// For each byte offset of `rendered` (0..size), the offset in `decoded` of the same text;
// nothing when the two differ by more than spaces. When `decoded` is the decoding of the first
// ids only (`prefix`), the rendered text past its end (and a partial character there) maps to
// its end.
std::optional<std::vector<size_t>> AlignOffsets(const std::string& rendered,
                                                const std::string& decoded, bool prefix) {
  std::vector<size_t> map(rendered.size() + 1);
  size_t r = 0, d = 0;
  while (r < rendered.size() || d < decoded.size()) {
    if (r < rendered.size() && d < decoded.size() && rendered[r] == decoded[d]) {
      map[r++] = d++;
    } else if (d < decoded.size() && decoded[d] == ' ') {
      ++d;
    } else if (r < rendered.size() && rendered[r] == ' ') {
      map[r++] = d;
    } else if (prefix && decoded.size() - d <= kReplacementBytes) {
      while (r < rendered.size()) map[r++] = decoded.size();
      break;
    } else {
      return std::nullopt;
    }
  }
  map[rendered.size()] = decoded.size();
  return map;
}

// How many bytes of the full decoding the first `k` tokens decode to.
size_t DecodedLength(const Tokenizer& tokenizer, const std::vector<int64_t>& ids, size_t k,
                     const std::string& full) {
  if (k == 0) return 0;
  if (k >= ids.size()) return full.size();
  const std::vector<int64_t> prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k));
  return CommonPrefix(tokenizer.DecodeWithSpecialTokens(prefix), full);
}

// The first k in [0, n] whose first k tokens decode to at least `offset` bytes... shifted: the
// smallest k with DecodedLength(k) >= offset.
size_t FirstReaching(const Tokenizer& tokenizer, const std::vector<int64_t>& ids, size_t offset,
                     const std::string& full) {
  size_t low = 0, high = ids.size();
  while (low < high) {
    const size_t mid = (low + high) / 2;
    if (DecodedLength(tokenizer, ids, mid, full) >= offset) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return low;
}

// Whether the first `k` tokens end inside a character (their decoding ends in a replacement
// character the full decoding does not have there): byte-level and byte-fallback tokens split
// characters.
bool EndsInsideCharacter(const Tokenizer& tokenizer, const std::vector<int64_t>& ids, size_t k,
                         const std::string& full) {
  const std::vector<int64_t> prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k));
  const std::string decoded = tokenizer.DecodeWithSpecialTokens(prefix);
  return CommonPrefix(decoded, full) < decoded.size();
}

}  // namespace

StatusOr<TokenizedConversation> TokenizeForTraining(const chat::RenderedConversation& rendered,
                                                    const Tokenizer& tokenizer, size_t max_tokens) {
  TokenizedConversation out;
  out.ids = tokenizer.EncodeAtMost(rendered.text, max_tokens);
  std::string full = tokenizer.DecodeWithSpecialTokens(out.ids);
  auto offsets = AlignOffsets(rendered.text, full, /*prefix=*/out.ids.size() == max_tokens);
  if (!offsets && out.ids.size() == max_tokens) {
    // The cut fell inside a run of byte tokens that decodes to more than one replacement
    // character (a byte-fallback decoder writes one per byte): the whole text decides.
    out.ids = tokenizer.Encode(rendered.text);
    full = tokenizer.DecodeWithSpecialTokens(out.ids);
    offsets = AlignOffsets(rendered.text, full, /*prefix=*/false);
  }
  out.loss.assign(out.ids.size(), 0);
  if (!offsets) {
    return FailedPreconditionError(
        "the tokenizer does not decode the rendered conversation back to its text (beyond "
        "spaces), so the assistant's tokens cannot be located");
  }
  for (const chat::AssistantSpan& span : rendered.assistant_spans) {
    const size_t begin = (*offsets)[span.begin], end = (*offsets)[span.end];
    if (end <= begin) continue;
    // Token i covers decoded bytes [length(i), length(i + 1)): it overlaps the span when
    // length(i + 1) > begin and length(i) < end.
    size_t first = FirstReaching(tokenizer, out.ids, begin + 1, full) - 1;
    // Tokens holding the first bytes of the span's first character carry loss too.
    while (first > 0 && EndsInsideCharacter(tokenizer, out.ids, first, full)) --first;
    const size_t last = FirstReaching(tokenizer, out.ids, end, full);
    for (size_t i = first; i < last && i < out.ids.size(); ++i) out.loss[i] = 1;
  }
  return out;
}

}  // namespace engine::plugins
