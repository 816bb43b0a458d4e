// Parses template tokens into a syntax tree, following Jinja2's grammar and operator precedence
// (conditional < or < and < not < comparisons and `in` < + - < ~ < * / // % < ** < unary -/+ <
// filters, tests and calls < attribute and subscript).
//
// Statements: if/elif/else, for (tuple targets, `if` filter, `else`, `recursive`), set (to a
// name, a tuple, a namespace attribute, or a block), macro, call, filter blocks, break, continue,
// and transformers' generation blocks. A filter or test that does not exist, or a tag Jinja2 has
// but chat templates do not use (extends, include, import, block, with, do, autoescape), is an
// error at parse time, as Jinja2 reports unknown filters and tests.
//
// Failure: "line:col: message" (the caller puts the template's name in front).
#pragma once

#include <vector>

#include "engine/status.h"
#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace engine::jinja {

StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace engine::jinja
