// Jinja2's built-in filters and tests, Python's string and dict methods, and attribute/item
// lookup, as a template rendered by transformers sees them (an ImmutableSandboxedEnvironment:
// methods that change a list or dict are refused).
//
// Every function here reports a template error by throwing EvalError with Python's or Jinja2's
// message; the evaluator catches it and puts the template position in front. EvalError never
// leaves the jinja library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace engine::jinja {

struct EvalError {
  std::string message;
  int line = 0;  // 0 until the evaluator knows where it happened
  int column = 0;
  std::string context;  // the loop item being rendered, when the caller could name it
};
[[noreturn]] void ThrowError(std::string message);
// Throws "'x' is undefined" (the hint an undefined value carries) when v is undefined.
void RequireDefined(const Value& v);
// args.Finish(function, max_positional), its failure thrown as a template error.
void FinishCall(CallArgs& args, std::string_view function, size_t max_positional);

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

Value ApplyFilter(const std::string& name, const Value& operand, CallArgs& args,
                  Evaluator& evaluator);
bool ApplyTest(const std::string& name, const Value& operand, CallArgs& args, Evaluator& evaluator);

// `object.name`: an attribute (a method of a str or dict) first, then an item, as Jinja2's
// getattr does; undefined (with a hint) when there is neither.
Value GetAttribute(const Value& object, const std::string& name);
// `object[key]`: an item first, then an attribute.
Value GetItem(const Value& object, const Value& key);
// `object[start:stop:step]` on a str (by code point) or list.
Value Slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The items `for` iterates: a list's items, a dict's keys, a string's characters; undefined
// iterates nothing. Throws for values that are not iterable.
ValueList Iterate(const Value& value);

// Python's operators on two values: + - * / // % ** and comparisons < <= > >=, `in`.
Value BinaryOperation(const std::string& op, const Value& a, const Value& b);
bool Compare(const std::string& op, const Value& a, const Value& b);
bool Contains(const Value& container, const Value& item);
// Python's ordering of two values (-1, 0, 1); throws for values Python cannot order.
int PyOrder(const Value& a, const Value& b);
// Python's str.split(sep, maxsplit) (sep unset: runs of whitespace) and str.splitlines().
ValueList PySplit(const std::string& s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> PySplitLines(const std::string& s);
// Python's str.title() and str.capitalize() (ASCII letters change case; others are kept).
std::string PyTitle(const std::string& s);
std::string PyCapitalize(const std::string& s);
std::string AsciiUpper(std::string s);
std::string AsciiLower(std::string s);
// Python's len(): code points of a str, items of a list or dict; throws for other values.
int64_t PyLen(const Value& v);

}  // namespace engine::jinja
