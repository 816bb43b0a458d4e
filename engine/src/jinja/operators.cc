// Python's arithmetic, ordering and membership on template values.
#include <cmath>

#include "jinja/builtins.h"
#include "jinja/limits.h"
#include "jinja/unicode.h"

namespace engine::jinja {
namespace {

std::string PyTypeName(const Value& v) {
  std::string name = v.TypeName();
  size_t space = name.find(' ');
  return space == std::string::npos ? name : name.substr(0, space);
}

[[noreturn]] void Unsupported(const std::string& op, const Value& a, const Value& b) {
  if (op == "+" && a.is_string()) {
    ThrowError("can only concatenate str (not \"" + PyTypeName(b) + "\") to str");
  }
  ThrowError("unsupported operand type(s) for " + op + ": '" + PyTypeName(a) + "' and '" +
             PyTypeName(b) + "'");
}

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t IntOf(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }
bool IsNumeric(const Value& v) { return v.is_number() || v.is_bool(); }

Value Repeat(const Value& sequence, int64_t times) {
  const bool empty =
      sequence.is_string() ? sequence.as_string().empty() : sequence.as_list().empty();
  if (times <= 0 || empty) {
    return sequence.is_string() ? Value::String("") : Value::List({}, sequence.is_tuple());
  }
  // Checked before anything is built: `'a' * 10**9` is refused at once.
  const size_t size =
      sequence.is_string() ? sequence.as_string().size() : sequence.as_list().size();
  uint64_t total = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(size), static_cast<uint64_t>(times), &total)) {
    total = UINT64_MAX;
  }
  if (sequence.is_string()) {
    RenderBudget::Built(total);
  } else {
    RenderBudget::CheckList(total);
  }
  if (sequence.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.as_string();
    return Value::String(std::move(out));
  }
  ValueList out;
  for (int64_t i = 0; i < times; ++i) {
    out.insert(out.end(), sequence.as_list().begin(), sequence.as_list().end());
  }
  return Value::List(std::move(out), sequence.is_tuple());
}

// jinja2 computes with Python's unbounded integers; a result past 64 bits is refused here rather
// than wrapped into a wrong number.
[[noreturn]] Value Overflow(const std::string& op, int64_t x, int64_t y) {
  ThrowError("integer overflow: " +
             (op == "-" && x == 0 ? "-" + std::to_string(y)
                                  : std::to_string(x) + " " + op + " " + std::to_string(y)) +
             " does not fit in 64 bits (jinja2 computes it exactly; this engine refuses it rather "
             "than give a wrong number)");
}

// x ** y for y >= 0 by squaring, refused past 64 bits.
int64_t Power(int64_t x, int64_t y) {
  int64_t result = 1, base = x;
  for (int64_t e = y; e > 0; e >>= 1) {
    if ((e & 1) != 0 && __builtin_mul_overflow(result, base, &result)) Overflow("**", x, y);
    if (e > 1 && __builtin_mul_overflow(base, base, &base)) Overflow("**", x, y);
  }
  return result;
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Python's ordering: -1, 0 or 1; throws for types Python cannot order.
int Order(const std::string& op, const Value& a, const Value& b) {
  if (IsNumeric(a) && IsNumeric(b)) {
    if (IsIntLike(a) && IsIntLike(b)) {
      return IntOf(a) < IntOf(b) ? -1 : IntOf(a) > IntOf(b) ? 1 : 0;
    }
    double x = a.as_double();
    double y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const ValueList& x = a.as_list();
    const ValueList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] == y[i]) continue;
      return Order(op, x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  RequireDefined(a);
  RequireDefined(b);
  ThrowError("'" + op + "' not supported between instances of '" + PyTypeName(a) + "' and '" +
             PyTypeName(b) + "'");
}

}  // namespace

void ThrowError(std::string message) {
  EvalError error;
  error.message = std::move(message);
  throw error;
}

void RequireDefined(const Value& v) {
  if (v.is_undefined()) ThrowError(v.name());
}

void FinishCall(CallArgs& args, std::string_view function, size_t max_positional) {
  Status status = args.Finish(function, max_positional);
  if (!status.ok()) ThrowError(status.message());
}

Value BinaryOperation(const std::string& op, const Value& a, const Value& b) {
  RequireDefined(a);
  if (op == "neg" || op == "pos") {
    if (a.is_float()) return Value::Float(op == "neg" ? -a.as_double() : a.as_double());
    if (IsIntLike(a)) {
      if (op == "neg" && IntOf(a) == INT64_MIN) Overflow("-", 0, IntOf(a));
      return Value::Int(op == "neg" ? -IntOf(a) : IntOf(a));
    }
    ThrowError("bad operand type for unary " + std::string(op == "neg" ? "-" : "+") + ": '" +
               PyTypeName(a) + "'");
  }
  RequireDefined(b);
  if (IsNumeric(a) && IsNumeric(b)) {
    bool ints = IsIntLike(a) && IsIntLike(b);
    if (op == "/") {
      if (b.as_double() == 0) ThrowError("division by zero");
      return Value::Float(a.as_double() / b.as_double());
    }
    if (ints) {
      int64_t x = IntOf(a);
      int64_t y = IntOf(b);
      int64_t r = 0;
      if (op == "+") return __builtin_add_overflow(x, y, &r) ? Overflow(op, x, y) : Value::Int(r);
      if (op == "-") return __builtin_sub_overflow(x, y, &r) ? Overflow(op, x, y) : Value::Int(r);
      if (op == "*") return __builtin_mul_overflow(x, y, &r) ? Overflow(op, x, y) : Value::Int(r);
      if (op == "//" || op == "%") {
        if (y == 0) ThrowError("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
          return op == "%" ? Value::Int(0) : Overflow(op, x, y);
        }
        int64_t q = FloorDiv(x, y);
        if (op == "//") return Value::Int(q);
        // x - q*y is Python's remainder, |r| < |y|; computed in unsigned arithmetic, where the
        // intermediate product may wrap without undefined behaviour.
        return Value::Int(static_cast<int64_t>(
            static_cast<uint64_t>(x) - static_cast<uint64_t>(q) * static_cast<uint64_t>(y)));
      }
      if (op == "**") {
        if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        return Value::Int(Power(x, y));
      }
    } else {
      double x = a.as_double();
      double y = b.as_double();
      if (op == "+") return Value::Float(x + y);
      if (op == "-") return Value::Float(x - y);
      if (op == "*") return Value::Float(x * y);
      if (op == "//" || op == "%") {
        if (y == 0) ThrowError("float floor division by zero");
        double q = std::floor(x / y);
        return Value::Float(op == "//" ? q : x - q * y);
      }
      if (op == "**") return Value::Float(std::pow(x, y));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      RenderBudget::Built(a.as_string().size() + b.as_string().size());
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      RenderBudget::CheckList(a.as_list().size() + b.as_list().size());
      ValueList items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::List(std::move(items), a.is_tuple());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && IsIntLike(b)) return Repeat(a, IntOf(b));
    if ((b.is_string() || b.is_list()) && IsIntLike(a)) return Repeat(b, IntOf(a));
  }
  Unsupported(op, a, b);
}

bool Compare(const std::string& op, const Value& a, const Value& b) {
  int order = Order(op, a, b);
  if (op == "<") return order < 0;
  if (op == "<=") return order <= 0;
  if (op == ">") return order > 0;
  return order >= 0;
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        RequireDefined(item);
        ThrowError("'in <string>' requires string as left operand, not " + PyTypeName(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& element : container.as_list()) {
        if (element == item) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.Find(item.as_string()) != nullptr;
    default:
      ThrowError("argument of type '" + PyTypeName(container) + "' is not iterable");
  }
}

ValueList Iterate(const Value& value) {
  const size_t items = value.is_list()     ? value.as_list().size()
                       : value.is_dict()   ? value.as_dict().size()
                       : value.is_string() ? value.as_string().size()
                                           : 0;
  RenderBudget::ChargeWork(static_cast<int64_t>(items));
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return value.as_list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& [key, item] : value.as_dict()) keys.push_back(Value::String(key));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      std::vector<size_t> offsets = CodePointOffsets(value.as_string());
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.push_back(
            Value::String(value.as_string().substr(offsets[i], offsets[i + 1] - offsets[i])));
      }
      return chars;
    }
    default:
      ThrowError("'" + value.TypeName() + "' is not iterable");
  }
}

// Exposed for sort, min and max.
int PyOrder(const Value& a, const Value& b) { return Order("<", a, b); }

}  // namespace engine::jinja
