// The syntax tree of a parsed template: expressions (Expr) and statements (Node), each with the
// line and column it starts at, so that a runtime error names where it happened.
//
// Ownership: a node owns its children (unique_ptr); a parsed template owns its root body and is
// immutable after parsing, so one tree may be rendered from several threads.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace engine::jinja {

struct Expr;
struct Node;
using ExprPtr = std::unique_ptr<Expr>;
using Body = std::vector<std::unique_ptr<Node>>;
using KeywordArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // items
    kTuple,     // items
    kDict,      // items: key, value, key, value, ...
    kGetAttr,   // a.name
    kGetItem,   // a[b]
    kSlice,     // a[items[0]:items[1]:items[2]] (null parts are absent)
    kCall,      // a(items..., kwargs...)
    kFilter,    // a | name(items..., kwargs...); a is null inside a filter block
    kTest,      // a is [not] name(items...); negated
    kUnary,     // name ('-' or '+') a
    kBinary,    // a name b: + - * / // % ** ~
    kCompare,   // items[0] ops[0] items[1] ops[1] items[2] ...: == != < <= > >= in notin
    kAnd,       // a and b
    kOr,        // a or b
    kNot,       // not a
    kCondition  // a if b else c (c may be null)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> items;
  KeywordArgs kwargs;
  std::vector<std::string> ops;
  ExprPtr a, b, c;
  bool negated = false;
};

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (test, body)...; a null test is the else branch
    kFor,          // for target in expr [if condition]: body [else: else_body]
    kSet,          // set target = expr
    kSetBlock,     // set target [| filters]: body
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body
    kFilterBlock,  // filter filters: body
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %}: body, recorded as an assistant span
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::string name;
  KeywordArgs params;            // a parameter without a default has a null expression
  std::vector<ExprPtr> filters;  // kFilter expressions with a null operand, applied in order
};

}  // namespace engine::jinja
