// Attribute, item and slice access, and the methods of str and dict a template may call.
#include <algorithm>
#include <cctype>
#include <optional>

#include "jinja/builtins.h"
#include "jinja/limits.h"
#include "jinja/unicode.h"

namespace engine::jinja {
namespace {

// Methods that would change a list or dict: the sandbox transformers renders in refuses them.
bool IsMutatingMethod(const Value& object, const std::string& name) {
  static const char* const kList[] = {"append", "extend", "insert", "pop",
                                      "remove", "clear",  "sort",   "reverse"};
  static const char* const kDict[] = {"update", "pop", "popitem", "clear", "setdefault"};
  if (object.is_list()) {
    return std::any_of(std::begin(kList), std::end(kList),
                       [&](const char* m) { return name == m; });
  }
  if (object.is_dict()) {
    return std::any_of(std::begin(kDict), std::end(kDict),
                       [&](const char* m) { return name == m; });
  }
  return false;
}

const std::string* OptionalString(CallArgs& args, size_t index, const char* name,
                                  const char* method) {
  const Value* v = args.Get(index, name);
  if (v == nullptr || v->is_none()) return nullptr;
  if (!v->is_string()) {
    ThrowError(std::string(method) + "() argument must be str or None, not " + v->TypeName());
  }
  return &v->as_string();
}

const std::string& RequiredString(CallArgs& args, size_t index, const char* name,
                                  const char* method) {
  const Value* v = args.Get(index, name);
  if (v == nullptr) ThrowError(std::string(method) + "() missing required argument '" + name + "'");
  if (!v->is_string()) {
    ThrowError(std::string(method) + "() argument must be str, not " + v->TypeName());
  }
  return v->as_string();
}

int64_t OptionalInt(CallArgs& args, size_t index, const char* name, int64_t fallback) {
  const Value* v = args.Get(index, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_int()) ThrowError(std::string("'") + name + "' must be an integer");
  return v->as_int();
}

bool AffixMatch(CallArgs& args, const std::string& s, bool prefix, const char* method) {
  const Value* affix = args.Get(0, prefix ? "prefix" : "suffix");
  FinishCall(args, method, 1);
  if (affix == nullptr) ThrowError(std::string(method) + "() takes at least 1 argument (0 given)");
  ValueList candidates = affix->is_list() ? affix->as_list() : ValueList{*affix};
  for (const Value& candidate : candidates) {
    if (!candidate.is_string()) {
      ThrowError(std::string(method) + " first arg must be str or a tuple of str, not " +
                 candidate.TypeName());
    }
    const std::string& c = candidate.as_string();
    if (c.size() > s.size()) continue;
    if (prefix ? s.compare(0, c.size(), c) == 0
               : s.compare(s.size() - c.size(), c.size(), c) == 0) {
      return true;
    }
  }
  return false;
}

std::string ReplaceInString(const std::string& s, const std::string& from, const std::string& to,
                            int64_t count) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) {
    std::vector<size_t> offsets = CodePointOffsets(s);
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) {
        RenderBudget::CheckString(out.size() + to.size() + s.size());
        out += to;
        ++done;
      }
      out += s.substr(offsets[i], offsets[i + 1] - offsets[i]);
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  while (count < 0 || done < count) {
    size_t found = s.find(from, pos);
    if (found == std::string::npos) break;
    RenderBudget::CheckString(out.size() + (found - pos) + to.size() + (s.size() - found));
    out += s.substr(pos, found - pos) + to;
    pos = found + from.size();
    ++done;
  }
  return out + s.substr(pos);
}

// str.split and str.rsplit, with Python's rules for sep and maxsplit.
Value SplitMethod(const std::string& s, const std::string& name, CallArgs& args) {
  const std::string* sep = OptionalString(args, 0, "sep", name.c_str());
  int64_t maxsplit = OptionalInt(args, 1, "maxsplit", -1);
  FinishCall(args, name, 2);
  if (sep != nullptr && sep->empty()) ThrowError("empty separator");
  if (name == "rsplit" && maxsplit >= 0) {
    if (sep == nullptr) ThrowError("rsplit() with maxsplit needs a separator");
    std::vector<std::string> tail;
    std::string rest = s;
    for (int64_t done = 0; done < maxsplit; ++done) {
      size_t found = rest.rfind(*sep);
      if (found == std::string::npos) break;
      tail.push_back(rest.substr(found + sep->size()));
      rest.resize(found);
    }
    ValueList out{Value::String(rest)};
    for (auto part = tail.rbegin(); part != tail.rend(); ++part) {
      out.push_back(Value::String(*part));
    }
    return Value::List(std::move(out));
  }
  return Value::List(PySplit(s, sep, maxsplit));
}

// str.find, rfind, index (positions in code points, as Python counts) and count.
Value SearchMethod(const std::string& s, const std::string& name, CallArgs& args) {
  const std::string& sub = RequiredString(args, 0, "sub", name.c_str());
  FinishCall(args, name, 1);
  if (name == "count") {
    if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointOffsets(s).size()));
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) {
      ++n;
    }
    return Value::Int(n);
  }
  size_t pos = name == "rfind" ? s.rfind(sub) : s.find(sub);
  if (pos == std::string::npos) {
    if (name == "index") ThrowError("substring not found");
    return Value::Int(-1);
  }
  return Value::Int(static_cast<int64_t>(CodePointOffsets(s.substr(0, pos)).size()) - 1);
}

Value RemoveAffixMethod(const std::string& s, const std::string& name, CallArgs& args) {
  const std::string& affix = RequiredString(args, 0, "affix", name.c_str());
  FinishCall(args, name, 1);
  if (affix.size() <= s.size()) {
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) {
      return Value::String(s.substr(affix.size()));
    }
    if (name == "removesuffix" && s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::String(s.substr(0, s.size() - affix.size()));
    }
  }
  return Value::String(s);
}

Value JoinMethod(const std::string& s, const std::string& name, CallArgs& args) {
  const Value* items = args.Get(0, "iterable");
  FinishCall(args, name, 1);
  if (items == nullptr) ThrowError("join() takes exactly one argument (0 given)");
  std::string out;
  ValueList list = Iterate(*items);
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) {
      ThrowError("sequence item " + std::to_string(i) + ": expected str instance, " +
                 list[i].TypeName().substr(0, list[i].TypeName().find(' ')) + " found");
    }
    if (i > 0) out += s;
    RenderBudget::CheckString(out.size() + list[i].as_string().size());
    out += list[i].as_string();
  }
  return Value::String(std::move(out));
}

// isdigit, isalpha, isalnum, isspace, isupper, islower over ASCII classes; nullopt for another
// name.
std::optional<Value> ClassMethod(const std::string& s, const std::string& name, CallArgs& args) {
  int (*classify)(int) = name == "isdigit"   ? ::isdigit
                         : name == "isalpha" ? ::isalpha
                         : name == "isalnum" ? ::isalnum
                         : name == "isspace" ? ::isspace
                                             : nullptr;
  if (classify != nullptr) {
    FinishCall(args, name, 0);
    return Value::Bool(!s.empty() && std::all_of(s.begin(), s.end(), [&](char c) {
      return classify(static_cast<unsigned char>(c)) != 0;
    }));
  }
  if (name != "isupper" && name != "islower") return std::nullopt;
  FinishCall(args, name, 0);
  bool cased = false;
  for (char c : s) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      cased = true;
      if ((name == "isupper") != (std::isupper(static_cast<unsigned char>(c)) != 0)) {
        return Value::Bool(false);
      }
    }
  }
  return Value::Bool(cased);
}

Value StringMethod(const std::string& s, const std::string& name, CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const std::string* chars = OptionalString(args, 0, "chars", name.c_str());
    FinishCall(args, name, 1);
    return Value::String(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") return SplitMethod(s, name, args);
  if (name == "splitlines") {
    FinishCall(args, name, 0);
    ValueList lines;
    for (auto& line : PySplitLines(s)) lines.push_back(Value::String(std::move(line)));
    return Value::List(std::move(lines));
  }
  if (name == "startswith" || name == "endswith") {
    return Value::Bool(AffixMatch(args, s, name == "startswith", name.c_str()));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    FinishCall(args, name, 0);
    if (name == "upper") return Value::String(AsciiUpper(s));
    if (name == "lower") return Value::String(AsciiLower(s));
    if (name == "title") return Value::String(PyTitle(s));
    return Value::String(PyCapitalize(s));
  }
  if (name == "replace") {
    const std::string& from = RequiredString(args, 0, "old", "replace");
    const std::string& to = RequiredString(args, 1, "new", "replace");
    int64_t count = OptionalInt(args, 2, "count", -1);
    FinishCall(args, name, 3);
    return Value::String(ReplaceInString(s, from, to, count));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    return SearchMethod(s, name, args);
  }
  if (name == "removeprefix" || name == "removesuffix") return RemoveAffixMethod(s, name, args);
  if (name == "join") return JoinMethod(s, name, args);
  if (std::optional<Value> answer = ClassMethod(s, name, args)) return *std::move(answer);
  ThrowError("'str object' has no attribute '" + name + "'");
}

Value DictMethod(const Value& dict, const std::string& name, CallArgs& args) {
  if (name == "get") {
    const Value* key = args.Get(0, "key");
    const Value* fallback = args.Get(1, "default");
    FinishCall(args, name, 2);
    if (key == nullptr) ThrowError("get expected at least 1 argument, got 0");
    const Value* found = key->is_string() ? dict.Find(key->as_string()) : nullptr;
    if (found != nullptr) return *found;
    return fallback != nullptr ? *fallback : Value::None();
  }
  FinishCall(args, name, 0);
  ValueList out;
  for (const auto& [key, value] : dict.as_dict()) {
    if (name == "items") {
      out.push_back(Value::List({Value::String(key), value}, true));
    } else if (name == "keys") {
      out.push_back(Value::String(key));
    } else {
      out.push_back(value);
    }
  }
  return Value::List(std::move(out));
}

bool IsStringMethod(const std::string& name) {
  static const char* const kMethods[] = {
      "strip",    "lstrip",  "rstrip",  "split",        "rsplit",       "splitlines", "startswith",
      "endswith", "upper",   "lower",   "title",        "capitalize",   "replace",    "find",
      "rfind",    "count",   "index",   "removeprefix", "removesuffix", "join",       "isdigit",
      "isalpha",  "isalnum", "isspace", "isupper",      "islower"};
  return std::any_of(std::begin(kMethods), std::end(kMethods),
                     [&](const char* m) { return name == m; });
}

bool IsDictMethod(const std::string& name) {
  return name == "get" || name == "items" || name == "keys" || name == "values";
}

// The bound method `object.name`, or undefined when there is none.
std::optional<Value> Method(const Value& object, const std::string& name) {
  if (IsMutatingMethod(object, name)) {
    ThrowError("access to attribute '" + name + "' of '" +
               object.TypeName().substr(0, object.TypeName().find(' ')) + "' object is unsafe.");
  }
  if (object.is_string() && IsStringMethod(name)) {
    std::string s = object.as_string();
    return Value::Callable(name, [s, name](CallArgs& args, Evaluator&) -> StatusOr<Value> {
      return StringMethod(s, name, args);
    });
  }
  if (object.is_dict() && IsDictMethod(name)) {
    return Value::Callable(name, [object, name](CallArgs& args, Evaluator&) -> StatusOr<Value> {
      return DictMethod(object, name, args);
    });
  }
  return std::nullopt;
}

Value ItemOf(const Value& object, const Value& key) {
  if (object.is_dict() || object.is_namespace()) {
    if (key.is_string()) {
      if (const Value* found = object.Find(key.as_string())) return *found;
    }
    return Value::Undefined("'" + object.TypeName() + "' has no attribute '" + key.Str() + "'");
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t index = key.is_bool() ? key.as_bool() : key.as_int();
    if (object.is_list()) {
      int64_t n = static_cast<int64_t>(object.as_list().size());
      if (index < 0) index += n;
      if (index >= 0 && index < n) return object.as_list()[static_cast<size_t>(index)];
    } else {
      std::vector<size_t> offsets = CodePointOffsets(object.as_string());
      int64_t n = static_cast<int64_t>(offsets.size()) - 1;
      if (index < 0) index += n;
      if (index >= 0 && index < n) {
        size_t i = static_cast<size_t>(index);
        return Value::String(object.as_string().substr(offsets[i], offsets[i + 1] - offsets[i]));
      }
    }
    return Value::Undefined("'" + object.TypeName() + "' has no element " + key.Str());
  }
  return Value::Undefined("'" + object.TypeName() + "' has no attribute '" + key.Str() + "'");
}

}  // namespace

Value GetAttribute(const Value& object, const std::string& name) {
  RequireDefined(object);
  if (std::optional<Value> method = Method(object, name)) return *method;
  return ItemOf(object, Value::String(name));
}

Value GetItem(const Value& object, const Value& key) {
  RequireDefined(object);
  Value item = ItemOf(object, key);
  if (!item.is_undefined() || !key.is_string()) return item;
  if (std::optional<Value> method = Method(object, key.as_string())) return *method;
  return item;
}

Value Slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  RequireDefined(object);
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int()) ThrowError(std::string("slice ") + what + " must be an integer or None");
    return v.as_int();
  };
  std::optional<int64_t> first = bound(start, "start");
  std::optional<int64_t> last = bound(stop, "stop");
  int64_t stride = bound(step, "step").value_or(1);
  if (stride == 0) ThrowError("slice step cannot be zero");
  std::vector<size_t> offsets;
  int64_t n;
  if (object.is_string()) {
    offsets = CodePointOffsets(object.as_string());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else if (object.is_list()) {
    n = static_cast<int64_t>(object.as_list().size());
  } else {
    ThrowError("'" + object.TypeName() + "' is not subscriptable");
  }
  // Python's slice.indices().
  auto clamp = [n, stride](std::optional<int64_t> v, bool is_start) {
    if (!v) return stride > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
    int64_t x = *v < 0 ? *v + n : *v;
    if (stride > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t i = clamp(first, true);
  int64_t end = clamp(last, false);
  std::vector<size_t> picked;
  for (; stride > 0 ? i < end : i > end;) {
    picked.push_back(static_cast<size_t>(i));
    if (__builtin_add_overflow(i, stride, &i)) break;  // past either end of any sequence
  }
  if (object.is_string()) {
    std::string out;
    for (size_t k : picked)
      out += object.as_string().substr(offsets[k], offsets[k + 1] - offsets[k]);
    return Value::String(std::move(out));
  }
  ValueList out;
  for (size_t k : picked) out.push_back(object.as_list()[k]);
  return Value::List(std::move(out), object.is_tuple());
}

}  // namespace engine::jinja
