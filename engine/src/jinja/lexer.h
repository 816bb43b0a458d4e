// Splits a Jinja template into tokens, with the environment transformers renders chat templates
// in: trim_blocks and lstrip_blocks on, keep_trailing_newline off, newlines in text normalised
// to "\n" (Jinja2's newline_sequence), `{%-`/`-%}`/`{{-`/`-}}`/`{#-`/`-#}` strip whitespace,
// `{%+` keeps it.
//
// Text between tags becomes kText tokens; a tag becomes its opening token (kBlockBegin or
// kVariableBegin), the tokens inside, and kBlockEnd/kVariableEnd. Comments vanish. `{% raw %}`
// blocks become text. Every token carries its 1-based line and column (in code points) so that
// errors name where they are.
//
// Failure: an unterminated tag, comment or string, or a character no token starts with, is an
// error "line:col: message" (the caller puts the template's name in front).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"

namespace engine::jinja {

struct Token {
  enum class Kind {
    kText,
    kBlockBegin,     // {%
    kBlockEnd,       // %}
    kVariableBegin,  // {{
    kVariableEnd,    // }}
    kName,
    kString,  // value: the unescaped text
    kInt,
    kFloat,
    kOperator,  // value: the operator's spelling: + - * / // % ** ~ ( ) [ ] { } , . : | = == != <
                // <= > >=
    kEnd,
  };
  Kind kind;
  std::string value;
  int line = 1;
  int column = 1;
};

// Describes a token for messages: "name 'foo'", "'%}'", "end of template".
std::string DescribeToken(const Token& token);

StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace engine::jinja
