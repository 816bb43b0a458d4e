#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/precompiled_charsmap.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}
  std::string Normalize(std::string text) const override { return NormalizeUnicode(text, form_); }

 private:
  UnicodeForm form_;
};

// Each character by itself (tokenizers lowercases char by char: a final sigma stays σ).
std::string Lowercased(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) AppendLowercase(NextCodePoint(text, &pos), &out);
  return out;
}

class Lowercase : public Normalizer {
 public:
  std::string Normalize(std::string text) const override { return Lowercased(text); }
};

// The characters of `text` that `keep` accepts.
template <typename Keep>
std::string Filtered(std::string_view text, Keep keep) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t begin = pos;
    if (keep(NextCodePoint(text, &pos))) out.append(text.substr(begin, pos - begin));
  }
  return out;
}

class StripAccents : public Normalizer {
 public:
  std::string Normalize(std::string text) const override {
    return Filtered(text, [](char32_t c) { return !IsMark(c); });
  }
};

// BERT's cleaning: control characters out, whitespace to ' ', spaces around CJK ideographs, and
// accents (after NFD) and case optionally.
class BertNormalizer : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents, bool lowercase)
      : clean_text_(clean_text),
        handle_chinese_chars_(handle_chinese_chars),
        strip_accents_(strip_accents),
        lowercase_(lowercase) {}
  std::string Normalize(std::string text) const override {
    if (clean_text_) text = CleanText(text);
    if (handle_chinese_chars_) text = SpaceIdeographs(text);
    if (strip_accents_) {
      text = Filtered(NormalizeUnicode(text, UnicodeForm::kNfd),
                      [](char32_t c) { return !IsNonspacingMark(c); });
    }
    if (lowercase_) text = Lowercased(text);
    return text;
  }

 private:
  static bool IsIdeograph(char32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
  }
  static std::string CleanText(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      const size_t begin = pos;
      const char32_t c = NextCodePoint(text, &pos);
      // Removal first: a control character that is also whitespace (\v, \f, U+0085) goes.
      const bool tab_or_newline = c == '\t' || c == '\n' || c == '\r';
      if (c == 0 || c == 0xFFFD || (!tab_or_newline && IsOther(c))) continue;
      if (tab_or_newline || IsWhitespace(c)) {
        out.push_back(' ');
      } else {
        out.append(text.substr(begin, pos - begin));
      }
    }
    return out;
  }
  static std::string SpaceIdeographs(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      const size_t begin = pos;
      const bool ideograph = IsIdeograph(NextCodePoint(text, &pos));
      if (ideograph) out.push_back(' ');
      out.append(text.substr(begin, pos - begin));
      if (ideograph) out.push_back(' ');
    }
    return out;
  }

  bool clean_text_, handle_chinese_chars_, strip_accents_, lowercase_;
};

class Precompiled : public Normalizer {
 public:
  explicit Precompiled(PrecompiledCharsmap charsmap) : charsmap_(std::move(charsmap)) {}
  std::string Normalize(std::string text) const override { return charsmap_.Normalize(text); }

 private:
  PrecompiledCharsmap charsmap_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      for (size_t pos = 0; pos < end;) {
        size_t next = pos;
        if (!IsWhitespace(NextCodePoint(text, &next))) break;
        begin = pos = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = 0;
        if (!IsWhitespace(PreviousCodePoint(text, end, &start))) break;
        end = start;
      }
    }
    return text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string text) const override {
    return pattern_.ReplaceAll(text, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class NormalizerSequence : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string Normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->Normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

StatusOr<std::unique_ptr<Normalizer>> ParseReplaceNormalizer(const Json& json,
                                                             const std::string& path) {
  bool is_regex = false;
  ENGINE_ASSIGN_OR_RETURN(std::string pattern, PatternField(json, path, &is_regex));
  ENGINE_ASSIGN_OR_RETURN(std::string content, StringField(json, "content", path, ""));
  StatusOr<Regex> regex = is_regex ? Regex::Compile(pattern) : Regex::Literal(pattern);
  if (!regex.ok()) return FieldError(path + ".pattern", regex.status().message());
  return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(*regex), std::move(content)));
}

StatusOr<std::unique_ptr<Normalizer>> ParseBert(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(bool clean_text, BoolField(json, "clean_text", path, true));
  ENGINE_ASSIGN_OR_RETURN(bool chinese, BoolField(json, "handle_chinese_chars", path, true));
  ENGINE_ASSIGN_OR_RETURN(bool lowercase, BoolField(json, "lowercase", path, true));
  // strip_accents: null follows lowercase.
  ENGINE_ASSIGN_OR_RETURN(bool strip_accents, BoolField(json, "strip_accents", path, lowercase));
  return std::unique_ptr<Normalizer>(
      new BertNormalizer(clean_text, chinese, strip_accents, lowercase));
}

StatusOr<std::unique_ptr<Normalizer>> ParsePrecompiled(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(std::string base64, StringField(json, "precompiled_charsmap", path, ""));
  ENGINE_ASSIGN_OR_RETURN(PrecompiledCharsmap charsmap,
                          PrecompiledCharsmap::Parse(base64, path + ".precompiled_charsmap"));
  return std::unique_ptr<Normalizer>(new Precompiled(std::move(charsmap)));
}

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizerSequence(const Json& json,
                                                              const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(const Json* list, ArrayField(json, "normalizers", path));
  std::vector<std::unique_ptr<Normalizer>> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    ENGINE_ASSIGN_OR_RETURN(
        auto step, ParseNormalizer((*list)[i], path + ".normalizers[" + std::to_string(i) + "]"));
    if (step != nullptr) steps.push_back(std::move(step));
  }
  return std::unique_ptr<Normalizer>(new NormalizerSequence(std::move(steps)));
}

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json, const std::string& path) {
  if (json.is_null()) return std::unique_ptr<Normalizer>();
  ENGINE_ASSIGN_OR_RETURN(std::string type, TypeField(json, path));
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeForm::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeForm::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeForm::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeForm::kNfkd));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new Lowercase());
  if (type == "Strip") {
    ENGINE_ASSIGN_OR_RETURN(bool left, BoolField(json, "strip_left", path, true));
    ENGINE_ASSIGN_OR_RETURN(bool right, BoolField(json, "strip_right", path, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Prepend") {
    ENGINE_ASSIGN_OR_RETURN(std::string prefix, StringField(json, "prepend", path, ""));
    return std::unique_ptr<Normalizer>(new Prepend(std::move(prefix)));
  }
  if (type == "Replace") return ParseReplaceNormalizer(json, path);
  if (type == "Sequence") return ParseNormalizerSequence(json, path);
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccents());
  if (type == "BertNormalizer") return ParseBert(json, path);
  if (type == "Precompiled") return ParsePrecompiled(json, path);
  return FieldError(path + ".type", "unsupported normalizer '" + type +
                                        "' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                                        "StripAccents, Prepend, Replace, BertNormalizer, "
                                        "Precompiled, Sequence)");
}

}  // namespace engine::tokenizer
