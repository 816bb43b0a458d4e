#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

// GPT-2's word pattern, which ByteLevel's use_regex means.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

using PreTokenizerPtr = std::unique_ptr<PreTokenizer>;

// Spans merged as tokenizers' NormalizedString::split does for each behavior.
std::vector<Span> Merge(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> merged;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.is_match) merged.push_back(span);
      }
      return merged;
    case SplitBehavior::kIsolated:
      return spans;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !merged.empty()) {
          merged.back().end = span.end;
        } else {
          merged.push_back(span);
        }
        previous_match = span.is_match;
      }
      return merged;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return std::vector<Span>(merged.rbegin(), merged.rend());
    case SplitBehavior::kContiguous:
      for (const Span& span : spans) {
        if (span.is_match == previous_match && !merged.empty()) {
          merged.back().end = span.end;
        } else {
          merged.push_back(span);
        }
        previous_match = span.is_match;
      }
      return merged;
  }
  return spans;
}

class RegexSplit : public PreTokenizer {
 public:
  RegexSplit(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    std::vector<Span> spans = pattern_.Spans(piece.text);
    if (invert_) {
      for (Span& span : spans) span.is_match = !span.is_match;
    }
    SplitAlong(piece, std::move(spans), behavior_, out);
  }

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Splits at each character `is_delimiter` accepts (each one a match of its own).
class CharSplit : public PreTokenizer {
 public:
  CharSplit(bool (*is_delimiter)(char32_t), SplitBehavior behavior)
      : is_delimiter_(is_delimiter), behavior_(behavior) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    std::vector<Span> spans;
    for (size_t pos = 0; pos < piece.text.size();) {
      const size_t begin = pos;
      const bool match = is_delimiter_(NextCodePoint(piece.text, &pos));
      if (!match && !spans.empty() && !spans.back().is_match) {
        spans.back().end = pos;
      } else {
        spans.push_back({begin, pos, match});
      }
    }
    SplitAlong(piece, std::move(spans), behavior_, out);
  }

 private:
  bool (*is_delimiter_)(char32_t);
  SplitBehavior behavior_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> words)
      : add_prefix_space_(add_prefix_space), words_(std::move(words)) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    Piece prefixed = piece;
    if (add_prefix_space_ && (prefixed.text.empty() || prefixed.text[0] != ' ')) {
      prefixed.text.insert(0, 1, ' ');
    }
    const size_t first = out->size();
    if (words_ != nullptr) {
      SplitAlong(prefixed, words_->Spans(prefixed.text), SplitBehavior::kIsolated, out);
    } else if (!prefixed.text.empty()) {
      out->push_back(std::move(prefixed));
    }
    for (size_t i = first; i < out->size(); ++i) (*out)[i].text = BytesToByteLevel((*out)[i].text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> words_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, std::unique_ptr<Regex> splitter)
      : replacement_(std::move(replacement)), prepend_(prepend), splitter_(std::move(splitter)) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    Piece replaced = piece;
    replaced.text.clear();
    for (char c : piece.text) {
      if (c == ' ') {
        replaced.text += replacement_;
      } else {
        replaced.text.push_back(c);
      }
    }
    const bool starts = replaced.text.compare(0, replacement_.size(), replacement_) == 0;
    if (!starts &&
        (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && piece.at_origin))) {
      replaced.text.insert(0, replacement_);
    }
    if (splitter_ == nullptr) {
      if (!replaced.text.empty()) out->push_back(std::move(replaced));
      return;
    }
    SplitAlong(replaced, splitter_->Spans(replaced.text), SplitBehavior::kMergedWithNext, out);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  std::unique_ptr<Regex> splitter_;
};

class PreTokenizerSequence : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<PreTokenizerPtr> steps) : steps_(std::move(steps)) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    std::vector<Piece> current{piece};
    std::vector<Piece> next;
    for (const auto& step : steps_) {
      next.clear();
      for (const Piece& part : current) step->Split(part, &next);
      current.swap(next);
    }
    for (Piece& part : current) out->push_back(std::move(part));
  }

 private:
  std::vector<PreTokenizerPtr> steps_;
};

StatusOr<SplitBehavior> ParseBehavior(const Json& json, const std::string& path,
                                      const std::string& fallback = "") {
  ENGINE_ASSIGN_OR_RETURN(std::string name, StringField(json, "behavior", path, fallback));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return FieldError(path + ".behavior", "unsupported split behavior '" + name + "'");
}

StatusOr<Regex> CompileAt(const std::string& pattern, bool is_regex, const std::string& path) {
  StatusOr<Regex> regex = is_regex ? Regex::Compile(pattern) : Regex::Literal(pattern);
  if (!regex.ok()) return FieldError(path, regex.status().message());
  return regex;
}

StatusOr<PreTokenizerPtr> ParseSplit(const Json& json, const std::string& path) {
  bool is_regex = false;
  ENGINE_ASSIGN_OR_RETURN(std::string pattern, PatternField(json, path, &is_regex));
  ENGINE_ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(json, path));
  ENGINE_ASSIGN_OR_RETURN(bool invert, BoolField(json, "invert", path, false));
  ENGINE_ASSIGN_OR_RETURN(Regex regex, CompileAt(pattern, is_regex, path + ".pattern"));
  return PreTokenizerPtr(new RegexSplit(std::move(regex), behavior, invert));
}

StatusOr<PreTokenizerPtr> ParseByteLevel(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(bool add_prefix_space, BoolField(json, "add_prefix_space", path, true));
  ENGINE_ASSIGN_OR_RETURN(bool use_regex, BoolField(json, "use_regex", path, true));
  std::unique_ptr<Regex> words;
  if (use_regex) {
    ENGINE_ASSIGN_OR_RETURN(Regex regex, CompileAt(kGpt2Pattern, true, path));
    words = std::make_unique<Regex>(std::move(regex));
  }
  return PreTokenizerPtr(new ByteLevelPreTokenizer(add_prefix_space, std::move(words)));
}

StatusOr<PreTokenizerPtr> ParseMetaspacePreTokenizer(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(std::string replacement,
                          StringField(json, "replacement", path, "\u2581"));
  ENGINE_ASSIGN_OR_RETURN(bool add_prefix_space, BoolField(json, "add_prefix_space", path, true));
  ENGINE_ASSIGN_OR_RETURN(std::string scheme, StringField(json, "prepend_scheme", path,
                                                          add_prefix_space ? "always" : "never"));
  ENGINE_ASSIGN_OR_RETURN(bool split, BoolField(json, "split", path, true));
  MetaspacePreTokenizer::Prepend prepend;
  if (scheme == "always") {
    prepend = MetaspacePreTokenizer::Prepend::kAlways;
  } else if (scheme == "first") {
    prepend = MetaspacePreTokenizer::Prepend::kFirst;
  } else if (scheme == "never") {
    prepend = MetaspacePreTokenizer::Prepend::kNever;
  } else {
    return FieldError(path + ".prepend_scheme", "unsupported scheme '" + scheme + "'");
  }
  std::unique_ptr<Regex> splitter;
  if (split) {
    ENGINE_ASSIGN_OR_RETURN(Regex regex, CompileAt(replacement, false, path + ".replacement"));
    splitter = std::make_unique<Regex>(std::move(regex));
  }
  return PreTokenizerPtr(
      new MetaspacePreTokenizer(std::move(replacement), prepend, std::move(splitter)));
}

StatusOr<PreTokenizerPtr> ParsePreTokenizerSequence(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(const Json* list, ArrayField(json, "pretokenizers", path));
  std::vector<PreTokenizerPtr> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    ENGINE_ASSIGN_OR_RETURN(auto step, ParsePreTokenizer((*list)[i], path + ".pretokenizers[" +
                                                                         std::to_string(i) + "]"));
    if (step != nullptr) steps.push_back(std::move(step));
  }
  return PreTokenizerPtr(new PreTokenizerSequence(std::move(steps)));
}

// BERT's: whitespace removed, then each punctuation character alone.
StatusOr<PreTokenizerPtr> Bert() {
  std::vector<PreTokenizerPtr> steps;
  steps.emplace_back(new CharSplit(IsWhitespace, SplitBehavior::kRemoved));
  steps.emplace_back(new CharSplit(IsPunctuation, SplitBehavior::kIsolated));
  return PreTokenizerPtr(new PreTokenizerSequence(std::move(steps)));
}

StatusOr<PreTokenizerPtr> ParsePunctuation(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(json, path, "Isolated"));
  return PreTokenizerPtr(new CharSplit(IsPunctuation, behavior));
}

StatusOr<PreTokenizerPtr> Fixed(const std::string& pattern, SplitBehavior behavior, bool invert,
                                const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(Regex regex, CompileAt(pattern, true, path));
  return PreTokenizerPtr(new RegexSplit(std::move(regex), behavior, invert));
}

}  // namespace

void SplitAlong(const Piece& piece, std::vector<Span> spans, SplitBehavior behavior,
                std::vector<Piece>* out) {
  for (const Span& span : Merge(std::move(spans), behavior)) {
    if (span.end == span.begin) continue;
    Piece part;
    part.text = piece.text.substr(span.begin, span.end - span.begin);
    part.at_origin = piece.at_origin && span.begin == 0;
    out->push_back(std::move(part));
  }
}

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                          const std::string& path) {
  if (json.is_null()) return PreTokenizerPtr();
  ENGINE_ASSIGN_OR_RETURN(std::string type, TypeField(json, path));
  if (type == "ByteLevel") return ParseByteLevel(json, path);
  if (type == "Split") return ParseSplit(json, path);
  if (type == "Metaspace") return ParseMetaspacePreTokenizer(json, path);
  if (type == "Sequence") return ParsePreTokenizerSequence(json, path);
  if (type == "WhitespaceSplit") return Fixed(R"(\s)", SplitBehavior::kRemoved, false, path);
  if (type == "Whitespace") return Fixed(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, true, path);
  if (type == "BertPreTokenizer") return Bert();
  if (type == "Punctuation") return ParsePunctuation(json, path);
  if (type == "Digits") {
    ENGINE_ASSIGN_OR_RETURN(bool individual, BoolField(json, "individual_digits", path, false));
    return Fixed(R"(\p{N})", individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                 false, path);
  }
  return FieldError(path + ".type", "unsupported pre-tokenizer '" + type +
                                        "' (supported: ByteLevel, Split, Metaspace, Digits, "
                                        "Whitespace, WhitespaceSplit, BertPreTokenizer, "
                                        "Punctuation, Sequence)");
}

}  // namespace engine::tokenizer
