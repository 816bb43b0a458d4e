#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

using DecoderPtr = std::unique_ptr<Decoder>;

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) bytes += ByteLevelToBytes(token);
    *tokens = {ToValidUtf8(bytes)};
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      std::string out;
      for (size_t pos = 0; pos < token.size();) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(token[pos++]);
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      token = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) token = pattern_.ReplaceAll(token, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

// Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one U+FFFD each.
class ByteFallback : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t byte_tokens = 0;
    const auto flush = [&] {
      if (byte_tokens == 0) return;
      if (IsValidUtf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < byte_tokens; ++i) out.push_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      byte_tokens = 0;
    };
    for (std::string& token : *tokens) {
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' &&
          std::isxdigit(static_cast<unsigned char>(token[3])) &&
          std::isxdigit(static_cast<unsigned char>(token[4]))) {
        bytes.push_back(static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
        ++byte_tokens;
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
  }
};

class Fuse : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined += token;
    *tokens = {joined};
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int64_t start, int64_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      size_t begin = 0, end = token.size();
      for (int64_t i = 0;
           i < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++i) {
        begin += content_.size();
      }
      for (int64_t i = 0; i < stop_ && end >= begin + content_.size() &&
                          token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

// BERT's: pieces after the first lose the continuing-subword prefix or gain a space before them,
// and with `cleanup` each piece loses the spaces English punctuation and contractions do not take.
class WordPiece : public Decoder {
 public:
  WordPiece(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      if (i > 0) {
        if (token.compare(0, prefix_.size(), prefix_) == 0) {
          token.erase(0, prefix_.size());
        } else {
          token.insert(0, 1, ' ');
        }
      }
      if (cleanup_) token = Cleanup(std::move(token));
    }
  }

 private:
  static std::string Cleanup(std::string token) {
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules) {
      for (size_t at = 0; (at = token.find(from, at)) != std::string::npos; at += to.size()) {
        token.replace(at, from.size(), to);
      }
    }
    return token;
  }

  std::string prefix_;
  bool cleanup_;
};

class DecoderSequence : public Decoder {
 public:
  explicit DecoderSequence(std::vector<DecoderPtr> steps) : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<DecoderPtr> steps_;
};

StatusOr<DecoderPtr> ParseReplaceDecoder(const Json& json, const std::string& path) {
  bool is_regex = false;
  ENGINE_ASSIGN_OR_RETURN(std::string pattern, PatternField(json, path, &is_regex));
  ENGINE_ASSIGN_OR_RETURN(std::string content, StringField(json, "content", path, ""));
  StatusOr<Regex> regex = is_regex ? Regex::Compile(pattern) : Regex::Literal(pattern);
  if (!regex.ok()) return FieldError(path + ".pattern", regex.status().message());
  return DecoderPtr(new ReplaceDecoder(std::move(*regex), std::move(content)));
}

StatusOr<DecoderPtr> ParseMetaspaceDecoder(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(std::string replacement,
                          StringField(json, "replacement", path, "\u2581"));
  ENGINE_ASSIGN_OR_RETURN(bool add_prefix_space, BoolField(json, "add_prefix_space", path, true));
  ENGINE_ASSIGN_OR_RETURN(std::string scheme, StringField(json, "prepend_scheme", path,
                                                          add_prefix_space ? "always" : "never"));
  return DecoderPtr(new MetaspaceDecoder(std::move(replacement), scheme != "never"));
}

StatusOr<DecoderPtr> ParseDecoderSequence(const Json& json, const std::string& path) {
  ENGINE_ASSIGN_OR_RETURN(const Json* list, ArrayField(json, "decoders", path));
  std::vector<DecoderPtr> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    ENGINE_ASSIGN_OR_RETURN(
        auto step, ParseDecoder((*list)[i], path + ".decoders[" + std::to_string(i) + "]"));
    if (step != nullptr) steps.push_back(std::move(step));
  }
  return DecoderPtr(new DecoderSequence(std::move(steps)));
}

}  // namespace

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& json, const std::string& path) {
  if (json.is_null()) return DecoderPtr();
  ENGINE_ASSIGN_OR_RETURN(std::string type, TypeField(json, path));
  if (type == "ByteLevel") return DecoderPtr(new ByteLevelDecoder());
  if (type == "Metaspace") return ParseMetaspaceDecoder(json, path);
  if (type == "Replace") return ParseReplaceDecoder(json, path);
  if (type == "ByteFallback") return DecoderPtr(new ByteFallback());
  if (type == "Fuse") return DecoderPtr(new Fuse());
  if (type == "Sequence") return ParseDecoderSequence(json, path);
  if (type == "WordPiece") {
    ENGINE_ASSIGN_OR_RETURN(std::string prefix, StringField(json, "prefix", path, "##"));
    ENGINE_ASSIGN_OR_RETURN(bool cleanup, BoolField(json, "cleanup", path, true));
    return DecoderPtr(new WordPiece(std::move(prefix), cleanup));
  }
  if (type == "Strip") {
    ENGINE_ASSIGN_OR_RETURN(std::string content, StringField(json, "content", path, " "));
    ENGINE_ASSIGN_OR_RETURN(int64_t start, IntField(json, "start", path, 0));
    ENGINE_ASSIGN_OR_RETURN(int64_t stop, IntField(json, "stop", path, 0));
    return DecoderPtr(new StripDecoder(std::move(content), start, stop));
  }
  return FieldError(path + ".type", "unsupported decoder '" + type +
                                        "' (supported: ByteLevel, Metaspace, Replace, "
                                        "ByteFallback, Fuse, Strip, WordPiece, Sequence)");
}

std::string DecodeTokens(const Decoder* decoder, std::vector<std::string> tokens) {
  std::string text;
  if (decoder == nullptr) {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i > 0 ? " " : "") + tokens[i];
    return ToValidUtf8(text);
  }
  decoder->DecodeChain(&tokens);
  for (const std::string& token : tokens) text += token;
  return ToValidUtf8(text);
}

}  // namespace engine::tokenizer
