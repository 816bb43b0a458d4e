// The values a Jinja template computes with, with Python's semantics as Jinja2 gives them.
//
// Chat templates are written for Python Jinja2 (transformers renders them with it), so a Value
// behaves like the Python object it stands for: truthiness (empty strings, lists and dicts are
// false), `str()` and `repr()` when printed (`True`, `None`, `['a', 1]`, `1.0`, `1e-05`), `==`
// across int/float/bool, and JSON as Python's `json.dumps` writes it (the `tojson` filter that
// transformers installs). Dicts keep their insertion order, as Python's do.
//
// Lists and dicts are immutable once built (HF renders in an ImmutableSandboxedEnvironment, where
// `list.append` is refused), so they are shared by pointer; only namespace() objects change, and
// they are shared too, which is what makes `{% set ns.x = ... %}` visible outside a loop.
//
// Thread safety: values are immutable except namespaces; a Value tree may be read from several
// threads while no template writes into its namespaces.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/status.h"

namespace engine::jinja {

class Value;
struct CallArgs;
class Evaluator;

using ValueList = std::vector<Value>;
// Insertion-ordered string-keyed map; chat messages hold a handful of keys, so lookups are linear.
using ValueDict = std::vector<std::pair<std::string, Value>>;

// A callable: a global function (range, namespace, raise_exception, strftime_now), a macro, a
// bound method of a string/dict, or `loop.cycle`. Returns the result or an error message (the
// evaluator adds the template position).
using Function = std::function<StatusOr<Value>(CallArgs& args, Evaluator& evaluator)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  // Undefined, remembering what was looked up (for "'x' is undefined" messages).
  Value() = default;
  static Value Undefined(std::string hint = {});
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items, bool is_tuple = false);
  static Value Dict(ValueDict items);
  static Value Namespace(ValueDict items);
  static Value Callable(std::string name, Function function);
  // JSON as Python's json.loads would give it (objects keep their order).
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return int_; }
  // Ints, floats and bools as a double.
  double as_double() const;
  const std::string& as_string() const { return *string_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& namespace_items() const { return *dict_; }
  const Function& function() const { return *function_; }
  // The name a callable was made with, or the undefined value's hint.
  const std::string& name() const { return *string_; }

  // Identity of a list/dict/namespace (the same object shared), or nullptr.
  const void* identity() const;

  // A dict's or namespace's entry, or nullptr.
  const Value* Find(std::string_view key) const;

  // Python's bool().
  bool Truthy() const;
  // Python's str(): what `{{ value }}` prints. Undefined prints nothing.
  std::string Str() const;
  int nesting() const { return nesting_; }
  // Python's repr(), used inside printed containers.
  std::string Repr() const { return Repr(0); }
  // Jinja2's type name in messages: "str object", "dict object", "list object", "int object".
  std::string TypeName() const;

  // Python's ==.
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

 private:
  Kind kind_ = Kind::kUndefined;
  bool is_tuple_ = false;
  bool bool_ = false;
  // How many containers deep the value goes (0 for a scalar): a render may not build one deeper
  // than kMaxCallDepth, which comparing, printing or freeing it would recurse through.
  int nesting_ = 0;
  int64_t int_ = 0;
  double float_ = 0;
  // `depth`: how deep inside other values this one is printed; past kMaxCallDepth (a namespace
  // that holds itself) it is an error rather than a stack overflow.
  std::string Repr(int depth) const;

  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Function> function_;
};

// Python's repr() of a float ("1.0", "0.1", "1e-05", "1e+16", "inf", "nan").
std::string FloatRepr(double d);

// json.dumps options, as transformers' tojson filter passes them through.
struct JsonOptions {
  std::optional<int> indent;  // nullopt: one line
  bool ensure_ascii = false;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool sort_keys = false;
};

// Python's json.dumps(value, ...). Fails on values JSON cannot hold (undefined, functions), with
// Python's message ("Object of type Undefined is not JSON serializable").
StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options);

// Positional and keyword arguments of a call, in order.
struct CallArgs {
  ValueList positional;
  ValueDict keyword;

  // The argument at `index`, or the keyword argument `name`, or nullptr; a keyword argument
  // that is read is marked used, so Finish can report unexpected ones.
  const Value* Get(size_t index, std::string_view name);
  // Fails with "<function>() got an unexpected keyword argument 'x'" or "takes at most N
  // arguments" when arguments were passed that no Get asked for.
  Status Finish(std::string_view function, size_t max_positional);

 private:
  std::vector<std::string> used_;
};

}  // namespace engine::jinja
