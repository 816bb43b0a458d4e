#include "jinja/lexer.h"

#include <cctype>

#include "jinja/unicode.h"

namespace engine::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool IsNameChar(char c) { return IsNameStart(c) || std::isdigit(static_cast<unsigned char>(c)); }

std::string NormalizeNewlines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      out += '\n';
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(source) {
    // keep_trailing_newline=False: one final newline of the source is not part of the template.
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
    if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
  }

  StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = FindTagStart(pos_);
      std::string_view text = src_.substr(pos_, tag - pos_);
      if (tag < src_.size()) {
        char kind = src_[tag + 1];
        char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
        if (modifier == '-') {
          while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
        } else if (modifier != '+' && kind != '{') {
          // lstrip_blocks: spaces and tabs between the start of a line and a block or comment.
          size_t line_start = text.find_last_of('\n');
          size_t from = line_start == std::string_view::npos ? 0 : line_start + 1;
          bool blank = text.find_first_not_of(" \t", from) == std::string_view::npos;
          if (blank && (line_start != std::string_view::npos || line_starting)) {
            text = text.substr(0, from);
          }
        }
      }
      EmitText(pos_, text);
      if (tag >= src_.size()) break;
      pos_ = tag;
      Status status = src_[tag + 1] == '#' ? LexComment(&line_starting) : LexTag(&line_starting);
      if (!status.ok()) return status;
    }
    tokens_.push_back(Token{Token::Kind::kEnd, "", Line(src_.size()), Column(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  int Line(size_t offset) {
    if (offset < line_scan_) {
      line_ = 1;
      line_start_ = 0;
      line_scan_ = 0;
    }
    while (line_scan_ < offset && line_scan_ < src_.size()) {
      if (src_[line_scan_] == '\n') {
        ++line_;
        line_start_ = line_scan_ + 1;
      }
      ++line_scan_;
    }
    return line_;
  }
  // The 1-based column in code points, counted on from the last token's on the same line (a
  // template of one long line would otherwise cost its length for every token).
  int Column(size_t offset) {
    Line(offset);
    if (column_line_start_ != line_start_ || offset < column_scan_) {
      column_line_start_ = line_start_;
      column_scan_ = line_start_;
      column_code_points_ = 0;
    }
    while (column_scan_ < offset) {
      size_t length = 1;
      DecodeUtf8(src_, column_scan_, &length);
      column_scan_ += length;
      ++column_code_points_;
    }
    return column_code_points_ + 1;
  }
  Status Error(size_t offset, const std::string& message) {
    int line = Line(offset);
    return InvalidArgumentError(std::to_string(line) + ":" + std::to_string(Column(offset)) + ": " +
                                message);
  }
  void Push(Token::Kind kind, std::string value, size_t offset) {
    int line = Line(offset);
    tokens_.push_back(Token{kind, std::move(value), line, Column(offset)});
  }
  void EmitText(size_t offset, std::string_view text) {
    if (!text.empty()) Push(Token::Kind::kText, NormalizeNewlines(text), offset);
  }

  // After a tag's closing delimiter: `-` strips all whitespace, trim_blocks one newline after a
  // block or comment.
  void AfterTagEnd(bool strip, bool trim_newline, bool* line_starting) {
    *line_starting = false;
    if (strip) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
      return;
    }
    if (!trim_newline) return;
    if (src_.compare(pos_, 2, "\r\n") == 0) {
      pos_ += 2;
      *line_starting = true;
    } else if (pos_ < src_.size() && (src_[pos_] == '\n' || src_[pos_] == '\r')) {
      ++pos_;
      *line_starting = true;
    }
  }

  Status LexComment(bool* line_starting) {
    size_t start = pos_;
    size_t end = src_.find("#}", pos_ + 2);
    if (end == std::string_view::npos) return Error(start, "unterminated comment: no '#}'");
    bool strip = end > pos_ + 2 && src_[end - 1] == '-';
    bool keep = end > pos_ + 2 && src_[end - 1] == '+';
    pos_ = end + 2;
    AfterTagEnd(strip, !keep, line_starting);
    return Status::Ok();
  }

  Status LexTag(bool* line_starting) {
    size_t start = pos_;
    bool block = src_[pos_ + 1] == '%';
    Push(block ? Token::Kind::kBlockBegin : Token::Kind::kVariableBegin, block ? "{%" : "{{",
         start);
    pos_ += 2;
    if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) ++pos_;
    size_t first_token = tokens_.size();
    std::vector<char> brackets;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return Error(start, std::string("unterminated tag: no '") + (block ? "%}" : "}}") + "'");
      }
      if (brackets.empty()) {
        std::string_view close = block ? "%}" : "}}";
        char mod = src_[pos_];
        bool has_modifier = (mod == '-' || mod == '+') && src_.compare(pos_ + 1, 2, close) == 0;
        if (has_modifier || src_.compare(pos_, 2, close) == 0) {
          Push(block ? Token::Kind::kBlockEnd : Token::Kind::kVariableEnd, std::string(close),
               pos_);
          pos_ += has_modifier ? 3 : 2;
          AfterTagEnd(has_modifier && mod == '-', block && !(has_modifier && mod == '+'),
                      line_starting);
          break;
        }
      }
      ENGINE_RETURN_IF_ERROR(LexToken(brackets));
    }
    if (block && tokens_.size() == first_token + 2 && tokens_[first_token].value == "raw") {
      return LexRaw(line_starting);
    }
    return Status::Ok();
  }

  // `{% raw %}...{% endraw %}`: the text in between, as it is.
  Status LexRaw(bool* line_starting) {
    tokens_.resize(tokens_.size() - 3);
    size_t search = pos_;
    while (true) {
      size_t tag = src_.find("{%", search);
      if (tag == std::string_view::npos) return Error(pos_, "unterminated 'raw' block");
      size_t p = tag + 2;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      std::string_view text = src_.substr(pos_, tag - pos_);
      if (src_[tag + 2] == '-') {
        while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
      }
      EmitText(pos_, text);
      p += 6;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      bool strip = src_.compare(p, 3, "-%}") == 0;
      if (!strip && src_.compare(p, 2, "%}") != 0) return Error(p, "expected '%}' after 'endraw'");
      pos_ = p + (strip ? 3 : 2);
      AfterTagEnd(strip, true, line_starting);
      return Status::Ok();
    }
  }

  Status LexToken(std::vector<char>& brackets) {
    size_t start = pos_;
    char c = src_[pos_];
    if (IsNameStart(c)) {
      while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
      Push(Token::Kind::kName, std::string(src_.substr(start, pos_ - start)), start);
      return Status::Ok();
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return LexNumber();
    if (c == '\'' || c == '"') return LexString();
    static constexpr std::string_view kOperators[] = {
        "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "(",
        ")",  "[",  "]",  "{",  "}",  ",",  ".", ":", "|", "=", "<", ">"};
    for (std::string_view op : kOperators) {
      if (src_.compare(pos_, op.size(), op) != 0) continue;
      if (op == "(" || op == "[" || op == "{") brackets.push_back(op[0]);
      if (op == ")" || op == "]" || op == "}") {
        char open = op == ")" ? '(' : op == "]" ? '[' : '{';
        if (brackets.empty() || brackets.back() != open) {
          return Error(start, "unexpected '" + std::string(op) + "'");
        }
        brackets.pop_back();
      }
      Push(Token::Kind::kOperator, std::string(op), start);
      pos_ += op.size();
      return Status::Ok();
    }
    size_t length = 1;
    std::string shown;
    AppendUtf8(DecodeUtf8(src_, pos_, &length), &shown);
    return Error(start, "unexpected character '" + shown + "'");
  }

  Status LexNumber() {
    size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    // `1.5` is a float; `x.0.y` (a dot after a name) never reaches here as a number's fraction.
    bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOperator &&
                     tokens_.back().value == ".";
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        is_float = true;
        pos_ = p;
        digits();
      }
    }
    std::string text;
    for (char ch : src_.substr(start, pos_ - start)) {
      if (ch != '_') text += ch;
    }
    Push(is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, start);
    return Status::Ok();
  }

  // Python's string literal escapes (Jinja2 decodes them with "unicode-escape"); an unknown
  // escape keeps its backslash, as Python does. One case per escape, hence the length.
  Status LexString() {
    size_t start = pos_;
    char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) return Error(start, "unterminated string");
      char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (pos_ >= src_.size()) return Error(start, "unterminated string");
      char e = src_[pos_++];
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case 'a':
          value += '\a';
          break;
        case '0':
          value += '\0';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t count = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          std::string hex(src_.substr(pos_, count));
          if (hex.size() != count ||
              hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
            return Error(pos_ - 2, std::string("invalid \\") + e + " escape in string");
          }
          AppendUtf8(static_cast<char32_t>(std::stoul(hex, nullptr, 16)), &value);
          pos_ += count;
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    Push(Token::Kind::kString, NormalizeNewlines(value), start);
    return Status::Ok();
  }

  std::string_view src_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_start_ = 0;
  size_t line_scan_ = 0;
  size_t column_line_start_ = 0;
  size_t column_scan_ = 0;
  int column_code_points_ = 0;
};

}  // namespace

std::string DescribeToken(const Token& token) {
  switch (token.kind) {
    case Token::Kind::kText:
      return "template text";
    case Token::Kind::kName:
      return "name '" + token.value + "'";
    case Token::Kind::kString:
      return "string";
    case Token::Kind::kInt:
    case Token::Kind::kFloat:
      return "number " + token.value;
    case Token::Kind::kEnd:
      return "end of template";
    default:
      return "'" + token.value + "'";
  }
}

StatusOr<std::vector<Token>> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace engine::jinja
