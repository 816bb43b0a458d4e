// The regular expressions of tokenizer.json (Split pre-tokenizers, Replace normalizers and
// decoders), written for Oniguruma by Hugging Face tokenizers and run here with PCRE2 in UTF and
// Unicode-property mode. Oniguruma's `\s`/`\S` (the White_Space property) are translated, since
// PCRE2's differ (no U+0085); lookaheads, `(?i:...)`, `\p{L}` and `{1,3}` mean the same in both.
//
// A Regex is immutable after Compile and may match from any thread (each call has its own match
// data). Failure: a pattern PCRE2 cannot compile is an error with PCRE2's message and offset.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/status.h"

namespace engine::tokenizer {

// A half-open byte range of the subject and whether it is a match (false: the text between).
struct Span {
  size_t begin = 0;
  size_t end = 0;
  bool is_match = false;
};

class Regex {
 public:
  static StatusOr<Regex> Compile(const std::string& oniguruma_pattern);
  // `literal` matched as is.
  static StatusOr<Regex> Literal(const std::string& literal);

  // The subject cut into matches and the text between them, in order, covering all of it (an
  // empty subject is one empty non-match), as tokenizers' find_matches does.
  std::vector<Span> Spans(std::string_view subject) const;
  // Every match replaced by `replacement` (taken literally).
  std::string ReplaceAll(std::string_view subject, std::string_view replacement) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

}  // namespace engine::tokenizer
