#include "tokenizer/regex.h"

#include "tokenizer/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace engine::tokenizer {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Oniguruma's \s and \S as PCRE2 properties; both work inside and outside character classes.
std::string TranslateOniguruma(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += pattern.substr(i, 2);
      }
      ++i;
      continue;
    }
    out.push_back(pattern[i]);
  }
  return out;
}

std::string EscapeLiteral(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

size_t NextCharEnd(std::string_view s, size_t pos) {
  ++pos;
  while (pos < s.size() && IsContinuationByte(s[pos])) ++pos;
  return pos;
}

}  // namespace

StatusOr<Regex> Regex::Compile(const std::string& oniguruma_pattern) {
  const std::string pattern = TranslateOniguruma(oniguruma_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return InvalidArgumentError("regex '" + oniguruma_pattern +
                                "' does not compile: " + reinterpret_cast<const char*>(message) +
                                " at offset " + std::to_string(offset));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // Without JIT support it still matches, slower.
  Regex regex;
  auto owned = std::make_shared<Code>();
  owned->code = code;
  regex.code_ = std::move(owned);
  return regex;
}

StatusOr<Regex> Regex::Literal(const std::string& literal) {
  return Compile(EscapeLiteral(literal));
}

std::vector<Span> Regex::Spans(std::string_view subject) const {
  if (subject.empty()) return {Span{0, 0, false}};
  std::vector<Span> spans;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  size_t previous = 0;
  size_t start = 0;
  while (start <= subject.size()) {
    int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                         start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // The JIT's small stack can run out on long runs (of spaces, say); the interpreter keeps
      // its backtracking on the heap.
      rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                       start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, nullptr);
    }
    if (rc < 0) break;
    const PCRE2_SIZE* vector = pcre2_get_ovector_pointer(data);
    const size_t begin = vector[0], end = vector[1];
    if (begin != previous) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
    // An empty match moves on by one character, as Oniguruma's iterator does.
    start = end > begin ? end : (end < subject.size() ? NextCharEnd(subject, end) : end + 1);
  }
  pcre2_match_data_free(data);
  if (previous != subject.size()) spans.push_back({previous, subject.size(), false});
  return spans;
}

std::string Regex::ReplaceAll(std::string_view subject, std::string_view replacement) const {
  std::string out;
  out.reserve(subject.size());
  for (const Span& span : Spans(subject)) {
    if (span.is_match) {
      out += replacement;
    } else {
      out += subject.substr(span.begin, span.end - span.begin);
    }
  }
  return out;
}

}  // namespace engine::tokenizer
