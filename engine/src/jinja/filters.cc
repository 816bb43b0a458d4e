// Jinja2's built-in filters, with transformers' tojson (json.dumps with ensure_ascii=False).
#include <algorithm>
#include <cmath>
#include <map>

#include "jinja/builtins.h"
#include "jinja/evaluator.h"
#include "jinja/limits.h"
#include "jinja/unicode.h"

namespace engine::jinja {
namespace {

using FilterFunction = Value (*)(const Value& operand, CallArgs& args, Evaluator& evaluator);

bool Flag(CallArgs& args, size_t index, const char* name, bool fallback) {
  const Value* v = args.Get(index, name);
  return v == nullptr ? fallback : v->Truthy();
}

// The item at a dotted path ("function.name", "0"), as Jinja2's attribute getters find it.
Value Attribute(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (!digits) {
      v = GetItem(v, Value::String(part));
    } else {
      try {
        v = GetItem(v, Value::Int(std::stoll(part)));
      } catch (const std::out_of_range&) {
        return Value::Undefined();  // an index past 64 bits finds nothing, as in Python
      }
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::string AttributeArgument(CallArgs& args, size_t index, const char* name) {
  const Value* v = args.Get(index, name);
  if (v == nullptr || v->is_none()) return "";
  return v->Str();
}

// The sort key of sort, unique, min, max and dictsort: the attribute, lower-cased strings unless
// case_sensitive.
Value SortKey(const Value& item, const std::string& attribute, bool case_sensitive) {
  Value key = attribute.empty() ? item : Attribute(item, attribute);
  if (!case_sensitive && key.is_string()) return Value::String(AsciiLower(key.as_string()));
  return key;
}

Value Trim(const Value& v, CallArgs& args, Evaluator&) {
  const Value* chars = args.Get(0, "chars");
  FinishCall(args, "trim", 1);
  std::string set = chars != nullptr && !chars->is_none() ? chars->Str() : "";
  return Value::String(
      PyStrip(v.Str(), chars != nullptr && !chars->is_none() ? &set : nullptr, true, true));
}

Value Upper(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "upper", 0);
  return Value::String(AsciiUpper(v.Str()));
}

Value Lower(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "lower", 0);
  return Value::String(AsciiLower(v.Str()));
}

Value Capitalize(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "capitalize", 0);
  return Value::String(PyCapitalize(v.Str()));
}

// Jinja2's title: words begin after '-', whitespace or an opening bracket.
Value Title(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "title", 0);
  std::string s = v.Str();
  std::string out;
  bool word_start = true;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    bool separator = c == '-' || std::isspace(u) || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      out += c;
      word_start = true;
    } else {
      out += static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
      word_start = false;
    }
  }
  return Value::String(std::move(out));
}

Value Length(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "length", 0);
  return Value::Int(PyLen(v));
}

Value First(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "first", 0);
  ValueList items = Iterate(v);
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Value Last(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "last", 0);
  ValueList items = Iterate(v);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Value Join(const Value& v, CallArgs& args, Evaluator&) {
  const Value* separator = args.Get(0, "d");
  std::string attribute = AttributeArgument(args, 1, "attribute");
  FinishCall(args, "join", 2);
  std::string out;
  ValueList items = Iterate(v);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0 && separator != nullptr) out += separator->Str();
    const std::string item = (attribute.empty() ? items[i] : Attribute(items[i], attribute)).Str();
    RenderBudget::CheckString(out.size() + item.size());
    out += item;
  }
  return Value::String(std::move(out));
}

Value Default(const Value& v, CallArgs& args, Evaluator&) {
  const Value* fallback = args.Get(0, "default_value");
  bool boolean = Flag(args, 1, "boolean", false);
  FinishCall(args, "default", 2);
  if (v.is_undefined() || (boolean && !v.Truthy())) {
    return fallback != nullptr ? *fallback : Value::String("");
  }
  return v;
}

Value ReplaceFilter(const Value& v, CallArgs& args, Evaluator& evaluator) {
  CallArgs method_args;
  method_args.positional = args.positional;
  method_args.keyword = args.keyword;
  Value method = GetAttribute(Value::String(v.Str()), "replace");
  return evaluator.Call(method, method_args);
}

Value String(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "string", 0);
  return Value::String(v.Str());
}

// Python's int() of a string: optional sign and surrounding whitespace, underscores between
// digits.
std::optional<int64_t> ParseInt(const std::string& text) {
  std::string s = PyStrip(text, nullptr, true, true);
  std::string digits;
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  for (; i < s.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      digits += s[i];
    } else if (s[i] != '_' || digits.empty()) {
      return std::nullopt;
    }
  }
  if (digits.empty()) return std::nullopt;
  try {
    int64_t value = std::stoll(digits);
    return negative ? -value : value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<double> ParseFloat(const std::string& text) {
  std::string s = PyStrip(text, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  size_t used = 0;
  try {
    double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

Value Int(const Value& v, CallArgs& args, Evaluator&) {
  const Value* fallback = args.Get(0, "default");
  FinishCall(args, "int", 2);
  Value otherwise = fallback != nullptr ? *fallback : Value::Int(0);
  if (v.is_int()) return v;
  if (v.is_bool()) return Value::Int(v.as_bool());
  // A float past 64 bits would be a wrong number (jinja2 gives the exact big integer).
  auto truncated = [](double d) {
    if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) {
      ThrowError("integer overflow: int(" + std::to_string(d) + ") does not fit in 64 bits");
    }
    return Value::Int(static_cast<int64_t>(d));
  };
  if (v.is_float()) return std::isfinite(v.as_double()) ? truncated(v.as_double()) : otherwise;
  if (v.is_string()) {
    if (auto i = ParseInt(v.as_string())) return Value::Int(*i);
    if (auto d = ParseFloat(v.as_string())) return std::isfinite(*d) ? truncated(*d) : otherwise;
  }
  return otherwise;
}

Value Float(const Value& v, CallArgs& args, Evaluator&) {
  const Value* fallback = args.Get(0, "default");
  FinishCall(args, "float", 1);
  if (v.is_number() || v.is_bool()) return Value::Float(v.as_double());
  if (v.is_string()) {
    if (auto d = ParseFloat(v.as_string())) return Value::Float(*d);
  }
  return fallback != nullptr ? *fallback : Value::Float(0);
}

Value Round(const Value& v, CallArgs& args, Evaluator&) {
  const Value* precision = args.Get(0, "precision");
  const Value* method = args.Get(1, "method");
  FinishCall(args, "round", 2);
  if (!v.is_number() && !v.is_bool()) ThrowError("round() needs a number, not " + v.TypeName());
  int64_t digits = precision != nullptr && precision->is_int() ? precision->as_int() : 0;
  std::string how = method != nullptr ? method->Str() : "common";
  double scale = std::pow(10.0, static_cast<double>(digits));
  double x = v.as_double() * scale;
  double r = how == "ceil" ? std::ceil(x) : how == "floor" ? std::floor(x) : std::nearbyint(x);
  if (how != "common" && how != "ceil" && how != "floor") {
    ThrowError("method must be 'common', 'ceil' or 'floor'");
  }
  if (v.is_int() && how == "common") return v;
  return Value::Float(r / scale);
}

Value Abs(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "abs", 0);
  if (v.is_float()) return Value::Float(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
    if (i == INT64_MIN)
      ThrowError("integer overflow: abs(" + std::to_string(i) + ") does not fit in 64 bits");
    return Value::Int(i < 0 ? -i : i);
  }
  ThrowError("bad operand type for abs(): '" + v.TypeName() + "'");
}

Value List(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "list", 0);
  return Value::List(Iterate(v));
}

Value Items(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "items", 0);
  if (v.is_undefined()) return Value::List({});
  if (!v.is_dict()) ThrowError("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [key, item] : v.as_dict()) {
    out.push_back(Value::List({Value::String(key), item}, true));
  }
  return Value::List(std::move(out));
}

void StableSort(ValueList& items, const std::string& attribute, bool case_sensitive, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items)
    keyed.emplace_back(SortKey(item, attribute, case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? PyOrder(b.first, a.first) < 0 : PyOrder(a.first, b.first) < 0;
  });
  for (size_t i = 0; i < items.size(); ++i) items[i] = keyed[i].second;
}

Value Sort(const Value& v, CallArgs& args, Evaluator&) {
  bool reverse = Flag(args, 0, "reverse", false);
  bool case_sensitive = Flag(args, 1, "case_sensitive", false);
  std::string attribute = AttributeArgument(args, 2, "attribute");
  FinishCall(args, "sort", 3);
  ValueList items = Iterate(v);
  StableSort(items, attribute, case_sensitive, reverse);
  return Value::List(std::move(items));
}

Value DictSort(const Value& v, CallArgs& args, Evaluator&) {
  bool case_sensitive = Flag(args, 0, "case_sensitive", false);
  const Value* by = args.Get(1, "by");
  bool reverse = Flag(args, 2, "reverse", false);
  FinishCall(args, "dictsort", 3);
  if (!v.is_dict()) ThrowError("dictsort needs a mapping, not " + v.TypeName());
  std::string position = by != nullptr ? by->Str() : "key";
  if (position != "key" && position != "value") {
    ThrowError("You can only sort by either \"key\" or \"value\"");
  }
  ValueList pairs;
  for (const auto& [key, item] : v.as_dict()) {
    pairs.push_back(Value::List({Value::String(key), item}, true));
  }
  StableSort(pairs, position == "key" ? "0" : "1", case_sensitive, reverse);
  return Value::List(std::move(pairs));
}

Value Unique(const Value& v, CallArgs& args, Evaluator&) {
  bool case_sensitive = Flag(args, 0, "case_sensitive", false);
  std::string attribute = AttributeArgument(args, 1, "attribute");
  FinishCall(args, "unique", 2);
  ValueList out;
  ValueList seen;
  for (const Value& item : Iterate(v)) {
    Value key = SortKey(item, attribute, case_sensitive);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::List(std::move(out));
}

Value Reverse(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "reverse", 0);
  ValueList items = Iterate(v);
  std::reverse(items.begin(), items.end());
  if (!v.is_string()) return Value::List(std::move(items));
  std::string out;
  for (const Value& c : items) out += c.as_string();
  return Value::String(std::move(out));
}

Value MinMax(const Value& v, CallArgs& args, bool max, const char* name) {
  bool case_sensitive = Flag(args, 0, "case_sensitive", false);
  std::string attribute = AttributeArgument(args, 1, "attribute");
  FinishCall(args, name, 2);
  ValueList items = Iterate(v);
  if (items.empty())
    return Value::Undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int order = PyOrder(SortKey(items[i], attribute, case_sensitive),
                        SortKey(items[best], attribute, case_sensitive));
    if (max ? order > 0 : order < 0) best = i;
  }
  return items[best];
}
Value Max(const Value& v, CallArgs& args, Evaluator&) { return MinMax(v, args, true, "max"); }
Value Min(const Value& v, CallArgs& args, Evaluator&) { return MinMax(v, args, false, "min"); }

Value Sum(const Value& v, CallArgs& args, Evaluator&) {
  std::string attribute = AttributeArgument(args, 0, "attribute");
  const Value* start = args.Get(1, "start");
  FinishCall(args, "sum", 2);
  Value total = start != nullptr ? *start : Value::Int(0);
  for (const Value& item : Iterate(v)) {
    total = BinaryOperation("+", total, attribute.empty() ? item : Attribute(item, attribute));
  }
  return total;
}

Value Map(const Value& v, CallArgs& args, Evaluator& evaluator) {
  ValueList out;
  const Value* attribute = nullptr;
  for (const auto& [key, value] : args.keyword) {
    if (key == "attribute") attribute = &value;
  }
  if (attribute != nullptr) {
    args.Get(99, "attribute");
    const Value* fallback = args.Get(99, "default");
    FinishCall(args, "map", 0);
    for (const Value& item : Iterate(v)) {
      Value mapped = Attribute(item, attribute->Str());
      out.push_back(mapped.is_undefined() && fallback != nullptr ? *fallback : mapped);
    }
    return Value::List(std::move(out));
  }
  if (args.positional.empty()) ThrowError("map requires a filter argument");
  std::string filter = args.positional[0].Str();
  if (!IsKnownFilter(filter)) ThrowError("No filter named '" + filter + "'.");
  for (const Value& item : Iterate(v)) {
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    out.push_back(evaluator.Filter(filter, item, rest));
  }
  return Value::List(std::move(out));
}

// select, reject, selectattr, rejectattr.
Value SelectOrReject(const Value& v, CallArgs& args, Evaluator& evaluator, bool by_attribute,
                     bool keep_matches) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) ThrowError("Missing parameter for attribute name");
    attribute = args.positional[next++].Str();
  }
  std::string test = next < args.positional.size() ? args.positional[next++].Str() : "";
  if (!test.empty() && !IsKnownTest(test)) ThrowError("No test named '" + test + "'.");
  ValueList out;
  for (const Value& item : Iterate(v)) {
    Value subject = by_attribute ? Attribute(item, attribute) : item;
    bool match;
    if (test.empty()) {
      match = subject.Truthy();
    } else {
      CallArgs test_args;
      test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next),
                                  args.positional.end());
      test_args.keyword = args.keyword;
      match = evaluator.Test(test, subject, test_args);
    }
    if (match == keep_matches) out.push_back(item);
  }
  return Value::List(std::move(out));
}
Value Select(const Value& v, CallArgs& a, Evaluator& e) {
  return SelectOrReject(v, a, e, false, true);
}
Value Reject(const Value& v, CallArgs& a, Evaluator& e) {
  return SelectOrReject(v, a, e, false, false);
}
Value SelectAttr(const Value& v, CallArgs& a, Evaluator& e) {
  return SelectOrReject(v, a, e, true, true);
}
Value RejectAttr(const Value& v, CallArgs& a, Evaluator& e) {
  return SelectOrReject(v, a, e, true, false);
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), positional arguments in that order.
Value ToJsonFilter(const Value& v, CallArgs& args, Evaluator&) {
  JsonOptions options;
  options.ensure_ascii = Flag(args, 0, "ensure_ascii", false);
  if (const Value* indent = args.Get(1, "indent"); indent != nullptr && !indent->is_none()) {
    if (!indent->is_int()) ThrowError("tojson: indent must be an integer");
    RenderBudget::CheckString(static_cast<size_t>(std::max<int64_t>(0, indent->as_int())));
    options.indent = static_cast<int>(std::max<int64_t>(-1, indent->as_int()));
  }
  if (const Value* separators = args.Get(2, "separators");
      separators != nullptr && !separators->is_none()) {
    if (!separators->is_list() || separators->as_list().size() != 2) {
      ThrowError("tojson: separators must be a pair of strings");
    }
    options.separators = {separators->as_list()[0].Str(), separators->as_list()[1].Str()};
  }
  options.sort_keys = Flag(args, 3, "sort_keys", false);
  FinishCall(args, "tojson", 4);
  StatusOr<std::string> json = ToJson(v, options);
  if (!json.ok()) ThrowError(json.status().message());
  return Value::String(std::move(json).value());
}

Value Safe(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "safe", 0);
  return v;
}

// Jinja2's indent: every line but the first (unless first) and blank ones (unless blank).
Value Indent(const Value& v, CallArgs& args, Evaluator&) {
  const Value* width = args.Get(0, "width");
  bool first = Flag(args, 1, "first", false);
  bool blank = Flag(args, 2, "blank", false);
  FinishCall(args, "indent", 3);
  if (width != nullptr && !width->is_string()) {
    RenderBudget::CheckString(static_cast<size_t>(std::max<int64_t>(0, width->as_int())));
  }
  std::string indentation =
      width == nullptr ? "    "
      : width->is_string()
          ? width->as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width->as_int())), ' ');
  std::vector<std::string> lines = PySplitLines(v.Str() + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    bool indent_line = (i > 0 || first) && (blank || !lines[i].empty());
    RenderBudget::CheckString(out.size() + (indent_line ? indentation.size() : 0) +
                              lines[i].size());
    out += (indent_line ? indentation : "") + lines[i];
  }
  return Value::String(std::move(out));
}

Value WordCount(const Value& v, CallArgs& args, Evaluator&) {
  FinishCall(args, "wordcount", 0);
  return Value::Int(static_cast<int64_t>(PySplit(v.Str(), nullptr, -1).size()));
}

const std::map<std::string, FilterFunction, std::less<>>& Filters() {
  static const auto* filters = new std::map<std::string, FilterFunction, std::less<>>{
      {"abs", Abs},
      {"capitalize", Capitalize},
      {"count", Length},
      {"d", Default},
      {"default", Default},
      {"dictsort", DictSort},
      {"first", First},
      {"float", Float},
      {"indent", Indent},
      {"int", Int},
      {"items", Items},
      {"join", Join},
      {"last", Last},
      {"length", Length},
      {"list", List},
      {"lower", Lower},
      {"map", Map},
      {"max", Max},
      {"min", Min},
      {"reject", Reject},
      {"rejectattr", RejectAttr},
      {"replace", ReplaceFilter},
      {"reverse", Reverse},
      {"round", Round},
      {"safe", Safe},
      {"select", Select},
      {"selectattr", SelectAttr},
      {"sort", Sort},
      {"string", String},
      {"sum", Sum},
      {"title", Title},
      {"tojson", ToJsonFilter},
      {"trim", Trim},
      {"unique", Unique},
      {"upper", Upper},
      {"wordcount", WordCount},
  };
  return *filters;
}

}  // namespace

bool IsKnownFilter(std::string_view name) { return Filters().count(name) > 0; }

Value ApplyFilter(const std::string& name, const Value& operand, CallArgs& args,
                  Evaluator& evaluator) {
  auto found = Filters().find(name);
  if (found == Filters().end()) ThrowError("No filter named '" + name + "'.");
  return found->second(operand, args, evaluator);
}

}  // namespace engine::jinja
