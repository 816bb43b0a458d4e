// Jinja2's built-in tests (`x is defined`, `x is string`, `n is divisibleby 3`, ...).
#include <algorithm>
#include <cctype>
#include <map>

#include "jinja/builtins.h"

namespace engine::jinja {
namespace {

using TestFunction = bool (*)(const Value& v, CallArgs& args);

const Value& Argument(CallArgs& args, const char* test) {
  const Value* other = args.Get(0, "other");
  if (other == nullptr) ThrowError(std::string("test '") + test + "' needs an argument");
  return *other;
}

int64_t IntegerOperand(const Value& v, const char* test) {
  RequireDefined(v);
  if (!v.is_int() && !v.is_bool()) ThrowError(std::string("test '") + test + "' needs an integer");
  return v.is_bool() ? v.as_bool() : v.as_int();
}

bool HasCase(const Value& v, bool upper) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (char c : v.as_string()) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      cased = true;
      if ((std::isupper(static_cast<unsigned char>(c)) != 0) != upper) return false;
    }
  }
  return cased;
}

// The table of Jinja's tests (`x is defined`, ...): long as a table is, one line or two a test.
const std::map<std::string, TestFunction, std::less<>>& Tests() {
  static const auto* tests = new std::map<std::string, TestFunction, std::less<>>{
      {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
      {"boolean", [](const Value& v, CallArgs&) { return v.is_bool(); }},
      {"true", [](const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](const Value& v, CallArgs&) { return v.is_int(); }},
      {"float", [](const Value& v, CallArgs&) { return v.is_float(); }},
      // Python's bool is a Number.
      {"number", [](const Value& v, CallArgs&) { return v.is_number() || v.is_bool(); }},
      {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, CallArgs&) { return v.is_dict(); }},
      // Jinja2's Undefined is iterable (it iterates nothing) and has a length.
      {"iterable",
       [](const Value& v, CallArgs&) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"sequence",
       [](const Value& v, CallArgs&) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"callable", [](const Value& v, CallArgs&) { return v.is_function(); }},
      {"odd", [](const Value& v, CallArgs&) { return IntegerOperand(v, "odd") % 2 != 0; }},
      {"even", [](const Value& v, CallArgs&) { return IntegerOperand(v, "even") % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, CallArgs& args) {
         int64_t d = IntegerOperand(Argument(args, "divisibleby"), "divisibleby");
         if (d == 0) ThrowError("integer division or modulo by zero");
         return IntegerOperand(v, "divisibleby") % d == 0;
       }},
      {"eq", [](const Value& v, CallArgs& args) { return v == Argument(args, "eq"); }},
      {"equalto", [](const Value& v, CallArgs& args) { return v == Argument(args, "equalto"); }},
      {"==", [](const Value& v, CallArgs& args) { return v == Argument(args, "=="); }},
      {"ne", [](const Value& v, CallArgs& args) { return v != Argument(args, "ne"); }},
      {"!=", [](const Value& v, CallArgs& args) { return v != Argument(args, "!="); }},
      {"lt", [](const Value& v, CallArgs& args) { return Compare("<", v, Argument(args, "lt")); }},
      {"lessthan",
       [](const Value& v, CallArgs& args) { return Compare("<", v, Argument(args, "lessthan")); }},
      {"<", [](const Value& v, CallArgs& args) { return Compare("<", v, Argument(args, "<")); }},
      {"le", [](const Value& v, CallArgs& args) { return Compare("<=", v, Argument(args, "le")); }},
      {"<=", [](const Value& v, CallArgs& args) { return Compare("<=", v, Argument(args, "<=")); }},
      {"gt", [](const Value& v, CallArgs& args) { return Compare(">", v, Argument(args, "gt")); }},
      {"greaterthan",
       [](const Value& v, CallArgs& args) {
         return Compare(">", v, Argument(args, "greaterthan"));
       }},
      {">", [](const Value& v, CallArgs& args) { return Compare(">", v, Argument(args, ">")); }},
      {"ge", [](const Value& v, CallArgs& args) { return Compare(">=", v, Argument(args, "ge")); }},
      {">=", [](const Value& v, CallArgs& args) { return Compare(">=", v, Argument(args, ">=")); }},
      {"in", [](const Value& v, CallArgs& args) { return Contains(Argument(args, "in"), v); }},
      {"sameas",
       [](const Value& v, CallArgs& args) {
         const Value& other = Argument(args, "sameas");
         if (v.identity() != nullptr) return v.identity() == other.identity();
         return v.kind() == other.kind() && (v.is_none() || v.is_undefined() || v == other);
       }},
      {"lower", [](const Value& v, CallArgs&) { return HasCase(v, false); }},
      {"upper", [](const Value& v, CallArgs&) { return HasCase(v, true); }},
      {"escaped", [](const Value&, CallArgs&) { return false; }},
  };
  return *tests;
}

}  // namespace

bool IsKnownTest(std::string_view name) { return Tests().count(name) > 0; }

bool ApplyTest(const std::string& name, const Value& operand, CallArgs& args, Evaluator&) {
  auto found = Tests().find(name);
  if (found == Tests().end()) ThrowError("No test named '" + name + "'.");
  bool result = found->second(operand, args);
  Status status = args.Finish(name, 1);
  if (!status.ok()) ThrowError(status.message());
  return result;
}

}  // namespace engine::jinja
