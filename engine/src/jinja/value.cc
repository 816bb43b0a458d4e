#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/builtins.h"
#include "jinja/limits.h"
#include "jinja/unicode.h"

namespace engine::jinja {

Value Value::Undefined(std::string hint) {
  Value v;
  v.string_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

namespace {

// 1 + the deepest item's nesting; refused during a render past kMaxCallDepth.
template <typename Items, typename Get>
int NestingOf(const Items& items, Get get) {
  int deepest = 0;
  for (const auto& item : items) deepest = std::max(deepest, get(item).nesting());
  if (deepest + 1 > kMaxCallDepth && RenderBudget::Active()) {
    ThrowError("the template would build a value nested deeper than " +
               std::to_string(kMaxCallDepth) + " levels");
  }
  return deepest + 1;
}

}  // namespace

Value Value::List(ValueList items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.is_tuple_ = is_tuple;
  v.nesting_ = NestingOf(items, [](const Value& item) -> const Value& { return item; });
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.nesting_ = NestingOf(items, [](const auto& entry) -> const Value& { return entry.second; });
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::Callable(std::string name, Function function) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.string_ = std::make_shared<const std::string>(std::move(name));
  v.function_ = std::make_shared<const Function>(std::move(function));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict items;
      items.reserve(json.size());
      for (const auto& [key, item] : json.items()) items.emplace_back(key, FromJson(item));
      return Dict(std::move(items));
    }
    case nlohmann::ordered_json::value_t::binary:
      break;
  }
  return None();
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::kInt:
      return static_cast<double>(int_);
    case Kind::kBool:
      return bool_ ? 1 : 0;
    default:
      return float_;
  }
}

const void* Value::identity() const {
  if (kind_ == Kind::kList) return list_.get();
  if (kind_ == Kind::kDict || kind_ == Kind::kNamespace) return dict_.get();
  return nullptr;
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kDict && kind_ != Kind::kNamespace) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !string_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest digits that read back as d, then Python's layout: scientific when the exponent
  // is below -4 or at least 16, fixed otherwise, always with a '.' or an exponent.
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, d, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) {
    return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  }
  size_t int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) {
    return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

namespace {

std::string StringRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(quote)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char hex[16];
          std::snprintf(hex, sizeof hex, "\\x%02x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *string_;
    default:
      return Repr();
  }
}

std::string Value::Repr(int depth) const {
  if (depth > kMaxCallDepth) {
    ThrowError("a value nested deeper than " + std::to_string(kMaxCallDepth) +
               " levels (a namespace that holds itself?) cannot be printed");
  }
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return FloatRepr(float_);
    case Kind::kString:
      return StringRepr(*string_);
    case Kind::kList: {
      std::string out = is_tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr(depth + 1);
        RenderBudget::CheckString(out.size());
      }
      if (is_tuple_ && list_->size() == 1) out += ",";
      return out + (is_tuple_ ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        if (i > 0) out += ", ";
        out += StringRepr((*dict_)[i].first) + ": " + (*dict_)[i].second.Repr(depth + 1);
        RenderBudget::CheckString(out.size());
      }
      return out + "}";
    }
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      for (size_t i = 0; i < dict_->size(); ++i) {
        if (i > 0) out += ", ";
        out += StringRepr((*dict_)[i].first) + ": " + (*dict_)[i].second.Repr(depth + 1);
        RenderBudget::CheckString(out.size());
      }
      return out + "}>";
    }
    case Kind::kFunction:
      return "<function " + *string_ + ">";
  }
  return "";
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType object";
    case Kind::kBool:
      return "bool object";
    case Kind::kInt:
      return "int object";
    case Kind::kFloat:
      return "float object";
    case Kind::kString:
      return "str object";
    case Kind::kList:
      return is_tuple_ ? "tuple object" : "list object";
    case Kind::kDict:
      return "dict object";
    case Kind::kNamespace:
      return "Namespace object";
    case Kind::kFunction:
      return "function object";
  }
  return "object";
}

bool operator==(const Value& a, const Value& b) {
  bool a_numeric = a.is_number() || a.is_bool();
  bool b_numeric = b.is_number() || b.is_bool();
  if (a_numeric && b_numeric) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList:
      return a.is_tuple() == b.is_tuple() && a.as_list() == b.as_list();
    case Value::Kind::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [key, value] : a.as_dict()) {
        const Value* other = b.Find(key);
        if (other == nullptr || *other != value) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity() && a.identity() != nullptr;
  }
}

namespace {

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          char hex[16];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else if (c >= 0x80 && ensure_ascii) {
          size_t length = 0;
          char32_t cp = DecodeUtf8(s, i, &length);
          auto put = [&out](unsigned unit) {
            char hex[16];
            std::snprintf(hex, sizeof hex, "\\u%04x", unit);
            out += hex;
          };
          if (cp >= 0x10000) {
            cp -= 0x10000;
            put(0xD800 + (cp >> 10));
            put(0xDC00 + (cp & 0x3FF));
          } else {
            put(cp);
          }
          i += length;
          continue;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

// Python's json.dumps for one value and, recursively, its items: one case per value type, with
// indentation and separators handled where they appear.
Status AppendJson(const Value& value, const JsonOptions& options, int depth, std::string& out) {
  if (depth > kMaxCallDepth) {
    return InvalidArgumentError("a value nested deeper than " + std::to_string(kMaxCallDepth) +
                                " levels cannot be serialized");
  }
  if (out.size() > kMaxStringBytes ||
      (options.indent && static_cast<size_t>(std::max(0, *options.indent)) >
                             kMaxStringBytes / static_cast<size_t>(depth + 2))) {
    return InvalidArgumentError("tojson would build a string above the " +
                                std::to_string(kMaxStringBytes) +
                                " bytes a chat template may build");
  }
  const std::string item_separator =
      options.separators ? options.separators->first : (options.indent ? "," : ", ");
  const std::string key_separator = options.separators ? options.separators->second : ": ";
  auto newline = [&](int level) {
    if (!options.indent) return;
    out += '\n';
    // Python's json.dumps indents by ' ' * indent: nothing for a negative indent.
    out.append(static_cast<size_t>(std::max(0, *options.indent)) * static_cast<size_t>(level), ' ');
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      out += value.as_bool() ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      out += std::to_string(value.as_int());
      return Status::Ok();
    case Value::Kind::kFloat: {
      double d = value.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += FloatRepr(d);
      }
      return Status::Ok();
    }
    case Value::Kind::kString:
      AppendJsonString(value.as_string(), options.ensure_ascii, out);
      return Status::Ok();
    case Value::Kind::kList: {
      const ValueList& items = value.as_list();
      if (items.empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_separator;
        newline(depth + 1);
        ENGINE_RETURN_IF_ERROR(AppendJson(items[i], options, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : value.as_dict()) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      if (entries.empty()) {
        out += "{}";
        return Status::Ok();
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_separator;
        newline(depth + 1);
        AppendJsonString(entries[i]->first, options.ensure_ascii, out);
        out += key_separator;
        ENGINE_RETURN_IF_ERROR(AppendJson(entries[i]->second, options, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return Status::Ok();
    }
    case Value::Kind::kUndefined:
      return InvalidArgumentError("Object of type Undefined is not JSON serializable");
    case Value::Kind::kNamespace:
      return InvalidArgumentError("Object of type Namespace is not JSON serializable");
    case Value::Kind::kFunction:
      return InvalidArgumentError("Object of type function is not JSON serializable");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  ENGINE_RETURN_IF_ERROR(AppendJson(value, options, 0, out));
  return out;
}

const Value* CallArgs::Get(size_t index, std::string_view name) {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : keyword) {
    if (key == name) {
      used_.emplace_back(name);
      return &value;
    }
  }
  return nullptr;
}

Status CallArgs::Finish(std::string_view function, size_t max_positional) {
  if (positional.size() > max_positional) {
    return InvalidArgumentError(
        std::string(function) + "() takes at most " + std::to_string(max_positional) + " argument" +
        (max_positional == 1 ? "" : "s") + " (" + std::to_string(positional.size()) + " given)");
  }
  for (const auto& [key, value] : keyword) {
    if (std::find(used_.begin(), used_.end(), key) == used_.end()) {
      return InvalidArgumentError(std::string(function) +
                                  "() got an unexpected keyword argument '" + key + "'");
    }
  }
  return Status::Ok();
}

}  // namespace engine::jinja
