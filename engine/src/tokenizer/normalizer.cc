#include "tokenizer/normalizer.h"

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <vector>

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

class Lowercase : public Normalizer {
 public:
  std::string Normalize(std::string text) const override {
    icu::UnicodeString unicode = icu::UnicodeString::fromUTF8(text);
    unicode.toLower(icu::Locale::getRoot());
    std::string out;
    unicode.toUTF8String(out);
    return out;
  }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
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

class Replace : public Normalizer {
 public:
  Replace(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string text) const override {
    return pattern_.ReplaceAll(text, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string Normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->Normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

StatusOr<std::unique_ptr<Normalizer>> ParseReplace(const Json& json, const std::string& path) {
  bool is_regex = false;
  ENGINE_ASSIGN_OR_RETURN(std::string pattern, PatternField(json, path, &is_regex));
  ENGINE_ASSIGN_OR_RETURN(std::string content, StringField(json, "content", path, ""));
  StatusOr<Regex> regex = is_regex ? Regex::Compile(pattern) : Regex::Literal(pattern);
  if (!regex.ok()) return FieldError(path + ".pattern", regex.status().message());
  return std::unique_ptr<Normalizer>(new Replace(std::move(*regex), std::move(content)));
}

StatusOr<std::unique_ptr<Normalizer>> ParseSequence(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(const Json* list, ArrayField(json, "normalizers", path));
  std::vector<std::unique_ptr<Normalizer>> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    ENGINE_ASSIGN_OR_RETURN(
        auto step, ParseNormalizer((*list)[i], path + ".normalizers[" + std::to_string(i) + "]"));
    if (step != nullptr) steps.push_back(std::move(step));
  }
  return std::unique_ptr<Normalizer>(new Sequence(std::move(steps)));
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
    return std::unique_ptr<Normalizer>(new Strip(left, right));
  }
  if (type == "Prepend") {
    ENGINE_ASSIGN_OR_RETURN(std::string prefix, StringField(json, "prepend", path, ""));
    return std::unique_ptr<Normalizer>(new Prepend(std::move(prefix)));
  }
  if (type == "Replace") return ParseReplace(json, path);
  if (type == "Sequence") return ParseSequence(json, path);
  return FieldError(path + ".type", "unsupported normalizer '" + type +
                                        "' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                                        "Prepend, Replace, Sequence)");
}

}  // namespace engine::tokenizer
